"""Faults: a killed actor, a killed driver, a factory that breaks the contract."""
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

from fuzz_core.engine import TargetSpec
from fuzz_core.search import SearchConfig
from fuzz_core.sites import OpSite
from orchestrator.run.executors import ActorDied, Task
from orchestrator.worker import QuantumOutcome, Resume, WorkerOptions
from records import check_run



def _site(executor, spec: TargetSpec, op: str) -> OpSite:
    found = executor.discover([spec])[spec.name]
    return next(s for s in found if s.searched and s.op == op)


def _run_to_end(executor, task: Task, deadline: float) -> list:
    """Submit ``task`` and keep resubmitting with the latest checkpoint until the site is final."""
    outcomes = []
    while time.monotonic() < deadline:
        executor.submit(task)
        done = []
        while not done:
            done = executor.wait(1.0)
        (_, outcome), = done
        outcomes.append(outcome)
        if isinstance(outcome, QuantumOutcome):
            if outcome.result.status.final:
                return outcomes
            task = Task(task.site, task.spec, task.config, task.steps, resume=Resume.at(outcome.checkpoint))
        else:
            task = Task(task.site, task.spec, task.config, task.steps, resume=task.resume)
    raise AssertionError(f"site not final in time: {outcomes}")


SLOW_SUBJECT = """
import os
import time
import importlib.util
_spec = importlib.util.spec_from_file_location("mlp_subject", {path!r})
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)

def make_target(seed=0, **args):
    target = _mod.make_target(seed=seed, **args)
    program = target.program
    def held(batch):                 # the same program; while {hold!r} exists a pass says so in
        if os.path.exists({hold!r}):   # {mark!r} and waits: the kill lands inside a step, always
            open({mark!r}, "w").close()
            while os.path.exists({hold!r}):
                time.sleep(0.02)
        return program(batch)
    target.program = held
    return target
"""


@pytest.mark.ray
@pytest.mark.parametrize("how", ["ray.kill", pytest.param("os.kill", marks=pytest.mark.slow)])
def test_killed_actor_resumes_site_from_checkpoint_and_finds_it(ray_session, tmp_path: Path, how):
    import ray

    from orchestrator.run.ray_executor import RayExecutor

    module, hold, mark = tmp_path / "slow_mlp.py", tmp_path / "hold", tmp_path / "in_step"
    module.write_text(SLOW_SUBJECT.format(path=str(Path("campaigns/targets/softmax_xent_mlp.py").resolve()),
                                          hold=str(hold), mark=str(mark)))
    executor = RayExecutor(WorkerOptions(device="cpu"), num_actors=1, num_cpus=1, num_gpus=0,
                           max_restarts=3, quantum_timeout_s=120)
    try:
        spec = TargetSpec("mlp", f"{module}:make_target", base_dir=os.getcwd())
        site = _site(executor, spec, "log")
        config = SearchConfig(strategy="grist", max_steps=100, seed=0)     # grist triggers at step 5
        # a one-step quantum to get a checkpoint, a two-step one without (the actor keeps the search live),
        # then kill the actor during the next step
        executor.submit(Task(site, spec, config, steps=1))
        (_, first), = _wait(executor)
        assert isinstance(first, QuantumOutcome) and first.checkpoint is not None
        assert first.result.steps == 1 and first.finding is None
        resume = Resume.at(first.checkpoint)
        executor.submit(Task(site, spec, config, steps=2, resume=resume, want_checkpoint=False))
        (_, second), = _wait(executor)
        assert isinstance(second, QuantumOutcome) and second.checkpoint is None and second.result.steps == 3
        assert executor.resent == 0, "the actor held the search live: the checkpoint was not sent"
        resume = Resume(first.checkpoint, ((2, False),), 3)
        pid = executor.actor_pid(0)
        hold.touch()
        executor.submit(Task(site, spec, config, steps=99, resume=resume))
        deadline = time.monotonic() + 120
        while not mark.exists():        # the actor is inside a step of the resumed search
            assert time.monotonic() < deadline, "the actor never started its step"
            time.sleep(0.02)
        if how == "ray.kill":
            ray.kill(executor.actors[0], no_restart=False)
        else:
            os.kill(pid, signal.SIGKILL)       # a segfault or the OOM killer looks the same to Ray
        (_, died), = _wait(executor)
        assert isinstance(died, ActorDied), died
        hold.unlink()
        # the restarted actor has lost the search: it asks for the checkpoint, runs the quantum since it
        # again and goes on from step 3, not from step 0
        outcomes = _run_to_end(executor, Task(site, spec, config, steps=99, resume=resume), time.monotonic() + 120)
        final = outcomes[-1]
        assert executor.resent >= 1
        assert final.result.trace[0].step == 4           # continued from where the search stood
        assert final.result.status.value == "found" and final.finding is not None
    finally:
        hold.unlink(missing_ok=True)
        executor.shutdown()


def _wait(executor):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = executor.wait(1.0)
        if done:
            return done
    raise AssertionError("no result")


def _campaign(tmp_path: Path, name: str, out: Path) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        targets:
          - {{name: sig, entry: campaigns/targets/log_one_minus_sigmoid.py:make_target}}
          - {{name: mlp, entry: campaigns/targets/softmax_xent_mlp.py:make_target}}
          - {{name: divexp, entry: campaigns/targets/div_sum_exp.py:make_target}}
        search: {{strategy: adaptive, max_steps: 1500, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 50}}
        resources: {{num_actors: 0}}
        device: cpu
        output: {out}
        """))
    return path


def _findings(summary: dict) -> set[tuple[str, str]]:
    return {(s["id"], s["finding"]) for s in summary["sites"] if s["status"] == "found"}


@pytest.mark.slow
@pytest.mark.mlflow
def test_killed_driver_resumes_with_the_same_findings(tmp_path: Path):
    cli = [sys.executable, "-m", "orchestrator.cli", "run", "--plain"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    env.pop("MLFLOW_TRACKING_URI")
    reference = subprocess.run(cli + [str(_campaign(tmp_path, "ref", tmp_path / "ref"))], env=env,
                               capture_output=True, text=True, timeout=600)
    assert reference.returncode == 1, reference.stderr
    ref_summary = json.loads(next((tmp_path / "ref").glob("*/summary.json")).read_text())

    proc = subprocess.Popen(cli + [str(_campaign(tmp_path, "ref", tmp_path / "killed"))], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    run_dir = None
    while time.monotonic() < deadline:           # kill it once a finding and a checkpoint exist
        dirs = list((tmp_path / "killed").glob("ref-*"))
        if dirs and list(dirs[0].glob("findings/*/finding.json")) and list(dirs[0].glob("checkpoints/*.json")):
            run_dir = dirs[0]
            break
        time.sleep(0.1)
    assert run_dir is not None and proc.poll() is None, "the campaign ended before it could be killed"
    proc.kill()
    proc.wait()
    before = json.loads((run_dir / "summary.json").read_text())
    assert before["run"]["state"] == "running"
    resumed = subprocess.run(cli + ["--resume", str(run_dir)], env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 1, resumed.stderr
    after = json.loads((run_dir / "summary.json").read_text())
    assert after["run"]["resumed"] is True and after["run"]["state"] == "completed"
    assert {f for f, _ in _findings(after)} == {f for f, _ in _findings(ref_summary)}
    assert len(list(run_dir.glob("findings/*/finding.json"))) == len(_findings(after))   # none duplicated
    # the same MLflow run continued, even when the killed driver had not kept its id yet
    from mlflow.tracking import MlflowClient

    client = MlflowClient(after["run"]["tracking_uri"])
    parents = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()],
                                             f"tags.`run.folder` = '{run_dir.name}'")
               if "mlflow.parentRunId" not in r.data.tags]
    assert [r.info.run_id for r in parents] == [after["run"]["mlflow_run_id"]]
    assert before["run"]["mlflow_run_id"] in (None, after["run"]["mlflow_run_id"])
    children = client.search_runs([parents[0].info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'", max_results=1000)
    per_site = [r.data.tags.get("site.id") for r in children if r.data.tags.get("site.id")]
    assert len(per_site) == len(set(per_site)) == len(after["sites"]), "one child run per site, none doubled"
    assert all(s["status"] in ("found", "exhausted") for s in after["sites"])


def test_factory_breaking_the_contract_is_a_target_error_exit_3(tmp_path: Path):
    """A factory that returns the wrong thing or bounds with low > high: its target is reported (exit 3, one
    line, the run folder written), not a configuration error that stops everything."""
    bad = tmp_path / "bad_factory.py"
    bad.write_text("def make_target(seed=0):\n    return 42\n")
    bounds = tmp_path / "bad_bounds.py"
    bounds.write_text(textwrap.dedent("""\
        import numpy as np, torch
        from fuzz_core import Target
        def make_target(seed=0):
            return Target(program=lambda b: b["x"].sum(), sample=lambda rng: {"x": np.zeros((2, 2), np.float32)},
                          bounds={"x": (1.0, -1.0)}, search=["x"])
        """))
    for entry, expected in ((f"{bad}:make_target", "not a fuzz_core.Target"), (f"{bounds}:make_target", "low > high")):
        out = tmp_path / f"out-{len(expected)}"
        path = tmp_path / "c.yaml"
        path.write_text(f"name: c\ntargets: [{{name: t, entry: '{entry}'}}]\nresources: {{num_actors: 0}}\n"
                        f"output: {out}\ntracking: {{enabled: false}}\n")
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "--plain", str(path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 3, proc.stderr
        assert "Traceback" not in proc.stderr
        (line,) = [x for x in proc.stderr.splitlines() if x.startswith("cdeepfuzz: target t:")]
        assert expected in line
        (summary,) = out.glob("c-*/summary.json")
        (target,) = json.loads(summary.read_text())["targets"]
        assert (target["status"], target["exit_reason"]) == ("error", "target_error") and expected in target["error"]


HANGING = '''
import time
import numpy as np, torch
from fuzz_core import Target

CALLS = [0]

def make_target(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 3)
    def program(b):
        CALLS[0] += 1
        if CALLS[0] > 2:          # discovery and a step run; then the program hangs (a deadlock, a stuck read)
            time.sleep(120)
        return torch.log(torch.softmax(net(b["x"]), 1)).mean()
    return Target(program=program, sample=lambda rng: {"x": rng.random((4, 4), dtype=np.float32)},
                  model=net, bounds={"x": (0.0, 1.0)}, search=["x"])
'''


@pytest.mark.slow
@pytest.mark.parametrize("actors", [0, pytest.param(2, marks=pytest.mark.ray)])
def test_hanging_quantum_is_killed_and_the_site_retired_as_timeout(tmp_path: Path, request, actors):
    """On Ray the actor is killed; with --local (num_actors 0) the quantum is interrupted in the driver."""
    from orchestrator.run.campaign import RunOptions, run_campaign
    from orchestrator.config import load_campaign

    if actors:
        request.getfixturevalue("ray_session")
    module = tmp_path / "hangs.py"
    module.write_text(HANGING)
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: hangs
        targets:
          - {{name: hangs, entry: '{module}:make_target'}}
          - {{name: mlp, entry: campaigns/targets/softmax_xent_mlp.py:make_target}}
        search: {{max_steps: 100}}
        scheduler: {{quantum: 10}}
        resources: {{num_actors: {actors}, max_restarts: 5}}
        quantum_timeout_s: 4
        device: cpu
        tracking: {{enabled: false}}
        output: {tmp_path / 'out'}
        """))
    t0 = time.monotonic()
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False))
    assert time.monotonic() - t0 < 100                     # nobody waited for the 120 s sleeps
    summary = check_run(outcome.run_dir)
    sites = {s["target"]: s for s in summary["sites"]}
    assert (sites["hangs"]["status"], sites["hangs"]["exit_reason"]) == ("timeout", "quantum_timeout"), sites["hangs"]
    assert "time limit" in sites["hangs"]["error"]
    mlp = [s for s in summary["sites"] if s["target"] == "mlp"]
    assert any(s["status"] == "found" for s in mlp), mlp     # the campaign went on
    assert summary["run"]["executor"] == ("ray" if actors else "local")


def test_replay_refuses_a_factory_outside_the_tree_unless_trusted(tmp_path: Path):
    from typer.testing import CliRunner

    from fuzz_core.engine import TargetSpec, build_runner, finding_from, search_site
    from fuzz_core.findings import write_finding
    from orchestrator.cli import app

    module = tmp_path / "elsewhere.py"
    module.write_text(HANGING.replace("if CALLS[0] > 2:", "if False:").replace("torch.softmax(net(b[\"x\"]), 1)",
                                                                            "torch.softmax(net(b[\"x\"]) * 200, 1)"))
    spec = TargetSpec("elsewhere", f"{module}:make_target")
    runner = build_runner(spec)
    site = next(s for s in runner.discover(runner.sample(np.random.default_rng(0)), 0) if s.op == "log")
    config = SearchConfig("adaptive", 50)
    result = search_site(runner, site, config)
    folder = write_finding(finding_from(runner, spec, site, config, result.candidate, result.seconds),
                           tmp_path / "finding")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    refused = CliRunner().invoke(app, ["replay", str(folder)])
    assert refused.exit_code == 2 and "outside the current directory tree" in refused.output
    trusted = CliRunner().invoke(app, ["replay", str(folder), "--trust"])
    assert trusted.exit_code == 0, trusted.output
    after = sorted(p.name for p in tmp_path.rglob("*") if "__pycache__" not in p.parts)
    assert [p for p in after if p not in before] == []        # replay writes nothing


def test_finding_folder_with_a_link_or_garbage_is_refused(tmp_path: Path):
    from fuzz_core.findings import FindingError, load_finding

    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "finding.json").write_text('{"site": {}, "target": {}}')
    outside = tmp_path / "secret.safetensors"
    outside.write_bytes(b"not a tensor file")
    (folder / "values.safetensors").symlink_to(outside)
    with pytest.raises(FindingError, match="symbolic link"):
        load_finding(folder)
    (folder / "values.safetensors").unlink()
    (folder / "values.safetensors").write_bytes(b"\x80\x04garbage pickle-looking bytes")
    with pytest.raises(FindingError, match="cannot read"):
        load_finding(folder)


def test_nothing_is_unpickled_anywhere():
    """Reproducers and checkpoints are safetensors/JSON: no pickle, no torch.load without weights_only."""
    import re

    root = Path(__file__).resolve().parent.parent
    offenders = []
    for path in list((root / "fuzz_core").rglob("*.py")) + list((root / "orchestrator").rglob("*.py")):
        text = path.read_text()
        if re.search(r"\bimport pickle\b|\bpickle\.loads?\(|\bnp\.load\([^)]*allow_pickle=True", text):
            offenders.append(path.name)
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            if "weights_only=True" not in call:
                offenders.append(f"{path.name}: {call}")
    assert offenders == []


@pytest.mark.slow
@pytest.mark.mlflow
def test_ctrl_c_stops_cleanly_closes_runs_as_killed_and_keeps_findings(tmp_path: Path):
    from mlflow.tracking import MlflowClient

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    # a shell that starts the suite in the background (nohup, "&") hands it SIGINT ignored, and
    # a child keeps an ignored signal across exec; a Python handler is reset to the default
    # there instead, so the child gets SIGINT as a terminal would (no preexec_fn: the test
    # process has Ray's threads, and code between fork and exec may then deadlock)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", "--plain",
                                 str(_campaign(tmp_path, "ctrlc", tmp_path / "out"))], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 300
    run_dir = None
    while time.monotonic() < deadline and run_dir is None:
        dirs = list((tmp_path / "out").glob("ctrlc-*"))
        if dirs and list(dirs[0].glob("findings/*/finding.json")):
            run_dir = dirs[0]
        time.sleep(0.1)
    assert run_dir is not None and proc.poll() is None
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run"]["state"] == "stopped" and summary["run"]["stopped"] == "interrupted"
    found = [s for s in summary["sites"] if s["status"] == "found"]
    assert found and all((run_dir / s["finding"] / "finding.json").is_file() for s in found)
    assert {s["status"] for s in summary["sites"]} <= {"found", "exhausted", "stopped"}
    client = MlflowClient(summary["run"]["tracking_uri"])
    parent = client.get_run(summary["run"]["mlflow_run_id"])
    assert parent.info.status == "KILLED"
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    statuses = {r.data.tags["status"]: r.info.status for r in children}
    assert statuses.get("stopped") == "KILLED" and statuses.get("found") == "FINISHED"
