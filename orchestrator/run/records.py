"""What the controller knows of each target and site, in the vocabulary of :mod:`fuzz_core.status`.

The controller owns these records and is the only one to change them (a site's status in
:meth:`orchestrator.run.controller.Controller.set_status` alone); the run-state store
(:mod:`orchestrator.run.state`) persists them and observers read them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from fuzz_core.dedupe import size_key
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
    # the finding folders of other ops' bugs that its search reported on its way (another op went
    # non-finite first: the search stepped past it toward its own op, or ended there; relative to the
    # run folder)
    passed: list[str] = field(default_factory=list)
    found_by: str | None = None         # the label of the site whose search found the bug at this one

    def to_dict(self) -> dict[str, Any]:
        s = self.site
        return {
            "id": s.id, "label": s.label, "target": s.target, "op": s.op, "kind": s.kind,
            "hazard": s.hazard, "location": s.location, "column": s.column, "occurrence": s.occurrence,
            "status": self.status.value, "exit_reason": self.exit_reason.value, "steps": self.steps,
            "seconds": round(self.seconds, 4), "best_loss": finite(self.best_loss), "finding": self.finding,
            "error": self.error, "traceback": self.traceback, "mlflow_run_id": self.mlflow_run_id,
            "reach": self.reach, "passed": list(self.passed), "found_by": self.found_by,
        }


@dataclass
class FindingRecord:
    """One confirmed finding of a run: an occurrence of its bug (``bug``: :meth:`fuzz_core.findings.Bug.to_dict`,
    its ``signature`` the known bug's when it is one found before its line moved)."""

    folder: str                         # relative to the run folder
    site_id: str                        # the searched site whose search found it
    target: str
    step: int
    bug: dict[str, Any]
    batch_size: int = 0
    distance_l2: float | None = None
    distance_linf: float | None = None
    flaky: bool = False
    replays: tuple[int, int] = (1, 1)
    precision_only: bool | None = None
    created: str = ""
    overflow: dict[str, Any] | None = None   # mixed precision: the lower precision's overflow (dtype, value, limit)

    @property
    def signature(self) -> str:
        return str(self.bug["signature"])

    @property
    def size(self) -> tuple[float, float, float]:
        """Hypothesis's shortlex order of reproducers: rows, then L2, then Linf distance to the sample."""
        return size_key(self.batch_size, self.distance_l2, self.distance_linf)

    @classmethod
    def of(cls, finding, folder: str) -> "FindingRecord":
        mini = finding.minimised or {}
        dist = mini.get("distance") or {}
        batch = next(iter(finding.inputs.values())).shape[0] if finding.inputs else 0
        return cls(folder, finding.site.id, finding.site.target, int(finding.step),
                   {**finding.bug.to_dict(), "signature": finding.signature}, int(batch),
                   finite(dist.get("l2")), finite(dist.get("linf")), bool(finding.flaky),
                   (int(finding.replays[0]), int(finding.replays[1])), finding.precision_only,
                   datetime.now(timezone.utc).isoformat(timespec="seconds"), finding.overflow)

    def to_dict(self) -> dict[str, Any]:
        return {"folder": self.folder, "site": self.site_id, "target": self.target, "step": self.step,
                "batch_size": self.batch_size, "distance_l2": self.distance_l2,
                "distance_linf": self.distance_linf, "flaky": self.flaky,
                "replays": {"reproduced": self.replays[0], "of": self.replays[1]},
                "precision_only": self.precision_only, "overflow": self.overflow, "created": self.created}


def run_bugs(findings: list[FindingRecord], sites: list) -> list[dict[str, Any]]:
    """The run's bugs, one per signature, in the order they were first found: what every output of a
    run counts (``sites``: the run's site records, or their :class:`OpSite`). Each: the bug (op, hazard, ``path:line:col``, direction) as its smallest reproducer
    shows it (the first found among equals), the sites it is at (the op sites of the calls its occurrences
    name, when the campaign searched them), the targets it occurred in, whether it is flaky (no occurrence reproduced in
    every replay) or precision-only (its reproducer: finite in float32), and its occurrences."""
    groups: dict[str, list[FindingRecord]] = {}
    for f in findings:
        groups.setdefault(f.signature, []).append(f)
    out = []
    for sig, occurrences in groups.items():
        best = min(occurrences, key=lambda f: f.size)      # min keeps the first of equals
        ops = [getattr(s, "site", s) for s in sites]          # site records, or their sites
        at = list(dict.fromkeys(s.id for f in occurrences for s in ops if s.target == f.target and at_site(f.bug, s)))
        out.append({**best.bug, "signature": sig, "targets": sorted({f.target for f in occurrences}),
                    "sites": at, "reproducer": best.folder, "flaky": all(f.flaky for f in occurrences),
                    "precision_only": best.precision_only, "overflow": best.overflow,
                    "occurrences": [f.to_dict() for f in occurrences]})
    return out


def at_site(bug: dict[str, Any], site) -> bool:
    """The bug is at ``site``: the same op row at the same call (its column too, when both know it)."""
    column = bug.get("column")
    return (site.op == bug.get("op") and site.location == bug.get("location")
            and int(site.occurrence) == int(bug.get("occurrence", 0) or 0)
            and (not column or not site.column or int(column) == int(site.column)))


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


def findings_of_folder(run_dir) -> list[FindingRecord]:
    """The findings of a run folder read from its finding folders (a run written before its store held
    them), oldest first."""
    from pathlib import Path

    from fuzz_core.findings import REPORT, report_bug
    from fuzz_core.io import read_json

    out = []
    for report_path in sorted(Path(run_dir).glob(f"findings/*/{REPORT}"), key=lambda p: p.stat().st_mtime):
        try:
            report = read_json(report_path)
            bug = report.get("bug") or report_bug(report).to_dict()
        except (OSError, ValueError, KeyError):
            continue
        mini = report.get("minimised") or {}
        dist = mini.get("distance") or {}
        replays = report.get("replays") or {}
        site = report.get("site") or {}
        out.append(FindingRecord(report_path.parent.relative_to(run_dir).as_posix(), str(site.get("id", "")),
                                 str(site.get("target", "")), int(report.get("step", 0)), bug,
                                 int(report.get("batch_size") or 0), finite(dist.get("l2")), finite(dist.get("linf")),
                                 bool(report.get("flaky")), (int(replays.get("reproduced", 1)), int(replays.get("of", 1))),
                                 report.get("precision_only"), str(report.get("created") or ""), report.get("overflow")))
    return out
