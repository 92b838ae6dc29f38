"""An MLflow server that goes away mid-campaign and comes back: nothing is lost."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.mlflow, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(tmp: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
         "--artifacts-destination", str(tmp / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                time.sleep(1.0)
                return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise AssertionError("mlflow server did not start")


def _stop(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _started(root: Path) -> bool:
    """summary.json names the campaign's MLflow run and a site that found its bug."""
    for path in root.glob("outage-*/summary.json"):
        try:
            summary = json.loads(path.read_text())
        except ValueError:
            return False
        return bool(summary["run"]["mlflow_run_id"]) and any(s["status"] == "found" for s in summary["sites"])
    return False


def test_tracking_outage_loses_no_metric_and_no_finding(tmp_path: Path):
    from mlflow.tracking import MlflowClient

    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    server = _start_server(tmp_path, port)
    campaign = tmp_path / "outage.yaml"
    campaign.write_text(textwrap.dedent(f"""\
        name: outage
        targets:
          - {{name: sig, entry: campaigns/targets/log_one_minus_sigmoid.py:make_target}}
          - {{name: mlp, entry: campaigns/targets/softmax_xent_mlp.py:make_target}}
          - {{name: divexp, entry: campaigns/targets/div_sum_exp.py:make_target}}
        search: {{strategy: adaptive, max_steps: 600, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 40}}
        resources: {{num_actors: 0}}
        device: cpu
        output: {tmp_path / 'runs'}
        """))
    run = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(campaign), "--plain",
                            "--tracking-uri", uri], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300  # the runs exist and a first finding went through: then the outage
        while not _started(tmp_path / "runs"):
            assert run.poll() is None and time.monotonic() < deadline, "the campaign never got going"
            time.sleep(0.2)
        _stop(server)                      # the server goes away mid-campaign
        time.sleep(6)
        server = _start_server(tmp_path, port)
        out, _ = run.communicate(timeout=600)
        assert run.returncode == 1, out
        run_dir = next((tmp_path / "runs").glob("outage-*"))
        summary = json.loads((run_dir / "summary.json").read_text())
        spool = run_dir / "tracking-spool.jsonl"
        if spool.exists() and spool.read_text().strip():     # whatever the writer had not resent yet
            synced = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sync", str(run_dir)],
                                    capture_output=True, text=True, timeout=300)
            assert synced.returncode == 0, synced.stdout + synced.stderr
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("outage")
        runs = client.search_runs([exp.experiment_id], max_results=1000)
        children = {r.data.tags["site.id"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
        assert set(children) == {s["id"] for s in summary["sites"]}
        for site in summary["sites"]:
            child = children[site["id"]]
            history = client.get_metric_history(child.info.run_id, "suspect_loss")
            assert sorted(m.step for m in history) == list(range(1, site["steps"] + 1)), site["label"]
            assert child.data.tags["status"] == site["status"]
            if site["status"] == "found":
                names = {a.path for a in client.list_artifacts(child.info.run_id, "finding")}
                assert "finding/finding.json" in names
        assert sum(1 for s in summary["sites"] if s["status"] == "found") >= 3
    finally:
        if run.poll() is None:
            run.kill()
        _stop(server)
