"""Bugs, not runs: a campaign first replays the known bugs of its targets (Hypothesis' reuse phase).

A bug is found, triaged ``fixed``, its fix holds (the replay no longer triggers it: it stays fixed),
the fix is undone (the replay triggers it: ``regressed``, loudly), it is confirmed, fixed again in the
code without triage (``not reproduced``, never dropped); ``cdeepfuzz bugs`` lists it once throughout."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.observers.bug_registry import BUG_EXPERIMENT, find_bug_run
from records import check_run


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=env, timeout=900)


@pytest.mark.slow
@pytest.mark.mlflow
def test_known_bugs_are_replayed_first_fixed_regressed_not_reproduced(tmp_path: Path):
    fixed = tmp_path / "fixed"
    path = tmp_path / "kb.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: kb
        targets:
          - {{name: t, entry: tests/targets/faults.py:make_target, args: {{fixed_if: '{fixed}'}}}}
        search: {{strategy: adaptive, max_steps: 30, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 10}}
        resources: {{num_actors: 0}}
        device: cpu
        output: {tmp_path / 'out'}
        """))
    uri = "sqlite:///" + (tmp_path / "out" / "mlflow.db").as_posix()

    def campaign(expected_code: int) -> tuple[dict, str]:
        done = _cli("run", "--plain", str(path))
        assert done.returncode == expected_code, done.stderr[-3000:]
        run_dir = max((tmp_path / "out").glob("kb-*"), key=lambda p: p.stat().st_mtime)
        return check_run(run_dir), done.stderr

    def bugs() -> list[dict]:
        done = _cli("bugs", "--json", "--output", str(tmp_path / "out"))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first, _ = campaign(1)
    (bug,) = bugs()
    assert first["known_bugs"] == [] and bug["triage"] == "new" and bug["occurrences"] == 1
    sig = bug["signature"]
    assert (Path(bug["reproducer"]) / "finding.json").is_file()
    assert _cli("triage", sig, "--state", "fixed", "--output", str(tmp_path / "out")).returncode == 0

    fixed.touch()                                         # the fix holds: replayed, not reproduced, still fixed
    second, _ = campaign(0)
    (known,) = second["known_bugs"]
    assert (known["signature"], known["replayed"], known["reproduced"]) == (sig, True, False)
    assert (known["state_before"], known["state"]) == ("fixed", "fixed")
    assert bugs()[0]["triage"] == "fixed"

    fixed.unlink()                                        # the fix is undone: the bug is back
    third, err = campaign(1)
    (known,) = third["known_bugs"]
    assert (known["reproduced"], known["state_before"], known["state"]) == (True, "fixed", "regressed")
    assert any(line.startswith(f"REGRESSED: bug {sig}") for line in err.splitlines()), err
    (bug,) = bugs()
    assert bug["triage"] == "regressed" and bug["occurrences"] == 2 and bug["first_seen"] <= bug["last_seen"]
    client = MlflowClient(uri)                            # MLflow mirrors the bug database
    mirror = find_bug_run(client, client.get_experiment_by_name(BUG_EXPERIMENT).experiment_id, sig)
    assert mirror.data.tags["triage"] == "regressed"

    assert _cli("triage", sig, "--state", "confirmed", "--output", str(tmp_path / "out"),
                "--tracking-uri", uri).returncode == 0
    fixed.touch()                                         # fixed in the code, not triaged: never dropped
    fourth, err = campaign(0)
    (known,) = fourth["known_bugs"]
    assert (known["reproduced"], known["state_before"], known["state"]) == (False, "confirmed", "not reproduced")
    assert f"known bug {sig}" in err and "not reproduced" in err
    (bug,) = bugs()
    assert bug["triage"] == "not reproduced" and bug["occurrences"] == 2
    assert [b["signature"] for b in bugs()] == [sig]      # one row per bug across the four campaigns
    assert find_bug_run(client, client.get_experiment_by_name(BUG_EXPERIMENT).experiment_id,
                        sig).data.tags["triage"] == "not reproduced"
    listed = _cli("bugs", "--output", str(tmp_path / "out"), "--state", "not-reproduced")
    assert listed.returncode == 0 and sig in listed.stdout


MOVABLE = (Path(__file__).parent / "targets" / "movable.py").read_text()   # the log on line 13


@pytest.mark.mlflow
def test_a_known_bug_whose_line_moved_keeps_its_triage_and_its_new_finding_joins_it(tmp_path: Path):
    """Lines added above a triaged bug: the reuse phase replays it where its line of code sits now
    (reproduced, still ``wontfix``), and the search's finding at the new line is an occurrence of that
    bug, not a second ``new`` one (a signature names the line)."""
    program = tmp_path / "movable.py"
    program.write_text(MOVABLE)
    (tmp_path / "mv.yaml").write_text(textwrap.dedent("""\
        name: mv
        targets:
          - {name: movable, entry: movable.py:make_target}
        search: {strategy: adaptive, max_steps: 30, seed: 0}
        resources: {num_actors: 0}
        device: cpu
        output: out
        """))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}

    def cli(*args: str) -> subprocess.CompletedProcess:     # in the user's project folder
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                              env=env, timeout=900, cwd=tmp_path)

    def bugs() -> list[dict]:
        done = cli("bugs", "--json")                     # the output of the newest run here
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert cli("run", "--plain", "mv.yaml").returncode == 1
    (bug,) = bugs()
    sig = bug["signature"]
    assert cli("triage", sig, "--state", "wontfix").returncode == 0

    program.write_text('"""A docstring added above."""\n\n' + MOVABLE)
    done = cli("run", "--plain", "mv.yaml")
    assert done.returncode == 1, done.stderr[-3000:]
    run_dir = max((tmp_path / "out").glob("mv-*"), key=lambda p: p.stat().st_mtime)
    summary = check_run(run_dir)
    (known,) = summary["known_bugs"]
    assert (known["signature"], known["reproduced"], known["state"]) == (sig, True, "wontfix")
    assert "log moved from movable.py:13 to line 15" in known["message"] and known["moved_to"] != sig
    (finding,) = [s["finding"] for s in summary["sites"] if s.get("finding")]
    report = json.loads((run_dir / finding / "finding.json").read_text())
    assert report["site"]["location"] == "movable.py:15" and report["signature"] == sig
    (bug,) = bugs()                                       # one bug, its triage kept
    assert (bug["signature"], bug["triage"], bug["occurrences"]) == (sig, "wontfix", 2)

    # the bug store keeps the smaller reproducer: here, make it the occurrence at the new line
    for name in ("finding.json", "values.safetensors"):
        shutil.copyfile(run_dir / finding / name, tmp_path / "out" / "bugs" / sig / "reproducer" / name)
    assert cli("run", "--plain", "mv.yaml").returncode == 1       # its reproducer names the new line
    (bug,) = bugs()
    assert (bug["signature"], bug["triage"], bug["occurrences"]) == (sig, "wontfix", 3)
