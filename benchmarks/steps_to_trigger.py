"""Steps (and seconds) to trigger every subject, with every strategy, side by side in one run.

For each subject, every searched op site is searched on its own from the factory's
initial state with a budget of ``--max-steps``; a subject's figure is its fastest
site (the first bug a campaign would report). A candidate counts only once replay
confirms it. A site that a strategy never triggers counts as ``max_steps``.
Guarded twins are run too: any finding on them is a false positive (must be 0).

    python benchmarks/steps_to_trigger.py [--max-steps 1000] [--strategies adaptive grist random]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import table, write_section  # noqa: E402
from benchmarks.subjects import BUGGY, BUGGY_TF, GUARDED, GUARDED_TF  # noqa: E402


@dataclass
class Outcome:
    steps: int
    seconds: float
    found: bool
    site: str
    all_steps: int = 0          # every step of every site of the subject
    all_seconds: float = 0.0    # and their search time (throughput: steps per second)


def run_subject(entry: str, strategy: str, max_steps: int, seed: int = 0) -> Outcome:
    from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, search_site
    from fuzz_core.search import SearchConfig

    spec = TargetSpec("subject", entry, seed=seed)
    runner = build_runner(spec)
    sites = [s for s in discover_sites(runner, seed) if s.searched]
    config = SearchConfig(strategy=strategy, max_steps=max_steps, seed=seed)
    best = Outcome(max_steps, 0.0, False, "")
    all_steps, all_seconds = 0, 0.0
    for site in sites:
        t0 = time.perf_counter()
        result = search_site(runner, site, config)
        all_steps, all_seconds = all_steps + result.steps, all_seconds + result.seconds
        found = result.candidate is not None and finding_from(
            runner, spec, site, config, result.candidate, result.seconds, minimise_batch=False) is not None
        seconds = time.perf_counter() - t0
        if found and (not best.found or result.steps < best.steps):
            best = Outcome(result.steps, seconds, True, f"{site.op}@{site.location}")
    best.all_steps, best.all_seconds = all_steps, all_seconds
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--strategies", nargs="+", default=["adaptive", "grist", "random"])
    ap.add_argument("--only", nargs="*", help="subject names to run")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    ap.add_argument("--framework", choices=["torch", "tensorflow"], default="torch")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    tf = args.framework == "tensorflow"
    buggy_all, guarded_all = (BUGGY_TF, GUARDED_TF) if tf else (BUGGY, GUARDED)
    subjects = {k: v for k, v in buggy_all.items() if not args.only or k in args.only}
    guarded = {k: v for k, v in guarded_all.items() if not args.only or k in args.only}
    results: dict[tuple[str, str], Outcome] = {}
    for name, entry in {**subjects, **guarded}.items():
        for strategy in args.strategies:
            out = run_subject(entry, strategy, args.max_steps)
            results[(name, strategy)] = out
            print(f"{name:28s} {strategy:9s} {'found' if out.found else 'missed':6s} steps={out.steps:5d} "
                  f"{out.seconds:7.2f}s {out.site}", flush=True)
    body = report(subjects, guarded, args.strategies, results, args.max_steps, args.framework)
    print(body)
    if not args.no_write:
        write_section("steps_to_trigger" + ("_tf" if tf else ""), body, script="steps_to_trigger",
                      args="--framework tensorflow" if tf else "")
    return 0


def report(subjects: dict, guarded: dict, strategies: list[str], results: dict, max_steps: int,
           framework: str = "torch") -> str:
    rows = []
    for name in {**subjects, **guarded}:
        row = [name + (" (guarded)" if name in guarded else "")]
        for s in strategies:
            o = results[(name, s)]
            row.append(f"{o.steps} ({o.seconds:.2f}s)" if o.found else f"missed ({max_steps})")
        steps = sum(results[(name, s)].all_steps for s in strategies)
        secs = sum(results[(name, s)].all_seconds for s in strategies)
        row.append(f"{steps / secs:.0f}" if secs else "-")
        rows.append(row)
    summary = []
    for s in strategies:
        steps = [results[(n, s)].steps for n in subjects]
        found = sum(results[(n, s)].found for n in subjects)
        fp = sum(results[(n, s)].found for n in guarded)
        summary.append([s, f"{found}/{len(subjects)}", statistics.median(steps) if steps else "-",
                        max(steps) if steps else "-", sum(steps), f"{fp}/{len(guarded)}"])
    title = "Steps to trigger, TensorFlow (issue 4)" if framework == "tensorflow" else "Steps to trigger (issue 2)"
    text = [f"## {title}\n\nBudget {max_steps} steps per op site; a subject's figure is "
            "its fastest site, confirmed by replay; a miss counts as the budget. steps/s: every search step of "
            "the subject (all sites, all strategies) over its search time, one thread.\n",
            table(["subject", *strategies, "steps/s"], rows), "",
            table(["strategy", "found", "median steps", "max steps", "total steps", "guarded twins flagged"], summary)]
    if "adaptive" in strategies and "grist" in strategies:
        a = sum(results[(n, "adaptive")].steps for n in subjects)
        g = sum(results[(n, "grist")].steps for n in subjects)
        text.append(f"\ngrist / adaptive total steps: **{g / max(a, 1):.1f}x** (same subjects, same budget).")
    return "\n".join(text)


if __name__ == "__main__":
    sys.exit(main())
