"""GRIST's own code on the bugs no search here reaches: its entry files, run unchanged, for its own time limit.

    python benchmarks/grist_suite/grist_original.py --grist-repo PATH [--bugs ID_9a ID_9b ID_11c ID_16c]
                                                    [--minutes 30] [--jobs 2] [--no-write | --report-only]

``--grist-repo`` is a checkout of GRIST's public repository (github.com/Jacob-yen/GRIST, the FSE 2021
artifact); nothing of it is copied into this project. For each bug, its ``*_grist.py`` entry file runs
in a child process with GRIST's own ``GradientSearcher`` (``scripts/utils``), on GRIST's configuration
(``scripts/config/experiments.config``) with its ``time_limit`` set to ``--minutes`` (GRIST's: 30).
The entry's code is GRIST's to the line; what this script supplies is what TensorFlow 2 no longer has:

- the TF1 API, as ``tensorflow.compat.v1`` with v2 behaviour off, under the name ``tensorflow``;
- ``tf.layers.dense`` and ``tf.layers.flatten`` (gone with Keras 3): a kernel from the entry's
  ``kernel_initializer`` and a zero bias, as TF1's dense layer made them;
- ``tensorflow.examples.tutorials.mnist.input_data.read_data_sets`` (ID_9's entries): the MNIST images
  as floats in ``[0, 1]`` with one-hot labels, served in shuffled batches.

Data: real MNIST, the idx files in GRIST's own repository (``scripts/study_case/ID_9/MNIST_data``): its
60,000 training images where the checkout has them, else its 10,000 test images, which the entries'
dataset modules read as their training set. GRIST's code, its config and the data are copied into a
temporary folder per run, so the checkout is left as it was.

GRIST counts a bug found once the program's loss is non-finite, whatever op made it. For the entries
that build their logits with ``tf.layers.dense`` (ID_11, ID_16), every training pass is watched: the
first pass that holds a logit above 88.72 (``exp`` overflows in float32) and the first with a row whose
every logit is below -87.3 (the row's ``sum(exp)`` is 0: the division's edge, ID_11c and ID_16c). That
tells which op a NaN came from.

GRIST's code also appends its verdict to ``/data/scripts/results.txt`` where it may create that folder.

Writes the section ``grist_original`` and keeps the runs in ``record/grist_original.json``
(``--report-only`` rebuilds the section from them).
"""
from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grist_suite.run import RECORD  # noqa: E402

# the four bugs no search here reaches (RESULTS: the longer budget, the box's reach), and GRIST's entry for each
ENTRIES = {"ID_9a": "scripts/study_case/ID_9/soips7_grist.py",
           "ID_9b": "scripts/study_case/ID_9/soips7_log2_grist.py",
           "ID_11c": "scripts/study_case/ID_11/nan_model_truediv_grist.py",
           "ID_16c": "scripts/study_case/ID_16/nan_model_truediv_grist.py"}
# what the watch means per program: ID_16's softmax clips its logits to at most 87 before its exp
CLIPPED = {"ID_16c": "clipped to 87 before its `exp`: no overflow"}
MNIST = "scripts/study_case/ID_9/MNIST_data"
KEPT = RECORD / "grist_original.json"
EXP_OVERFLOW, ROW_UNDERFLOW = 88.72, -87.3       # float32: exp(88.73) is inf; exp(-87.4) is 0 with subnormals flushed
RESULT = re.compile(r"FINAL RESULTS: #(?P<name>[^#]+)# (?P<outcome>Success|Fail) to find NaN!\s+Iteration: <(?P<it>\d+)>")
WATCH = re.compile(r"^WATCH (?P<what>high|low) (?P<pass>\d+) (?P<value>\S+)$", re.M)


# ----------------------------------------------------------------------------- the child: one entry file
def _child(entry: str, data: str) -> None:
    """Run GRIST's ``entry`` (a path in the prepared copy, the cwd) under the TF1 shims."""
    import runpy
    import types

    import numpy as np
    import tensorflow as real_tf

    v1 = real_tf.compat.v1
    v1.disable_v2_behavior()
    dense_out: list = []

    class Layers:
        """``tf.layers.dense`` / ``flatten`` as TF1 made them: kernel from the initializer, zero bias."""

        @staticmethod
        def flatten(x, name=None):
            return v1.reshape(x, [-1, int(np.prod([int(d) for d in x.shape[1:]]))])

        @staticmethod
        def dense(x, units, activation=None, kernel_initializer=None, name=None):
            with v1.variable_scope(name, default_name="dense"):
                kernel = v1.get_variable("kernel", [int(x.shape[-1]), units], initializer=kernel_initializer)
                bias = v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
            out = v1.matmul(x, kernel) + bias
            dense_out.append(out)
            return activation(out) if activation is not None else out

    v1.layers = Layers
    run, seen, passes = v1.Session.run, {}, [0]

    def watched_run(self, fetches, feed_dict=None, **kw):
        """A training pass (the entry's train op, a NoOp) also fetches the last dense layer's output."""
        if not (dense_out and feed_dict and isinstance(fetches, v1.Operation) and fetches.type == "NoOp"):
            return run(self, fetches, feed_dict=feed_dict, **kw)
        out, logits = run(self, [fetches, dense_out[-1]], feed_dict=feed_dict, **kw)
        passes[0] += 1
        top, low = float(np.max(logits)), float(np.min(np.max(logits, axis=1)))
        for what, hit, value in (("high", top > EXP_OVERFLOW, top), ("low", low < ROW_UNDERFLOW, low)):
            if hit and what not in seen:
                seen[what] = passes[0]
                print(f"WATCH {what} {passes[0]} {value:.6g}", flush=True)
        return out

    v1.Session.run = watched_run

    def read_data_sets(path, one_hot=False, **kw):
        images = np.fromfile(os.path.join(data, "train-images-idx3-ubyte"), np.uint8, offset=16)
        labels = np.fromfile(os.path.join(data, "train-labels-idx1-ubyte"), np.uint8, offset=8).astype(np.int64)
        images = images.reshape(len(labels), 784).astype(np.float32) / 255.0
        if one_hot:
            labels = np.eye(10, dtype=np.float32)[labels]
        rng, order, at = np.random.RandomState(0), [], [0]

        def next_batch(n):
            if at[0] + n > len(order):
                order[:] = list(rng.permutation(len(images)))
                at[0] = 0
            idx = order[at[0]:at[0] + n]
            at[0] += n
            return images[idx], labels[idx]

        return types.SimpleNamespace(train=types.SimpleNamespace(images=images, labels=labels, next_batch=next_batch))

    mnist = types.ModuleType("tensorflow.examples.tutorials.mnist.input_data")
    mnist.read_data_sets = read_data_sets
    for name in ("tensorflow.examples", "tensorflow.examples.tutorials", "tensorflow.examples.tutorials.mnist"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["tensorflow.examples.tutorials.mnist"].input_data = mnist
    sys.modules["tensorflow.examples.tutorials.mnist.input_data"] = mnist
    sys.modules["tensorflow"] = v1
    sys.argv = [entry, "--data_dir", data]
    runpy.run_path(entry, run_name="__main__")


# ----------------------------------------------------------------------------- the parent
def mnist_files(repo: Path) -> tuple[Path, Path, str]:
    """GRIST's MNIST idx files (gzip): its training set where the checkout has it, else its test set."""
    folder = repo / MNIST
    for split, what in (("train", "60,000 training images"), ("t10k", "10,000 test images")):
        images, labels = folder / f"{split}-images-idx3-ubyte.gz", folder / f"{split}-labels-idx1-ubyte.gz"
        if images.is_file() and labels.is_file() and images.stat().st_size > 1_000_000:
            return images, labels, f"real MNIST, {what} (GRIST's {MNIST})"
    raise FileNotFoundError(f"no MNIST idx files in {folder}")


def prepare(repo: Path, bug: str, minutes: float, into: Path) -> tuple[Path, Path]:
    """GRIST's package, config (its time limit set), the bug's entry folder and the data, in ``into``."""
    entry = Path(ENTRIES[bug])
    for part in ("scripts/__init__.py", "scripts/utils", "scripts/config", "scripts/study_case/__init__.py"):
        src, dst = repo / part, into / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        elif src.is_file():
            shutil.copy2(src, dst)
        else:
            dst.touch()
    shutil.copytree(repo / entry.parent, into / entry.parent, ignore=shutil.ignore_patterns("*.gz", "*.csv"))
    (into / entry.parent / "__init__.py").touch()
    config = into / "scripts/config/experiments.config"
    config.write_text(re.sub(r"(?m)^time_limit=.*$", f"time_limit={minutes:g}", config.read_text()))
    data = into / "data"
    data.mkdir()
    images, labels, _ = mnist_files(repo)
    for src, name in ((images, "train-images-idx3-ubyte"), (labels, "train-labels-idx1-ubyte")):
        with gzip.open(src) as f_in, open(data / name, "wb") as f_out:
            shutil.copyfileobj(f_in, f_out)
    return into / entry, data


def parse(output: str) -> dict:
    """GRIST's verdict line and the watch's first passes, from the child's output."""
    m = RESULT.search(output)
    out: dict = {"verdict": None, "iterations": None}
    if m:
        out = {"verdict": "found" if m["outcome"] == "Success" else "missed", "iterations": int(m["it"])}
    for w in WATCH.finditer(output):
        out[w["what"]] = {"pass": int(w["pass"]), "value": float(w["value"])}
    return out


def run_one(repo: Path, bug: str, minutes: float) -> dict:
    """One bug's entry in a child process of its own, in a prepared copy: GRIST's verdict and the watch."""
    with tempfile.TemporaryDirectory(prefix="grist-original-") as tmp:
        entry, data = prepare(repo, bug, minutes, Path(tmp))
        env = dict(os.environ, PYTHONPATH=tmp, TF_CPP_MIN_LOG_LEVEL="2")
        t0 = time.time()
        try:
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(entry), str(data)],
                                  cwd=tmp, env=env, capture_output=True, text=True, timeout=minutes * 60 + 600)
            output, rc = proc.stdout + proc.stderr, proc.returncode
            error = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        except subprocess.TimeoutExpired as exc:      # GRIST's own limit did not stop it: say so, keep the rest
            output = "".join(o.decode() if isinstance(o, bytes) else o or "" for o in (exc.stdout, exc.stderr))
            rc, error = None, f"still running after {exc.timeout:g} s: stopped"
        out = dict(parse(output), bug=bug, entry=ENTRIES[bug], minutes=minutes,
                   seconds=round(time.time() - t0, 1), rc=rc)
        if out["verdict"] is None or rc is None:
            out["error"] = error
        return out


def report(runs: list[dict], data: str) -> str:
    from benchmarks._results import table

    rows = []
    for r in runs:
        verdict = ("error: " + r.get("error", "?") if r["verdict"] is None else
                   f"**NaN** at iteration {r['iterations']:,} ({r['seconds']:.0f} s)" if r["verdict"] == "found" else
                   f"none in {r['iterations']:,} iterations ({r['minutes']:g} min)")
        watch = []
        if "high" in r:
            watch.append(f"a logit above {EXP_OVERFLOW} at pass {r['high']['pass']:,} ({r['high']['value']:.4g}"
                         + (f"; {CLIPPED[r['bug']]})" if r["bug"] in CLIPPED else ")"))
        if "low" in r:
            watch.append(f"a row with every logit below {ROW_UNDERFLOW} at pass {r['low']['pass']:,}")
        if "high" not in r and "low" not in r:
            watch.append("-" if "ID_9" in r["bug"] else f"no logit above {EXP_OVERFLOW}, no row below {ROW_UNDERFLOW}")
        rows.append([r["bug"], f"`{r['entry']}`", verdict, "; ".join(watch)])
    found = [r["bug"] for r in runs if r["verdict"] == "found"]
    at_edge = [r["bug"] for r in runs if "low" in r]
    return "\n".join([
        "## GRIST's own code on the four bugs no search here reaches (issue 17)\n",
        "GRIST's entry files and its `GradientSearcher`, run unchanged on GRIST's configuration (sign steps of "
        "0.15, 5% of the rows refreshed every 100 iterations) for its own time limit, under TensorFlow 2's "
        "`compat.v1` (`tf.layers.dense` and ID_9's `input_data` supplied, as TF1 had them; "
        "`benchmarks/grist_suite/grist_original.py`). Data: " + data + ". GRIST counts a bug found once the "
        "loss is non-finite, whatever op made it; the watch column says, for the programs whose logits come "
        "from dense layers, which edge their training passes reached first.\n",
        table(["bug", "GRIST's entry", "GRIST's verdict", "watch (training passes)"], rows),
        f"\nGRIST's code reports a NaN on {len(found)} of {len(runs)} ({', '.join(found) or 'none'}); a row at the "
        f"division's edge (every logit below {ROW_UNDERFLOW}) on {len(at_edge)} ({', '.join(at_edge) or 'none'}).",
    ])


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grist-repo", type=Path, help="a checkout of github.com/Jacob-yen/GRIST")
    ap.add_argument("--bugs", nargs="+", default=list(ENTRIES), help=f"of {', '.join(ENTRIES)}")
    ap.add_argument("--minutes", type=float, default=30.0, help="GRIST's time limit per entry (its config: 30)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print the section; leave RESULTS.md alone")
    ap.add_argument("--report-only", action="store_true", help="run nothing: rebuild the section from "
                    "record/grist_original.json")
    args = ap.parse_args(argv)
    from benchmarks._results import kept_or_measured

    return kept_or_measured(ap, args, KEPT, measure, lambda k: report(k["runs"], k["data"]), "grist_original",
                            "grist_suite/grist_original", lambda k: "--grist-repo PATH " + k["flags"])


def measure(ap: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """Check the arguments (exit 2 naming what is wrong), then run each bug's entry: the runs, the data
    they ran on, and the flags that repeat them."""
    unknown = [b for b in args.bugs if b not in ENTRIES]
    if unknown:
        ap.error(f"--bugs: {', '.join(unknown)}: not one of {', '.join(ENTRIES)}")
    if args.grist_repo is None:
        ap.error("--grist-repo: required (a checkout of github.com/Jacob-yen/GRIST)")
    repo = args.grist_repo.resolve()
    missing = [ENTRIES[b] for b in args.bugs if not (repo / ENTRIES[b]).is_file()]
    if missing:
        ap.error(f"--grist-repo {args.grist_repo}: no {', '.join(missing)} there (is it GRIST's repository?)")
    try:
        data = mnist_files(repo)[2]
    except FileNotFoundError as exc:
        ap.error(f"--grist-repo {args.grist_repo}: {exc}")
    if not 0 < args.minutes <= 600:
        ap.error(f"--minutes: {args.minutes:g} is not in (0, 600]")
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = list(pool.map(lambda b: run_one(repo, b, args.minutes), args.bugs))
    for r in runs:
        print(f"{r['bug']}: {r['verdict'] or r.get('error')} ({r['iterations']} iterations)", flush=True)
    return {"data": data, "runs": runs, "flags": f"--bugs {' '.join(args.bugs)} --minutes {args.minutes:g}"}


if __name__ == "__main__":
    raise SystemExit(main())
