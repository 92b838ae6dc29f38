"""The suite's headline figures at more than one seed: how much of them is the seed.

    python benchmarks/grist_suite/seeds.py [--seeds 0 1 2] [--jobs 2] [--cache DIR]
                                           [--rerun | --report-only] [--no-write]

The suite's section (``run.py``) is one run, seed 0. A bug that only the program's own training
reaches is found at a step that depends on the whole training history the search rode, and that
history depends on the seed: the three-seed ablations saw one such bug take 141 to 641 steps. So
the headline (bugs found, the random-hard median, its ratios to ``random``'s and ``grist``'s) is measured here at each
seed in ``--seeds``, with ``adaptive`` over every runnable subject at the suite's budget (1000 steps
per op site). The seed is the suite's ``--seed``: it builds the program (its initial weights, its
data draws, its dropout) and seeds the search, so each seed is another instance of the same 63
programs.

The random-hard bugs are the suite's: those its ``random`` column (seed 0, the newest result of any
code) does not trigger within 100 steps. ``random`` and ``grist`` are not rerun at the other seeds
(``random`` took 133 process-minutes for one seed): the ratios divide their medians on those bugs at seed
0 by ``adaptive``'s median at each seed.

Each (subject, seed) is one child process of ``run.py``'s worker, cached as the suite caches
(``--cache``, keyed by the engine's and the subject's code); a result of the committed record
(``record/``) at the current code counts as cached. Writing the section keeps every ``adaptive``
result used in the record (commit them with RESULTS.md). Writes the section ``grist_seeds``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grist_suite import run as suite  # noqa: E402

SUITE_BUDGET = 1000
WITHIN = 50          # the random-hard median that 20x the budget asks for


def runnable_subjects() -> list:
    subjects, _ = suite.load_subjects(list(suite.REGISTRIES))
    return [s for s in subjects if s.runnable]


def current(task: dict) -> dict | None:
    """The task's result at the current code: in the cache, or in the committed record."""
    for path in (suite.cache_path(task), suite.record_path(task)):
        if path.exists():
            res = json.loads(path.read_text())
            if res.get("code_version") == task["code_version"] and "crash" not in res:
                return res
    return None


def newest(task: dict) -> dict | None:
    path = suite.newest_cached(task)
    return json.loads(path.read_text()) if path is not None else None


def collect(tasks: list[dict], jobs: int, timeout: float, rerun: bool, report_only: bool) -> dict[tuple, dict]:
    """(key, seed) -> ``adaptive``'s result: the current one, the newest of any code with
    ``report_only``, else run now."""
    results, todo = {}, []
    for task in tasks:
        res = newest(task) if report_only else None if rerun else current(task)
        if res is not None:
            results[(task["key"], task["seed"])] = res
        elif not report_only:
            todo.append(task)
    for seed in sorted({t["seed"] for t in todo}):
        batch = [t for t in todo if t["seed"] == seed]
        print(f"seed {seed}: {len(batch)} subjects to run", flush=True)
        for (key, _), res in suite.run_all(batch, jobs, timeout, rerun=True).items():
            results[(key, seed)] = res
    return results


def report(subjects: list, results: dict[tuple, dict], random_s0: dict[str, dict], seeds: list[int],
           same_code: bool = False, grist_s0: dict[str, dict] | None = None) -> str:
    """``random_s0``, ``grist_s0``: the suite's results of those strategies at seed 0, by subject key (no
    ``grist_s0``: its median is taken as the budget). ``same_code``: every result is at the current code
    (its engine labels may differ: the commit a result was run at, when fuzz_core and the programs hashed
    the same as now)."""
    from benchmarks._results import table

    bugs = [(s, b) for s in subjects for b in s.bugs]
    o = {(b.id, seed): suite.bug_outcome(s, b, results.get((suite.subject_key(s), seed)), s.budget(SUITE_BUDGET))
         for s, b in bugs for seed in seeds}

    def at_s0(by_subject: dict[str, dict]) -> dict[str, dict]:
        """Each bug's outcome in a strategy's seed-0 results."""
        return {b.id: suite.bug_outcome(s, b, by_subject.get(suite.subject_key(s)), s.budget(SUITE_BUDGET))
                for s, b in bugs}

    rnd = at_s0(random_s0)
    hard = [b.id for _, b in bugs if not rnd[b.id]["found"] or rnd[b.id]["steps"] > suite.RANDOM_HARD_STEPS]
    gri = at_s0(grist_s0) if grist_s0 is not None else None
    theirs = {"random": suite._median([rnd[b]["steps"] for b in hard]),
              "grist": suite._median([gri[b]["steps"] for b in hard]) if gri is not None else float(SUITE_BUDGET)}
    rows, found_at = [], {}
    for seed in seeds:
        found_at[seed] = {b.id for _, b in bugs if o[(b.id, seed)]["found"]}
        steps = sorted(o[(b, seed)]["steps"] for b in hard)
        k, med = len(steps), suite._median(steps)
        middle = (f"{steps[k // 2]}" if k % 2 else f"{steps[k // 2 - 1]}, {steps[k // 2]}") if k else "-"
        search = [o[(b.id, seed)]["search_s"] for _, b in bugs if o[(b.id, seed)]["found"]]
        rows.append([seed, f"{len(found_at[seed])}/{len(bugs)}", f"{med:g}" if med is not None else "-", middle,
                     f"{sum(x <= WITHIN for x in steps)} of {k}", suite._ratio(theirs["random"], med),
                     suite._ratio(theirs["grist"], med),
                     f"{sum(search) / len(search):.2f}" if search else "-"])
    always = set.intersection(*found_at.values())
    ever = set.union(*found_at.values())
    engines = sorted({r.get("engine", "?") for r in results.values() if "crash" not in r})
    text = [
        "## GRIST's benchmark at more than one seed (issue 17)\n",
        f"The suite's headline at seeds {', '.join(map(str, seeds))}: `adaptive` over its {len(subjects)} runnable "
        f"subjects ({len(bugs)} bugs), budget {SUITE_BUDGET} steps per op site (TF_Unet "
        f"{min(s.budget(SUITE_BUDGET) for s in subjects)}), bugs counted as the suite counts them (a finding at "
        "GRIST's op that replays in a fresh rebuild; a miss counts as the budget). The seed builds the program "
        "(initial weights, data draws, dropout) and seeds the search. Random-hard: the suite's "
        f"{len(hard)} (its `random` at seed 0 does not trigger them within {suite.RANDOM_HARD_STEPS} steps); "
        "`random` and `grist` are not rerun at other seeds: the ratios divide their medians on these bugs at "
        f"seed 0 ({_fmt(theirs['random'])} and {_fmt(theirs['grist'])} steps) by `adaptive`'s at each seed. "
        f"Engine at {', '.join(engines)}"
        + (" (labels of one code: every result's hash of fuzz_core and its program is the current one)"
           if same_code and len(engines) > 1 else "") + ".\n",
        table(["seed", "adaptive found", "random-hard median (steps)", "its middle two", f"within {WITHIN} steps",
               "random / adaptive", "grist / adaptive", "search s per found bug"], rows),
        f"\nFound at every seed: {len(always)}; at one seed at least: {len(ever)}. Found at some seeds only: "
        + (", ".join(f"{b.id} (seed {', '.join(str(sd) for sd in seeds if b.id in found_at[sd])})"
                     for _, b in bugs if b.id in ever - always) or "none") + ".\n",
    ]
    moving = []
    for b in hard:
        cells = [o[(b, seed)] for seed in seeds]
        if not any(c["found"] for c in cells) or all(c["found"] and c["steps"] <= WITHIN for c in cells):
            continue            # missed at every seed, or within the mark at every seed: no row
        moving.append([b, *[c["steps"] if c["found"] else "-" for c in cells]])
    text += [f"The random-hard bugs found at some seed and above {WITHIN} steps (or missed) at one at least, steps "
             "per seed (`-`: a miss):\n", table(["bug", *[f"seed {sd}" for sd in seeds]], moving)]
    kinds = {"failed_replay": "findings that fail a fresh replay", "discarded": "candidates the engine's own "
             "replay discarded", "nan_no_finding": "sites that saw a non-finite value and ended without a "
             "finding", "crash": "crashes"}
    seen = {k: [] for k in kinds}
    for seed in seeds:
        at_seed = {(suite.subject_key(s), "adaptive"): results[(suite.subject_key(s), seed)]
                   for s in subjects if (suite.subject_key(s), seed) in results}
        for k, items in suite.anomalies(subjects, at_seed, ["adaptive"]).items():
            if k in seen:
                seen[k] += [f"{item[0]} seed {seed}" for item in items]
    text.append("\nAt every seed: " + "; ".join(f"{what}: {len(seen[k])}" + (f" ({', '.join(seen[k])})" if seen[k] else "")
                                                 for k, what in kinds.items()) + ".")
    return "\n".join(text)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=suite.TASK_TIMEOUT_S)
    ap.add_argument("--cache", default=suite.CACHE.relative_to(ROOT).as_posix(),
                    help="cache folder, relative to the repository root (default: %(default)s)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--rerun", action="store_true", help="ignore cached and recorded results")
    mode.add_argument("--report-only", action="store_true",
                      help="run nothing: the newest result of each (subject, strategy, seed), any code version")
    ap.add_argument("--no-write", action="store_true", help="print the section; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
        ap.error(f"--seeds: {args.seeds} must be distinct seeds >= 0")
    os.chdir(ROOT)
    subjects = runnable_subjects()
    versions = {suite.subject_key(s): suite.code_version(s) for s in subjects}
    tasks = [suite.make_task(s, "adaptive", SUITE_BUDGET, seed, args.cache, versions[suite.subject_key(s)])
             for s in subjects for seed in args.seeds]
    s0: dict[str, dict] = {"random": {}, "grist": {}}
    for s in subjects:
        for strategy, got in s0.items():
            res = newest(suite.make_task(s, strategy, SUITE_BUDGET, 0, args.cache, versions[suite.subject_key(s)]))
            if res is None:
                print(f"no result of the suite's {strategy} column for {suite.subject_key(s)}: run "
                      "benchmarks/grist_suite/run.py first", file=sys.stderr)
                return 2
            got[suite.subject_key(s)] = res
    t0 = time.time()
    results = collect(tasks, args.jobs, args.timeout, args.rerun, args.report_only)
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    # outside --report-only every result is at the current code: found so by current(), or run now; with it,
    # when each result's hash of fuzz_core and its program is today's (a run started before its commit)
    same_code = not args.report_only or all(
        results.get((key, seed), {}).get("code_version") == version for key, version in versions.items()
        for seed in args.seeds)
    body = report(subjects, results, s0["random"], args.seeds, same_code=same_code, grist_s0=s0["grist"])
    print(body)
    if not args.no_write:
        from benchmarks._results import write_section

        write_section("grist_seeds", body, script="grist_suite/seeds",
                      args="--seeds " + " ".join(map(str, args.seeds)))
        kept = 0
        for task in tasks:
            res = results.get((task["key"], task["seed"]))
            if res is not None and "crash" not in res:
                suite.keep(task, res)
                kept += 1
        print(f"kept {kept} results in {suite._rel(suite.RECORD)}/ (commit them with RESULTS.md)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
