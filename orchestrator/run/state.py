"""The run-state store: ``<run folder>/state.db``, an SQLite database with one writer, the controller.

It is the run's source of truth; ``summary.json`` is written from it, and ``--resume`` reloads it.
Tables (``STORE_VERSION`` in ``meta``):

- ``run``: one row: campaign, campaign file, config (JSON), state (:class:`RunState`), exit reason
  (:class:`ExitReason`), started, updated, seconds, exit code, executor, tracking URI, MLflow run
  id, times resumed, an internal error and its traceback;
- ``targets``: per target: entry, framework, status, exit reason, error, traceback, sites, recorded ops;
- ``sites``: per site: the site (JSON), status, exit reason, steps, seconds, best and last loss,
  finding folder, error, traceback, the latest checkpoint (path relative to the run folder) and
  the quanta run after it (``since``: a resume runs them again from the checkpoint, so a
  checkpoint need not be written at every quantum), deaths, timeouts, MLflow run id, and the
  quantum in flight (dispatched, not reported yet);
- ``scheduler_log``: every call the controller made to the scheduler (``add_site``,
  ``on_progress``, ``retire``, ``allocate`` with the grants it made), in order: the scheduler is
  pure, so replaying it rebuilds its exact state (its statistics included) and a resumed campaign
  allocates as the uninterrupted one would;
- ``scheduler_state``: the latest snapshot of the scheduler's ``state()`` and the position of the
  log it reflects (written in the transaction of the call at that position): a resume restores it
  and replays only the calls logged after it (the whole log when there is none, or it is unusable);
- ``transitions``: every change of a site's status, in order (site, status, exit reason, steps, time);
- ``known_bugs``: what the reuse phase found when it replayed the known bugs of the campaign's targets;
- ``traces``: each quantum's trace (its points as JSON), committed with the quantum: the outbox that
  :mod:`orchestrator.observers.exporter` turns into Parquet shards and MLflow metrics, a few seconds
  later and off the controller's loop, from its watermark (``exported.json``): a driver killed before
  they were exported exports them when it resumes; rows below the watermark are pruned;
- ``findings``: every confirmed finding, in order (its folder, the site whose search found it, its
  step, its bug as JSON, its size): the occurrences of the run's bugs, which
  :func:`orchestrator.run.records.run_bugs` groups by signature for every output of the run.

Every change happens in a transaction (``with store.transaction():``); a driver killed at any
point leaves the state of the last committed one. WAL journal: readers (``cdeepfuzz report``,
the summary writer) never block the writer.
"""
from __future__ import annotations

import functools
import json
import math
import sqlite3
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from fuzz_core.sites import OpSite
from fuzz_core.status import ExitReason, RunState, SiteStatus
from orchestrator.run.records import FindingRecord, RunRecord, SiteRecord, TargetRecord

FILENAME = "state.db"
STORE_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS run(
    id INTEGER PRIMARY KEY CHECK (id = 1), campaign TEXT NOT NULL, campaign_file TEXT, config TEXT NOT NULL,
    folder TEXT, started TEXT, updated TEXT, executor TEXT, state TEXT NOT NULL, exit_reason TEXT NOT NULL,
    exit_code INTEGER, seconds REAL, tracking_uri TEXT, mlflow_run_id TEXT, resumed INTEGER NOT NULL DEFAULT 0,
    error TEXT, traceback TEXT);
CREATE TABLE IF NOT EXISTS targets(
    name TEXT PRIMARY KEY, ord INTEGER NOT NULL, entry TEXT, framework TEXT, status TEXT NOT NULL,
    exit_reason TEXT NOT NULL, error TEXT, traceback TEXT, sites INTEGER NOT NULL, recorded TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sites(
    id TEXT PRIMARY KEY, ord INTEGER NOT NULL, site TEXT NOT NULL, status TEXT NOT NULL, exit_reason TEXT NOT NULL,
    steps INTEGER NOT NULL, seconds REAL NOT NULL, best_loss REAL, last_loss REAL, finding TEXT, error TEXT,
    traceback TEXT, checkpoint TEXT, deaths INTEGER NOT NULL, timeouts INTEGER NOT NULL, mlflow_run_id TEXT,
    inflight TEXT, updated TEXT, reach TEXT, since TEXT, passed TEXT);
CREATE TABLE IF NOT EXISTS scheduler_log(seq INTEGER PRIMARY KEY, call TEXT NOT NULL, args TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS scheduler_state(
    id INTEGER PRIMARY KEY CHECK (id = 1), policy TEXT, seq INTEGER, state TEXT);
CREATE TABLE IF NOT EXISTS transitions(
    seq INTEGER PRIMARY KEY, site_id TEXT NOT NULL, status TEXT NOT NULL, exit_reason TEXT NOT NULL,
    steps INTEGER NOT NULL, at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS known_bugs(signature TEXT PRIMARY KEY, ord INTEGER NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS findings(
    folder TEXT PRIMARY KEY, ord INTEGER NOT NULL, signature TEXT NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS traces(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, site_id TEXT NOT NULL, at INTEGER NOT NULL, points TEXT NOT NULL);
"""


class StoreError(RuntimeError):
    """The run folder's state.db is missing, from another version, or unreadable."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _real(x: float) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _loss(x: Any) -> float:
    return float(x) if x is not None else math.inf


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as Python numbers and lists; anything else as its text."""
    for attr in ("item", "tolist"):
        if hasattr(value, attr):
            return getattr(value, attr)()
    return str(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_plain)


@functools.lru_cache(maxsize=None)
def _site_json(site: OpSite) -> str:
    """A site's JSON (a site never changes: its record is rewritten at every quantum, its site is not)."""
    return _dumps(site.to_dict())


class RunStore:
    """One run's state. The controller's instance writes; :meth:`open_readonly` gives readers theirs."""

    def __init__(self, path: Path | str, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly:
            if not self.path.is_file():
                raise StoreError(f"{self.path}: no run-state store")
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None,
                                       check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('store_version', ?)", (str(STORE_VERSION),))
            for column in ("reach", "since", "passed", "found_by"):   # a run folder written before sites had them
                if column not in self._columns("sites"):
                    self._db.execute(f"ALTER TABLE sites ADD COLUMN {column} TEXT")
        self._db.execute("PRAGMA busy_timeout=10000")
        version = self._db.execute("SELECT value FROM meta WHERE key = 'store_version'").fetchone()
        if version is None or int(version[0]) != STORE_VERSION:
            raise StoreError(f"{self.path}: store version {version and version[0]}, this CDeepFuzz reads "
                             f"{STORE_VERSION}")
        self._depth = 0
        self._deferred: dict[str, list[tuple]] = {}
        self._lock = threading.RLock()
        self._seq = self._scalar("SELECT COALESCE(MAX(seq), 0) FROM scheduler_log") if not readonly else 0
        self.commits = 0

    @classmethod
    def open_readonly(cls, run_dir: Path | str) -> "RunStore":
        return cls(Path(run_dir) / FILENAME, readonly=True)

    def close(self) -> None:
        self._db.close()

    def _scalar(self, sql: str, args: tuple = ()) -> Any:
        row = self._db.execute(sql, args).fetchone()
        return row[0] if row else None

    # -- transactions ---------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator["RunStore"]:
        """Everything written inside commits together, or not at all. Nests (the outer one commits)."""
        with self._lock:
            outer = self._depth == 0
            if outer:
                self._db.execute("BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield self
                if outer:
                    self._flush_deferred()
            except BaseException:
                self._depth -= 1
                if outer:
                    self._deferred.clear()
                    self._db.execute("ROLLBACK")
                    self._seq = self._scalar("SELECT COALESCE(MAX(seq), 0) FROM scheduler_log")
                raise
            self._depth -= 1
            if outer:
                self.commit()

    def _defer(self, sql: str, args: tuple) -> None:
        """A row written with the others of its kind at the transaction's end (``executemany``): the many rows
        of a turn of the controller's loop (log, traces, transitions) cost one statement each kind."""
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only")
        if self._depth == 0:
            with self.transaction():
                self._deferred.setdefault(sql, []).append(args)
        else:
            self._deferred.setdefault(sql, []).append(args)

    def _flush_deferred(self) -> None:
        for sql, rows in self._deferred.items():
            self._db.executemany(sql, rows)
        self._deferred.clear()

    def commit(self) -> None:
        """Commit the open transaction (a seam for tests that kill the driver at a commit)."""
        self._db.execute("COMMIT")
        self.commits += 1

    def _write(self, sql: str, args: tuple) -> None:
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only")
        with self.transaction():
            self._db.execute(sql, args)

    # -- the run --------------------------------------------------------------------------------
    def put_run(self, run: RunRecord) -> None:
        self._write(
            "INSERT OR REPLACE INTO run VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run.campaign, run.campaign_file, _dumps(run.config), run.folder, run.started, now(), run.executor,
             run.state.value, run.exit_reason.value, run.exit_code, run.seconds, run.tracking_uri,
             run.mlflow_run_id, run.resumed, run.error, run.traceback))

    def run(self) -> RunRecord:
        row = self._db.execute("SELECT campaign, campaign_file, config, folder, started, executor, state, exit_reason, "
                               "exit_code, seconds, tracking_uri, mlflow_run_id, resumed, error, traceback "
                               "FROM run WHERE id = 1").fetchone()
        if row is None:
            raise StoreError(f"{self.path}: no run recorded")
        return RunRecord(row[0], row[1], json.loads(row[2]), row[3], row[4], row[5], RunState(row[6]),
                         ExitReason(row[7]), row[8], row[9] or 0.0, row[10], row[11], row[12] or 0, row[13], row[14])

    def updated(self) -> str | None:
        return self._scalar("SELECT updated FROM run WHERE id = 1")

    # -- targets and sites ---------------------------------------------------------------------
    def put_target(self, rec: TargetRecord, order: int) -> None:
        self._write("INSERT OR REPLACE INTO targets VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (rec.name, order, rec.entry, rec.framework, rec.status.value, rec.exit_reason.value, rec.error,
                     rec.traceback, rec.sites, _dumps(rec.recorded)))

    def targets(self) -> list[TargetRecord]:
        rows = self._db.execute("SELECT name, entry, framework, status, exit_reason, error, traceback, sites, "
                                "recorded FROM targets ORDER BY ord").fetchall()
        return [TargetRecord(r[0], r[1], r[2], SiteStatus(r[3]), ExitReason(r[4]), r[5], r[6], r[7], json.loads(r[8]))
                for r in rows]

    _PUT_SITE = ("INSERT OR REPLACE INTO sites(id, ord, site, status, exit_reason, steps, seconds, best_loss, last_loss, "
                 "finding, error, traceback, checkpoint, deaths, timeouts, mlflow_run_id, inflight, updated, reach, since, "
                 "passed, found_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")

    def put_site(self, rec: SiteRecord, order: int) -> None:
        self.put_sites([(rec, order)])

    def put_sites(self, recs: list[tuple[SiteRecord, int]]) -> None:
        """Site records as they are now (one statement for all of them)."""
        stamp = now()
        rows = [(rec.site.id, order, _site_json(rec.site), rec.status.value, rec.exit_reason.value, rec.steps,
                 rec.seconds, _real(rec.best_loss), _real(rec.last_loss), rec.finding, rec.error, rec.traceback,
                 rec.checkpoint, rec.deaths, rec.timeouts, rec.mlflow_run_id,
                 _dumps(rec.inflight) if rec.inflight else None, stamp, _dumps(rec.reach) if rec.reach else None,
                 _dumps(rec.since) if rec.since else None, _dumps(rec.passed) if rec.passed else None, rec.found_by)
                for rec, order in recs]
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only")
        with self.transaction():
            self._db.executemany(self._PUT_SITE, rows)

    def _columns(self, table: str) -> set[str]:
        return {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}

    def sites(self) -> list[SiteRecord]:
        columns = self._columns("sites")
        reach, since, passed, found_by = (c if c in columns else "NULL"
                                          for c in ("reach", "since", "passed", "found_by"))
        rows = self._db.execute("SELECT site, status, exit_reason, steps, seconds, best_loss, last_loss, finding, "
                                f"error, traceback, checkpoint, deaths, timeouts, mlflow_run_id, inflight, {reach}, "
                                f"{since}, {passed}, {found_by} FROM sites ORDER BY ord").fetchall()
        return [SiteRecord(OpSite.from_dict(json.loads(r[0])), SiteStatus(r[1]), ExitReason(r[2]), r[3], r[4],
                           _loss(r[5]), _loss(r[6]), r[7], r[8], r[9], r[10], json.loads(r[16]) if r[16] else [],
                           r[11], r[12], r[13], json.loads(r[14]) if r[14] else None,
                           reach=json.loads(r[15]) if r[15] else None, passed=json.loads(r[17]) if r[17] else [],
                           found_by=r[18])
                for r in rows]

    def transition(self, rec: SiteRecord) -> None:
        self._defer("INSERT INTO transitions(site_id, status, exit_reason, steps, at) VALUES (?, ?, ?, ?, ?)",
                    (rec.site.id, rec.status.value, rec.exit_reason.value, rec.steps, now()))

    def transitions(self, site_id: str | None = None) -> list[tuple[str, str, str, int]]:
        sql = "SELECT site_id, status, exit_reason, steps FROM transitions"
        rows = self._db.execute(sql + (" WHERE site_id = ? ORDER BY seq" if site_id else " ORDER BY seq"),
                                (site_id,) if site_id else ()).fetchall()
        return [tuple(r) for r in rows]

    # -- the scheduler ---------------------------------------------------------------------------
    @property
    def log_position(self) -> int:
        """The sequence number of the last scheduler call logged (0: none)."""
        return self._seq

    def log_call(self, call: str, args: dict[str, Any]) -> int:
        """Append one scheduler call to the log (inside the caller's transaction); its sequence number."""
        self._seq += 1
        self._defer("INSERT INTO scheduler_log VALUES (?, ?, ?)", (self._seq, call, _dumps(args)))
        return self._seq

    def scheduler_log(self, after: int = 0) -> list[tuple[str, dict[str, Any]]]:
        """The logged calls in order; with ``after``, only those logged after that position."""
        rows = self._db.execute("SELECT call, args FROM scheduler_log WHERE seq > ? ORDER BY seq", (after,)).fetchall()
        return [(call, json.loads(args)) for call, args in rows]

    def grants(self, upto: int) -> list[tuple[str, int]] | None:
        """The grants (site id, steps) of the ``allocate`` calls logged up to position ``upto``, in order;
        None when one of them was logged without its grants (by a CDeepFuzz that did not record them)."""
        out: list[tuple[str, int]] = []
        for (args,) in self._db.execute("SELECT args FROM scheduler_log WHERE call = 'allocate' AND seq <= ? "
                                        "ORDER BY seq", (upto,)):
            grants = json.loads(args).get("grants")
            if not isinstance(grants, list):
                return None
            out.extend((str(site_id), int(steps)) for site_id, steps in grants)
        return out

    def put_scheduler_state(self, policy: str, seq: int, state: Any) -> None:
        """The scheduler's ``state()`` after the call logged at position ``seq`` (write it in that call's
        transaction, or in a later one with no call logged in between, so that the two agree)."""
        self._write("INSERT OR REPLACE INTO scheduler_state VALUES (1, ?, ?, ?)", (policy, seq, _dumps(state)))

    def scheduler_state(self) -> tuple[str, int | None, Any] | None:
        """The latest snapshot: (policy, the log position it reflects, its state); None when there is none.
        A ValueError when its text is not JSON."""
        row = self._db.execute("SELECT policy, seq, state FROM scheduler_state WHERE id = 1").fetchone()
        return (row[0], row[1], json.loads(row[2]) if row[2] is not None else None) if row else None

    # -- known bugs --------------------------------------------------------------------------------
    def put_known_bug(self, signature: str, order: int, record: dict[str, Any]) -> None:
        self._write("INSERT OR REPLACE INTO known_bugs VALUES (?, ?, ?)", (signature, order, _dumps(record)))

    def known_bugs(self) -> list[dict[str, Any]]:
        return [json.loads(r[0]) for r in self._db.execute("SELECT record FROM known_bugs ORDER BY ord")]

    # -- findings ------------------------------------------------------------------------------------
    def put_finding(self, rec: FindingRecord) -> None:
        """Record a finding once (a resumed driver that writes the same folder again changes nothing)."""
        order = self._scalar("SELECT COALESCE(MAX(ord), -1) + 1 FROM findings")
        self._write("INSERT OR IGNORE INTO findings VALUES (?, ?, ?, ?)",
                    (rec.folder, order, rec.signature, _dumps({**rec.to_dict(), "bug": rec.bug})))

    def findings(self) -> list[FindingRecord]:
        """The run's findings in the order they were recorded ([] for a run folder written before there were
        findings in the store: :func:`orchestrator.run.records.findings_of_folder` reads those)."""
        if "findings" not in self._tables():
            return []
        out = []
        for (text,) in self._db.execute("SELECT record FROM findings ORDER BY ord"):
            d = json.loads(text)
            replays = d.get("replays") or {}
            out.append(FindingRecord(d["folder"], d["site"], d["target"], int(d["step"]), d["bug"],
                                     int(d.get("batch_size") or 0), d.get("distance_l2"), d.get("distance_linf"),
                                     bool(d.get("flaky")), (int(replays.get("reproduced", 1)), int(replays.get("of", 1))),
                                     d.get("precision_only"), str(d.get("created") or ""), d.get("overflow")))
        return out

    # -- traces (the outbox of the Parquet and MLflow exports) ------------------------------------
    def put_trace(self, site_id: str, at_ms: int, points: list) -> None:
        """A quantum's trace (:class:`fuzz_core.search.TracePoint` rows), in the quantum's transaction."""
        rows = [[p.step, p.suspect_loss, p.best_loss, p.grad_norm, p.event, bool(p.triggered), p.wall_s]
                for p in points]
        self._defer("INSERT INTO traces(site_id, at, points) VALUES (?, ?, ?)", (site_id, int(at_ms), _dumps(rows)))

    def traces_after(self, seq: int, limit: int = 200_000) -> list[tuple[int, str, int, list]]:
        """(seq, site id, commit time in ms, points) of the traces committed after ``seq``, in order."""
        if "traces" not in self._tables():
            return []
        rows = self._db.execute("SELECT seq, site_id, at, points FROM traces WHERE seq > ? ORDER BY seq LIMIT ?",
                                (int(seq), int(limit))).fetchall()
        return [(s, site, at, json.loads(points)) for s, site, at, points in rows]

    def prune_traces(self, upto: int) -> None:
        """Drop the traces exported already (seq <= ``upto``): they live in Parquet and MLflow now."""
        self._write("DELETE FROM traces WHERE seq <= ?", (int(upto),))

    def _tables(self) -> set[str]:
        return {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
