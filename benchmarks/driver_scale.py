"""How many quanta a second one driver takes in, with MLflow on and off, from 100 to 10,000 sites
(issues 16, 57).

The driver runs ``cdeepfuzz run``'s own code (the run-state store, summary.json, MLflow in SQLite,
Parquet, the bug store) against simulated actors (``benchmarks/simulated_actors.py``): every quantum
is answered at once, so what is measured is the driver's own bookkeeping, not the targets. Targets of
100 suspect ops each, one op in ten a bug (found at its 8th step, a real finding folder written by the
actor), the others spend ``max_steps``; quanta of ``quantum`` steps; 64 actor slots. Throughput is
quanta over the campaign's wall time from the first grant to the last result; ms / quantum is its
inverse. The driver needs 1,000 quanta a second at 1,000 sites with MLflow on (a 64-GPU cluster with
quick quanta), and the same per-quantum cost at 10,000.

    python benchmarks/driver_scale.py [--sites 100 1000 10000] [--max-steps 40] [--quantum 4]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from benchmarks._results import table, write_section  # noqa: E402
from benchmarks.simulated_actors import SimulatedActors, write_entry  # noqa: E402

OPS_PER_TARGET = 100
SLOTS = 64


def campaign_file(folder: Path, sites: int, max_steps: int, quantum: int, mlflow: bool) -> Path:
    entry = write_entry(folder)
    targets = "\n".join(f"  - {{name: t{i:04d}, entry: '{entry}'}}" for i in range(sites // OPS_PER_TARGET))
    name = f"scale-{sites}-{'mlflow' if mlflow else 'off'}"
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\ntargets:\n{targets}\n" + textwrap.dedent(f"""\
        search: {{strategy: adaptive, max_steps: {max_steps}, seed: 0, minimise: false}}
        scheduler: {{policy: share, quantum: {quantum}}}
        resources: {{num_actors: {SLOTS}, num_cpus: 1, num_gpus: 0}}
        device: cpu
        time_limit_s: 7200
        output: {folder / f'out-{name}'}
        tracking: {{enabled: {str(mlflow).lower()}}}
        """))
    return path


def measure(sites: int, max_steps: int, quantum: int, mlflow: bool, folder: Path) -> dict:
    from orchestrator.config import load_campaign
    from orchestrator.run.campaign import RunOptions, run_campaign

    path = campaign_file(folder, sites, max_steps, quantum, mlflow)
    actors = SimulatedActors(SLOTS, OPS_PER_TARGET, max_steps)
    t0 = time.perf_counter()
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False, executor=actors, known_bugs=False))
    wall = time.perf_counter() - t0
    d = dict(outcome.driver)
    assert d["sites"] == sites and outcome.exit_code == 1, (d, outcome.exit_code)
    assert outcome.bugs == min(sites, OPS_PER_TARGET) // 10, outcome.bugs   # one bug per line of the program
    d["wall_s"] = wall
    d["loop_s"] = d.get("loop_seconds", wall)
    d["quanta_per_s"] = d["quanta"] / max(1e-9, d["loop_s"])
    d["ms_per_quantum"] = 1000 * d["loop_s"] / max(1, d["quanta"])
    return d


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--quantum", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows, results = [], {}
    with tempfile.TemporaryDirectory(prefix="cdf-scale-") as tmp:
        for n in args.sites:
            for mlflow in (True, False):
                r = results[(n, mlflow)] = measure(n, args.max_steps, args.quantum, mlflow, Path(tmp))
                print(n, "mlflow" if mlflow else "off", {k: (round(v, 3) if isinstance(v, float) else v)
                                                         for k, v in r.items()}, flush=True)
                rows.append([n, "on" if mlflow else "off", r["quanta"], f"{r['quanta_per_s']:.0f}",
                             f"{r['ms_per_quantum']:.3f}", f"{r['loop_s']:.1f}", f"{r['wall_s']:.1f}"])
    body = ("## Driver throughput with simulated actors (issues 16, 57)\n\n"
            f"`cdeepfuzz run`'s code path against simulated actors (`benchmarks/simulated_actors.py`: every quantum "
            f"answered at once), {SLOTS} actor slots, targets of {OPS_PER_TARGET} suspect ops (one in ten a bug, "
            f"found at its 8th step), `max_steps: {args.max_steps}`, quanta of {args.quantum} steps, the share "
            "scheduler, MLflow in SQLite or off. Quanta / s: over the controller's loop, from the first grant to the "
            "last result.\n\n"
            + table(["sites", "MLflow", "quanta", "quanta / s", "ms / quantum", "loop s", "run s (start to end)"],
                    rows) + "\n")
    print(body)
    if not args.no_write:
        write_section("driver-scale", body, script="driver_scale",
                      args=f"--sites {' '.join(map(str, args.sites))} --max-steps {args.max_steps} "
                           f"--quantum {args.quantum}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
