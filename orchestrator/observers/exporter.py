"""The exporter: what the run-state store holds, turned into Parquet traces, MLflow metrics, the
findings' Parquet rows, the output's bug database and ``summary.json``, from a thread of its own and
never on the controller's loop.

The controller commits each quantum's trace in the store (``traces``: the outbox) in the same transaction
as the quantum, and goes on. Every ``interval_s`` the exporter reads the traces committed since its
watermark through a read-only connection of its own, writes one Parquet shard per site (named by the
site's first step in it: exporting the same rows again replaces the shard, never adds a second copy),
hands the metrics to the MLflow observer (one batch per site, stamped with the commit time: MLflow keeps
one copy of a metric sent twice), waits until MLflow has them sent or spooled, and only then moves its
watermark (``exported.json``, written atomically). A driver killed at any point loses nothing that was
committed: the next session exports from the watermark again. The store's findings (the finding folders
the actors wrote) go the same way, with a watermark of their own: each becomes a Parquet row, an
occurrence in the output's bug database (:mod:`fuzz_core.dedupe`) and, with tracking, the mirror of its
bug's record in MLflow. It also writes ``summary.json`` at its cadence from the same connection.

The cost per quantum on the loop is one row in the quantum's transaction; a shard and a metrics batch
now cover every quantum of a site in an interval, not one quantum each (an fsynced shard per quantum
was ~7 ms of the loop's time, MLflow's calls ~12 ms).
"""
from __future__ import annotations

import functools
import logging
import math
import threading
from pathlib import Path
from typing import Any

from fuzz_core.io import atomic_write_json, read_json
from orchestrator.observers.base import Observer
from orchestrator.run.state import FILENAME, RunStore

log = logging.getLogger(__name__)

WATERMARK = "exported.json"
INTERVAL_S = 2.0
FINAL_S = 120.0       # the last export at the run's end: what MLflow has not taken by then stays in the store


def _float(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else float("nan")


class Exporter(Observer):
    """See the module docstring. ``output``: the output folder (Parquet and the bug database); ``mlflow``:
    the MLflow observer (``export_metrics``, ``bug_recorded``), or None; ``summary``: the summary observer."""

    def __init__(self, run_dir: Path, output: Path, campaign: str, strategy: str, mlflow=None, summary=None,
                 interval_s: float | None = None) -> None:
        self.run_dir, self.output, self.campaign = Path(run_dir), Path(output), campaign
        self.strategy, self.mlflow, self.summary = strategy, mlflow, summary
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self.watermark, self.findings_mark = self._read_watermark()
        self.exported = 0             # trace rows exported by this session
        self.flushes = 0
        self._sites: dict[str, tuple[str, str]] = {}     # site id -> (target, op)
        self._stop = threading.Event()
        self._lock = threading.Lock()                   # one export at a time: the thread's, or the last one
        self._thread: threading.Thread | None = None
        self._store: RunStore | None = None

    @functools.cached_property
    def parquet(self):  # noqa: ANN201
        """The run's Parquet store: pyarrow's import (half a second) in the export thread, which starts while
        the driver waits for MLflow's runs, not on the way to the search."""
        from orchestrator.observers.parquet import ParquetStore

        return ParquetStore(self.output, self.campaign, self.run_dir.name)

    # -- the thread -----------------------------------------------------------------------------
    def sites_ready(self, sites) -> None:
        self._sites.update({rec.site.id: (rec.site.target, rec.site.op) for rec in sites})
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="cdeepfuzz-export", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        with self._lock:
            self.parquet          # noqa: B018 - made here, off the driver's way to the search
        while not self._stop.wait(self.interval_s):
            try:
                self.export()
            except Exception:  # noqa: BLE001 - an export never stops the campaign: the store keeps the rows
                log.exception("export of %s failed; its rows stay in the store", self.run_dir)

    def run_ended(self, run) -> None:
        """The last export, once the run's records are final (before the MLflow runs end)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(FINAL_S)
        try:
            self.export(final=True)
        finally:
            if self._store is not None:
                self._store.close()
                self._store = None

    # -- one export ------------------------------------------------------------------------------
    def export(self, final: bool = False) -> int:
        """Export the traces committed since the watermark; then summary.json when due. Returns the rows."""
        with self._lock:
            if self._store is None:
                if not (self.run_dir / FILENAME).is_file():
                    return 0
                self._store = RunStore.open_readonly(self.run_dir)
            rows = self._store.traces_after(self.watermark)
            found = self._store.findings()[self.findings_mark:]
            if rows:
                self._export(rows, final)
                self.watermark = rows[-1][0]
            for record in found:
                self._finding(record)
                self.findings_mark += 1
            if rows or found:
                atomic_write_json(self.run_dir / WATERMARK, {"traces": self.watermark, "findings": self.findings_mark})
                self.exported += len(rows)
                self.flushes += 1
            if self.summary is not None and not final:
                self.summary.tick_from(self._store)
            return len(rows)

    def _finding(self, record) -> None:
        """A finding of the store: its Parquet row, its occurrence in the bug database, MLflow's mirror of
        its bug (a finding exported again is the same row, file and occurrence)."""
        from fuzz_core.dedupe import BugDatabase
        from fuzz_core.findings import REPORT
        from orchestrator.observers.parquet import finding_row

        folder = self.run_dir / record.folder
        try:
            report = read_json(folder / REPORT)
        except (OSError, ValueError) as exc:
            log.warning("finding %s cannot be read (%s): not exported", folder, exc)
            return
        self.parquet.write_finding(finding_row(report, f"{self.run_dir.name}/{record.folder}"))
        db = BugDatabase(self.output)
        db.save(folder, self.campaign)
        if self.mlflow is not None:
            self.mlflow.bug_recorded(record.signature, db.fetch(record.signature) or {})

    def _export(self, rows: list[tuple[int, str, int, list]], final: bool) -> None:
        by_site: dict[str, list[tuple[int, list]]] = {}
        for _, site_id, at, points in rows:
            by_site.setdefault(site_id, []).append((at, points))
        missing = [s for s in by_site if s not in self._sites]
        if missing:
            self._sites.update({rec.site.id: (rec.site.target, rec.site.op) for rec in self._store.sites()})
        for site_id, quanta in by_site.items():
            target, op = self._sites.get(site_id, ("", ""))
            shard = [{"site_id": site_id, "target": target, "op": op, "step": int(step), "suspect_loss": _float(loss),
                      "best_loss": _float(best), "grad_norm": _float(grad), "strategy": self.strategy,
                      "event": str(event), "triggered": bool(trig), "wall_s": float(wall)}
                     for _, points in quanta for step, loss, best, grad, event, trig, wall in points]
            if shard:
                self.parquet.write_traces(shard, part=f"{shard[0]['step']:09d}")
        if self.mlflow is not None and not self.mlflow.export_metrics(by_site, FINAL_S if final else self.interval_s * 10):
            raise TimeoutError("MLflow did not take the metrics in time: they are exported again from the store")

    def _read_watermark(self) -> tuple[int, int]:
        try:
            marks = read_json(self.run_dir / WATERMARK)
            return int(marks.get("traces", 0)), int(marks.get("findings", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            return 0, 0
