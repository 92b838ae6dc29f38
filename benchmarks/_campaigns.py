"""Running one campaign in this process for a benchmark: its config, a step-counting executor,
and the controller's loop with an early stop."""
from __future__ import annotations

import time
from pathlib import Path


class CountingExecutor:
    """Wraps an executor; counts steps campaign-wide in the order the quanta come back and
    notes, per site, the count at which its finding arrived (``found_at``), whether the site's own op
    fired (``own``) and its steps so far; and how many quanta brought a checkpoint to the driver, and
    how many bytes of arrays those held. The steps of out-of-box probes (the ``share`` policy asks
    for them; they are not a site's budget) count in ``total`` too (and alone in ``probe_steps``):
    they cost what steps cost."""

    def __init__(self, inner, on_outcome=None) -> None:
        self.inner, self.slots = inner, inner.slots
        self.on_outcome = on_outcome     # called with (task, outcome) once each is counted
        self.total, self.found_at, self.steps, self.probe_steps = 0, {}, {}, 0
        self.own = {}       # site -> its finding came from the site's own op (else another op went first)
        self.quanta = self.checkpoints = self.checkpoint_bytes = 0

    running = property(lambda self: self.inner.running)

    def discover(self, specs):
        return self.inner.discover(specs)

    def submit(self, task):
        self.inner.submit(task)

    def wait(self, timeout):
        done = self.inner.wait(timeout)
        for task, outcome in done:
            result = getattr(outcome, "result", None)
            if result is not None:
                self.quanta += 1
                checkpoint = getattr(outcome, "checkpoint", None)
                if checkpoint is not None:
                    self.checkpoints += 1
                    self.checkpoint_bytes += sum(getattr(a, "nbytes", 0) for a in checkpoint[0].values())
                probed = getattr(outcome, "probe_steps", 0)
                self.total += result.steps_quantum + probed
                self.probe_steps += probed
                self.steps[outcome.site_id] = result.steps
                finding = getattr(outcome, "finding", None)
                if finding is not None:
                    self.found_at[outcome.site_id] = self.total
                    self.own[outcome.site_id] = finding.site_triggered
            if self.on_outcome is not None:
                self.on_outcome(task, outcome)
        return done

    def shutdown(self):
        self.inner.shutdown()


def campaign(targets: dict, strategy: str, policy: str, max_steps: int, quantum: int, actors: int,
             seed: int = 0):
    """A campaign over ``targets``: name -> entry, or name -> (entry, factory args)."""
    from orchestrator.config import Campaign

    def target(name, value):
        entry, args = (value, {}) if isinstance(value, str) else value
        return {"name": name, "entry": entry, "args": dict(args)}

    return Campaign.model_validate({
        "name": "bench", "targets": [target(n, v) for n, v in targets.items()],
        "search": {"strategy": strategy, "max_steps": max_steps, "seed": seed, "minimise": False},
        "scheduler": {"policy": policy, "quantum": quantum},
        "resources": {"num_actors": actors, "num_cpus": 1}, "device": "cpu", "time_limit_s": 3600,
        "tracking": {"enabled": False}})


def run_controller(camp, executor, run_dir: Path, select=None, stop_when=None):
    """Run one campaign in this process; ``select(site) -> bool`` keeps only some sites;
    ``stop_when(controller) -> bool``, asked after each quantum, ends the campaign early. Returns the
    controller, the seconds it ran and the driver's own seconds per quantum (an executor wrapper times
    them: nothing of the controller is patched)."""
    from orchestrator.run.inprocess import TimedExecutor
    from orchestrator.run.inprocess import run_controller as run_in_process

    timed = TimedExecutor(executor)
    t0 = time.perf_counter()
    ctl = run_in_process(camp, timed, run_dir, select=select, stop_when=stop_when)
    return ctl, time.perf_counter() - t0, timed.per_quantum
