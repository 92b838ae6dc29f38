"""Pure helpers of the adaptive strategy's tactics: where a step goes, given values, gradients and a box.

Nothing here reads or writes a search's state; each function is a step rule on plain arrays, tested on
its own (``tests/test_adaptive_tactics.py``).
"""
from __future__ import annotations

import math
import zlib

import numpy as np

from fuzz_core.backends.base import WEIGHT_PREFIX

Values = dict[str, np.ndarray]
Box = dict[str, tuple[float, float]]

# the kinds of :func:`mutate`, in the order :class:`~.tactics.Exact` proposes them; "jitter" again at the end:
# each draw is a new ticket in the rounding lottery of an edge that rounding decides
MUTATIONS = ("zero", "copy", "flat", "low", "high", "one", "minus_one", "jitter", "jitter", "jitter", "jitter")


def box_reach(x: Values, g: Values, bounds: Box) -> float:
    """The most a linear model with gradient ``g`` at ``x`` can fall inside the box: every coordinate
    moved to the bound its gradient points away from."""
    total = 0.0
    for k, gk in g.items():
        if k not in bounds or k not in x:
            continue
        lo, hi = bounds[k]
        v = np.asarray(x[k], dtype=np.float64)
        gk = np.asarray(gk, dtype=np.float64)
        total += float(np.where(gk > 0, gk * (v - lo), gk * (v - hi)).sum())
    return total


def after_training(margin: float, shift: float) -> float:
    """The margin predicted where the program's training step moved the searched weights (``margin +
    shift``), when that prediction is still above the edge; else the measured one."""
    moved = margin + shift
    return moved if moved > 0 and math.isfinite(moved) else margin


def between(x: Values, y: Values, t: float) -> Values:
    """``x + t (y - x)`` for the values that differ."""
    out = dict(x)
    for k, v in y.items():
        if v is not x.get(k):
            out[k] = (x[k] + t * (v.astype(np.float64) - x[k])).astype(x[k].dtype)
    return out


def sign_step(x: Values, g: Values, fraction: float, bounds: Box, extra: Values | None = None) -> Values:
    """``x - h (sign(g) + sign(extra))`` clipped to the box, ``h`` a ``fraction`` of each value's box."""
    out = dict(x)
    for k, gk in g.items():
        if k not in bounds or k not in x:
            continue
        lo, hi = bounds[k]
        d = np.sign(gk)
        if extra is not None and k in extra:
            d = d + np.sign(extra[k])
        out[k] = np.clip(x[k] - fraction * (hi - lo) * d, lo, hi).astype(x[k].dtype)
    return out


def in_place(before: Values, after: Values) -> bool:
    """A step that left every value where it was (pinned at the box's corner by its clip)."""
    return all(after[k] is v or np.array_equal(after[k], v) for k, v in before.items())


def rows_only(g: Values, rows: list[int]) -> Values:
    """``g`` with every sample but ``rows`` (dimension 0) set to 0; searched weights, which have no samples,
    as they are."""
    out = {}
    for k, v in g.items():
        if k.startswith(WEIGHT_PREFIX):
            out[k] = v
            continue
        keep = np.zeros(np.shape(v)[0], dtype=bool)
        keep[rows] = True
        out[k] = np.where(keep.reshape((-1,) + (1,) * (np.ndim(v) - 1)), v, 0.0)
    return out


def mutate(kind: str, value: np.ndarray, rows: list[int], lo: float, hi: float, salt: int = 0) -> np.ndarray | None:
    """``value`` with ``rows`` set to an interesting value (None: the kind does not apply):
    ``zero``, ``low``/``high`` (the bounds), ``one``/``minus_one``; ``copy`` (another sample), ``flat`` (each
    row's own mean: equal features); ``jitter`` (a relative 1e-6 perturbation seeded by the values, never by
    per-process state, so that a resumed search draws the same)."""
    out = value.copy()
    if kind == "zero":
        out[rows] = np.clip(0.0, lo, hi)
    elif kind == "copy":
        if value.shape[0] < 2:
            return None
        out[rows] = value[(rows[0] + 1) % value.shape[0]]
    elif kind == "flat":
        if value.ndim < 2:
            return None
        out[rows] = value[rows].mean(axis=tuple(range(1, value.ndim)), keepdims=True)
    elif kind == "low":
        out[rows] = lo
    elif kind == "high":
        out[rows] = hi
    elif kind == "one":
        out[rows] = np.clip(1.0, lo, hi)
    elif kind == "minus_one":
        out[rows] = np.clip(-1.0, lo, hi)
    elif kind == "jitter":
        noise = np.random.default_rng([zlib.crc32(value[rows].tobytes()), salt]).standard_normal(out[rows].shape)
        out[rows] = np.clip(value[rows] * (1 + 1e-6 * noise) + 1e-6 * noise, lo, hi)
    else:
        raise ValueError(f"unknown mutation {kind!r}")
    return out


def zero_support(values: Values, grads: Values | None, bounds: Box) -> Values | None:
    """The searched weights with the entries the hard minimum depends on (its gradient's nonzero entries) set
    to 0 within their bounds, or None: a divisor that is a sum of weights (a column sum of ``|w|``) or a
    weight itself (a gain) is exactly 0 there, where a gradient step overshoots each entry and lands on none."""
    if grads is None:
        return None
    out, changed = dict(values), False
    for key, g in grads.items():
        if not key.startswith(WEIGHT_PREFIX) or key not in values or key not in bounds:
            continue
        value = np.asarray(values[key])
        support = np.asarray(g) != 0
        if support.shape != value.shape or not support.any():
            continue
        lo, hi = bounds[key]
        new = np.where(support, np.clip(0.0, lo, hi), value).astype(value.dtype)
        if not np.array_equal(new, value):
            out[key], changed = new, True
    return out if changed else None
