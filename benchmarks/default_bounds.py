"""The default box of inputs without bounds, old rule against new, on every buggy subject (issue 20).

Each subject's own ``bounds`` are taken away, so that the engine picks the box, and every
searched op site is searched with ``adaptive`` under two defaults:

- **old**: ``+-10 x max(1, max|x|)`` of the sampled data, centred on zero (the rule before issue 20);
- **new**: the sampled data's range over several draws, grown by ``search.input_range`` (1) widths
  on each side, never across zero when the data has one sign (``fuzz_core.backends.base.data_box``).

A subject's figure is its fastest confirmed finding (steps), and whether that finding's values lie
outside the range the data ever takes (the finding's ``notes``): a finding on values the program
can never see is the trust problem this rule removes. The subject's own bounds are shown beside.

    python benchmarks/default_bounds.py [--max-steps 200] [--only NAME ...] [--no-write]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import table, write_section  # noqa: E402
from benchmarks.subjects import BUGGY  # noqa: E402


def old_box(runner) -> dict[str, tuple[float, float]]:
    ranges = runner.data_ranges()
    out = {}
    for name in runner.searched:
        lo, hi = ranges.get(name, (-1.0, 1.0))
        r = 10.0 * max(1.0, abs(lo), abs(hi))
        out[name] = (-r, r)
    return out


def run(entry: str, rule: str, max_steps: int) -> tuple[int | None, int, float, str, dict]:
    """(steps of the fastest confirmed finding or None, its count of notes, seconds, site, box)."""
    from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, search_site
    from fuzz_core.search import SearchConfig

    spec = TargetSpec("subject", entry, seed=0)
    runner = build_runner(spec)
    given = dict(runner.target.bounds)
    searched_inputs = [n for n in runner.searched]
    if rule == "old":
        runner.target.bounds = {**{k: v for k, v in given.items() if k not in searched_inputs}, **old_box(runner)}
    elif rule == "new":
        runner.target.bounds = {k: v for k, v in given.items() if k not in searched_inputs}
    box = runner.bounds(dict(runner.sample(__import__("numpy").random.default_rng(0))))
    config = SearchConfig("adaptive", max_steps, 0)
    best, notes, site_label, t0 = None, 0, "", time.perf_counter()
    for site in [s for s in discover_sites(runner, 0) if s.searched]:
        result = search_site(runner, site, config)
        if result.candidate is None or best is not None and result.steps >= best:
            continue
        finding = finding_from(runner, spec, site, config, result.candidate, result.seconds, minimise_batch=False)
        if finding.flaky:
            continue
        best, notes, site_label = result.steps, len(finding.notes), f"{site.op}@{site.location}"
    return best, notes, time.perf_counter() - t0, site_label, {k: box[k] for k in searched_inputs if k in box}


def _box(b: dict) -> str:
    return "; ".join(f"{k} [{lo:.3g}, {hi:.3g}]" for k, (lo, hi) in b.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    rows, stats = [], {r: {"found": 0, "outside": 0, "steps": []} for r in ("given", "old", "new")}
    subjects = {k: v for k, v in BUGGY.items() if not args.only or k in args.only}
    for name, entry in subjects.items():
        cells = [name]
        boxes = {}
        for rule in ("given", "old", "new"):
            steps, notes, secs, site, box = run(entry, rule, args.max_steps)
            boxes[rule] = box
            st = stats[rule]
            st["steps"].append(steps if steps is not None else args.max_steps)
            if steps is not None:
                st["found"] += 1
                st["outside"] += notes > 0
            cells.append("missed" if steps is None else f"{steps} ({secs:.1f}s)" + (" **outside data**" if notes else ""))
            print(f"{name:28s} {rule:5s} {cells[-1]:28s} {site} {_box(box)}", flush=True)
        cells += [_box(boxes["old"]), _box(boxes["new"])]
        rows.append(cells)
    summary = [[r, f"{s['found']}/{len(subjects)}", statistics.median(s["steps"]) if s["steps"] else "-",
                f"{s['outside']}/{s['found']}"] for r, s in stats.items()]
    body = "\n".join([
        "## Default boxes for inputs without bounds (issue 20)\n",
        f"Each buggy subject with its own `bounds` taken away (given: the subject's bounds, for reference), "
        f"`adaptive`, {args.max_steps} steps per op site, the fastest confirmed finding; **outside data**: the "
        "finding's values leave the range the sampled data ever takes. old: `+-10 x max(1, max|x|)` centred on "
        "zero; new: the data's range over 8 draws grown by `input_range` = 1 width on each side, never across zero "
        "for one-signed data.\n",
        table(["subject", "given", "old default", "new default", "old box", "new box"], rows), "",
        table(["box", "found", "median steps (miss = budget)", "findings outside the data"], summary)])
    print(body)
    if not args.no_write:
        write_section("default_bounds", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
