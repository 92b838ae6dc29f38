"""The closing lines of ``cdeepfuzz run`` point somewhere real: a tracking server is opened in a browser
(there is no ``mlflow ui --backend-store-uri http://...``), and operations spooled while it did not
answer are counted, with the command that sends them."""
from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.run.campaign import tracking_line


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]        # nothing listens once the socket is closed: connection refused


@pytest.mark.parametrize("uri, line", [
    ("http://127.0.0.1:5000", "cdeepfuzz: MLflow: open http://127.0.0.1:5000 in a browser"),
    ("https://mlflow.example.org", "cdeepfuzz: MLflow: open https://mlflow.example.org in a browser"),
    ("sqlite:///runs/mlflow.db", "cdeepfuzz: MLflow: cdeepfuzz ui"),
    ("databricks", "cdeepfuzz: MLflow tracking: databricks"),
])
def test_the_tracking_line_fits_the_store(uri, line):
    assert tracking_line(uri) == line
    if line.endswith("cdeepfuzz ui"):            # a local store: the run's own UI, at its experiment
        assert tracking_line(uri, Path("runs/r-1")) == "cdeepfuzz: MLflow: cdeepfuzz ui runs/r-1"


@pytest.mark.mlflow
@pytest.mark.slow          # ~10 s: a local campaign, and the tracker's retries before it spools
def test_a_run_whose_tracking_server_never_answers_says_what_was_spooled_and_how_to_send_it(tmp_path: Path):
    uri = f"http://127.0.0.1:{_closed_port()}"
    campaign = tmp_path / "spool.yaml"
    campaign.write_text(textwrap.dedent(f"""\
        name: spool
        targets:
          - {{name: sig, entry: tests/targets/faults.py:make_target}}
        search: {{strategy: adaptive, max_steps: 20, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 10}}
        resources: {{num_actors: 0}}
        device: cpu
        output: {tmp_path / 'runs'}
        tracking: {{uri: "{uri}"}}
        """))
    result = CliRunner().invoke(app, ["run", str(campaign), "--local", "--plain", "--no-metrics"])
    assert result.exit_code == 1, result.output
    run_dir = next((tmp_path / "runs").glob("spool-*"))
    spooled = [line for line in (run_dir / "tracking-spool.jsonl").read_text().splitlines() if line.strip()]
    assert spooled
    assert "mlflow ui" not in result.output
    assert f"cdeepfuzz: MLflow: open {uri} in a browser" in result.output
    assert (f"cdeepfuzz: {len(spooled)} MLflow operation(s) were spooled while the tracking server did not answer "
            f"({run_dir / 'tracking-spool.jsonl'}); send them with: cdeepfuzz sync {run_dir}") in result.output
