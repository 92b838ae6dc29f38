"""The MLflow observer: a run's transitions as MLflow runs, tags and metrics (through the
background :class:`~orchestrator.observers.tracking.Tracker`, so tracking never stalls the loop).

Layout, in the experiment named after the campaign:

- one parent run per campaign run (params: the campaign; tags ``state``, ``exit_reason``,
  ``exit_code``, ``bugs``), ended FINISHED (completed), KILLED (stopped) or FAILED;
- a target that could not be built or run: a child run ``target <name>`` ended FAILED, with tags
  ``status`` ``error``, ``exit_reason``, ``error`` (the user's message) and ``traceback``;
- while the campaign has at most ``tracking.max_site_runs`` sites (100: one page of the MLflow
  UI): one child run per site, with ``suspect_loss``, ``best_loss`` and ``grad_norm`` by step, tags
  ``site.*``, ``status``, ``exit_reason`` (:mod:`fuzz_core.status`) and ``outcome`` (the words of
  :func:`orchestrator.wording.site_outcome`), and for a bug at its own op the finding's folder as
  artifacts under ``finding/`` (another op's bug that the site's search reported on its way: under
  ``passed/<folder>/``, its folder named in the tag ``passed``); ended FINISHED, FAILED (error,
  timeout) or KILLED (stopped);
- above that: one child run per target (metric ``best_loss.<site id>`` per site, by the site's
  step; tags with the counts per status) and one child run per bug, so that a 1,000-site
  campaign reads as a few dozen runs. ``cdeepfuzz bugs`` and ``cdeepfuzz report`` are the views
  made for that size.

Bugs: see :mod:`orchestrator.observers.bug_registry` (one run per bug in ``cdeepfuzz-bugs``, a tag
on each occurrence).
"""
from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from fuzz_core.sites import position_of
from fuzz_core.status import RunState, SiteStatus
from orchestrator.config import params
from orchestrator.observers.base import Observer
from fuzz_core.dedupe import reproducer_folder, triage_state
from orchestrator.run.records import at_site
from orchestrator.wording import site_outcome

CAMPAIGN = "campaign"
RUN_END = {RunState.COMPLETED: "FINISHED", RunState.STOPPED: "KILLED", RunState.FAILED: "FAILED",
           RunState.RUNNING: "KILLED"}
SITE_END = {SiteStatus.ERROR: "FAILED", SiteStatus.TIMEOUT: "FAILED", SiteStatus.STOPPED: "KILLED"}
REFRESH_S = 5.0
FLUSH_START_S = 10.0   # the runs exist (ids known) before the search starts, unless the server is down
MAX_TRACEBACK = 7900


def site_tags(site, status: SiteStatus) -> dict[str, Any]:
    """A site run's tags; ``site.column`` (1-based) and ``site.position`` (``path:line:col``) tell
    calls on one line apart, ``site.location`` (``path:line``) stays what bug signatures use."""
    return {"site.id": site.id, "site.op": site.op, "site.kind": site.kind, "site.location": site.location,
            "site.column": getattr(site, "column", None), "site.position": getattr(site, "position", site.location),
            "site.target": site.target, "site.label": site.label, "status": status.value, "hazard": site.hazard}


class MlflowObserver(Observer):
    def __init__(self, tracker, campaign, run_dir: Path, root: Path, run) -> None:
        self.tracker = tracker
        self.campaign = campaign
        self.run_dir = Path(run_dir)
        self.root = Path(root)
        self.run = run
        self.max_site_runs = campaign.tracking.max_site_runs
        self.per_site = True
        self.resumed = False
        self.sites: list = []
        self._started: set[str] = set()          # site runs started (or reopened) by this session
        self._target_counts: dict[str, Counter] = {}
        self._last_refresh = 0.0
        self._bug_runs: dict[str, str] = {}     # signature -> its child run's key (above max_site_runs sites)
        self._occurrence: dict[str, str] = {}   # signature -> the key of the run of the site it is at
        self._bugs: set[str] = set()            # the run's bugs so far

    # -- the campaign ---------------------------------------------------------------------------
    def run_started(self, run, resumed: bool) -> None:
        self.resumed = resumed
        self.tracker.start_campaign(CAMPAIGN, self.run_dir.name, params(self.campaign),
                                    {"campaign": self.campaign.name, "run.folder": self.run_dir.name,
                                     "state": RunState.RUNNING.value, "exit_reason": "none"},
                                    run_id=run.mlflow_run_id, adopt_folder=self.run_dir.name if resumed else None)

    def target_added(self, target) -> None:
        if target.status is not SiteStatus.ERROR or self.resumed:
            return
        key = f"target:{target.name}"
        self.tracker.start_site(key, f"target {target.name}", {
            "target": target.name, "site.target": target.name, "entry": target.entry,
            "status": target.status.value, "exit_reason": target.exit_reason.value,
            "error": target.error, "traceback": (target.traceback or "")[-MAX_TRACEBACK:] or None})
        self.tracker.end(key, "FAILED")

    def sites_ready(self, sites) -> None:
        self.sites = list(sites)
        self.per_site = len(self.sites) <= self.max_site_runs
        for rec in self.sites:
            self._target_counts.setdefault(rec.site.target, Counter())[rec.status] += 1
        if self.per_site:
            for rec in self.sites:
                if not rec.status.final:
                    self.tracker.start_site(rec.site.id, rec.site.label, site_tags(rec.site, rec.status),
                                            run_id=rec.mlflow_run_id, adopt=self.resumed)
                    self._started.add(rec.site.id)
                elif self.resumed:         # its end may have been lost with the driver that was killed
                    self.tracker.close_site(rec.site.id, {**site_tags(rec.site, rec.status),
                                                          "exit_reason": rec.exit_reason.value,
                                                          "steps": str(rec.steps)},
                                            SITE_END.get(rec.status, "FINISHED"), run_id=rec.mlflow_run_id)
        else:
            for target, counts in self._target_counts.items():
                self.tracker.start_site(f"target:{target}", f"target {target}",
                                        {"target": target, "site.target": target, "sites": str(sum(counts.values())),
                                         **{f"sites.{s.value}": str(n) for s, n in counts.items() if n}})
        self.tracker.flush(FLUSH_START_S)
        self.refresh_ids()

    # -- sites ------------------------------------------------------------------------------------
    def export_metrics(self, by_site: dict[str, list[tuple[int, list]]], timeout: float) -> bool:
        """The loss curves of an export (:mod:`orchestrator.observers.exporter`: per site, its quanta's commit
        times and trace points), one batch per run and commit time; True once MLflow has them (sent, or spooled
        while it does not answer) within ``timeout`` seconds."""
        targets = {rec.site.id: rec.site.target for rec in self.sites}
        by_target: dict[str, list[tuple]] = {}
        for site_id, quanta in by_site.items():
            if self.per_site:
                self.tracker.log_metrics(site_id, [(name, value, step, at) for at, points in quanta
                                                   for step, loss, best, grad, *_ in points
                                                   for name, value in (("suspect_loss", loss), ("best_loss", best),
                                                                       ("grad_norm", grad))])
            elif site_id in targets:        # the site's best loss after each of its quanta, on its target's run
                by_target.setdefault(targets[site_id], []).extend(
                    (f"best_loss.{site_id}", points[-1][2], points[-1][0], at) for at, points in quanta if points)
        for target, rows in by_target.items():
            self.tracker.log_metrics(f"target:{target}", rows)
        return self.tracker.flush(timeout)

    def finding(self, rec, finding, folder: Path) -> None:
        """A finding's files go to the run of the site whose search found it (under ``finding/`` for the bug
        at its own op, under ``passed/<folder>/`` for another op's bug it reported on its way); the bug's
        run in ``cdeepfuzz-bugs`` mirrors the bug database's record, and is linked from the run of the site
        the bug is at. Above ``max_site_runs`` sites: one child run per bug, at its first finding."""
        site = rec.site
        bug = finding.bug
        own = bool(finding.site_triggered)
        self._bugs.add(finding.signature)
        at = rec if own else next((s for s in self.sites if s.site.target == site.target
                                   and at_site(bug.to_dict(), s.site)), None)
        if not self.per_site:
            if finding.signature in self._bug_runs:
                return
            key = self._bug_runs[finding.signature] = f"bug:{finding.signature}"
            self.tracker.start_site(key, f"{bug.op} {bug.position}", {**self._finding_tags(finding, folder),
                                                                      "status": "found", "site.target": site.target,
                                                                      "site.id": site.id})
            self.tracker.log_artifacts(key, folder, artifact_path="finding")
            self.tracker.end(key, "FINISHED")
            return
        if own:
            self.tracker.log_artifacts(site.id, folder, artifact_path="finding")
            self.tracker.set_tags(site.id, self._finding_tags(finding, folder))
        else:
            self.tracker.log_artifacts(site.id, folder, artifact_path=f"passed/{Path(folder).name}")
            self.tracker.set_tags(site.id, {"passed": ", ".join(Path(p).name for p in rec.passed)})
        if at is not None and at.site.id in self._started_or_known():
            self._occurrence[finding.signature] = at.site.id

    def _started_or_known(self) -> set[str]:
        return self._started | {rec.site.id for rec in self.sites if rec.mlflow_run_id}

    @staticmethod
    def _finding_tags(finding, folder: Path) -> dict[str, Any]:
        replays = finding.replays
        return {"hazard": finding.bug.hazard, "trigger": finding.trigger, "training": str(finding.training).lower(),
                "signature": finding.signature, "steps": str(finding.step), "first_op": (finding.first_op or {}).get("kind", ""),
                "first_op.position": position_of(finding.first_op) if finding.first_op else None,
                "finding.folder": str(folder), "phase": finding.phase,
                "flaky": str(bool(finding.flaky)).lower(), "replays": f"{replays[0]}/{replays[1]}",
                **({"notes": "; ".join(finding.notes)} if finding.notes else {})}

    def bug_recorded(self, signature: str, record: dict[str, Any]) -> None:
        """Mirror a bug's record of the bug database (``record``: as the exporter has just updated it): its
        run in ``cdeepfuzz-bugs``, linked from the run of the site it is at."""
        key = self._bug_runs.get(signature) or self._occurrence.get(signature)
        position = record.get("position") or record.get("location")
        self.tracker.note_bug(signature, f"{record.get('op')} {position}",
                              {"bug.op": record.get("op"), "bug.position": position, "bug.phase": record.get("phase"),
                               "hazard": record.get("hazard"), "targets": ", ".join(record.get("targets") or []),
                               "triage": triage_state(record),
                               "triage.note": (record.get("triage") or {}).get("note"),
                               "reproducer": str(reproducer_folder(self.root, signature).resolve())},
                              key)

    def site_changed(self, rec, before) -> None:
        counts = self._target_counts.setdefault(rec.site.target, Counter())
        counts[before] -= 1
        counts[rec.status] += 1
        if not self.per_site or rec.site.id not in self._started:
            return      # not started yet (a stopped site reopened by a resume): sites_ready sends its status
        self.tracker.set_tags(rec.site.id, site_state(rec))
        if rec.status.final:
            self.tracker.end(rec.site.id, SITE_END.get(rec.status, "FINISHED"))

    def known_bug(self, record: dict[str, Any]) -> None:
        if record.get("state") != record.get("state_before"):
            self.tracker.set_bug_state(record["signature"], record["state"], record.get("message"),
                                       {"last_replayed": record.get("replayed_at")})

    # -- cadence and end --------------------------------------------------------------------------
    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_refresh < REFRESH_S:
            return
        self._last_refresh = now
        self.refresh_ids()

    def refresh_ids(self) -> None:
        """Copy the MLflow run ids known by now onto the records (the controller persists them)."""
        self.run.mlflow_run_id = self.run.mlflow_run_id or self.tracker.run_id(CAMPAIGN)
        if self.per_site:
            for rec in self.sites:
                if rec.mlflow_run_id is None:
                    rec.mlflow_run_id = self.tracker.run_id(rec.site.id)

    def findings_restored(self, findings) -> None:
        self._bugs.update(f.signature for f in findings)

    def run_ended(self, run) -> None:
        if not self.per_site:
            for target, counts in self._target_counts.items():
                key = f"target:{target}"
                self.tracker.set_tags(key, {f"sites.{s.value}": str(n) for s, n in counts.items()})
                self.tracker.end(key, RUN_END[run.state])
        self.tracker.set_tags(CAMPAIGN, run_state(run, len(self._bugs)))
        self.tracker.end(CAMPAIGN, RUN_END[run.state])
        self.tracker.mirror(self.run_dir)     # then MLflow is made to agree with the store, whatever was lost


def site_state(rec) -> dict[str, Any]:
    """The tags of a site run that say how the site stands (the run-state store's record of it)."""
    tags: dict[str, Any] = {"status": rec.status.value, "exit_reason": rec.exit_reason.value, "steps": str(rec.steps),
                            "found_by": rec.found_by, "outcome": site_outcome(rec.to_dict())}
    if rec.error:
        tags["error"] = rec.error
        tags["traceback"] = (rec.traceback or "")[-MAX_TRACEBACK:] or None
    return tags


def run_state(run, bugs: int) -> dict[str, Any]:
    """The tags of the campaign's parent run that say how the run stands."""
    return {"state": run.state.value, "exit_reason": run.exit_reason.value, "exit_code": str(run.exit_code),
            "bugs": str(bugs)}


def store_state(run_dir: Path) -> list[tuple[str, str | None, dict[str, Any], str | None]]:
    """What MLflow must show of a run, read from its run-state store (the truth): per MLflow run, (its tracker
    key, its id as the store knows it, the tags of its state, the status it ends with; None while the store
    has it live)."""
    from orchestrator.run.state import RunStore

    store = RunStore.open_readonly(run_dir)
    try:
        run, sites, findings = store.run(), store.sites(), store.findings()
    finally:
        store.close()
    out: list[tuple[str, str | None, dict[str, Any], str | None]] = [
        (CAMPAIGN, run.mlflow_run_id, run_state(run, len({f.signature for f in findings})),
         None if run.state is RunState.RUNNING else RUN_END[run.state])]
    for rec in sites:
        out.append((rec.site.id, rec.mlflow_run_id, site_state(rec),
                    SITE_END.get(rec.status, "FINISHED") if rec.status.final else None))
    return out
