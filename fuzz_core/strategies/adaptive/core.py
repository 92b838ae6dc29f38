"""The adaptive strategy's loop: rounds of proposals from a list of tactics, and the tactics' reactions.

Each call of :meth:`Adaptive.iterate` does one of three things:

1. a tactic that *holds* the site (a ride of the program's training, an escape walk, a pending
   re-measurement) takes its next step;
2. otherwise a *round*: the tactics' proposals for the current point, in the list's order, each evaluated
   (one step each) until one lowers the margin (the hard minimum), which is then accepted;
3. a round in which no proposal was accepted is *failed*: the first tactic that reacts to it (starts a
   ride, a walk, a refresh) takes the site.

The tactics are small classes (:class:`Tactic`), each with a dataclass of its own state and a docstring
naming the failure it answers; an ablation removes one from the list (:data:`~.tactics.DEFAULT_TACTICS`).
Every forward pass counts as a step. The state of the loop and of every tactic is kept in
``SiteSearch.strategy_state`` as plain arrays and JSON values (``"<owner>.<field>"``), so a site
checkpoints anywhere; a quantum may end inside any evaluation, and the next one goes on with the same
evaluation (nothing is changed before an evaluation returns), so a search does not depend on how it is
sliced into quanta.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Sequence

import numpy as np

from fuzz_core.backends.base import Evaluation
from fuzz_core.strategies.base import Strategy, distance, note_reachability, refresh_samples

if TYPE_CHECKING:
    from fuzz_core.search import SiteSearch


@dataclass(frozen=True)
class AdaptiveOptions:
    """The settings of the adaptive strategy a user may change.

    ``ride_patience``: steps a ride of the program's training goes on without measuring a margin below the
    lowest it measured before it gives up (the walk of the weights has gone astray)."""

    # metadata: the tactics that read a setting (an ablation of the setting changes only where they act)
    ride_patience: int = field(default=200, metadata={"tactics": ("ride",)})

    def __post_init__(self) -> None:
        if self.ride_patience < 1:
            raise ValueError(f"ride_patience must be >= 1, got {self.ride_patience!r}")


@dataclass
class CoreState:
    """The loop's own state: the current point's randomness, the round in progress, the accepted points."""

    seed_step: int | None = None    # candidates share this step's randomness (common random numbers)
    tried: int = 0                   # proposals of the current round already evaluated
    failed_rounds: int = 0           # rounds in a row without an accepted proposal
    points: int = 0                  # points the site moved to after its first
    origin: float | None = None      # the first margin: what progress is measured from
    recent: list = field(default_factory=list)     # the last accepted margins (ties are measured against them)
    ties: int = 0                    # accepted ties in a row
    slow_run: int = 0                # accepted points in a row that each kept more than half of the way
    label: str | None = None         # the label of the next start evaluation ("refresh": a refresh made the point)
    acts: dict = field(default_factory=dict)       # tactic -> times it acted (a step it took, a reaction)


_STATE_KINDS = (int, float, bool, str, list, dict, np.ndarray, type(None))


def load(owner: str, cls: type, store: dict[str, Any]) -> Any:
    """The dataclass ``cls`` of ``owner`` from ``store`` (``"owner.field"`` keys); defaults where absent."""
    values = {}
    for f in fields(cls):
        key = f"{owner}.{f.name}"
        if key in store:
            values[f.name] = store[key]
    return cls(**values)


def save(owner: str, state: Any, store: dict[str, Any]) -> None:
    """Write ``state`` back as ``"owner.field"`` keys: plain arrays, dicts of arrays and JSON values."""
    for f in fields(state):
        value = getattr(state, f.name)
        if not isinstance(value, _STATE_KINDS):
            raise TypeError(f"{owner}.{f.name}: {type(value).__name__} is not a checkpointable state value")
        store[f"{owner}.{f.name}"] = value


class Tactic:
    """One named way of moving the search. Subclasses override what they do; the defaults do nothing.

    ``State``: the tactic's own dataclass (plain values, arrays); ``self.st`` during a call. A tactic that
    does not act changes nothing the loop or another tactic reads, so that removing a tactic that never
    acted on a site leaves that site's search as it was (``tests/test_adaptive_tactics.py``)."""

    name: ClassVar[str] = "tactic"

    @dataclass
    class State:
        pass

    st: Any
    options: AdaptiveOptions

    def lead(self, ctx: "Context") -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        """Candidates that open the round, before any tactic's :meth:`proposals` (as :meth:`proposals`)."""
        return iter(())

    def proposals(self, ctx: "Context") -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        """Candidate points for the current round, each ``(label, values)``: a deterministic function of
        the current point and the states (a resumed round regenerates the same list)."""
        return iter(())

    def holds(self, ctx: "Context") -> bool:
        """The tactic is in the middle of something of its own (its :meth:`step` goes next)."""
        return False

    def step(self, ctx: "Context") -> None:
        """One step while holding the site."""

    def on_failed_round(self, ctx: "Context") -> bool:
        """A round failed; True: this tactic takes the site (the tactics after it do not react). It must not
        evaluate here: a reaction that needs steps holds the site and takes them in :meth:`step`."""
        return False

    def on_accept(self, ctx: "Context", label: str, before: dict, prev: Evaluation, after: Evaluation) -> None:
        """A proposal was accepted: the site moved from ``before`` (measured ``prev``) to ``ctx.s.values``."""

    def on_move(self, ctx: "Context", label: str) -> None:
        """The site moved somewhere a round did not choose (a walk, a ride, a refresh, a freeze)."""

    def accepts_ties(self, label: str) -> bool:
        """This tactic's proposal ``label`` may be accepted on a margin no worse than the recent ones."""
        return False

    def ride_direction(self, ctx: "Context", ev: Evaluation) -> dict[str, np.ndarray] | None:
        """During a ride, a direction to add to the margin's sign step (see :class:`~.tactics.Steer`)."""
        return None

    def on_ride_start(self, ctx: "Context", again: bool) -> None:
        """A ride of the program's training starts (``again``: from the factory's state, after a give-up)."""


class Context:
    """What a tactic sees during one call: the search, the loop's state, the other tactics."""

    def __init__(self, s: "SiteSearch", core: CoreState, tactics: Sequence[Tactic], options: AdaptiveOptions):
        self.s, self.core, self.tactics, self.options = s, core, tactics, options
        self.actor: Tactic | None = None     # the tactic whose step the next evaluation is

    @property
    def cur(self) -> Evaluation | None:
        return self.s.cache.get("current")

    def has(self, name: str) -> bool:
        return any(t.name == name for t in self.tactics)

    def evaluate(self, values: dict, label: str, **kw) -> Evaluation:
        """One step at ``values`` under the current point's randomness, counted as the acting tactic's (the
        step that triggers too: ``SiteSearch.evaluate`` raises on it)."""
        from fuzz_core.search import Triggered

        kw.setdefault("seed_step", self.core.seed_step)
        try:
            ev = self.s.evaluate(values, event=label, **kw)
        except Triggered:
            if self.actor is not None:
                self.acted(self.actor)
            raise
        if self.actor is not None:
            self.acted(self.actor)
        return ev

    def acted(self, tactic: Tactic) -> None:
        self.core.acts[tactic.name] = self.core.acts.get(tactic.name, 0) + 1

    def keep_per_sample(self, ev: Evaluation) -> None:
        if ev.per_sample is not None:
            self.s.strategy_state["last_per_sample"] = ev.per_sample

    def move(self, values: dict, ev: Evaluation, label: str) -> None:
        """The site goes on from ``values`` (measured ``ev``) without a round having chosen it."""
        self.s.values = values
        self.s.cache["current"] = ev
        self.core.tried = 0
        self.core.points += 1
        self.core.slow_run = 0          # a crawl is a run of accepted points
        self.keep_per_sample(ev)
        for t in self.tactics:
            t.on_move(self, label)

    def drop_point(self) -> None:
        """Forget the current evaluation: the next call measures the point (after a refresh, a freeze)."""
        self.s.cache.pop("current", None)
        self.core.tried = 0
        self.core.seed_step = None

    def weakest_rows(self, ev: Evaluation) -> list[int]:
        """The sample nearest the edge (every sample when there is no per-sample margin)."""
        if ev.per_sample is not None and len(ev.per_sample) == self.s.batch_size:
            return [int(np.argmin(ev.per_sample))]
        return list(range(self.s.batch_size))

    def kept(self, before: Evaluation, after: Evaluation) -> float:
        """The share of the way to the edge a step kept, measured as the search measures the site (in log
        space for an op judged there: a softmax output from 1e-10 to 1e-12 kept 95% of 80 nats, not 1%)."""
        if self.s.spec.log_space and math.isfinite(before.log_loss) and math.isfinite(after.log_loss):
            a, b = after.log_loss, before.log_loss
        else:
            a, b = after.hard, before.hard
        return a / b if b > 0 else 0.0


class Adaptive(Strategy):
    """CDeepFuzz's own strategy: rounds of proposals from a short list of named tactics (module docstring)."""

    name = "adaptive"

    def __init__(self, options: AdaptiveOptions | None = None, tactics: Sequence[type[Tactic]] | None = None):
        from fuzz_core.strategies.adaptive.tactics import DEFAULT_TACTICS

        self.options = options or AdaptiveOptions()
        self.tactic_types = list(DEFAULT_TACTICS if tactics is None else tactics)
        names = [t.name for t in self.tactic_types]
        if len(set(names)) != len(names):
            raise ValueError(f"a tactic appears twice in {names}")

    # -- state ------------------------------------------------------------------------------
    def _open(self, s: "SiteSearch") -> Context:
        core = load("core", CoreState, s.strategy_state)
        tactics = []
        for cls in self.tactic_types:
            t = cls()
            t.options = self.options
            t.st = load(cls.name, cls.State, s.strategy_state)
            tactics.append(t)
        return Context(s, core, tactics, self.options)

    @staticmethod
    def _close(ctx: Context) -> None:
        save("core", ctx.core, ctx.s.strategy_state)
        for t in ctx.tactics:
            save(t.name, t.st, ctx.s.strategy_state)

    # -- the loop ---------------------------------------------------------------------------
    def iterate(self, s: "SiteSearch") -> None:
        ctx = self._open(s)
        try:
            self._iterate(ctx)
        finally:
            self._close(ctx)

    def _iterate(self, ctx: Context) -> None:
        s, core = ctx.s, ctx.core
        cur = ctx.cur
        if cur is None:
            if core.seed_step is None:
                core.seed_step = s.step
            ev = ctx.evaluate(s.values, core.label or "start")
            note_reachability(s, ev)
            core.label = None
            if core.origin is None and ev.seen:
                core.origin = float(ev.hard)
            s.cache["current"] = ev
            core.tried = 0
            core.recent = [float(ev.hard)]
            ctx.keep_per_sample(ev)
            return
        for t in ctx.tactics:
            if t.holds(ctx):
                ctx.actor = t
                t.step(ctx)
                return
        i, proposed = 0, False
        for t, label, x in self._round(ctx):
            proposed = True
            if i < core.tried:
                i += 1
                continue
            ctx.actor = t
            ev = ctx.evaluate(x, label)
            ctx.actor = None
            i += 1
            core.tried = i             # only once evaluated: a quantum that ends first evaluates it again
            if ev.seen and (ev.hard < cur.hard or (t.accepts_ties(label) and self._tie(core, ev, cur))):
                self._accept(ctx, x, ev, label)
                return
        core.tried = 0
        core.failed_rounds += 1
        for t in ctx.tactics:
            if t.on_failed_round(ctx):
                ctx.acted(t)
                return
        if not proposed:
            # nothing to propose and no tactic reacts (an ablated list): measure the point again under a new
            # draw of the program's randomness, so that every call takes a step
            ev = s.evaluate(s.values, event="idle")
            ctx.move(s.values, ev, "idle")

    @staticmethod
    def _round(ctx: Context) -> Iterator[tuple[Tactic, str, dict]]:
        """The round's proposals: every tactic's leading ones, then every tactic's others, in the list's order."""
        for hook in ("lead", "proposals"):
            for t in ctx.tactics:
                for label, x in getattr(t, hook)(ctx):
                    yield t, label, x

    @staticmethod
    def _tie(core: CoreState, ev: Evaluation, cur: Evaluation) -> bool:
        """A non-monotone acceptance (as in Grippo-Lampariello-Lucidi line searches): at the float resolution
        of the op's input the margin is quantised and noisy by an ulp while the gradient still points the way
        (two embeddings 1e-4 rad apart compute a cosine of exactly 1.0, or one ulp below). A step no worse
        than the last three accepted margins, at most 16 times the current one (a few ulps, not a return to
        an old margin), four in a row at most."""
        recent = core.recent or [cur.hard]
        if ev.hard <= max(recent) and ev.hard <= 16.0 * cur.hard and core.ties < 4:
            core.ties += 1
            return True
        return False

    def _accept(self, ctx: Context, values: dict, ev: Evaluation, label: str) -> None:
        s, core = ctx.s, ctx.core
        prev, before = ctx.cur, s.values
        if ev.hard < prev.hard:
            core.ties = 0
        core.recent = (core.recent + [float(ev.hard)])[-3:]
        core.slow_run = core.slow_run + 1 if ctx.kept(prev, ev) > 0.5 else 0
        core.failed_rounds = 0
        core.tried = 0
        core.points += 1
        s.values = values
        s.cache["current"] = ev
        ctx.keep_per_sample(ev)
        for t in ctx.tactics:
            t.on_accept(ctx, label, before, prev, ev)

    def refresh(self, s: "SiteSearch", fraction: float) -> None:
        """The scheduler saw a plateau: a tactic holding the site refreshes its own way (a ride: a small
        share, most of the batch is what the training rides on); otherwise the least important samples are
        replaced and the point measured anew."""
        ctx = self._open(s)
        try:
            for t in ctx.tactics:
                if hasattr(t, "refresh") and t.holds(ctx):
                    t.refresh(ctx)
                    return
            refresh_samples(s, fraction, s.strategy_state.get("last_per_sample"))
            ctx.drop_point()
            ctx.core.label = "refresh"
            for t in ctx.tactics:
                t.on_move(ctx, "refresh")
        finally:
            self._close(ctx)


def nats(s: "SiteSearch", ev: Evaluation) -> np.ndarray | None:
    """The per-sample distance to the edge in the search's units (:func:`~fuzz_core.strategies.base.distance`)."""
    return None if ev.per_sample is None else distance(s, ev.per_sample)
