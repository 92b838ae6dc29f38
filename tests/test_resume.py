"""Exact resume: a campaign whose driver was killed continues with the same allocation decisions, the
same steps and the same findings as the uninterrupted campaign (same seed, --local, one actor).

The driver is killed deterministically: before its N-th transaction of the run-state store commits
(a wrapper replaces ``RunStore.commit``; SIGKILL, nothing runs after it), at several N, and once in
the middle of a quantum (the program waits on a hold file and says so in a mark file). The scheduler
is snapshotted every few calls, so each resume restores a snapshot and replays only the calls logged
after it (the full-replay paths are tested in test_scheduler_state.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from fuzz_core.io import load_arrays
from records import check_run

WRAPPER = """
import atexit, os, signal, sys
from orchestrator.run import state

KILL_AT = int(os.environ.get("CDF_KILL_AT_COMMIT", "0"))
real = state.RunStore.commit
stores = []

def commit(self):
    if self not in stores:
        stores.append(self)
    if KILL_AT and self.commits + 1 == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)       # before the transaction commits: it is lost
    real(self)

state.RunStore.commit = commit

from orchestrator.run import controller
controller.SNAPSHOT_CALLS = int(os.environ.get("CDF_SNAPSHOT_CALLS", controller.SNAPSHOT_CALLS))
controller.CHECKPOINT_QUANTA = int(os.environ.get("CDF_CHECKPOINT_QUANTA", controller.CHECKPOINT_QUANTA))
reload = controller.RecordedScheduler.reload

def reloaded(self, fresh):
    how = reload(self, fresh)
    print(f"scheduler-from={how}", file=sys.stderr, flush=True)
    return how

controller.RecordedScheduler.reload = reloaded
atexit.register(lambda: print(f"commits={sum(s.commits for s in stores)}", file=sys.stderr, flush=True))
from orchestrator.cli import main
sys.argv = ["cdeepfuzz", *sys.argv[1:]]
main()
"""

TARGETS = {
    "softmax-mlp": "campaigns/targets/softmax_xent_mlp.py:make_target",
    "sig": "campaigns/targets/log_one_minus_sigmoid.py:make_target",
    "divexp": "campaigns/targets/div_sum_exp.py:make_target",
    "guarded": "campaigns/targets/softmax_xent_mlp_guarded.py:make_target",
}


def _campaign(tmp_path: Path, out: str, extra_target: str = "") -> Path:
    lines = "\n".join(f"  - {{name: {n}, entry: {e}}}" for n, e in TARGETS.items())
    path = tmp_path / f"{out}.yaml"
    path.write_text("name: exact\ntargets:\n" + lines + "\n" + extra_target + textwrap.dedent(f"""\
        search: {{strategy: adaptive, max_steps: 60, seed: 3}}
        scheduler: {{policy: loss-slope, quantum: 10}}
        resources: {{num_actors: 1, num_cpus: 1, num_gpus: 0}}
        device: cpu
        output: {tmp_path / out}
        """))
    return path


SNAPSHOT_CALLS = 5    # a snapshot of the scheduler every few calls: a resume loads one and replays the rest


def _env(kill_at: int = 0, checkpoint_quanta: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["CDF_KILL_AT_COMMIT"] = str(kill_at)
    env["CDF_SNAPSHOT_CALLS"] = str(SNAPSHOT_CALLS)
    if checkpoint_quanta is not None:
        env["CDF_CHECKPOINT_QUANTA"] = str(checkpoint_quanta)
    return env


def _run(tmp_path: Path, args: list[str], kill_at: int = 0, checkpoint_quanta: int | None = None
         ) -> subprocess.CompletedProcess:
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    return subprocess.run([sys.executable, str(wrapper), "run", "--plain", "--local", *args],
                          env=_env(kill_at, checkpoint_quanta), capture_output=True, text=True, timeout=900)


def _commits(proc: subprocess.CompletedProcess) -> int:
    return int(proc.stderr.rsplit("commits=", 1)[1].split()[0])


def _outcome(run_dir: Path) -> dict:
    """What must be the same: the grants, and per site its status, reason, steps, best loss and finding."""
    summary = check_run(run_dir)
    sites = {}
    for s in summary["sites"]:
        finding = None
        if s["finding"]:
            report = json.loads((run_dir / s["finding"] / "finding.json").read_text())
            values = load_arrays(run_dir / s["finding"] / "values.safetensors")
            finding = ({k: report[k] for k in ("signature", "step", "step_seed", "first_op", "batch_size", "phase")},
                       {k: np.asarray(v).tobytes() for k, v in sorted(values.items())})
        sites[s["id"]] = (s["status"], s["exit_reason"], s["steps"], s["best_loss"], finding)
    return {"allocation": json.loads((run_dir / "allocation.json").read_text()), "sites": sites,
            "exit_code": summary["run"]["exit_code"]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exact")
    done = _run(tmp, [str(_campaign(tmp, "reference"))])
    assert done.returncode == 1, done.stderr[-3000:]
    (run_dir,) = (tmp / "reference").glob("exact-*")
    outcome = _outcome(run_dir)
    assert sum(1 for s in outcome["sites"].values() if s[4]) >= 3, "the campaign finds several bugs"
    assert any(s[0] == "exhausted" for s in outcome["sites"].values()), "and spends whole budgets"
    return outcome, _commits(done)


def _resume_and_compare(tmp_path: Path, run_dir: Path, expected: dict) -> None:
    written = {p: p.stat().st_mtime_ns for p in run_dir.glob("findings/*/finding.json")}
    before = json.loads((run_dir / "summary.json").read_text())["run"]["mlflow_run_id"]
    resumed = _run(tmp_path, ["--resume", str(run_dir)])
    assert resumed.returncode == expected["exit_code"], resumed.stderr[-3000:]
    assert "scheduler-from=snapshot" in resumed.stderr      # the latest snapshot and the calls after it
    got = _outcome(run_dir)
    assert got["allocation"] == expected["allocation"]          # the same decisions, in the same order
    assert got["sites"] == expected["sites"]                    # the same steps, losses and findings
    for path, mtime in written.items():                         # a finding is written once
        assert path.stat().st_mtime_ns == mtime, path
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run"]["resumed_times"] == 1
    if before:
        assert summary["run"]["mlflow_run_id"] == before
    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary["run"]["tracking_uri"])
    children = client.search_runs([client.get_run(summary["run"]["mlflow_run_id"]).info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{summary['run']['mlflow_run_id']}'", max_results=500)
    assert sorted(r.data.tags["site.id"] for r in children) == sorted(s["id"] for s in summary["sites"])
    assert {r.info.status for r in children} == {"FINISHED"}


@pytest.mark.slow
@pytest.mark.mlflow
@pytest.mark.parametrize("at", [0.15, 0.5, 0.85])
def test_a_driver_killed_at_a_commit_resumes_exactly(tmp_path: Path, reference, at):
    expected, commits = reference
    kill_at = max(3, int(commits * at))
    # the killed run checkpoints every other quantum of a site (the others resume from the factory's state
    # and the quanta since), so the resume restores checkpoints and runs the quanta after them again
    killed = _run(tmp_path, [str(_campaign(tmp_path, "killed"))], kill_at=kill_at, checkpoint_quanta=2)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (run_dir,) = (tmp_path / "killed").glob("exact-*")
    assert json.loads((run_dir / "summary.json").read_text())["run"]["state"] == "running"
    if at > 0.5:
        assert list(run_dir.glob("checkpoints/*.safetensors")), "a checkpoint to resume from"
    _resume_and_compare(tmp_path, run_dir, expected)


@pytest.mark.slow
@pytest.mark.mlflow
def test_a_driver_killed_inside_a_quantum_resumes_exactly(tmp_path: Path):
    """The kill lands while the program of a fifth target is inside a step (hold file); the campaign then
    resumes to the same end as one never killed."""
    hold, mark = tmp_path / "hold", tmp_path / "in_step"
    extra = f"  - {{name: held, entry: tests/targets/faults.py:make_target, args: {{hold: '{hold}', mark: '{mark}', after: 3}}}}\n"
    ref = _run(tmp_path, [str(_campaign(tmp_path, "reference", extra))])      # the hold file does not exist
    assert ref.returncode == 1, ref.stderr[-3000:]
    (ref_dir,) = (tmp_path / "reference").glob("exact-*")
    expected = _outcome(ref_dir)
    hold.touch()
    wrapper = tmp_path / "wrapper.py"
    proc = subprocess.Popen([sys.executable, str(wrapper), "run", "--plain", "--local",
                             str(_campaign(tmp_path, "killed", extra))], env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not mark.exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the held program never started its step"
            time.sleep(0.05)
        proc.kill()
        proc.wait(60)
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
    (run_dir,) = (tmp_path / "killed").glob("exact-*")
    _resume_and_compare(tmp_path, run_dir, expected)
