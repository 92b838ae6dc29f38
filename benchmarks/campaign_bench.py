"""Campaign-level measurements (issue 3), side by side in one run.

1. Scheduler benefit: one campaign of buggy and guarded sites; campaign-wide steps
   spent until every bug is found, ``loss-slope`` against ``round-robin``, once with
   ``grist`` (hundreds of steps per bug: allocation matters most) and once with ``adaptive``.
2. Scaling: steps per second with 1 and 2 Ray actors on a compute-heavy subject
   (a d_model 256 Transformer), and the driver's own time per quantum.
3. Overhead: the recorder's forward+backward time against the plain program.

    python benchmarks/campaign_bench.py [--skip-scaling] [--max-steps 600]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from benchmarks._results import table, write_section  # noqa: E402
from benchmarks.subjects import BUGGY, GUARDED  # noqa: E402

TRANSFORMER = "benchmarks/targets/transformer_256.py:make_target"


class _Null:
    def message(self, *_): pass
    def update(self, *_, **__): pass


class CountingExecutor:
    """Wraps an executor; notes the campaign-wide step count at which each finding arrives."""

    def __init__(self, inner) -> None:
        self.inner, self.slots = inner, inner.slots
        self.total, self.found_at, self.handle_s = 0, [], []

    running = property(lambda self: self.inner.running)

    def discover(self, specs):
        return self.inner.discover(specs)

    def submit(self, task):
        self.inner.submit(task)

    def wait(self, timeout):
        done = self.inner.wait(timeout)
        for _, outcome in done:
            result = getattr(outcome, "result", None)
            if result is not None:
                self.total += result.steps_quantum
                if getattr(outcome, "finding", None) is not None:
                    self.found_at.append(self.total)
        return done

    def shutdown(self):
        self.inner.shutdown()


def campaign(targets: dict[str, str], strategy: str, policy: str, max_steps: int, quantum: int, actors: int):
    from orchestrator.config import Campaign

    return Campaign.model_validate({
        "name": "bench", "targets": [{"name": n, "entry": e} for n, e in targets.items()],
        "search": {"strategy": strategy, "max_steps": max_steps, "seed": 0, "minimise": False},
        "scheduler": {"policy": policy, "quantum": quantum},
        "resources": {"num_actors": actors, "num_cpus": 1}, "device": "cpu", "time_limit_s": 3600,
        "tracking": {"enabled": False}})


def run_controller(camp, executor, run_dir: Path):
    from fuzz_core.search import SearchConfig
    from orchestrator.campaign import target_specs
    from orchestrator.controller import Controller, LoopLimits

    specs = target_specs(camp)
    config = SearchConfig(camp.search.strategy, camp.search.max_steps, camp.search.seed)
    ctl = Controller(camp, run_dir, executor, None, None, _Null(), specs, config, LoopLimits(3600, 3))
    handle = ctl._handle
    timings: list[float] = []

    def timed(task, outcome):
        t = time.perf_counter()
        handle(task, outcome)
        timings.append(time.perf_counter() - t)

    ctl._handle = timed
    ctl.add_targets(executor.discover(list(specs.values())))
    t0 = time.perf_counter()
    ctl.run()
    return ctl, time.perf_counter() - t0, timings


def scheduler_benefit(max_steps: int, quantum: int, tmp: Path) -> str:
    from orchestrator.executors import LocalExecutor
    from orchestrator.campaign import worker_options

    targets = {**BUGGY, **GUARDED}
    rows, ratios = [], {}
    for strategy in ("grist", "adaptive"):
        spent = {}
        for policy in ("round-robin", "loss-slope"):
            camp = campaign(targets, strategy, policy, max_steps, quantum, 0)
            ex = CountingExecutor(LocalExecutor(worker_options(camp)))
            ctl, seconds, _ = run_controller(camp, ex, tmp / f"{strategy}-{policy}")
            found = len(ex.found_at)
            bug_sites = len(ctl.sites)
            last = ex.found_at[-1] if ex.found_at else 0
            spent[policy] = (last, found)
            rows.append([strategy, policy, bug_sites, found, last, ex.total, f"{seconds:.1f}"])
            print(rows[-1], flush=True)
        rr, ls = spent["round-robin"], spent["loss-slope"]
        if rr[1] == ls[1] and ls[0]:
            ratios[strategy] = rr[0] / ls[0]
    text = table(["strategy", "policy", "sites", "findings", "steps until the last finding", "steps in all",
                  "seconds"], rows)
    notes = "".join(f"\n- {s}: round-robin / loss-slope steps until every bug is found = **{r:.2f}x**"
                    for s, r in ratios.items())
    return (f"### Scheduler benefit\n\nOne campaign over every subject ({len(BUGGY)} buggy, {len(GUARDED)} "
            f"guarded), {max_steps} steps per site, quantum {quantum}, in one process (no Ray), steps counted "
            f"campaign-wide in the order the controller received the quanta.\n\n{text}\n{notes}\n")


def scaling(max_steps: int, quantum: int, tmp: Path) -> str:
    import ray

    from orchestrator.campaign import worker_options
    from orchestrator.ray_executor import RayExecutor

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    rows, rates, overhead = [], {}, []
    try:
        for actors in (1, 2):
            camp = campaign({"tlm": TRANSFORMER}, "grist", "round-robin", max_steps, quantum, actors)
            ex = CountingExecutor(RayExecutor(worker_options(camp), actors, 1, 0, 0, 600))
            ctl, seconds, timings = run_controller(camp, ex, tmp / f"scale-{actors}")
            ex.shutdown()
            steps = sum(r.steps for r in ctl.sites.values())
            rates[actors] = steps / seconds
            overhead += timings
            rows.append([actors, len(ctl.sites), steps, f"{seconds:.1f}", f"{rates[actors]:.1f}",
                         f"{1e3 * statistics.median(timings):.2f}"])
            print(rows[-1], flush=True)
    finally:
        ray.shutdown()
    text = table(["actors", "sites", "steps", "seconds", "steps/s", "driver ms per quantum (median)"], rows)
    return (f"### Scaling on 2 cores\n\n`{TRANSFORMER}` (2 searched sites, guarded: every site spends its "
            f"budget), grist, {max_steps} steps per site, quantum {quantum}.\n\n{text}\n\n"
            f"2 actors / 1 actor: **{rates[2] / rates[1]:.2f}x** steps per second. Driver time per quantum "
            f"(writing the trace shard and checkpoint, scheduling): median "
            f"{1e3 * statistics.median(overhead):.2f} ms, max {1e3 * max(overhead):.1f} ms.\n")


def recorder_overhead(repeats: int = 30) -> str:
    import torch

    from fuzz_core.backends.torch import program_loss
    from fuzz_core.backends.torch_recorder import Recorder, RecordingMode
    from fuzz_core.catalogue import DEFAULT_CATALOGUE
    from fuzz_core.engine import TargetSpec, build_runner

    rows = []
    for name, entry in {"transformer_256": TRANSFORMER, **BUGGY}.items():
        runner = build_runner(TargetSpec(name, entry))
        batch = runner.sample(np.random.default_rng(0))
        tensors = {k: torch.as_tensor(v) for k, v in batch.items()}

        def plain():
            loss = program_loss(runner.target.program(tensors))
            loss.backward()

        def recorded():
            rec = Recorder(DEFAULT_CATALOGUE)
            with RecordingMode(rec):
                loss = program_loss(runner.target.program(tensors))
            rec.resolve()
            loss.backward()

        times = {}
        for label, fn in (("plain", plain), ("recorded", recorded)):
            fn()
            samples = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t)
            times[label] = statistics.median(samples)
        rows.append([name, f"{1e3 * times['plain']:.2f}", f"{1e3 * times['recorded']:.2f}",
                     f"{times['recorded'] / times['plain']:.2f}x"])
        print(rows[-1], flush=True)
    return ("### Recorder overhead\n\nForward + backward of the program, plain against under the recorder "
            f"(every op's output checked, one sync per pass), median of {repeats}, one thread.\n\n"
            + table(["subject", "plain ms", "recorded ms", "ratio"], rows) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=600)
    ap.add_argument("--quantum", type=int, default=20)
    ap.add_argument("--scaling-steps", type=int, default=300)
    ap.add_argument("--scaling-quantum", type=int, default=50)
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--skip-scheduler", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    import tempfile

    import torch

    torch.set_num_threads(1)
    parts = ["## Campaigns (issue 3)\n"]
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_scheduler:
            parts.append(scheduler_benefit(args.max_steps, args.quantum, Path(tmp)))
        if not args.skip_scaling:
            parts.append(scaling(args.scaling_steps, args.scaling_quantum, Path(tmp)))
    parts.append(recorder_overhead())
    body = "\n".join(parts)
    print(body)
    if not args.no_write:
        write_section("campaign_bench", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
