"""GRIST's own search loop, re-expressed, on the suite's TensorFlow programs, beside the ``grist`` strategy.

    python benchmarks/grist_suite/grist_loop.py [--iterations 1000] [--subjects 3 14 ...] [--no-write]
        [--rerun | --report-only]

Issue 17 asked why the project's ``grist`` strategy seemed not to reproduce GRIST's own results on
TF programs. This runs, on the same re-expressed programs and stand-in data, the loop that GRIST's
code runs around a TF1 program (``scripts/utils/tf_utils.py`` of github.com/Jacob-yen/GRIST, read
and re-expressed here, not copied), with its configuration (``scripts/config/experiments.config``):

1. one ``session.run`` of the program's loss, the objective ``reduce_min(abs(x_op))`` over the bug
   op's input ``x_op`` and its gradient with respect to the searched placeholder; a loss that is
   NaN or infinite ends the run (GRIST looks at the loss only);
2. ``x <- clip(x - 0.15 * sign(grad), lo, hi)``, ``lo`` and ``hi`` the first batch's min and max;
3. one ``session.run`` of the program's ``train_op`` on the new batch;
4. every 100th iteration the 5% of rows with the lowest score ``(updates - clips + 1) / iterations``
   (rows whose pixels the sign steps moved, less those they pushed out of the range) are replaced by
   fresh rows of the sampler.

That objective and refresh are those of most of GRIST's entries; a few entry files differ (ID_11c's and
ID_16c's objective is ``reduce_max(logits)``; the BMI entries, ID_40 to ID_42, discard their refresh).
``grist_original.py`` runs GRIST's entry files themselves, from a checkout of its repository.

Its figure is GRIST's **iterations**; each is two passes of the program (the step and the train
op), so it compares with the ``grist`` strategy's **steps / 2** (every pass is a step there, and a
TF1 training step is its own ``session.run``). The strategy's steps come from the suite's cache
(``run.py`` at the same budget), so run that first. Randomness inside the graph (dropout) is left to
the session here, as in GRIST's runs; the strategy draws it from each step's seed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STEP, REFRESH_EVERY, REFRESH_FRACTION = 0.15, 100, 0.05     # GRIST's experiments.config
# each subject's outcome, kept (under a hash of the loop's code and the program's) so that the section can be
# written again without running the loop
CACHE = ROOT / "benchmarks" / "grist_suite" / ".cache" / "grist_loop"
TF_OPS = {"log": ("Log",), "exp": ("Exp",), "div": ("RealDiv", "Div"), "sqrt": ("Sqrt",)}


def bug_input(graph, bug) -> object | None:
    """The input tensor of the bug's op: an op of the bug's kind on a line marked for it."""
    from benchmarks.grist_suite.model import marked_lines
    from fuzz_core.backends.tf_recorder import traceback_location

    path = bug.entry.split(":", 1)[0]
    lines = set(marked_lines(bug.entry).get(bug.id, []))
    for op in graph.get_operations():
        if op.type not in TF_OPS.get(bug.op, ()) or op.name.startswith(("gradients", "cdeepfuzz")):
            continue
        where = traceback_location(op)
        file, _, line = where.rpartition(":")
        if file == path and line.isdigit() and int(line) in lines:
            return op.inputs[-1] if bug.op == "div" else op.inputs[0]
    return None


def grist_loop(subject, bug, iterations: int | None, seed: int = 0, seconds: float | None = None) -> dict:
    """GRIST's loop on one bug: iterations to a non-finite loss (None: not within ``iterations``, or
    within ``seconds`` of looping: GRIST's own limit is a time, 30 minutes; ``ran`` then says how many
    iterations it made). ``iterations`` None: no cap but the time."""
    import tensorflow as tf

    from fuzz_core.loader import call_factory, load_factory

    target = call_factory(load_factory(bug.entry, ROOT), seed, dict(bug.args))
    searched = target.search[0]
    with target.graph.as_default():
        x_op = bug_input(target.graph, bug)
        if x_op is None:
            return {"error": "the bug's op was not found on its marked line"}
        objective = tf.reduce_min(tf.abs(x_op))
        grad = tf.gradients(objective, target.feeds[searched])[0]
    if grad is None:
        return {"error": "no gradient from the searched input to the bug's op"}
    rng = np.random.default_rng(seed)
    batch = {k: np.array(v) for k, v in target.sample(rng).items()}
    lo, hi = float(batch[searched].min()), float(batch[searched].max())
    rows = len(batch[searched])
    updates, clips, age = np.zeros(rows), np.zeros(rows), np.zeros(rows)
    pixels = int(np.prod(batch[searched].shape[1:]))
    t0 = time.perf_counter()
    it = 0
    while iterations is None or it < iterations:
        it += 1
        if seconds is not None and time.perf_counter() - t0 > seconds:
            return {"iterations": None, "seconds": round(time.perf_counter() - t0, 3), "ran": it - 1}
        feed = {target.feeds[k]: v for k, v in batch.items()}
        loss, g = target.session.run([target.loss, grad], feed)
        if not np.all(np.isfinite(loss)):
            return {"iterations": it, "seconds": round(time.perf_counter() - t0, 3)}
        moved = STEP * np.sign(g)
        stepped = batch[searched] - moved
        flat = (moved != 0).reshape(rows, -1).sum(1)
        out = ((stepped < lo) | (stepped > hi)).reshape(rows, -1).sum(1)
        updates, clips, age = updates + flat / pixels, clips + out / pixels, age + 1
        batch[searched] = np.clip(stepped, lo, hi).astype(batch[searched].dtype)
        target.session.run(target.train_op, {target.feeds[k]: v for k, v in batch.items()})
        if it % REFRESH_EVERY == 0:
            score = (updates - clips + 1) / (age + 1e-7)
            worst = np.argsort(score)[: int(rows * REFRESH_FRACTION)]
            fresh = target.sample(rng)
            for i, r in enumerate(worst):
                for k in batch:
                    batch[k][r] = fresh[k][i]
                updates[r] = clips[r] = age[r] = 0
    return {"iterations": None, "seconds": round(time.perf_counter() - t0, 3), "ran": it}


def _worker(task: dict) -> dict:
    from benchmarks.grist_suite.subjects_tf import SUBJECTS

    os.chdir(ROOT)
    subject = next(s for s in SUBJECTS if s.id == task["subject"])
    out = {}
    for bug in subject.bugs:
        if task.get("bugs") and bug.id not in task["bugs"]:
            continue
        if bug.search_weights:
            out[bug.id] = {"error": "GRIST searched a variable here, not the input (not this loop)"}
            continue
        try:
            out[bug.id] = grist_loop(subject, bug, task.get("iterations"), seconds=task.get("seconds"))
        except Exception as exc:  # noqa: BLE001 - a program the loop cannot drive is a result
            out[bug.id] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return out


def _version(subject) -> str:
    """A hash of what the loop's outcome on ``subject`` depends on: the loop's own code (not this file's
    report) and the program's files."""
    import hashlib
    import inspect

    h = hashlib.sha1(f"{STEP} {REFRESH_EVERY} {REFRESH_FRACTION} {TF_OPS}".encode())
    for fn in (bug_input, grist_loop, _worker):
        h.update(inspect.getsource(fn).encode())
    for path in sorted({ROOT / b.entry.split(":", 1)[0] for b in subject.bugs}):
        h.update(path.read_bytes())
        for helper in sorted(path.parent.glob("_*.py")):
            h.update(helper.read_bytes())
    return h.hexdigest()[:10]


def strategy_steps(subject, bug, max_steps: int) -> int | None:
    """The ``grist`` strategy's steps to trigger the bug at GRIST's op (the suite's cache), or None."""
    from benchmarks.grist_suite import run

    task = {"key": run.subject_key(subject), "strategy": "grist", "max_steps": subject.budget(max_steps),
            "seed": 0, "cache": run.CACHE.relative_to(ROOT).as_posix()}
    path = run.newest_cached(task)
    if path is None:
        return None
    outcome = run.bug_outcome(subject, bug, json.loads(path.read_text()), subject.budget(max_steps))
    return outcome["steps"] if outcome["found"] else -1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=1000, help="GRIST iterations per bug (and the suite's budget "
                    "whose grist results are compared)")
    ap.add_argument("--subjects", nargs="*", help="GRIST subject ids (3, ID_3 or ID_2a), as run.py takes them")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--rerun", action="store_true", help="ignore the results kept from earlier runs")
    ap.add_argument("--report-only", action="store_true", help="run nothing: write the section from kept results")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0

    from concurrent.futures import ThreadPoolExecutor

    from benchmarks._results import table, write_section
    from benchmarks.grist_suite.run import json_child, pick
    from benchmarks.grist_suite.subjects_tf import SUBJECTS

    subjects = pick([s for s in SUBJECTS if s.runnable], args.subjects)

    def one(subject) -> tuple:
        its = min(args.iterations, subject.budget(args.iterations))
        cached = CACHE / f"id{subject.id:02d}-{its}-{_version(subject)}.json"
        if cached.exists() and not args.rerun:
            return subject, json.loads(cached.read_text())
        if args.report_only:
            return subject, {b.id: {"error": "not run"} for b in subject.bugs}
        task = json.dumps({"subject": subject.id, "iterations": its})
        # a child that fails or runs past the hour is a row saying so, not a crash of the whole run
        res, failure = json_child([sys.executable, __file__, "--worker", task], timeout=3600)
        if res is None:
            res = {b.id: {"error": failure[:200]} for b in subject.bugs}
        else:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(res))
        print(f"  ID_{subject.id}: {res}", flush=True)
        return subject, res

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, subjects))
    rows, both, loop_only, strat_only = [], 0, [], []
    for subject, res in results:
        for bug in subject.bugs:
            r = res.get(bug.id, {})
            steps = strategy_steps(subject, bug, args.iterations)
            its = r.get("iterations")
            loop = r["error"] if "error" in r else (f"{its} ({r['seconds']:.1f}s)" if its else f"- ({args.iterations})")
            strat = "not run" if steps is None else "-" if steps < 0 else f"{steps} steps = {steps / 2:g} it"
            rows.append([bug.id, subject.name, bug.op, loop, strat])
            found_loop, found_strat = bool(its), steps is not None and steps > 0
            both += found_loop and found_strat
            if found_loop and not found_strat:
                loop_only.append(bug.id)
            if found_strat and not found_loop:
                strat_only.append(bug.id)
    found = sum(1 for _, res in results for r in res.values() if r.get("iterations"))
    body = "\n".join([
        "### GRIST's own loop on the TensorFlow programs\n",
        f"GRIST's search loop as its code runs it (`benchmarks/grist_suite/grist_loop.py`: objective "
        f"`reduce_min(abs(op input))`, `x - 0.15 sign(grad)` clipped to the first batch's range, the program's "
        f"train op on the stepped batch, GRIST's own row score for its 5% refresh every 100 iterations, a "
        f"non-finite loss ends it), up to {args.iterations} iterations per bug, beside the `grist` strategy's "
        f"steps in the suite's run at a budget of {args.iterations} steps. An iteration is two passes of a TF1 "
        "program (its step and its train op), each a step of the strategy: compare iterations with steps / 2.\n",
        table(["bug", "subject", "op", "GRIST's loop: iterations (s)", "grist strategy: steps (= iterations)"], rows),
        "",
        "The loop ends, as GRIST's code does, at the first non-finite loss, whatever op made it: where one "
        "program holds two bugs (ID_2a and ID_2b: a softmax output at 0 and at 1) both rows show the iteration "
        "of the one that fires first, while the strategy's steps are those of a finding at that bug's own "
        "line.\n",
        f"GRIST's loop triggered {found} bugs within {args.iterations} iterations; both it and the strategy "
        f"(within {args.iterations} steps, half the iterations) found {both}; the loop only: "
        f"{', '.join(loop_only) or 'none'}; the strategy only: {', '.join(strat_only) or 'none'}.",
    ])
    print(body)
    if not args.no_write:
        cmd = f"--iterations {args.iterations}" + (
            " --subjects " + " ".join(args.subjects) if args.subjects else "")
        write_section("grist_loop", body, script="grist_suite/grist_loop", args=cmd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
