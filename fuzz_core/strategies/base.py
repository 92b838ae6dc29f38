"""What every strategy shares: the interface, sample refresh, and box-aware steps."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

from fuzz_core.backends.base import WEIGHT_PREFIX, Evaluation

if TYPE_CHECKING:
    from fuzz_core.search import SiteSearch


class Strategy(ABC):
    """Decides where the search steps next; :class:`SiteSearch` owns budget and trace."""

    name = "base"
    refresh_fraction = 0.25   # share of the batch a refresh the scheduler asks for replaces

    @abstractmethod
    def iterate(self, s: "SiteSearch") -> None:
        """Take one or more steps through ``s.evaluate``."""

    def refresh(self, s: "SiteSearch", fraction: float) -> None:
        """Replace the least important samples with fresh ones from the target's sampler."""
        refresh_samples(s, fraction)


def note_reachability(s: "SiteSearch", ev: Evaluation) -> None:
    """No gradient path from any searched value, and nothing else that moves (the program does
    not train, or no trained weight reaches the margin either): unreachable. A framework's own
    op that a user call reached (a dropout's division by 1 - rate) is one."""
    if ev.seen and not ev.connected and (not ev.movable or (not s.runner.trains and ev.grads is not None)):
        s.unreachable = True


_LOG_FLOOR = float(np.finfo(np.float32).tiny)


def distance(s: "SiteSearch", per_sample: np.ndarray) -> np.ndarray:
    """Each sample's distance to the edge in the units the search measures it in: nats above the
    smallest normal float32 for an op measured in log space (a softmax output of 1e-30 is 18 nats
    from its underflow, not 1e-30 from it), the margin itself otherwise."""
    if s.spec.log_space:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.log(np.maximum(per_sample, _LOG_FLOOR)) - math.log(_LOG_FLOOR)
    return per_sample


def importance(s: "SiteSearch", per_sample: np.ndarray | None) -> np.ndarray | None:
    """How far each sample's suspect loss moved since the last refresh (a real score)."""
    if per_sample is None:
        return None
    per_sample = distance(s, per_sample)
    ref = s.strategy_state.get("ref_per_sample")
    if not isinstance(ref, np.ndarray) or ref.shape != per_sample.shape:
        s.strategy_state["ref_per_sample"] = per_sample.copy()
        return None
    with np.errstate(invalid="ignore"):          # inf - inf: a sample whose op did not run
        moved = np.abs(np.nan_to_num(ref - per_sample, nan=0.0, posinf=0.0, neginf=0.0))
    # a sample already near the boundary is important even when it stopped moving
    return moved + 1.0 / (1.0 + np.maximum(per_sample, 0.0))


def refresh_samples(s: "SiteSearch", fraction: float, per_sample: np.ndarray | None = None,
                    at_random: bool = False) -> list[int]:
    """Swap the ``fraction`` least important rows of the batch for fresh samples (at least one);
    ``at_random``: rows drawn at random instead (no importance)."""
    n = s.batch_size
    if n < 2:
        return []
    k = max(1, int(math.floor(fraction * n)))
    if at_random:
        rows = [int(r) for r in s.rng.permutation(n)[:k]]
    else:
        per_sample = per_sample if per_sample is not None else s.strategy_state.get("last_per_sample")
        score = importance(s, per_sample if isinstance(per_sample, np.ndarray) else None)
        rows = list(np.argsort(score)[:k]) if score is not None else list(s.rng.choice(n, size=k, replace=False))
    fresh = s.fresh_batch()
    for key, value in s.values.items():
        if key.startswith(WEIGHT_PREFIX) or key not in fresh:
            continue
        value = value.copy()
        value[rows] = fresh[key][rows]
        s.values[key] = value
    s.strategy_state.pop("ref_per_sample", None)
    s.cache.pop("current", None)
    return [int(r) for r in rows]


def box_step(x: dict[str, np.ndarray], g: dict[str, np.ndarray], decrease: float,
             bounds: dict[str, tuple[float, float]]) -> dict[str, np.ndarray] | None:
    """Move against ``g`` so that the linear prediction falls by ``decrease``, inside the box.

    A Polyak step on the free coordinates: coordinates pinned at a bound that the step
    would push outward are dropped and the step is re-solved on the rest, so clipping
    does not eat the progress.
    """
    free = {k: np.ones_like(g[k], dtype=bool) for k in g if k in bounds}
    remaining = decrease
    new = {k: np.asarray(v, dtype=np.float64).copy() for k, v in x.items() if k in free}
    for _ in range(8):
        norm2 = sum(float((g[k][free[k]] ** 2).sum()) for k in free)
        if norm2 <= 0 or not math.isfinite(norm2) or remaining <= 0:
            break
        alpha = remaining / norm2
        achieved = 0.0
        for k in free:
            lo, hi = bounds[k]
            proposal = new[k] - alpha * g[k] * free[k]
            clipped = np.clip(proposal, lo, hi)
            achieved += float((g[k] * (new[k] - clipped)).sum())
            new[k] = clipped
            free[k] &= (clipped > lo) & (clipped < hi)
        remaining -= achieved
        if remaining <= 1e-12 * decrease:
            break
    if all(np.array_equal(new[k], x[k]) for k in new):
        return None
    out = dict(x)
    for k in new:
        out[k] = new[k].astype(x[k].dtype)
    return out


def sign_step(x: dict[str, np.ndarray], g: dict[str, np.ndarray], size: float | dict[str, float],
              bounds: dict[str, tuple[float, float]]) -> dict[str, np.ndarray]:
    out = dict(x)
    for k in g:
        if k not in bounds:
            continue
        lo, hi = bounds[k]
        step = size[k] if isinstance(size, dict) else size
        out[k] = np.clip(x[k] - step * np.sign(g[k]), lo, hi).astype(x[k].dtype)
    return out
