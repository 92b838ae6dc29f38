"""Simulated actors: an executor whose quanta cost nothing, to measure the driver alone.

A driver's throughput is the quanta per second its loop can take in, record and hand out again; real
actors (``benchmarks/targets/many_logs.py`` on Ray) measure the targets as much as the driver, and two
cores run out long before a cluster's driver would. :class:`SimulatedActors` has the executor's
interface (``discover``, ``submit``, ``wait``, ``slots``, ``running``): every target has ``ops`` sites,
every quantum is answered at once with a trace of one point per step (a falling loss), one site in
``bug_every`` finds its bug at step ``trigger`` (a real finding of the engine's kind, its folder written by
the actor as a real actor does), the others spend their budget. Checkpoints are asked for and answered
at the controller's cadence. Nothing is random: two runs are the same run.
"""
from __future__ import annotations

import math
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fuzz_core.findings import Finding
from fuzz_core.search import QuantumResult, TracePoint
from fuzz_core.sites import make_site
from fuzz_core.status import ExitReason, SiteStatus
from orchestrator.worker import QuantumOutcome, write_into


@dataclass
class SimulatedActors:
    slots: int
    ops: int
    max_steps: int
    bug_every: int = 10
    trigger: int = 8
    deadline: float | None = None
    writes_run_folder: bool = True       # as actors on the driver's machine or a shared disk do
    writers: int = 2                     # processes that write the actors' files
    _pending: list = field(default_factory=list)
    _writing: list = field(default_factory=list)
    _executor: ThreadPoolExecutor | None = None

    def discover(self, specs) -> dict:
        return {spec.name: [make_site(spec.name, "log", "log", "log of x <= 0", f"sim/model.py:{10 + i}", 0)
                            for i in range(self.ops)] for spec in specs}

    def replay(self, bugs) -> list:
        return []

    def submit(self, task) -> None:
        self._pending.append(task)

    def wait(self, timeout: float) -> list:
        """Every quantum answered at once, but for the files an actor writes (a finding's folder, a
        checkpoint), written beside the driver's loop as real actors write them, not in it."""
        done = [(task, self._outcome(task)) for task in self._pending]
        self._pending = []
        out = []
        for task, outcome in done:
            if task.into is not None and (outcome.finding is not None or outcome.checkpoint is not None):
                self._writing.append((task, self._pool().submit(write_into, task.into, outcome)))
            else:
                out.append((task, outcome))
        if self._writing:
            wait([f for _, f in self._writing], timeout=0 if out else timeout, return_when=FIRST_COMPLETED)
            out += [(task, f.result()) for task, f in self._writing if f.done()]
            self._writing = [(task, f) for task, f in self._writing if not f.done()]
        return out

    @property
    def running(self) -> int:
        return len(self._pending) + len(self._writing)

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            # threads of the driver's process, not processes (a process pool outlives a driver killed with
            # SIGKILL, and a forked one copies the driver's threads' locks): the files are written by C code
            # that releases the GIL, and what the threads cost the driver counts against it, not for it
            self._executor = ThreadPoolExecutor(self.writers, thread_name_prefix="sim-actor")
        return self._executor

    def shutdown(self) -> None:
        self._pending = []
        if self._executor is not None:
            self._executor.shutdown(cancel_futures=True)
            self._executor = None

    def _outcome(self, task) -> QuantumOutcome:
        site = task.site
        index = int(site.location.rsplit(":", 1)[1]) - 10
        start = task.resume.step if task.resume is not None else 0
        end = min(self.max_steps, start + task.steps)
        bug = index % self.bug_every == 0
        if bug:
            end = min(end, max(start + 1, self.trigger))
        trace = [TracePoint(s, 100.0 * math.exp(-s / 50), 100.0 * math.exp(-s / 50), 1.0, "step", False, s * 1e-3)
                 for s in range(start + 1, end + 1)]
        finding = None
        if bug and end >= self.trigger:
            status, reason = SiteStatus.FOUND, ExitReason.TRIGGERED
            trace[-1] = TracePoint(end, 0.0, 0.0, 1.0, "trigger", True, end * 1e-3)
            finding = Finding(site=site, target={"name": site.target, "entry": task.spec.entry, "args": {},
                                                 "framework": "torch", "seed": 0},
                              inputs={"x": np.zeros((1, 4), np.float32)}, state=None, step=end, step_seed=0,
                              strategy="adaptive", first_op={"op": "log", "kind": "log", "location": site.location,
                                                             "occurrence": 0}, trigger="inputs", training=False,
                              bounds={"x": (0.0, 1.0)})
        elif end >= self.max_steps:
            status, reason = SiteStatus.EXHAUSTED, ExitReason.BUDGET_SPENT
        else:
            status, reason = SiteStatus.SEARCHING, ExitReason.NONE
        result = QuantumResult(site.id, end, end - start, trace, status, trace[-1].best_loss if trace else math.inf,
                               seconds=end * 1e-3, exit_reason=reason)
        checkpoint = None
        if task.want_checkpoint and not status.final:
            checkpoint = ({"values.x": np.zeros((8, 4), np.float32)}, {"step": end, "best": result.best_loss})
        return QuantumOutcome(site.id, result, checkpoint, finding, "sim")


def write_entry(folder: Path) -> str:
    """A factory file for the campaign's targets (never built: the simulated actors discover its sites)."""
    path = Path(folder) / "sim_model.py"
    path.write_text("def make_target(seed: int = 0):\n    raise RuntimeError('simulated: never built')\n")
    return f"{path.as_posix()}:make_target"
