"""One switch of the engine, on and off, side by side on the bug sites of GRIST's benchmark.

    python benchmarks/grist_suite/ablation.py [--switch RESTART] [--bugs ID_48a ID_3 ...]
                                              [--seeds 0 1 2] [--max-steps 1000] [--jobs 2] [--no-write]

A bug's trajectory that the program's own training reaches is chaotic: a CPU whose kernels round
differently sends one seed elsewhere (``run.py``'s section says so), so a change to the search is
measured here against the same engine with the change switched off, in one run on one machine. For
each bug and each arm one child process (the suite's environment: one thread per library) builds
the target as the suite does, and searches the bug's own sites (the searched sites, of any op, on the
lines marked ``# GRIST bug <id>``) from the factory's state with ``adaptive``, once per search seed
(``--seeds``, default 0: the seed of the site's batches and of the program's randomness per step; the
factory is built with seed 0, the suite's, so every seed searches the same program); a candidate
counts when the engine confirms it (``finding_from``: every replay of the engine's reproduces it)
and its site or its first non-finite op is on a marked line (``run.at_bug``). The suite's own run
also replays each finding in a fresh process; this one does not.

Arms: ``on`` is the engine as it is; ``off`` sets the switch's module constant (:data:`SWITCHES`).
Default bugs: :data:`TRAINING_REACHED`, the bugs the suite's ``adaptive`` found by riding the
program's training, and ID_48a, which ``grist`` finds that way. Writes the section
``grist_ablation_<switch>`` of ``benchmarks/RESULTS.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grist_suite import run as suite  # noqa: E402

# name -> (module, constant, its value in the "off" arm, what the switch does)
SWITCHES = {
    "RESTART": ("fuzz_core.strategies.adaptive", "RESTART", False,
                "a site's first drift first measures the program's training from the factory's state on the "
                "search's point, and rides it from there when it leaves a lower margin"),
    "THAW": ("fuzz_core.strategies.adaptive", "THAW", False,
             "a site frozen because the training fought the search on its batch (every step from the factory's "
             "state) rides the training again once the edge is out of the box's reach at the factory's weights"),
    "QN_DEMOTE": ("fuzz_core.strategies.adaptive", "QN_DEMOTE", False,
                  "a quasi-Newton step tried first and rejected goes after the Polyak steps until one is accepted"),
    "DRIFT_CRN": ("fuzz_core.strategies.adaptive", "DRIFT_CRN", False,
                  "a site that rides the training keeps the randomness its point was measured under (dropout masks, "
                  "noise) instead of a new draw per step"),
    "DRIFT_CRAWL": ("fuzz_core.strategies.adaptive", "DRIFT_CRAWL", 24,
                    "a site whose program trains rides the training after 12 slow accepted points in a row (each "
                    "keeping more than half the margin) instead of 24"),
    "FIRST_CUT": ("fuzz_core.strategies.adaptive", "FIRST_CUT", False,
                  "a site's first point, in a program that trains, with the edge out of the box's reach under the "
                  "linear model, rides the training after its full steps, without the shorter steps and sign step"),
    "DEDUPE": ("fuzz_core.strategies.adaptive", "DEDUPE", False,
               "a list of mutations proposes each batch once: kinds that make the same batch in the box (in [0, 1], "
               "zero, low and minus_one; one and high) and the probe's repeats of the early kinds are skipped"),
    "RECHECK_FACTORY": ("fuzz_core.strategies.adaptive", "RECHECK_FACTORY", False,
                        "a re-measured point that the training moved away from the edge (by less than half the "
                        "search's progress) is measured at the factory's weights too, and the site goes on under "
                        "whichever is lower"),
    "RIDE_AGAIN": ("fuzz_core.strategies.adaptive", "RIDE_AGAIN", False,
                   "a drift given up after 200 steps without a new low rides once more, from the factory's state "
                   "and the site's first batch, under a new draw of the program's randomness, by GRIST's rule"),
    "SLOW_START": ("fuzz_core.strategies.adaptive", "SLOW_START", False,
                   "a point that only slow steps led to (each keeping more than half the way) counts as the "
                   "first point: with the edge out of the box's reach, it rides the training at its first failed list"),
    "RESTART_AFTER": ("fuzz_core.strategies.adaptive", "RESTART_AFTER", 0,
                      "a first drift measures the factory's training step on the point only once the search has "
                      "taken 16 steps (off: always)"),
    "ESCAPE_STUCK": ("fuzz_core.strategies.adaptive", "ESCAPE_STUCK", False,
                     "an escape walk whose sign step leaves every input where it was, on a site where nothing "
                     "trains (frozen, or a program without training), ends there instead of measuring that point again"),
    "REFIT": ("fuzz_core.strategies.adaptive", "REFIT", False,
              "a point the re-measurement moved to the factory's weights tries one step of the list from the "
              "gradient measured there before the list's mutations, for an op judged in log space (off: the "
              "mutations next)"),
    "RIDE_ON": ("fuzz_core.strategies.adaptive", "RIDE_ON", 0,
                "a site whose rides both gave up rides again from today's state after every third list of "
                "proposals that failed whole, in a program that trains (off: it searches the box to its budget)"),
    "RIDE_CRAWL": ("fuzz_core.strategies.adaptive", "RIDE_CRAWL", False,
                   "after a site's rides gave up, a crawl of slow accepted steps counts toward RIDE_ON as a list "
                   "that failed (off: only failed lists do, and a crawl that never fails a list never rides)"),
    "RIDE_REAL": ("fuzz_core.strategies.adaptive", "RIDE_REAL", False,
                  "a ride on (RIDE_ON) starts from the site's first batch with the point's weakest row kept, by "
                  "the margin's gradient alone, rows refreshed at random, patience 1000 (off: from the point's "
                  "batch, the direction rules of a first ride)"),
}
TRAINING_REACHED = ("ID_1", "ID_3", "ID_6", "ID_7", "ID_8", "ID_11a", "ID_11b", "ID_12", "ID_14", "ID_15",
                    "ID_22", "ID_24", "ID_29", "ID_35a", "ID_45b", "ID_48a", "ID_51", "ID_55", "ID_58",
                    "ID_61", "ID_63")
ARMS = ("on", "off")


def find_bug(bug_id: str):
    """(subject, bug) of the suite's registries with this id, or None."""
    subjects, _ = suite.load_subjects(list(suite.REGISTRIES))
    for subject in subjects:
        for bug in subject.bugs:
            if bug.id == bug_id:
                return subject, bug
    return None


def require_bugs(ap: argparse.ArgumentParser, bugs: list[str]) -> None:
    """Exit 2 (``ap.error``) naming every id in ``bugs`` that is no bug of the suite's registries."""
    unknown = [bug for bug in bugs if find_bug(bug) is None]
    if unknown:
        ap.error(f"--bugs: no bug {', '.join(map(repr, unknown))} in the suite's registries (ids such as ID_48a)")


# ----------------------------------------------------------------------------- worker (child process)
def worker(task: dict) -> dict:
    os.chdir(ROOT)
    if task["arm"] == "off":
        import importlib

        module, name, value, _ = SWITCHES[task["switch"]]
        setattr(importlib.import_module(module), name, value)
    subject, bug = find_bug(task["bug"])
    if subject.framework == "torch":
        import torch

        torch.set_num_threads(1)
    from fuzz_core.backends.base import RunnerOptions
    from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, search_site
    from fuzz_core.search import SearchConfig

    spec = TargetSpec(f"grist-id{subject.id:02d}", bug.entry, dict(bug.args), framework=subject.framework, seed=0)
    runner = build_runner(spec, RunnerOptions(search_weights=bug.search_weights))
    path, lines = suite.bug_lines(bug)
    seed = int(task.get("seed", 0))
    config = SearchConfig(strategy="adaptive", max_steps=subject.budget(task["max_steps"]), seed=seed,
                          search_weights=bug.search_weights, reach_steps=0)
    out = {"bug": bug.id, "arm": task["arm"], "seed": seed, "budget": config.max_steps, "sites": []}
    for site in discover_sites(runner, 0):
        # every op on the marked lines, as the suite counts a finding there whatever its site's op (GRIST's
        # RBMs ID_22 and ID_51: an exp bug, found by the log site on its line, whose first NaN is the exp)
        if not (site.searched and suite.on_lines(site.location, path, lines)):
            continue
        result = search_site(runner, site, config)
        rec = {"location": site.location, "occurrence": site.occurrence, "steps": int(result.steps),
               "search_s": round(float(result.seconds), 3), "status": str(result.status), "confirmed": False}
        if result.candidate is not None:
            finding = finding_from(runner, spec, site, config, result.candidate, result.seconds,
                                   minimise_batch=False)
            if finding is not None:
                done, of = finding.replays
                rec.update(confirmed=done == of, own=bool(finding.site_triggered), first_op=finding.first_op)
        rec["found"] = bool(rec["confirmed"] and suite.at_bug(rec, bug))
        out["sites"].append(rec)         # the next site's search starts from the factory's state
    return out


def run_one(task: dict, timeout: float) -> dict:
    t0 = time.time()
    res, failure = suite.json_child([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(task)],
                                    timeout)
    if res is None:
        return dict(task, error=failure, sites=[])
    return dict(res, wall_s=round(time.time() - t0, 1))


# ----------------------------------------------------------------------------- report
def outcome(res: dict, budget: int) -> dict:
    """Found (the fewest steps of a site that found the bug) or a miss counted as the budget."""
    hits = [s for s in res.get("sites", []) if s.get("found")]
    if hits:
        best = min(hits, key=lambda s: s["steps"])
        return {"found": True, "steps": best["steps"], "search_s": best["search_s"]}
    return {"found": False, "steps": res.get("budget", budget), "search_s": None,
            "error": res.get("error")}


def cell(o: dict, seconds: bool = True) -> str:
    if o["found"]:
        return f"{o['steps']} ({o['search_s']:.2f}s)" if seconds else str(o["steps"])
    return f"- ({o['steps']})" + (" error" if o.get("error") else "")


def verdict(on: list[dict], off: list[dict]) -> str:
    """How the arms of one bug differ: over one seed, found by one arm only or the steps' difference; over
    several, the seeds each arm found it on and the difference of the median steps (a miss as the budget)."""
    if len(on) == 1:
        if on[0]["found"] != off[0]["found"]:
            return "**found on only**" if on[0]["found"] else "**found off only**"
        d = on[0]["steps"] - off[0]["steps"]
        return "same" if d == 0 else f"{d:+d} steps"
    n_on, n_off = sum(o["found"] for o in on), sum(o["found"] for o in off)
    d = statistics.median(o["steps"] for o in on) - statistics.median(o["steps"] for o in off)
    found = f"found {n_on} vs {n_off} of {len(on)}" if n_on != n_off else ""
    median = "" if d == 0 else f"median {d:+g} steps"
    text = "; ".join(t for t in (found, median) if t) or "same"
    return f"**{text}**" if n_on != n_off else text


def report(switch: str, bugs: list[str], results: dict, max_steps: int, engine: str = "",
           seeds: list[int] | tuple[int, ...] = (0,)) -> str:
    """The section: a row per bug (a cell per arm: its steps on each seed), then per arm the totals over
    every (bug, seed). ``results`` is keyed by (bug, seed, arm)."""
    from benchmarks._results import table

    _, _, value, what = SWITCHES[switch]
    seeds = list(seeds)
    rows, per_arm = [], {arm: [] for arm in ARMS}
    for bug in bugs:
        o = {arm: [outcome(results[(bug, seed, arm)], max_steps) for seed in seeds] for arm in ARMS}
        for arm in ARMS:
            per_arm[arm].extend(o[arm])
        cells = [", ".join(cell(x, seconds=len(seeds) == 1) for x in o[arm]) for arm in ARMS]
        rows.append([bug, *cells, verdict(o["on"], o["off"])])
    tot = []
    for arm in ARMS:
        found = [o for o in per_arm[arm] if o["found"]]
        steps = [o["steps"] for o in per_arm[arm]]
        tot.append([arm, f"{len(found)}/{len(steps)}", f"{statistics.median(steps):g}", sum(steps),
                    f"{sum(o['search_s'] for o in found):.1f}"])
    errors = [f"{b} (seed {seed}, {arm}): {results[(b, seed, arm)]['error']}" for b in bugs for seed in seeds
              for arm in ARMS if results[(b, seed, arm)].get("error")]
    if len(seeds) == 1:
        runs = f"seed {seeds[0]}"
        cells = ("A cell: steps to a confirmed finding at GRIST's op (search seconds); `-`: a miss, counted as "
                 "the budget.")
        heads = ["bug", "on", "off", "on - off"]
    else:
        runs = f"search seeds {', '.join(map(str, seeds))} (the factory built with seed 0: the same program)"
        cells = ("A cell: steps to a confirmed finding at GRIST's op on each seed in turn; `-`: a miss, counted as "
                 "the budget. The totals count every (bug, seed).")
        heads = ["bug", f"on (seeds {', '.join(map(str, seeds))})", "off", "on - off"]
    text = [f"## Ablation on GRIST's bug sites: {switch}\n",
            f"`{switch}` on: {what}. Off: the same engine with `{switch} = {value!r}`. Each bug's own sites "
            f"searched with `adaptive` from the factory's state, {runs}, budget {max_steps} steps, both arms in "
            "one run on one machine (a training-reached bug's single-seed trajectory depends on the CPU: compare "
            f"the arms here, not these cells with the suite's section). {cells}"
            + (f" Engine at {engine}." if engine else "") + "\n",
            table(heads, rows), "",
            table(["arm", "found", "median steps (miss = budget)", "total steps", "search s (found)"], tot), ""]
    if errors:
        text.append("Errors: " + "; ".join(errors) + "\n")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch", choices=sorted(SWITCHES), default="RESTART")
    ap.add_argument("--bugs", nargs="+", default=list(TRAINING_REACHED))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="search seeds, each a run of every bug and arm")
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per (bug, arm) process")
    ap.add_argument("--no-write", action="store_true", help="print the section; leave RESULTS.md alone")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker)), default=str))
        return 0
    require_bugs(ap, args.bugs)
    tasks = [{"bug": b, "seed": seed, "arm": arm, "switch": args.switch, "max_steps": args.max_steps}
             for b in args.bugs for seed in args.seeds for arm in ARMS]
    results: dict = {}
    engine = suite.engine_revision()
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_one, t, args.timeout): t for t in tasks}
        for n, fut in enumerate(futures, 1):
            res, t = fut.result(), futures[fut]
            results[(t["bug"], t["seed"], t["arm"])] = res
            o = outcome(res, args.max_steps)
            print(f"[{n}/{len(tasks)}] {t['bug']} seed {t['seed']} {t['arm']}: {cell(o)} ({time.time() - t0:.0f} s)",
                  flush=True)
    body = report(args.switch, args.bugs, results, args.max_steps, engine, args.seeds)
    print(body)
    if not args.no_write:
        from benchmarks._results import write_section

        cmd = f"--switch {args.switch} --max-steps {args.max_steps}"
        if list(args.seeds) != [0]:
            cmd += " --seeds " + " ".join(map(str, args.seeds))
        if list(args.bugs) != list(TRAINING_REACHED):
            cmd += " --bugs " + " ".join(args.bugs)
        write_section(f"grist_ablation_{args.switch.lower()}", body, script="grist_suite/ablation", args=cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
