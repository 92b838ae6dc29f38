"""The driver takes a turn's results in one transaction and exports traces, MLflow metrics, findings and
the bug database from the store afterwards, off its loop (issue 57): a driver killed with SIGKILL in the
middle of a batch loses nothing it committed. After a resume, every step of every site is in Parquet and
in MLflow exactly once, every finding has its Parquet row and its occurrence in the bug database, and
the records agree (records.check_run).

The actors are simulated (``benchmarks/simulated_actors.py``: quanta answered at once, finding folders
and checkpoints written by the "actors" themselves), so that many turns of the loop take seconds; the
driver is the real one. The kill comes before the N-th commit of the run-state store."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

from fuzz_core.dedupe import BugDatabase
from records import check_run

WRAPPER = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, os.getcwd())
from orchestrator.run import state

KILL_AT = int(os.environ.get("CDF_KILL_AT_COMMIT", "0"))
real = state.RunStore.commit

def commit(self):
    if KILL_AT and self.commits + 1 == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)       # before the batch commits: it is lost
    real(self)

state.RunStore.commit = commit
if KILL_AT:                  # the run to kill exports nothing before it dies: the resume must export it all
    from orchestrator.observers import exporter
    exporter.INTERVAL_S = 3600.0
if __name__ == "__main__":
    from benchmarks.simulated_actors import SimulatedActors
    from orchestrator.config import load_campaign
    from orchestrator.run.campaign import RunOptions, run_campaign

    path, resume = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
    actors = SimulatedActors(slots=8, ops=50, max_steps=40)
    options = RunOptions(progress=False, executor=actors, known_bugs=False, resume=resume)
    out = run_campaign(None if resume else load_campaign(Path(path)), None if resume else Path(path), options)
    sys.exit(out.exit_code)
"""


def _run(tmp_path: Path, *args: str, kill_at: int = 0) -> subprocess.CompletedProcess:
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["CDF_KILL_AT_COMMIT"] = str(kill_at)
    return subprocess.run([sys.executable, str(wrapper), *args], env=env, capture_output=True, text=True,
                          timeout=900, start_new_session=True)


@pytest.mark.mlflow
@pytest.mark.parametrize("kill_at", [12, 40])
def test_a_driver_killed_mid_batch_loses_nothing_it_committed(tmp_path: Path, kill_at: int):
    from benchmarks.simulated_actors import write_entry

    entry = write_entry(tmp_path)
    path = tmp_path / "batches.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: batches
        targets:
          - {{name: a, entry: '{entry}'}}
          - {{name: b, entry: '{entry}'}}
        search: {{strategy: adaptive, max_steps: 40, seed: 0, minimise: false}}
        scheduler: {{policy: share, quantum: 4}}
        resources: {{num_actors: 8}}
        device: cpu
        output: {tmp_path / 'out'}
        """))
    killed = _run(tmp_path, str(path), kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (run_dir,) = (tmp_path / "out").glob("batches-*")
    db = sqlite3.connect(run_dir / "state.db")
    committed = db.execute("SELECT COUNT(*) FROM traces").fetchone()[0]
    db.close()
    assert committed > 0 and not (run_dir / "exported.json").exists(), "the case: committed, not exported"
    resumed = _run(tmp_path, str(path), str(run_dir))
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    summary = check_run(run_dir)
    assert summary["run"]["state"] == "completed" and summary["run"]["resumed_times"] == 1
    steps = {s["id"]: s["steps"] for s in summary["sites"]}
    assert len(steps) == 100 and all(s["status"] in ("found", "exhausted") for s in summary["sites"])

    from orchestrator.observers.parquet import read_findings, read_traces

    traces = read_traces(tmp_path / "out", "batches").to_pylist()
    by_site: dict[str, list[int]] = defaultdict(list)
    for row in traces:
        by_site[row["site_id"]].append(row["step"])
    for site, n in steps.items():                       # every committed step exported once, none missing
        assert sorted(by_site[site]) == list(range(1, n + 1)), site

    folders = {o["folder"] for b in summary["bugs"] for o in b["occurrences"]}
    rows = read_findings(tmp_path / "out", "batches").to_pylist()
    assert sorted(r["folder"] for r in rows) == sorted(f"{run_dir.name}/{f}" for f in folders)
    db = BugDatabase(tmp_path / "out")
    for bug in summary["bugs"]:
        listed = {o["folder"] for o in db.fetch(bug["signature"])["occurrences"]}
        assert listed == {f"{run_dir.name}/{o['folder']}" for o in bug["occurrences"]}

    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary["run"]["tracking_uri"])
    for site in summary["sites"]:                       # and in MLflow, once each
        history = [m.step for m in client.get_metric_history(site["mlflow_run_id"], "suspect_loss")]
        assert sorted(history) == list(range(1, site["steps"] + 1)), site["id"]
    assert not json.loads((run_dir / "exported.json").read_text()) == {}
