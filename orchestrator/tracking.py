"""MLflow tracking from a background writer thread (the only module that imports mlflow).

``Tracker`` methods only put an operation on a queue and return; a daemon thread drains it
through ``mlflow.tracking.MlflowClient``, so a slow or unreachable server never stalls the
control loop, and no tracking failure raises into the caller (it is logged). Runs are
addressed by our own keys (the campaign run key, e.g. ``"campaign"``, and each site id),
which the writer maps to MLflow run ids. One experiment per campaign name, one parent run
per campaign run, one nested child run (tag ``mlflow.parentRunId``) per op site.

Failures: a transient failure (connection refused, timeout, 5xx, a locked SQLite file) is
retried ``TRIES`` times with backoff; if it persists the writer goes *offline*: that
operation and every later one are appended, in order, as JSON lines to
``<spool_dir>/tracking-spool.jsonl`` (artifacts by absolute path: the folder must still
exist at replay). Every ``probe_interval_s`` the writer probes the server; once it answers,
the spool is replayed and the writer goes back online. ``replay_spool`` sends a spool from
another process (``cdeepfuzz sync``); unsent lines stay in the file. An operation MLflow
rejects as invalid is logged and dropped. A run whose creation reached the server but whose
answer was lost is created again on replay (MLflow has no idempotent create).

For an ``http(s)`` URI the writer sets, unless already set, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``
and ``MLFLOW_HTTP_REQUEST_TIMEOUT=10`` (MLflow's defaults retry for minutes; our retries
replace them) and ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT=true`` (MLflow 3 writes "View
run at" lines to stdout when a run ends). MLflow reads them at each request, process-wide.

Values: params are flattened to dotted keys and truncated to 6000 characters (MLflow 3.17
``MAX_PARAM_VAL_LENGTH``), tags to 8000; characters MLflow rejects in keys become ``_``.
A NaN metric is sent as is (MLflow stores it with an ``is_nan`` flag, over REST too);
+-inf is clamped to +-``sys.float_info.max``, as MLflow's SQL store does itself, so every
backend agrees; values that are not numbers are skipped. The spool writes NaN as the JSON
extension ``NaN``, which Python's ``json`` reads back.

SQLite: ``default_sqlite_uri`` gives ``sqlite:///<abs>/mlflow.db`` (MLflow 3 refuses a
``./mlruns`` file store); experiments created here keep artifacts next to the database,
in ``mlartifacts/<experiment>``, not in MLflow's default ``./mlruns`` of the cwd.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import queue
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

__all__ = [
    "RunEnd",
    "SpoolReplay",
    "Tracker",
    "default_sqlite_uri",
    "flatten_params",
    "query_findings",
    "replay_spool",
    "set_triage",
]

log = logging.getLogger(__name__)

RunEnd = Literal["FINISHED", "FAILED", "KILLED"]
RUN_ENDS = ("FINISHED", "FAILED", "KILLED")
SPOOL_NAME = "tracking-spool.jsonl"
SPOOL_VERSION = 1
TRIES = 3
BACKOFF_S = 0.2  # doubled after every failed try
PROBE_INTERVAL_S = 15.0
CLOSE_GRACE_S = 1.0
MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (3.17)
MAX_TAG_VALUE = 8000  # MAX_TAG_VAL_LENGTH
MAX_KEY = 250  # MAX_ENTITY_KEY_LENGTH
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
HTTP_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
PARENT_TAG = "mlflow.parentRunId"
# MLflow error codes that no retry can cure; every other MlflowException is transient.
_PERMANENT_CODES = frozenset(
    "INVALID_PARAMETER_VALUE RESOURCE_DOES_NOT_EXIST RESOURCE_ALREADY_EXISTS INVALID_STATE"
    " BAD_REQUEST MALFORMED_REQUEST ENDPOINT_NOT_FOUND NOT_IMPLEMENTED FEATURE_DISABLED".split()
)
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")  # what MLflow accepts in param/metric/tag keys
_BAD_PATH_CHARS = re.compile(r"[^A-Za-z0-9._-]")
# query_findings columns read from tags of a site run
_FINDING_TAGS = {
    "site_id": "site.id",
    "target": "site.target",
    "op": "site.op",
    "hazard": "hazard",
    "location": "site.location",
    "status": "status",
    "triage": "triage",
    "signature": "signature",
}
_STOP = object()
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


def default_sqlite_uri(output_dir: Path | str) -> str:
    """Absolute ``sqlite:///<abs path>/mlflow.db`` URI for a run output folder."""
    return "sqlite:///" + (Path(output_dir).resolve() / "mlflow.db").as_posix()


def _safe_key(key: object) -> str:
    """A param/metric/tag key MLflow accepts: bad characters become ``_``."""
    return _BAD_KEY_CHARS.sub("_", str(key))[:MAX_KEY] or "_"


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested mappings to dotted keys; lists as JSON; values truncated for MLflow."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, f"{name}."))
            continue
        text = json.dumps(value, default=str) if isinstance(value, (list, tuple)) else str(value)
        out[_safe_key(name)] = text[:MAX_PARAM_VALUE]
    return out


def _str_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    """Tags as strings (bools as ``true``/``false``); ``None`` values are left out."""
    return {
        _safe_key(k): (str(v).lower() if isinstance(v, bool) else str(v))[:MAX_TAG_VALUE]
        for k, v in tags.items()
        if v is not None
    }


def _metric_rows(rows: Iterable[tuple[str, float, int]], ts: int) -> list[list[Any]]:
    """``[name, value, step, timestamp]`` rows; inf clamped, non-numbers skipped."""
    out = []
    for name, value, step in rows:
        try:
            number = float(value)
        except (TypeError, ValueError):
            log.debug("tracking: metric %s=%r is not a number; skipped", name, value)
            continue
        if math.isinf(number):
            number = math.copysign(sys.float_info.max, number)
        out.append([_safe_key(name), number, int(step), ts])
    return out


def _chunks(items: list[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def _make_client(uri: str) -> MlflowClient:
    """An ``MlflowClient`` with short HTTP retries; creates a SQLite file's folder."""
    if uri.startswith(("http://", "https://")):
        for name, value in HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
    db = _sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


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

    def annotate(self, rec: Record) -> Record:
        """``rec`` with the run ids known now, so that a replay elsewhere can address them."""
        return {
            **rec,
            "run_id": self.known(rec, rec["key"]) or rec.get("run_id"),
            "parent_run_id": self.known(rec, rec.get("parent_key")) or rec.get("parent_run_id"),
        }

    def _experiment_id(self, name: str) -> str:
        if name not in self._experiments:
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                try:
                    location = _artifact_location(self.uri, name)
                    self._experiments[name] = self.client.create_experiment(name, location)
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
        rid = self.known(rec, rec["key"]) or rec.get("run_id")
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
        self.run_ids[(rec["session"], rec["key"])] = run.info.run_id
        return run.info.run_id

    def _do_start_campaign(self, rec: Record, args: Record) -> None:
        rid = self.known(rec, rec["key"]) or rec.get("run_id") or args.get("resume_run_id")
        existing = self._resume(rid) if rid else None
        if rid is None or existing is None:
            rid, existing = self._create(rec, args["tags"]), {}
        else:
            self.run_ids[(rec["session"], rec["key"])] = rid
            self._log_batch(rid, tags=args["tags"])
        params = args["params"]
        changed = sorted(k for k, v in params.items() if existing.get(k, v) != v)
        if changed:
            log.warning("tracking: run %s keeps its old values of params %s", rid, changed)
        self._log_batch(rid, params={k: v for k, v in params.items() if k not in existing})

    def _do_start_site(self, rec: Record, args: Record) -> None:
        rid = self.known(rec, rec["key"]) or rec.get("run_id")
        if rid:  # created before the spool line was written
            self.run_ids[(rec["session"], rec["key"])] = rid
            return
        resume = args.get("resume_run_id")
        if resume and self._resume(resume) is not None:
            self.run_ids[(rec["session"], rec["key"])] = resume
            return
        parent = self.known(rec, rec.get("parent_key")) or rec.get("parent_run_id")
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


def _replay_file(sender: _Sender, path: Path, tries: int) -> SpoolReplay:
    """Send a spool file in order; stop at the first transient failure, keep the rest."""
    if not path.exists():
        return SpoolReplay(0, 0, 0)
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    sent = dropped = 0
    for index, line in enumerate(lines):
        try:
            outcome = _send(sender, json.loads(line), tries)
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


def replay_spool(uri: str, spool_dir: Path | str, tries: int = TRIES) -> SpoolReplay:
    """Send ``<spool_dir>/tracking-spool.jsonl`` to ``uri``; unsent lines stay in the file."""
    return _replay_file(_Sender(uri), Path(spool_dir) / SPOOL_NAME, tries)


def _never_raise(method: Callable[..., None]) -> Callable[..., None]:
    """Log, never raise: a tracking failure must not stop the campaign."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            method(*args, **kwargs)
        except Exception:
            log.exception("tracking: %s failed", method.__name__)

    return wrapper


class Tracker:
    """MLflow runs of one campaign run, written by a background thread.

    Every public method returns at once and never raises. ``flush`` waits until what was
    enqueued before it is sent or spooled; ``close`` ends the runs still open with
    ``status`` (``None`` leaves them open), flushes and stops the writer.
    """

    def __init__(
        self,
        uri: str,
        experiment: str,
        spool_dir: Path | str,
        *,
        tries: int = TRIES,
        probe_interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self.uri, self.experiment = uri, experiment
        self.spool_path = Path(spool_dir) / SPOOL_NAME
        self._tries, self._probe_interval_s = tries, probe_interval_s
        self._session = uuid.uuid4().hex[:12]
        self._sender = _Sender(uri)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._open: dict[str, None] = {}  # keys of runs started and not ended, in order
        self._campaign_key: str | None = None
        self._closed = False
        self._abandon = False  # close timed out: spool what is left, send nothing more
        self._offline = False  # spooling until the server answers again
        self._next_probe = 0.0
        self._thread = threading.Thread(target=self._drain, name="cdeepfuzz-tracking", daemon=True)
        self._thread.start()

    def _put(self, kind: str, key: str, parent_key: str | None = None, **args: Any) -> None:
        if self._closed:
            log.warning("tracking: %s for %r after close; ignored", kind, key)
            return
        rec = {
            "v": SPOOL_VERSION,
            "session": self._session,
            "experiment": self.experiment,
            "kind": kind,
            "key": str(key),
            "parent_key": parent_key,
            "ts": int(time.time() * 1000),
            "args": args,
        }
        self._queue.put(rec)

    @_never_raise
    def start_campaign(
        self,
        key: str,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, Any],
        run_id: str | None = None,
    ) -> None:
        """Start the parent run (or reopen ``run_id`` to resume) with flattened params."""
        self._campaign_key = key
        params, tags = flatten_params(params), _str_tags(tags)
        self._put("start_campaign", key, run_name=run_name, params=params, tags=tags, resume_run_id=run_id)
        self._open[key] = None

    @_never_raise
    def start_site(self, key: str, run_name: str, tags: Mapping[str, Any], run_id: str | None = None) -> None:
        """Start a child run of the campaign run (or reopen ``run_id`` to resume); ``triage`` defaults to ``new``."""
        tags = _str_tags({"triage": "new", **tags})
        self._put("start_site", key, self._campaign_key, run_name=run_name, tags=tags, resume_run_id=run_id)
        self._open[key] = None

    @_never_raise
    def log_metrics(self, key: str, rows: Iterable[tuple[str, float, int]]) -> None:
        """Log ``(name, value, step)`` rows in batches; inf clamped, non-numbers skipped."""
        metrics = _metric_rows(rows, int(time.time() * 1000))
        if metrics:
            self._put("log_metrics", key, metrics=metrics)

    @_never_raise
    def set_tags(self, key: str, tags: Mapping[str, Any]) -> None:
        """Set tags on a run (``None`` values are skipped)."""
        self._put("set_tags", key, tags=_str_tags(tags))

    @_never_raise
    def log_artifacts(self, key: str, local_dir: Path | str, artifact_path: str = "finding") -> None:
        """Upload the files of ``local_dir`` under ``artifact_path`` (read when sent)."""
        local = str(Path(local_dir).resolve())
        self._put("log_artifacts", key, local_dir=local, artifact_path=artifact_path)

    @_never_raise
    def end(self, key: str, status: RunEnd = "FINISHED") -> None:
        """End a run with ``FINISHED``, ``FAILED`` or ``KILLED``."""
        if status not in RUN_ENDS:
            log.error("tracking: end status %r is not one of %s; ignored", status, RUN_ENDS)
            return
        self._put("end", key, status=status)
        self._open.pop(key, None)

    def flush(self, timeout: float) -> bool:
        """Wait until everything enqueued so far is sent or spooled; False on timeout."""
        if not self._thread.is_alive():
            return self._queue.empty()
        done = threading.Event()
        self._queue.put(done)
        return done.wait(max(0.0, timeout))

    def close(self, timeout: float = 10.0, status: RunEnd | None = "KILLED") -> bool:
        """End open runs with ``status``, flush within ``timeout`` and stop the writer.

        True when everything was sent or spooled in time. Otherwise the writer spools what
        is left as soon as its current call returns (it is a daemon thread: a process exit
        loses what it had not spooled yet).
        """
        if self._closed:
            return not self._thread.is_alive()
        deadline = time.monotonic() + max(0.0, timeout)
        for key in reversed(list(self._open) if status is not None else []):
            self.end(key, status)
        self._closed = True
        drained = self.flush(timeout)
        if not drained:
            self._abandon = True
            log.warning("tracking: not drained in %.1fs; spooling the rest to %s", timeout, self.spool_path)
        self._queue.put(_STOP)
        self._thread.join(max(0.0, deadline - time.monotonic()) + CLOSE_GRACE_S)
        return drained and not self._thread.is_alive()

    def run_id(self, key: str) -> str | None:
        """MLflow run id of ``key`` (known once its start was sent: call ``flush`` first)."""
        return self._sender.run_ids.get((self._session, key))

    @property
    def parent_run_id(self) -> str | None:
        """MLflow run id of the campaign run, once sent."""
        return self.run_id(self._campaign_key) if self._campaign_key else None

    @property
    def offline(self) -> bool:
        """Whether the writer is spooling because the server did not answer."""
        return self._offline

    def _drain(self) -> None:
        """The writer thread: send queued operations in order until ``_STOP``."""
        while True:
            try:
                item = self._queue.get(timeout=self._probe_interval_s if self._offline else None)
            except queue.Empty:
                self._try_reconnect()
                continue
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._handle(item)
            except Exception:  # never let the writer die
                log.exception("tracking: writer failed on %s", item.get("kind"))

    def _handle(self, rec: Record) -> None:
        self._try_reconnect()
        if self._offline or self._abandon:
            self._spool(rec)
        elif _send(self._sender, rec, self._tries, lambda: self._abandon) is _Outcome.FAILED:
            log.warning("tracking: %s unreachable; spooling to %s until it answers", self.uri, self.spool_path)
            self._offline = True
            self._next_probe = time.monotonic() + self._probe_interval_s
            self._spool(rec)

    def _spool(self, rec: Record) -> None:
        try:
            self.spool_path.parent.mkdir(parents=True, exist_ok=True)
            with self.spool_path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(self._sender.annotate(rec), default=str) + "\n")
        except (OSError, TypeError, ValueError):
            log.exception("tracking: could not spool %s for %r; lost", rec["kind"], rec["key"])

    def _try_reconnect(self) -> None:
        """When offline and a probe is due: if the server answers, replay the spool."""
        if not self._offline or self._abandon or time.monotonic() < self._next_probe:
            return
        self._next_probe = time.monotonic() + self._probe_interval_s
        try:
            self._sender.ping()
        except Exception as exc:
            log.debug("tracking: %s still unreachable: %s", self.uri, exc)
            return
        result = _replay_file(self._sender, self.spool_path, tries=1)
        if result.left == 0:
            self._offline = False
            log.info("tracking: %s answers again; replayed %d spooled operations", self.uri, result.sent)


def _pages(fetch: Callable[[str | None], Any]) -> Iterator[Any]:
    """Every item of a paged MLflow search."""
    token: str | None = None
    while True:
        page = fetch(token)
        yield from page
        token = page.token
        if not token:
            return


def _as_int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def query_findings(uri: str, campaign: str | None = None, state: str | None = None) -> list[dict]:
    """Site runs tagged ``status=found`` (optionally of one campaign, in one triage state).

    Each dict: site_id, label (run name), target, op, hazard, location, steps (metric or
    tag ``steps``), status, triage, signature, run_id, campaign (experiment name).
    """
    if state is not None and ("'" in state or "\\" in state):
        raise ValueError(f"triage state {state!r} must not contain quotes or backslashes")
    client = _make_client(uri)
    if campaign is not None:
        exp = client.get_experiment_by_name(campaign)
        experiments = {exp.experiment_id: exp.name} if exp is not None else {}
    else:
        found = _pages(lambda t: client.search_experiments(max_results=1000, page_token=t))
        experiments = {e.experiment_id: e.name for e in found}
    if not experiments:
        return []
    where = "tags.status = 'found'" + (f" and tags.triage = '{state}'" if state is not None else "")
    ids = list(experiments)
    runs = _pages(lambda t: client.search_runs(ids, where, max_results=1000, page_token=t))
    return [
        {
            **{name: run.data.tags.get(tag) for name, tag in _FINDING_TAGS.items()},
            "label": run.info.run_name,
            "steps": _as_int(run.data.metrics.get("steps", run.data.tags.get("steps"))),
            "run_id": run.info.run_id,
            "campaign": experiments[run.info.experiment_id],
        }
        for run in runs
        if PARENT_TAG in run.data.tags
    ]


def set_triage(uri: str, run_id: str, state: str, note: str | None = None) -> None:
    """Set tags ``triage`` (and ``triage.note``) on a site run."""
    from mlflow.entities import RunTag

    tags = [RunTag("triage", str(state)[:MAX_TAG_VALUE])]
    if note is not None:
        tags.append(RunTag("triage.note", str(note)[:MAX_TAG_VALUE]))
    _make_client(uri).log_batch(run_id, tags=tags)
