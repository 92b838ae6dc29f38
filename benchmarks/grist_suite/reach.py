"""The out-of-box probe on GRIST's programs: does it tell the ops that can go non-finite from the
guarded ones on programs nobody here wrote for the purpose? (issue 16)

The ``share`` scheduler asks a site that has used ``ReachProbe.after`` steps without a trigger
for an out-of-box probe (:func:`orchestrator.worker.reach_verdict`: ``ReachProbe.steps`` more
steps of ``adaptive`` with the inputs free to leave their bounds, 100x as wide) and weighs a site
whose own op did not fire there as a guarded op (the floor, whatever its loss promises). This script does what a
campaign does for every searched site of every runnable program of the suite: ``adaptive`` for
``after`` steps, then, if the site is still searching, the probe; and reports the verdicts at
GRIST's bug sites (the bug's op on a line marked ``# GRIST bug <id>``; not the gradient sites of
that op, nor other ops on its line) and at the others. A bug site the probe
calls guarded is one the scheduler would slow down: the figure that matters is how many of them
the suite's own search (``run.py``, 1000 steps) goes on to find.

One process per subject (TF1 graphs and imports apart), ``--jobs`` at a time; results cached
per subject under ``benchmarks/grist_suite/.cache/reach/`` by a hash of the engine, the worker,
the scheduler's parts and the programs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grist_suite.run import (  # noqa: E402
    CACHE, REGISTRIES, at_bug, code_version, groups, in_child, load_subjects, newest, newest_cached, pick, subject_key,
)

REACH_CACHE = CACHE / "reach"
TIMEOUT_S = 1800.0


def _defaults() -> tuple[int, int]:
    from orchestrator.scheduling.parts import ReachProbe

    return ReachProbe.after, ReachProbe.steps


def version(subject) -> str:
    h = hashlib.sha1(code_version(subject).encode())
    for rel in ("orchestrator/worker.py", "orchestrator/scheduling/parts.py", "benchmarks/grist_suite/reach.py"):
        h.update((ROOT / rel).read_bytes())
    return h.hexdigest()[:12]


# ----------------------------------------------------------------------------- worker (child process)
def probe_group(framework: str, sid: int, group: dict, after: int, steps: int, seed: int) -> dict[str, Any]:
    from fuzz_core.backends.base import RunnerOptions
    from fuzz_core.engine import TargetSpec, build_runner, discover_sites
    from fuzz_core.search import SearchConfig, SiteSearch
    from orchestrator.worker import reach_verdict

    weights = bool(group.get("search_weights", False))
    spec = TargetSpec(f"grist-id{sid:02d}", group["entry"], dict(group["args"]), framework=framework, seed=seed)
    out: dict[str, Any] = {"entry": group["entry"], "args": group["args"], "sites": [], "error": None}
    try:
        runner = build_runner(spec, RunnerOptions(search_weights=weights))
        sites = [s for s in discover_sites(runner, seed) if s.searched]
    except Exception as exc:  # noqa: BLE001 - a subject that cannot be built is a result
        out["error"] = f"build/discover: {type(exc).__name__}: {exc}"
        return out
    for site in sites:
        rec: dict[str, Any] = {"op": site.op, "location": site.location, "occurrence": site.occurrence}
        try:
            search = SiteSearch(runner, site, SearchConfig("adaptive", 10 * after, seed, search_weights=weights,
                                                           reach_steps=0))
            result = search.run(after)
            rec["status"] = str(result.status)
            if result.candidate is not None:
                rec["own"] = bool(result.candidate.own)
            elif not result.status.final:
                rec["outside"], rec["probe_steps"] = reach_verdict(search, steps)
        except Exception as exc:  # noqa: BLE001 - recorded, the next site goes on
            rec["error"] = f"{type(exc).__name__}: {exc}"
        out["sites"].append(rec)
    return out


def worker(task: dict[str, Any]) -> dict[str, Any]:
    os.chdir(ROOT)
    if task["framework"] == "torch":
        import torch

        torch.set_num_threads(1)
    out = {k: task[k] for k in ("key", "framework", "subject", "after", "steps", "seed", "version")}
    out["groups"] = [probe_group(task["framework"], task["subject"], g, task["after"], task["steps"], task["seed"])
                     for g in task["groups"]]
    return out


# ----------------------------------------------------------------------------- driver
def run_task(task: dict[str, Any], rerun: bool, report_only: bool = False) -> dict[str, Any]:
    """One subject's verdicts: cached, or from a child process. ``report_only``: the newest cached
    result of the subject (any code version), or a crash record saying there is none."""
    stem = f"{task['key']}-{task['after']}-{task['steps']}-s{task['seed']}"
    path = REACH_CACHE / f"{stem}-{task['version']}.json"
    if report_only:
        found = newest(REACH_CACHE, f"{stem}-*.json")
        return json.loads(found.read_text()) if found else dict(task, crash="no cached result", groups=[])
    if path.exists() and not rerun:
        return json.loads(path.read_text())
    out_file = REACH_CACHE / "tmp" / f"{task['key']}-{os.getpid()}-{time.time_ns()}.json"
    result, failure, _ = in_child(Path(__file__).resolve(), task, out_file, TIMEOUT_S)
    if result is None:
        return dict(task, crash=failure, groups=[])
    path.write_text(json.dumps(result))
    return result


def _suite_found(subject, bug, max_steps: int) -> bool | None:
    """Whether the suite's own adaptive run (the newest cached, any engine) found ``bug`` at GRIST's op."""
    from benchmarks.grist_suite.run import bug_outcome

    task = {"key": subject_key(subject), "strategy": "adaptive", "max_steps": subject.budget(max_steps), "seed": 0,
            "cache": CACHE.relative_to(ROOT).as_posix()}
    path = newest_cached(task)
    if path is None:
        return None
    return bool(bug_outcome(subject, bug, json.loads(path.read_text()), subject.budget(max_steps))["found"])


def report(subjects, results: dict[str, dict], after: int, steps: int, max_steps: int) -> str:
    from benchmarks._results import table

    tally = {True: {}, False: {}}         # marked (a GRIST bug site) or not -> verdict -> count
    slowed, crashes = [], []
    for subj in subjects:
        res = results.get(subject_key(subj))
        if res is None:
            continue
        if "crash" in res:
            crashes.append(f"ID_{subj.id}: {res['crash'][:160]}")
            continue
        for g in res["groups"]:
            if g.get("error"):
                crashes.append(f"ID_{subj.id}: {g['error'][:160]}")
            bugs = [b for b in subj.bugs if b.entry == g["entry"] and b.args == g["args"]]
            for s in g["sites"]:
                marked = [b for b in bugs if b.op == s["op"] and at_bug({"location": s["location"], "own": True}, b)]
                if s.get("error"):
                    verdict = "error"
                elif "outside" in s:
                    verdict = {True: "fires outside", False: "guarded (did not fire)", None: "no verdict"}[s["outside"]]
                elif s["status"].endswith("found") or s["status"].endswith("flaky"):
                    verdict = f"found within {after} steps"
                else:
                    verdict = s["status"].split(".")[-1]
                tally[bool(marked)][verdict] = tally[bool(marked)].get(verdict, 0) + 1
                if marked and s.get("outside") is False:
                    for b in marked:
                        slowed.append((b.id, f"{s['op']}#{s['occurrence']}", _suite_found(subj, b, max_steps)))
    verdicts = sorted(set(tally[True]) | set(tally[False]))
    rows = [[v, tally[True].get(v, 0), tally[False].get(v, 0)] for v in verdicts]
    rows.append(["all", sum(tally[True].values()), sum(tally[False].values())])
    text = [f"Every searched site of every runnable program: `adaptive` for {after} steps (the steps after which "
            f"`share` asks for a probe), then, if still searching, the out-of-box probe ({steps} steps, inputs free "
            f"to leave their bounds 100x as wide; `orchestrator.worker.reach_verdict`). GRIST's bug sites (the bug's "
            f"op on a line marked `# GRIST bug <id>`) against the others.\n",
            table(["verdict", "GRIST's bug sites", "other sites"], rows), ""]
    if slowed:
        found = [x for x in slowed if x[2]]
        text.append(f"Bug sites the probe calls guarded (the scheduler weighs them as flat sites, the floor, until "
                    f"their steps double and a new probe says otherwise): {len(slowed)}; the suite's own adaptive search "
                    f"(`run.py`, {max_steps} steps) finds {len(found)} of them: "
                    + ", ".join(f"{b} {op}" + (" (found by the suite)" if f else "") for b, op, f in sorted(slowed))
                    + ".\n")
    else:
        text.append("No bug site is called guarded.\n")
    if crashes:
        text.append("Could not be probed: " + "; ".join(crashes) + ".\n")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    after, steps = _defaults()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frameworks", nargs="+", choices=list(REGISTRIES), default=list(REGISTRIES))
    ap.add_argument("--subjects", nargs="*", help="GRIST subject ids (26 or ID_26)")
    ap.add_argument("--after", type=int, default=after, help="steps of adaptive before the probe (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=steps, help="steps of the probe (default: %(default)s)")
    ap.add_argument("--max-steps", type=int, default=1000, help="the suite run whose findings are compared")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: report the newest cached result of each subject, any code version")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--note", default="", help="a paragraph added to the section (how it was run, what else was seen)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        Path(args.worker_out).write_text(json.dumps(worker(json.loads(args.worker))))
        return 0
    os.chdir(ROOT)
    subjects = [s for s in pick(load_subjects(args.frameworks)[0], args.subjects) if s.runnable]
    tasks = [{"key": subject_key(s), "framework": s.framework, "subject": s.id, "after": args.after,
              "steps": args.steps, "seed": args.seed, "version": version(s), "groups": groups(s)} for s in subjects]
    results: dict[str, dict] = {}
    t0 = time.time()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for task, res in zip(tasks, pool.map(lambda t: run_task(t, args.rerun, args.report_only), tasks)):
            results[task["key"]] = res
            print(f"{task['key']}: {sum(len(g['sites']) for g in res.get('groups', []))} sites"
                  + (f", {res['crash']}" if "crash" in res else ""), flush=True)
    print(f"done in {time.time() - t0:.0f} s")
    body = "## The out-of-box probe on GRIST's programs (issue 16)\n\n" + report(
        subjects, results, args.after, args.steps, args.max_steps) + (f"\n{args.note.strip()}\n" if args.note else "")
    print(body)
    if not args.no_write:
        from benchmarks._results import write_section

        write_section("grist_reach", body, script="grist_suite/reach",
                      args=f"--frameworks {' '.join(args.frameworks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
