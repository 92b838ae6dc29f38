"""The vocabulary and the bookkeeping every policy shares.

The controller reports with ``on_progress`` and ``retire``, asks with ``allocate`` and
alone turns the returned :class:`Decision` values into actor calls (the decider never
acts, as in Ray Tune's schedulers). A policy only ranks idle live sites and sizes their
grants; this base class owns the budget, the retirements, the site statuses and the
state: :meth:`Scheduler.state` is plain JSON data, and a scheduler restored from it
(:meth:`Scheduler.restore`) makes exactly the decisions the original would have made
(Optuna keeps a pruner's state in storage the same way). Every call costs O(live sites)
or less: retired sites are never visited again.
"""
from __future__ import annotations

import json
import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, NamedTuple

from fuzz_core.status import SiteStatus
from orchestrator.scheduling.codec import from_json, to_json
from orchestrator.scheduling.numeric import check_int, flag, number

log = logging.getLogger(__name__)

STATE_FORMAT = 1


class Action(Enum):
    """What the controller does with a site."""
    GRANT = "grant"                            # run `steps` more steps
    REFRESH = "refresh"                        # refresh samples, then run `steps` steps
    RETIRE_FOUND = "retire_found"              # triggered: never granted again
    RETIRE_EXHAUSTED = "retire_exhausted"      # its whole max_steps budget is spent
    RETIRE_NO_PROGRESS = "retire_no_progress"  # a policy gave up on it, budget left

    @property
    def retires(self) -> bool:
        return self in RETIRED_AS


# the final status each retirement gives a site (its exit reason: triggered, budget_spent, no_progress)
RETIRED_AS = {Action.RETIRE_FOUND: SiteStatus.FOUND, Action.RETIRE_EXHAUSTED: SiteStatus.EXHAUSTED,
              Action.RETIRE_NO_PROGRESS: SiteStatus.RETIRED}


@dataclass(frozen=True)
class Decision:
    """``reach_steps``: after the quantum, a site still searching is probed outside its bounds for
    this many steps (0: not), and its report says whether its own op fired there
    (``SiteProgress.outside``)."""
    site_id: str
    action: Action
    steps: int = 0
    reach_steps: int = 0


@dataclass(frozen=True)
class SiteProgress:
    """A site's report after a quantum: ``losses`` holds the suspect loss after each step
    of that quantum (>= 0, 0 at the boundary; nan/inf tolerated), ``steps_used`` the
    site's total so far. ``log_space``: the losses are logs of the margin (less a floor),
    as for ``log`` and ``div``: their zero is arbitrary, so a fall counts by the share of
    the margin it removes (a difference of logs), not by its share of the loss. A report
    with no losses (a quantum lost to a timeout or a dead actor, the site resumed from its
    checkpoint) only says how many steps the site has used."""
    site_id: str
    steps_used: int
    losses: tuple[float, ...]
    best_loss: float
    triggered: bool
    plateau_hint: bool = False
    log_space: bool = False
    outside: bool | None = None    # the verdict of the out-of-box probe the grant asked for (None: none)


class Allocation(NamedTuple):
    """One grant, for plotting: steps to ``site_id``, ``total`` granted so far overall."""
    site_id: str
    steps: int
    total: int


@dataclass(eq=False)
class SiteBook:
    """The bookkeeping of one site that every policy keeps (a policy subclasses it to add
    its statistics: every field is plain data, so the record is its own state)."""
    site_id: str
    order: int                           # registration order: the last tie-break everywhere
    used: int = 0                        # steps the site has used, as last reported
    inflight: int = 0                    # steps of the grant it is running (0: idle)
    inflight_action: Action | None = None
    final: SiteStatus | None = None      # the status once retired
    pending: Action | None = None        # a RETIRE_* decision not yet returned
    idle_since: int = 0                  # the scheduler's rounds when it last became idle
    served: int = -1                     # sequence number of its last grant (-1: never)

    @property
    def running(self) -> bool:
        return self.inflight_action is not None

    @property
    def granted(self) -> int:
        """Steps used plus the steps of the grant in flight: what the budget is charged."""
        return self.used + self.inflight

    @property
    def live(self) -> bool:
        return self.final is None and self.pending is None


class Scheduler(ABC):
    """Bookkeeping shared by all policies; a policy ranks idle sites and sizes their grants."""

    policy: ClassVar[str] = ""
    site_type: ClassVar[type[SiteBook]] = SiteBook

    def __init__(self, max_steps: int, quantum: int) -> None:
        self.max_steps = check_int("max_steps", max_steps, 1)
        self.quantum = check_int("quantum", quantum, 1)
        self._sites: dict[str, SiteBook] = {}
        self._live: dict[str, SiteBook] = {}      # registration order
        self._pending: dict[str, SiteBook] = {}   # retirements not yet returned
        self._log: list[Allocation] = []
        self._total = 0                           # steps granted, all sites
        self._grants = 0                          # grants made, all sites
        self._rounds = 0                          # allocations that granted something

    # -- what a policy provides -------------------------------------------------------------
    @abstractmethod
    def _choose(self, free_slots: int) -> list[tuple[SiteBook, Action, int]]:
        """The grants of one allocation (``free_slots`` >= 1): at most that many idle live sites
        in serving order, each with its action (GRANT or REFRESH) and the steps it wants (>= 1)."""

    def _on_idle(self, site: SiteBook) -> None:
        """Hook: ``site`` is live and idle again (added, reported, restored). Default: nothing."""

    def _on_leave(self, site: SiteBook) -> None:
        """Hook: ``site`` is no longer live (retired, or its retirement pending). Default: nothing."""

    def options(self) -> dict[str, Any]:
        """The policy's options, as JSON data (part of its state: a state is restored only
        into a scheduler configured the same way)."""
        return {}

    def _observe(self, site: SiteBook, progress: SiteProgress) -> Action | None:
        """Hook: a policy reads a live site's report; it may answer RETIRE_NO_PROGRESS to
        give up on the site (a trigger or a spent budget still wins). Default: nothing."""
        return None

    def _on_grant(self, site: SiteBook, action: Action, steps: int) -> None:
        """Hook: ``site`` was just granted (default: nothing)."""

    def _reach_steps(self, site: SiteBook) -> int:
        """Hook: steps of an out-of-box probe to ask of ``site``'s grant (default: none)."""
        return 0

    def _policy_state(self) -> dict[str, Any]:
        """Hook: the policy's own state beside its sites' records, as JSON data."""
        return {}

    def _restore_policy_state(self, state: dict[str, Any]) -> None:
        """Hook: undo :meth:`_policy_state`."""

    # -- the controller's calls -------------------------------------------------------------
    def add_site(self, site_id: str, steps_used: int = 0) -> None:
        """Register a site (``steps_used`` > 0 when resuming); a second add is an error."""
        if site_id in self._sites:
            raise ValueError(f"site {site_id!r} was already added")
        used = check_int("steps_used", steps_used, 0)
        site = self.site_type(str(site_id), len(self._sites), used=used, idle_since=self._rounds)
        self._sites[site.site_id] = site
        self._live[site.site_id] = site
        if self._remaining(site) <= 0:
            self._set_pending(site, Action.RETIRE_EXHAUSTED)
        else:
            self._on_idle(site)

    def on_progress(self, progress: SiteProgress) -> None:
        """Take a site's report after a quantum; the site is no longer running. Its
        ``steps_used`` is the truth about its budget (the steps of a grant it did not use, a
        quantum lost to a dead actor, go back to it); junk there counts the grant as used."""
        site = self._site(progress.site_id)
        reported = number(progress.steps_used)
        site.used = max(site.used, int(reported) if math.isfinite(reported) else site.granted)
        site.inflight, site.inflight_action = 0, None
        if not site.live:
            log.debug("progress for retired site %s ignored", site.site_id)
            return
        verdict = self._observe(site, progress)
        if flag(progress.triggered):
            self._set_pending(site, Action.RETIRE_FOUND)
        elif self._remaining(site) <= 0:
            self._set_pending(site, Action.RETIRE_EXHAUSTED)
        elif verdict is Action.RETIRE_NO_PROGRESS:
            self._set_pending(site, verdict)
        elif verdict is not None:
            raise ValueError(f"a policy may only answer RETIRE_NO_PROGRESS to a report, not {verdict}")
        else:
            site.idle_since = self._rounds
            self._on_idle(site)

    def retire(self, site_id: str, status: SiteStatus | str) -> None:
        """Controller-side retirement (error, timeout, stopped, unreachable): no decision
        follows. The first status wins."""
        site = self._site(site_id)
        status = SiteStatus(getattr(status, "value", status))
        if site.final is None:
            was_live = site.live
            site.final, site.pending = status, None
            site.inflight, site.inflight_action = 0, None
            self._live.pop(site.site_id, None)
            self._pending.pop(site.site_id, None)
            if was_live:
                self._on_leave(site)

    def allocate(self, free_slots: int) -> list[Decision]:
        """Pending retirements (each returned once), then at most ``free_slots`` grants to
        idle live sites."""
        free_slots = check_int("free_slots", free_slots, 0)
        decisions = self._retirements()
        chosen = self._choose(free_slots) if free_slots and self._live else []
        for site, action, wanted in chosen:
            steps = min(int(wanted), self._remaining(site))
            site.inflight, site.inflight_action = steps, action
            site.served = self._grants
            self._grants += 1
            self._total += steps
            self._log.append(Allocation(site.site_id, steps, self._total))
            self._on_grant(site, action, steps)
            decisions.append(Decision(site.site_id, action, steps, self._reach_steps(site)))
        if chosen:
            self._rounds += 1
        return decisions

    def waits(self, site: SiteBook) -> int:
        """Allocations that granted others while ``site`` was idle and live (0 while it runs)."""
        return self._rounds - site.idle_since if site.live and not site.running else 0

    @property
    def done(self) -> bool:
        """True when no site is live and every retirement has been returned."""
        return not self._live and not self._pending

    @property
    def registered(self) -> int:
        """How many sites were added (retired ones included)."""
        return len(self._sites)

    @property
    def allocation_log(self) -> list[Allocation]:
        """The grants made by this object (a restored scheduler's log starts at its restore)."""
        return list(self._log)

    def status_of(self, site_id: str) -> SiteStatus:
        """The site's status: pending, searching, or its final status (a pending retirement
        already counts)."""
        site = self._site(site_id)
        if site.final is not None:
            return site.final
        if site.pending is not None:
            return RETIRED_AS[site.pending]
        return SiteStatus.SEARCHING if site.served >= 0 else SiteStatus.PENDING

    def in_flight(self) -> list[Decision]:
        """The grants given and not reported yet, in registration order: after a restore, the
        quanta the controller must run again (or report as lost with ``on_progress``)."""
        return [Decision(s.site_id, s.inflight_action, s.inflight) for s in self._live.values() if s.running]

    # -- state ------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {"policy": self.policy, "max_steps": self.max_steps, "quantum": self.quantum,
                "options": self.options()}

    def state(self) -> dict[str, Any]:
        """Everything the next decisions depend on, as JSON data (numbers, strings, lists,
        dicts; non-finite floats as strings): ``json.dumps(state, allow_nan=False)`` works.
        The allocation log is not part of it (the grants are the controller's to persist)."""
        return {"format": STATE_FORMAT, "config": _plain(self.config()), "total": self._total,
                "grants": self._grants, "rounds": self._rounds, "sites": [to_json(s) for s in self._sites.values()],
                "policy_state": self._policy_state()}

    def restore(self, state: dict[str, Any]) -> None:
        """Replace this scheduler's sites and statistics by those of ``state`` (from
        :meth:`state` of a scheduler configured the same way); the allocation log restarts."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a scheduler state of format {STATE_FORMAT}: "
                             f"{state.get('format') if isinstance(state, dict) else state!r}")
        if state.get("config") != _plain(self.config()):
            raise ValueError(f"the state was made by a scheduler configured as {state.get('config')}, "
                             f"not as this one {_plain(self.config())}")
        sites = [from_json(self.site_type, data) for data in state["sites"]]
        if [s.order for s in sites] != list(range(len(sites))):
            raise ValueError("the sites of a scheduler state must be in registration order")
        self._sites = {s.site_id: s for s in sites}
        self._live = {s.site_id: s for s in sites if s.live}
        self._pending = {s.site_id: s for s in sites if s.final is None and s.pending is not None}
        self._total = check_int("total", state["total"], 0)
        self._grants = check_int("grants", state["grants"], 0)
        self._rounds = check_int("rounds", state["rounds"], 0)
        self._log = []
        self._restore_policy_state(state["policy_state"])
        for site in self._live.values():
            if not site.running:
                self._on_idle(site)

    # -- helpers for policies ---------------------------------------------------------------
    def _site(self, site_id: str) -> SiteBook:
        try:
            return self._sites[site_id]
        except KeyError:
            raise KeyError(f"unknown site {site_id!r}") from None

    def _remaining(self, site: SiteBook) -> int:
        return self.max_steps - site.granted

    def _set_pending(self, site: SiteBook, action: Action) -> None:
        """Retire ``site`` by a decision that the next ``allocate`` returns."""
        site.pending = action
        self._live.pop(site.site_id, None)
        self._pending[site.site_id] = site
        self._on_leave(site)

    def _retirements(self) -> list[Decision]:
        out = []
        for site in sorted(self._pending.values(), key=lambda s: s.order):
            out.append(Decision(site.site_id, site.pending))
            site.final, site.pending = RETIRED_AS[site.pending], None
        self._pending.clear()
        return out


def _plain(data: Any) -> Any:
    """``data`` as JSON would give it back (tuples as lists), so that configs compare."""
    return json.loads(json.dumps(data, allow_nan=False))


class RankedScheduler(Scheduler):
    """A policy that ranks every idle live site at each allocation: O(live sites) per call."""

    @abstractmethod
    def _rank(self, idle: list[SiteBook], free_slots: int) -> list[tuple[SiteBook, Action, int]]:
        """At most ``free_slots`` of ``idle`` in serving order, with their actions and steps."""

    def _choose(self, free_slots: int) -> list[tuple[SiteBook, Action, int]]:
        idle = [s for s in self._live.values() if not s.running]
        return self._rank(idle, free_slots)[:free_slots] if idle else []
