"""The adaptive strategy's tactics: each a small class, its state a dataclass, its docstring the failure it
answers. :data:`DEFAULT_TACTICS` is the list the strategy runs; ``docs/adaptive-ablation.md`` measures each
one's removal over the repository's whole subject set and says why each one stays.

Hooks (see :class:`~.core.Tactic`): ``proposals`` (candidates of a round), ``holds``/``step`` (steps of its
own), ``on_failed_round`` (a reaction), ``on_accept``/``on_move`` (bookkeeping), ``ride_direction`` and
``on_ride_start`` (the ride's plug-ins).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from fuzz_core.backends.base import WEIGHT_PREFIX, Evaluation
from fuzz_core.strategies.adaptive.core import Context, Tactic
from fuzz_core.strategies.adaptive.steps import (
    MUTATIONS, after_training, between, box_reach, in_place, mutate, rows_only, sign_step, zero_support,
)
from fuzz_core.strategies.base import box_step, importance, note_reachability, refresh_samples


def exact_edge(ctx: Context) -> bool:
    """The edge is a point the search must land on exactly (a zero divisor), or a backward hazard (the sqrt
    of a variance at exactly 0): gradient steps approach it and never reach it."""
    return bool(ctx.s.spec.point or ctx.s.spec.phase == "backward")


def out_of_reach(ctx: Context, ev: Evaluation) -> bool:
    """No input in the box reaches the edge under the linear model of the margin at ``ev``'s weights (in the
    space the search steps in: log space for a quantity that nears its edge multiplicatively, where in the
    op's input space a linear model reaches 0 from 1e-3 in one step and never gets there)."""
    s = ctx.s
    if s.spec.log_space and ev.log_grads is not None and math.isfinite(ev.log_loss):
        g, need = ev.log_grads, ev.log_loss
    else:
        g, need = ev.grads, ev.hard
    return g is not None and box_reach(s.values, g, s.bounds) < need


class Land(Tactic):
    """A margin that is locally linear (in log space for a quantity that nears its edge multiplicatively: a
    softmax output, a sum of exps) is crossed in one step: a Polyak step ``(L - L*) g / |g|^2`` solved inside
    the box (coordinates pinned at a bound dropped and the step solved again on the rest, so the clip does
    not eat it), in log space first for such an op, then in the op's input space aiming exactly onto the edge
    and, where the edge is crossed rather than hit (not a zero divisor), 1.5 times as far. Then, unless the
    edge must be landed on exactly, shorter steps along the first (0.5, 0.2, 0.05 of it); and a sign step of
    10% of the box, for a gradient too small to trust its size. In a program that trains, where the full
    steps find the edge out of the box's reach, only the full steps: the rest reach it no better, and each
    trains the program on a batch of box corners. Searched weights that the program's training moves are stepped from where the
    training left them (the margin removed is the one the linear model predicts there). A step no worse
    than the recent accepted margins is accepted as a tie (a margin quantised at the float resolution)."""

    name = "land"

    @dataclass
    class State:
        prefer: str | None = None       # the space of the last accepted step: tried first

    def proposals(self, ctx: Context):
        s, cur = ctx.s, ctx.cur
        spaces = ["linear"]
        if s.spec.log_space and cur.log_grads is not None and math.isfinite(cur.log_loss):
            spaces = ["linear", "log"] if self.st.prefer == "linear" else ["log", "linear"]
        full = []
        for space in spaces:
            x = self._polyak(ctx, space, 1.0)
            if x is not None:
                full.append(x)
                yield f"land:{space}", x
            if space == "linear" and not s.spec.point:
                x = self._polyak(ctx, space, 1.5)
                if x is not None:
                    yield "land:cross", x
        # the full steps say the edge is out of the box's reach (a zero gradient says nothing: a step there is
        # a measurement after the program's training moved)
        rides = bool(full) and s.runner.trains and not s.frozen and out_of_reach(ctx, cur)
        if full and not exact_edge(ctx) and not rides:
            for t in (0.5, 0.2, 0.05):
                yield "land:back", between(s.values, full[0], t)
        if cur.grads is not None and cur.connected and not rides:
            yield "land:sign", sign_step(s.values, cur.grads, 0.1, s.bounds)

    def _polyak(self, ctx: Context, space: str, overshoot: float) -> dict | None:
        cur = ctx.cur
        if space == "log":
            grads, decrease = cur.log_grads, after_training(cur.log_loss, cur.log_train_shift)
        else:
            grads, decrease = cur.grads, after_training(cur.hard, cur.train_shift) * overshoot
        if grads is None or not (decrease > 0) or not math.isfinite(decrease):
            return None
        return box_step(ctx.s.values, grads, decrease, ctx.s.bounds)

    def accepts_ties(self, label: str) -> bool:
        return label in ("land:log", "land:linear", "land:cross")

    def on_accept(self, ctx: Context, label: str, before: dict, prev: Evaluation, after: Evaluation) -> None:
        if label in ("land:log", "land:linear", "land:cross"):
            self.st.prefer = "log" if label == "land:log" else "linear"


class Exact(Tactic):
    """Floating point is discrete: a gradient step rarely lands exactly on a zero divisor, makes a variance
    exactly 0 (in float32 it stops near 1e-14) or two vectors exactly parallel; interesting values do. The
    weakest sample set to 0, to a copy of another sample, to its own mean (equal features), to the bounds,
    to +-1, jittered by 1e-6 (an edge that rounding decides: each draw a new ticket); with searched weights,
    the weights the hard minimum depends on set to 0 (a column sum of ``|w|``, a gain). Each batch once per
    round (in a [0, 1] box several kinds coincide). Where the edge must be landed on exactly, the first three
    open the site's first round and every kind follows the gradient steps of every round; elsewhere every
    kind follows them once a round has failed, or where there is no gradient."""

    name = "exact"

    def lead(self, ctx: Context):
        if exact_edge(ctx) and ctx.core.points == 0:
            yield from self._kinds(ctx, ("support", "zero", "flat"))

    def proposals(self, ctx: Context):
        cur = ctx.cur
        if exact_edge(ctx) or ctx.core.failed_rounds >= 1 or cur.grads is None or not cur.connected:
            yield from self._kinds(ctx, ("support",) + MUTATIONS)

    def _kinds(self, ctx: Context, kinds: tuple[str, ...]):
        s, cur = ctx.s, ctx.cur
        if "support" in kinds:
            x = zero_support(s.values, cur.grads, s.bounds)
            if x is not None:
                yield "exact:support", x
        rows = ctx.weakest_rows(cur)
        inputs = [k for k in s.searched if not k.startswith(WEIGHT_PREFIX)]
        seen: set[bytes] = set()
        for salt, kind in enumerate(k for k in kinds if k != "support"):
            x_new, changed = dict(s.values), False
            for key in inputs:
                value = np.array(s.values[key], copy=True)
                lo, hi = s.bounds[key]
                new = mutate(kind, value, rows, lo, hi, salt)
                if new is not None and not np.array_equal(new, value):
                    x_new[key], changed = new.astype(value.dtype), True
            if not changed:
                continue
            digest = hashlib.blake2b(digest_size=16)
            for k in inputs:
                digest.update(np.ascontiguousarray(x_new[k]).tobytes())
            if digest.digest() in seen:
                continue
            seen.add(digest.digest())
            yield f"exact:{kind}", x_new


class Escape(Tactic):
    """A local minimum of the margin (a ReLU region, a ridge, a plateau) where every proposal of a round
    fails: twelve sign steps of 2.5% of the box, each taken whatever the margin does (GRIST's move), walk out
    of it. The walk ends early when its step would leave every input where it was (pinned at the box's
    corner) and nothing trains: each step left would measure the same point."""

    name = "escape"

    @dataclass
    class State:
        left: int = 0

    def on_failed_round(self, ctx: Context) -> bool:
        if ctx.cur.grads is None or not ctx.cur.connected:
            return False
        self.st.left = 12
        return True

    def holds(self, ctx: Context) -> bool:
        return self.st.left > 0

    def on_ride_start(self, ctx: Context, again: bool) -> None:
        self.st.left = 0                    # the ride moves the site elsewhere

    def step(self, ctx: Context) -> None:
        s, cur = ctx.s, ctx.cur
        x = sign_step(s.values, cur.grads, 0.025, s.bounds) if cur.grads is not None else s.values
        if cur.grads is None or ((s.frozen or not s.runner.trains) and in_place(s.values, x)):
            self.st.left = 0
            return
        ev = ctx.evaluate(x, "escape")
        self.st.left -= 1                   # only once taken: a quantum that ends first takes it next
        if ev.seen:
            ctx.move(x, ev, "escape")


class Freeze(Tactic):
    """A program's training moves the weights after every step the search takes, on batches no training would
    see (box corners, mutations), and on a hazard of the program's own loss (a softmax's cross-entropy) it
    lowers the loss on the very batch the search raises it on: the point the search reached is often nearer
    the edge at the factory's weights than at today's. After a failed round in a program that has trained,
    where the search has made progress from the site's first margin, the point is measured at today's weights
    and at the factory's (two steps, the same randomness); the
    site goes on from the lower, and from the factory's only where the edge is within the box's reach there:
    frozen (``SiteSearch.freeze``: every step starts from the factory's state, its training steps still run
    and are watched, their writes undone). Twice per site at most."""

    name = "freeze"

    @dataclass
    class State:
        stage: int = 0                  # 1: today's measured, the factory's next
        checks: int = 0
        today: float = math.inf         # the point's margin at today's weights, just measured
        saved: dict | None = None       # today's state, put back when the factory's is no nearer

    def on_failed_round(self, ctx: Context) -> bool:
        s, cur, origin = ctx.s, ctx.cur, ctx.core.origin
        if (not s.trained or s.frozen or self.st.checks >= 2 or not math.isfinite(cur.hard) or origin is None
                or not cur.hard < origin):
            return False
        self.st.stage, self.st.checks = 1, self.st.checks + 1
        return True

    def holds(self, ctx: Context) -> bool:
        return self.st.stage > 0

    def step(self, ctx: Context) -> None:
        s, st = ctx.s, self.st
        if st.stage == 1:
            ev = ctx.evaluate(s.values, "freeze")
            if not ev.seen:
                st.stage = 0
                return
            s.cache["freeze_today"] = ev
            st.stage, st.today, st.saved = 2, float(ev.hard), s.runner.get_state()
            return
        s.freeze()
        ev = ctx.evaluate(s.values, "freeze")
        today = s.cache.pop("freeze_today")
        if ev.seen and ev.hard < st.today and not out_of_reach(ctx, ev):
            ctx.move(s.values, ev, "freeze")          # frozen at the factory's weights
        else:
            s.thaw()
            s.runner.set_state(st.saved)
            ctx.move(s.values, today, "freeze")
        st.stage, st.saved = 0, None


class Ride(Tactic):
    """An edge out of the box's reach at today's weights, in a program that trains: no input in the box takes
    the margin to the edge, only the weights can, and the program's own training moves them. After a failed
    round (a frozen site too: its training is let accumulate again), the site rides that training: GRIST's
    step on the inputs, a sign step of 15% of each box against the margin's gradient taken whatever the
    margin does, the program training on the batch after each, under the randomness its point was measured
    under (one network per ride, not another each step); 5% of the batch (the least important rows)
    refreshed every 100 ride steps, and at once after a step that neither trained nor moved an input (the
    next would be the same step). A ride ends when the edge is within the box's reach again (back to rounds)
    or after ``ride_patience`` steps without a margin below the lowest the ride measured. After a first
    give-up the site rides once more from today's weights, on its first batch (the program's own data: a
    batch the search moved to the box's corners, with mixed labels, stops the training's walk) with the
    weakest row kept, under a new draw; after a second it rides no more. Twelve accepted points in a row
    that each kept more than half of the way (a crawl; not at a frozen site, whose training is undone at
    every step) start a ride too, which only its patience ends."""

    name = "ride"

    @dataclass
    class State:
        active: bool = False
        why: str = "box"            # "box": ends once the edge is within reach; "crawl": by patience only
        steps: int = 0
        best: float = math.inf
        since: int = 0
        rides: int = 0
        done: bool = False

    def _may(self, ctx: Context) -> bool:
        cur = ctx.cur
        return bool(ctx.s.runner.trains and not self.st.done and cur is not None and cur.seen
                    and math.isfinite(cur.hard) and cur.hard > 0)

    def on_failed_round(self, ctx: Context) -> bool:
        if self._may(ctx) and out_of_reach(ctx, ctx.cur):
            self._start(ctx, "box")
            return True
        return False

    def holds(self, ctx: Context) -> bool:
        # a crawl at the factory's weights (a frozen site) is progress there: the training is undone anyway
        return self.st.active or (ctx.core.slow_run >= 12 and not ctx.s.frozen and self._may(ctx))

    def _start(self, ctx: Context, why: str, last: Evaluation | None = None) -> None:
        """A ride starts; after a give-up (``last``: the ride's last evaluation) from the site's first batch."""
        s, st = ctx.s, self.st
        again = st.rides > 0
        st.active, st.why, st.steps, st.best, st.since, st.rides = True, why, 0, math.inf, 0, st.rides + 1
        ctx.core.slow_run = 0
        ctx.core.tried = 0
        s.thaw()
        if again:
            s.values = first_batch(ctx, last or ctx.cur)
            ctx.core.seed_step = s.step
        for t in ctx.tactics:
            t.on_ride_start(ctx, again)

    def step(self, ctx: Context) -> None:
        s, st = ctx.s, self.st
        if not st.active:
            self._start(ctx, "crawl")       # the ride's steps come next
            return
        ev = ctx.evaluate(s.values, "ride", lookahead=ctx.has("steer"))
        note_reachability(s, ev)
        st.steps += 1
        if s.unreachable or not ev.seen:
            return
        if ev.per_sample is not None:
            ctx.keep_per_sample(ev)
            importance(s, ev.per_sample)        # the reference a refresh measures each sample's move from
        if s.last_loss < st.best:
            st.best, st.since = float(s.last_loss), 0
        else:
            st.since += 1
        gave_up = st.since >= self.options.ride_patience
        if gave_up and st.rides < 2:
            self._start(ctx, "box", ev)
            return
        if gave_up or (st.why == "box" and not out_of_reach(ctx, ev)):
            st.active, st.done = False, gave_up
            ctx.core.failed_rounds = 0
            ctx.move(s.values, ev, "ride")
            return
        extra = None
        for t in ctx.tactics:
            extra = t.ride_direction(ctx, ev)
            if extra is not None:
                ctx.acted(t)            # the next ride step is steered
                break
        before = s.values
        if ev.grads is not None and ev.connected:
            s.values = sign_step(s.values, ev.grads, 0.15, s.bounds, extra)
        if st.steps % 100 == 0 or (not ev.trained and in_place(before, s.values)):
            self.refresh(ctx, ev.per_sample)

    def refresh(self, ctx: Context, per_sample=None) -> None:
        """The ride's own refresh, and the scheduler's of a riding site: 5% of the rows (most of the batch is
        what the training rides on)."""
        s = ctx.s
        point = s.cache.get("current")
        refresh_samples(s, 0.05, per_sample if per_sample is not None else s.strategy_state.get("last_per_sample"))
        if point is not None:
            s.cache["current"] = point          # the ride measures its own steps: no new start measurement


def first_batch(ctx: Context, ev: Evaluation | None) -> dict[str, np.ndarray]:
    """The site's first batch (real data) with the weakest row of ``ev`` kept where the search moved it;
    searched weights, which are no rows of a batch, stay where the search left them."""
    s = ctx.s
    keep = ctx.weakest_rows(ev) if ev is not None else []
    out = dict(s.values)
    for k, v in s.original.items():
        if k.startswith(WEIGHT_PREFIX):
            continue
        out[k] = np.array(v, copy=True)
        if 0 < len(keep) < s.batch_size and k in s.values and np.shape(s.values[k]) == np.shape(v):
            out[k][keep] = s.values[k][keep]
    return out


_RULES = ("both", "row", "none")


class Steer(Tactic):
    """Riding, a sign step against the margin's gradient moves the inputs toward the edge at today's weights,
    and ignores where the program's next training step on them takes the weights. The lookahead gradient
    (how the inputs steer that training step toward the edge, ``Evaluation.train_grads``) adds its sign: on
    every sample, on the weakest one only, or not at all. Which rule goes is learnt during each ride: each is
    tried for ten ride steps, its gain (how fast the margin fell: the median of the first three margins less
    that of the last three, per step) kept as a running mean; then the best so far, and every fifth phase
    the rule left untried longest. A ride from the factory's state starts with no lookahead."""

    name = "steer"

    @dataclass
    class State:
        rule: int = 0
        gains: list = field(default_factory=lambda: [None] * len(_RULES))
        used: list = field(default_factory=lambda: [-1] * len(_RULES))
        phases: int = 0
        losses: list = field(default_factory=list)

    def on_ride_start(self, ctx: Context, again: bool) -> None:
        self.st = self.State(rule=_RULES.index("none") if again else 0)

    def ride_direction(self, ctx: Context, ev: Evaluation) -> dict | None:
        rule = _RULES[self._rule(ctx.s.last_loss)]
        if rule == "none" or ev.train_grads is None:
            return None
        return rows_only(ev.train_grads, ctx.weakest_rows(ev)) if rule == "row" else ev.train_grads

    def _rule(self, loss: float) -> int:
        st = self.st
        st.losses.append(float(loss) if math.isfinite(loss) else 1e300)
        if len(st.losses) < 10:
            return st.rule
        gain = (float(np.median(st.losses[:3])) - float(np.median(st.losses[-3:]))) / len(st.losses)
        r = st.rule
        st.gains[r] = gain if st.gains[r] is None else 0.5 * st.gains[r] + 0.5 * gain
        st.phases += 1
        st.used[r] = st.phases
        untried = [i for i, g in enumerate(st.gains) if g is None]
        if untried:
            r = untried[0]
        elif st.phases % 5 == 0:
            r = int(np.argmin(st.used))
        else:
            r = int(np.argmax(st.gains))
        st.rule, st.losses = r, []
        return r


# the strategy's list: the order is the order of the hooks (holds, proposals, reactions)
DEFAULT_TACTICS: tuple[type[Tactic], ...] = (Freeze, Ride, Steer, Land, Exact, Escape)
