"""MLflow tracking from a background writer thread.

``Tracker`` methods only put an operation on a queue and return; a daemon thread drains it
through ``mlflow.tracking.MlflowClient`` (in a child process:
:mod:`orchestrator.observers.tracking_process`), so a slow or unreachable server never stalls the
control loop, and no tracking failure raises into the caller (it is logged). Runs are
addressed by our own keys (the campaign run key, e.g. ``"campaign"``, and each site id),
which the writer maps to MLflow run ids. One experiment per campaign name, one parent run
per campaign run, one nested child run (tag ``mlflow.parentRunId``) per op site.

Failures: a transient failure (connection refused, timeout, 5xx, a locked SQLite file) is
retried ``TRIES`` times with backoff; if it persists the writer goes *offline*: that
operation and every later one are appended, in order, as JSON lines to
``<spool_dir>/tracking-spool.jsonl`` (artifacts by absolute path: the folder must still
exist at replay). Every ``probe_interval_s`` the writer probes the server; once it answers,
the spool is replayed and the writer goes back online. ``tracking_sender.replay_spool`` sends a
spool from another process (``cdeepfuzz sync``); unsent lines stay in the file. An operation MLflow
rejects as invalid is logged and dropped. A run whose creation reached the server but whose
answer was lost is created again on replay (MLflow has no idempotent create).

Values: params are flattened to dotted keys and truncated to 6000 characters (MLflow 3.17
``MAX_PARAM_VAL_LENGTH``), tags to 8000; characters MLflow rejects in keys become ``_``.
A NaN metric is sent as is (MLflow stores it with an ``is_nan`` flag, over REST too);
+-inf is clamped to +-``sys.float_info.max``, as MLflow's SQL store does itself, so every
backend agrees; values that are not numbers are skipped. The spool writes NaN as the JSON
extension ``NaN``, which Python's ``json`` reads back.

Modules: the writer sends through :mod:`orchestrator.observers.tracking_sender` (which also replays
a spool, and sets MLflow's HTTP options and SQLite locations); bugs (one MLflow run per signature,
holding its triage state) are written and read by :mod:`orchestrator.observers.bug_registry`. Those
two are the only modules that import mlflow; :mod:`orchestrator.observers.mlflow` turns a run's
transitions into calls of this tracker.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import queue
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from orchestrator.observers.tracking_sender import (
    SPOOL_NAME,
    SPOOL_VERSION,
    TRIES,
    Record,
    _Outcome,
    _replay_file,
    _send,
)
from orchestrator.observers.tracking_process import RemoteSender

__all__ = [
    "RunEnd",
    "Tracker",
    "flatten_params",
]

log = logging.getLogger(__name__)

RunEnd = Literal["FINISHED", "FAILED", "KILLED"]
RUN_ENDS = ("FINISHED", "FAILED", "KILLED")
PROBE_INTERVAL_S = 15.0
CLOSE_GRACE_S = 1.0
MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (3.17)
MAX_TAG_VALUE = 8000  # MAX_TAG_VAL_LENGTH
MAX_KEY = 250  # MAX_ENTITY_KEY_LENGTH
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")  # what MLflow accepts in param/metric/tag keys
_STOP = object()
_WAKE = object()     # wakes the writer for an urgent operation


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


def _metric_rows(rows: Iterable[tuple], ts: int) -> list[list[Any]]:
    """``[name, value, step, timestamp]`` rows (``ts`` unless a row carries its own, fourth); inf clamped,
    non-numbers skipped."""
    out = []
    for name, value, step, *own in rows:
        try:
            number = float(value)
        except (TypeError, ValueError):
            log.debug("tracking: metric %s=%r is not a number; skipped", name, value)
            continue
        if math.isinf(number):
            number = math.copysign(sys.float_info.max, number)
        out.append([_safe_key(name), number, int(step), int(own[0]) if own else ts])
    return out



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
        self._sender = RemoteSender(uri)      # MLflow itself runs in a child process
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._urgent: queue.SimpleQueue[Record] = queue.SimpleQueue()   # sent before what is queued
        self._spool_lock = threading.Lock()
        self._inflight: Record | None = None      # the operation the writer is sending
        self._open: dict[str, None] = {}  # keys of runs started and not ended, in order
        self._campaign_key: str | None = None
        self._closed = False
        self._abandon = False  # close timed out: spool what is left, send nothing more
        # spooling until the server answers again; a spool left by an earlier session of this run (a
        # stopped or killed driver) is sent first, once, before anything of this session's
        self._offline = self.spool_path.exists()
        self._next_probe = 0.0
        self._thread = threading.Thread(target=self._drain, name="cdeepfuzz-tracking", daemon=True)
        self._thread.start()

    def _put(self, kind: str, key: str, parent_key: str | None = None, **args: Any) -> None:
        rec = self._record(kind, key, parent_key, **args)
        if rec is not None:
            self._queue.put(rec)

    def _record(self, kind: str, key: str, parent_key: str | None = None, **args: Any) -> Record | None:
        if self._closed:
            log.warning("tracking: %s for %r after close; ignored", kind, key)
            return None
        return {
            "v": SPOOL_VERSION,
            "session": self._session,
            "experiment": self.experiment,
            "kind": kind,
            "key": str(key),
            "parent_key": parent_key,
            "ts": int(time.time() * 1000),
            "args": args,
        }

    @_never_raise
    def start_campaign(
        self,
        key: str,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, Any],
        run_id: str | None = None,
        adopt_folder: str | None = None,
    ) -> None:
        """Start the parent run (or reopen ``run_id`` to resume) with flattened params. Resuming
        without a run id (the driver was killed before it kept one), ``adopt_folder`` names the run
        folder whose parent run an earlier session created: it is reopened, not duplicated."""
        self._campaign_key = key
        params, tags = flatten_params(params), _str_tags(tags)
        self._put("start_campaign", key, run_name=run_name, params=params, tags=tags, resume_run_id=run_id,
                  adopt_folder=adopt_folder)
        self._open[key] = None

    @_never_raise
    def start_site(self, key: str, run_name: str, tags: Mapping[str, Any], run_id: str | None = None,
                   adopt: bool = False) -> None:
        """Start a child run of the campaign run (or reopen ``run_id`` to resume; with ``adopt``, reopen the
        child run of the same ``site.id`` tag an earlier session created); ``triage`` defaults to ``new``."""
        tags = _str_tags({"triage": "new", **tags})
        self._put("start_site", key, self._campaign_key, run_name=run_name, tags=tags, resume_run_id=run_id,
                  adopt=adopt)
        self._open[key] = None

    @_never_raise
    def close_site(self, key: str, tags: Mapping[str, Any], status: RunEnd, run_id: str | None = None) -> None:
        """End a site run that an earlier session of this campaign run may have left RUNNING (found by
        ``run_id``, else by its ``site.id`` tag); a run already ended is left as it is."""
        self._put("close_site", key, self._campaign_key, tags=_str_tags(tags), status=status, run_id=run_id)

    @_never_raise
    def log_metrics(self, key: str, rows: Iterable[tuple[str, float, int]], timestamp_ms: int | None = None) -> None:
        """Log ``(name, value, step)`` rows in batches; inf clamped, non-numbers skipped. ``timestamp_ms``: the
        time they are stamped with (default now; a fixed one makes the same rows sent twice one copy in MLflow)."""
        metrics = _metric_rows(rows, int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms))
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

    @_never_raise
    def mirror(self, run_dir: Path | str) -> None:
        """Make MLflow's runs agree with the run-state store of ``run_dir`` (read when sent): at once, ahead
        of what is queued (a stop's few seconds go to the runs' ends, not to metrics), and again after it."""
        rec = self._record("mirror", "mirror", run_dir=str(Path(run_dir).resolve()))
        if rec is not None:
            self._urgent.put(rec)
            self._queue.put(_WAKE)
            self._queue.put(dict(rec))

    @_never_raise
    def note_bug(self, signature: str, name: str, tags: Mapping[str, Any], occurrence_key: str | None) -> None:
        """An occurrence of bug ``signature`` (found in run ``occurrence_key``): see
        :func:`orchestrator.observers.bug_registry.note_occurrence`."""
        self._put("note_bug", f"bug:{signature}", signature=signature, name=name, tags=_str_tags(tags),
                  occurrence_key=occurrence_key)

    @_never_raise
    def set_bug_state(self, signature: str, state: str, note: str | None = None,
                      tags: Mapping[str, Any] | None = None) -> None:
        """Set a bug's triage state (in its run of ``cdeepfuzz-bugs``, copied onto its occurrences)."""
        self._put("bug_state", f"bug:{signature}", signature=signature, state=state, note=note,
                  tags=_str_tags(tags or {}))

    def flush(self, timeout: float) -> bool:
        """Wait until everything enqueued so far is sent or spooled; False on timeout."""
        if not self._thread.is_alive():
            return self._queue.empty()
        done = threading.Event()
        self._queue.put(done)
        return done.wait(max(0.0, timeout))

    def close(self, timeout: float = 10.0, status: RunEnd | None = "KILLED") -> bool:
        """End open runs with ``status``, flush within ``timeout`` and stop the writer.

        True when everything was sent or spooled in time. Otherwise the writer spools what is left as
        soon as its current call returns; if that call has not returned after a grace, it and what is
        still queued are spooled here (``cdeepfuzz sync``, or the run's ``--resume``, sends them; a replayed
        start adopts the run its call may have made after all).
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
        if self._thread.is_alive():      # still in a call: it and what is queued behind it are spooled, in order
            inflight = self._inflight    # (its replay adopts what the call made, should it have got through)
            if inflight is not None:
                self._spool(inflight)
            for pending in (self._urgent, self._queue):
                while True:
                    try:
                        item = pending.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(item, dict):
                        self._spool(item)
            self._queue.put(_STOP)           # taken out with the rest: the writer stops once its call returns
        else:
            self._sender.close()
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
            while True:                                   # what must go first (the end of a stop: mirror)
                try:
                    urgent = self._urgent.get_nowait()
                except queue.Empty:
                    break
                self._handle_safely(urgent)
            if item is _WAKE:
                continue
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            self._handle_safely(item)

    def _handle_safely(self, item: Record) -> None:
        self._inflight = item
        try:
            self._handle(item)
        except Exception:  # never let the writer die
            log.exception("tracking: writer failed on %s", item.get("kind"))
        finally:
            self._inflight = None

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
            line = json.dumps(self._sender.annotate(rec), default=str) + "\n"
            with self._spool_lock:             # the writer and a timed-out close may both spool
                self.spool_path.parent.mkdir(parents=True, exist_ok=True)
                with self.spool_path.open("a", encoding="utf-8") as fh:
                    fh.write(line)
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
        result = _replay_file(self._sender, self.spool_path, tries=1, session=self._session)
        if result.left == 0:
            self._offline = False
            log.info("tracking: %s answers again; replayed %d spooled operations", self.uri, result.sent)
