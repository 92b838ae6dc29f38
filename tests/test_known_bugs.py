"""Bugs, not runs: a campaign first replays the known bugs of its targets (Hypothesis' reuse phase).

A bug is found, triaged ``fixed``, its fix holds (the replay no longer triggers it: it stays fixed),
the fix is undone (the replay triggers it: ``regressed``, loudly), it is confirmed, fixed again in the
code without triage (``not reproduced``, never dropped); ``cdeepfuzz bugs`` lists it once throughout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

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
        done = _cli("bugs", "--json", "--tracking-uri", uri)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first, _ = campaign(1)
    (bug,) = bugs()
    assert first["known_bugs"] == [] and bug["triage"] == "new" and bug["occurrences"] == 1
    sig = bug["signature"]
    assert (Path(bug["reproducer"]) / "finding.json").is_file()
    assert _cli("triage", sig, "--state", "fixed", "--tracking-uri", uri).returncode == 0

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
    client = MlflowClient(uri)
    assert client.get_run(bug["bug_run_id"]).data.tags["triage"] == "regressed"     # the one place per bug
    assert {client.get_run(r).data.tags["triage"] for r in bug["runs"]} == {"regressed"}   # and its copies

    assert _cli("triage", sig, "--state", "confirmed", "--tracking-uri", uri).returncode == 0
    fixed.touch()                                         # fixed in the code, not triaged: never dropped
    fourth, err = campaign(0)
    (known,) = fourth["known_bugs"]
    assert (known["reproduced"], known["state_before"], known["state"]) == (False, "confirmed", "not reproduced")
    assert f"known bug {sig}" in err and "not reproduced" in err
    (bug,) = bugs()
    assert bug["triage"] == "not reproduced" and bug["occurrences"] == 2
    assert [b["signature"] for b in bugs()] == [sig]      # one row per bug across the four campaigns
    listed = _cli("bugs", "--tracking-uri", uri, "--state", "not-reproduced")
    assert listed.returncode == 0 and sig in listed.stdout
