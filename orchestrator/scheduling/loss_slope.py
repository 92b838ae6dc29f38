"""``loss-slope``: the previous default, kept for the side-by-side comparison.

Strict priority between tiers of sites (see :class:`LossSlopeScheduler`). Issue 3's closing
note measures it: strict priority starves a bug that looks worse than its decoys, which
the ``share`` policy fixes by giving every live site a share instead of a rank.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.scheduling.core import Action, RankedScheduler, SiteBook, SiteProgress
from orchestrator.scheduling.numeric import (
    check_fraction, check_int, check_positive, curve_prediction, flag, floats, improved, is_plateau, number,
    progressed, quantum_for,
)

DEFAULT_WINDOW = 16       # losses the slope and the plateau test look at
DEFAULT_MAX_FACTOR = 4    # largest loss-slope quantum, in quanta
DEFAULT_STARVE_AFTER = 64  # allocations a live idle site may be passed over (a backstop)
DEFAULT_PLATEAU_TOL = 0.01  # a window falling by less than this fraction is flat
DEFAULT_MAX_REFRESHES = 2   # fruitless refreshes before a site gets floor quanta only
DEFAULT_PROBE_QUANTA = 4    # the first pass over never-served sites costs about this many quanta
DEFAULT_PROGRESS = 0.5      # a site whose best loss is below this share of its first has progressed


@dataclass(eq=False)
class LossSlopeSite(SiteBook):
    trace: list[float] = field(default_factory=list)   # the last `window` losses
    loss: float = math.nan           # latest finite loss
    best: float = math.inf
    pred: float = math.nan           # predicted steps to trigger; nan before any data
    plateau: bool = False
    best_at_refresh: float | None = None
    fruitless: int = 0               # refreshes in a row that did not lower the best loss
    hopeless: bool = False
    first: float = math.nan          # first finite loss
    gained: int = 0                  # steps used when the best loss last improved
    curve: list[float] = field(default_factory=list)  # best loss so far, after each recent loss
    moving: bool = True              # the recent losses are not all one value
    log_space: bool = False          # its losses are logs of the margin


class LossSlopeScheduler(RankedScheduler):
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
    budget) it is retired (RETIRE_NO_PROGRESS), its remaining budget left to the others."""

    policy = "loss-slope"
    site_type = LossSlopeSite

    def __init__(self, max_steps: int, quantum: int, *, window: int = DEFAULT_WINDOW,
                 min_quantum: int | None = None, max_quantum: int | None = None,
                 starve_after: int = DEFAULT_STARVE_AFTER,
                 plateau_tol: float = DEFAULT_PLATEAU_TOL,
                 max_refreshes: int = DEFAULT_MAX_REFRESHES,
                 floor: float | None = None, probe_quanta: int = DEFAULT_PROBE_QUANTA,
                 progress: float = DEFAULT_PROGRESS, retire_after: int | None = None,
                 horizon: float | None = None) -> None:
        super().__init__(max_steps, quantum)
        self.window = check_int("window", window, 3)
        lo = max(1, self.quantum // 4) if min_quantum is None else min_quantum
        hi = DEFAULT_MAX_FACTOR * self.quantum if max_quantum is None else max_quantum
        self.min_quantum = check_int("min_quantum", lo, 1)
        self.max_quantum = check_int("max_quantum", hi, 1)
        if not self.min_quantum <= self.quantum <= self.max_quantum:
            raise ValueError(f"need min_quantum <= quantum <= max_quantum, got "
                             f"{self.min_quantum} <= {self.quantum} <= {self.max_quantum}")
        self.starve_after = check_int("starve_after", starve_after, 1)
        self.plateau_tol = check_fraction("plateau_tol", plateau_tol)
        self.max_refreshes = check_int("max_refreshes", max_refreshes, 0)
        self.floor = check_fraction("floor", min(0.5, self.min_quantum / self.max_quantum)
                                    if floor is None else floor)
        self.probe_quanta = check_int("probe_quanta", probe_quanta, 1)
        self.progress = check_fraction("progress", progress)
        self.retire_after = check_int("retire_after", max(1, self.max_steps // 2)
                                      if retire_after is None else retire_after, 1)
        self.horizon = check_positive("horizon", horizon, optional=True)

    def options(self) -> dict[str, Any]:
        return {"window": self.window, "min_quantum": self.min_quantum, "max_quantum": self.max_quantum,
                "starve_after": self.starve_after, "plateau_tol": self.plateau_tol,
                "max_refreshes": self.max_refreshes, "floor": self.floor, "probe_quanta": self.probe_quanta,
                "progress": self.progress, "retire_after": self.retire_after, "horizon": self.horizon}

    # -- reading reports ------------------------------------------------------------------
    def _observe(self, site: LossSlopeSite, progress: SiteProgress) -> Action | None:
        losses = floats(progress.losses)
        finite = [v for v in losses if math.isfinite(v)]
        if losses:                 # a report without losses (a resume) does not say
            site.log_space = flag(progress.log_space)
        ls, tol = site.log_space, self.plateau_tol
        if finite:
            site.loss = finite[-1]
            if math.isnan(site.first):
                site.first = finite[0]
        before = site.best
        best = [v for v in finite + [number(progress.best_loss)] if math.isfinite(v)]
        site.best = min([site.best, *best])
        fell = site.best < before
        if improved(before, site.best, tol, ls):
            site.gained = site.used
            site.fruitless, site.hopeless = 0, False  # a real gain: judged afresh
        site.trace = (site.trace + losses)[-self.window:]
        site.curve, site.pred = curve_prediction(site.curve, finite, site.best, fell, self.window, tol, ls)
        site.moving = len(set(finite[-self.window:])) > 1 if finite else site.moving
        full = len(site.trace) == self.window
        flat = full and is_plateau(site.trace, tol, ls)
        site.plateau = flag(progress.plateau_hint) or flat
        if site.plateau and site.best_at_refresh is not None:  # judge the last refresh
            helped = improved(site.best_at_refresh, site.best, tol, ls)
            site.fruitless = 0 if helped else site.fruitless + 1
            site.best_at_refresh = None
        if site.plateau and site.fruitless >= self.max_refreshes:
            site.hopeless = True  # until its best loss improves again
        if site.hopeless and site.used - site.gained >= self.retire_after:
            return Action.RETIRE_NO_PROGRESS  # refreshed, flat, and no gain for long
        return None

    def _on_grant(self, site: LossSlopeSite, action: Action, steps: int) -> None:
        if action is Action.REFRESH:
            site.trace = []
            site.plateau, site.best_at_refresh = False, site.best

    # -- ranking --------------------------------------------------------------------------
    def _progressed(self, s: LossSlopeSite) -> bool:
        return progressed(s.first, s.best, self.progress)

    def _on_course(self, s: LossSlopeSite) -> bool:
        """Still falling (a finite prediction) and, with a ``horizon``, predicted to trigger
        within ``horizon`` times its remaining budget."""
        if s.hopeless or not s.pred < math.inf:
            return False
        return self.horizon is None or s.pred <= self.horizon * self._remaining(s)

    def _tier(self, s: LossSlopeSite, floor: float) -> int:
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

    def _rank(self, idle: list[LossSlopeSite], free_slots: int) -> list[tuple[SiteBook, Action, int]]:
        live = list(self._live.values())
        preds = [s.pred for s in live if s.served >= 0 and self._on_course(s) and 0 < s.pred < math.inf]
        ref = float(np.median(preds)) if preds else math.nan
        floor = self.floor * max((s.granted for s in live), default=0)
        probe = min(self.quantum, max(self.min_quantum, self.probe_quanta * self.quantum // max(1, len(live))))
        tiers = {s.site_id: self._tier(s, floor) for s in live}
        better = any(t < 5 for t in tiers.values())  # a site worth more than the flat ones

        def key(s: LossSlopeSite) -> tuple:
            tier = tiers[s.site_id]
            waits = self.waits(s)
            if waits >= self.starve_after:
                return (0, -waits, s.order)
            if tier == 3:
                return (3, s.pred, s.order)
            if tier == 4:
                return (4, not s.moving, s.granted, s.order)
            return (tier, s.granted if tier != 1 else 0, s.order)

        ranked = []
        for s in heapq.nsmallest(free_slots, idle, key=key):
            tier = tiers[s.site_id]
            if tier == 1:
                size = probe
            elif tier == 3:
                size = quantum_for(s.pred, ref, self.quantum, self.min_quantum, self.max_quantum)
            elif tier == 2 or s.hopeless or (tier == 5 and better):
                size = self.min_quantum
            else:
                size = self.quantum
            action = Action.REFRESH if s.plateau and not s.hopeless else Action.GRANT
            ranked.append((s, action, size))
        return ranked
