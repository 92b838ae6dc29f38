"""``cdeepfuzz replay`` takes a finding folder or its finding.json; a path that is not there says so."""
from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, search_site
from fuzz_core.findings import write_finding
from fuzz_core.fixes import suggest_and_verify
from fuzz_core.search import SearchConfig
from orchestrator.cli import app
from orchestrator.schemas import validate


def _finding(tmp_path: Path, name: str = "faults", entry: str = "tests/targets/faults.py:make_target") -> Path:
    """A finding of the target's first log site, written under ``tmp_path / "f"``."""
    spec = TargetSpec(name, entry, {}, "torch", 0)
    runner = build_runner(spec)
    site = next(s for s in discover_sites(runner, 0) if s.op == "log")
    config = SearchConfig("adaptive", 100, seed=0)
    result = search_site(runner, site, config)
    assert result.candidate is not None
    return write_finding(finding_from(runner, spec, site, config, result.candidate, result.seconds), tmp_path / "f")


def test_replay_takes_the_folder_or_its_finding_json_and_names_a_missing_path(tmp_path: Path):
    folder = _finding(tmp_path)
    for given in (folder, folder / "finding.json"):
        result = CliRunner().invoke(app, ["replay", str(given)])
        assert result.exit_code == 0, result.output
        assert result.output.startswith("reproduced: faults:log@tests/targets/faults.py:")
    result = CliRunner().invoke(app, ["replay", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert result.output.strip() == f"cdeepfuzz: error: {tmp_path / 'nope'}: no such path (give a finding folder: " \
                                    "<run>/findings/<name>)"
    other = tmp_path / "notes.txt"
    other.write_text("x")
    result = CliRunner().invoke(app, ["replay", str(other)])
    assert result.exit_code == 2 and "not a finding folder" in result.output
    result = CliRunner().invoke(app, ["replay", str(tmp_path)])           # a folder, but not a finding's
    assert result.exit_code == 2 and "not a finding folder" in result.output


MOVABLE = (Path(__file__).parent / "targets" / "movable.py").read_text()   # the log on line 13


def test_a_finding_replays_after_an_edit_moved_its_line_and_not_after_its_line_changed(tmp_path: Path, monkeypatch):
    """The finding keeps its line of code; a replay after lines were added above it judges the op where
    that line sits now (before: 'NOT reproduced', as if the bug were gone), and a fix guards it there
    (before: 'not called from Python', no suggestion); a changed line is judged as the code now is."""
    import sys

    monkeypatch.chdir(tmp_path)                       # a user's project: the program under the current folder
    program = tmp_path / "movable.py"
    program.write_text(MOVABLE)
    folder = _finding(tmp_path, "movable", "movable.py:make_target")
    report = __import__("json").loads((folder / "finding.json").read_text())
    assert report["site"]["location"] == "movable.py:13" and report["site"]["code"] == "return -torch.log(p).mean()"
    validate(folder / "finding.json")                 # the code is part of the public schema

    def replay():
        for name in [n for n in sys.modules if n.startswith("cdeepfuzz_target_") and n.endswith("movable")]:
            del sys.modules[name]                     # what a fresh process of `cdeepfuzz replay` sees
        return CliRunner().invoke(app, ["replay", str(folder)])

    program.write_text('"""Docs added above the program."""\n# and a comment\n' + MOVABLE)
    got = replay()
    assert got.exit_code == 0, got.output
    assert "log moved from movable.py:13 to line 15" in got.output
    fix = suggest_and_verify(folder, 20)              # `cdeepfuzz fix` guards the op on its line as it is now
    assert fix["location"] == "movable.py:15" and fix["source"] == "return -torch.log(p).mean()"
    assert fix["moved"] and fix["status"] == "verified", fix
    assert fix["recommended"]["name"] == "clamp_min" and fix["recommended"]["location"] == "movable.py:15"
    assert fix["attempts"][0]["why"].startswith("log_softmax needs the input of the softmax that computed `p`")

    program.write_text(MOVABLE.replace("torch.log(p)", "torch.log(p.clamp_min(1e-30))"))   # the fix
    got = replay()
    assert got.exit_code == 1 and got.output.startswith("NOT reproduced"), got.output
