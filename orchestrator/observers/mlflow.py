"""The MLflow observer: a run's transitions as MLflow runs, tags and metrics (through the
background :class:`~orchestrator.observers.tracking.Tracker`, so tracking never stalls the loop).

Layout, in the experiment named after the campaign:

- one parent run per campaign run (params: the campaign; tags ``state``, ``exit_reason``,
  ``exit_code``, ``findings``), ended FINISHED (completed), KILLED (stopped) or FAILED;
- a target that could not be built or run: a child run ``target <name>`` ended FAILED, with tags
  ``status`` ``error``, ``exit_reason``, ``error`` (the user's message) and ``traceback``;
- while the campaign has at most ``tracking.max_site_runs`` sites (100: one page of the MLflow
  UI): one child run per site, with ``suspect_loss``, ``best_loss`` and ``grad_norm`` by step, tags
  ``site.*``, ``status`` and ``exit_reason`` (:mod:`fuzz_core.status`), and for a finding its folder
  as artifacts under ``finding/`` (another op's finding that the site's search stepped past: under
  ``passed/<folder>/``, its folder named in the tag ``passed``); ended FINISHED, FAILED (error,
  timeout) or KILLED (stopped);
- above that: one child run per target (metric ``best_loss.<site id>`` per site, by the site's
  step; tags with the counts per status) and one child run per finding, so that a 1,000-site
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
from orchestrator.observers.bugstore import reproducer_folder

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
    def quantum(self, rec, result) -> None:
        if self.per_site:
            rows = []
            for p in result.trace:
                rows += [("suspect_loss", p.suspect_loss, p.step), ("best_loss", p.best_loss, p.step),
                         ("grad_norm", p.grad_norm, p.step)]
            self.tracker.log_metrics(rec.site.id, rows)
        else:
            self.tracker.log_metrics(f"target:{rec.site.target}", [(f"best_loss.{rec.site.id}", rec.best_loss,
                                                                    rec.steps)])

    def finding(self, rec, finding, folder: Path) -> None:
        site = rec.site
        key = site.id
        # another op's finding the site's search stepped past: its files go beside the site's own
        # finding, not over them (the site's run keeps both; its tags stay its own finding's)
        passed = [Path(p).name for p in (getattr(rec, "passed", None) or [])]
        stepped_past = Path(folder).name in passed
        if not self.per_site:
            key = f"finding:{site.id}" + (f":{Path(folder).name}" if stepped_past else "")
            self.tracker.start_site(key, site.label, site_tags(site, SiteStatus.SEARCHING))
        elif stepped_past:
            self.tracker.log_artifacts(key, folder, artifact_path=f"passed/{Path(folder).name}")
            self.tracker.set_tags(key, {"passed": ", ".join(passed)})
            self._note_bug(site, finding, key)
            return
        replays = getattr(finding, "replays", (1, 1))
        self.tracker.log_artifacts(key, folder, artifact_path="finding")
        self.tracker.set_tags(key, {"hazard": site.hazard, "trigger": finding.trigger,
                                    "training": str(finding.training).lower(), "signature": finding.signature,
                                    "steps": str(finding.step), "first_op": (finding.first_op or {}).get("kind", ""),
                                    "first_op.position": position_of(finding.first_op) if finding.first_op else None,
                                    "finding.folder": str(folder), "phase": str(getattr(finding, "phase", "forward")),
                                    "flaky": str(bool(getattr(finding, "flaky", False))).lower(),
                                    "replays": f"{replays[0]}/{replays[1]}",
                                    **({"notes": "; ".join(finding.notes)} if finding.notes else {})})
        self._note_bug(site, finding, key)
        if not self.per_site:
            status = SiteStatus.FLAKY if getattr(finding, "flaky", False) else SiteStatus.FOUND
            self.tracker.set_tags(key, {"status": status.value, "exit_reason": "triggered_flaky"
                                        if status is SiteStatus.FLAKY else "triggered"})
            self.tracker.end(key, "FINISHED")

    def _note_bug(self, site, finding, key: str) -> None:
        self.tracker.note_bug(finding.signature, f"{site.target} {site.op} {site.location}",
                              {"site.target": site.target, "site.op": site.op, "site.location": site.location,
                               "hazard": site.hazard,
                               "reproducer": str(reproducer_folder(self.root, finding.signature).resolve())}, key)

    def site_changed(self, rec, before) -> None:
        counts = self._target_counts.setdefault(rec.site.target, Counter())
        counts[before] -= 1
        counts[rec.status] += 1
        if not self.per_site or rec.site.id not in self._started:
            return      # not started yet (a stopped site reopened by a resume): sites_ready sends its status
        tags: dict[str, Any] = {"status": rec.status.value, "exit_reason": rec.exit_reason.value,
                                "steps": str(rec.steps)}
        if rec.error:
            tags["error"] = rec.error
            tags["traceback"] = (rec.traceback or "")[-MAX_TRACEBACK:] or None
        if rec.status.final and rec.reach:
            tags["reach"] = rec.reach.get("message", "")
        self.tracker.set_tags(rec.site.id, tags)
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

    def run_ended(self, run) -> None:
        findings = sum(1 for rec in self.sites if rec.status.finding)
        if not self.per_site:
            for target, counts in self._target_counts.items():
                key = f"target:{target}"
                self.tracker.set_tags(key, {f"sites.{s.value}": str(n) for s, n in counts.items()})
                self.tracker.end(key, RUN_END[run.state])
        self.tracker.set_tags(CAMPAIGN, {"state": run.state.value, "exit_reason": run.exit_reason.value,
                                         "exit_code": str(run.exit_code), "findings": str(findings)})
        self.tracker.end(CAMPAIGN, RUN_END[run.state])
