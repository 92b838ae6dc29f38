"""A campaign stopped by a real SIGTERM while its MLflow store cannot be written, then resumed: MLflow, the
run-state store and ``cdeepfuzz bugs`` end up telling the same story (issue 55, item 7).

What went wrong before: the stop's few seconds ran out with the MLflow parent and the site runs still
RUNNING and their ends spooled; ``--resume`` did not send the spool but told the user to ``sync``, and that
``sync`` replayed the stopped session's ends over the completed run (KILLED, exit 4, fewer bugs). Now a
resume sends the spool once, first, without the stopped session's ends and state tags (stale by then), and
the run's end (and any ``sync``) makes every MLflow run agree with the store; a run that agrees is never
changed.

The store is a real SQLite MLflow store; "cannot be written" is real too: another connection holds the
database's exclusive lock while the signal stops the campaign."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.observers.bug_registry import BUG_EXPERIMENT, find_bug_run
from records import check_run

SUBJECT = "tests/targets/faults.py:make_target"
MANY = "benchmarks/targets/many_logs.py:make_target"
SITE_END = {"stopped": "KILLED", "error": "FAILED", "timeout": "FAILED"}


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _agrees(run_dir: Path, summary: dict) -> None:
    """Every MLflow run of the campaign says what the store says, once each; bugs agree three ways."""
    client = MlflowClient(summary["run"]["tracking_uri"])
    parent = client.get_run(summary["run"]["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    assert {k: parent.data.tags[k] for k in ("state", "exit_reason", "exit_code", "bugs")} == {
        "state": "completed", "exit_reason": "completed", "exit_code": "1", "bugs": str(summary["totals"]["bugs"])}
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
                                  max_results=1000)
    assert len(children) == len(summary["sites"]), "one run per site: nothing created twice by the replay"
    by_id = {r.info.run_id: r for r in children}
    for site in summary["sites"]:
        run = by_id[site["mlflow_run_id"]]
        assert run.info.status == SITE_END.get(site["status"], "FINISHED"), site
        assert (run.data.tags["status"], run.data.tags["exit_reason"]) == (site["status"], site["exit_reason"]), site
    listed = _cli("bugs", "--json", "--output", str(run_dir.parent))
    assert listed.returncode == 0, listed.stderr
    bugs = {b["signature"]: b for b in json.loads(listed.stdout)}
    assert set(bugs) == {b["signature"] for b in summary["bugs"]}
    for bug in summary["bugs"]:
        assert bugs[bug["signature"]]["occurrences"] == len(bug["occurrences"])
        mirror = find_bug_run(client, client.get_experiment_by_name(BUG_EXPERIMENT).experiment_id, bug["signature"])
        assert mirror is not None and mirror.data.tags["triage"] == bugs[bug["signature"]]["triage"]


@pytest.mark.mlflow
def test_a_sigtermed_run_whose_mlflow_writes_were_spooled_resumes_into_agreement(tmp_path: Path):
    hold, mark = tmp_path / "hold", tmp_path / "in_step"
    hold.touch()
    out = tmp_path / "out"
    path = tmp_path / "stopme.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: stopme
        targets:
          - {{name: quick, entry: {SUBJECT}}}
          - {{name: logs, entry: {MANY}, args: {{ops: 6, bug_every: 2}}}}
          - {{name: held, entry: {SUBJECT}, args: {{hold: '{hold}', mark: '{mark}', after: 4}}}}
        search: {{strategy: adaptive, max_steps: 40, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 10}}
        resources: {{num_actors: 0}}
        device: cpu
        output: {out}
        """))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", "--plain", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = None
    try:
        deadline = time.monotonic() + 300
        while not mark.exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the held program never started its step"
            time.sleep(0.05)
        lock = sqlite3.connect(out / "mlflow.db", isolation_level=None, timeout=60)
        lock.execute("BEGIN EXCLUSIVE")          # MLflow's writes now fail: the stop spools them
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, err[-3000:]
    (run_dir,) = out.glob("stopme-*")
    stopped = check_run(run_dir)
    assert stopped["run"]["state"] == "stopped"
    spool = run_dir / "tracking-spool.jsonl"
    assert spool.is_file() and f"cdeepfuzz sync {run_dir}" in err, err[-3000:]
    lock.execute("ROLLBACK")
    lock.close()
    hold.unlink()

    resumed = _cli("run", "--plain", "--resume", str(run_dir))
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    assert "cdeepfuzz sync" not in resumed.stderr, "the resume sent what was spooled"
    assert not spool.exists()
    summary = check_run(run_dir)
    assert summary["run"]["state"] == "completed" and summary["run"]["resumed_times"] == 1
    assert {b["signature"] for b in stopped["bugs"]} <= {b["signature"] for b in summary["bugs"]}
    _agrees(run_dir, summary)

    synced = _cli("sync", str(run_dir))          # nothing left to send; a run that agrees is not changed
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "sent 0" in synced.stdout and "0 MLflow run(s) brought in line" in synced.stdout, synced.stdout
    _agrees(run_dir, summary)
