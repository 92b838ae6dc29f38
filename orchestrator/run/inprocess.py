"""A campaign's controller run in this process with a given executor, for benchmarks and tests.

Nothing is patched: callers subscribe observers (:class:`~orchestrator.observers.base.Observer`)
and read the controller's records afterwards; ``stop_when(controller)``, asked after each
quantum, ends the campaign early (the live sites are recorded as stopped). The run-state store
lives in ``run_dir``; no MLflow, no summary.json, no Parquet unless an observer writes them.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from fuzz_core.status import ExitReason
from orchestrator.observers.base import Observer, Observers
from orchestrator.run.controller import Controller, LoopLimits
from orchestrator.run.records import RunRecord
from orchestrator.run.state import FILENAME, RunStore, now


class TimedExecutor:
    """Wraps an executor; measures the driver's own time per turn of the loop (everything between
    two waits: handling results, the store, the observers, the scheduler, dispatching)."""

    def __init__(self, inner) -> None:
        self.inner, self.slots = inner, inner.slots
        self.driver_seconds = 0.0
        self.results = 0
        self.per_quantum: list[float] = []      # each turn that handled results: its seconds per result
        self._back: float | None = None
        self._last = 0

    running = property(lambda self: self.inner.running)

    def discover(self, specs):
        return self.inner.discover(specs)

    def replay(self, bugs):
        return self.inner.replay(bugs)

    def submit(self, task):
        self.inner.submit(task)

    def wait(self, timeout):
        if self._back is not None:
            turn = time.perf_counter() - self._back
            self.driver_seconds += turn
            if self._last:
                self.per_quantum.append(turn / self._last)
        done = self.inner.wait(timeout)
        self.results += len(done)
        self._last = len(done)
        self._back = time.perf_counter()
        return done

    def shutdown(self):
        self.inner.shutdown()


class _StopWhen(Observer):
    def __init__(self, ctl: Controller, stop_when: Callable[[Controller], bool]) -> None:
        self.ctl, self.stop_when = ctl, stop_when

    def quantum(self, rec, result) -> None:
        if self.stop_when(self.ctl):
            self.ctl.stop_request.request(ExitReason.COMPLETED)


def run_controller(campaign, executor, run_dir: Path, *, select: Callable | None = None,
                   observers: list[Observer] = (), stop_when: Callable[[Controller], bool] | None = None,
                   found: dict | None = None) -> Controller:
    """Discover (unless ``found`` is given), keep the sites ``select(site)`` accepts, run to the end."""
    from orchestrator.run.campaign import search_config, target_specs

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    specs = target_specs(campaign)
    store = RunStore(run_dir / FILENAME)
    record = RunRecord(campaign.name, "", campaign.model_dump(), run_dir.as_posix(), now(), "in-process")
    store.put_run(record)
    chain = Observers(list(observers))
    ctl = Controller(campaign, run_dir, executor, specs, search_config(campaign),
                     LoopLimits(campaign.time_limit_s, campaign.resources.max_restarts), store, record, chain)
    if stop_when is not None:
        chain.add(_StopWhen(ctl, stop_when))
    if found is None:
        found = executor.discover(list(specs.values()))
    if select is not None:
        found = {name: sites if isinstance(sites, BaseException) else [s for s in sites if select(s)]
                 for name, sites in found.items()}
    ctl.add_targets(found)
    try:
        ctl.run()
        ctl.finish_targets()
    finally:
        store.close()
    return ctl
