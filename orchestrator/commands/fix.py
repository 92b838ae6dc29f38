"""``cdeepfuzz fix FINDING``: a guard at the op, verified by searching the guarded program, printed as a
patch of the user's line; or one sentence that says there is no fix, and why.

``FINDING`` is a finding folder or one of its files (``finding.json``), resolved as ``replay``
resolves it; any finding folder: a site's own finding or one its search passed on the way (the op
guarded is the one that went non-finite first, :func:`fuzz_core.fixes.guarded_op`). The verdict is
written into ``finding.json`` (section ``fix``; the verified guard's patch in ``fix.diff``, for
``git apply`` in the folder the campaign ran in) and recorded on the finding's MLflow run, beside the
finding: tags ``fix.verdict``, ``fix.guard``, ``fix.message``, ``fix.steps`` and the artifacts
``finding/finding.json`` and ``finding/fix.diff``. The tracking store is found as every command
finds it (:func:`orchestrator.config.resolve_tracking_uri`: ``--tracking-uri``, the run's own,
``MLFLOW_TRACKING_URI``); when none is reachable, one line says so and ``finding.json`` still
holds the verdict.

Exit codes as ``replay``: 0 a verified fix (its diff printed), 1 none, 2 usage, 3 the target could not
be built or its program raised (the same line as ``cdeepfuzz run``), 5 an internal error of CDeepFuzz."""
from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_TAG = 5000      # MLflow's limit on a tag value (older servers)


def fix(folder: Path, budget: int, trust: bool = False, device: str = "cpu",
        tracking_uri: str | None = None) -> dict[str, Any]:
    """The ``fix`` section written into the finding, with ``mlflow``: where the verdict was recorded
    (FindingError/ReplayError for usage, TargetBroken)."""
    from fuzz_core.backends.base import Precision, RunnerOptions
    from fuzz_core.engine import TargetSpec
    from fuzz_core.findings import FindingError, load_finding
    from fuzz_core.fixes import framework_of, suggest_and_verify
    from orchestrator.commands.replay import (ReplayError, TargetBroken, build_target, check_entry_exists,
                                              check_trusted, finding_folder)
    from orchestrator.run.failures import from_exception

    folder = finding_folder(folder)
    try:
        report = load_finding(folder).report
    except FindingError as exc:
        raise ReplayError(str(exc)) from None
    entry = str(report["target"].get("entry", ""))
    runner = None
    if framework_of(report) == "torch":
        check_trusted(entry, trust)
        check_entry_exists(entry, folder)
        runner = build_target(TargetSpec.from_dict(report["target"]),
                              RunnerOptions(device=device, search_weights=report.get("trigger") == "weights",
                                            precision=Precision.from_dict(report.get("precision"))))
    try:
        section = suggest_and_verify(folder, budget, device=device, runner=runner)
    except Exception as exc:  # noqa: BLE001 - the program raised under the guard, or CDeepFuzz did
        raise TargetBroken(str(report["target"].get("name", "")), from_exception(exc)) from None
    section["mlflow"] = record(folder, section, tracking_uri)
    _update(folder, section)
    return section


def shown(section: dict[str, Any]) -> list[str]:
    """What ``cdeepfuzz fix`` prints: the verdict in one line (the diff's guard, or "no fix for the ...: why."),
    each guard tried (or not written, and why), the patch, and where MLflow recorded it."""
    out = [section["message"]]
    for attempt in section.get("attempts", []):
        residual = attempt.get("residual") or {}
        if attempt["status"] == "no patch":
            out.append(f"  - {attempt['guard']['description']}: not written: {attempt.get('why')}")
            continue
        out.append(f"  - {attempt['guard']['description']}: {attempt['status']} ({attempt['steps']} steps)"
                   + (f": {residual.get('explanation')}" if residual else ""))
    if section.get("diff"):
        out.append(section["diff"].rstrip("\n"))
    if (section.get("mlflow") or {}).get("message"):
        out.append(section["mlflow"]["message"])
    return out


def _update(folder: Path, section: dict[str, Any]) -> None:
    from fuzz_core.findings import REPORT
    from fuzz_core.io import atomic_write_json, read_json

    report = read_json(folder / REPORT)
    report["fix"] = section
    atomic_write_json(folder / REPORT, report)


def record(folder: Path, section: dict[str, Any], tracking_uri: str | None = None) -> dict[str, Any]:
    """Tag the finding's MLflow run with the verdict and log ``finding.json`` and ``fix.diff`` beside the
    finding's artifacts. Returns ``{"recorded", "uri", "run_id", "message"}``; ``message`` is the one
    line to print, recorded or not (never raises: the verdict is in ``finding.json`` either way)."""
    from fuzz_core.findings import REPORT
    from fuzz_core.fixes import DIFF_FILE
    from fuzz_core.io import read_json
    from orchestrator.config import resolve_tracking_uri

    folder = Path(folder)
    run_dir = folder.parent.parent if folder.parent.name == "findings" else None
    uri = resolve_tracking_uri(tracking_uri, run_dir=run_dir)
    out: dict[str, Any] = {"recorded": False, "uri": uri, "run_id": None}

    def said(message: str) -> dict[str, Any]:
        return {**out, "message": f"MLflow: {message}"}

    summary: dict[str, Any] = {}
    if run_dir is not None:
        try:
            summary = read_json(run_dir / "summary.json")
        except (OSError, ValueError):
            summary = {}
    site = _site_of(folder, run_dir, summary)
    # a finding the site's search stepped past (another op's): recorded beside the site's own finding,
    # in the site's run, under passed/<folder>/ (and its tags prefixed so), as the MLflow observer logs it
    past = _passed_by(folder, run_dir, summary)
    run = summary.get("run") if isinstance(summary.get("run"), dict) else {}
    if not summary:
        return said("not recorded: the finding is not in a run folder with a summary.json (<run>/findings/<name>), "
                    "so it has no MLflow run; the verdict is in finding.json")
    if not uri:
        return said("not recorded: no tracking store (the finding's run had tracking off; give --tracking-uri "
                    "or MLFLOW_TRACKING_URI); the verdict is in finding.json")
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        return said(f"not recorded: the tracking store {uri} is not reachable (no such file); the verdict is in "
                    f"finding.json")
    try:
        from orchestrator.observers.tracking_sender import _make_client

        client = _make_client(uri)
        rid = ((past or site or {}).get("mlflow_run_id")
               or _search_run(client, run.get("mlflow_run_id"), folder))
        if rid is None:
            return said(f"not recorded: no MLflow run of this finding in {uri} (the finding's run tracked no "
                        f"run for it); the verdict is in finding.json")
        out["run_id"] = rid
        from mlflow.entities import RunTag

        rec = section.get("recommended") or {}
        tags = {"fix.verdict": section.get("status", ""), "fix.guard": rec.get("code") or "none",
                "fix.description": rec.get("description") or "none", "fix.message": section.get("message", ""),
                "fix.steps": str((section.get("checked") or {}).get("steps") or 0),
                "fix.budget": str(section.get("budget", "")), "fix.created": section.get("created", "")}
        prefix, where = (f"passed.{folder.name}.", f"passed/{folder.name}") if past else ("", "finding")
        client.log_batch(rid, tags=[RunTag(prefix + k, str(v)[:MAX_TAG]) for k, v in tags.items()])
        for name in (REPORT, DIFF_FILE):
            if (folder / name).is_file():
                client.log_artifact(rid, str(folder / name), artifact_path=where)
    except Exception as exc:  # noqa: BLE001 - MLflow raises its own exception types; the store is down
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return said(f"not recorded: the tracking store {uri} is not reachable ({first}); the verdict is in "
                    f"finding.json")
    out["recorded"] = True
    return said(f"fix.verdict={section.get('status')} recorded on run {rid} ({uri})")


def _site_of(folder: Path, run_dir: Path | None, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The summary's site whose finding is this folder."""
    if run_dir is None or not isinstance(summary.get("sites"), list):
        return None
    here = folder.resolve()
    for site in summary["sites"]:
        if isinstance(site, dict) and site.get("finding") and (run_dir / site["finding"]).resolve() == here:
            return site
    return None


def _passed_by(folder: Path, run_dir: Path | None, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The summary's site whose search stepped past this folder's finding (its ``finding`` too, when its
    own op then never fired)."""
    if run_dir is None or not isinstance(summary.get("sites"), list):
        return None
    here = folder.resolve()
    for site in summary["sites"]:
        if isinstance(site, dict) and any((run_dir / p).resolve() == here for p in site.get("passed") or []):
            return site
    return None


def _search_run(client, parent: str | None, folder: Path) -> str | None:
    """A campaign above ``tracking.max_site_runs`` sites has one run per finding (not per site), whose id
    the summary does not keep: the child of the campaign's run with the finding's ``site.id``, and of
    those the one whose ``finding.folder`` is this folder (a site's search may have stepped past another
    op's finding first: a run of its own)."""
    from fuzz_core.findings import load_finding

    if not parent:
        return None
    site_id = load_finding(folder).site.id.replace("'", "")
    experiment = client.get_run(parent).info.experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.`site.id` = '{site_id}' and "
                                                          f"tags.`mlflow.parentRunId` = '{parent}'", max_results=5)
    runs = [r for r in runs if r.data.tags.get("signature")] or runs
    here = folder.resolve()
    runs = [r for r in runs if _same_folder(r.data.tags.get("finding.folder"), here)] or runs
    return runs[0].info.run_id if runs else None


def _same_folder(tag: str | None, here: Path) -> bool:
    try:
        return bool(tag) and Path(tag).resolve() == here
    except (OSError, ValueError):
        return False
