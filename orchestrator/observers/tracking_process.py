"""MLflow in a child process: the tracking writer's sender, off the driver's interpreter.

MLflow's import and its store's set-up take 2-3 s of CPU (``import mlflow`` alone 1-2 s). In the
driver's process they shared the interpreter lock with ``import torch`` and the targets' building,
so a campaign's start paid their sum. :class:`RemoteSender` is the :class:`~orchestrator.observers.
tracking_sender._Sender` the writer thread of :class:`~orchestrator.observers.tracking.Tracker` uses: each
``apply`` (and ``ping``) is sent as one JSON line to a child process (this module's :func:`main`, given
the URI) that holds the real sender, and the thread waits for
its answer, as it waited for MLflow before. Everything else of the writer (its queue, the spool, going
offline and back, a close that gives up on a call in flight) is unchanged. :func:`start` launches the
child at the start of a run (beside Ray's start and the targets' building, on another core); the
tracker takes it over. The child ignores SIGINT and SIGTERM: a stop is the driver's, which ends its runs
in MLflow through the child.

Protocol, one JSON object per line: the parent sends ``{"op": "apply", "rec": ...}``, ``{"op": "ping"}``
or ``{"op": "bind", "run_ids": [[session, key, run id], ...]}``; the child answers each with ``{"ok":
true, "bound": [...]}`` (the run ids it mapped meanwhile, which the parent keeps so that ``run_id`` and
a spooled line's ``annotate`` know them) or ``{"ok": false, "transient": bool, "error": "..."}``.
The child writes its answers to its own copy of the standard output it started with; its ``sys.stdout``
goes to the standard error, so nothing MLflow prints can break a line. It ends at the end of its
input: when the tracker closes it, or when the driver is gone (killed: the call in flight completes,
and the driver's spool, or a resume, covers what never reached it).

A child that dies is a transient failure of the call (the writer spools and probes); the probe starts
a new child, told the run ids known so far.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from orchestrator.observers.tracking_sender import Record, _is_transient, _Permanent, _Sender

__all__ = ["RemoteSender", "discard", "start"]

log = logging.getLogger(__name__)

_STARTED: dict[str, subprocess.Popen] = {}   # URI -> a child started ahead of its tracker (start())
_STARTED_LOCK = threading.Lock()


class _ChildGone(ConnectionError):
    """The child process ended or stopped answering (transient: a probe starts another)."""


# the child finds this package where the driver found it (a checkout on PYTHONPATH, or installed)
_CHILD = (f"import sys; sys.path.append({str(Path(__file__).resolve().parents[2])!r}); "
          f"from {__name__} import main; main()")


def _spawn(uri: str) -> subprocess.Popen | None:
    """A new child for ``uri``; None where none starts (the writer meets that as a transient failure, and
    spools)."""
    try:
        return subprocess.Popen([sys.executable, "-c", _CHILD, uri], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, encoding="utf-8", bufsize=1)
    except OSError as exc:
        log.debug("tracking: could not start the MLflow process: %s", exc)
        return None


def start(uri: str) -> None:
    """Launch the child process for ``uri`` now (it imports MLflow and sets up the store at once); the
    run's tracker takes it over. A second call for the same URI keeps the first child."""
    with _STARTED_LOCK:
        if uri not in _STARTED or _STARTED[uri].poll() is not None:
            proc = _spawn(uri)
            if proc is not None:
                _STARTED[uri] = proc


def discard() -> None:
    """End every child that :func:`start` launched and no tracker took over (a run that ended before it
    made its tracker: a target that failed to build, a stop during discovery)."""
    with _STARTED_LOCK:
        left = list(_STARTED.values())
        _STARTED.clear()
    for proc in left:
        _end(proc, 5.0)


def _end(proc: subprocess.Popen, timeout: float) -> None:
    """Close the child's input (it finishes the call it is in and exits) and wait for it."""
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        proc.stdout.close()


class RemoteSender(_Sender):
    """A sender whose every MLflow call runs in a child process (see the module's docstring). Used by one
    thread at a time (the tracker's writer)."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        with _STARTED_LOCK:
            self._proc: subprocess.Popen | None = _STARTED.pop(uri, None)
        self._told = False          # whether this child was told the run ids (a new child is told all of them)
        if self._proc is None:
            self._proc = self._new_child()

    @property
    def client(self):  # noqa: ANN201 - never in this process
        raise RuntimeError("RemoteSender has no MLflow client in this process")

    def _new_child(self) -> subprocess.Popen | None:
        self._told = False
        return _spawn(self.uri)

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise _ChildGone("the MLflow process is not running")
        try:
            proc.stdin.write(json.dumps(message, default=str) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (OSError, ValueError) as exc:
            raise _ChildGone(f"the MLflow process: {exc}") from exc
        if not line:
            raise _ChildGone(f"the MLflow process ended (exit code {proc.poll()})")
        answer = json.loads(line)
        for session, key, rid in answer.get("bound", ()):
            self.run_ids[(session, key)] = rid
        if answer.get("ok"):
            return answer
        if answer.get("transient"):
            raise ConnectionError(answer.get("error"))
        raise _Permanent(answer.get("error"))

    def _tell_run_ids(self) -> None:
        """A new child learns the run ids the last one mapped (its operations address those runs)."""
        if not self._told and self.run_ids:
            self._call({"op": "bind", "run_ids": [[s, k, r] for (s, k), r in self.run_ids.items()]})
        self._told = True

    def apply(self, rec: Record) -> None:
        self._tell_run_ids()
        self._call({"op": "apply", "rec": rec})

    def ping(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._new_child()
        self._tell_run_ids()
        self._call({"op": "ping"})

    def close(self, timeout: float = 5.0) -> None:
        """End the child: its input closes, it finishes the call it is in and exits."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _end(proc, timeout)


class _Recording(_Sender):
    """The child's sender: notes every run id it maps, for the next answer."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.bound: list[list[str]] = []

    def _bind(self, rec: Record, rid: str) -> None:
        super()._bind(rec, rid)
        self.bound.append([rec["session"], rec["key"], rid])


def _answer(sender: _Recording, message: dict[str, Any]) -> dict[str, Any]:
    try:
        op = message.get("op")
        if op == "apply":
            sender.apply(message["rec"])
        elif op == "ping":
            sender.ping()
        elif op == "bind":
            sender.run_ids.update({(s, k): r for s, k, r in message["run_ids"]})
        else:
            raise _Permanent(f"unknown message {op!r}")
        answer: dict[str, Any] = {"ok": True}
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the writer, which decides
        answer = {"ok": False, "transient": _is_transient(exc), "error": f"{type(exc).__name__}: {exc}"}
    answer["bound"], sender.bound = sender.bound, []
    return answer


def serve(uri: str, requests: IO[str], answers: IO[str]) -> None:
    """Answer the requests of ``requests`` until its end (the child's loop)."""
    sender = _Recording(uri)
    try:
        sender.client                   # noqa: B018 - MLflow's import and the store now, not at the first call
    except Exception as exc:  # noqa: BLE001 - the first call meets it again and answers with it
        log.debug("tracking: setting up %s: %s", uri, exc)
    for line in requests:
        if line.strip():
            answers.write(json.dumps(_answer(sender, json.loads(line)), default=str) + "\n")
            answers.flush()


def main() -> None:
    # a stop (Ctrl-C reaches the whole process group, a SIGTERM may) is the driver's to handle: it ends its
    # runs in MLflow through this process, which ends when the driver closes its input or is gone
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)               # what MLflow prints goes to the standard error, never into an answer
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.basicConfig(level=os.environ.get("CDEEPFUZZ_LOG", "WARNING").upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    serve(sys.argv[1], sys.stdin, answers)
    # every answer is written and every MLflow call returned: the interpreter's teardown (collecting
    # MLflow's and SQLAlchemy's objects, most of a second) would only keep the driver's close waiting
    answers.close()
    os._exit(0)


if __name__ == "__main__":
    main()
