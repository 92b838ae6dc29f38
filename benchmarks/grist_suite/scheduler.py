"""The scheduler on GRIST's programs: the PyTorch half of the suite as one campaign (issues 16, 17).

The scheduler benchmark (``benchmarks/scheduler_benefit.py``) measures policies on subjects
written here; this one runs them on programs nobody here wrote for the purpose: every searched
site of every runnable PyTorch program of GRIST's benchmark (the TensorFlow half's TF1 graphs do
not share one process), ``adaptive``, one slot, with ``round-robin``, ``loss-slope`` and ``share``
side by side on the same searches (one :class:`~benchmarks.search_cache.SearchCache` per seed).
A bug is found when a confirmed finding's site, or its first non-finite op, is GRIST's op (the
bug's op on a line marked ``# GRIST bug <id>``). The figure is the campaign's steps (out-of-box
probe steps included) until every bug that any of the policies finds with that seed is found; a
bug a policy misses counts, for it, as found when its campaign ended plus that bug's unspent
budget. Most of these bugs fall within a few steps of any policy's first pass, so what the
policies can differ on is the few slow ones among dozens of sites that cannot fire.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grist_suite.run import at_bug, load_subjects  # noqa: E402

POLICIES = ("round-robin", "loss-slope", "share")
QUANTUM = 20


def targets() -> tuple[dict[str, tuple[str, dict]], dict[str, list]]:
    """name -> (entry, args), and name -> the GRIST bugs of that build."""
    subjects, _ = load_subjects(["torch"])
    out, bugs = {}, {}
    for s in subjects:
        if not s.runnable:
            continue
        for b in s.bugs:
            name = f"id{s.id:02d}-" + "-".join(f"{k}{v}" for k, v in sorted(b.args.items())) if b.args else f"id{s.id:02d}"
            out.setdefault(name, (b.entry, dict(b.args)))
            bugs.setdefault(name, []).append(b)
    return dict(sorted(out.items())), bugs


def _finding_at(bug, site, finding) -> bool:
    """The finding's site (when its own hazard fired) or its first non-finite op is on GRIST's line (as
    the suite's ``run.py`` counts it)."""
    first = finding.first_op
    first = first if isinstance(first, dict) or first is None else first.to_dict()
    rec = {"location": site.location, "own": bool(finding.site_triggered), "first_op": first}
    return at_bug(rec, bug)


def one_run(policy: str, seed: int, max_steps: int, cache, options: dict | None = None) -> dict[str, Any]:
    from fuzz_core.search import SearchConfig
    from orchestrator.run.campaign import target_specs
    from orchestrator.scheduler import make_scheduler

    from benchmarks._campaigns import CountingExecutor, campaign
    from benchmarks.scheduler_benefit import one_slot_campaign
    from benchmarks.search_cache import ReplayingExecutor

    tmap, bugs = targets()
    camp = campaign(tmap, "adaptive", policy, max_steps, QUANTUM, 0, seed)
    specs = target_specs(camp)
    found_at: dict[str, int] = {}
    findings: dict[str, Any] = {}

    def note(task, out) -> None:                   # each finding as it comes back: is it a GRIST bug?
        if getattr(out, "finding", None) is not None:
            findings[task.site.id] = out.finding
            for b in bugs.get(task.site.target, []):
                if b.id not in found_at and _finding_at(b, task.site, out.finding):
                    found_at[b.id] = ex.total       # counted before it is called

    ex = CountingExecutor(ReplayingExecutor(cache), on_outcome=note)
    sites = []
    for name, found in ex.discover(list(specs.values())).items():
        if isinstance(found, BaseException):
            raise SystemExit(f"target {name} could not be built: {found}")
        sites += [s for s in found if s.searched]
    by_target: dict[str, list] = {}
    for s in sites:
        by_target.setdefault(s.target, []).append(s)
    scheduler = make_scheduler(policy, max_steps, QUANTUM, **(options or {}))
    all_bugs = {b.id for bs in bugs.values() for b in bs}

    def settled() -> bool:            # every bug found, or every site of its build retired
        return all(b in found_at or all(scheduler.status_of(s.id).final for s in by_target[t])
                   for t, bs in bugs.items() for b in (x.id for x in bs))

    t0 = time.perf_counter()
    one_slot_campaign(scheduler, ex, sites, specs, SearchConfig("adaptive", max_steps, seed), settled)
    unspent = {}
    for t, bs in bugs.items():
        left = sum(max_steps - ex.steps.get(s.id, 0) for s in by_target[t] if s.id not in findings)
        for b in bs:
            if b.id not in found_at:
                unspent[b.id] = left
    return {"found_at": found_at, "unspent": unspent, "bugs": sorted(all_bugs), "total": ex.total,
            "probe_steps": ex.probe_steps, "sites": len(sites), "programs": len(tmap),
            "seconds": time.perf_counter() - t0}


def seed_job(seed: int, max_steps: int, policies, cache_dir: str | None = None,
             options: dict | None = None) -> dict[str, dict]:
    """Every policy's run of one seed on one search cache (``cache_dir``: kept between invocations while
    the engine is unchanged; ``options``: policy -> its options, for tuning runs only)."""
    import torch

    from orchestrator.run.campaign import worker_options

    from benchmarks._campaigns import campaign
    from benchmarks.search_cache import SearchCache, fingerprint

    torch.set_num_threads(1)
    tmap, _ = targets()
    worker = worker_options(campaign(tmap, "adaptive", "round-robin", max_steps, QUANTUM, 0, seed))
    path = Path(cache_dir) / f"grist-torch-{max_steps}-{seed}.pickle" if cache_dir else None
    stamp = fingerprint(ROOT) if path else ""
    cache = SearchCache.load(path, stamp, worker) if path else SearchCache(worker)
    out = {}
    for policy in policies:
        out[policy] = one_run(policy, seed, max_steps, cache, (options or {}).get(policy))
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            cache.save(path, stamp)
    return out


def report(runs: dict[int, dict[str, dict]], max_steps: int) -> str:
    from benchmarks._results import table
    from benchmarks.scheduler_benefit import steps_until_found

    policies = list(next(iter(runs.values())))
    rows, sums = [], dict.fromkeys(policies, 0)
    for seed, by_policy in sorted(runs.items()):
        wanted = set().union(*(set(r["found_at"]) for r in by_policy.values()))
        steps = {p: steps_until_found(r, wanted) for p, r in by_policy.items()}
        for p in policies:
            sums[p] += steps[p]
        base = steps["round-robin"]
        rows.append([seed, len(wanted)] + [f"{len(by_policy[p]['found_at'])}, {steps[p]}"
                                           + (f", **{base / max(1, steps[p]):.2f}x**" if p != "round-robin" else "")
                                           + (f" ({by_policy[p]['probe_steps']} probe)" if by_policy[p]["probe_steps"] else "")
                                           for p in policies])
    first = next(iter(runs.values()))["round-robin"]
    text = [f"The PyTorch half of GRIST's benchmark as one campaign: {first['sites']} searched op sites of "
            f"{first['programs']} builds, {len(first['bugs'])} bugs, `adaptive`, "
            f"{max_steps} steps per site, quantum {QUANTUM}, one slot, the three policies on the same searches "
            f"(`benchmarks/grist_suite/scheduler.py`). Per seed: bugs any policy finds; per policy: bugs found, "
            f"campaign steps until every bug any policy finds is found (a miss charged as its campaign's end "
            f"plus its unspent budget), and round-robin's steps over the policy's; `share`'s out-of-box probe "
            f"steps are counted in its steps and shown beside them.\n",
            table(["seed", "bugs any finds"] + [f"{p}: found, steps" for p in policies], rows), "",
            "Summed over the seeds: " + ", ".join(f"{p} {sums[p]}" for p in policies) + "; round-robin's over "
            + ", ".join(f"{p}'s {sums['round-robin'] / max(1, sums[p]):.2f}x" for p in policies if p != "round-robin")
            + ".\n"]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--save", help="a JSON file that gets every seed's runs as they finish")
    ap.add_argument("--merge", nargs="*", default=[], help="such files: their seeds are reported, not run")
    ap.add_argument("--cache-dir", help="keep each seed's search cache here between invocations (tuning)")
    ap.add_argument("--options", default="{}", help="JSON: policy -> its options (tuning runs only)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--note", default="", help="a paragraph added to the section (what the figures mean)")
    args = ap.parse_args(argv)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    policies = ["round-robin"] + [p for p in args.policies if p != "round-robin"]
    runs: dict[int, dict] = {}
    for path in args.merge:
        runs.update({int(k): v for k, v in json.loads(Path(path).read_text()).items()})
    todo = [s for s in args.seeds if s not in runs]
    with ProcessPoolExecutor(max(1, args.jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {seed: pool.submit(seed_job, seed, args.max_steps, policies, args.cache_dir,
                                     json.loads(args.options)) for seed in todo}
        for seed, fut in futures.items():
            runs[seed] = fut.result()
            print(f"seed {seed}: " + "; ".join(f"{p} {len(r['found_at'])} bugs, {r['total']} steps"
                                               for p, r in runs[seed].items()), flush=True)
            if args.save:
                Path(args.save).write_text(json.dumps(runs))
    body = report(runs, args.max_steps) + (f"\n{args.note.strip()}\n" if args.note else "")
    print(body)
    if not args.no_write:
        from benchmarks._results import write_section

        write_section("grist_scheduler", "## The scheduler on GRIST's PyTorch programs (issues 16, 17)\n\n" + body,
                      script="grist_suite/scheduler", args=f"--seeds {' '.join(map(str, sorted(runs)))} "
                      f"--max-steps {args.max_steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
