"""Step-budget scheduler: decides which op sites get the next quanta of steps.

Pure (stdlib and numpy only): the controller reports with ``on_progress`` and
``retire``, asks with ``allocate`` and alone turns the returned ``Decision`` values
into actor calls. Policies: ``round-robin`` (equal quanta, least recently served
first: the baseline) and ``loss-slope`` (a cheap probe of every site, then quanta in
inverse proportion to the predicted steps to trigger, closest sites first, an
exploration floor that grows with the budget the others got, a REFRESH when a site
plateaus and early retirement once refreshes stay fruitless). Missing or NaN data in
a report means "continue".
"""
from __future__ import annotations

import inspect
import logging
import math
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple, Sequence

import numpy as np

__all__ = [
    "Action", "Allocation", "Decision", "LossSlopeScheduler", "POLICIES",
    "RoundRobinScheduler", "Scheduler", "SiteProgress", "make_scheduler",
]

log = logging.getLogger(__name__)

EPS = 1e-9                # smallest fall rate (loss per step) in a prediction
DEFAULT_WINDOW = 16       # losses the slope and the plateau test look at
DEFAULT_MAX_FACTOR = 4    # largest loss-slope quantum, in quanta
DEFAULT_STARVE_AFTER = 64  # allocations a live idle site may be passed over (a backstop)
DEFAULT_PLATEAU_TOL = 0.01  # a window falling by less than this fraction is flat
DEFAULT_MAX_REFRESHES = 2   # fruitless refreshes before a site gets floor quanta only
DEFAULT_PROBE_QUANTA = 4    # the first pass over never-served sites costs about this many quanta
DEFAULT_PROGRESS = 0.5      # a site whose best loss is below this share of its first has progressed


class Action(Enum):
    """What the controller does with a site."""
    GRANT = "grant"                        # run `steps` more steps
    REFRESH = "refresh"                    # refresh samples, then run `steps` steps
    RETIRE_FOUND = "retire_found"          # triggered: never granted again
    RETIRE_EXHAUSTED = "retire_exhausted"  # max_steps spent


@dataclass(frozen=True)
class Decision:
    site_id: str
    action: Action
    steps: int = 0


@dataclass(frozen=True)
class SiteProgress:
    """A site's report after a quantum: ``losses`` holds the suspect loss after each step
    of that quantum (>= 0, 0 at the boundary; nan/inf tolerated), ``steps_used`` the
    site's total so far. ``log_space``: the losses are logs of the margin (less a floor),
    as for ``log`` and ``div``: their zero is arbitrary, so a fall counts by the share of
    the margin it removes (a difference of logs), not by its share of the loss."""
    site_id: str
    steps_used: int
    losses: tuple[float, ...]
    best_loss: float
    triggered: bool
    plateau_hint: bool = False
    log_space: bool = False


class Allocation(NamedTuple):
    """One grant, for plotting: steps to ``site_id``, ``total`` granted so far overall."""
    site_id: str
    steps: int
    total: int


def _number(value: Any) -> float:
    """``value`` as a float; nan when it is missing or not a number."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _floats(values: Any) -> list[float]:
    """A loss trace as floats (nan for junk); [] when it is missing or not iterable."""
    try:
        return [_number(v) for v in values]
    except TypeError:
        return []


def _flag(value: Any) -> bool:
    """True only for a real true value (True, numpy True, nonzero int); nan/None are False."""
    return isinstance(value, (bool, np.bool_, int, np.integer)) and bool(value)


def _slope(losses: Sequence[float]) -> float:
    """Least-squares slope (loss per step) of the finite losses, by position in the trace;
    nan with fewer than two finite points."""
    y = np.asarray(_floats(losses), dtype=float)
    x = np.arange(y.size, dtype=float)
    ok = np.isfinite(y)
    if ok.sum() < 2:
        return math.nan
    x, y = x[ok] - x[ok].mean(), y[ok]
    with np.errstate(all="ignore"):
        s = float(np.sum(x * (y - y.mean())) / np.sum(x * x))
    return s if math.isfinite(s) else math.nan


def _predicted_steps(loss: float, slope: float, eps: float = EPS) -> float:
    """Steps until ``loss`` reaches 0 at ``slope``: loss / max(eps, -slope).

    0 at or past the boundary; inf when the loss or the slope is unknown."""
    loss, slope = _number(loss), _number(slope)
    if not math.isfinite(loss) or math.isnan(slope):
        return math.inf
    return 0.0 if loss <= 0 else loss / max(eps, -slope)


def _small_fall(fall: float, level: float, tol: float, log_space: bool = False) -> bool:
    """True when a fall of the loss to ``level`` removed at most ``tol`` of the margin: of the
    level for a plain loss, ``-log(1 - tol)`` for a log-space one (a ratio of margins)."""
    return fall <= (-math.log1p(-tol) if log_space else tol * abs(level))


def _improved(before: float, after: float, tol: float, log_space: bool = False) -> bool:
    """True when the best loss went from ``before`` to ``after`` by more than a small fall
    (any finite best improves on none)."""
    if not after < before:
        return False
    return not math.isfinite(before) or not _small_fall(before - after, before, tol, log_space)


def _is_plateau(losses: Sequence[float], tol: float, log_space: bool = False) -> bool:
    """True when the finite losses fell by at most ``tol`` of the margin (flat or rising,
    see :func:`_small_fall`); False when too few, or at the boundary."""
    trace = _floats(losses)
    y = np.asarray([v for v in trace if math.isfinite(v)], dtype=float)
    if y.size < 3:
        return False
    with np.errstate(all="ignore"):
        level = float(np.mean(np.abs(y)))
    slope = _slope(trace)
    if not math.isfinite(level) or level == 0 or math.isnan(slope):
        return False
    return _small_fall(-slope * (len(trace) - 1), level, tol, log_space)


def _quantum_for(pred: float, ref: float, quantum: int, lo: int, hi: int) -> int:
    """``quantum * ref / pred`` clamped to [lo, hi]: a site predicted to trigger ``ref``
    steps away gets one quantum, a closer one more, a farther one less."""
    if pred <= 0:
        return hi
    if not math.isfinite(pred) or not math.isfinite(ref) or ref <= 0:
        return lo if not math.isfinite(pred) else quantum
    return int(round(min(hi, max(lo, quantum * ref / pred))))


def _check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, (bool, str)) or not 0 < _number(value) < 1:
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


@dataclass(eq=False)
class _Site:
    """The scheduler's mutable view of one site (private)."""
    site_id: str
    order: int
    granted: int = 0                 # steps granted so far
    reported: int = 0                # steps the site says it used
    running: bool = False
    final: str | None = None         # the site status once retired
    pending: Action | None = None    # a RETIRE_* decision not yet returned
    waits: int = 0                   # allocations passed over while idle
    served: int = -1                 # sequence number of the last grant
    trace: deque = field(default_factory=deque)
    loss: float = math.nan           # latest finite loss
    best: float = math.inf
    pred: float = math.nan           # predicted steps to trigger; nan before any data
    plateau: bool = False
    best_at_refresh: float | None = None
    fruitless: int = 0               # refreshes in a row that did not lower the best loss
    hopeless: bool = False
    first: float = math.nan          # first finite loss
    gained: int = 0                  # steps used when the best loss last improved
    curve: deque = field(default_factory=deque)  # best loss so far, after each recent loss
    moving: bool = True              # the recent losses are not all one value
    log_space: bool = False          # its losses are logs of the margin

    @property
    def live(self) -> bool:
        return self.final is None and self.pending is None


class Scheduler(ABC):
    """Bookkeeping shared by all policies; a policy only ranks and sizes grants."""

    policy = ""

    def __init__(self, max_steps: int, quantum: int) -> None:
        self.max_steps = _check_int("max_steps", max_steps, 1)
        self.quantum = _check_int("quantum", quantum, 1)
        self._sites: dict[str, _Site] = {}
        self._log: list[Allocation] = []
        self._total = 0

    @abstractmethod
    def _rank(self, idle: list[_Site]) -> list[tuple[_Site, Action, int]]:
        """Idle live sites in serving order, each with its action and wanted steps."""

    def _observe(self, site: _Site, progress: SiteProgress) -> None:
        """Hook: a policy reads a report (default: nothing)."""

    def _on_refresh(self, site: _Site) -> None:
        """Hook: a REFRESH was just granted to ``site`` (default: nothing)."""

    def add_site(self, site_id: str, steps_used: int = 0) -> None:
        """Register a site (``steps_used`` > 0 when resuming); a second add is an error."""
        if site_id in self._sites:
            raise ValueError(f"site {site_id!r} was already added")
        used = _check_int("steps_used", steps_used, 0)
        self._sites[site_id] = _Site(site_id, len(self._sites), granted=used, reported=used)

    def on_progress(self, progress: SiteProgress) -> None:
        """Take a site's report after a quantum; the site is no longer running."""
        site = self._site(progress.site_id)
        site.running = False
        if not site.live:
            log.debug("progress for retired site %s ignored", site.site_id)
            return
        used = _number(progress.steps_used)
        if math.isfinite(used):
            site.reported = max(site.reported, int(used))
        self._observe(site, progress)
        if _flag(progress.triggered):
            site.pending = Action.RETIRE_FOUND
        elif self._remaining(site) <= 0:
            site.pending = Action.RETIRE_EXHAUSTED

    def retire(self, site_id: str, status: str) -> None:
        """Controller-side retirement (error, timeout, stopped): no decision follows."""
        site = self._site(site_id)
        if site.final is None:
            site.final, site.pending, site.running = str(status), None, False

    def allocate(self, free_slots: int) -> list[Decision]:
        """Pending retirements, then at most ``free_slots`` grants to idle live sites."""
        free_slots = _check_int("free_slots", free_slots, 0)
        decisions = self._retirements()
        idle = [s for s in self._sites.values() if s.live and not s.running]
        chosen = self._rank(idle)[:free_slots]
        for site, action, wanted in chosen:
            steps = min(wanted, self._remaining(site))
            site.granted += steps
            site.running, site.waits, site.served = True, 0, len(self._log)
            self._total += steps
            self._log.append(Allocation(site.site_id, steps, self._total))
            if action is Action.REFRESH:
                self._on_refresh(site)
            decisions.append(Decision(site.site_id, action, steps))
        if chosen:
            for site in idle:
                if not site.running:
                    site.waits += 1
        return decisions

    @property
    def done(self) -> bool:
        """True when no site is live and every retirement has been returned."""
        return all(s.final is not None for s in self._sites.values())

    @property
    def allocation_log(self) -> list[Allocation]:
        return list(self._log)

    def status_of(self, site_id: str) -> str:
        """The site's status word: pending, searching, found, exhausted or as retired."""
        site = self._site(site_id)
        if site.final is not None:
            return site.final
        if site.pending is not None:
            return "found" if site.pending is Action.RETIRE_FOUND else "exhausted"
        return "searching" if site.served >= 0 else "pending"

    def _site(self, site_id: str) -> _Site:
        try:
            return self._sites[site_id]
        except KeyError:
            raise KeyError(f"unknown site {site_id!r}") from None

    def _remaining(self, site: _Site) -> int:
        return self.max_steps - max(site.granted, site.reported)

    def _retirements(self) -> list[Decision]:
        out = []
        for site in self._sites.values():
            if site.live and not site.running and self._remaining(site) <= 0:
                site.pending = Action.RETIRE_EXHAUSTED
            if site.pending is not None:
                out.append(Decision(site.site_id, site.pending))
                site.final = "found" if site.pending is Action.RETIRE_FOUND else "exhausted"
                site.pending = None
        return out


class RoundRobinScheduler(Scheduler):
    """The baseline: equal quanta, least recently served site first."""

    policy = "round-robin"

    def _rank(self, idle: list[_Site]) -> list[tuple[_Site, Action, int]]:
        ranked = sorted(idle, key=lambda s: (s.served, s.order))
        return [(s, Action.GRANT, self.quantum) for s in ranked]


class LossSlopeScheduler(Scheduler):
    """Closest sites first, with quanta in inverse proportion to their predicted steps.

    A site's predicted steps to trigger are ``best / max(eps, fall)``: its best loss over the
    fall per step of its best-loss curve over the last ``window`` losses (monotone, so noise in
    the loss does not read as progress; a fall that removes at most ``plateau_tol`` of the
    margin counts as none, so a loss parked just above a clamp, say at 1e-45, is not "almost
    there"). A site that reports log-space losses (``SiteProgress.log_space``) is judged by
    differences of its logs: their zero, the smallest float, is arbitrary. Serving order, by
    tier:

    0. sites passed over ``starve_after`` allocations in a row (a backstop);
    1. sites never served, with a probe of ``probe_quanta * quantum / live sites`` steps
       (within [min_quantum, quantum]): the first pass over many sites stays cheap;
    2. sites below the exploration floor: fewer steps than ``floor`` times the largest budget
       of a live site (default ``min_quantum / max_quantum``: a min quantum for every max
       quantum the leader gets), least served first, min_quantum each. The floor grows with
       what the others got, so a flat site that will trigger suddenly is never starved;
    3. sites on course (still falling: a finite prediction; with a ``horizon``, one within
       ``horizon`` times the site's remaining budget), closest first, ``quantum * ref / pred``
       steps each (``ref``: the median prediction of such sites). Without a horizon a site
       predicted past its budget stays on course: a straight line through a curve is a poor
       guide, and with small fixed steps (``grist``) a bug's log loss often falls slowly for
       hundreds of steps, then jumps to 0. With steps sized to reach the edge (``adaptive``) a
       bug usually triggers within a few dozen steps, and a site falling too slowly to reach
       its edge within its budget is usually guarded (an eps or a clamp its margin creeps
       toward): there ``horizon=1`` leaves it to the tiers below, and the controller sets it;
    4. sites off course that have progressed (best loss at most ``progress`` times their
       first), those whose loss still moves first, then least served first, a quantum each
       (min_quantum once hopeless: a bug that wanders near the edge before it triggers looks
       hopeless too, and still deserves more than a site that never moved);
    5. the rest (flat so far), least served first: min_quantum while a better site is live,
       else a quantum;
    6. hopeless sites that never progressed: min_quantum.

    A plateau (the loss window removed at most ``plateau_tol`` of the margin, or rose) gets a
    REFRESH; after ``max_refreshes`` fruitless ones in a row the site is hopeless (until its best
    loss improves: a window of noise that happens to fall does not undo it), and once
    its best loss has not improved for ``retire_after`` of its steps (default: half the
    budget) it is retired as exhausted, its remaining budget left to the others."""

    policy = "loss-slope"

    def __init__(self, max_steps: int, quantum: int, *, window: int = DEFAULT_WINDOW,
                 min_quantum: int | None = None, max_quantum: int | None = None,
                 starve_after: int = DEFAULT_STARVE_AFTER,
                 plateau_tol: float = DEFAULT_PLATEAU_TOL,
                 max_refreshes: int = DEFAULT_MAX_REFRESHES,
                 floor: float | None = None, probe_quanta: int = DEFAULT_PROBE_QUANTA,
                 progress: float = DEFAULT_PROGRESS, retire_after: int | None = None,
                 horizon: float | None = None) -> None:
        super().__init__(max_steps, quantum)
        self.window = _check_int("window", window, 3)
        lo = max(1, self.quantum // 4) if min_quantum is None else min_quantum
        hi = DEFAULT_MAX_FACTOR * self.quantum if max_quantum is None else max_quantum
        self.min_quantum = _check_int("min_quantum", lo, 1)
        self.max_quantum = _check_int("max_quantum", hi, 1)
        if not self.min_quantum <= self.quantum <= self.max_quantum:
            raise ValueError(f"need min_quantum <= quantum <= max_quantum, got "
                             f"{self.min_quantum} <= {self.quantum} <= {self.max_quantum}")
        self.starve_after = _check_int("starve_after", starve_after, 1)
        self.plateau_tol = _check_fraction("plateau_tol", plateau_tol)
        self.max_refreshes = _check_int("max_refreshes", max_refreshes, 0)
        self.floor = _check_fraction("floor", min(0.5, self.min_quantum / self.max_quantum)
                                     if floor is None else floor)
        self.probe_quanta = _check_int("probe_quanta", probe_quanta, 1)
        self.progress = _check_fraction("progress", progress)
        self.retire_after = _check_int("retire_after", max(1, self.max_steps // 2)
                                       if retire_after is None else retire_after, 1)
        if horizon is not None and (isinstance(horizon, (bool, str)) or not _number(horizon) > 0):
            raise ValueError(f"horizon must be a number > 0 or None, got {horizon!r}")
        self.horizon = None if horizon is None else float(horizon)

    # -- reading reports ------------------------------------------------------------------
    def _observe(self, site: _Site, progress: SiteProgress) -> None:
        losses = _floats(progress.losses)
        finite = [v for v in losses if math.isfinite(v)]
        if losses:                 # a report without losses (a resume) does not say
            site.log_space = _flag(progress.log_space)
        ls, tol = site.log_space, self.plateau_tol
        if finite:
            site.loss = finite[-1]
            if math.isnan(site.first):
                site.first = finite[0]
        before = site.best
        best = [v for v in finite + [_number(progress.best_loss)] if math.isfinite(v)]
        site.best = min([site.best, *best])
        fell = site.best < before
        if _improved(before, site.best, tol, ls):
            site.gained = site.reported
            site.fruitless, site.hopeless = 0, False  # a real gain: judged afresh
        site.trace = deque(list(site.trace) + losses, maxlen=self.window)
        running, curve = site.curve[-1] if site.curve else math.inf, []
        for v in finite:
            running = min(running, v)
            curve.append(running)
        site.curve = deque(list(site.curve) + curve, maxlen=self.window)
        if len(site.curve) < 2:
            site.pred = math.nan
        elif _small_fall(site.curve[0] - site.curve[-1], site.curve[-1], tol, ls):
            site.pred = math.inf  # no fall beyond the plateau tolerance: no evidence of progress
        elif finite and not fell:
            site.pred = math.inf  # no new best in this report: the fall has stopped, for now
        else:
            site.pred = _predicted_steps(site.best, -(site.curve[0] - site.curve[-1]) / (len(site.curve) - 1))
        site.moving = len(set(finite[-self.window:])) > 1 if finite else site.moving
        full = len(site.trace) == self.window
        flat = full and _is_plateau(site.trace, tol, ls)
        site.plateau = _flag(progress.plateau_hint) or flat
        if site.plateau and site.best_at_refresh is not None:  # judge the last refresh
            helped = _improved(site.best_at_refresh, site.best, tol, ls)
            site.fruitless = 0 if helped else site.fruitless + 1
            site.best_at_refresh = None
        if site.plateau and site.fruitless >= self.max_refreshes:
            site.hopeless = True  # until its best loss improves again
        if site.hopeless and site.reported - site.gained >= self.retire_after:
            site.pending = Action.RETIRE_EXHAUSTED  # refreshed, flat, and no gain for long

    def _on_refresh(self, site: _Site) -> None:
        site.trace.clear()
        site.plateau, site.best_at_refresh = False, site.best

    # -- ranking --------------------------------------------------------------------------
    def _progressed(self, s: _Site) -> bool:
        """The best loss is at most ``progress`` times the first: that share of the way to the
        edge in the loss's own units (for a log-space loss, in orders of magnitude of the
        margin, so a guard's clamp at 1e-12 that the margin merely approaches does not count)."""
        return math.isfinite(s.first) and s.first > 0 and s.best <= self.progress * s.first

    def _on_course(self, s: _Site) -> bool:
        """Still falling (a finite prediction) and, with a ``horizon``, predicted to trigger
        within ``horizon`` times its remaining budget."""
        if s.hopeless or not s.pred < math.inf:
            return False
        return self.horizon is None or s.pred <= self.horizon * self._remaining(s)

    def _tier(self, s: _Site, floor: float) -> int:
        if s.served < 0:
            return 1
        if s.granted < floor:
            return 2
        if self._on_course(s):
            return 3
        progressed = self._progressed(s)
        if s.hopeless and not progressed:
            return 6
        return 4 if progressed else 5

    def _rank(self, idle: list[_Site]) -> list[tuple[_Site, Action, int]]:
        live = [s for s in self._sites.values() if s.live]
        preds = [s.pred for s in live if s.served >= 0 and self._on_course(s) and 0 < s.pred < math.inf]
        ref = float(np.median(preds)) if preds else math.nan
        floor = self.floor * max((s.granted for s in live), default=0)
        probe = min(self.quantum, max(self.min_quantum, self.probe_quanta * self.quantum // max(1, len(live))))
        tiers = {s.site_id: self._tier(s, floor) for s in live}
        better = any(t < 5 for t in tiers.values())  # a site worth more than the flat ones

        def key(s: _Site) -> tuple:
            tier = tiers[s.site_id]
            if s.waits >= self.starve_after:
                return (0, -s.waits, s.order)
            if tier == 3:
                return (3, s.pred, s.order)
            if tier == 4:
                return (4, not s.moving, s.granted, s.order)
            return (tier, s.granted if tier != 1 else 0, s.order)

        ranked = []
        for s in sorted(idle, key=key):
            tier = tiers[s.site_id]
            if tier == 1:
                size = probe
            elif tier == 3:
                size = _quantum_for(s.pred, ref, self.quantum, self.min_quantum, self.max_quantum)
            elif tier == 2 or s.hopeless or (tier == 5 and better):
                size = self.min_quantum
            else:
                size = self.quantum
            action = Action.REFRESH if s.plateau and not s.hopeless else Action.GRANT
            ranked.append((s, action, size))
        return ranked


POLICIES: dict[str, type[Scheduler]] = {
    RoundRobinScheduler.policy: RoundRobinScheduler,
    LossSlopeScheduler.policy: LossSlopeScheduler,
}


def make_scheduler(policy: str, max_steps: int, quantum: int, **options: Any) -> Scheduler:
    """Build the scheduler named by a campaign's ``scheduler.policy`` (a str or str Enum)."""
    cls = POLICIES.get(getattr(policy, "value", policy))
    if cls is None:
        raise ValueError(f"unknown scheduler policy {policy!r}; known: {sorted(POLICIES)}")
    known = set(inspect.signature(cls.__init__).parameters) - {"self", "max_steps", "quantum"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for policy {policy!r}; "
                         f"known: {sorted(known)}")
    return cls(max_steps, quantum, **options)
