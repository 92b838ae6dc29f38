"""Each finding folder holds ``test_reproducer.py``: a pytest file that fails while the bug is there
(naming the op, its phase and file:line) and passes once the program is fixed, from any directory.

The generated files are run by a real pytest in a subprocess, on a real search's finding."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, search_site
from fuzz_core.findings import load_finding, write_finding
from fuzz_core.reproducer import TEST_FILE, find_root
from fuzz_core.search import SearchConfig

ROOT = Path(__file__).resolve().parents[1]

BUGGY = '''
import numpy as np
import torch

from fuzz_core import Target


def loss(x):
    p = torch.sigmoid(4.0 * x)
    return -torch.log(1 - p).mean()


def make_target(seed: int = 0, rows: int = 4) -> Target:
    def sample(rng):
        return {"x": rng.uniform(-1, 1, (rows, 3)).astype(np.float32)}
    return Target(program=lambda b: loss(b["x"]), sample=sample, bounds={"x": (-10.0, 10.0)}, search=["x"])
'''
BUG_LINE = "    return -torch.log(1 - p).mean()"
BUG_COLUMN = BUG_LINE.index("torch.log") + 1      # file:line:col of the call in the failure message
FIX_LINE = "    return -torch.nn.functional.logsigmoid(-4.0 * x).mean()"
ENTRY = "subjects/sig.py:make_target"


def _bug_lineno() -> int:
    return BUGGY.splitlines().index(BUG_LINE) + 1


def _finding(project: Path, entry: str, name: str, op: str, out: Path, monkeypatch) -> Path:
    """A real search's finding, written into ``out`` as the controller does from the project's folder."""
    monkeypatch.chdir(project)
    spec = TargetSpec(name, entry, {}, "torch", 0)
    runner = build_runner(spec)
    site = next(s for s in discover_sites(runner, 0) if s.op == op and s.searched)
    config = SearchConfig("adaptive", 200, seed=0)
    result = search_site(runner, site, config)
    assert result.candidate is not None, result.trace
    finding = finding_from(runner, spec, site, config, result.candidate, result.seconds)
    return write_finding(finding, out / finding.folder_name).resolve()


def _pytest(*files: Path, cwd: Path, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """Run pytest on generated files in a fresh interpreter; outcome per file (passed, failed, error)."""
    import os

    report = cwd / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
                           f"--junit-xml={report}", *map(str, files)], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failure = case.find("failure")
        error = case.find("error")
        outcome = "failed" if failure is not None else "error" if error is not None else "passed"
        outcomes[case.get("classname", "")] = (outcome, (failure if failure is not None else error).get("message", "")
                                               if outcome != "passed" else "")
    return proc, outcomes


def _outcome(outcomes: dict, folder: Path) -> tuple[str, str]:
    hits = [v for k, v in outcomes.items() if folder.name in k]
    assert len(hits) == 1, outcomes
    return hits[0]


def _buggy_and_fixed(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A finding of the buggy project's search, and a copy of its folder in a project whose program is
    fixed (the bug's line patched), at the same depth."""
    buggy, fixed = tmp_path / "buggy", tmp_path / "fixed"
    (buggy / "subjects").mkdir(parents=True)
    (buggy / "subjects" / "sig.py").write_text(BUGGY)
    folder = _finding(buggy, ENTRY, "sig", "log", Path("runs/r/findings"), monkeypatch)
    shutil.copytree(buggy / "subjects", fixed / "subjects")
    source = fixed / "subjects" / "sig.py"
    source.write_text(source.read_text().replace(BUG_LINE, FIX_LINE))
    copy = fixed / folder.relative_to(buggy)
    shutil.copytree(folder, copy)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return folder, copy


def _run_in_process(test_file: Path, monkeypatch) -> None:
    """Import a generated test file and call its test as pytest would (a fresh monkeypatch)."""
    spec = importlib.util.spec_from_file_location(f"reproducer_{abs(hash(str(test_file)))}", test_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with monkeypatch.context() as mp:
        module.test_program_stays_finite_on_the_saved_values(mp)


def test_a_finding_folder_holds_a_pytest_reproducer_that_fails_until_the_program_is_fixed(tmp_path, monkeypatch):
    folder, fixed = _buggy_and_fixed(tmp_path, monkeypatch)
    test_file = folder / TEST_FILE
    assert test_file.is_file() and (folder / "values.safetensors").is_file()
    text = test_file.read_text()
    assert str(tmp_path) not in text            # no machine path: the root is relative to the folder
    report = load_finding(folder).report
    assert f"STEP_SEED = {report['step_seed']}" in text and "'entry': 'subjects/sig.py:make_target'" in text
    with pytest.raises(AssertionError) as failed:          # from another directory, on the buggy program
        _run_in_process(test_file, monkeypatch)
    message = str(failed.value)
    assert f"log (log) at subjects/sig.py:{_bug_lineno()}:{BUG_COLUMN} went non-finite in the forward pass" in message, message
    assert "not finite on the values CDeepFuzz saved" in message
    assert Path.cwd() == tmp_path / "elsewhere"
    _run_in_process(fixed / TEST_FILE, monkeypatch)       # the fixed program: it passes


@pytest.mark.slow
def test_the_generated_file_runs_under_pytest_from_another_directory(tmp_path, monkeypatch):
    folder, fixed = _buggy_and_fixed(tmp_path, monkeypatch)
    proc, outcomes = _pytest(folder / TEST_FILE, fixed / TEST_FILE, cwd=tmp_path / "elsewhere")
    outcome, message = _outcome({k: v for k, v in outcomes.items() if "fixed" not in k}, folder)
    assert outcome == "failed", proc.stdout + proc.stderr
    assert f"log (log) at subjects/sig.py:{_bug_lineno()}:{BUG_COLUMN} went non-finite in the forward pass" in message, message
    assert _outcome({k: v for k, v in outcomes.items() if "fixed" in k}, fixed)[0] == "passed", proc.stdout + proc.stderr
    assert proc.returncode == 1


def test_the_reproducer_finds_its_project_from_the_environment_or_from_the_folders_above(tmp_path, monkeypatch):
    project = tmp_path / "proj"
    (project / "subjects").mkdir(parents=True)
    (project / "subjects" / "sig.py").write_text(BUGGY)
    dropped = project / "tests" / "regressions" / "bug1"       # copied into the project's own tests
    dropped.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert find_root(ENTRY, dropped, "../../../../nowhere") == project.resolve()
    assert find_root(ENTRY, dropped, None) == project.resolve()
    assert find_root("subjects.sig:make_target", dropped, None) == project.resolve()
    other = tmp_path / "other"
    (other / "subjects").mkdir(parents=True)
    (other / "subjects" / "sig.py").write_text(BUGGY)
    assert find_root(ENTRY, dropped, "../../../../other") == other.resolve()   # the recorded path wins
    monkeypatch.setenv("CDEEPFUZZ_ROOT", str(other))
    assert find_root(ENTRY, dropped, None) == other.resolve()                  # the variable wins over all
    monkeypatch.delenv("CDEEPFUZZ_ROOT")
    with pytest.raises(FileNotFoundError, match="CDEEPFUZZ_ROOT"):
        find_root("subjects/missing.py:make_target", dropped, None)


@pytest.mark.slow
def test_the_log_one_minus_sigmoid_reproducer_fails_then_passes_on_its_guarded_twin(tmp_path, monkeypatch):
    """The campaign subject: its finding's test fails naming log at bce's line; pointed (CDEEPFUZZ_ROOT)
    at a project whose file is the guarded twin, it passes."""
    entry = "campaigns/targets/log_one_minus_sigmoid.py:make_target"
    run = _finding(ROOT, entry, "log-one-minus-sigmoid", "log", tmp_path / "runs", monkeypatch)
    fixed = tmp_path / "fixed" / "campaigns" / "targets"
    fixed.mkdir(parents=True)
    shutil.copyfile(ROOT / "campaigns/targets/log_sigmoid_guarded.py", fixed / "log_one_minus_sigmoid.py")
    line = next(i for i, text in enumerate((ROOT / entry.split(":")[0]).read_text().splitlines(), 1)
                if "torch.log(1 - p)" in text and "return" in text)
    proc, outcomes = _pytest(run / TEST_FILE, cwd=tmp_path)       # the recorded root: the repository
    outcome, message = _outcome(outcomes, run)
    assert outcome == "failed", proc.stdout + proc.stderr
    assert f"at campaigns/targets/log_one_minus_sigmoid.py:{line}" in message and "forward" in message, message
    proc, outcomes = _pytest(run / TEST_FILE, cwd=tmp_path, env={"CDEEPFUZZ_ROOT": str(tmp_path / "fixed")})
    assert _outcome(outcomes, run)[0] == "passed", proc.stdout + proc.stderr
