"""Pure, typed helpers shared by the policies: reading report values, fitting a slope,
predicting steps to trigger, judging a plateau, checking arguments.

Every function is total: junk, nan and inf in a report never raise (missing data means
"continue", as in Ray Tune's schedulers).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

EPS = 1e-9   # smallest fall rate (loss per step) in a prediction


def number(value: Any) -> float:
    """``value`` as a float; nan when it is missing or not a number."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def floats(values: Any) -> list[float]:
    """A loss trace as floats (nan for junk); [] when it is missing or not iterable."""
    try:
        return [number(v) for v in values]
    except TypeError:
        return []


def flag(value: Any) -> bool:
    """True only for a real true value (True, numpy True, nonzero int); nan/None are False."""
    return isinstance(value, (bool, np.bool_, int, np.integer)) and bool(value)


def slope(losses: Sequence[float]) -> float:
    """Least-squares slope (loss per step) of the finite losses, by position in the trace;
    nan with fewer than two finite points. (Plain floats: a window is a few dozen losses, where
    NumPy's per-call cost is most of the work, at every report of every site.)"""
    points = [(i, v) for i, v in enumerate(floats(losses)) if math.isfinite(v)]
    if len(points) < 2:
        return math.nan
    x_mean = sum(i for i, _ in points) / len(points)
    y_mean = sum(v for _, v in points) / len(points)          # inf on overflow, as NumPy's: then nan below
    s = sum((i - x_mean) * (v - y_mean) for i, v in points) / sum((i - x_mean) ** 2 for i, _ in points)
    return s if math.isfinite(s) else math.nan


def predicted_steps(loss: float, rate: float, eps: float = EPS) -> float:
    """Steps until ``loss`` reaches 0 at ``rate`` (a slope: loss per step): loss / max(eps, -rate).

    0 at or past the boundary; inf when the loss or the slope is unknown."""
    loss, rate = number(loss), number(rate)
    if not math.isfinite(loss) or math.isnan(rate):
        return math.inf
    return 0.0 if loss <= 0 else loss / max(eps, -rate)


def small_fall(fall: float, level: float, tol: float, log_space: bool = False) -> bool:
    """True when a fall of the loss to ``level`` removed at most ``tol`` of the margin: of the
    level for a plain loss, ``-log(1 - tol)`` for a log-space one (a ratio of margins)."""
    return fall <= (-math.log1p(-tol) if log_space else tol * abs(level))


def improved(before: float, after: float, tol: float, log_space: bool = False) -> bool:
    """True when the best loss went from ``before`` to ``after`` by more than a small fall
    (any finite best improves on none)."""
    if not after < before:
        return False
    return not math.isfinite(before) or not small_fall(before - after, before, tol, log_space)


def curve_prediction(curve: Sequence[float], finite: Sequence[float], best: float, fell: bool, window: int,
                     tol: float, log_space: bool = False) -> tuple[list[float], float]:
    """A site's best-loss curve (the best loss so far after each of its last ``window`` finite
    losses: monotone, so noise does not read as progress) extended by a report's ``finite``
    losses, and the predicted steps to trigger it gives: nan with fewer than two points; inf
    when it fell by at most ``tol`` of the margin (no evidence of progress: a loss parked just
    above a clamp is not "almost there") or the report had losses and no new best (``fell``
    False: the fall has stopped, for now); else ``best`` (the site's best loss) over the fall per step."""
    running, new = curve[-1] if curve else math.inf, []
    for v in finite:
        running = min(running, v)
        new.append(running)
    curve = (list(curve) + new)[-window:]
    if len(curve) < 2:
        return curve, math.nan
    if small_fall(curve[0] - curve[-1], curve[-1], tol, log_space):
        return curve, math.inf
    if finite and not fell:
        return curve, math.inf
    return curve, predicted_steps(best, -(curve[0] - curve[-1]) / (len(curve) - 1))


def is_plateau(losses: Sequence[float], tol: float, log_space: bool = False) -> bool:
    """True when the finite losses fell by at most ``tol`` of the margin (flat or rising,
    see :func:`small_fall`); False when too few, or at the boundary."""
    trace = floats(losses)
    y = [v for v in trace if math.isfinite(v)]
    if len(y) < 3:
        return False
    level = sum(abs(v) for v in y) / len(y)
    s = slope(trace)
    if not math.isfinite(level) or level == 0 or math.isnan(s):
        return False
    return small_fall(-s * (len(trace) - 1), level, tol, log_space)


def progressed(first: float, best: float, share: float) -> bool:
    """The best loss is at most ``share`` times the first: that share of the way to the edge in
    the loss's own units (for a log-space loss, in orders of magnitude of the margin, so a guard's
    clamp at 1e-12 that the margin merely approaches does not count)."""
    return math.isfinite(first) and first > 0 and best <= share * first


def quantum_for(pred: float, ref: float, quantum: int, lo: int, hi: int) -> int:
    """``quantum * ref / pred`` clamped to [lo, hi]: a site predicted to trigger ``ref``
    steps away gets one quantum, a closer one more, a farther one less."""
    if pred <= 0:
        return hi
    if not math.isfinite(pred) or not math.isfinite(ref) or ref <= 0:
        return lo if not math.isfinite(pred) else quantum
    return int(round(min(hi, max(lo, quantum * ref / pred))))


def check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def check_fraction(name: str, value: Any) -> float:
    if isinstance(value, (bool, str)) or not 0 < number(value) < 1:
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


def check_positive(name: str, value: Any, optional: bool = False) -> float | None:
    """A number > 0 (finite or inf); None passes when ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, (bool, str)) or not number(value) > 0:
        raise ValueError(f"{name} must be a number > 0{' or None' if optional else ''}, got {value!r}")
    return float(value)
