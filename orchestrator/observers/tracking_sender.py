"""Applying tracking operations to MLflow: the writer thread's sender, and spool replay.

:class:`_Sender` applies the operation records that :class:`orchestrator.observers.tracking.Tracker`
queues (start a campaign or site run, log metrics, set tags, upload artifacts, end a run)
to one tracking URI, mapping our run keys to MLflow run ids; :func:`_send` retries a
transient failure with backoff and drops an operation MLflow rejects for good.
:func:`replay_spool` sends a spool file (``tracking-spool.jsonl``, the operations the
writer could not send) from another process (``cdeepfuzz sync``); unsent lines stay in
the file.

For an ``http(s)`` URI the writer sets, unless already set, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``
and ``MLFLOW_HTTP_REQUEST_TIMEOUT=10`` (MLflow's defaults retry for minutes; our retries
replace them) and ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT=true`` (MLflow 3 writes "View
run at" lines to stdout when a run ends). MLflow reads them at each request, process-wide.

SQLite: ``default_sqlite_uri`` gives ``sqlite:///<abs>/mlflow.db`` (MLflow 3 refuses a
``./mlruns`` file store); experiments created here keep artifacts next to the database,
in ``mlartifacts/<experiment>``, not in MLflow's default ``./mlruns`` of the cwd.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

__all__ = ["SPOOL_NAME", "SpoolReplay", "default_sqlite_uri", "experiment_ids", "replay_spool"]

log = logging.getLogger(__name__)

SPOOL_NAME = "tracking-spool.jsonl"
SPOOL_VERSION = 1
TRIES = 3
BACKOFF_S = 0.2  # doubled after every failed try
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_TAG_VALUE = 8000  # mlflow.utils.validation.MAX_TAG_VAL_LENGTH (3.17)
HTTP_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
PARENT_TAG = "mlflow.parentRunId"
EXPERIMENT_KIND, RUNS_KIND = "mlflow.experimentKind", "custom_model_development"
# MLflow error codes that no retry can cure; every other MlflowException is transient.
_PERMANENT_CODES = frozenset(
    "INVALID_PARAMETER_VALUE RESOURCE_DOES_NOT_EXIST RESOURCE_ALREADY_EXISTS INVALID_STATE"
    " BAD_REQUEST MALFORMED_REQUEST ENDPOINT_NOT_FOUND NOT_IMPLEMENTED FEATURE_DISABLED".split()
)
_BAD_PATH_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_T = TypeVar("_T")
Record = dict[str, Any]  # one operation, as queued and as spooled


class _Permanent(Exception):
    """An operation that can never succeed (sending it again is pointless)."""


class _Outcome(Enum):
    SENT = "sent"
    DROPPED = "dropped"  # rejected for good; logged
    FAILED = "failed"  # transient failure after every try


@dataclass(frozen=True)
class SpoolReplay:
    """What a spool replay did: operations sent, dropped as invalid, left in the file."""

    sent: int
    dropped: int
    left: int
    mirrored: int = 0     # MLflow runs changed to agree with the run-state store afterwards


def default_sqlite_uri(output_dir: Path | str) -> str:
    """Absolute ``sqlite:///<abs path>/mlflow.db`` URI for a run output folder."""
    return "sqlite:///" + (Path(output_dir).resolve() / "mlflow.db").as_posix()

def experiment_ids(uri: str) -> Callable[[str], str]:
    """``name -> experiment id`` for ``uri``, creating the experiment (artifacts beside a SQLite store)."""
    return _Sender(uri)._experiment_id


def _chunks(items: list[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


# One client made at a time in this process: MLflow keeps each URI's store (lru_cache), and a new
# SQLite file gets its tables once, not from two threads at once.
_SETTING_UP = threading.Lock()


def _make_client(uri: str) -> MlflowClient:
    """An ``MlflowClient`` with short HTTP retries; a SQLite file that does not exist yet is created whole
    first (:func:`_create_sqlite`)."""
    if uri.startswith(("http://", "https://")):
        for name, value in HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
    db = _sqlite_path(uri)
    with _SETTING_UP:
        if db is not None and not db.exists():
            _create_sqlite(db)
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=uri)


def _create_sqlite(db: Path) -> None:
    """Create MLflow's tables in a file beside ``db`` and rename it into place: MLflow builds a new SQLite
    store by a series of migrations, and a process stopped in the middle of them (a campaign stopped in
    its first seconds) left a store no later MLflow call could open ("table ... already exists"). The
    file is a copy of an empty store made once per MLflow version (:func:`_empty_store`: the migrations
    take 1-2 s, the copy milliseconds); where that cannot be kept, the migrations run here."""
    template = _empty_store()
    _put_in_place(db, _migrate if template is None else (lambda tmp: shutil.copyfile(template, tmp)))


def _put_in_place(path: Path, make: Callable[[Path], object]) -> None:
    """``make`` the file in a new file beside ``path`` and rename it into place, unless another process put
    one there first (either is the same): a process stopped midway leaves no half-made file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.init")
    try:
        make(tmp)
        if not path.exists():
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _migrate(db: Path) -> None:
    """MLflow's migrations into a new SQLite file ``db``."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri="sqlite:///" + db.resolve().as_posix()).search_experiments(max_results=1)


def cache_dir() -> Path:
    """Where CDeepFuzz keeps what it makes once per machine: ``$CDEEPFUZZ_CACHE``, else
    ``$XDG_CACHE_HOME/cdeepfuzz``, else ``~/.cache/cdeepfuzz``."""
    explicit = os.environ.get("CDEEPFUZZ_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdeepfuzz"


def _empty_store() -> Path | None:
    """An empty SQLite store of this MLflow version and schema (``mlflow-<version>-<schema revision>.db`` in
    :func:`cache_dir`), made the first time it is asked for; None where the folder cannot be written."""
    import mlflow
    from mlflow.store.db.utils import _get_latest_schema_revision

    path = cache_dir() / f"mlflow-{mlflow.__version__}-{_get_latest_schema_revision()}.db"
    if path.is_file():
        return path
    try:
        _put_in_place(path, _migrate)
        return path
    except OSError as exc:
        log.debug("tracking: no empty MLflow store in %s (%s): each new store is migrated", path.parent, exc)
        return None


def _artifact_location(uri: str, experiment: str) -> str | None:
    """For SQLite, ``<db folder>/mlartifacts/<experiment>``; else the server's default."""
    db = _sqlite_path(uri)
    if db is None:
        return None
    return (db.resolve().parent / "mlartifacts" / _BAD_PATH_CHARS.sub("_", experiment)).as_uri()


def _is_transient(exc: BaseException) -> bool:
    """Whether sending the same operation again later may succeed."""
    if isinstance(exc, _Permanent):
        return False
    code = getattr(exc, "error_code", None)
    if isinstance(code, str):  # MlflowException
        return code not in _PERMANENT_CODES
    return isinstance(exc, OSError)  # connection errors, timeouts (requests errors too)


# tags that say how a run stands; a spooled operation of an earlier session (a stopped driver's) that
# sets them is stale once the run went on: a replay in another session leaves them (and ends) to
# :meth:`_Sender.mirror`, which sets them from the run-state store
STATE_TAGS = frozenset({"status", "exit_reason", "state", "exit_code", "bugs", "steps", "outcome", "found_by",
                        "error", "traceback"})
STATE_KINDS = frozenset({"end", "close_site", "mirror"})


class _Sender:
    """Applies operation records to one tracking URI (the writer thread, or a replay)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.run_ids: dict[tuple[str, str], str] = {}  # (session, key) -> MLflow run id
        self._experiments: dict[str, str] = {}
        self._client: MlflowClient | None = None

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = _make_client(self.uri)
        return self._client

    def ping(self) -> None:
        self.client.search_experiments(max_results=1)

    def apply(self, rec: Record) -> None:
        handler = getattr(self, f"_do_{rec.get('kind')}", None)
        if handler is None:
            raise _Permanent(f"unknown operation {rec.get('kind')!r}")
        handler(rec, rec["args"])

    def known(self, rec: Record, key: str | None) -> str | None:
        """The MLflow run id of ``key`` in ``rec``'s session, if it was created here."""
        return self.run_ids.get((rec["session"], key)) if key is not None else None

    def _run_id_of(self, rec: Record) -> str | None:
        """The run id of ``rec``'s key: mapped here, else the one its spool line carries."""
        return self.known(rec, rec["key"]) or rec.get("run_id")

    def _parent_run_id_of(self, rec: Record) -> str | None:
        """The run id of ``rec``'s parent key: mapped here, else the one its spool line carries."""
        return self.known(rec, rec.get("parent_key")) or rec.get("parent_run_id")

    def _bind(self, rec: Record, rid: str) -> None:
        """Map ``rec``'s key (in its session) to MLflow run ``rid``."""
        self.run_ids[(rec["session"], rec["key"])] = rid

    def annotate(self, rec: Record) -> Record:
        """``rec`` with the run ids known now, so that a replay elsewhere can address them."""
        out = {**rec, "run_id": self._run_id_of(rec), "parent_run_id": self._parent_run_id_of(rec)}
        occurrence = (rec.get("args") or {}).get("occurrence_key")
        if occurrence is not None:
            out["occurrence_run_id"] = self.known(rec, occurrence) or rec.get("occurrence_run_id")
        return out

    def _experiment_id(self, name: str) -> str:
        if name not in self._experiments:
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                try:
                    location = _artifact_location(self.uri, name)
                    # MLflow 3's UI opens an experiment of unknown kind on its GenAI (traces) page: ours are
                    # runs of a search, one per site, to be read as a table of runs and their curves
                    self._experiments[name] = self.client.create_experiment(name, location,
                                                                            tags={EXPERIMENT_KIND: RUNS_KIND})
                    return self._experiments[name]
                except Exception:  # created meanwhile by another process?
                    exp = self.client.get_experiment_by_name(name)
                    if exp is None:
                        raise
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            self._experiments[name] = exp.experiment_id
        return self._experiments[name]

    def _rid(self, rec: Record) -> str:
        rid = self._run_id_of(rec)
        if not rid:
            raise _Permanent(f"no MLflow run for key {rec['key']!r} (its start was lost)")
        return rid

    def _resume(self, rid: str) -> dict[str, str] | None:
        """Reopen run ``rid``; its params, or None when it does not exist."""
        try:
            run = self.client.get_run(rid)
        except Exception as exc:
            if getattr(exc, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
            log.warning("tracking: run %s to resume does not exist; starting a new one", rid)
            return None
        self.client.update_run(rid, status="RUNNING")
        return dict(run.data.params)

    def _create(self, rec: Record, tags: Mapping[str, str]) -> str:
        eid = self._experiment_id(rec["experiment"])
        run = self.client.create_run(eid, rec["ts"], dict(tags), rec["args"]["run_name"])
        self._bind(rec, run.info.run_id)
        return run.info.run_id

    def _do_start_campaign(self, rec: Record, args: Record) -> None:
        # a replayed line adopts the run its folder's earlier session made (the same line, spooled while in
        # flight, may have reached the server after all): a replay never makes a second parent run
        folder = args.get("adopt_folder") or (args["tags"].get("run.folder") if rec.get("replay") else None)
        rid = self._run_id_of(rec) or args.get("resume_run_id") or self._adopt_campaign(rec, folder)
        existing = self._resume(rid) if rid else None
        if rid is None or existing is None:
            rid, existing = self._create(rec, args["tags"]), {}
        else:
            self._bind(rec, rid)
            self._log_batch(rid, tags=args["tags"])
        params = args["params"]
        changed = sorted(k for k, v in params.items() if existing.get(k, v) != v)
        if changed:
            log.warning("tracking: run %s keeps its old values of params %s", rid, changed)
        self._log_batch(rid, params={k: v for k, v in params.items() if k not in existing})

    def _adopt_campaign(self, rec: Record, folder: str | None) -> str | None:
        """The parent run an earlier session of this run folder created, if any (oldest first)."""
        if not folder or "'" in folder:
            return None
        runs = self.client.search_runs([self._experiment_id(rec["experiment"])],
                                       f"tags.`run.folder` = '{folder}'",
                                       order_by=["attributes.start_time ASC"], max_results=5)
        runs = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        return runs[0].info.run_id if runs else None

    def _adopt(self, rec: Record, site_id: str) -> str | None:
        """The child run of this site that an earlier session of the same campaign run created (a driver
        killed before it kept the run id), if any."""
        parent = self._parent_run_id_of(rec)
        if not parent or "'" in site_id or "'" in parent:
            return None
        runs = self.client.search_runs([self._experiment_id(rec["experiment"])],
                                       f"tags.mlflow.parentRunId = '{parent}' and tags.`site.id` = '{site_id}'",
                                       order_by=["attributes.start_time ASC"], max_results=1)
        return runs[0].info.run_id if runs else None

    def _do_start_site(self, rec: Record, args: Record) -> None:
        rid = self._run_id_of(rec)
        if rid:  # created before the spool line was written
            self._bind(rec, rid)
            return
        resume = args.get("resume_run_id")
        if not resume and (args.get("adopt") or rec.get("replay")):     # never a second run for a site
            resume = self._adopt(rec, args["tags"].get("site.id", ""))
        if resume and self._resume(resume) is not None:
            self._bind(rec, resume)
            return
        parent = self._parent_run_id_of(rec)
        if not parent and rec.get("replay"):
            # its campaign run was lost with a stopped driver: the session that resumes the run makes the
            # site's run under the campaign's (a run at the top level would be an orphan, RUNNING for good)
            raise _Permanent(f"site {rec['key']!r} has no campaign run")
        if not parent:
            log.warning("tracking: site %r has no campaign run; logged at top level", rec["key"])
        self._create(rec, {**args["tags"], **({PARENT_TAG: parent} if parent else {})})

    def _do_log_metrics(self, rec: Record, args: Record) -> None:
        from mlflow.entities import Metric

        rid = self._rid(rec)
        metrics = [Metric(n, v, ts, s) for n, v, s, ts in args["metrics"]]
        for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH):
            self.client.log_batch(rid, metrics=chunk)

    def _do_set_tags(self, rec: Record, args: Record) -> None:
        self._log_batch(self._rid(rec), tags=args["tags"])

    def _do_log_artifacts(self, rec: Record, args: Record) -> None:
        rid = self._rid(rec)
        if not Path(args["local_dir"]).is_dir():
            raise _Permanent(f"artifact folder {args['local_dir']!r} is gone")
        self.client.log_artifacts(rid, args["local_dir"], args["artifact_path"])

    def _do_close_site(self, rec: Record, args: Record) -> None:
        """End a site run an earlier session may have left RUNNING (its end was lost with the driver)."""
        rid = self._run_id_of(rec) or args.get("run_id") or self._adopt(rec, args["tags"].get("site.id", ""))
        if not rid:              # its run was never made (a driver stopped while MLflow did not answer)
            parent = self._parent_run_id_of(rec)
            if not parent:
                return
            rid = self._create({**rec, "args": {**args, "run_name": args["tags"].get("site.label", rec["key"])}},
                               {**args["tags"], PARENT_TAG: parent})
            self.client.set_terminated(rid, status=args["status"], end_time=rec["ts"])
            return
        self._bind(rec, rid)
        if self.client.get_run(rid).info.status == "RUNNING":
            self._log_batch(rid, tags=args["tags"])
            self.client.set_terminated(rid, status=args["status"], end_time=rec["ts"])

    def _do_note_bug(self, rec: Record, args: Record) -> None:
        from orchestrator.observers.bug_registry import note_occurrence

        occurrence = self.known(rec, args.get("occurrence_key")) or rec.get("occurrence_run_id")
        rid = note_occurrence(self.client, self._experiment_id, args["signature"], args["name"], args["tags"],
                              occurrence)
        self._bind(rec, rid)

    def _do_bug_state(self, rec: Record, args: Record) -> None:
        from orchestrator.observers.bug_registry import set_state

        rid = set_state(self.client, self._experiment_id, args["signature"], args["state"], args.get("note"),
                        args.get("tags"))
        if rid:
            self._bind(rec, rid)

    def _do_mirror(self, rec: Record, args: Record) -> None:
        from orchestrator.observers.mlflow import store_state

        self.mirror(store_state(Path(args["run_dir"])), rec["session"])

    def mirror(self, entries: list, session: str | None = None) -> int:
        """Make MLflow's runs agree with the run-state store (``entries``: :func:`store_state`): each run's
        state tags as the store has them, and ended as the store has it ended. A run that agrees already is
        left as it is (a finished run is never changed); a run the store has live is not ended. Returns how
        many runs were changed."""
        from mlflow.entities import RunTag

        changed = 0
        for key, stored_id, tags, end in entries:
            rid = stored_id or self.run_ids.get((session, key))
            if not rid:
                continue
            try:
                run = self.client.get_run(rid)
            except Exception as exc:
                if getattr(exc, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
                    continue
                raise
            text = {k: str(v)[:MAX_TAG_VALUE] for k, v in tags.items() if v is not None}
            want = {k: v for k, v in text.items() if run.data.tags.get(k) != v}
            if want:
                self.client.log_batch(rid, tags=[RunTag(k, v) for k, v in want.items()])
            if end is not None and run.info.status != end:
                self.client.set_terminated(rid, status=end)
            changed += bool(want) or (end is not None and run.info.status != end)
        return changed

    def _do_end(self, rec: Record, args: Record) -> None:
        self.client.set_terminated(self._rid(rec), status=args["status"], end_time=rec["ts"])

    def _log_batch(
        self, rid: str, params: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None
    ) -> None:
        from mlflow.entities import Param, RunTag

        for chunk in _chunks([Param(k, v) for k, v in (params or {}).items()], MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(rid, params=chunk)
        for chunk in _chunks([RunTag(k, v) for k, v in (tags or {}).items()], MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(rid, tags=chunk)


def _send(sender: _Sender, rec: Record, tries: int, give_up: Callable[[], bool] = bool) -> _Outcome:
    """Apply ``rec``, retrying transient failures with backoff until ``give_up()``."""
    for attempt in range(tries):
        try:
            sender.apply(rec)
            return _Outcome.SENT
        except Exception as exc:  # every MLflow failure is contained here
            if not _is_transient(exc):
                log.warning("tracking: dropped %s for %r: %s", rec.get("kind"), rec.get("key"), exc)
                return _Outcome.DROPPED
            log.debug("tracking: %s for %r failed (try %d): %s", rec["kind"], rec["key"], attempt + 1, exc)
        if attempt + 1 == tries or give_up():
            break
        time.sleep(BACKOFF_S * 2**attempt)
    return _Outcome.FAILED


def _fresh(rec: Record, session: str | None) -> Record | None:
    """``rec`` as a replay in ``session`` sends it: as it is when it is that session's own (or ``session`` is
    ``"*"``); an earlier
    session's without what says how a run stands (its ends, its state tags: stale once the run went on,
    which :meth:`_Sender.mirror` sets from the store instead), None when nothing else is left of it."""
    if session == "*" or (session is not None and rec.get("session") == session):
        return rec
    if rec.get("kind") in STATE_KINDS:
        return None
    if rec.get("kind") == "set_tags":
        tags = {k: v for k, v in (rec.get("args") or {}).get("tags", {}).items() if k not in STATE_TAGS}
        return {**rec, "args": {**rec["args"], "tags": tags}} if tags else None
    return rec


def _replay_file(sender: _Sender, path: Path, tries: int, session: str | None = "*") -> SpoolReplay:
    """Send a spool file in order (with ``session``, the lines of other sessions without their state:
    :func:`_fresh`; ``"*"``: every line whole); stop at the first transient failure, keep the rest."""
    if not path.exists():
        return SpoolReplay(0, 0, 0)
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    sent = dropped = 0
    for index, line in enumerate(lines):
        try:
            rec = _fresh(json.loads(line), session)
            outcome = _send(sender, {**rec, "replay": True}, tries) if rec is not None else _Outcome.DROPPED
        except (ValueError, TypeError, KeyError):
            log.warning("tracking: unreadable spool line dropped: %.200s", line)
            outcome = _Outcome.DROPPED
        if outcome is _Outcome.FAILED:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text("".join(f"{rest}\n" for rest in lines[index:]), encoding="utf-8")
            os.replace(tmp, path)
            return SpoolReplay(sent, dropped, len(lines) - index)
        sent += outcome is _Outcome.SENT
        dropped += outcome is _Outcome.DROPPED
    path.unlink(missing_ok=True)
    return SpoolReplay(sent, dropped, 0)


def replay_spool(uri: str, run_dir: Path | str, tries: int = TRIES) -> SpoolReplay:
    """Send ``<run_dir>/tracking-spool.jsonl`` to ``uri`` (unsent lines stay in the file), then, once all is
    sent, make MLflow agree with the run's store (:meth:`_Sender.mirror`): the spool holds what a stopped
    session could not send, and it is sent once, never over what the run became since."""
    sender = _Sender(uri)
    store = (Path(run_dir) / "state.db").is_file()       # else no truth to prefer: every line is sent whole
    result = _replay_file(sender, Path(run_dir) / SPOOL_NAME, tries, session=None if store else "*")
    if result.left == 0 and store:
        from orchestrator.observers.mlflow import store_state

        return dataclasses.replace(result, mirrored=sender.mirror(store_state(Path(run_dir))))
    return result
