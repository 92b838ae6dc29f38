"""The controller: the only writer. It turns scheduler decisions into executor tasks.

Per quantum result, in this order: the finding folder (atomic), its Parquet row,
the trace shard, the checkpoint, then the scheduler and MLflow hear of it. MLflow
calls go through the tracker's background writer, so tracking never stalls the loop.
"""
from __future__ import annotations

import logging
import math
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzz_core.dedupe import record_finding
from fuzz_core.engine import TargetSpec
from fuzz_core.findings import write_finding
from fuzz_core.io import atomic_save_arrays, atomic_write_json
from fuzz_core.search import SearchConfig
from fuzz_core.sites import OpSite
from fuzz_core.status import SiteStatus
from orchestrator.run.executors import ActorDied, QuantumTimeout, Task
from orchestrator.observers.metrics import CampaignMetrics
from orchestrator.scheduler import Action, SiteProgress, make_scheduler
from orchestrator.observers.summary import SiteRecord, TargetRecord
from orchestrator.worker import QuantumOutcome

log = logging.getLogger(__name__)

MAX_TIMEOUTS = 2      # quanta over their time limit before a site is retired as timeout
WAIT_S = 0.5


@dataclass
class LoopLimits:
    time_limit_s: float
    max_deaths: int


def scheduler_options(campaign) -> dict:
    """The policy options a campaign implies: loss-slope's ``horizon`` is the campaign's, else 1
    with the adaptive strategy (its bugs trigger within a few dozen steps, so a site too slow to
    reach its edge within its budget is rarely one) and unlimited with the others (grist's small
    fixed steps make a bug's loss fall slowly for hundreds of steps before it jumps to 0)."""
    if campaign.scheduler.policy != "loss-slope":
        return {}
    horizon = campaign.scheduler.horizon
    if horizon is None and campaign.search.strategy == "adaptive":
        horizon = 1.0
    return {"horizon": horizon}


class Controller:
    def __init__(self, campaign, run_dir: Path, executor, tracker, store, progress, specs: dict[str, TargetSpec],
                 config: SearchConfig, limits: LoopLimits, metrics: bool = True) -> None:
        self.campaign = campaign
        self.run_dir = run_dir
        self.executor = executor
        self.tracker = tracker
        self.store = store
        self.progress = progress
        self.specs = specs
        self.config = config
        self.limits = limits
        self.targets: dict[str, TargetRecord] = {}
        self.sites: dict[str, SiteRecord] = {}
        self.scheduler = make_scheduler(campaign.scheduler.policy, max_steps=config.max_steps,
                                        quantum=campaign.scheduler.quantum,
                                        **scheduler_options(campaign))
        self.stopped_reason: str | None = None
        self.on_change = lambda: None
        self.metrics = CampaignMetrics(campaign.name, metrics)   # live Ray metrics; a no-op without Ray

    # -- discovery ------------------------------------------------------------------------
    def add_targets(self, found: dict, previous: dict[str, SiteRecord] | None = None) -> None:
        """Register the discovered sites (``found``: target name -> sites or TargetFailure)."""
        previous = previous or {}
        for name, spec in self.specs.items():
            rec = self.targets[name] = TargetRecord(name, spec.entry, spec.framework)
            result = found[name]
            if isinstance(result, Exception):
                rec.status, rec.error, rec.traceback = "error", str(result), getattr(result, "tb", None)
                self.progress.message(f"target {name}: could not be built or run: {result}")
                continue
            for site in result:
                if not site.searched:
                    rec.recorded.append({"op": site.op, "kind": site.kind, "location": site.location})
                    continue
                rec.sites += 1
                self.add_site(site, previous.get(site.id))

    def add_site(self, site: OpSite, record: SiteRecord | None = None) -> None:
        rec = record or SiteRecord(site)
        self.sites[site.id] = rec
        if rec.status.final:
            return
        self.scheduler.add_site(site.id, steps_used=rec.steps)
        if self.tracker is not None:
            self.tracker.start_site(site.id, site.label, site_tags(site, rec.status), run_id=rec.mlflow_run_id)

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        deadline = time.monotonic() + self.limits.time_limit_s
        try:
            while not self.scheduler.done:
                if time.monotonic() > deadline:
                    self.stopped_reason = "time limit"
                    break
                self._dispatch()
                for task, outcome in self.executor.wait(WAIT_S):
                    self._handle(task, outcome)
                self.progress.update(self.sites.values())
        except KeyboardInterrupt:
            self.stopped_reason = "interrupted"
        if self.stopped_reason:
            for rec in self.sites.values():
                if not rec.status.final:
                    self._finish(rec, SiteStatus.STOPPED, end="KILLED")
        self.progress.update(self.sites.values(), force=True)

    def _dispatch(self) -> None:
        free = self.executor.slots - self.executor.running
        for decision in self.scheduler.allocate(max(0, free)):
            rec = self.sites[decision.site_id]
            if decision.action is Action.RETIRE_FOUND:
                continue                              # already finished when its finding was written
            if decision.action is Action.RETIRE_EXHAUSTED:
                self._finish(rec, SiteStatus.EXHAUSTED)
                continue
            rec.status = SiteStatus.SEARCHING
            self.executor.submit(Task(rec.site, self.specs[rec.site.target], self.config, decision.steps,
                                      refresh=decision.action is Action.REFRESH, checkpoint=rec.checkpoint))

    def _handle(self, task: Task, outcome: QuantumOutcome | BaseException) -> None:
        rec = self.sites[task.site.id]
        if isinstance(outcome, QuantumOutcome):
            self._quantum(rec, outcome)
            return
        if isinstance(outcome, QuantumTimeout):
            rec.timeouts += 1
            if rec.timeouts >= MAX_TIMEOUTS:
                rec.error = f"{rec.timeouts} quanta over the time limit"
                self._retire(rec, SiteStatus.TIMEOUT)
                return
        elif isinstance(outcome, ActorDied):
            rec.deaths += 1
            if rec.deaths > self.limits.max_deaths:
                rec.error = f"its actor died {rec.deaths} times: {outcome}"
                self._retire(rec, SiteStatus.ERROR)
                return
        else:
            rec.error = "".join(traceback.format_exception_only(type(outcome), outcome)).strip()
            self._retire(rec, SiteStatus.ERROR)
            return
        log.info("%s: %s; resuming from its checkpoint", rec.site.label, outcome)
        self.scheduler.on_progress(SiteProgress(rec.site.id, rec.steps, (), rec.best_loss, False))

    def _quantum(self, rec: SiteRecord, out: QuantumOutcome) -> None:
        result = out.result
        rec.steps, rec.seconds = result.steps, result.seconds
        rec.best_loss = min(rec.best_loss, result.best_loss)
        if result.trace:
            rec.last_loss = result.trace[-1].suspect_loss
        self.metrics.quantum(rec.site, rec.last_loss, rec.best_loss, rec.steps, len(result.trace))
        if out.finding is not None:
            self._write_finding(rec, out.finding)
        self._write_trace(rec, result.trace)
        if out.checkpoint is not None:
            rec.checkpoint = out.checkpoint
            self._write_checkpoint(rec, out.checkpoint)
        status = result.status
        if status is SiteStatus.FOUND and out.finding is None:
            status = SiteStatus.SEARCHING
        if status in (SiteStatus.ERROR, SiteStatus.UNREACHABLE):
            rec.error = result.error
            self._retire(rec, status)
            return
        losses = tuple(p.suspect_loss for p in result.trace)
        self.scheduler.on_progress(SiteProgress(rec.site.id, result.steps, losses, rec.best_loss,
                                                out.finding is not None, log_space=result.log_space))
        if out.finding is not None:
            self._finish(rec, SiteStatus.FOUND)
        elif status is SiteStatus.EXHAUSTED:
            self._finish(rec, SiteStatus.EXHAUSTED)

    # -- writing ----------------------------------------------------------------------------
    def _write_finding(self, rec: SiteRecord, finding) -> None:
        folder = self.run_dir / "findings" / finding.folder_name
        write_finding(finding, folder, display=folder)
        record_finding(self.run_dir.parent, folder)      # one bug per signature: <output>/bugs/<signature>/
        rec.finding = folder.relative_to(self.run_dir).as_posix()
        if self.store is not None:
            self.store.write_finding(finding_row(finding, rec))
        if self.tracker is not None:
            self.tracker.log_artifacts(rec.site.id, folder, artifact_path="finding")
            self.tracker.set_tags(rec.site.id, {"hazard": finding.site.hazard, "trigger": finding.trigger,
                                                "training": str(finding.training).lower(),
                                                "signature": finding.signature, "triage": "new",
                                                "steps": str(finding.step),
                                                "first_op": (finding.first_op or {}).get("kind", ""),
                                                "finding.folder": str(folder)})
        self.metrics.finding(rec.site)
        self.progress.message(f"FOUND {rec.site.label} ({rec.site.hazard}) at step {finding.step}: {folder}")

    def _write_trace(self, rec: SiteRecord, trace) -> None:
        if not trace:
            return
        if self.store is not None:
            self.store.write_traces([trace_row(rec.site, p, self.config.strategy) for p in trace])
        if self.tracker is not None:
            rows = []
            for p in trace:
                rows += [("suspect_loss", p.suspect_loss, p.step), ("best_loss", p.best_loss, p.step),
                         ("grad_norm", p.grad_norm, p.step)]
            self.tracker.log_metrics(rec.site.id, rows)

    def _write_checkpoint(self, rec: SiteRecord, checkpoint) -> None:
        arrays, meta = checkpoint
        arrays_path, meta_path = checkpoint_paths(self.run_dir, rec.site.id)
        atomic_save_arrays(arrays_path, arrays)
        atomic_write_json(meta_path, meta)

    def _retire(self, rec: SiteRecord, status: SiteStatus) -> None:
        self.scheduler.retire(rec.site.id, status.value)
        self._finish(rec, status, end="FAILED" if status in (SiteStatus.ERROR, SiteStatus.TIMEOUT) else "FINISHED")

    def _finish(self, rec: SiteRecord, status: SiteStatus, end: str = "FINISHED") -> None:
        rec.status = status
        rec.checkpoint = None
        if self.tracker is not None:
            tags: dict[str, Any] = {"status": status.value, "steps": str(rec.steps)}
            if rec.error:
                tags["error"] = rec.error[:4000]
            self.tracker.set_tags(rec.site.id, tags)
            self.tracker.end(rec.site.id, end)
        self.on_change()


def checkpoint_paths(run_dir: Path, site_id: str) -> tuple[Path, Path]:
    """Where a site's last checkpoint is kept in a run folder: its arrays, its metadata."""
    folder = run_dir / "checkpoints"
    return folder / f"{site_id}.safetensors", folder / f"{site_id}.json"


def site_tags(site: OpSite, status: SiteStatus) -> dict[str, str]:
    return {"site.id": site.id, "site.op": site.op, "site.kind": site.kind, "site.location": site.location,
            "site.target": site.target, "site.label": site.label, "status": status.value,
            "hazard": site.hazard}


def trace_row(site: OpSite, p, strategy: str) -> dict[str, Any]:
    return {"site_id": site.id, "target": site.target, "op": site.op, "step": p.step,
            "suspect_loss": _f(p.suspect_loss), "best_loss": _f(p.best_loss), "grad_norm": _f(p.grad_norm),
            "strategy": strategy, "event": p.event, "triggered": p.triggered, "wall_s": p.wall_s}


def finding_row(finding, rec: SiteRecord) -> dict[str, Any]:
    first = finding.first_op or {}
    mini = finding.minimised or {}
    batch = next(iter(finding.inputs.values())).shape[0] if finding.inputs else 0
    return {"site_id": finding.site.id, "target": finding.site.target, "op": finding.site.op,
            "hazard": finding.site.hazard, "location": finding.site.location, "signature": finding.signature,
            "steps": finding.step, "seconds": finding.seconds, "trigger": finding.trigger,
            "training": finding.training, "first_op": first.get("kind", ""),
            "first_op_location": first.get("location", ""),
            "batch_size": int(mini.get("original_batch_size", batch)), "minimised_size": int(batch),
            "folder": rec.finding or ""}


def _f(x: float) -> float:
    return float(x) if x is not None and math.isfinite(x) else float("nan")
