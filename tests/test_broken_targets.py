"""Broken targets never crash a campaign, on a real local Ray and with --local; the user's own message
and traceback are in summary.json, in MLflow and on the terminal; an internal error is said to be ours."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.config import load_campaign
from orchestrator.run.campaign import RunOptions, run_campaign
from records import Recorder, check_run

SUBJECT = "tests/targets/faults.py:make_target"
sys.path.insert(0, str(Path(__file__).resolve().parent / "targets"))
import faults  # noqa: E402

# target name -> (args, the user's message, whether the traceback shows the user's file)
BROKEN = {
    "factory-raises": ({"mode": "factory_raises"}, f"FileNotFoundError: {faults.ERROR}", True),
    "program-raises": ({"mode": "program_raises"}, f"ValueError: {faults.PROGRAM_ERROR}", True),
    "wrong-return": ({"mode": "wrong_return"}, "not a fuzz_core.Target", False),
    "inverted-bounds": ({"mode": "inverted_bounds"}, "low > high", True),
    "unknown-search": ({"mode": "unknown_search"}, "search names 'y'", False),
    "bad-argument": ({"hidden": -1}, "RuntimeError: Trying to create tensor with negative dimension", True),
}


def _campaign(tmp_path: Path, name: str, actors: int, targets: dict[str, dict], extra: str = "") -> Path:
    lines = "\n".join(f"  - {{name: {n}, entry: {SUBJECT}, args: {json.dumps(a)}}}" for n, a in targets.items())
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\ntargets:\n{lines}\n" + textwrap.dedent(f"""\
        search: {{strategy: adaptive, max_steps: 30, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 10}}
        resources: {{num_actors: {actors}, num_cpus: 1, num_gpus: 0}}
        device: cpu
        time_limit_s: 300
        output: {tmp_path / 'out'}
        """) + extra)
    return path


@pytest.mark.mlflow
@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_broken_targets_are_reported_and_the_campaign_goes_on(tmp_path: Path, executor, request, capsys, monkeypatch):
    if executor == "ray":
        request.getfixturevalue("ray_session")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    targets = {"ok": {}, "raises-later": {"mode": "raises_later", "after": 3},
               **{name: args for name, (args, _, _) in BROKEN.items()}}
    path = _campaign(tmp_path, f"broken-{executor}", 2 if executor == "ray" else 0, targets)
    recorder = Recorder()
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=True, live=False, observers=[recorder]))
    err = capsys.readouterr().err
    assert outcome.exit_code == 3, err              # 3 wins over 1
    summary = check_run(outcome.run_dir)
    recorder.check_once()
    assert summary["run"]["state"] == "completed" and summary["run"]["exit_code"] == 3
    by_name = {t["name"]: t for t in summary["targets"]}
    assert by_name["ok"]["status"] == "found"                      # the campaign went on
    for name, (_, message, user_frame) in BROKEN.items():
        t = by_name[name]
        assert (t["status"], t["exit_reason"], t["sites"]) == ("error", "target_error", 0), t
        assert message in t["error"] and t["traceback"], t
        assert ("tests/targets/faults.py" in t["traceback"]) is user_frame, t["traceback"]
        lines = [line for line in err.splitlines() if line.startswith(f"cdeepfuzz: target {name}:")]
        assert len(lines) == 1 and message in lines[0], err      # one line on the terminal
    later = [s for s in summary["sites"] if s["target"] == "raises-later"]
    assert later and all(s["status"] == "error" and s["exit_reason"] == "target_error"
                         and faults.PROGRAM_ERROR in s["error"] and "faults.py" in s["traceback"] for s in later)
    assert all(s["status"] == "found" for s in summary["sites"] if s["target"] == "ok")

    client = MlflowClient(outcome.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(f"broken-{executor}").experiment_id], max_results=500)
    for name, (_, message, _) in BROKEN.items():
        (run,) = [r for r in runs if r.info.run_name == f"target {name}"]
        assert run.info.status == "FAILED"
        assert run.data.tags["status"] == "error" and run.data.tags["exit_reason"] == "target_error"
        assert message in run.data.tags["error"] and run.data.tags["traceback"]
    for site in later:
        run = client.get_run(site["mlflow_run_id"])
        assert run.info.status == "FAILED" and faults.PROGRAM_ERROR in run.data.tags["error"]


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd)


def test_the_same_broken_factory_reads_the_same_from_sites_run_replay_and_fix(tmp_path: Path):
    broken = tmp_path / "broken"
    path = _campaign(tmp_path, "same", 0, {"ok": {"broken_if": str(broken)}}, "tracking: {enabled: false}\n")
    first = _cli("run", "--plain", str(path))
    assert first.returncode == 1, first.stderr
    (finding,) = (tmp_path / "out").glob("same-*/findings/*")
    broken.touch()                                     # the same factory, broken since
    expected = f"cdeepfuzz: target ok: could not be built or run: FileNotFoundError: {faults.ERROR}"
    for args in (["sites", str(path)], ["run", "--plain", str(path)], ["replay", str(finding)],
                 ["fix", str(finding), "--budget", "5"]):
        done = _cli(*args)
        assert done.returncode == 3, (args, done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.startswith("cdeepfuzz: target ok:")]
        assert len(lines) == 1 and lines[0].startswith(expected), (args, done.stderr)
        assert "Traceback (most recent call last)" not in done.stderr or args[0] != "run"


def test_a_bug_of_cdeepfuzz_is_an_internal_error_not_the_users(tmp_path: Path, capsys, monkeypatch):
    """An exception from the controller itself: exit 5, said plainly, every live site stopped; --resume finishes."""
    from orchestrator.run.controller import Controller

    path = _campaign(tmp_path, "internal", 0, {"ok": {}, "ok2": {}}, "tracking: {enabled: false}\n")
    real = Controller._quantum
    calls = []

    def failing(self, rec, out):
        calls.append(rec.site.id)
        if len(calls) == 2:
            raise KeyError("planted: a bug in the controller")
        return real(self, rec, out)

    monkeypatch.setattr(Controller, "_quantum", failing)
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=True, live=False))
    err = capsys.readouterr().err
    assert outcome.exit_code == 5
    summary = check_run(outcome.run_dir)
    run = summary["run"]
    assert (run["state"], run["exit_reason"], run["exit_code"]) == ("failed", "internal_error", 5)
    assert "planted: a bug in the controller" in run["error"] and "_quantum" in run["traceback"]
    assert "INTERNAL ERROR" in err and "bug in CDeepFuzz" in err and "--resume" in err.splitlines()[-1]
    assert not any(t["status"] == "error" for t in summary["targets"]), "never reported as the user's error"
    live = [s for s in summary["sites"] if s["status"] not in ("found", "exhausted")]
    assert live and all(s["status"] == "stopped" and s["exit_reason"] == "internal_error" for s in live)
    monkeypatch.setattr(Controller, "_quantum", real)
    resumed = run_campaign(None, None, RunOptions(progress=False, resume=str(outcome.run_dir)))
    assert resumed.exit_code == 1
    summary = check_run(outcome.run_dir)
    assert summary["run"]["state"] == "completed" and summary["run"]["resumed_times"] == 1
    assert {t["status"] for t in summary["targets"]} == {"found"}


def test_failures_are_classified_by_whose_code_raised(tmp_path: Path):
    from fuzz_core.status import ExitReason
    from orchestrator.run import failures
    from orchestrator.run.state import RunStore, StoreError

    user = tmp_path / "user_prog.py"
    user.write_text("import torch\ndef f():\n    return torch.ones(2) @ torch.ones(3)\n")
    namespace: dict = {}
    exec(compile(user.read_text(), str(user), "exec"), namespace)
    try:
        namespace["f"]()
    except RuntimeError as exc:
        mine = failures.from_exception(exc)
    assert mine.reason is ExitReason.TARGET_ERROR and mine.message.startswith("RuntimeError:")
    assert failures.where(mine).startswith(f"{user}:3 in f")
    line = failures.describe("target t", mine)
    assert line.startswith("cdeepfuzz: target t: could not be built or run: RuntimeError:") and str(user) in line
    try:
        RunStore.open_readonly(tmp_path / "nothing")            # raised by CDeepFuzz's own code
    except StoreError as exc:
        ours = failures.from_exception(exc)
    assert ours.internal
    line = failures.describe("target t", ours)
    assert "INTERNAL ERROR of CDeepFuzz" in line and failures.BUG_REPORT in line
