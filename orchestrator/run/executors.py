"""Where quanta run: in the driver process, or on a pool of Ray actors.

Both executors take :class:`Task` objects and give back ``(task, outcome)``
pairs; an outcome is a :class:`~orchestrator.worker.QuantumOutcome` or the
exception that ended the task (a dead actor, a killed quantum). The controller
decides; executors only execute.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fuzz_core.engine import TargetSpec
from fuzz_core.search import SearchConfig
from fuzz_core.sites import OpSite
from orchestrator.worker import QuantumOutcome, TargetFailure, Worker, WorkerOptions

log = logging.getLogger(__name__)


@dataclass
class Task:
    site: OpSite
    spec: TargetSpec
    config: SearchConfig
    steps: int
    refresh: bool = False
    checkpoint: Any = None
    started: float = field(default_factory=time.monotonic)
    actor: int = -1


class QuantumTimeout(Exception):
    """A quantum ran past its time limit and its actor was killed."""


class ActorDied(Exception):
    """The actor running a quantum died (crash, segfault, out of memory, node lost)."""


class LocalExecutor:
    """Runs every quantum in the driver process, one at a time (``num_actors: 0``)."""

    def __init__(self, options: WorkerOptions) -> None:
        self.worker = Worker(options)
        self.slots = 1
        self._queue: deque[Task] = deque()

    @property
    def running(self) -> int:
        return len(self._queue)

    def discover(self, specs: list[TargetSpec]) -> dict[str, list[OpSite] | TargetFailure]:
        return {spec.name: self.worker.try_discover(spec) for spec in specs}

    def submit(self, task: Task) -> None:
        self._queue.append(task)

    def wait(self, timeout: float) -> list[tuple[Task, QuantumOutcome | BaseException]]:
        if not self._queue:
            return []
        task = self._queue.popleft()
        try:
            return [(task, self.worker.run(task.spec, task.site, task.config, task.steps, task.refresh,
                                           task.checkpoint))]
        except BaseException as exc:  # noqa: BLE001 - handed to the controller
            if isinstance(exc, KeyboardInterrupt):
                raise
            return [(task, exc)]

    def shutdown(self) -> None:
        self.worker.runners.clear()
