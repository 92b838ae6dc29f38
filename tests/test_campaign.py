"""Campaigns end to end: a real local Ray, a real MLflow (temporary SQLite), Parquet read back."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.run.campaign import RunOptions, run_campaign
from orchestrator.cli import app
from orchestrator.config import load_campaign
from records import Recorder, check_run

# Buggy subjects with their planted bug (op at the site that must be found).
PLANTED = {
    "softmax-mlp": ("campaigns/targets/softmax_xent_mlp.py:make_target", "log"),
    "sig": ("campaigns/targets/log_one_minus_sigmoid.py:make_target", "log"),
    "divexp": ("campaigns/targets/div_sum_exp.py:make_target", "div"),
    "expov": ("campaigns/targets/exp_overflow_softmax.py:make_target", "exp"),
}


def write_campaign(tmp_path: Path, name: str, targets: dict, *, actors: int, extra: str = "") -> Path:
    lines = "\n".join(f"  - {{name: {n}, entry: {e}}}" for n, (e, _) in targets.items())
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        targets:
        """) + lines + textwrap.dedent(f"""
        search: {{strategy: adaptive, max_steps: 60, seed: 0}}
        scheduler: {{policy: loss-slope, quantum: 10}}
        resources: {{num_actors: {actors}, num_cpus: 1, num_gpus: 0}}
        device: cpu
        time_limit_s: 300
        output: {tmp_path / 'runs'}
        """) + extra)
    return path


def summary_of(outcome) -> dict:
    return json.loads(Path(outcome.summary).read_text())


def check_planted_found(summary: dict, targets: dict) -> None:
    found = {(s["target"], s["op"]) for s in summary["sites"] if s["status"] == "found"}
    for name, (_, op) in targets.items():
        assert (name, op) in found, f"planted bug {name}:{op} not found: {summary['sites']}"


def test_local_campaign_writes_summary_findings_and_replays(tmp_path: Path):
    targets = dict(list(PLANTED.items())[:2])
    path = write_campaign(tmp_path, "local", targets, actors=0, extra="tracking: {enabled: false}\n")
    recorder = Recorder()
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False, observers=[recorder]))
    assert outcome.exit_code == 1
    summary = check_run(outcome.run_dir)
    recorder.check_once()
    assert summary["schema_version"] == 3
    assert summary["run"]["state"] == "completed" and summary["run"]["exit_code"] == 1
    assert summary["run"]["exit_reason"] == "completed"
    assert {s["exit_reason"] for s in summary["sites"] if s["status"] == "exhausted"} <= {"budget_spent"}
    assert all(t["status"] == "found" and t["exit_reason"] == "triggered" for t in summary["targets"])
    check_planted_found(summary, targets)
    for site in summary["sites"]:
        assert set(site) >= {"id", "label", "target", "op", "hazard", "location", "status", "steps",
                             "seconds", "best_loss", "finding"}
        assert not site["location"].startswith("/")
        if site["status"] == "found":
            folder = outcome.run_dir / site["finding"]
            assert (folder / "finding.json").is_file() and (folder / "values.safetensors").is_file()
            assert (folder / "test_reproducer.py").is_file()
            report = json.loads((folder / "finding.json").read_text())
            assert report["first_op"]["kind"] == site["kind"]
            assert report["site"]["id"] == site["id"] if not site["found_by"] else report["site"]["label"] == site["found_by"]
            assert report["minimised"]["batch_size"] == 1
            result = CliRunner().invoke(app, ["replay", str(folder)])
            assert result.exit_code == 0, result.output
            assert "reproduced" in result.output


@pytest.mark.ray
@pytest.mark.mlflow
@pytest.mark.slow
def test_ray_campaign_with_mlflow_and_parquet(tmp_path: Path, ray_session, monkeypatch):
    import duckdb
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from orchestrator.observers.parquet import TRACE_PARTITIONING

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    path = write_campaign(tmp_path, "ray-e2e", PLANTED, actors=2)
    recorder = Recorder()
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False, observers=[recorder]))
    summary = check_run(outcome.run_dir)
    recorder.check_once()
    assert outcome.exit_code == 1
    assert len(summary["targets"]) >= 3 and len(summary["sites"]) >= 8
    check_planted_found(summary, PLANTED)
    assert summary["run"]["executor"] == "ray"

    client = MlflowClient(outcome.tracking_uri)
    exp = client.get_experiment_by_name("ray-e2e")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].data.params["search.strategy"] == "adaptive"
    assert parents[0].info.run_id == summary["run"]["mlflow_run_id"]
    assert {k: parents[0].data.tags[k] for k in ("state", "exit_reason", "exit_code")} == {
        "state": "completed", "exit_reason": "completed", "exit_code": "1"}
    assert len(children) == len(summary["sites"])
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in children)
    assert all(r.info.status == "FINISHED" for r in runs)
    by_id = {r.info.run_id: r for r in children}
    for site in summary["sites"]:        # every record says the same thing
        tags = by_id[site["mlflow_run_id"]].data.tags
        assert (tags["site.id"], tags["status"], tags["exit_reason"]) == (site["id"], site["status"],
                                                                          site["exit_reason"])
    found = [r for r in children if r.data.tags.get("status") == "found"]
    assert len(found) == sum(1 for s in summary["sites"] if s["status"] == "found")
    for run in found:
        tags = run.data.tags
        assert {"site.op", "site.location", "site.target", "signature", "bug.run_id"} <= set(tags)
        assert tags["triage"] == "new"
        if not tags.get("found_by"):             # its own search found it: the finding's files are its own
            history = client.get_metric_history(run.info.run_id, "suspect_loss")
            assert history and [m.step for m in history] == sorted(m.step for m in history)
            names = {a.path for a in client.list_artifacts(run.info.run_id, "finding")}
            assert {"finding/finding.json", "finding/values.safetensors"} <= names
    assert {r.data.tags["signature"] for r in found} <= {b["signature"] for b in summary["bugs"]}

    root = tmp_path / "runs"
    traces = pd.read_parquet(root / "traces", partitioning=TRACE_PARTITIONING)
    assert set(traces["site_id"]) == {s["id"] for s in summary["sites"]}
    assert len(traces) == sum(s["steps"] for s in summary["sites"])
    con = duckdb.connect()
    n = con.execute(f"select count(*) from read_parquet('{root}/findings/**/*.parquet', hive_partitioning=true)"
                    ).fetchall()[0][0]
    assert n == summary["totals"]["findings"]

    result = CliRunner().invoke(app, ["bugs", "--output", str(root), "--json", "--campaign", "ray-e2e"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)       # bugs, not runs: one row per signature
    assert {b["signature"] for b in listed} == {b["signature"] for b in summary["bugs"]}
    assert all(b["triage"] == "new" and b["campaigns"] == ["ray-e2e"] and b["occurrences"] >= 1 and b["runs"] == 1
               and (Path(b["reproducer"]) / "finding.json").is_file() for b in listed)


@pytest.mark.ray
def test_fractional_gpus_pack_actors_on_logical_gpu(ray_session):
    import ray

    from orchestrator.run.ray_executor import RayExecutor
    from orchestrator.worker import WorkerOptions

    executor = RayExecutor(WorkerOptions(device="cpu"), num_actors=2, num_cpus=0.5, num_gpus=0.5,
                           max_restarts=0, quantum_timeout_s=60)
    try:
        ids = ray.get([a.gpu_ids.remote() for a in executor.actors], timeout=60)
        assert all(len(i) == 1 for i in ids)          # each actor holds a share of one GPU
        assert len({str(i[0]) for i in ids}) == 1      # two halves of the same logical GPU
    finally:
        executor.shutdown()


def test_the_scheduler_hears_which_sites_report_log_space_losses(tmp_path: Path, monkeypatch):
    """A division's loss is log-space, an exp's is not: the controller passes on what the
    search measured, so loss-slope reads each on its own scale (in process, no Ray)."""
    from orchestrator.scheduler import LossSlopeScheduler

    heard: dict[str, bool] = {}
    on_progress = LossSlopeScheduler.on_progress

    def spy(self, progress):
        if progress.losses:
            heard[progress.site_id] = progress.log_space
        return on_progress(self, progress)

    monkeypatch.setattr(LossSlopeScheduler, "on_progress", spy)
    path = write_campaign(tmp_path, "logspace", {"expov": PLANTED["expov"]}, actors=1,
                          extra="tracking: {enabled: false}\n")
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False, local=True))
    ops = {s["id"]: s["op"] for s in summary_of(outcome)["sites"]}
    assert {ops[i] for i in heard} == {"exp", "div"}, (heard, ops)
    assert all(heard[i] == (ops[i] == "div") for i in heard), (heard, ops)


def test_terminal_and_summary_say_what_was_found_and_how_close_the_rest_came(tmp_path: Path, capsys):
    """Plain terminal lines: ``BUG n: <op> (<phase>) at <path:line:col>: <hazard> [...] -> <folder>`` once per
    bug, and an exhausted site's line ends with the out-of-reach probe's message, which summary.json keeps."""
    targets = {"sig": PLANTED["sig"]}
    path = write_campaign(tmp_path, "reach", targets, actors=0, extra="tracking: {enabled: false}\n")
    path.write_text(path.read_text().replace("max_steps: 60", "max_steps: 30"))
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=True, live=False))
    err = capsys.readouterr().err
    summary = check_run(outcome.run_dir)
    assert summary["bugs"]
    lines = [x for x in err.splitlines() if x.startswith("BUG ")]
    assert len(lines) == len(summary["bugs"]), err                   # one line per bug, not per finding
    for n, bug in enumerate(summary["bugs"], 1):
        assert lines[n - 1].startswith(f"BUG {n}: {bug['op']} ({bug['phase']}) at {bug['position']}: "), err
        assert bug["occurrences"][0]["folder"] in lines[n - 1]
    assert f"cdeepfuzz: {len(summary['bugs'])} bug" in err
    exhausted = [s for s in summary["sites"] if s["status"] == "exhausted"]
    assert exhausted, "the sigmoid's first log site is out of reach within [-3, 3] at 30 steps"
    for s in exhausted:
        assert s["reach"] and s["reach"]["probe_steps"] > 0 and s["reach"]["message"], s
        line = next(x for x in err.splitlines() if f"{s['label']} exhausted" in x)
        assert line.endswith("; " + s["reach"]["message"]), line
    for s in summary["sites"]:                 # a found site says nothing of a probe: its op went non-finite
        if s["status"] == "found":
            line = next(x for x in err.splitlines() if f"{s['label']} found" in x)
            assert "would trigger" not in line and "not triggered" not in line, line
