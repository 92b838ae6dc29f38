"""The quickstart, as a new user runs it, twice: every place a user looks says 2 bugs (issue 55).

The console (one BUG line each, the closing line), summary.json, JUnit, SARIF, the HTML report, MLflow (the
campaign's run, the bug runs) and ``cdeepfuzz bugs`` (2 bugs, then 2 bugs with 2 runs each) count the same
two bugs: a forward ``log`` of an underflowed softmax, and ``log(1 - sigmoid)``; the quickstart's other
sites (the backward ``log_grad`` rows, the sigmoid's ``log(p)``) reach them on their way, or nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.observers.bug_registry import BUG_EXPERIMENT
from records import check_run

QUICKSTART = "campaigns/quickstart.yaml"
BUGS = {("log", "campaigns/targets/softmax_xent_mlp.py:43:18"), ("log", "campaigns/targets/log_one_minus_sigmoid.py:43:43")}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=env, timeout=900)


@pytest.mark.mlflow
def test_the_quickstart_says_two_bugs_everywhere_and_bugs_counts_two_runs_each(tmp_path: Path):
    out = tmp_path / "runs"
    for n in (1, 2):
        junit, sarif = tmp_path / f"junit-{n}.xml", tmp_path / f"run-{n}.sarif"
        done = _cli("run", QUICKSTART, "--local", "--plain", "--output", str(out), "--junit-xml", str(junit),
                    "--sarif", str(sarif))
        assert done.returncode == 1, done.stderr[-3000:]
        err = done.stderr
        assert "INFO" not in err, err                                   # no MLflow INFO lines
        assert len([line for line in err.splitlines() if line.startswith("BUG ")]) == 2, err
        assert "cdeepfuzz: 2 bugs; summary:" in err and "as this campaign expects" in err, err
        run_dir = max(out.glob("quickstart-*"), key=lambda p: p.stat().st_mtime)
        summary = check_run(run_dir)
        assert {(b["op"], b["position"]) for b in summary["bugs"]} == BUGS
        assert summary["totals"]["bugs"] == 2 and summary["expect"]["met"]
        assert sum(s["status"] == "found" for s in summary["sites"]) == 2
        assert int(ET.parse(junit).getroot().get("failures")) == 2
        assert len(json.loads(sarif.read_text())["runs"][0]["results"]) == 2
        report = _cli("report", str(run_dir))
        assert report.returncode == 0, report.stderr
        html = (run_dir / "report" / "index.html").read_text()
        assert "<b>2 bug(s)</b>" in html and len(list((run_dir / "report" / "findings").glob("*.html"))) == 2
        client = MlflowClient(summary["run"]["tracking_uri"])
        assert client.get_run(summary["run"]["mlflow_run_id"]).data.tags["bugs"] == "2"
        bug_runs = client.search_runs([client.get_experiment_by_name(BUG_EXPERIMENT).experiment_id])
        assert len(bug_runs) == 2
        listed = _cli("bugs", "--json", "--output", str(out))
        assert listed.returncode == 0, listed.stderr
        bugs = json.loads(listed.stdout)
        assert len(bugs) == 2 and {b["runs"] for b in bugs} == {n}, bugs
        assert {(b["op"], b["position"]) for b in bugs} == BUGS
        table = _cli("bugs", "--output", str(out))                     # piped: whole lines, one per bug
        assert table.stdout.splitlines()[0] == f"2 bugs in {out / 'bugs'}" and len(table.stdout.splitlines()) == 4
