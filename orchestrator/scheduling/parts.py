"""The parts the ``share`` policy is composed of, each small, pure and tested alone (as
Optuna wraps pruners): a predictor reads a site's reports, a power schedule turns its
prediction into a share of the steps, a refresh policy asks for fresh samples on a
plateau, a patience rule retires a site that stopped improving, and a starvation guard
bounds how long any live site waits.

Each part is a frozen dataclass of validated options (its configuration) and keeps
nothing: what it learns about a site lives in that site's record (plain data, so the
scheduler's state is the records), which the part reads and writes.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.scheduling.numeric import (
    check_fraction, check_int, check_positive, curve_prediction, flag, floats, improved, is_plateau, number,
)


# ---------------------------------------------------------------------------------- predictor

@dataclass(eq=False)
class CurveStats:
    """What the predictor knows of one site."""
    trace: list[float] = field(default_factory=list)   # the last `window` losses
    curve: list[float] = field(default_factory=list)   # best loss so far, after each of them
    best: float = math.inf
    first: float = math.nan          # first finite loss
    pred: float = math.nan           # predicted steps to trigger; nan before any data, inf when not falling
    log_space: bool = False          # its losses are logs of the margin
    gained: int = 0                  # steps used when its best loss last improved for real
    mark: float = math.inf           # its best loss then
    reports: int = 0                 # reports with losses
    moving: bool = True              # its last `window` losses are not all one value


@dataclass(frozen=True)
class CurvePredictor:
    """Predicted steps to trigger: the best loss over the fall per step of the best-loss curve
    over the last ``window`` losses (monotone, so noise does not read as progress). A fall that
    removes at most ``plateau_tol`` of the margin counts as none (a loss parked just above a
    clamp, say 1e-45, is not "almost there"); a report with no new best says the fall has
    stopped, for now. Log-space losses (logs of the margin, an arbitrary zero) are judged by
    differences of logs."""

    window: int = 16
    plateau_tol: float = 0.01

    def __post_init__(self) -> None:
        check_int("window", self.window, 3)
        check_fraction("plateau_tol", self.plateau_tol)

    def observe(self, st: CurveStats, losses: Any, best_loss: Any, log_space: Any, used: int) -> bool:
        """Read one report into ``st``; True when the best loss improved for real: by more than the
        tolerance since the last such gain (so a slow, steady fall counts, however it is sliced)."""
        losses = floats(losses)
        finite = [v for v in losses if math.isfinite(v)]
        if losses:                 # a report without losses (a resumed site) does not say
            st.log_space = flag(log_space)
            st.reports += 1
        ls, tol = st.log_space, self.plateau_tol
        if finite and math.isnan(st.first):
            st.first = finite[0]
        before = st.best
        st.best = min([st.best, *(v for v in finite + [number(best_loss)] if math.isfinite(v))])
        gain = improved(st.mark, st.best, tol, ls)
        if gain:
            st.gained, st.mark = used, st.best
        st.trace = (st.trace + losses)[-self.window:]
        recent = [v for v in st.trace if math.isfinite(v)]
        if finite and recent:      # a loss parked at a clamp repeats one value; a search that wanders does not
            st.moving = len(set(recent)) > 1
        st.curve, st.pred = curve_prediction(st.curve, finite, st.best, st.best < before, self.window, tol, ls)
        return gain

    def flat(self, st: CurveStats) -> bool:
        """A full window of losses that fell by at most the tolerance (or rose)."""
        return len(st.trace) == self.window and is_plateau(st.trace, self.plateau_tol, st.log_space)

    def helped(self, st: CurveStats, before: float) -> bool:
        """The best loss improved for real since it was ``before``."""
        return improved(before, st.best, self.plateau_tol, st.log_space)


# ---------------------------------------------------------------------------------- power schedule

@dataclass(frozen=True)
class PowerSchedule:
    """A site's weight (its share of the steps, relative to the others) from its predicted steps
    to trigger, in the manner of a fuzzer's power schedule: AFLFast (Böhme, Pham and Roychoudhury,
    CCS 2016) gives a seed energy by how promising its path is, relative to the others; Entropic
    (Böhme, Manès and Cha, FSE 2020) by the information it still yields; EcoFuzz (Yue et al.,
    USENIX Security 2020) by a bandit's estimate of its reward, never writing an arm off.

    The weight of a falling site is ``cap * (ref / pred) ** power``: the closest live falling site
    (``ref``, its prediction) gets ``cap``, one predicted ``k`` times farther ``cap / k ** power``;
    times the share of its prediction that its remaining budget covers (``horizon * remaining /
    pred``, at most 1: a site predicted far past its budget is rarely about to trigger); all within
    [floor, cap]. A site that is not falling gets ``floor``, never 0, unless it has ``progressed``
    (covered ``progress`` of the way from its first loss to the edge, then stalled): it gets
    ``stalled`` (a bug whose loss falls, sits still for hundreds of steps, then jumps to the edge
    looks like that; a site that never moved does not), as long as its loss still moves (a guarded
    op's loss that fell to its clamp and sits there, one value step after step, does not: it gets
    ``floor``; the caller says which). One with no prediction yet gets 1
    (optimism under uncertainty, as a bandit's first pulls); one at the edge gets ``cap``.

    The out-of-box probe (:class:`ReachProbe`) overrides the loss. A site whose own op fired with its
    inputs free to leave their bounds gets at least ``reached``: it can go non-finite, and the weights
    or the data must bring it into the box (a bug that the program's own training reaches, whose loss
    sits flat until it jumps). One whose op did not fire gets ``floor * unreached`` whatever its loss
    does: a guarded op (``x / max(|x|, eps)``, ``sqrt(var + eps)``, ``log(p.clamp(1e-12))``) whose loss
    creeps toward its clamp for hundreds of steps looks the most promising of all. The two verdicts
    are not worth the same: on GRIST's programs (``benchmarks/grist_suite/reach.py``) 40 of the 42
    sites whose op fired outside watch a call of GRIST's bugs, but 26 of the 61 bug sites not found
    within 20 steps did not fire in the probe's 16 steps either (softmax outputs that only training drives to
    0). So "did not fire" only takes away what the loss promised (``unreached`` 1: the floor, as a
    flat site), never less; 0.25 saved a little more on the scheduler benchmark and nothing on
    GRIST's PyTorch programs, and would starve those 26 bugs four times as much."""

    floor: float = 0.1
    cap: float = 16.0
    power: float = 1.0
    horizon: float = 4.0
    stalled: float = 1.0
    progress: float = 0.5
    unreached: float = 1.0
    reached: float = 1.0

    def __post_init__(self) -> None:
        check_fraction("floor", self.floor)
        check_positive("cap", self.cap)
        if self.cap < 1:
            raise ValueError(f"cap must be >= 1, got {self.cap!r}")
        check_positive("power", self.power)
        check_positive("horizon", self.horizon)
        check_positive("stalled", self.stalled)
        check_fraction("progress", self.progress)
        if check_positive("unreached", self.unreached) > 1:
            raise ValueError(f"unreached must be in (0, 1], got {self.unreached!r}")
        check_positive("reached", self.reached)

    def weight(self, pred: float, remaining: int, ref: float = math.nan, progressed: bool = False,
               outside: bool | None = None) -> float:
        """``pred``: the site's predicted steps to trigger (nan: none yet, inf: not falling);
        ``remaining``: its budget left; ``ref``: the closest live falling site's prediction
        (nan: none, the site is weighed as if it were the closest); ``progressed``: see the class;
        ``outside``: the out-of-box probe's verdict (None: not probed)."""
        if outside is False:
            return self.floor * self.unreached
        w = self._weight(pred, remaining, ref, progressed)
        return min(self.cap, max(w, self.reached)) if outside else w

    def _weight(self, pred: float, remaining: int, ref: float, progressed: bool) -> float:
        if math.isnan(pred):
            return 1.0
        if pred <= 0:
            return self.cap
        if not math.isfinite(pred):
            return min(self.cap, max(self.floor, self.stalled)) if progressed else self.floor
        rel = min(1.0, ref / pred) ** self.power if math.isfinite(ref) and ref > 0 else 1.0
        feasible = min(1.0, self.horizon * max(remaining, 0) / pred)
        return min(self.cap, max(self.floor, self.cap * rel * feasible))


# ---------------------------------------------------------------------------------- reach probe

@dataclass(eq=False)
class ReachStats:
    outside: bool | None = None      # the last verdict: its own op fired outside the bounds (None: none yet)
    next_at: int = 0                 # steps used from which the next probe is due (besides ``after``)
    probes: int = 0                  # probes asked for and answered


@dataclass(frozen=True)
class ReachProbe:
    """When to ask whether a site's op can go non-finite at all: once it has used ``after`` steps
    without a trigger, its grant asks the worker to probe it outside its bounds for ``steps``
    steps (:func:`orchestrator.worker.reach_verdict`: the site's search goes on, in a box 100
    times as wide, and is put back; those steps are not the site's budget). A site whose op did
    not fire is probed again each time its steps used have grown ``growth`` times (the program's
    training may bring its edge closer); one whose op fired is not probed again. ``steps`` 0
    turns the probes off. On the scheduler benchmark none of 2,842 probes of its guarded sites
    fired, and 205 of 259 probes of its bug sites did, before the verdict counted a site's own
    hazard named second in its step (the second ``exp`` of ``exp(z) / exp(z).sum()``, a bug site,
    never fired until then; ``benchmarks/RESULTS.md``)."""

    after: int = 20
    steps: int = 16
    growth: float = 2.0

    def __post_init__(self) -> None:
        check_int("after", self.after, 1)
        check_int("steps", self.steps, 0)
        if isinstance(self.growth, bool) or not number(self.growth) > 1 or not math.isfinite(number(self.growth)):
            raise ValueError(f"growth must be a finite number > 1, got {self.growth!r}")

    def due(self, st: ReachStats, used: int) -> bool:
        """A grant to a site with ``used`` steps would ask for a probe."""
        return self.steps > 0 and st.outside is not True and used >= max(self.after, st.next_at)

    def ask(self, st: ReachStats, used: int) -> int:
        """Steps of the probe a grant to a site with ``used`` steps asks for (0: none); once asked,
        the next is due only when the steps used have grown ``growth`` times (answered or not: a
        program that raises outside its bounds gives no verdict, and is not asked at every grant)."""
        if not self.due(st, used):
            return 0
        st.next_at = max(self.after, int(math.ceil(used * self.growth)))
        return self.steps

    def observe(self, st: ReachStats, outside: Any) -> None:
        """A report; ``outside`` its probe's verdict (None: it carried none)."""
        if outside is not None:
            st.outside, st.probes = flag(outside), st.probes + 1


# ---------------------------------------------------------------------------------- refresh

@dataclass(eq=False)
class RefreshStats:
    plateau: bool = False            # the next grant refreshes (unless stale)
    best_at_refresh: float | None = None   # the best loss when the last refresh was granted, until judged
    fruitless: int = 0               # refreshes in a row that did not lower the best loss
    stale: bool = False              # refreshed in vain max_refreshes times, and no real gain since


@dataclass(frozen=True)
class PlateauRefresh:
    """A plateau (a flat window, or the search's own hint) gets a REFRESH; each refresh is
    judged at the next plateau, and after ``max_refreshes`` fruitless ones in a row the site
    is stale (no more refreshes) until its best loss improves for real.

    A plateau is ripe for a refresh only once the site has gone without a real gain for at
    least a full window and ``grow`` times the steps it took to reach its best (restart
    intervals that grow with the progress a restart would throw away, as in Luby, Sinclair
    and Zuckerman's restart schedules): a site that never moved is refreshed after a window;
    one that fell for 400 steps and then sat still is given 400 more first. A refresh of a
    grist search restarts it from fresh samples, and on the scheduler benchmark early
    refreshes of slow, steady bugs cost more steps than any allocation saved."""

    max_refreshes: int = 2
    grow: float = 1.0

    def __post_init__(self) -> None:
        check_int("max_refreshes", self.max_refreshes, 0)
        if isinstance(self.grow, bool) or not number(self.grow) >= 0 or not math.isfinite(number(self.grow)):
            raise ValueError(f"grow must be a finite number >= 0, got {self.grow!r}")

    def ripe(self, used: int, gained: int, window: int) -> bool:
        """Steps ``used`` so far, a real gain last at ``gained``: long enough without one."""
        return used - gained >= max(window, self.grow * gained)

    def observe(self, st: RefreshStats, plateau: bool, gained: bool, helped: bool) -> None:
        """``plateau``: the predictor's test or the search's hint; ``gained``: a real gain in this
        report; ``helped``: the best loss improved for real since the last refresh was granted."""
        if gained:
            st.fruitless, st.stale = 0, False
        st.plateau = plateau
        if st.plateau and st.best_at_refresh is not None:
            st.fruitless = 0 if helped else st.fruitless + 1
            st.best_at_refresh = None
        if st.plateau and st.fruitless >= self.max_refreshes:
            st.stale = True

    def wants_refresh(self, st: RefreshStats) -> bool:
        return st.plateau and not st.stale

    def granted(self, st: RefreshStats, refreshed: bool, best: float) -> None:
        if refreshed:
            st.plateau, st.best_at_refresh = False, best


# ---------------------------------------------------------------------------------- patience

@dataclass(frozen=True)
class Patience:
    """Retire a stale site whose best loss has not improved for ``after`` of its steps (None: half
    the budget), so that its remaining budget goes to the others (RETIRE_NO_PROGRESS). Only a stale
    site is retired: refreshed in vain (see :class:`PlateauRefresh`), and no real gain since. On the
    scheduler benchmark a fifth of the budget saved steps (raw units, adaptive: 1.58x round-robin's
    instead of 1.11x) but retired bugs that round-robin finds (standardised, adaptive: 192 of 200
    found instead of 199; grist 174 instead of 182): a finder that gives up on bugs early is not
    believed, so the default stays half. A site whose op fired outside its bounds is never retired
    (see :meth:`gives_up`)."""

    after: int | None = None

    def __post_init__(self) -> None:
        if self.after is not None:
            check_int("after", self.after, 1)

    def steps(self, max_steps: int) -> int:
        return max(1, max_steps // 2) if self.after is None else self.after

    def gives_up(self, stale: bool, used: int, gained: int, max_steps: int, outside: bool | None = None) -> bool:
        """``outside``: the out-of-box probe's verdict. A site whose own op fired there is never given
        up: it can go non-finite, and what it waits for is the program's own training (GRIST's ID_63
        RBM: its exp site sat at one loss for 150 steps and was retired 10 steps before its budget
        ran out); the budget is its bound."""
        return outside is not True and stale and used - gained >= self.steps(max_steps)


# ---------------------------------------------------------------------------------- starvation

@dataclass(frozen=True)
class StarvationGuard:
    """A reserve: ``reserve`` of the steps are dealt round-robin among the live sites (the least
    recently served by the reserve first, a min quantum a turn), the rest by the power schedule.
    So no live site ever gets less than about ``reserve / live sites`` of the steps, whatever the
    predictions say: a bug the predictions misjudge needs at most about ``1 / reserve`` times the
    campaign steps it needs under round-robin (fewer, as the sites the schedule favours leave), and
    no live idle site waits more than :meth:`bound` allocations (after the first pass over the
    sites). The price: only ``1 - reserve`` of the steps follow the predictions, so a site gets at
    most ``reserve / live + 1 - reserve`` of them (with 0.3 and 3 live sites, two of them equally
    promising: each at most 0.45, 1.35 times round-robin's third). The default, 0.3, was chosen on
    the scheduler benchmark (``benchmarks/scheduler_benefit.py``): 0.5 bounds the worst case at 2x
    round-robin in theory but spends half of every campaign like round-robin; 0.3 stayed within
    the 2x bound on every measured seed (see ``benchmarks/RESULTS.md``)."""

    reserve: float = 0.3

    def __post_init__(self) -> None:
        check_fraction("reserve", self.reserve)

    def lane(self, reserve_steps: int, share_steps: int) -> str:
        """The lane of the next grant: the reserve while it has had at most its part of the steps."""
        return "reserve" if reserve_steps * (1 - self.reserve) <= self.reserve * share_steps else "share"

    def bound(self, live: int) -> int:
        """The most allocations a live idle site waits for a grant, with ``live`` live sites (one
        slot, every grant at least a min quantum): each of the others' reserve turns, and between two
        reserve turns at most ``ceil((1 - reserve) / reserve)`` share grants."""
        return max(0, live) * (1 + math.ceil((1 - self.reserve) / self.reserve - 1e-12))


def part_options(part: Any) -> dict[str, Any]:
    """A part's options as JSON data."""
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else repr(v)) for k, v in asdict(part).items()}
