"""How the scheduler's own cost grows with a campaign (issue 16): milliseconds per ``allocate``
and per ``on_progress`` at 100 and 1,000 sites, every policy, and per ``state()``.

No search runs: each site is a synthetic loss curve (a third fall steadily, a third fall and
then sit at a clamp, a third stay flat; one in fifty triggers after a while), fed back as a
controller would, with 2 and 16 slots. The figure a campaign of 1,000 sites needs is that
the cost per call grows at most linearly with the live sites, i.e. stays flat per site.

    python benchmarks/scheduler_scale.py [--sites 100 1000] [--calls 3000]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import table, write_section  # noqa: E402
from orchestrator.scheduler import Action, SiteProgress, make_scheduler  # noqa: E402


def _losses(kind: int, start: int, steps: int) -> list[float]:
    """The suspect losses of a synthetic site after each of ``steps`` steps from ``start``."""
    out = []
    for t in range(start + 1, start + steps + 1):
        if kind == 0:
            out.append(100.0 * 0.995 ** t)            # falls steadily
        elif kind == 1:
            out.append(max(1e-6, 1.0 - 0.02 * t))     # falls to a clamp, then sits there
        else:
            out.append(50.0 + 0.1 * math.sin(t))      # flat
    return out


def measure(policy: str, sites: int, slots: int, calls: int, max_steps: int = 100_000) -> dict:
    """Drive ``calls`` rounds (one allocate, then one report per grant) and time each call."""
    sched = make_scheduler(policy, max_steps, 20)
    for i in range(sites):
        sched.add_site(f"s{i:05d}")
    used = dict.fromkeys((f"s{i:05d}" for i in range(sites)), 0)
    running: list = []
    t_alloc, t_report = [], []
    for _ in range(calls):
        free = slots - len(running)
        t = time.perf_counter()
        decisions = sched.allocate(free)
        t_alloc.append(time.perf_counter() - t)
        running += [d for d in decisions if d.action in (Action.GRANT, Action.REFRESH)]
        if not running:
            break
        d = running.pop(0)
        n = int(d.site_id[1:])
        losses = _losses(n % 3, used[d.site_id], d.steps)
        used[d.site_id] += d.steps
        hit = n % 50 == 7 and used[d.site_id] >= 400
        report = SiteProgress(d.site_id, used[d.site_id], tuple(losses), min(losses), hit,
                              log_space=n % 2 == 0)
        t = time.perf_counter()
        sched.on_progress(report)
        t_report.append(time.perf_counter() - t)
    t = time.perf_counter()
    state = sched.state()
    t_state = time.perf_counter() - t
    size = len(json.dumps(state, allow_nan=False))
    return {"allocate_ms": 1e3 * statistics.mean(t_alloc), "report_ms": 1e3 * statistics.mean(t_report),
            "live": len(sched._live), "state_ms": 1e3 * t_state, "state_kb": size / 1024}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--slots", type=int, nargs="+", default=[2, 16])
    ap.add_argument("--calls", type=int, default=3000, help="allocations per measurement")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    rows, per_site = [], {}
    for policy in ("share", "loss-slope", "round-robin"):
        for slots in args.slots:
            for n in args.sites:
                m = measure(policy, n, slots, args.calls)
                pair = m["allocate_ms"] + m["report_ms"]
                per_site[policy, slots, n] = pair / n
                rows.append([policy, slots, n, m["live"], f"{m['allocate_ms']:.3f}", f"{m['report_ms']:.3f}",
                             f"{pair:.3f}", f"{1e3 * pair / n:.2f}", f"{m['state_ms']:.1f}", f"{m['state_kb']:.0f}"])
                print(rows[-1], flush=True)
    lo, hi = min(args.sites), max(args.sites)
    growth = [f"{policy} ({slots} slots) {per_site[policy, slots, hi] / per_site[policy, slots, lo]:.2f}x"
              for policy in ("share", "loss-slope", "round-robin") for slots in args.slots]
    body = ("### Scheduler cost per call\n\n"
            f"Each policy drives synthetic sites (a third falling, a third falling to a clamp, a third flat; "
            f"one in fifty triggers once it has 400 steps) for {args.calls} allocations, each followed by one "
            f"report, as a controller with that many slots would; mean milliseconds per call, one thread. "
            f"`state()` is timed once at the end (its JSON size beside it).\n\n"
            + table(["policy", "slots", "sites", "live at the end", "allocate ms", "on_progress ms",
                     "allocate + on_progress ms", "µs per site", "state() ms", "state KB"], rows)
            + f"\n\nPer-site cost of allocate + on_progress at {hi} sites over that at {lo} "
              f"(1.00x: flat per site): " + ", ".join(growth) + ".\n")
    print(body)
    if not args.no_write:
        write_section("scheduler_scale", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
