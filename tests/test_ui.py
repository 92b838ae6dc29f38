"""``cdeepfuzz ui``: a run in MLflow at its campaign's experiment, which MLflow 3 shows as a table of runs
(``mlflow.experimentKind``), not as its GenAI pages (issue 55, item 9)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.observers.tracking_sender import EXPERIMENT_KIND, RUNS_KIND


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ui")
    path = tmp / "ui.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: ui-camp
        targets:
          - {{name: t, entry: tests/targets/faults.py:make_target}}
        search: {{strategy: adaptive, max_steps: 10, seed: 0}}
        resources: {{num_actors: 0}}
        device: cpu
        output: {tmp / 'runs'}
        """))
    done = CliRunner().invoke(app, ["run", str(path), "--local", "--quiet"], env={"MLFLOW_TRACKING_URI": ""})
    assert done.exit_code == 1, done.output
    return next((tmp / "runs").glob("ui-camp-*"))


def _experiment(run_dir: Path):
    from mlflow.tracking import MlflowClient

    summary = json.loads((run_dir / "summary.json").read_text())
    client = MlflowClient(summary["run"]["tracking_uri"])
    return client, client.get_experiment_by_name("ui-camp")


@pytest.mark.mlflow
def test_a_campaigns_experiment_is_made_as_a_runs_experiment(tracked_run: Path):
    _, experiment = _experiment(tracked_run)
    assert experiment.tags[EXPERIMENT_KIND] == RUNS_KIND


@pytest.mark.mlflow
def test_ui_names_the_experiment_and_serves_a_local_store(tracked_run: Path, monkeypatch):
    """The command it starts (the one unit-level seam: the server itself is the slow test below)."""
    client, experiment = _experiment(tracked_run)
    client.delete_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND)       # one made before: told so here
    started = []
    monkeypatch.setattr(os, "execv", lambda exe, cmd: started.append(cmd))
    res = CliRunner().invoke(app, ["ui", str(tracked_run), "--port", "5123"])
    assert res.exit_code == 0, res.output
    assert f"http://127.0.0.1:5123/#/experiments/{experiment.experiment_id}" in res.output
    ((*_, _host, _h, port),) = [cmd[-4:] for cmd in started]
    assert started[0][1:4] == ["-m", "mlflow", "ui"] and port == "5123"
    assert client.get_experiment(experiment.experiment_id).tags[EXPERIMENT_KIND] == RUNS_KIND
    missing = CliRunner().invoke(app, ["ui", str(tracked_run.parent / "nope")])
    assert missing.exit_code == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.mlflow
@pytest.mark.slow          # an MLflow server's start-up: tens of seconds on a loaded machine
def test_ui_serves_the_experiment_for_real(tracked_run: Path):
    _, experiment = _experiment(tracked_run)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", str(tracked_run), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    try:
        first = proc.stdout.readline()
        assert f"#/experiments/{experiment.experiment_id}" in first, first
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get?experiment_id={experiment.experiment_id}"
        deadline, body = time.monotonic() + 180, None
        while body is None and time.monotonic() < deadline:
            try:
                body = json.loads(urllib.request.urlopen(url, timeout=5).read())
            except OSError:
                time.sleep(1)
        assert body is not None, "the MLflow UI never answered"
        tags = {t["key"]: t["value"] for t in body["experiment"]["tags"]}
        assert body["experiment"]["name"] == "ui-camp" and tags[EXPERIMENT_KIND] == RUNS_KIND
    finally:
        proc.terminate()
        proc.wait(30)
