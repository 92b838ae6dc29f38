"""``summary.json``: what a run did, per target and per site (``schema_version`` 2), written from the
run-state store.

Written atomically when the run starts, at most every ``interval_s`` seconds while something
changed (not at every status change: a rewrite costs O(sites); by the exporter's thread, off the
controller's loop: :mod:`orchestrator.observers.exporter`), and when the run ends, so a
killed run still leaves a readable summary a few seconds old (the store, ``state.db``, is
exact). The JSON Schema is ``orchestrator/schemas/summary.schema.json``.

Version 3: ``bugs``, the run's bugs (one per signature: op, hazard, ``path:line:col``, direction, as
its smallest reproducer shows it, with every occurrence under it), and ``totals.bugs`` (``findings``
counts the occurrences); a site is ``found`` when a confirmed bug is at its op, whichever site's
search found it (``found_by`` names that site when it is another); the findings of other ops' bugs that
a site's search reported on its way are its ``passed`` and no longer make it found; a search that ends
on another op's bug it cannot step past is ``retired`` with the exit reason ``blocked``.

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
from orchestrator.run.records import FindingRecord, RunRecord, SiteRecord, TargetRecord, run_bugs
from orchestrator.run.state import RunStore, now

SCHEMA_VERSION = 3
FILENAME = "summary.json"
INTERVAL_S = 5.0


def tracking_uri_of(summary: Any) -> str | None:
    """The tracking URI a parsed summary.json names for its run; None when the file names none
    or is not shaped like a summary (a hand-edited or truncated file)."""
    run = summary.get("run") if isinstance(summary, dict) else None
    uri = run.get("tracking_uri") if isinstance(run, dict) else None
    return uri or None


def build_summary(run: RunRecord, targets: list[TargetRecord], sites: list[SiteRecord],
                  known_bugs: list[dict[str, Any]], seconds: float | None = None,
                  findings: list[FindingRecord] = ()) -> dict[str, Any]:
    counts = {status.value: 0 for status in SiteStatus}
    for rec in sites:
        counts[rec.status.value] += 1
    bugs = run_bugs(list(findings), sites)
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
        "bugs": bugs,
        "sites": [s.to_dict() for s in sites],
        "known_bugs": known_bugs,
        "expect": expectation(run, bugs),
        "totals": {"targets": len(targets), "sites": len(sites), "steps": sum(s.steps for s in sites),
                   "bugs": len(bugs), "findings": len(findings), **counts},
    }


def expectation(run: RunRecord, bugs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The campaign's ``expect`` against the run's bugs (:meth:`orchestrator.config.Campaign.expectation`);
    None when the campaign says nothing, or cannot be read back."""
    from orchestrator.config import Campaign

    try:
        campaign = Campaign.model_validate(run.config)
    except ValueError:
        return None
    return campaign.expectation(bugs)


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

    def write(self, store: RunStore | None = None) -> Path:
        """Write it from ``store`` (default: the controller's; the exporter passes its own connection)."""
        t = time.perf_counter()
        store = store or self.store
        seconds = self.run.seconds if self.run.state is not RunState.RUNNING else self.clock() - self.started
        data = build_summary(self.run, store.targets(), store.sites(), store.known_bugs(), seconds, store.findings())
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

    def tick_from(self, store: RunStore) -> None:
        """From the exporter's thread and connection (never the controller's loop): at least every
        interval_s, and never more than ~5% of the time (a large campaign's file is big)."""
        wait = max(self.interval_s, 20 * self.write_seconds / max(1, self.writes))
        if self._dirty and self.clock() - self._last >= wait:
            self.write(store)

    # run_ended: the run's last act is an explicit write(), once every other observer has ended (the
    # MLflow run ids are known then).
