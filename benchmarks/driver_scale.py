"""The driver's bookkeeping as a campaign grows: milliseconds per quantum and per status change at 100
and 1,000 sites, side by side (issue 16).

Each campaign runs for real: ``cdeepfuzz run``'s own code path (the run-state store, summary.json,
MLflow in SQLite, Parquet, the bug store), two Ray actors, synthetic targets of 20 suspect ops each
(``benchmarks/targets/many_logs.py``: one op in ten a bug, the others spend their budget). The
driver's time is everything but its waits on the actors (:attr:`Controller.driver_seconds`); a status
change's time is its store transaction and its observers (:attr:`Controller.status_seconds`).
summary.json is written at a cadence from the store, so its cost no longer grows with the status
changes: before this issue it was rewritten in full at every one (34 ms at 200 sites, so quadratic).

    python benchmarks/driver_scale.py [--sites 100 1000] [--actors 2]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from benchmarks._results import table, write_section  # noqa: E402

OPS_PER_TARGET = 20
ENTRY = "benchmarks/targets/many_logs.py:make_target"


def campaign_file(folder: Path, sites: int, actors: int, max_steps: int) -> Path:
    targets = "\n".join(f"  - {{name: t{i:03d}, entry: {ENTRY}, args: {{ops: {OPS_PER_TARGET}, bug_every: 10}}}}"
                        for i in range(sites // OPS_PER_TARGET))
    path = folder / f"scale-{sites}.yaml"
    path.write_text(f"name: scale-{sites}\ntargets:\n{targets}\n" + textwrap.dedent(f"""\
        search: {{strategy: adaptive, max_steps: {max_steps}, seed: 0, minimise: false}}
        scheduler: {{policy: round-robin, quantum: {max_steps}}}
        resources: {{num_actors: {actors}, num_cpus: 1, num_gpus: 0}}
        device: cpu
        time_limit_s: 7200
        output: {folder / f'out-{sites}'}
        """))
    return path


def measure(sites: int, actors: int, max_steps: int, folder: Path) -> dict:
    from orchestrator.config import load_campaign
    from orchestrator.run.campaign import RunOptions, run_campaign

    path = campaign_file(folder, sites, actors, max_steps)
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False))
    d = dict(outcome.driver)
    assert d["sites"] == sites, d
    d["exit_code"] = outcome.exit_code
    d["ms_per_quantum"] = 1000 * d["driver_seconds"] / max(1, d["quanta"])
    d["ms_per_status_change"] = 1000 * d["status_seconds"] / max(1, d["status_changes"])
    d["ms_per_summary_write"] = 1000 * d["summary_seconds"] / max(1, d["summary_writes"])
    return d


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=4)
    args = parser.parse_args()
    rows, results = [], {}
    with tempfile.TemporaryDirectory(prefix="cdf-scale-") as tmp:
        for n in args.sites:
            r = results[n] = measure(n, args.actors, args.max_steps, Path(tmp))
            print(n, r, flush=True)
            rows.append([n, r["quanta"], r["status_changes"], f"{r['ms_per_quantum']:.2f}",
                         f"{r['ms_per_status_change']:.2f}", r["summary_writes"], f"{r['ms_per_summary_write']:.1f}",
                         f"{r['driver_seconds']:.1f}"])
    small, large = min(results), max(results)
    ratio_q = results[large]["ms_per_quantum"] / max(1e-9, results[small]["ms_per_quantum"])
    ratio_s = results[large]["ms_per_status_change"] / max(1e-9, results[small]["ms_per_status_change"])
    body = ("## Driver bookkeeping at scale (issue 16)\n\n"
            f"`cdeepfuzz run` code path, {args.actors} Ray actors, synthetic targets of {OPS_PER_TARGET} suspect "
            f"ops (`benchmarks/targets/many_logs.py`, one op in ten a bug), `max_steps: {args.max_steps}`, "
            "MLflow in SQLite (one child run per site up to 100 sites, per target and per finding above). "
            "Driver time is everything but the waits on the actors; a status change's time is its store "
            "transaction and its observers.\n\n"
            + table(["sites", "quanta", "status changes", "driver ms / quantum", "ms / status change",
                     "summary.json writes", "ms / summary write", "driver s"], rows)
            + f"\n\nFrom {small} to {large} sites the driver's time per quantum changes {ratio_q:.2f}x and per "
              f"status change {ratio_s:.2f}x: the bookkeeping per site stays flat. summary.json is written from the "
              "run-state store every 5 s at most (less often when it is big: under ~5% of the wall time) and at "
              "the end; before, it was rewritten in full at every status change (34 ms at 200 sites, so the total "
              f"grew with the square of the sites). At {large} sites its {results[large]['summary_writes']} writes "
              f"took {results[large]['summary_seconds']:.1f} s of the driver's {results[large]['driver_seconds']:.1f} s; "
              "the rest of a quantum's cost is its store transactions, its checkpoint and Parquet shard (each "
              "written atomically and fsynced) and the observers' queues, the same at any size.\n")
    print(body)
    write_section("driver-scale", body, script="driver_scale",
                  args=" ".join(f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                                for k, v in vars(args).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
