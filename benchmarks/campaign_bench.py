"""Campaign-level measurements (issues 3 and 16), side by side in one run.

1. Scheduler benefit (``benchmarks/scheduler_benefit.py``, its own section of RESULTS.md):
   campaigns of buggy and guarded sites; campaign-wide steps spent until every bug is found,
   ``share`` and ``loss-slope`` against ``round-robin``, with ``grist`` and with
   ``adaptive``, over 40 seeds (share's defaults were swept on 0-31; 32-39 were never used for tuning). Two campaigns: the
   subjects fed raw units (grist needs a hundred to a few hundred steps per bug: allocation
   matters most) and the subjects as they are (bugs in a few steps).
2. Scaling: steps per second with 1 and 2 Ray actors on a compute-heavy subject
   (a d_model 256 Transformer), and the driver's own time per quantum.
3. Overhead: the recorder's forward+backward time against the plain program.

    python benchmarks/campaign_bench.py [--skip-scaling] [--skip-overhead] [--campaigns "raw units"] [--seeds 0 1]
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

from benchmarks._campaigns import CountingExecutor, campaign, run_controller  # noqa: E402
from benchmarks._results import table, write_section  # noqa: E402
from benchmarks.scheduler_benefit import POLICIES, SCHED_CAMPAIGNS, scheduler_benefit  # noqa: E402
from benchmarks.subjects import BUGGY  # noqa: E402

TRANSFORMER = "benchmarks/targets/transformer_256.py:make_target"


def scaling(max_steps: int, quantum: int, tmp: Path) -> str:
    import ray

    from orchestrator.run.campaign import target_specs, worker_options
    from orchestrator.run.controller import CHECKPOINT_QUANTA, CHECKPOINT_S
    from orchestrator.run.ray_executor import RayExecutor

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    rows, rates, overhead, sizes = [], {}, [], []
    try:
        for actors in (1, 2):
            camp = campaign({"tlm": TRANSFORMER}, "grist", "round-robin", max_steps, quantum, actors)
            ex = CountingExecutor(RayExecutor(worker_options(camp), actors, 1, 0, 0, 600))
            # every actor builds the target before the clock starts, as the one actor that runs
            # discovery does: steps per second is then throughput, not actor start-up
            specs = list(target_specs(camp).values())
            ray.get([a.discover.remote(spec) for a in ex.inner.actors for spec in specs])
            ctl, seconds, timings = run_controller(camp, ex, tmp / f"scale-{actors}")
            ex.shutdown()
            steps = sum(r.steps for r in ctl.sites.values())
            rates[actors] = steps / seconds
            if ex.checkpoints:
                sizes.append(ex.checkpoint_bytes / ex.checkpoints / 1e6)
            overhead += timings
            rows.append([actors, len(ctl.sites), steps, f"{seconds:.1f}", f"{rates[actors]:.1f}",
                         f"{1e3 * statistics.median(timings):.2f}", f"{ex.checkpoints} of {ex.quanta}",
                         f"{ex.checkpoint_bytes / max(1, ex.quanta) / 1e6:.2f}"])
            print(rows[-1], flush=True)
    finally:
        ray.shutdown()
    text = table(["actors", "sites", "steps", "seconds", "steps/s", "driver ms per quantum (median)",
                  "quanta that sent the site's state to the driver", "state MB to the driver per quantum"], rows)
    return (f"### Scaling on 2 cores\n\n`{TRANSFORMER}` (2 searched sites, guarded: every site spends its "
            f"budget), grist, {max_steps} steps per site, quantum {quantum}; every actor has built the target "
            f"before the clock starts (start-up is not throughput).\n\n{text}\n\n"
            f"2 actors / 1 actor: **{rates[2] / rates[1]:.2f}x** steps per second. Driver time per quantum "
            f"(writing the trace shard and, when one came, the checkpoint; scheduling): median "
            f"{1e3 * statistics.median(overhead):.2f} ms, max {1e3 * max(overhead):.1f} ms. A site's model and "
            f"optimizer state (its checkpoint) comes to the driver once in {CHECKPOINT_QUANTA} of its quanta "
            f"(or {CHECKPOINT_S:g} s of its search), not at every quantum: in between it stays live in the actor "
            f"that runs the site (and, with more than one actor, as a reference into that actor's object store), "
            f"and a resume runs the quanta since the last checkpoint again."
            + (f" A checkpoint of this target is {max(sizes):.1f} MB: before, every quantum brought one to the "
               f"driver (and took one back with its task)." if sizes else "") + "\n")


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


def _args_text(argv) -> str:
    """The command line as written into RESULTS.md: files by their names only (no path of this machine)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if "--note" in args:        # the note is in the section itself
        i = args.index("--note")
        args = args[:i] + args[i + 2:]
    return " ".join(Path(a).name if os.path.isabs(a) else (f'"{a}"' if " " in a else a) for a in args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=None,
                    help="steps per site in the scheduler campaigns (default: each campaign's own)")
    ap.add_argument("--quantum", type=int, default=20)
    ap.add_argument("--scaling-steps", type=int, default=300)
    ap.add_argument("--scaling-quantum", type=int, default=50)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(40)),
                    help="campaign seeds of the scheduler benchmark")
    ap.add_argument("--jobs", type=int, default=2, help="seeds run at once (one process each)")
    ap.add_argument("--campaigns", nargs="+", choices=list(SCHED_CAMPAIGNS), default=list(SCHED_CAMPAIGNS),
                    help="scheduler campaigns to run (default: both)")
    ap.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES),
                    help="scheduler policies (round-robin, the baseline, always runs)")
    ap.add_argument("--no-cache", action="store_true",
                    help="every scheduler run searches for itself instead of sharing its seed's searches")
    ap.add_argument("--cache-dir", default=None,
                    help="keep each seed's search cache here between invocations while fuzz_core and the "
                         "targets are unchanged (for tuning; a reported table is run without it)")
    ap.add_argument("--strategies", nargs="+", choices=["grist", "adaptive"], default=["grist", "adaptive"],
                    help="search strategies of the scheduler campaigns (default: both)")
    ap.add_argument("--save-runs", default=None,
                    help="write every scheduler run to this JSON file as it finishes (to run the benchmark in parts)")
    ap.add_argument("--merge-runs", nargs="+", default=[],
                    help="JSON files of earlier parts (--save-runs): reported with this run's, not run again")
    ap.add_argument("--note", default="", help="a paragraph added to the scheduler section (how it was run)")
    ap.add_argument("--report-only", action="store_true",
                    help="run no scheduler campaign: report the runs of --merge-runs")
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true", help="skip the recorder overhead")
    ap.add_argument("--skip-scheduler", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    import tempfile

    import torch

    torch.set_num_threads(1)
    policies = ["round-robin"] + [p for p in args.policies if p != "round-robin"]
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_scheduler:
            body, _ = scheduler_benefit(args.max_steps, args.quantum, Path(tmp), args.seeds, args.jobs,
                                        args.campaigns, policies, not args.no_cache, args.cache_dir,
                                        strategies=args.strategies, save=args.save_runs, merge=args.merge_runs,
                                        report_only=args.report_only)
            if args.note:
                body = body.replace("\n\n", f"\n\n{args.note.strip()}\n\n", 1)
            print(body)
            if not args.no_write:
                write_section("scheduler_benefit", body, script="campaign_bench", args=_args_text(argv))
        if not args.skip_scaling:
            parts.append(scaling(args.scaling_steps, args.scaling_quantum, Path(tmp)))
    if not args.skip_overhead:
        parts.append(recorder_overhead())
    if parts:
        body = "\n".join(["## Campaigns (issue 3)\n"] + parts)
        print(body)
        if not args.no_write:
            write_section("campaign_bench", body, script="campaign_bench", args=_args_text(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
