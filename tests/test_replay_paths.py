"""``cdeepfuzz replay`` takes a finding folder or its finding.json; a path that is not there says so."""
from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, search_site
from fuzz_core.findings import write_finding
from fuzz_core.search import SearchConfig
from orchestrator.cli import app


def _finding(tmp_path: Path) -> Path:
    spec = TargetSpec("faults", "tests/targets/faults.py:make_target", {}, "torch", 0)
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
