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
4. a quasi-Newton step (L-BFGS from the curvature of the accepted steps) when plain
   Polyak steps make slow progress: a margin such as ``1 - cos`` of two embeddings
   is a narrow valley through a network, where gradient steps zig-zag and a
   curvature-aware step goes down it (an ArcFace head: a few dozen steps instead of never);
5. mutations to interesting values: the weakest sample set to 0, to a copy of
   another sample, to its own mean (equal features), to the bounds, to +-1.
   Floating point is discrete: a gradient step rarely lands *exactly* on a zero
   divisor or makes two vectors exactly parallel; these values do.

In a program that trains, the first failed list of a point re-measures that point: when the
training steps on the tried batches took back most of the search's progress (a hazard on the
loss itself, which training lowers), the site goes on from its start state with its training
steps undone after each step (:meth:`SiteSearch.freeze`).

A site that stalls refreshes its least important samples (importance: how far each
sample's suspect loss moved). Every forward pass counts as a step. Candidates are
compared under the same randomness of the program (dropout masks, noise: common
random numbers), drawn anew at each refresh.
"""
from __future__ import annotations

import math
import zlib
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
# jitter first (near a rounding-decided edge it is the cheapest win) and drawn again at the end:
# each draw is a new ticket in the rounding lottery
MUTATIONS = ("jitter", "zero", "copy", "flat", "low", "high", "one", "minus_one", "jitter", "jitter", "jitter")
# tried at the first point, after the first gradient step, where the edge is a point that the
# search must land on exactly (a zero divisor; a backward hazard: the sqrt of a variance at exactly
# 0): a margin such as a variance only reaches 0 when values are exactly equal, which gradient
# steps approach and never reach (in float32 a variance stops near 1e-14, not at 0)
EARLY_MUTATIONS = ("zero", "flat")
MULT_MIN, MULT_MAX = 0.1, 8.0   # bounds of the input-space step multiplier
JITTER = 1e-6            # relative size of the rounding-lottery perturbation
QN_MEMORY = 8            # curvature pairs kept by the quasi-Newton (L-BFGS) proposal
QN_MAX_SIZE = 1 << 20    # searched elements above which it is not used (memory: 2 * QN_MEMORY copies)
MAX_TIES = 4             # consecutive gradient steps accepted on an unchanged (quantised) margin
NONMONOTONE = 3          # a tie is measured against the largest of this many accepted margins
SLOW = 0.5               # an accepted step that kept more than this fraction of the margin was slow
RECHECKS = 2             # re-measurements of the current point, per site, of a program that trains
UNDONE = 0.5             # training that took back more than this share of the search's progress fights it


class Adaptive(Strategy):
    name = "adaptive"
    refresh_fraction = REFRESH_FRACTION

    def iterate(self, s) -> None:
        cur: Evaluation | None = s.cache.get("current")
        st = s.strategy_state
        # "open": a quantum ended inside the list of proposals, which goes on before any escape
        if cur is not None and st.get("escape", 0) > 0 and not st.get("open", False):
            self._escape(s, cur)
            return
        if cur is None:
            st["seed_step"] = s.step          # candidates share this step's randomness until a refresh
            cur = s.evaluate(s.values, seed_step=st["seed_step"])
            note_reachability(s, cur)
            st.setdefault("origin", float(cur.hard))     # the site's first margin: what progress is measured from
            self._accept(s, s.values, cur, "step")
            if s.unreachable:
                return
        tried = st.get("tried", 0)         # proposals already rejected for this point (a quantum may end
        mutated = False                    # in the middle of the list)
        st["open"] = True                  # until the list ends: the next quantum goes on with it
        for i, (label, x_new) in enumerate(self._proposals(s, cur)):
            mutated = mutated or label == "mutation"
            if i < tried:
                continue
            ev = s.evaluate(x_new, event=label, seed_step=st.get("seed_step"))
            st["tried"] = i + 1       # only once evaluated: a quantum that ends first retries it
            if ev.seen and (ev.hard < cur.hard or self._tie(st, label, ev, cur)):
                st["open"] = False
                self._accept(s, x_new, ev, label)
                return
        # the re-measurement's one step may end the quantum: nothing is changed before it, so the next
        # quantum comes back here and makes the same step (the search does not depend on its slicing)
        rechecked = not mutated and self._recheck(s, cur)
        st["open"] = False
        st["stall"] = st.get("stall", 0) + 1
        st["prefer"] = None
        if rechecked or not mutated:      # else the same list grows by the mutations: go on where it stopped
            return
        st["tried"] = 0
        st["escape"] = ESCAPE_STEPS              # a local minimum: walk out of it, whatever the loss does
        if st["stall"] >= STALL_REFRESH:
            st["stall"] = 0
            refresh_samples(s, REFRESH_FRACTION, cur.per_sample)
            s.cache.pop("current", None)
            forget_curvature(st)

    def _recheck(self, s, cur: Evaluation) -> bool:
        """A program that trains has taken a training step on every batch this point's proposals
        tried: the current point's margin is stale. Measure it again (one step, the same
        randomness). When the training took back more than :data:`UNDONE` of the progress the
        search made from the site's first margin, it fights the search (a hazard on the loss
        itself: each step on a batch that raises it teaches the program to lower it, faster than
        the search can follow): the site goes on from its start state, its training steps still run
        and watched but undone (:meth:`SiteSearch.freeze`), and True. Otherwise the list goes on
        where it stopped (its mutations next), from the point as it was measured."""
        st = s.strategy_state
        origin = st.get("origin")
        if (not s.trained or s.frozen or st.get("rechecks", 0) >= RECHECKS or origin is None
                or not cur.hard < origin or not math.isfinite(cur.hard)):
            return False
        ev = s.evaluate(s.values, event="recheck", seed_step=st.get("seed_step"))
        st["rechecks"] = st.get("rechecks", 0) + 1
        if not ev.seen:
            return False
        if not ev.hard - cur.hard > UNDONE * (origin - cur.hard):
            return False
        s.freeze()
        s.cache.pop("current", None)
        forget_curvature(st)
        st["tried"] = 0
        return True

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
        forget_curvature(st)

    @staticmethod
    def _tie(st: dict, label: str, ev: Evaluation, cur: Evaluation) -> bool:
        """A non-monotone acceptance of gradient steps (as in Grippo-Lampariello-Lucidi line
        searches): at the float resolution of the op's input the margin is quantised and
        noisy by an ulp while the gradient still points the way (two embeddings 1e-4 rad
        apart compute a cosine of exactly 1.0, or one ulp below). A few steps no worse
        than the recent accepted margins are taken; a strict improvement ends the run."""
        recent = st.get("recent") or [cur.hard]
        if label in ("qn", "linear", "log") and ev.hard <= max(recent) and st.get("ties", 0) < MAX_TIES:
            st["ties"] = st.get("ties", 0) + 1
            return True
        return False

    def _escape(self, s, cur: Evaluation) -> None:
        """Sign steps taken unconditionally, as GRIST does: they cross ReLU kinks and ridges
        where the monotone Polyak iteration stalls."""
        st = s.strategy_state
        forget_curvature(st)                  # curvature from before the walk describes another place
        if cur.grads is None or not cur.connected:
            st["escape"] = 0
            return
        sizes = {k: ESCAPE_FRACTION * (hi - lo) for k, (lo, hi) in s.bounds.items()}
        x_new = sign_step(s.values, cur.grads, sizes, s.bounds)
        ev = s.evaluate(x_new, event="escape", seed_step=st.get("seed_step"))
        st["escape"] -= 1                     # only once taken: a quantum that ends first takes it next
        if ev.seen:
            s.values, s.cache["current"] = x_new, ev
            st["tried"] = 0
            st["points"] = st.get("points", 0) + 1

    def _accept(self, s, values: dict, ev: Evaluation, label: str) -> None:
        st = s.strategy_state
        cur = s.cache.get("current")
        if cur is not None and label in ("linear", "crossing", "retry"):
            st["mult"] = adapt_multiplier(st.get("mult", 1.0), label, cur.hard, ev.hard)
        if cur is not None and label not in ("mutation", "early"):
            remember_curvature(st, s, s.values, cur, values, ev)
        elif label in ("mutation", "early"):
            forget_curvature(st)
        if cur is None or ev.hard < cur.hard:
            st["ties"] = 0
        st["recent"] = ([] if cur is None else list(st.get("recent", [])))[-(NONMONOTONE - 1):] + [float(ev.hard)]
        if cur is not None and label != "qn":       # slow progress: the valley is narrow, try qn first
            st["slow"] = bool(cur.hard > 0 and ev.hard / cur.hard > SLOW)
        s.values = values
        s.cache["current"] = ev
        st["points"] = st.get("points", 0) + (cur is not None)
        if ev.per_sample is not None:
            st["last_per_sample"] = ev.per_sample
        if label in ("log", "linear", "qn"):
            st["prefer"] = label
        st["stall"] = 0
        st["tried"] = 0

    def _proposals(self, s, cur: Evaluation) -> Iterator[tuple[str, dict]]:
        st = s.strategy_state
        # the L-BFGS recursion runs only when the list gets this far (most iterations accept earlier)
        qn_first = bool(st.get("slow") or st.get("prefer") == "qn")
        qn = quasi_newton_step(st, s, cur) if qn_first else None
        if qn is not None:
            yield "qn", qn
        spaces = self._spaces(s, cur)
        full: dict[str, dict] = {}
        for i, space in enumerate(spaces):
            x_new = self._polyak(s, cur, space)
            if x_new is not None:
                full[space] = x_new
                yield space, x_new
            if space == "linear" and not s.spec.point and x_new is not None:
                yield "crossing", self._polyak(s, cur, space, 1 + OVERSHOOT) or x_new
            if i == 0 and self._lands_exactly(s) and st.get("points", 0) == 0:
                yield from self._mutations(s, cur, EARLY_MUTATIONS, "early")
        if not qn_first:
            qn = quasi_newton_step(st, s, cur)
            if qn is not None:
                yield "qn", qn
        if full:                                   # backtrack along the first step's direction
            first = full[next(iter(full))]
            for t in BACKTRACK:
                yield "retry", _between(s.values, first, t)
        if cur.grads is not None and cur.connected:
            sizes = {k: SIGN_FRACTION * (hi - lo) for k, (lo, hi) in s.bounds.items()}
            yield "sign", sign_step(s.values, cur.grads, sizes, s.bounds)
        if st.get("stall", 0) >= 1 or not full:
            yield from self._mutations(s, cur)

    def _spaces(self, s, cur: Evaluation) -> list[str]:
        spaces = ["linear"]
        if s.spec.log_space and cur.log_grads is not None and math.isfinite(cur.log_loss):
            first = s.strategy_state.get("prefer") or "log"
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

    @staticmethod
    def _lands_exactly(s) -> bool:
        return bool(s.spec.point or s.spec.phase == "backward")

    def _mutations(self, s, cur: Evaluation, kinds: tuple[str, ...] = MUTATIONS,
                   label: str = "mutation") -> Iterator[tuple[str, dict]]:
        rows = self._weakest_rows(s, cur)
        inputs = [k for k in s.searched if not k.startswith(WEIGHT_PREFIX)]
        for salt, kind in enumerate(kinds):
            x_new = dict(s.values)
            changed = False
            for key in inputs:
                value = np.array(s.values[key], copy=True)
                lo, hi = s.bounds[key]
                mutated = _mutate(kind, value, rows, lo, hi, salt)
                if mutated is not None and not np.array_equal(mutated, value):
                    x_new[key] = mutated.astype(value.dtype)
                    changed = True
            if changed:
                yield label, x_new

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


def _qn_keys(s, grads: dict | None) -> list[str] | None:
    if grads is None:
        return None
    keys = sorted(k for k in grads if k in s.bounds and k in s.values)
    size = sum(int(np.size(grads[k])) for k in keys)
    return keys if keys and size <= QN_MAX_SIZE else None


def _flat(d: dict, keys: list[str]) -> np.ndarray:
    return np.concatenate([np.asarray(d[k], dtype=np.float64).ravel() for k in keys])


def forget_curvature(st: dict) -> None:
    st.pop("qn_s", None)
    st.pop("qn_y", None)


def remember_curvature(st: dict, s, x_old: dict, ev_old: Evaluation, x_new: dict, ev_new: Evaluation) -> None:
    """Keep the pair (step, change of gradient) of an accepted step when its curvature is positive."""
    keys = _qn_keys(s, ev_old.grads)
    if keys is None or ev_new.grads is None or any(k not in ev_new.grads for k in keys):
        return
    step = _flat(x_new, keys) - _flat(x_old, keys)
    change = _flat(ev_new.grads, keys) - _flat(ev_old.grads, keys)
    curv = float(step @ change)
    if not (curv > 1e-10 * float(np.linalg.norm(step) * np.linalg.norm(change))) or not math.isfinite(curv):
        return
    S, Y = st.get("qn_s"), st.get("qn_y")
    if not isinstance(S, np.ndarray) or S.shape[1:] != step.shape:
        S, Y = np.empty((0, step.size)), np.empty((0, step.size))
    st["qn_s"] = np.vstack([S, step[None]])[-QN_MEMORY:]
    st["qn_y"] = np.vstack([Y, change[None]])[-QN_MEMORY:]


def quasi_newton_step(st: dict, s, cur: Evaluation) -> dict | None:
    """``x - H g`` (L-BFGS two-loop recursion on the free coordinates), clipped to the box."""
    S, Y = st.get("qn_s"), st.get("qn_y")
    keys = _qn_keys(s, cur.grads)
    if not isinstance(S, np.ndarray) or len(S) == 0 or keys is None or not cur.connected:
        return None
    x, g = _flat(s.values, keys), _flat(cur.grads, keys)
    if S.shape[1] != x.size:
        forget_curvature(st)
        return None
    lo = np.concatenate([np.full(np.size(s.values[k]), s.bounds[k][0]) for k in keys])
    hi = np.concatenate([np.full(np.size(s.values[k]), s.bounds[k][1]) for k in keys])
    free = ~(((x <= lo) & (g > 0)) | ((x >= hi) & (g < 0)))   # pinned at a bound and pushed outward
    q = g * free
    alphas = []
    for sv, yv in zip(S[::-1], Y[::-1]):
        a = float(sv @ q) / float(yv @ sv)
        alphas.append(a)
        q = q - a * yv
    q = q * (float(S[-1] @ Y[-1]) / float(Y[-1] @ Y[-1]))
    for (sv, yv), a in zip(zip(S, Y), reversed(alphas)):
        q = q + sv * (a - float(yv @ q) / float(yv @ sv))
    if not (float(g @ (q * free)) > 0) or not np.all(np.isfinite(q)):   # not a descent direction
        return None
    new = np.clip(x - q * free, lo, hi)
    out, at = dict(s.values), 0
    for k in keys:
        n = int(np.size(s.values[k]))
        out[k] = new[at:at + n].reshape(np.shape(s.values[k])).astype(s.values[k].dtype)
        at += n
    return out


def _between(x: dict, y: dict, t: float) -> dict:
    """``x + t (y - x)`` for the values that differ."""
    out = dict(x)
    for k, v in y.items():
        if v is not x.get(k):
            out[k] = (x[k] + t * (v.astype(np.float64) - x[k])).astype(x[k].dtype)
    return out


def _mutate(kind: str, value: np.ndarray, rows: list[int], lo: float, hi: float, salt: int = 0) -> np.ndarray | None:
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
        # seeded by the values themselves (crc32, not hash(): that one changes per process)
        noise = np.random.default_rng([zlib.crc32(value[rows].tobytes()), salt]).standard_normal(out[rows].shape)
        out[rows] = np.clip(value[rows] * (1 + JITTER * noise) + JITTER * noise, lo, hi)
    return out
