"""``summary.json``: what a run did, per target and per site (``schema_version`` 2), written from the
run-state store.

Written atomically when the run starts, at most every ``interval_s`` seconds while something
changed (not at every status change: a rewrite costs O(sites)), and when the run ends, so a
killed run still leaves a readable summary a few seconds old (the store, ``state.db``, is
exact). The JSON Schema is ``orchestrator/schemas/summary.schema.json``.

Version 2 (version 1 had the same fields, fewer of them): every site and target and the run
carry an ``exit_reason`` beside their status; site statuses are :class:`SiteStatus` (``retired``
and ``flaky`` are new, ``exhausted`` now means the budget was spent); a target's ``status`` is a
:class:`SiteStatus` too (``error``, or its sites' roll-up) instead of ``ok``/``error``;
``run.state`` gained ``failed``, and ``run.stopped`` holds an :class:`ExitReason` value.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from fuzz_core.io import atomic_write_json
from fuzz_core.status import RunState, SiteStatus
from orchestrator.observers.base import Observer
from orchestrator.run.records import RunRecord, SiteRecord, TargetRecord
from orchestrator.run.state import RunStore, now

SCHEMA_VERSION = 2
FILENAME = "summary.json"
INTERVAL_S = 5.0


def tracking_uri_of(summary: Any) -> str | None:
    """The tracking URI a parsed summary.json names for its run; None when the file names none
    or is not shaped like a summary (a hand-edited or truncated file)."""
    run = summary.get("run") if isinstance(summary, dict) else None
    uri = run.get("tracking_uri") if isinstance(run, dict) else None
    return uri or None


def build_summary(run: RunRecord, targets: list[TargetRecord], sites: list[SiteRecord],
                  known_bugs: list[dict[str, Any]], seconds: float | None = None) -> dict[str, Any]:
    counts = {status.value: 0 for status in SiteStatus}
    for rec in sites:
        counts[rec.status.value] += 1
    stopped = run.exit_reason.value if run.state in (RunState.STOPPED, RunState.FAILED) else None
    return {
        "schema_version": SCHEMA_VERSION,
        "campaign": {"name": run.campaign, "file": run.campaign_file, "config": run.config},
        "run": {
            "folder": run.folder, "campaign_file": run.campaign_file, "started": run.started, "updated": now(),
            "state": run.state.value, "exit_reason": run.exit_reason.value,
            "seconds": round(run.seconds if seconds is None else seconds, 3), "exit_code": run.exit_code,
            "tracking_uri": run.tracking_uri, "mlflow_run_id": run.mlflow_run_id, "stopped": stopped,
            "executor": run.executor, "resumed": run.resumed > 0, "resumed_times": run.resumed,
            "error": run.error, "traceback": run.traceback,
            "resume": f"cdeepfuzz run --resume {run.folder}" if stopped else None,
        },
        "targets": [t.to_dict() for t in targets],
        "sites": [s.to_dict() for s in sites],
        "known_bugs": known_bugs,
        "totals": {"targets": len(targets), "sites": len(sites), "steps": sum(s.steps for s in sites),
                   "findings": sum(1 for s in sites if s.status.finding), **counts},
    }


class SummaryObserver(Observer):
    """Keeps ``summary.json`` up to date from the store, at a cadence."""

    def __init__(self, run_dir: Path, store: RunStore, run: RunRecord, *, interval_s: float = INTERVAL_S,
                 started: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(run_dir) / FILENAME
        self.store, self.run, self.interval_s, self.clock = store, run, interval_s, clock
        self.started = clock() if started is None else started
        self._dirty = False
        self._last = -float("inf")
        self.writes = 0
        self.write_seconds = 0.0

    def write(self) -> Path:
        t = time.perf_counter()
        seconds = self.run.seconds if self.run.state is not RunState.RUNNING else self.clock() - self.started
        data = build_summary(self.run, self.store.targets(), self.store.sites(), self.store.known_bugs(), seconds)
        atomic_write_json(self.path, data)
        self._dirty, self._last = False, self.clock()
        self.writes += 1
        self.write_seconds += time.perf_counter() - t
        return self.path

    def _changed(self, *_args) -> None:
        self._dirty = True

    target_added = site_changed = finding = known_bug = _changed

    def run_started(self, run, resumed) -> None:
        self.write()

    def sites_ready(self, sites) -> None:
        self.write()

    def tick(self) -> None:
        # at least every interval_s, and never more than ~5% of the time (a large campaign's file is big)
        wait = max(self.interval_s, 20 * self.write_seconds / max(1, self.writes))
        if self._dirty and self.clock() - self._last >= wait:
            self.write()

    # run_ended: the run's last act is an explicit write(), once every other observer has ended (the
    # MLflow run ids are known then).
