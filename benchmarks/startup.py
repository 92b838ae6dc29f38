"""How long ``cdeepfuzz run`` of the quickstart takes from process start, and where the seconds go
(issue 57, item 2).

Every run is a fresh process, ``python -m orchestrator.cli run campaigns/quickstart.yaml [--local]
--profile --quiet``, timed from its spawn to its exit; its ``--profile`` report gives the phases (from
the process's start) and the heavy imports, and what is left after the report is the process's exit.
``import torch`` alone, in a fresh interpreter that exits at once (``os._exit``: no teardown, as the CLI
skips it too), is measured in the same rounds for reference, and so are
the campaign's programs alone (torch imported and every target built by its factory, no CDeepFuzz): the
wall beyond them is CDeepFuzz's own. The
modes: ``local`` (``--local``: every site in the driver), ``ray`` (an embedded Ray, as the README's
quickstart), ``local-new`` (``--local`` into a new output folder: MLflow's SQLite file is made
with its tables, as on a first run; the others reuse their folder's store), and ``one-bug``
(``--local``, a campaign of one small program with one planted bug and no optimizer,
``tests/targets/faults.py``, 30 steps), ``one-bug-new`` (the same into a new output folder). Rounds take the modes in turn, so that the machine's other
load falls on all of them alike; a first round is not counted (it makes the stores). ``--compare DIR`` also runs another checkout of CDeepFuzz (the one before a
change) the same way in every round, timed by its wall clock alone where it has no ``--profile``.

    python benchmarks/startup.py [--repeats 5] [--modes local ray local-new one-bug one-bug-new] [--compare DIR] [--keep JSON]
                                 [--no-write]
    python benchmarks/startup.py --from JSON     (the section again from kept measurements)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import table, write_section  # noqa: E402

CAMPAIGN = "campaigns/quickstart.yaml"
MODES = {"local": ["--local"], "ray": [], "local-new": ["--local"], "one-bug": ["--local"], "one-bug-new": ["--local"]}
# one-bug: a program with one planted bug and no optimizer (PyTorch's Optimizer.step imports torch._dynamo)
ONE_BUG = """\
name: one-bug
targets:
  - {name: sig, entry: tests/targets/faults.py:make_target}
search: {strategy: adaptive, max_steps: 30, seed: 0}
scheduler: {policy: round-robin, quantum: 10}
resources: {num_actors: 0}
device: cpu
"""
PHASE = re.compile(r"^  (.+?)\s+(\d+\.\d+) s  \(CPU\s+(\d+\.\d+) s; at\s+\d+\.\d+ s\)$")
IMPORT = re.compile(r"([\w.]+) (\d+\.\d+) s")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(tree: Path, mode: str, output: Path, profile: bool) -> dict:
    """One ``cdeepfuzz run`` of the quickstart from ``tree`` (a checkout): wall and CPU seconds of its
    process, its profile (phases, imports, the seconds after the report) and what it found."""
    campaign = CAMPAIGN
    if mode.startswith("one-bug"):
        output.parent.mkdir(parents=True, exist_ok=True)
        campaign = str(output.parent / "one-bug.yaml")
        Path(campaign).write_text(ONE_BUG)
    cmd = [sys.executable, "-m", "orchestrator.cli", "run", campaign, *MODES[mode], "--quiet", "--no-metrics",
           "--output", str(output)] + (["--profile"] if profile else [])
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cpu = _children_cpu()
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    reported = None
    lines = []
    for line in proc.stderr:
        if line.startswith("cdeepfuzz: profile: "):
            reported = time.perf_counter()
        lines.append(line.rstrip("\n"))
    proc.wait()
    ended = time.perf_counter()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n" + "\n".join(lines[-30:]))
    out = {"wall": ended - began, "cpu": _children_cpu() - cpu, "exit_code": proc.returncode, "phases": {},
           "phase_cpu": {}, "imports": {}}
    if reported is not None:
        out["after_report"] = ended - reported
        out["profile_total"] = float(next(x for x in lines if x.startswith("cdeepfuzz: profile: ")).split()[2])
        for line in lines:
            m = PHASE.match(line)
            if m:
                out["phases"][m.group(1)] = float(m.group(2))
                out["phase_cpu"][m.group(1)] = float(m.group(3))
            if "imports, inside the phases above:" in line:
                out["imports"] = {k: float(v) for k, v in IMPORT.findall(line.split("above:", 1)[1])}
    summary = max(output.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    totals = json.loads(summary.read_text())["totals"]
    out["steps"], out["findings"] = totals["steps"], totals["findings"]
    return out


def import_torch() -> float:
    began = time.perf_counter()
    # os._exit: the import, not the interpreter's teardown of torch (0.5 s), which the CLI skips too
    subprocess.run([sys.executable, "-c", "import os, torch; os._exit(0)"], check=True)
    return time.perf_counter() - began


# The campaign's programs alone, without CDeepFuzz: a fresh interpreter imports torch (one thread, as the
# run's worker sets it) and builds every target of the campaign with its factory, seed and arguments.
PROGRAMS = """\
import sys, torch, yaml
torch.set_num_threads(1)
from fuzz_core.loader import call_factory, load_factory
campaign = yaml.safe_load(open(sys.argv[1]))
seed = (campaign.get("search") or {}).get("seed", 0)
for t in campaign["targets"]:
    call_factory(load_factory(t["entry"]), seed, t.get("args") or {})
import os; os._exit(0)
"""


def programs_alone(tree: Path, campaign: str) -> float:
    """Seconds from spawn to exit of a process that imports torch and builds the campaign's programs."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", PROGRAMS, campaign], check=True, cwd=tree, env=env)
    return time.perf_counter() - began


def measure(args) -> dict:
    trees = {"this": ROOT} | ({"compare": Path(args.compare).resolve()} if args.compare else {})
    profiled = {name: "--profile" in (tree / "orchestrator/commands/cli.py").read_text()
                for name, tree in trees.items()}
    runs: dict[str, dict[str, list[dict]]] = {name: {m: [] for m in args.modes} for name in trees}
    torch_s: list[float] = []
    programs: dict[str, list[float]] = {"quickstart": [], "one-bug": []}
    with tempfile.TemporaryDirectory(prefix="cdf-startup-") as tmp:
        one_bug = Path(tmp) / "one-bug-alone.yaml"
        one_bug.write_text(ONE_BUG)
        for r in range(args.warmup + args.repeats):
            counted = r >= args.warmup
            t = import_torch()
            alone = {"quickstart": programs_alone(ROOT, CAMPAIGN), "one-bug": programs_alone(ROOT, str(one_bug))}
            if counted:
                torch_s.append(t)
                for name, seconds in alone.items():
                    programs[name].append(seconds)
            for mode in args.modes:
                for name, tree in trees.items():
                    output = Path(tmp) / name / (f"{mode}-{r}" if mode.endswith("-new") else mode)
                    one = run_once(tree, mode, output, profiled[name])
                    print(f"round {r}{'' if counted else ' (not counted)'} {name} {mode}: {one['wall']:.2f} s, "
                          f"{one['findings']} findings, {one['steps']} steps", flush=True)
                    if counted:
                        runs[name][mode].append(one)
    return {"repeats": args.repeats, "modes": args.modes, "import_torch": torch_s, "programs": programs, "runs": runs,
            "compare": (args.label or Path(args.compare).resolve().name) if args.compare else None}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(m: dict) -> str:
    torch_s = _median(m["import_torch"])
    rows = []
    for name, modes in m["runs"].items():
        for mode, runs in modes.items():
            if not runs:
                continue
            wall = _median([r["wall"] for r in runs])
            search = _median([r["phases"].get("search and confirmation", float("nan")) for r in runs])
            alone = _median(m.get("programs", {}).get("one-bug" if mode.startswith("one-bug") else "quickstart", []))
            rows.append([m["compare"] if name == "compare" else name, mode, f"{wall:.2f}", f"{wall - torch_s:.2f}",
                         f"{alone:.2f}" if alone == alone else "-",
                         f"{wall - alone:.2f}" if alone == alone else "-",
                         f"{_median([r['cpu'] for r in runs]):.2f}",
                         f"{search:.2f}" if search == search else "-",
                         f"{_median([r['after_report'] for r in runs if 'after_report' in r]):.2f}"
                         if any("after_report" in r for r in runs) else "-",
                         f"{runs[0]['findings']} / {runs[0]['steps']}"])
    head = ["checkout", "mode", "wall s", "wall - import torch s", "its programs alone s",
            "wall - programs alone s", "CPU s (driver)", "search and confirmation s",
            "exit s (after the report)", "findings / steps"]
    if not m["compare"]:
        head, rows = head[1:], [row[1:] for row in rows]
    counts = sorted({len(runs) for modes in m["runs"].values() for runs in modes.values() if runs})
    rounds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    text = [f"Medians of {rounds} rounds; `import torch` alone in a fresh interpreter: {torch_s:.2f} s "
            f"(same rounds; it exits without the interpreter's teardown, which the CLI skips too). The quickstart: 3 programs, 6 sites searched, 707 steps; one-bug: 1 program, "
            f"its one site; CPU is the driver process's (with Ray, the actor's is not in it). Its programs "
            f"alone: a fresh interpreter that imports torch and builds the campaign's programs with their "
            f"factories, without CDeepFuzz (same rounds): what is left of the wall beyond it is CDeepFuzz's "
            f"own (the search, which runs the programs, included).", "",
            table(head, rows), ""]
    if m["compare"]:
        paired = []
        for mode, runs in m["runs"]["this"].items():
            diffs = sorted(a["wall"] - b["wall"] for a, b in zip(runs, m["runs"]["compare"][mode]))
            if diffs:
                paired.append(f"`{mode}` {_median(diffs):+.2f} s (quartiles {diffs[len(diffs) // 4]:+.2f}, "
                              f"{diffs[(3 * len(diffs)) // 4]:+.2f})")
        text += [f"This checkout minus {m['compare']}, round by round (each round runs both under the same "
                 f"load), median wall: " + "; ".join(paired) + ".", ""]
    for mode, runs in m["runs"]["this"].items():
        if not runs or not runs[0]["phases"]:
            continue
        names = list(runs[0]["phases"])
        text.append(f"Phases of `{mode}` (medians, from process start; CPU: the driver process's, every thread):")
        text.append("")
        text.append(table(["phase", "s", "CPU s"],
                          [[n, f"{_median([r['phases'].get(n, 0.0) for r in runs]):.2f}",
                            f"{_median([r['phase_cpu'].get(n, 0.0) for r in runs]):.2f}"] for n in names]
                          + [["exit (after the report)", f"{_median([r['after_report'] for r in runs]):.2f}", ""]]))
        imports = sorted({k for r in runs for k in r["imports"]})
        text.append("")
        text.append("Imports inside those phases (median s): " + ", ".join(
            f"{k} {_median([r['imports'].get(k, 0.0) for r in runs]):.2f}" for k in imports) + ".")
        text.append("")
    return "\n".join(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="rounds not counted (the first makes the stores)")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--compare", metavar="DIR", help="another checkout of CDeepFuzz, run the same way")
    ap.add_argument("--label", help="what the --compare checkout is (its commit, say; default: its folder's name)")
    ap.add_argument("--no-write", action="store_true", help="print the tables only (leave RESULTS.md)")
    ap.add_argument("--keep", metavar="JSON", help="also keep the measurements in this file")
    ap.add_argument("--from", dest="kept", metavar="JSON", help="measure nothing: report the kept measurements")
    ap.add_argument("--note", default="", help="a paragraph for the section (the machine's load, say)")
    ap.add_argument("--section", default="startup",
                    help="the section of RESULTS.md to write (another name keeps the default one: a quiet "
                         "machine's figures beside a loaded one's, say)")
    args = ap.parse_args()
    measured = json.loads(Path(args.kept).read_text()) if args.kept else measure(args)
    if args.keep:
        Path(args.keep).write_text(json.dumps(measured, indent=1))
    body = report(measured) + (f"\n{args.note}\n" if args.note else "")
    print(body)
    if not args.no_write:
        flags = (f"--repeats {measured['repeats']} --modes {' '.join(measured['modes'])}"
                 + (f" --compare DIR --label '{measured['compare']}'" if measured["compare"] else ""))
        title = "## A start in seconds: the quickstart from process start (issue 57)"
        if args.section != "startup":
            title += f" ({args.section})"
            flags += f" --section {args.section}"
        write_section(args.section, f"{title}\n\n" + body, "startup", flags)
    return 0


if __name__ == "__main__":
    sys.exit(main())
