"""Stopping a campaign before it completes: SIGTERM, SIGINT (Ctrl-C) and a reached time limit, with
--local and on a real local Ray. Within seconds every record says the same thing, nothing written is
lost, the exit code is 4 and the last line says how to resume. Deterministic: the program of one
target waits while a hold file exists and says so in a mark file; the signal is sent once it waits."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from records import check_run

SUBJECT = "tests/targets/faults.py:make_target"
EXIT_STOPPED = 4
STOP_WITHIN_S = 15.0
TIME_LIMIT_S = 60          # generous: a loaded machine takes seconds to start Ray and MLflow
MLFLOW_END = {"found": "FINISHED", "stopped": "KILLED", "exhausted": "FINISHED"}


def campaign(tmp_path: Path, name: str, actors: int, hold: Path, mark: Path, time_limit_s: float = 600) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        targets:
          - {{name: quick, entry: {SUBJECT}}}
          - {{name: held, entry: {SUBJECT}, args: {{hold: '{hold}', mark: '{mark}', after: 4}}}}
        search: {{strategy: adaptive, max_steps: 200, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 10}}
        resources: {{num_actors: {actors}, num_cpus: 1, num_gpus: 0}}
        device: cpu
        time_limit_s: {time_limit_s}
        output: {tmp_path / 'out'}
        """))
    return path


def start(path: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", "--plain", str(path), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(mark: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not mark.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the campaign ended before its program waited:\n{proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, "the held program never started its step"
        time.sleep(0.05)


def check_stopped(tmp_path: Path, proc: subprocess.Popen, reason: str, stopped_at: float | None) -> dict:
    """Every record says stopped with ``reason``; nothing written is lost; the last line says how to resume."""
    _, err = proc.communicate(timeout=180)
    if stopped_at is not None:
        assert time.monotonic() - stopped_at < STOP_WITHIN_S, "the campaign took too long to stop"
    assert proc.returncode == EXIT_STOPPED, err[-3000:]
    assert "Traceback" not in err and "*** SIGTERM received" not in err, err[-3000:]     # no Ray C++ dump
    (run_dir,) = (tmp_path / "out").glob("*-*/")
    assert err.strip().splitlines()[-1].endswith(f"cdeepfuzz run --resume {run_dir.as_posix().rstrip('/')}"), err
    summary = check_run(run_dir)
    run = summary["run"]
    assert (run["state"], run["exit_reason"], run["stopped"], run["exit_code"]) == ("stopped", reason, reason, 4)
    sites = {s["target"]: s for s in summary["sites"]}
    assert sites["quick"]["status"] == "found" and sites["quick"]["exit_reason"] == "triggered"
    assert (sites["held"]["status"], sites["held"]["exit_reason"]) == ("stopped", reason)
    assert {t["name"]: t["status"] for t in summary["targets"]} == {"quick": "found", "held": "stopped"}
    # MLflow says the same, runs closed: the campaign KILLED, the stopped site KILLED, the found one FINISHED
    client = MlflowClient(run["tracking_uri"])
    parent = client.get_run(run["mlflow_run_id"])
    assert parent.info.status == "KILLED"
    assert (parent.data.tags["state"], parent.data.tags["exit_reason"], parent.data.tags["exit_code"]) == (
        "stopped", reason, "4")
    for site in summary["sites"]:
        mlrun = client.get_run(site["mlflow_run_id"])
        assert mlrun.info.status == MLFLOW_END[site["status"]], site
        assert (mlrun.data.tags["status"], mlrun.data.tags["exit_reason"]) == (site["status"], site["exit_reason"])
    # nothing written lost: each committed quantum's trace is in Parquet, the finding folder is complete
    import pyarrow.dataset as ds

    from orchestrator.observers.parquet import TRACE_PARTITIONING
    traces = ds.dataset(tmp_path / "out" / "traces", partitioning=TRACE_PARTITIONING).to_table().to_pylist()
    for site in summary["sites"]:
        assert len([r for r in traces if r["site_id"] == site["id"]]) == site["steps"], site
    assert (run_dir / sites["quick"]["finding"] / "values.safetensors").is_file()
    assert not (run_dir / "tracking-spool.jsonl").exists(), "every MLflow operation was sent"
    return summary


# SIGTERM (what `ray job stop`, Kubernetes and Slurm send) on the Ray path is in the default suite;
# the other three combinations are slow
@pytest.mark.mlflow
@pytest.mark.parametrize("how, reason", [(signal.SIGTERM, "signal"),
                                         pytest.param(signal.SIGINT, "interrupted", marks=pytest.mark.slow)])
@pytest.mark.parametrize("actors", [pytest.param(0, marks=pytest.mark.slow), pytest.param(1, marks=pytest.mark.ray)])
def test_a_signal_stops_the_campaign_and_every_record_says_so(tmp_path: Path, how, reason, actors):
    hold, mark = tmp_path / "hold", tmp_path / "in_step"
    hold.touch()
    proc = start(campaign(tmp_path, f"sig-{actors}", actors, hold, mark))
    try:
        wait_for(mark, proc)
        sent = time.monotonic()
        proc.send_signal(how)
        check_stopped(tmp_path, proc, reason, sent)
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
@pytest.mark.mlflow
@pytest.mark.parametrize("actors", [0, pytest.param(1, marks=pytest.mark.ray)])
def test_a_reached_time_limit_stops_the_campaign_and_it_resumes(tmp_path: Path, actors):
    hold, mark = tmp_path / "hold", tmp_path / "in_step"
    hold.touch()               # the held program waits for good: only the time limit can end this campaign
    proc = start(campaign(tmp_path, f"tl-{actors}", actors, hold, mark, time_limit_s=TIME_LIMIT_S))
    try:
        wait_for(mark, proc)       # the quick target was found first; the held one waits
        summary = check_stopped(tmp_path, proc, "time_limit", None)
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
    run_dir = Path(summary["run"]["folder"])
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    resumed = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "--plain", "--local", "--resume",
                              str(run_dir)], env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    after = check_run(run_dir)
    assert (after["run"]["state"], after["run"]["resumed_times"]) == ("completed", 1)
    assert summary["run"]["seconds"] < TIME_LIMIT_S + 60    # the limit stopped it (after start-up)
    assert after["run"]["mlflow_run_id"] == summary["run"]["mlflow_run_id"]
    assert after["run"]["seconds"] > summary["run"]["seconds"]        # time adds up; the limit counts per run
    held = next(s for s in after["sites"] if s["target"] == "held")
    assert held["status"] == "found" and held["mlflow_run_id"] == next(
        s for s in summary["sites"] if s["target"] == "held")["mlflow_run_id"]
    client = MlflowClient(after["run"]["tracking_uri"])
    assert client.get_run(after["run"]["mlflow_run_id"]).info.status == "FINISHED"
    assert json.loads((run_dir / "summary.json").read_text())["run"]["stopped"] is None
