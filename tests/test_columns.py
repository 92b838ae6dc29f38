"""Sites on one line are told apart by the column of their call (``file:line:col``) wherever a
site is shown: labels, ``cdeepfuzz sites`` (table and --json), summary.json, finding.json and its
first op, the FOUND line, SARIF, JUnit, the HTML report and MLflow tags. The column is extra data:
a site's ``location`` (``path:line``), id and bug signature are those of the runs made before it."""
from __future__ import annotations

import json
import pickle
import re
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fuzz_core.sites import CallerLocator, Location, OpSite, column_of, make_site, position_of, site_id

TARGET = "tests/targets/same_line.py"
HERE = "tests/test_columns.py"
LOCATOR = CallerLocator(())
# columns come from code positions (co_positions), new in Python 3.11; before it sites have none
positions = pytest.mark.skipif(sys.version_info < (3, 11), reason="code positions (columns) are Python 3.11+")


def _line_and_columns() -> tuple[int, int, int]:
    """The line of the two logs, and the 1-based columns of ``torch.log(x)`` and ``torch.log(1 - x)``."""
    lines = Path(TARGET).read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith("# TWO-LOGS"))
    text = lines[line - 1]
    return line, text.index("torch.log(x)") + 1, text.index("torch.log(1 - x)") + 1


def _here(marker: str) -> tuple[int, str]:
    lines = Path(HERE).read_text(encoding="utf-8").splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))
    return line, lines[line - 1]


def at() -> str:
    return LOCATOR.locate(2)      # the caller's call of at()


@positions
def test_the_locator_gives_each_call_on_a_line_its_own_column():
    first, second = at(), at()                                            # TWO-CALLS
    line, text = _here("TWO-CALLS")
    assert first == second == f"{HERE}:{line}"                            # the location is path:line, unchanged
    one = text.index("at(), at()")
    assert (first.column, second.column) == (one + 1, text.index("at()", one + 1) + 1)
    again = [at() for _ in range(2)]
    assert again[0] is again[1]                                           # cached per code and instruction
    wide = "ééé"; later = at()                                           # NON-ASCII
    _, text = _here("NON-ASCII")
    assert wide and later.column == text.index("at()") + 1                # characters, not UTF-8 bytes


def test_a_location_is_its_path_line_string_with_a_column_riding_along():
    loc = Location("pkg/model.py:12", 7)
    assert loc == "pkg/model.py:12" and hash(loc) == hash("pkg/model.py:12") and str(loc) == "pkg/model.py:12"
    assert json.dumps({"location": loc}) == '{"location": "pkg/model.py:12"}'
    back = pickle.loads(pickle.dumps(loc))
    assert back == loc and back.column == 7
    assert column_of(loc) == 7 and column_of("pkg/model.py:12") is None
    assert site_id("t", "log", loc, 0) == site_id("t", "log", "pkg/model.py:12", 0)   # ids without the column


def test_old_site_and_finding_dicts_without_a_column_still_load():
    site = make_site("t", "log", "log", "h", Location("a.py:3", 9), 1)
    assert (site.location, site.column, site.position) == ("a.py:3", 9, "a.py:3:9")
    assert type(site.location) is str and site.label == "t:log@a.py:3:9#1"
    old = {k: v for k, v in site.to_dict().items() if k not in ("column", "label")}
    loaded = OpSite.from_dict(old)
    assert loaded.column is None and loaded.label == "t:log@a.py:3#1" and loaded.position == "a.py:3"
    assert loaded == site and loaded.key == site.key and loaded.id == site.id     # the same site
    assert OpSite.from_dict(json.loads(json.dumps(site.to_dict()))).column == 9
    assert position_of({"location": "a.py:3"}) == "a.py:3"
    assert position_of({"location": "a.py:3", "column": 4}) == "a.py:3:4"


def _runner():
    from fuzz_core.backends.torch import TorchRunner
    from targets.same_line import make_target

    return TorchRunner("two", make_target())


@pytest.fixture(autouse=True)
def _targets_importable(monkeypatch, repo_root):
    monkeypatch.syspath_prepend(str(repo_root / "tests"))


@positions
def test_torch_sites_and_first_ops_on_one_line_differ_by_column():
    pytest.importorskip("torch")
    line, first, second = _line_and_columns()
    runner = _runner()
    batch = dict(runner.sample(np.random.default_rng(0)))
    logs = [s for s in runner.discover(batch, seed=0) if s.op == "log"]
    assert [(s.location, s.occurrence, s.column) for s in logs] == [(f"{TARGET}:{line}", 0, first),
                                                                    (f"{TARGET}:{line}", 1, second)]
    assert [s.label for s in logs] == [f"two:log@{TARGET}:{line}:{first}#0", f"two:log@{TARGET}:{line}:{second}#1"]
    assert [s.id for s in logs] == [site_id("two", "log", f"{TARGET}:{line}", n) for n in (0, 1)]   # unchanged ids
    for x, (occurrence, column) in ((0.0, (0, first)), (1.0, (1, second))):
        result = runner.check({"x": np.full((4, 3), x, np.float32)}, 0)
        op = result.first_op
        assert (op.op, op.location, op.occurrence, op.column) == ("log", f"{TARGET}:{line}", occurrence, column)
        assert op.position == f"{TARGET}:{line}:{column}" and op.to_dict()["column"] == column


def _campaign(tmp_path: Path, steps: int = 60) -> Path:
    path = tmp_path / "cols.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: cols
        targets:
          - {{name: two, entry: "{TARGET}:make_target"}}
        search: {{strategy: adaptive, max_steps: {steps}, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 20}}
        resources: {{num_actors: 0, num_cpus: 1, num_gpus: 0}}
        device: cpu
        time_limit_s: 300
        output: {tmp_path / 'runs'}
        tracking: {{enabled: false}}
        """))
    return path


@positions
def test_sites_json_and_table_show_file_line_col(tmp_path: Path):
    pytest.importorskip("torch")
    from orchestrator.cli import app

    line, first, second = _line_and_columns()
    campaign = _campaign(tmp_path)
    got = CliRunner().invoke(app, ["sites", str(campaign), "--json"])
    assert got.exit_code == 0, got.output
    logs = [r for r in json.loads(got.stdout) if r["op"] == "log"]
    assert [(r["location"], r["occurrence"], r["column"]) for r in logs] == [(f"{TARGET}:{line}", 0, first),
                                                                           (f"{TARGET}:{line}", 1, second)]
    assert logs[0]["label"] != logs[1]["label"] and logs[1]["label"].endswith(f":{line}:{second}#1")
    table = CliRunner().invoke(app, ["sites", str(campaign)], env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    assert f"{TARGET}:{line}:{first}" in table.output and f"{TARGET}:{line}:{second}" in table.output


@positions
def test_a_run_shows_the_column_in_every_output(tmp_path: Path):
    pytest.importorskip("torch")
    import jsonschema

    from orchestrator.cli import app
    from orchestrator.commands.report import write_reports
    from orchestrator.export import SARIF_SCHEMA
    from orchestrator.observers.mlflow import site_tags
    from fuzz_core.status import SiteStatus
    from records import check_run

    line, first, second = _line_and_columns()
    columns = {0: first, 1: second}
    junit, sarif = tmp_path / "junit.xml", tmp_path / "run.sarif"
    result = CliRunner().invoke(app, ["run", str(_campaign(tmp_path)), "--local", "--plain", "--junit-xml", str(junit),
                                      "--sarif", str(sarif)])
    assert result.exit_code == 1, result.output           # findings
    run_dir = next((tmp_path / "runs").glob("cols-*"))
    summary = check_run(run_dir)                           # summary.json and finding.json valid against their schemas
    logs = {s["occurrence"]: s for s in summary["sites"] if s["op"] == "log"}
    assert {n: s["column"] for n, s in logs.items()} == columns
    assert {n: s["label"] for n, s in logs.items()} == {n: f"two:log@{TARGET}:{line}:{c}#{n}"
                                                         for n, c in columns.items()}
    found = [s for s in logs.values() if s["status"] == "found"]
    assert found, summary["sites"]

    for s in found:                                        # the BUG line names the call by file:line:col
        assert re.search(rf"BUG \d: log \(forward\) at {re.escape(TARGET)}:{line}:{s['column']}: ",
                         result.output), result.output
        report = json.loads((run_dir / s["finding"] / "finding.json").read_text())
        assert report["site"]["column"] == s["column"] and report["site"]["label"] == s["label"]
        first_op = report["first_op"]
        assert (first_op["location"], first_op["column"]) == (f"{TARGET}:{line}", columns[first_op["occurrence"]])

    log = json.loads(sarif.read_text())
    jsonschema.Draft4Validator(json.loads(SARIF_SCHEMA.read_text(encoding="utf-8"))).validate(log)
    by_site = {site: r for r in log["runs"][0]["results"] for site in r["properties"]["sites"]}
    for s in found:
        region = by_site[s["id"]]["locations"][0]["physicalLocation"]["region"]
        report = json.loads((run_dir / s["finding"] / "finding.json").read_text())
        assert region == {"startLine": line, "startColumn": report["first_op"]["column"]}
        assert f"{TARGET}:{line}:{report['first_op']['column']}" in by_site[s["id"]]["message"]["text"]

    names = {case.get("name") for case in ET.fromstring(junit.read_text()).iter("testcase")}
    assert {s["label"] for s in logs.values()} <= names

    index = write_reports(run_dir)[0]
    html = index.read_text()
    assert all(s["label"] in html for s in logs.values())
    page = next((index.parent / "findings").glob("*.html")).read_text()
    assert f"{TARGET}:{line}:" in page and "^</td>" in page        # the source line with a caret under the call

    site = OpSite.from_dict(logs[1])
    tags = site_tags(site, SiteStatus.FOUND)
    assert tags["site.column"] == second and tags["site.position"] == f"{TARGET}:{line}:{second}"
    assert tags["site.location"] == f"{TARGET}:{line}"


@positions
def test_tensorflow_eager_sites_on_one_line_differ_by_column():
    tf = pytest.importorskip("tensorflow")
    from fuzz_core import Target
    from fuzz_core.backends.base import RunnerOptions
    from fuzz_core.backends.tensorflow import make_runner

    def program(batch):
        x = batch["x"]
        return tf.reduce_mean(tf.math.log(x) + tf.math.log(1.0 - x))   # TF-LOGS

    target = Target(program=program, sample=lambda r: {"x": r.uniform(0.25, 0.75, (4, 3)).astype(np.float32)},
                    bounds={"x": (-0.5, 1.5)}, search=["x"])
    runner = make_runner("tf", target, RunnerOptions())
    logs = [s for s in runner.discover(dict(runner.sample(np.random.default_rng(0))), 0) if s.op == "log"]
    line, text = _here("TF-LOGS")
    columns = [text.index("tf.math.log(x)") + 1, text.index("tf.math.log(1.0 - x)") + 1]
    assert [(s.location, s.occurrence, s.column) for s in logs] == [(f"{HERE}:{line}", 0, columns[0]),
                                                                    (f"{HERE}:{line}", 1, columns[1])]
    assert logs[0].label != logs[1].label
    op = runner.check({"x": np.full((4, 3), 1.0, np.float32)}, 0).first_op
    assert (op.occurrence, op.column) == (1, columns[1])
