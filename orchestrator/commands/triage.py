"""``cdeepfuzz triage``: set the triage state of a finding on its MLflow site run.

A finding is named by its folder (``<run>/findings/<name>/``) or by the MLflow run id of its
site run. For a folder, the run id comes from the run's ``summary.json`` (``sites[].mlflow_run_id``)
or, failing that, from MLflow itself (a site run of the same campaign and site id tagged
``status=found``; the last one MLflow lists when several runs found the same site). The
tracking URI is, in this order: ``--tracking-uri``, the run's own (``summary.json``),
``MLFLOW_TRACKING_URI``, the store of the newest run under the current directory.

The states are tags on the site run (``triage``, ``triage.note``): ``cdeepfuzz bugs --state``
filters on them. Every finding starts as ``new``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from fuzz_core.findings import REPORT
from fuzz_core.io import read_json
from orchestrator.observers.summary import FILENAME as SUMMARY
from orchestrator.observers.summary import tracking_uri_of


class TriageState(str, Enum):
    NEW = "new"
    CONFIRMED = "confirmed"
    DUPLICATE = "duplicate"
    WONTFIX = "wontfix"
    FIXED = "fixed"

    def __str__(self) -> str:
        return self.value


STATES = tuple(s.value for s in TriageState)


class TriageError(ValueError):
    """A finding or run that cannot be triaged as asked (exit 2)."""


@dataclass(frozen=True)
class TriageResult:
    uri: str
    run_id: str
    label: str
    state: TriageState
    note: str | None

    def describe(self) -> str:
        note = f" ({self.note})" if self.note else ""
        return f"triage: {self.label or self.run_id} -> {self.state}{note} [MLflow run {self.run_id} in {self.uri}]"


def parse_state(state: str) -> TriageState:
    try:
        return TriageState(str(state).strip().lower())
    except ValueError:
        raise TriageError(f"--state: {state!r} is not one of {', '.join(STATES)}") from None


def triage(finding: str | Path, state: str, note: str | None = None, tracking_uri: str | None = None,
           cwd: Path | None = None) -> TriageResult:
    """Set the triage state (and note) of a finding folder or an MLflow site run id."""
    from orchestrator.observers.tracking_queries import set_triage

    wanted = parse_state(state)
    uri, run_id, label = resolve(finding, tracking_uri, cwd)
    try:
        set_triage(uri, run_id, wanted.value, note)
    except Exception as exc:  # noqa: BLE001 - MLflow raises its own exception types
        raise TriageError(f"cannot set the triage of run {run_id} in {uri}: {exc}") from None
    return TriageResult(uri, run_id, label, wanted, note)


def resolve(finding: str | Path, tracking_uri: str | None = None, cwd: Path | None = None) -> tuple[str, str, str]:
    """(tracking URI, MLflow run id, label) of a finding folder or a run id."""
    path = Path(finding)
    if path.is_dir():
        return _from_folder(path, tracking_uri, cwd)
    if path.exists() or "/" in str(finding) or os.sep in str(finding):
        raise TriageError(f"{finding}: not a finding folder (no {REPORT}) and not an MLflow run id")
    uri = _default_uri(tracking_uri, None, cwd)
    return uri, str(finding), ""


def _from_folder(folder: Path, tracking_uri: str | None, cwd: Path | None) -> tuple[str, str, str]:
    if not (folder / REPORT).is_file():
        raise TriageError(f"{folder}: not a finding folder (no {REPORT})")
    report = read_json(folder / REPORT)
    site = report.get("site") or {}
    site_id, label = str(site.get("id", "")), str(site.get("label", ""))
    run_dir = folder.parent.parent if folder.parent.name == "findings" else None
    summary = _summary(run_dir)
    uri = _default_uri(tracking_uri, tracking_uri_of(summary), cwd)
    run_id = next((s.get("mlflow_run_id") for s in summary.get("sites", []) if s.get("id") == site_id), None)
    if not run_id:
        run_id = _search_run(uri, (summary.get("campaign") or {}).get("name"), site_id, folder)
    return uri, run_id, label


def _summary(run_dir: Path | None) -> dict:
    if run_dir is None or not (run_dir / SUMMARY).is_file():
        return {}
    try:
        summary = read_json(run_dir / SUMMARY)
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _default_uri(cli: str | None, own: str | None, cwd: Path | None) -> str:
    from orchestrator.commands.bugs import find_tracking_uri

    uri = cli or own or find_tracking_uri(None, cwd)
    if not uri:
        raise TriageError("no tracking store: give --tracking-uri, set MLFLOW_TRACKING_URI, "
                          "or run from a folder with runs")
    return uri


def _search_run(uri: str, campaign: str | None, site_id: str, folder: Path) -> str:
    from orchestrator.observers.tracking_queries import query_findings

    try:
        rows = [r for r in query_findings(uri, campaign=campaign) if r.get("site_id") == site_id]
    except Exception as exc:  # noqa: BLE001
        raise TriageError(f"cannot search {uri} for site {site_id}: {exc}") from None
    if not rows:
        raise TriageError(f"{folder}: no MLflow site run with status=found for site {site_id} in {uri}; "
                          "give the run id instead")
    return rows[-1]["run_id"]
