"""Writing one benchmark's section of benchmarks/RESULTS.md (each script owns its section)."""
from __future__ import annotations

import json
import platform
import re
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = ("# Benchmark results\n\nEach section is written by the script it names; rerun the script to "
          "refresh it. Figures are machine-independent where possible (steps, ratios measured side by "
          "side in one run); seconds are from the machine named in the section.\n")


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_section(name: str, body: str, script: str | None = None, args: str = "") -> None:
    """Replace the section ``name`` (delimited by HTML comments) or append it."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = f"benchmarks/{script or name}.py" + (f" {args}" if args else "")
    block = f"<!-- {name}:start -->\n{body.rstrip()}\n\n_Written by `{command}`, {stamp}, {machine()}._\n<!-- {name}:end -->"
    pattern = re.compile(rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)


def kept_or_measured(ap, args, kept: Path, measure, report, section: str, script: str, flags) -> int:
    """A script whose measurements are kept beside its section: ``--report-only`` rebuilds the section
    from ``kept`` (exit 2 when there is none yet); otherwise ``measure(ap, args)`` gives them, and unless
    ``--no-write`` they are kept and the section written. ``report(measurements)`` is the section's body,
    ``flags(measurements)`` the arguments its footer names."""
    if args.report_only:
        if not kept.exists():
            root = RESULTS.parent.parent
            shown = kept.relative_to(root) if kept.is_relative_to(root) else kept
            ap.error(f"--report-only: no {shown} yet (a run that writes its section keeps one)")
        measured = json.loads(kept.read_text())
    else:
        measured = measure(ap, args)
    body = report(measured)
    print(body)
    if not args.no_write:
        if not args.report_only:
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps(measured, indent=1))
        write_section(section, body, script, flags(measured))
    return 0


def table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def interleaved_cost(steps: dict, reset, repeats: int, warmup: int, base: str = "plain",
                     watched: str = "watched") -> dict:
    """Median wall and CPU seconds of each step in ``steps`` (name -> callable), run in turn after
    ``reset()`` for ``warmup + repeats`` rounds, and the median (with quartiles) of the per-round
    ratios ``watched / base`` of CPU time: each round's two steps run back to back under the same
    load, so their ratio moves less with the machine's other users than the ratio of two medians."""
    wall: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(warmup + repeats):
        for key, fn in steps.items():
            reset()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            if i >= warmup:
                wall[key].append(time.perf_counter() - t0)
                cpu[key].append(time.process_time() - c0)
    pairs = sorted(w / p for w, p in zip(cpu[watched], cpu[base]))
    return {"wall": {k: statistics.median(v) for k, v in wall.items()},
            "cpu": {k: statistics.median(v) for k, v in cpu.items()}, "repeats": repeats, "warmup": warmup,
            "paired": {"median": statistics.median(pairs), "q1": pairs[len(pairs) // 4],
                       "q3": pairs[(3 * len(pairs)) // 4]}}
