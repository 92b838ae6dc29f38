"""A campaign of 1,000 sites runs on this machine with two Ray actors and completes; its bookkeeping is
per change, not per site (summary.json at a cadence), and MLflow and the report stay readable."""
from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from records import check_run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def campaign_file(folder: Path, sites: int, actors: int, max_steps: int) -> Path:
    """Targets of 20 real ``log`` sites each (one in ten a bug), searched by Ray actors."""
    targets = "\n".join(f"  - {{name: t{i:03d}, entry: benchmarks/targets/many_logs.py:make_target, "
                        f"args: {{ops: 20, bug_every: 10}}}}" for i in range(sites // 20))
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


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.mlflow
def test_a_thousand_sites_with_two_actors_complete(tmp_path: Path, ray_session, monkeypatch):
    from orchestrator.commands.report import TOTAL_POINTS, write_reports
    from orchestrator.config import load_campaign
    from orchestrator.run.campaign import RunOptions, run_campaign

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    path = campaign_file(tmp_path, sites=1000, actors=2, max_steps=4)
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False))
    assert outcome.exit_code == 1
    summary = check_run(outcome.run_dir)
    totals = summary["totals"]
    assert totals["sites"] == 1000 and totals["targets"] == 50
    assert totals["pending"] == totals["searching"] == totals["stopped"] == totals["error"] == 0
    assert totals["found"] >= 100 and totals["found"] + totals["exhausted"] == 1000, totals
    driver = outcome.driver
    assert driver["status_changes"] >= 2000
    assert driver["summary_writes"] < driver["status_changes"] / 20      # at a cadence, not per change
    assert driver["status_seconds"] / driver["status_changes"] < 0.01    # a change costs O(1), not O(sites)

    # MLflow reads as target runs and finding runs, not 1,000 site runs
    client = MlflowClient(outcome.tracking_uri)
    exp = client.get_experiment_by_name("scale-1000")
    parent = summary["run"]["mlflow_run_id"]
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}'", max_results=1000)
    targets = [r for r in children if r.info.run_name.startswith("target ")]
    findings = [r for r in children if not r.info.run_name.startswith("target ")]
    assert len(targets) == 50 and len(findings) == totals["bugs"]      # one MLflow run per bug, not per site
    assert {r.info.status for r in children} == {"FINISHED"}
    assert all(int(r.data.tags["sites.exhausted"]) + int(r.data.tags["sites.found"]) == 20 for r in targets)
    assert any(k.startswith("best_loss.") for k in targets[0].data.metrics)

    (page,) = write_reports(outcome.run_dir)    # one page: every site's series, within the report's points
    body = re.search(r'<script type="application/json" id="cdf-data">(.*?)</script>', page.read_text(), re.S)[1]
    series = json.loads(body.replace("<\\/", "</"))["sites"]
    assert len(series) == 1000 and sum(len(s["s"]) for s in series.values()) <= TOTAL_POINTS + 2 * 1000
    assert json.loads((outcome.run_dir / "summary.json").read_text())["totals"]["sites"] == 1000
