"""CDeepFuzz's own strategy: Polyak steps that land on the boundary, then finish the job.

Each iteration proposes, in order, until one lowers the hard-minimum margin:

1. a Polyak step ``(L - L*) / |g|^2 * g`` in the space that suits the op: in log
   space for quantities that approach their edge multiplicatively (a softmax or
   sigmoid output, a sum of exps: ``log p`` is nearly linear in the logits, so one
   step reaches the underflow), in the op's input space otherwise, aiming past the
   edge (``overshoot``) for hazards that are crossed, exactly onto it for hazards
   at a point (a zero divisor). The step is solved inside the box (bounds), so
   clipping does not eat it;
2. the same step in the other space, then shorter steps (backtracking);
3. a sign step when the gradient vanishes; after an iteration without progress, a
   short walk of unconditional sign steps (GRIST's move) out of the local minimum;
4. mutations to interesting values: the weakest sample set to 0, to a copy of
   another sample, to its own mean (equal features), to the bounds, to +-1.
   Floating point is discrete: a gradient step rarely lands *exactly* on a zero
   divisor or makes two vectors exactly parallel; these values do.

A site that stalls refreshes its least important samples (importance: how far each
sample's suspect loss moved). Every forward pass counts as a step. Candidates are
compared under the same randomness of the program (dropout masks, noise: common
random numbers), drawn anew at each refresh.
"""
from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from fuzz_core.backends.base import WEIGHT_PREFIX, Evaluation
from fuzz_core.strategies.base import Strategy, box_step, note_reachability, refresh_samples, sign_step

OVERSHOOT = 0.5          # linear steps aim this fraction of the margin past a crossed edge
BACKTRACK = (0.5, 0.2, 0.05)  # shorter steps along the first proposal, after the full ones
SIGN_FRACTION = 0.1      # sign-step size, as a fraction of each value's box
STALL_REFRESH = 3        # iterations without progress before a refresh
ESCAPE_STEPS = 12        # unconditional sign steps after an iteration without progress
ESCAPE_FRACTION = 0.025  # their size, as a fraction of each value's box
REFRESH_FRACTION = 0.25
MUTATIONS = ("zero", "copy", "flat", "low", "high", "one", "minus_one", "jitter")
MULT_MIN, MULT_MAX = 0.1, 8.0   # bounds of the input-space step multiplier
JITTER = 1e-6            # relative size of the rounding-lottery perturbation


class Adaptive(Strategy):
    name = "adaptive"

    def iterate(self, s) -> None:
        cur: Evaluation | None = s.cache.get("current")
        st = s.strategy_state
        if cur is not None and st.get("escape", 0) > 0:
            self._escape(s, cur)
            return
        if cur is None:
            st["seed_step"] = s.step          # candidates share this step's randomness until a refresh
            cur = s.evaluate(s.values, seed_step=st["seed_step"])
            note_reachability(s, cur)
            self._accept(s, s.values, cur, "step")
            if s.unreachable:
                return
        tried = st.get("tried", 0)         # proposals already rejected for this point (a quantum may end
        for i, (label, x_new) in enumerate(self._proposals(s, cur)):   # in the middle of the list)
            if i < tried:
                continue
            st["tried"] = i + 1
            ev = s.evaluate(x_new, event=label, seed_step=st.get("seed_step"))
            if ev.seen and ev.hard < cur.hard:
                self._accept(s, x_new, ev, label)
                return
        st["tried"] = 0
        st["stall"] = st.get("stall", 0) + 1
        st["escape"] = ESCAPE_STEPS              # a local minimum: walk out of it, whatever the loss does
        if st["stall"] >= STALL_REFRESH:
            st["stall"] = 0
            refresh_samples(s, REFRESH_FRACTION, cur.per_sample)
            s.cache.pop("current", None)

    def refresh(self, s, fraction: float) -> None:
        """The scheduler saw a plateau. The first time, walk out of the local minimum (the
        samples may be right: a ReLU region, a ridge); the next time, refresh samples."""
        st = s.strategy_state
        if not st.get("walked"):
            st["walked"] = True
            st["escape"] = max(st.get("escape", 0), ESCAPE_STEPS)
            return
        st["walked"] = False
        refresh_samples(s, fraction, st.get("last_per_sample"))

    def _escape(self, s, cur: Evaluation) -> None:
        """Sign steps taken unconditionally, as GRIST does: they cross ReLU kinks and ridges
        where the monotone Polyak iteration stalls."""
        st = s.strategy_state
        st["escape"] -= 1
        if cur.grads is None or not cur.connected:
            st["escape"] = 0
            return
        sizes = {k: ESCAPE_FRACTION * (hi - lo) for k, (lo, hi) in s.bounds.items()}
        x_new = sign_step(s.values, cur.grads, sizes, s.bounds)
        ev = s.evaluate(x_new, event="escape", seed_step=st.get("seed_step"))
        if ev.seen:
            s.values, s.cache["current"] = x_new, ev
            st["tried"] = 0

    def _accept(self, s, values: dict, ev: Evaluation, label: str) -> None:
        cur = s.cache.get("current")
        if cur is not None and label in ("linear", "crossing", "retry"):
            s.strategy_state["mult"] = adapt_multiplier(s.strategy_state.get("mult", 1.0), label, cur.hard, ev.hard)
        s.values = values
        s.cache["current"] = ev
        if ev.per_sample is not None:
            s.strategy_state["last_per_sample"] = ev.per_sample
        if label in ("log", "linear"):
            s.strategy_state["prefer"] = label
        s.strategy_state["stall"] = 0
        s.strategy_state["tried"] = 0

    def _proposals(self, s, cur: Evaluation) -> Iterator[tuple[str, dict]]:
        spaces = self._spaces(s, cur)
        full: dict[str, dict] = {}
        for space in spaces:
            x_new = self._polyak(s, cur, space)
            if x_new is not None:
                full[space] = x_new
                yield space, x_new
            if space == "linear" and not s.spec.point and x_new is not None:
                yield "crossing", self._polyak(s, cur, space, 1 + OVERSHOOT) or x_new
        if full:                                   # backtrack along the first step's direction
            first = full[next(iter(full))]
            for t in BACKTRACK:
                yield "retry", _between(s.values, first, t)
        if cur.grads is not None and cur.connected:
            sizes = {k: SIGN_FRACTION * (hi - lo) for k, (lo, hi) in s.bounds.items()}
            yield "sign", sign_step(s.values, cur.grads, sizes, s.bounds)
        if s.strategy_state.get("stall", 0) >= 1 or not full:
            yield from self._mutations(s, cur)

    def _spaces(self, s, cur: Evaluation) -> list[str]:
        spaces = ["linear"]
        if s.spec.log_space and cur.log_grads is not None and math.isfinite(cur.log_loss):
            first = s.strategy_state.get("prefer", "log")
            spaces = ["log", "linear"] if first == "log" else ["linear", "log"]
        return spaces

    def _polyak(self, s, cur: Evaluation, space: str, overshoot: float = 1.0) -> dict | None:
        """Land on the edge (``overshoot`` 1) under a local model: log-linear, or ``c * d**k``."""
        if space == "log":
            grads, decrease = cur.log_grads, cur.log_loss
        else:
            grads = cur.grads
            decrease = cur.hard * s.strategy_state.get("mult", 1.0) * overshoot
        if grads is None or not (decrease > 0) or not math.isfinite(decrease):
            return None
        return box_step(s.values, grads, decrease, s.bounds)

    def _mutations(self, s, cur: Evaluation) -> Iterator[tuple[str, dict]]:
        rows = self._weakest_rows(s, cur)
        inputs = [k for k in s.searched if not k.startswith(WEIGHT_PREFIX)]
        for kind in MUTATIONS:
            x_new = dict(s.values)
            changed = False
            for key in inputs:
                value = np.array(s.values[key], copy=True)
                lo, hi = s.bounds[key]
                mutated = _mutate(kind, value, rows, lo, hi)
                if mutated is not None and not np.array_equal(mutated, value):
                    x_new[key] = mutated.astype(value.dtype)
                    changed = True
            if changed:
                yield "mutation", x_new

    def _weakest_rows(self, s, cur: Evaluation) -> list[int]:
        if cur.per_sample is not None and len(cur.per_sample) == s.batch_size:
            return [int(np.argmin(cur.per_sample))]
        return list(range(s.batch_size))


def adapt_multiplier(mult: float, label: str, before: float, after: float) -> float:
    """Step-size control of the input-space step (a trust region on the Polyak multiplier).

    A full step that landed well short of the edge (a margin like ``1 - cos``, ``~ d**2``,
    only halves per step) grows the multiplier; a backtracked step shrinks it.
    """
    if label == "retry":
        return max(MULT_MIN, mult / 2)
    if before > 0 and after / before > 0.2:
        return min(MULT_MAX, mult * 1.5)
    return mult


def _between(x: dict, y: dict, t: float) -> dict:
    """``x + t (y - x)`` for the values that differ."""
    out = dict(x)
    for k, v in y.items():
        if v is not x.get(k):
            out[k] = (x[k] + t * (v.astype(np.float64) - x[k])).astype(x[k].dtype)
    return out


def _mutate(kind: str, value: np.ndarray, rows: list[int], lo: float, hi: float) -> np.ndarray | None:
    out = value.copy()
    if kind == "zero":
        out[rows] = np.clip(0.0, lo, hi)
    elif kind == "copy":
        if value.shape[0] < 2:
            return None
        donor = (rows[0] + 1) % value.shape[0]
        out[rows] = value[donor]
    elif kind == "flat":
        if value.ndim < 2:
            return None
        axes = tuple(range(1, value.ndim))
        out[rows] = value[rows].mean(axis=axes, keepdims=True)
    elif kind == "low":
        out[rows] = lo
    elif kind == "high":
        out[rows] = hi
    elif kind == "one":
        out[rows] = np.clip(1.0, lo, hi)
    elif kind == "minus_one":
        out[rows] = np.clip(-1.0, lo, hi)
    elif kind == "jitter":     # on a boundary that rounding decides (a cosine of parallel vectors)
        noise = np.random.default_rng(abs(hash(value[rows].tobytes())) % 2**32).standard_normal(out[rows].shape)
        out[rows] = np.clip(value[rows] * (1 + JITTER * noise) + JITTER * noise, lo, hi)
    return out
