"""Faults: a killed actor, a killed driver, a factory that breaks the contract."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fuzz_core.engine import TargetSpec
from fuzz_core.search import SearchConfig
from fuzz_core.sites import OpSite
from orchestrator.executors import ActorDied, Task
from orchestrator.worker import QuantumOutcome, WorkerOptions

SLOW_ENTRY = "campaigns/targets/log_one_minus_sigmoid.py:make_target"   # its log(sigmoid) site never triggers


def _site(executor, spec: TargetSpec, op: str) -> OpSite:
    found = executor.discover([spec])[spec.name]
    return next(s for s in found if s.searched and s.op == op)


def _run_to_end(executor, task: Task, deadline: float) -> list:
    """Submit ``task`` and keep resubmitting with the latest checkpoint until the site is final."""
    outcomes = []
    while time.monotonic() < deadline:
        executor.submit(task)
        done = []
        while not done:
            done = executor.wait(1.0)
        (_, outcome), = done
        outcomes.append(outcome)
        if isinstance(outcome, QuantumOutcome):
            if outcome.result.status.final:
                return outcomes
            task = Task(task.site, task.spec, task.config, task.steps, checkpoint=outcome.checkpoint)
        else:
            task = Task(task.site, task.spec, task.config, task.steps, checkpoint=task.checkpoint)
    raise AssertionError(f"site not final in time: {outcomes}")


@pytest.mark.ray
@pytest.mark.parametrize("how", ["ray.kill", "os.kill"])
def test_killed_actor_resumes_site_from_checkpoint(ray_session, how):
    import ray

    from orchestrator.ray_executor import RayExecutor

    executor = RayExecutor(WorkerOptions(device="cpu"), num_actors=1, num_cpus=1, num_gpus=0,
                           max_restarts=3, quantum_timeout_s=120)
    try:
        spec = TargetSpec("mlp", SLOW_ENTRY, base_dir=os.getcwd())
        site = _site(executor, spec, "log")
        config = SearchConfig(strategy="grist", max_steps=2500, seed=0)
        # one quantum to get a checkpoint, then kill the actor while the next one runs
        executor.submit(Task(site, spec, config, steps=20))
        (_, first), = _wait(executor)
        assert isinstance(first, QuantumOutcome) and first.checkpoint is not None
        assert first.result.steps == 20
        pid = executor.actor_pid(0)
        executor.submit(Task(site, spec, config, steps=2480, checkpoint=first.checkpoint))
        time.sleep(0.5)
        if how == "ray.kill":
            ray.kill(executor.actors[0], no_restart=False)
        else:
            os.kill(pid, signal.SIGKILL)       # a segfault or the OOM killer looks the same to Ray
        (_, died), = _wait(executor)
        assert isinstance(died, ActorDied), died
        # the restarted actor has lost the search: it resumes from the checkpoint, not from step 0
        outcomes = _run_to_end(executor, Task(site, spec, config, steps=2480, checkpoint=first.checkpoint),
                               time.monotonic() + 120)
        final = outcomes[-1]
        assert final.result.status.value in ("found", "exhausted")
        assert final.result.trace[0].step == 21          # continued from the checkpoint's step
    finally:
        executor.shutdown()


def _wait(executor):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = executor.wait(1.0)
        if done:
            return done
    raise AssertionError("no result")
