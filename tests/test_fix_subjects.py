"""``cdeepfuzz fix`` on every buggy subject of campaigns/targets/ (benchmarks/subjects.py), as a user meets it.

The subject's campaign runs as a user runs it (``cdeepfuzz run``, in this process, a short budget, tracking
off); on each distinct bug it wrote (one finding folder per first non-finite op and phase: a site's own
finding or one its search passed on the way) ``cdeepfuzz fix`` either prints a diff that ``git apply``
applies to a copy of the project, after which ``cdeepfuzz replay`` of the finding there no longer
reproduces (no op goes non-finite, forward or backward), or says in one sentence that it has none: the
answer for every TensorFlow subject (guards are for PyTorch programs only, as the README says).

Minutes per subject on a laptop CPU: marked ``slow`` (``pytest -m slow tests/test_fix_subjects.py``).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.subjects import BUGGY, BUGGY_TF, KNOWN_MISS
from orchestrator.cli import app

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 20                 # search steps per site of the guarded program
SUBJECTS = {**BUGGY, **BUGGY_TF}
STEPS = {"rsqrt_norm": 600}  # the campaign's search budget per site (200 unless named): rsqrt_norm needs ~470
# torch subjects whose bugs no guard at one call fixes, and why (the answer is then "no fix for the ...: ...")
NO_FIX = {
    "train_only_bug": "its training diverges (lr 25 times too large): a guard at the exp moves the blow-up to the "
                      "log of the rate that underflows, and a guard at that log back to the exp",
}


def _params():
    """A known miss (no finding to fix) is a strict xfail: a run that finds it fails the test."""
    return [pytest.param(name, id=name, marks=((pytest.mark.tf,) if name in BUGGY_TF else ())
                         + ((pytest.mark.xfail(strict=True, reason=KNOWN_MISS[name]),) if name in KNOWN_MISS else ()))
            for name in SUBJECTS]


def _findings(name: str, tmp_path: Path) -> list[Path]:
    """Run the subject's campaign (from the repository root, as its entries are written); one finding folder
    per distinct first non-finite op (position and phase)."""
    campaign = tmp_path / "campaign.yaml"
    campaign.write_text(textwrap.dedent(f"""\
        name: fix-{name.replace('_', '-')}
        targets:
          - {{name: {name.replace('_', '-')}, entry: {SUBJECTS[name]}}}
        search: {{strategy: adaptive, max_steps: {STEPS.get(name, 200)}, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 20}}
        resources: {{num_actors: 0}}
        device: cpu
        time_limit_s: 600
        tracking: {{enabled: false}}
        output: {tmp_path / 'runs'}
        """))
    res = CliRunner().invoke(app, ["run", "--local", "--plain", "--quiet", str(campaign)])
    assert res.exit_code == 1, f"{name}: no finding (exit {res.exit_code}): {res.output[-2000:]}"
    seen, out = set(), []
    for folder in sorted((tmp_path / "runs").glob("*/findings/*")):
        report = json.loads((folder / "finding.json").read_text())
        first = report.get("first_op") or {}
        key = (first.get("location"), first.get("column"), report.get("phase"))
        if key not in seen:
            seen.add(key)
            out.append(folder)
    assert out
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", _params())
def test_fix_on_a_subject_gives_a_patch_that_applies_and_passes_or_says_it_has_none(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    if name in BUGGY_TF:
        pytest.importorskip("tensorflow")
    for folder in _findings(name, tmp_path):
        monkeypatch.chdir(ROOT)
        res = CliRunner().invoke(app, ["fix", str(folder), "--budget", str(BUDGET)])
        fix = json.loads((folder / "finding.json").read_text())["fix"]
        first = res.output.splitlines()[0]
        assert first == fix["message"], res.output
        if name in BUGGY_TF or name in NO_FIX:
            assert res.exit_code == 1 and fix["status"] in ("no suggestion", "not sufficient"), res.output
            assert first.startswith("no fix for the ") and first.endswith("."), first
            assert not re.search(r"\. [A-Z]", first), first                                   # one sentence
            assert name in NO_FIX or "PyTorch programs only" in first
            continue
        assert res.exit_code == 0 and fix["status"] == "verified", f"{folder.name}: {res.output}"
        _applies_and_passes(folder, tmp_path / f"patched-{folder.name}", monkeypatch)


def _applies_and_passes(folder: Path, copy: Path, monkeypatch) -> None:
    """``fix.diff`` applied with ``git apply`` to a copy of the project's program files (``copy``, the
    current directory after), where ``cdeepfuzz replay`` of the finding no longer reproduces."""
    report = json.loads((folder / "finding.json").read_text())
    source = report["target"]["entry"].split(":")[0]
    (copy / source).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / source, copy / source)
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    applied = subprocess.run(["git", "apply", str(folder / "fix.diff")], cwd=copy, capture_output=True, text=True)
    assert applied.returncode == 0, f"{folder.name}: {applied.stderr}"
    monkeypatch.chdir(copy)
    replay = CliRunner().invoke(app, ["replay", str(folder)])
    assert replay.exit_code == 1 and replay.output.startswith("NOT reproduced"), f"{folder.name}: {replay.output}"
    assert "first non-finite op: none" in replay.output, f"{folder.name}: {replay.output}"


@pytest.mark.slow
def test_every_finding_folder_of_the_quickstart_gets_a_patch_that_applies_and_passes(tmp_path, monkeypatch):
    """The README's quickstart, as a user runs it: ``fix`` on each finding folder it wrote, whichever site's
    search wrote it (a site's own finding, or one its search passed on the way)."""
    monkeypatch.chdir(ROOT)
    res = CliRunner().invoke(app, ["run", "--local", "--plain", "--quiet", "--output", str(tmp_path / "runs"),
                                   "campaigns/quickstart.yaml"])
    assert res.exit_code == 1, res.output[-2000:]
    folders = sorted((tmp_path / "runs").glob("quickstart-*/findings/*"))
    assert folders
    lines = set()
    for folder in folders:
        monkeypatch.chdir(ROOT)
        fixed = CliRunner().invoke(app, ["fix", str(folder), "--budget", str(BUDGET)])
        assert fixed.exit_code == 0, f"{folder.name}: {fixed.output}"
        lines.add(json.loads((folder / "finding.json").read_text())["fix"]["location"])
        _applies_and_passes(folder, tmp_path / f"patched-{folder.name}", monkeypatch)
    assert lines == {"campaigns/targets/softmax_xent_mlp.py:43", "campaigns/targets/log_one_minus_sigmoid.py:43"}
