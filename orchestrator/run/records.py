"""What the controller knows of each target and site, in the vocabulary of :mod:`fuzz_core.status`.

The controller owns these records and is the only one to change them (a site's status in
:meth:`orchestrator.run.controller.Controller.set_status` alone); the run-state store
(:mod:`orchestrator.run.state`) persists them and observers read them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fuzz_core.sites import OpSite
from fuzz_core.status import ExitReason, RunState, SiteStatus


@dataclass
class SiteRecord:
    site: OpSite
    status: SiteStatus = SiteStatus.PENDING
    exit_reason: ExitReason = ExitReason.NONE
    steps: int = 0
    seconds: float = 0.0
    best_loss: float = math.inf
    last_loss: float = math.inf
    finding: str | None = None          # finding folder, relative to the run folder
    error: str | None = None            # one line: the user's message (or the tool's, for internal errors)
    traceback: str | None = None
    checkpoint: str | None = None       # the latest checkpoint's arrays, relative to the run folder
    since: list[list[Any]] = field(default_factory=list)   # the quanta run after it: [steps, refresh] each
    deaths: int = 0
    timeouts: int = 0
    mlflow_run_id: str | None = None
    inflight: dict[str, Any] | None = None   # a quantum dispatched and not reported yet: {"action", "steps"}
    reach: dict[str, Any] | None = None  # not triggered within its bounds: how close it came, how far outside
    # the finding folders of other ops that went non-finite first, which its search reported and stepped
    # past toward its own op (relative to the run folder)
    passed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        s = self.site
        return {
            "id": s.id, "label": s.label, "target": s.target, "op": s.op, "kind": s.kind,
            "hazard": s.hazard, "location": s.location, "column": s.column, "occurrence": s.occurrence,
            "status": self.status.value, "exit_reason": self.exit_reason.value, "steps": self.steps,
            "seconds": round(self.seconds, 4), "best_loss": finite(self.best_loss), "finding": self.finding,
            "error": self.error, "traceback": self.traceback, "mlflow_run_id": self.mlflow_run_id,
            "reach": self.reach, "passed": list(self.passed),
        }


@dataclass
class TargetRecord:
    name: str
    entry: str
    framework: str | None
    status: SiteStatus = SiteStatus.PENDING      # error when it could not be built or run, else its sites' roll-up
    exit_reason: ExitReason = ExitReason.NONE
    error: str | None = None
    traceback: str | None = None
    sites: int = 0
    recorded: list[dict] = field(default_factory=list)   # stable ops recorded but not searched

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "entry": self.entry, "framework": self.framework, "status": self.status.value,
                "exit_reason": self.exit_reason.value, "error": self.error, "traceback": self.traceback,
                "sites": self.sites, "recorded": self.recorded}


@dataclass
class RunRecord:
    """The run itself: its state and why it ended, and where it reports."""

    campaign: str
    campaign_file: str
    config: dict[str, Any]
    folder: str
    started: str
    executor: str                       # ray | local
    state: RunState = RunState.RUNNING
    exit_reason: ExitReason = ExitReason.NONE
    exit_code: int | None = None
    seconds: float = 0.0
    tracking_uri: str | None = None
    mlflow_run_id: str | None = None
    resumed: int = 0                    # how many times it was resumed
    error: str | None = None            # an internal error of CDeepFuzz that failed the run
    traceback: str | None = None


def finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def target_rollup(target: TargetRecord, sites: list[SiteRecord]) -> tuple[SiteStatus, ExitReason]:
    """A target's status from its sites': error if it broke, searching while any site is live, else
    the most telling final status (found, flaky, stopped, error, timeout, exhausted, retired, unreachable)."""
    if target.status is SiteStatus.ERROR:
        return target.status, target.exit_reason
    if not sites:
        if target.sites == 0:      # nothing to search: every op it ran is stable
            return SiteStatus.EXHAUSTED, ExitReason.COMPLETED
        return SiteStatus.PENDING, ExitReason.NONE
    statuses = {s.status for s in sites}
    if not all(s.final for s in statuses):
        return (SiteStatus.SEARCHING if statuses - {SiteStatus.PENDING} else SiteStatus.PENDING), ExitReason.NONE
    for status in (SiteStatus.FOUND, SiteStatus.FLAKY, SiteStatus.STOPPED, SiteStatus.ERROR, SiteStatus.TIMEOUT,
                   SiteStatus.EXHAUSTED, SiteStatus.RETIRED, SiteStatus.UNREACHABLE):
        if status in statuses:
            reason = next(s.exit_reason for s in sites if s.status is status)
            return status, reason
    return SiteStatus.EXHAUSTED, ExitReason.BUDGET_SPENT
