"""Where quanta run: in the driver process, or on a pool of Ray actors.

Both executors take :class:`Task` objects and give back ``(task, outcome)``
pairs; an outcome is a :class:`~orchestrator.worker.QuantumOutcome` or the
exception that ended the task (a dead actor, a killed quantum). The controller
decides; executors only execute.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Iterator

from fuzz_core.engine import TargetSpec
from fuzz_core.search import SearchConfig
from fuzz_core.sites import OpSite
from fuzz_core.status import ExitReason
from orchestrator.run.replays import KnownBug, ReplayOutcome, replay_known
from orchestrator.run.stopping import StopRun
from orchestrator.worker import QuantumOutcome, Resume, RunFolder, TargetFailure, Worker, WorkerOptions, write_into

log = logging.getLogger(__name__)


@dataclass
class Task:
    site: OpSite
    spec: TargetSpec
    config: SearchConfig
    steps: int
    refresh: bool = False
    resume: Resume | None = None      # for a worker that does not hold the site live (None: a new search)
    want_checkpoint: bool = True      # send the site's checkpoint back (the controller asks at its cadence)
    probe_steps: int = 0              # then probe it outside its bounds for this many steps (the scheduler asks)
    into: RunFolder | None = None     # a worker that sees the run folder writes the finding and checkpoint there
    known: frozenset[str] = frozenset()  # the run's bugs so far: another op's among them is stepped past, not replayed
    started: float = field(default_factory=time.monotonic)
    actor: int = -1


class QuantumTimeout(Exception):
    """A quantum ran past its time limit and its actor was killed."""


class ActorDied(Exception):
    """The actor running a quantum died (crash, segfault, out of memory, node lost)."""


DISCOVERY_TIMEOUT_S = 600.0


def discovery_timeout(quantum_timeout_s: float) -> float:
    """How long building a target and running its program once may take before it counts as hanging:
    factories often train or load a model, so far longer than a quantum."""
    return max(DISCOVERY_TIMEOUT_S, float(quantum_timeout_s or 0))


class _OverTime(BaseException):
    """Raised by the alarm inside a quantum run in the driver that went past its time limit."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`_OverTime` in this (the main) thread once ``seconds`` have passed (SIGALRM).

    Python code of a program is interrupted wherever it is, sleeps included; a single call into C
    that never returns to the interpreter is not (a Ray actor, which is killed, stops it too)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def over(_signum, _frame):
        raise _OverTime()

    previous = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class LocalExecutor:
    """Runs every quantum in the driver process, one at a time (``num_actors: 0`` or ``--local``).

    A quantum over ``quantum_timeout_s`` is interrupted (:func:`time_limit`) and reported as
    :class:`QuantumTimeout`, as a Ray actor's would be; the worker forgets that target's state,
    so the next quantum rebuilds it. ``stop`` (a :class:`~orchestrator.run.stopping.StopRequest`)
    lets SIGTERM/SIGINT interrupt a quantum at once."""

    def __init__(self, options: WorkerOptions, quantum_timeout_s: float = 0.0, stop=None) -> None:
        self.worker = Worker(options)
        self.slots = 1
        self.writes_run_folder = True         # the driver's own process: it sees the run folder
        self.timeout = quantum_timeout_s
        self.stop = stop
        self.deadline: float | None = None     # the campaign's time limit (monotonic): a quantum stops there too
        self.discovery_timeout = discovery_timeout(quantum_timeout_s)
        self._queue: deque[Task] = deque()

    @property
    def running(self) -> int:
        return len(self._queue)

    def discover(self, specs: list[TargetSpec]) -> dict[str, list[OpSite] | TargetFailure]:
        """Each target's sites, or its failure; a factory or first pass over the time limit fails its target."""
        out: dict[str, list[OpSite] | TargetFailure] = {}
        for spec in specs:
            interruptible = self.stop.interruptible() if self.stop is not None else nullcontext()
            try:
                with interruptible, time_limit(self.discovery_timeout):
                    out[spec.name] = self.worker.try_discover(spec)
            except _OverTime:
                self.worker.runners.pop(spec.name, None)
                out[spec.name] = TargetFailure(
                    f"building and running the target once took over {self.discovery_timeout:g}s: it hangs", "")
        return out

    def replay(self, bugs: list[KnownBug]) -> list[ReplayOutcome]:
        return [replay_known(self.worker, bug) for bug in bugs]

    def submit(self, task: Task) -> None:
        self._queue.append(task)

    def wait(self, timeout: float) -> list[tuple[Task, QuantumOutcome | BaseException]]:
        if not self._queue:
            return []
        task = self._queue.popleft()
        task.started = time.monotonic()
        interruptible = self.stop.interruptible() if self.stop is not None else nullcontext()
        left = self.deadline - task.started if self.deadline is not None else float("inf")
        limit = min(self.timeout, max(left, 0.001))
        try:
            with interruptible, time_limit(limit):
                outcome = self.worker.run(task.spec, task.site, task.config, task.steps, task.refresh,
                                          task.resume, task.want_checkpoint, task.probe_steps, task.known)
            return [(task, write_into(task.into, outcome))]
        except _OverTime:
            self._forget(task)
            if limit < self.timeout:                 # the campaign's time limit, not the quantum's
                raise StopRun(ExitReason.TIME_LIMIT) from None
            log.warning("quantum of %s over %.0fs: interrupted", task.site.label, self.timeout)
            return [(task, QuantumTimeout(f"quantum over {self.timeout:g}s"))]
        except Exception as exc:  # noqa: BLE001 - handed to the controller
            self._forget(task)
            return [(task, exc)]
        except BaseException:     # a stop (StopRun) or Ctrl-C: the site resumes from its task's resume
            self._forget(task)
            raise

    def _forget(self, task: Task) -> None:
        """A quantum cut short leaves its target half-way through a step: rebuild it next time, and resume
        every site of it from its last checkpoint and the quanta since (the controller sends them with each
        task)."""
        for site_id, search in list(self.worker.searches.items()):
            if site_id == task.site.id or getattr(search.site, "target", None) == task.spec.name:
                del self.worker.searches[site_id]
        self.worker.owner.pop(task.spec.name, None)
        self.worker.runners.pop(task.spec.name, None)

    def shutdown(self) -> None:
        self.worker.runners.clear()
