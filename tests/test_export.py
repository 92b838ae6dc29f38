"""``cdeepfuzz run --junit-xml PATH --sarif PATH``: a run for CI test reports and code scanning.

The SARIF is validated against the published SARIF 2.1.0 schema bundled in orchestrator/schemas/."""
from __future__ import annotations

import copy
import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.export import SARIF_SCHEMA, junit_xml, sarif_log, write_junit_xml, write_sarif

FAULTS = "tests/targets/faults.py"


def _sarif_validator() -> jsonschema.Draft4Validator:
    schema = json.loads(SARIF_SCHEMA.read_text(encoding="utf-8"))
    assert schema["id"].endswith("sarif-schema-2.1.0.json") and "2.1.0" in schema["title"]
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def _cases(xml_text: str) -> dict[str, ET.Element]:
    root = ET.fromstring(xml_text)
    assert root.tag == "testsuites"
    return {case.get("name"): case for case in root.iter("testcase")}


def _outcome(case: ET.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return tag
    return "passed"


def _log_line() -> int:
    lines = Path(FAULTS).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if "return -torch.log(1 - torch.sigmoid(z))" in text)


def _log_column() -> int:
    """1-based column of the ``torch.log(...)`` call on that line (the site's column)."""
    return Path(FAULTS).read_text().splitlines()[_log_line() - 1].index("torch.log(") + 1


def test_a_run_writes_junit_xml_and_sarif_that_name_the_finding_and_the_broken_target(tmp_path: Path):
    fixed = tmp_path / "fixed.flag"
    fixed.touch()
    campaign = tmp_path / "export.yaml"
    campaign.write_text(textwrap.dedent(f"""\
        name: export
        targets:
          - {{name: buggy, entry: "{FAULTS}:make_target"}}
          - {{name: guarded, entry: "{FAULTS}:make_target", args: {{fixed_if: "{fixed}"}}}}
          - {{name: broken, entry: "{FAULTS}:make_target", args: {{mode: factory_raises}}}}
        search: {{strategy: adaptive, max_steps: 20, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 10}}
        resources: {{num_actors: 0, num_cpus: 1, num_gpus: 0}}
        device: cpu
        time_limit_s: 300
        output: {tmp_path / 'runs'}
        tracking: {{enabled: false}}
        """))
    junit, sarif = tmp_path / "reports" / "junit.xml", tmp_path / "reports" / "run.sarif"
    junit.parent.mkdir()
    result = CliRunner().invoke(app, ["run", str(campaign), "--local", "--quiet", "--junit-xml", str(junit),
                                      "--sarif", str(sarif)])
    assert result.exit_code == 3, result.output           # a target could not be built: 3 wins over findings
    line, col = _log_line(), _log_column()

    cases = _cases(junit.read_text())
    buggy = cases[f"buggy:log@{FAULTS}:{line}:{col}#0"]                 # file:line:col in the test's name
    assert _outcome(buggy) == "failure"
    failure = buggy.find("failure")
    assert failure.get("message").startswith(f"log (forward) at {FAULTS}:{line}:{col}: log of x <= 0")
    assert "cdeepfuzz replay" in failure.text and "test_reproducer.py" in failure.text
    assert buggy.get("file") == FAULTS and buggy.get("line") == str(line)
    assert _outcome(cases[f"guarded:log@{FAULTS}:{line}:{col}#0"]) == "passed"          # searched, nothing found
    broken = cases["broken (build)"]
    assert _outcome(broken) == "error" and "could not open its weights file" in broken.find("error").get("message")
    root = ET.fromstring(junit.read_text())
    assert int(root.get("failures")) >= 1 and root.get("errors") == "1"
    assert int(root.get("tests")) == len(cases)

    log = json.loads(sarif.read_text())
    _sarif_validator().validate(log)
    results = log["runs"][0]["results"]
    ours = [r for r in results if r["properties"]["targets"] == ["buggy"] and r["ruleId"] == "log"]
    assert len(ours) == 1 and all(r["properties"]["targets"] == ["buggy"] for r in results)
    assert len(results) == json.loads((next((tmp_path / "runs").glob("export-*")) / "summary.json").read_text()
                                      )["totals"]["bugs"]            # one result per bug, not per finding
    where = ours[0]["locations"][0]["physicalLocation"]
    assert where["artifactLocation"]["uri"] == FAULTS and where["region"]["startLine"] == line
    assert where["region"]["startColumn"] == col
    assert "log of x <= 0" in ours[0]["message"]["text"]
    assert ours[0]["partialFingerprints"]["cdeepfuzzSignature/v2"]
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert rules[ours[0]["ruleIndex"]]["id"] == "log"
    notes = log["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert any("target broken" in n["message"]["text"] for n in notes)

    # the same files again from the run folder alone
    run_dir = next((tmp_path / "runs").glob("export-*"))
    assert write_junit_xml(run_dir, tmp_path / "again.xml").read_text() == junit.read_text()
    assert json.loads(write_sarif(run_dir, tmp_path / "again.sarif").read_text()) == log


def _site(id_: str, status: str, exit_reason: str, location: str = "pkg/model.py:12", **extra) -> dict:
    return {"id": id_, "label": f"net:log@{location}#0", "target": "net", "op": "log", "kind": "log",
            "hazard": "log of x <= 0 (-inf at 0, NaN below)", "location": location, "occurrence": 0,
            "status": status, "exit_reason": exit_reason, "steps": 10, "seconds": 0.5, "best_loss": 0.1,
            "finding": None, "error": None, "traceback": None, **extra}


SIG_A, SIG_B = "a" * 16, "b" * 16
SUMMARY = {
    "campaign": {"name": "synthetic"},
    "run": {"state": "stopped", "exit_code": 4},
    "targets": [
        {"name": "net", "status": "found", "error": None, "recorded": [
            {"op": "_log_softmax", "kind": "_log_softmax", "location": "pkg/model.py:30"}]},
        {"name": "bad", "status": "error", "exit_reason": "target_error", "sites": 0,
         "error": "ValueError: no weights\nsecond line", "traceback": "Traceback ...\nValueError: no weights"},
    ],
    "bugs": [
        {"signature": SIG_A, "op": "log", "kind": "log", "location": "pkg/model.py:12", "column": None,
         "position": "pkg/model.py:12", "hazard": "log of x <= 0 (-inf at 0, NaN below)", "phase": "forward",
         "targets": ["net"], "sites": ["a1"], "reproducer": "findings/a1", "flaky": False, "precision_only": None,
         "occurrences": [{"folder": "findings/a1"}, {"folder": "findings/a1b"}]},
        {"signature": SIG_B, "op": "sqrt_grad", "kind": "sqrt", "location": "pkg/loss.py:7", "column": 21,
         "position": "pkg/loss.py:7:21", "phase": "backward",
         "hazard": "backward: sqrt at 0 has an infinite gradient", "targets": ["net"], "sites": [],
         "reproducer": "findings/b2", "flaky": True, "precision_only": None, "occurrences": [{"folder": "findings/b2"}]},
    ],
    "sites": [
        _site("a1", "found", "triggered", finding="findings/a1"),
        _site("b2", "retired", "blocked", location="pkg/model.py:14:9", passed=["findings/b2"]),
        _site("c3", "error", "target_error", error="RuntimeError: shapes", traceback="Traceback ..."),
        _site("d4", "timeout", "quantum_timeout"),
        _site("e5", "stopped", "time_limit"),
        _site("f6", "unreachable", "unreachable"),
        _site("g7", "exhausted", "budget_spent", reach={"message": "would trigger if x[0] reached 52", "triggered": True,
                                                         "probe_steps": 40}),
        _site("h8", "retired", "no_progress"),
    ],
}
REPORTS = {
    SIG_A: {"signature": SIG_A, "phase": "forward", "site_triggered": True, "notes": ["x[0, 1] = 41.7, sampled data "
                                                                                      "lies in [0, 16]"],
            "first_op": {"op": "log", "kind": "log", "location": "pkg/model.py:12", "occurrence": 0}},
    SIG_B: {"signature": SIG_B, "phase": "backward", "site_triggered": False,
            "first_op": {"op": "sqrt", "kind": "sqrt", "location": "pkg/loss.py:7:21", "occurrence": 1}},
}


def test_junit_xml_has_one_failure_per_bug_at_its_site_or_of_its_own():
    root = ET.fromstring(junit_xml(SUMMARY, REPORTS, "runs/r"))
    cases = {case.find("properties/property[@name='cdeepfuzz.id']").get("value") if case.find("properties") is not None
             else case.get("name"): case for case in root.iter("testcase")}
    loose = "net:sqrt_grad@pkg/loss.py:7:21 (bug)"          # a bug at no searched site: a test case of its own
    expected = {"a1": "failure", "b2": "passed", "c3": "error", "d4": "error", "e5": "skipped", "f6": "skipped",
                "g7": "passed", "h8": "passed", "bad (build)": "error", "net:_log_softmax@pkg/model.py:30": "skipped",
                loose: "failure"}
    assert {k: _outcome(v) for k, v in cases.items()} == expected
    assert "runs/r/findings/a1/test_reproducer.py" in cases["a1"].find("failure").text
    assert "sampled data lies in [0, 16]" in cases["a1"].find("failure").text
    assert "occurrences: 2 in this run" in cases["a1"].find("failure").text
    assert cases[loose].find("failure").get("message") == (
        "sqrt_grad (backward) at pkg/loss.py:7:21: backward: sqrt at 0 has an infinite gradient "
        "[flaky: not every fresh replay reproduced it]")
    assert cases[loose].get("file") == "pkg/loss.py" and cases[loose].get("line") == "7"
    assert cases["b2"].find("system-out").text == "retired (blocked), closest suspect loss 0.1"
    assert cases["c3"].find("error").get("message") == "RuntimeError: shapes"
    assert cases["bad (build)"].find("error").get("message") == "ValueError: no weights"
    assert "time limit" in cases["e5"].find("skipped").get("message")
    assert "would trigger if x[0] reached 52" in cases["g7"].find("system-out").text
    root = ET.fromstring(junit_xml(SUMMARY, REPORTS))
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert suites["synthetic.net"].get("failures") == "2" and suites["synthetic.net"].get("skipped") == "3"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("11", "2", "3", "3")


def test_sarif_has_one_result_per_bug_at_its_op_and_is_valid_sarif_2_1_0():
    validator = _sarif_validator()
    log = sarif_log(SUMMARY, REPORTS, "runs/r")
    validator.validate(log)
    results = log["runs"][0]["results"]
    assert [r["ruleId"] for r in results] == ["log", "sqrt_grad"]       # found; flaky (the first op's bug)
    own, other = results
    assert own["level"] == "error" and other["level"] == "warning"
    assert own["locations"][0]["physicalLocation"]["region"] == {"startLine": 12}
    assert other["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "pkg/loss.py", "uriBaseId": "%SRCROOT%"}, "region": {"startLine": 7, "startColumn": 21}}
    assert own["partialFingerprints"] == {"cdeepfuzzSignature/v2": SIG_A}
    assert own["properties"]["occurrences"] == 2 and own["properties"]["sites"] == ["a1"]
    assert "pytest runs/r/findings/a1/test_reproducer.py" in own["message"]["text"]
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == ["log", "sqrt_grad"] and [r["ruleIndex"] for r in results] == [0, 1]
    assert log["runs"][0]["invocations"][0]["executionSuccessful"] is False       # a stopped run
    assert "ValueError: no weights" in log["runs"][0]["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"]
    broken = copy.deepcopy(log)            # the validator is real: a result without its message is not SARIF
    del broken["runs"][0]["results"][0]["message"]
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(broken)
    assert not sarif_log({"sites": [], "targets": [], "bugs": []}, {})["runs"][0]["results"]


def test_report_paths_in_a_missing_folder_are_a_usage_error(tmp_path: Path):
    result = CliRunner().invoke(app, ["run", "campaigns/quickstart.yaml", "--junit-xml", str(tmp_path / "no" / "j.xml")])
    assert result.exit_code == 2
    assert "no such folder for the JUnit XML file" in result.output and "Traceback" not in result.output
