"""The bugs of GRIST's benchmark that the suite's ``adaptive`` misses, searched again at a longer budget,
beside GRIST's own loop given as many passes.

    python benchmarks/grist_suite/long_budget.py [--max-steps 80000] [--bugs ID_9a ID_40 ...] [--jobs 2]
                                                 [--timeout 1800] [--rerun | --report-only] [--no-write]
                                                 [--loop-seconds 300 [--loop-only]]

The suite (``run.py``) gives every op site 1000 steps, the project's budget. GRIST's paper counts a bug
found within its configuration's 30-minute limit (``scripts/config/experiments.config`` of
github.com/Jacob-yen/GRIST), and some of its bugs took GRIST thousands of iterations. So a count set
beside GRIST's 78 of 79 asks what a longer search finds, and whether GRIST's own loop finds it on these
same re-expressed programs and stand-in data.

For each bug, two child processes (three with ``--loop-seconds``):

- ``adaptive``: the bug's program (its variant) is built as the suite builds it, and only the sites on
  the lines marked for the bug are searched (:func:`run.search_group` with ``only``), seed 0, budget
  ``--max-steps``; a candidate is confirmed by the engine's replays, written as a finding folder and
  replayed in a fresh build, as in the suite; a bug also counts when another bug's search of the same
  program made such a finding on its line (:func:`outcome_in_run`). A process still running at ``--timeout`` (default 1800 s:
  GRIST's 30 minutes) is stopped, and the bug counts as missed.
- GRIST's loop (:func:`grist_loop.grist_loop`, TensorFlow programs): ``--max-steps / 2`` iterations, each
  two passes of the program (its step and its train op), so both searches see as many passes.
- With ``--loop-seconds``, GRIST's loop once more, given that many seconds of looping instead, whatever
  its iterations: GRIST's own limit is a time (30 minutes), in which a small program makes a hundred
  thousand iterations (GRIST's loop triggers ID_40 at about 35,000 of them, 70,000 passes, in seconds).
  ``--loop-only`` runs only the loops and reports ``adaptive``'s newest kept results beside them.

Default bugs: every bug the suite's ``adaptive`` column misses (its newest result per subject at
:data:`SUITE_BUDGET` steps, in the cache or the committed record), less those whose steps cost seconds
(a subject with a budget of its own, ``Subject.max_steps``: TF_Unet's steps take about 1.5 s, 80,000
of them more than a day). Results are kept in ``.cache/long_budget`` and, when the section is written, in
``record/long_budget`` (commit them with RESULTS.md). Writes the section ``grist_long_budget``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grist_suite import grist_loop, run as suite  # noqa: E402
from benchmarks.grist_suite.run import find_bug, require_bugs  # noqa: E402

SUITE_BUDGET = 1000
CACHE = suite.CACHE / "long_budget"
RECORD = suite.RECORD / "long_budget"


def suite_found(frameworks: list[str] | None = None) -> dict[str, tuple[bool, bool]]:
    """Bug id -> (found by the suite's newest ``adaptive`` result of its subject at :data:`SUITE_BUDGET`
    steps, its subject has a budget of its own); a subject with no result counts as missing all its bugs."""
    subjects, _ = suite.load_subjects(frameworks or list(suite.REGISTRIES))
    out = {}
    for subject in subjects:
        task = {"key": suite.subject_key(subject), "strategy": "adaptive", "seed": 0,
                "max_steps": subject.budget(SUITE_BUDGET), "cache": suite.CACHE.relative_to(ROOT).as_posix()}
        path = suite.newest_cached(task) if subject.runnable else None
        res = json.loads(path.read_text()) if path else None
        for b in subject.bugs:
            found = suite.bug_outcome(subject, b, res, subject.budget(SUITE_BUDGET))["found"]
            out[b.id] = (found, bool(subject.max_steps))
    return out


def suite_misses() -> list[str]:
    """The bugs the suite's ``adaptive`` misses, less those of subjects with a budget of their own."""
    return [b for b, (found, own_budget) in suite_found().items() if not found and not own_budget]


# ----------------------------------------------------------------------------- workers (child processes)
def worker(task: dict) -> dict:
    """``adaptive`` on one bug's own sites: the suite's record of one subject, holding the bug's group."""
    t_launch = float(task["t_launch"])
    os.chdir(ROOT)
    subject, bug = find_bug(task["bug"])
    if subject.framework == "torch":
        import torch

        torch.set_num_threads(1)
    group = next(g for g in suite.groups(subject) if suite._of_group(bug, g))
    findings = Path(task.get("cache", CACHE)) / "findings" / f"{bug.id}-adaptive-{task['max_steps']}"
    out = {"bug": bug.id, "key": suite.subject_key(subject), "strategy": "adaptive", "max_steps": task["max_steps"],
           "seed": 0, "engine": suite.engine_revision(), "code_version": task["code_version"]}
    out["groups"] = [suite.search_group(subject.framework, subject.id, "adaptive", task["max_steps"], 0, group,
                                        t_launch, findings, only=suite.bug_lines(bug))]
    out["wall_s"] = round(time.time() - t_launch, 3)
    return out


USED: set[Path] = set()      # the kept results this run reports: what the record keeps


def _kept(name: str, rerun: bool, report_only: bool) -> dict | None:
    """A kept result: this code version's in the cache, or (``report_only``) the newest of any version in
    the cache or the record."""
    if report_only:
        stem = name.rsplit("-", 1)[0]
        found = [p for folder in (CACHE, RECORD) for p in folder.glob(f"{stem}-*.json")]
        path = max(found, key=lambda p: p.stat().st_mtime, default=None)
    else:
        path = CACHE / f"{name}.json"
        path = path if path.exists() and not rerun else None
    if path is None:
        return None
    USED.add(path)
    return json.loads(path.read_text())


def _keep(name: str, res: dict) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"{name}.json"
    path.write_text(json.dumps(res, indent=1, default=str))
    USED.add(path)


def _kept_or_run(name: str, script: str, task, timeout: float, rerun: bool, report_only: bool,
                 pick=lambda res: res) -> dict:
    """The kept result ``name`` (:func:`_kept`), or ``script --worker TASK`` run in a child process and
    ``pick`` of its result kept; a child that failed is an error, kept nowhere. ``task``: called for the
    worker's task only when it runs (its launch time is the start of its end-to-end seconds)."""
    kept = _kept(name, rerun, report_only)
    if kept is not None or report_only:
        return kept or {"error": "not run"}
    res, failure = suite.json_child([sys.executable, str(Path(script).resolve()), "--worker", json.dumps(task())],
                                    timeout)
    if res is None:
        return {"error": failure}
    res = pick(res)
    _keep(name, res)
    return res


def run_adaptive(bug_id: str, max_steps: int, timeout: float, rerun: bool, report_only: bool) -> dict:
    subject, _ = find_bug(bug_id)
    version = suite.code_version(subject)
    return _kept_or_run(f"{bug_id}-adaptive-{max_steps}-{version}", __file__,
                        lambda: {"bug": bug_id, "max_steps": max_steps, "code_version": version,
                                 "t_launch": time.time(), "cache": str(CACHE)},
                        timeout, rerun, report_only)


def run_loop(bug_id: str, iterations: int | None, timeout: float, rerun: bool, report_only: bool,
             seconds: float | None = None) -> dict:
    """GRIST's loop on one bug, up to ``iterations`` (as many passes as ``adaptive``'s budget) or, with
    ``seconds``, for that long whatever the iterations (GRIST's own limit is a time)."""
    subject, _ = find_bug(bug_id)
    if subject.framework != "tensorflow":
        return {"error": "GRIST's loop is re-expressed for the TensorFlow programs only"}
    budget = f"{seconds:g}s" if seconds is not None else str(iterations)
    task = {"subject": subject.id, "iterations": iterations, "bugs": [bug_id]}
    if seconds is not None:
        task["seconds"] = seconds
    return _kept_or_run(f"{bug_id}-loop-{budget}-{grist_loop._version(subject)}", grist_loop.__file__,
                        lambda: task, timeout, rerun, report_only,
                        pick=lambda res: res.get(bug_id, {"error": "no result"}))


# ----------------------------------------------------------------------------- report
def adaptive_cell(bug_id: str, res: dict, max_steps: int) -> tuple[dict, str]:
    """(the suite's outcome of the bug, its cell): steps (search s), or a miss with the closest suspect loss."""
    subject, bug = find_bug(bug_id)
    if "error" in res:
        return {"found": False, "steps": max_steps}, f"- ({res['error']})"
    o = suite.bug_outcome(subject, bug, res, max_steps)
    if o["found"]:
        return o, f"{o['steps']} ({o['search_s']:.1f}s)"
    if o["replay"] == "FAILED":
        return o, "**failed a fresh replay**"
    return o, f"- ({suite.miss_note(bug, res) or 'not searched'})"


def outcome_in_run(bug_id: str, adaptive: dict, max_steps: int) -> tuple[dict, str]:
    """:func:`adaptive_cell` of the bug's own search or, where that missed, the suite's count over the whole
    run: a confirmed, replayed finding of another bug's search of the same program whose first non-finite op
    sits on a line marked for this bug (the suite searches every site of a program and counts a bug so).
    GRIST's StackOverFlow-7 (dae7c21, 20,000 steps): the search of ID_9a's site drove ID_9b's ``log`` out
    of its domain at step 13,293 (its folder replays), while ID_9b's own search ended 18.8 nats short."""
    own, cell = adaptive_cell(bug_id, adaptive[bug_id], max_steps)
    if own["found"] or own.get("replay") == "FAILED":
        return own, cell
    subject, bug = find_bug(bug_id)
    best = None
    for other in sorted(adaptive):
        res = adaptive[other]
        if other == bug_id or "error" in res or suite.subject_key(find_bug(other)[0]) != suite.subject_key(subject):
            continue
        o = suite.bug_outcome(subject, bug, res, max_steps)
        if o["found"] and (best is None or o["steps"] < best[1]["steps"]):
            best = (other, o)
    if best is None:
        return own, cell
    other, o = best
    return o, f"{o['steps']} ({o['search_s']:.1f}s, in {other}'s search)"


def loop_cell(res: dict, iterations: int | None = None) -> tuple[bool, str]:
    """``iterations`` None: a loop that ran for a time (its cell says how many iterations it made)."""
    if "error" in res:
        return False, res["error"]
    if res.get("iterations"):
        return True, f"{res['iterations']} it ({res['seconds']:.1f}s)"
    ran = iterations if iterations is not None else res.get("ran", "?")
    return False, f"- ({ran} it, {res.get('seconds', 0):.0f}s)"


def report(bugs: list[str], adaptive: dict, loop: dict, max_steps: int, engine: str, timed: dict | None = None,
           seconds: float | None = None) -> str:
    """``timed``: GRIST's loop given ``seconds`` per bug instead of as many passes (a column of its own)."""
    from benchmarks._results import table

    iterations = max_steps // 2
    rows, found, loop_found, loop_ran, failed, timed_found = [], [], [], 0, [], []
    for bug_id in bugs:
        subject, bug = find_bug(bug_id)
        o, cell = outcome_in_run(bug_id, adaptive, max_steps)
        hit, lcell = loop_cell(loop[bug_id], iterations)
        loop_ran += "error" not in loop[bug_id]
        if o["found"]:
            found.append(bug_id)
        if o.get("replay") == "FAILED":
            failed.append(bug_id)
        if hit:
            loop_found.append(bug_id)
        e2e = f"{o['e2e_s']:.1f}" if o.get("found") else ""
        rows.append([bug_id, subject.name, bug.op, cell, e2e, o.get("replay", "-"), lcell])
        if timed is not None:
            hit, tcell = loop_cell(timed[bug_id])
            rows[-1].append(tcell)
            if hit:
                timed_found.append(bug_id)
    at_1000 = suite_found()
    total, at_suite = len(at_1000), sum(found for found, _ in at_1000.values())
    both = len(set(found) | {b for b, (f, _) in at_1000.items() if f})
    text = [
        "## GRIST's benchmark: the suite's misses at a longer budget (issue 17)\n",
        f"The bugs the suite's `adaptive` misses at {SUITE_BUDGET} steps (section above), each searched again on "
        f"its own sites (the lines marked for it) from the factory's state with `adaptive`, seed 0, budget "
        f"**{max_steps} steps**, its findings confirmed and replayed in a fresh build as the suite does; beside "
        f"it, GRIST's own loop (`grist_loop.py`, TensorFlow programs) at **{iterations} iterations**, two passes "
        "each: as many passes of the program. GRIST's configuration gives a bug 30 minutes; a process still "
        "running then is cut. A cell: steps (search seconds), or a miss with the closest suspect loss of the "
        "bug's sites. End to end: process start to the confirmed, replayed finding."
        + (f" Engine at {engine}." if engine else "") + "\n",
        table(["bug", "subject", "op", f"adaptive, {max_steps} steps", "end to end (s)", "replay",
               f"GRIST's loop, {iterations} iterations"]
              + ([f"GRIST's loop, {seconds:g} s"] if timed is not None else []), rows),
        "",
        f"`adaptive` at {max_steps} steps found **{len(found)} of these {len(bugs)}**"
        + (f" ({', '.join(found)})" if found else "")
        + f": with the suite's {at_suite} at {SUITE_BUDGET} steps, **{both} of {total}** (GRIST's paper: 78 of "
          "79, on the original programs and data, within its 30 minutes)"
        + f". GRIST's loop, on the {loop_ran} of them it can drive, found {len(loop_found)}"
        + (f" ({', '.join(loop_found)})" if loop_found else "") + " (it ends, as GRIST's code does, at the first "
        "non-finite loss whatever op made it: a program with two bugs shows the one that fires first in both rows).",
        f"Findings that failed a fresh replay: {len(failed)}" + (f" ({', '.join(failed)})" if failed else "") + ".",
    ]
    if timed is not None:
        text.insert(-1, f"Given time instead of passes ({seconds:g} s of looping per bug, whatever the iterations: "
                    "GRIST's own limit is a time, 1800 s), GRIST's loop found "
                    f"{len(timed_found)}" + (f" ({', '.join(timed_found)})" if timed_found else "") + ".")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=80000)
    ap.add_argument("--bugs", nargs="+", help="bug ids (ID_9a ...); default: the suite's adaptive misses")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per process (GRIST's limit: 1800)")
    ap.add_argument("--rerun", action="store_true", help="ignore kept results")
    ap.add_argument("--report-only", action="store_true", help="run nothing: report the newest kept results")
    ap.add_argument("--no-write", action="store_true", help="print the section; leave RESULTS.md alone")
    ap.add_argument("--loop-seconds", type=float, help="also run GRIST's loop for this many seconds per bug, "
                    "whatever its iterations (a column of its own; GRIST's limit: 1800)")
    ap.add_argument("--loop-only", action="store_true", help="run GRIST's loop only; adaptive's column is "
                    "its newest kept results (as --report-only)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker)), default=str))
        return 0
    if args.max_steps < 2:
        ap.error(f"--max-steps: {args.max_steps} is below 2 (GRIST's loop gets half of it, in iterations)")
    if args.loop_seconds is not None and not 0 < args.loop_seconds < args.timeout:
        ap.error(f"--loop-seconds: {args.loop_seconds:g} is not between 0 and --timeout ({args.timeout:g})")
    bugs = args.bugs or suite_misses()
    require_bugs(ap, bugs)
    kinds = ("adaptive", "loop") + (("timed",) if args.loop_seconds is not None else ())
    jobs = [(kind, b) for b in bugs for kind in kinds]
    results: dict[str, dict] = {kind: {} for kind in kinds}
    t0 = time.time()

    def one(job):
        kind, b = job
        if kind == "adaptive":
            return job, run_adaptive(b, args.max_steps, args.timeout, args.rerun, args.report_only or args.loop_only)
        if kind == "loop":
            return job, run_loop(b, args.max_steps // 2, args.timeout, args.rerun, args.report_only)
        return job, run_loop(b, None, args.timeout, args.rerun, args.report_only, seconds=args.loop_seconds)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for n, ((kind, b), res) in enumerate(pool.map(one, jobs), 1):
            results[kind][b] = res
            cell = (adaptive_cell(b, res, args.max_steps)[1] if kind == "adaptive"
                    else loop_cell(res, args.max_steps // 2 if kind == "loop" else None)[1])
            print(f"[{n}/{len(jobs)}] {b} {kind}: {cell} ({time.time() - t0:.0f} s)", flush=True)
    adaptive, loop = results["adaptive"], results["loop"]
    engine = sorted({r.get("engine", "") for r in adaptive.values()} - {""})
    body = report(bugs, adaptive, loop, args.max_steps, ", ".join(engine), results.get("timed"), args.loop_seconds)
    print(body)
    if not args.no_write:
        from benchmarks._results import write_section

        RECORD.mkdir(parents=True, exist_ok=True)
        for path in USED:
            if path.parent != RECORD:
                for old in RECORD.glob(path.name.rsplit("-", 1)[0] + "-*.json"):
                    old.unlink()          # the record keeps one version per (bug, search, budget)
                shutil.copy2(path, RECORD / path.name)
        cmd = f"--max-steps {args.max_steps}" + (" --bugs " + " ".join(args.bugs) if args.bugs else "") + (
            f" --loop-seconds {args.loop_seconds:g}" if args.loop_seconds is not None else "")
        write_section("grist_long_budget", body, script="grist_suite/long_budget", args=cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
