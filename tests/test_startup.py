"""A start in seconds: recording ops imports no ``torch._dynamo`` (until something compiles), and
``cdeepfuzz run --profile`` says where the seconds of a run went, from the start of its process.

Each check runs in a fresh interpreter: this one may have imported ``torch._dynamo`` already."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator import phases

REPO = Path(__file__).resolve().parent.parent

# A program with a model and a suspect op, searched a few steps: the recorder, its backward (the
# suspect loss's gradient) and the engine's confirmation all run; no optimizer (PyTorch's own
# Optimizer.step imports torch._dynamo).
PROGRAM = textwrap.dedent("""\
    import sys

    import numpy as np
    import torch

    from fuzz_core import Target
    from fuzz_core.backends.torch import TorchRunner
    from fuzz_core.engine import discover_sites, search_site
    from fuzz_core.search import SearchConfig

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)

    def program(batch):
        return -torch.log(torch.softmax(lin(batch["x"]) * 30, 1)).sum()

    def sample(rng):
        return {"x": rng.uniform(-1, 1, size=(2, 4)).astype(np.float32)}

    runner = TorchRunner("t", Target(program=program, sample=sample, model=lin, bounds={"x": (-1.0, 1.0)},
                                     search=["x"]))
    sites = [s for s in discover_sites(runner, 0) if s.searched]
    result = search_site(runner, sites[0], SearchConfig("adaptive", 30, 0, False))
    print("sites", len(sites), "steps", result.steps)
    print("dynamo before", "torch._dynamo" in sys.modules)
    {after}
    """)


def _python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_recorder_imports_no_dynamo_until_something_compiles_then_runs_with_it_switched_off():
    after = textwrap.dedent("""\
        import torch._dynamo
        from fuzz_core.backends.torch_recorder import RecordingMode

        again = [s for s in discover_sites(runner, 0) if s.searched]
        print("same sites", [s.id for s in again] == [s.id for s in sites])
        compiled = torch.compile(program, backend="eager")        # under the recorder: run as written
        runner.target.program = compiled
        print("same sites compiled", [s.id for s in discover_sites(runner, 0) if s.searched] == [s.id for s in sites])
        switched_off = RecordingMode.__torch_dispatch__.__wrapped__.__dynamo_disable
        print("dynamo's own", getattr(switched_off, "_torchdynamo_disable", False)
              and switched_off.__module__.startswith("torch._dynamo"))
        """)
    out = _python(PROGRAM.replace("{after}", after))
    assert out.returncode == 0, out.stderr
    assert "sites " in out.stdout and "sites 0" not in out.stdout, out.stdout
    assert "dynamo before False" in out.stdout, out.stdout          # recorded and searched without it
    for line in ("same sites True", "same sites compiled True", "dynamo's own True"):
        assert line in out.stdout, out.stdout + out.stderr


def test_profile_prints_each_phase_from_process_start_and_the_heavy_imports(tmp_path: Path):
    campaign = tmp_path / "one.yaml"
    campaign.write_text(textwrap.dedent(f"""\
        name: one
        targets:
          - {{name: sig, entry: tests/targets/faults.py:make_target}}
        search: {{strategy: adaptive, max_steps: 10, seed: 0, minimise: false}}
        scheduler: {{policy: round-robin, quantum: 10}}
        resources: {{num_actors: 0}}
        device: cpu
        output: {tmp_path / 'runs'}
        tracking: {{enabled: false}}
        """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(campaign), "--local", "--quiet",
                          "--profile", "--no-metrics"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode in (0, 1), out.stderr
    assert out.stdout == ""                              # the profile goes to stderr, as the closing lines
    lines = out.stderr.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("cdeepfuzz: profile: "))
    assert "from process start" in lines[head]
    phase = re.compile(r"^  (.+?)\s+(\d+\.\d+) s  \(CPU\s+(\d+\.\d+) s; at\s+(\d+\.\d+) s\)$")
    rows = [m.groups() for m in map(phase.match, lines[head + 1:]) if m]
    names = [name for name, *_ in rows]
    for name in ("python start", "CLI imports (typer, pydantic)", "campaign read", "targets built, sites found",
                 "search and confirmation", "run closed (MLflow, summary.json)"):
        assert name in names, lines[head:]
    imports = next(line for line in lines[head:] if "imports, inside the phases above" in line)
    assert "torch " in imports and "torch._dynamo" not in imports and "mlflow" not in imports, imports
    seconds = [float(wall) for _, wall, _, _ in rows]
    total = float(lines[head].split("profile: ")[1].split(" s ")[0])
    # each figure printed to 0.01 s: the sum of the rounded phases may pass the rounded total by half a
    # hundredth per figure
    assert all(s >= 0 for s in seconds) and sum(seconds) <= total + 0.005 * (len(seconds) + 1)
    assert abs(float(rows[-1][3]) - sum(seconds)) < 0.05            # "at" is where each phase ended
    assert 0 < sum(float(cpu) for _, _, cpu, _ in rows) < 2 * total   # two cores at most, and more than none


def test_a_profile_starts_at_the_process_start_and_its_phases_add_up():
    age = phases.process_age()
    if age is None:
        pytest.skip("no /proc: the profile starts at the CLI's first import")
    assert 0 < age < 24 * 3600
    profile = phases.Profile(origin=phases.PROFILE.origin, known_start=True)
    profile.mark("one")
    profile.mark("two")
    text = phases.report(profile)
    assert text.startswith("cdeepfuzz: profile: ") and "from process start" in text
    assert [line.split()[0] for line in text.splitlines()[1:3]] == ["one", "two"]
    assert profile.phases[0][1] >= profile.phases[1][1] >= 0      # "one" began at the process's start
    assert profile.phases[0][2] > 0                                # this process's CPU since it started


@pytest.mark.mlflow
def test_mlflow_is_set_up_in_a_child_process_that_the_tracker_takes_over(tmp_path: Path):
    """MLflow's import and a new store's tables happen in the child that ``start`` launches (beside the
    driver's own start), never in this process; the tracker sends through that same child."""
    import sqlite3
    import sys

    from orchestrator.observers import tracking_process
    from orchestrator.observers.tracking import Tracker

    db = tmp_path / "out" / "mlflow.db"
    uri = "sqlite:///" + db.as_posix()
    already = "mlflow" in sys.modules
    tracking_process.start(uri)
    child = tracking_process._STARTED[uri]
    tracker = Tracker(uri, "warm", tmp_path / "run")
    assert tracker._sender._proc is child and uri not in tracking_process._STARTED
    tracker.start_campaign("campaign", "run-1", {"a": 1}, {"state": "running"})
    assert tracker.flush(120) and tracker.parent_run_id
    assert tracker.close(timeout=30, status="FINISHED")
    assert child.wait(10) == 0                   # closed with the tracker
    assert already or "mlflow" not in sys.modules
    with sqlite3.connect(db) as con:             # the store's tables, made by the child
        tables = {name for (name,) in con.execute("select name from sqlite_master where type='table'")}
    assert {"experiments", "runs", "metrics"} <= tables
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(tracker.parent_run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"a": "1"}


def test_the_startup_benchmark_reads_the_profile_as_the_cli_prints_it():
    from benchmarks.startup import IMPORT, PHASE, report

    profile = phases.Profile(origin=phases.PROFILE.origin, known_start=True)
    for name in ("python start", "targets built, sites found", "search and confirmation"):
        profile.mark(name)
    profile.imports.update({"torch": 1.5, "torch._dynamo": 0.25})
    lines = phases.report(profile).splitlines()
    read = {m.group(1): float(m.group(2)) for m in map(PHASE.match, lines) if m}
    assert list(read) == ["python start", "targets built, sites found", "search and confirmation"]
    imports = next(line for line in lines if "imports, inside the phases above:" in line)
    assert dict(IMPORT.findall(imports.split("above:", 1)[1])) == {"torch": "1.50", "torch._dynamo": "0.25"}
    run = {"wall": 9.0, "cpu": 6.0, "exit_code": 1, "after_report": 0.4, "profile_total": 8.6, "steps": 707,
           "findings": 6, "phases": {"search and confirmation": 2.0}, "phase_cpu": {"search and confirmation": 1.9},
           "imports": {"torch": 1.5}}
    text = report({"repeats": 1, "modes": ["local"], "import_torch": [2.0], "compare": None,
                   "programs": {"quickstart": [5.5], "one-bug": [2.1]}, "runs": {"this": {"local": [run]}}})
    assert "| local | 9.00 | 7.00 | 5.50 | 3.50 | 6.00 | 2.00 | 0.40 | 6 / 707 |" in text, text
    assert "| search and confirmation | 2.00 | 1.90 |" in text, text
