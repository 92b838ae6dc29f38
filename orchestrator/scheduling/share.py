"""``share``: every live site gets a share of the steps that never falls to zero and grows
with its chance of triggering soon (the recommended policy).

Shares are kept by stride scheduling (Waldspurger and Weihl, "Stride scheduling:
deterministic proportional-share resource management", MIT LCS TM-528, 1995): each site
has a virtual time ``due``; the idle site due first is served, and a grant of ``k`` steps
at weight ``w`` moves its ``due`` on by ``k / w``. Over any stretch, the steps each site
gets are in proportion to its weight, whatever the quanta; nothing is random and nothing
depends on the clock. The weight comes from composed parts (see ``parts.py``): a
predictor of steps to trigger, a power schedule, an out-of-box probe that tells a guarded
op from one that can fire, a plateau refresh policy, a patience rule that retires a site
that stopped improving, and a starvation guard.

Unlike loss-slope's strict priority between tiers, a site that looks worse than another
only gets a smaller share, never none: a bug that looks flat among decoys that look close
still gets at least ``floor`` of a promising site's steps.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.scheduling.codec import decode_float, encode_float
from orchestrator.scheduling.core import Action, Scheduler, SiteBook, SiteProgress
from orchestrator.scheduling.numeric import check_int, flag, progressed
from orchestrator.scheduling.parts import (
    CurvePredictor, CurveStats, Patience, PlateauRefresh, PowerSchedule, ReachProbe, ReachStats, RefreshStats,
    StarvationGuard, part_options,
)

DEFAULT_PROBE_QUANTA = 4   # the first pass over never-served sites costs about this many quanta
DEFAULT_MAX_FACTOR = 4     # the largest grant, in quanta (a heavier site is served more often instead)


@dataclass(eq=False)
class ShareSite(SiteBook):
    curve: CurveStats = field(default_factory=CurveStats)
    refresh: RefreshStats = field(default_factory=RefreshStats)
    reach: ReachStats = field(default_factory=ReachStats)
    due: float = 0.0                 # virtual time of its next turn in the share lane
    turn: int = -1                   # its last turn in the reserve lane (-1: none yet)
    lane: str = ""                   # the lane of its last grant
    weight: float = 1.0              # its weight when last chosen


def _part(cls: type, value: Any) -> Any:
    """A part given as itself, as a dict of its options, or None (the defaults)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for the {cls.__name__}; known: {sorted(known)}")
        return cls(**value)
    raise ValueError(f"expected a {cls.__name__} or a dict of its options, got {value!r}")


class ShareScheduler(Scheduler):
    """Proportional shares by predicted chance of triggering soon; see the module docstring.

    Never-served sites are probed first, in order, with ``probe_quanta * quantum / live
    sites`` steps each (within [min_quantum, quantum]). After that a site's grant is
    ``quantum * weight`` steps (at least ``min_quantum``, default quantum / 4): a site with a
    small share is served about as often as the others, with smaller grants, so a bug that
    looks flat and then triggers suddenly is reached soon."""

    policy = "share"
    site_type = ShareSite

    def __init__(self, max_steps: int, quantum: int, *, predictor: CurvePredictor | dict | None = None,
                 schedule: PowerSchedule | dict | None = None, refresh: PlateauRefresh | dict | None = None,
                 patience: Patience | dict | None = None, guard: StarvationGuard | dict | None = None,
                 reach: ReachProbe | dict | None = None, min_quantum: int | None = None,
                 max_quantum: int | None = None, probe_quanta: int = DEFAULT_PROBE_QUANTA) -> None:
        super().__init__(max_steps, quantum)
        self.predictor = _part(CurvePredictor, predictor)
        self.schedule = _part(PowerSchedule, schedule)
        self.refresh = _part(PlateauRefresh, refresh)
        self.patience = _part(Patience, patience)
        self.guard = _part(StarvationGuard, guard)
        self.reach = _part(ReachProbe, reach)
        self.min_quantum = check_int("min_quantum", max(1, self.quantum // 4) if min_quantum is None
                                     else min_quantum, 1)
        self.max_quantum = check_int("max_quantum", DEFAULT_MAX_FACTOR * self.quantum if max_quantum is None
                                     else max_quantum, 1)
        if not self.min_quantum <= self.quantum <= self.max_quantum:
            raise ValueError(f"need min_quantum <= quantum <= max_quantum, got "
                             f"{self.min_quantum} <= {self.quantum} <= {self.max_quantum}")
        self.probe_quanta = check_int("probe_quanta", probe_quanta, 1)
        self._vtime = 0.0            # the virtual time of the last grant
        self._steps = {"reserve": 0, "share": 0}   # steps granted in each lane
        self._turns = 0                              # turns of the reserve lane so far
        # the idle live sites, twice (derived data, rebuilt on restore): by their turn in each lane; an
        # entry is stale once its site's version moved on (granted, retired), and skipped when popped
        self._by_due: list[tuple[float, int, int, str]] = []
        self._by_turn: list[tuple[int, int, int, str]] = []
        self._unserved: list[tuple[int, int, int, str]] = []   # never served: probed first, in order
        self._version: dict[str, int] = {}
        self._by_pred: list[tuple[float, int, int, str]] = []   # the live falling sites, closest first
        self._pred_version: dict[str, int] = {}

    def options(self) -> dict[str, Any]:
        return {"predictor": part_options(self.predictor), "schedule": part_options(self.schedule),
                "refresh": part_options(self.refresh), "patience": part_options(self.patience),
                "guard": part_options(self.guard), "reach": part_options(self.reach), "min_quantum": self.min_quantum,
                "max_quantum": self.max_quantum, "probe_quanta": self.probe_quanta}

    def _policy_state(self) -> dict[str, Any]:
        return {"vtime": encode_float(self._vtime), "reserve_steps": self._steps["reserve"], "share_steps": self._steps["share"], "turns": self._turns}

    def _restore_policy_state(self, state: dict[str, Any]) -> None:
        self._vtime = decode_float(state["vtime"])
        self._steps = {"reserve": check_int("reserve_steps", state["reserve_steps"], 0),
                       "share": check_int("share_steps", state["share_steps"], 0)}
        self._turns = check_int("turns", state["turns"], 0)
        self._by_due, self._by_turn, self._unserved, self._version = [], [], [], {}   # rebuilt with the sites
        self._by_pred, self._pred_version = [], {}
        for site in self._live.values():
            self._push_pred(site)

    def add_site(self, site_id: str, steps_used: int = 0) -> None:
        super().add_site(site_id, steps_used)
        self._sites[str(site_id)].due = self._vtime   # a late site joins at the present, not the past

    # -- reading reports ----------------------------------------------------------------------
    def _observe(self, site: ShareSite, progress: SiteProgress) -> Action | None:
        curve, refresh = site.curve, site.refresh
        self.reach.observe(site.reach, progress.outside)
        gained = self.predictor.observe(curve, progress.losses, progress.best_loss, progress.log_space, site.used)
        plateau = flag(progress.plateau_hint) or self.predictor.flat(curve)
        plateau = plateau and self.refresh.ripe(site.used, curve.gained, self.predictor.window)
        helped = refresh.best_at_refresh is not None and self.predictor.helped(curve, refresh.best_at_refresh)
        self.refresh.observe(refresh, plateau, gained, helped)
        self._push_pred(site)
        if self.patience.gives_up(refresh.stale, site.used, curve.gained, self.max_steps, site.reach.outside):
            return Action.RETIRE_NO_PROGRESS
        return None

    def _push_pred(self, site: ShareSite) -> None:
        v = self._pred_version[site.site_id] = self._pred_version.get(site.site_id, 0) + 1
        if 0 < site.curve.pred < math.inf:
            heapq.heappush(self._by_pred, (site.curve.pred, site.order, v, site.site_id))

    def _on_leave(self, site: ShareSite) -> None:
        self._pred_version[site.site_id] = self._pred_version.get(site.site_id, 0) + 1   # out of the reference

    def reference(self) -> float:
        """The prediction the others are weighed against: the closest live falling site's; nan when no
        live site is falling. O(log live sites), amortised: a heap whose stale entries are dropped."""
        while self._by_pred:
            pred, _, v, site_id = self._by_pred[0]
            if self._pred_version.get(site_id) == v and self._sites[site_id].live:
                return pred
            heapq.heappop(self._by_pred)
        return math.nan

    def _on_grant(self, site: ShareSite, action: Action, steps: int) -> None:
        self.refresh.granted(site.refresh, action is Action.REFRESH, site.curve.best)
        if action is Action.REFRESH:
            site.curve.trace = []      # the next plateau is judged on a full window of the refreshed search
        if site.lane == "probe":
            return
        self._steps[site.lane] += steps
        if site.lane == "reserve":
            site.turn, self._turns = self._turns, self._turns + 1
        else:
            self._vtime = max(self._vtime, site.due)
            site.due += steps / site.weight

    # -- choosing -----------------------------------------------------------------------------
    def weight(self, site: ShareSite) -> float:
        """The site's share weight now, in [floor, cap]."""
        curve = site.curve
        stalled = progressed(curve.first, curve.best, self.schedule.progress) and curve.moving
        return self.schedule.weight(curve.pred, self._remaining(site), self.reference(), stalled, site.reach.outside)

    def _reach_steps(self, site: ShareSite) -> int:
        """A probe with a grant that leaves budget (one that spends it all ends the search: an
        exhausted site is probed as it ends anyway)."""
        return self.reach.ask(site.reach, site.used) if self._remaining(site) > 0 else 0

    def _on_idle(self, site: ShareSite) -> None:
        v = self._version[site.site_id] = self._version.get(site.site_id, 0) + 1
        heapq.heappush(self._by_due, (site.due, site.order, v, site.site_id))
        heapq.heappush(self._by_turn, (site.turn, site.order, v, site.site_id))
        if site.served < 0:
            heapq.heappush(self._unserved, (site.order, site.order, v, site.site_id))

    def _pop(self, heap: list) -> ShareSite | None:
        """The first current entry of ``heap`` (stale ones are dropped), or None."""
        while heap:
            entry = heapq.heappop(heap)
            site = self._sites[entry[3]]
            if site.live and not site.running and self._version[site.site_id] == entry[2]:
                return site
        return None

    def _choose(self, free_slots: int) -> list[tuple[SiteBook, Action, int]]:
        """O(log live sites) per grant: a heap per lane instead of a pass over every site."""
        probe = min(self.quantum, max(self.min_quantum, self.probe_quanta * self.quantum // max(1, len(self._live))))
        steps = dict(self._steps)
        out: list[tuple[SiteBook, Action, int]] = []
        while len(out) < free_slots:
            s, lane = self._pop(self._unserved), "probe"
            if s is None:
                lane = self.guard.lane(steps["reserve"], steps["share"])
                s = self._pop(self._by_turn if lane == "reserve" else self._by_due)
            if s is None:
                break
            self._version[s.site_id] += 1          # its entries in the other heaps are stale now
            s.lane, s.weight = lane, self.weight(s)
            if lane == "probe":
                size = probe
            elif lane == "reserve":
                size = self.min_quantum
            elif self.reach.due(s.reach, s.used):
                size = self.min_quantum            # a probe is due with this grant: its verdict soon
            else:
                size = min(self.max_quantum, max(self.min_quantum, int(round(self.quantum * s.weight))))
            if lane != "probe":
                steps[lane] += size
            action = Action.REFRESH if self.refresh.wants_refresh(s.refresh) else Action.GRANT
            out.append((s, action, size))
        return out
