"""``cdeepfuzz run --resume RUN_FOLDER``: continue a campaign whose driver was killed.

Sites already final (found, exhausted, unreachable, error, timeout) are not searched
again; a site whose finding folder is complete is found even if the summary missed it;
the other sites resume from their last checkpoint; the MLflow runs are reopened.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from fuzz_core.findings import REPORT
from fuzz_core.io import load_arrays, read_json
from fuzz_core.sites import OpSite
from fuzz_core.status import SiteStatus
from orchestrator.config import Campaign, ConfigError, parse_campaign
from orchestrator.run.controller import checkpoint_paths
from orchestrator.observers.summary import FILENAME, SiteRecord

RESUMABLE = (SiteStatus.PENDING, SiteStatus.SEARCHING, SiteStatus.STOPPED)


def load_previous(run_dir: Path) -> tuple[Campaign, dict, dict[str, SiteRecord]]:
    """The campaign, the run section and a record per site of a run folder."""
    path = run_dir / FILENAME
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no {FILENAME})")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a run summary (a JSON {type(data).__name__}, not an object)")
    campaign = parse_campaign((data.get("campaign") or {}).get("config"), path)
    records: dict[str, SiteRecord] = {}
    for s in data.get("sites", []):
        site = OpSite.from_dict(s)
        rec = SiteRecord(site, SiteStatus(s["status"]), int(s.get("steps") or 0), float(s.get("seconds") or 0),
                         _num(s.get("best_loss")), math.inf, s.get("finding"), s.get("error"),
                         mlflow_run_id=s.get("mlflow_run_id"))
        if rec.status in RESUMABLE:
            rec.status = SiteStatus.PENDING
            _attach_checkpoint(run_dir, rec)
        records[site.id] = rec
    _adopt_findings(run_dir, records)
    return campaign, data.get("run") or {}, records


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) else math.inf


def _attach_checkpoint(run_dir: Path, rec: SiteRecord) -> None:
    arrays_path, meta_path = checkpoint_paths(run_dir, rec.site.id)
    if arrays_path.is_file() and meta_path.is_file():
        meta = read_json(meta_path)
        rec.checkpoint = (load_arrays(arrays_path), meta)
        rec.steps = int(meta["step"])
        rec.best_loss = float(meta.get("best", rec.best_loss))


def _adopt_findings(run_dir: Path, records: dict[str, SiteRecord]) -> None:
    """A finding folder written before the driver died counts, even if summary.json missed it."""
    for report in (run_dir / "findings").glob(f"*/{REPORT}"):
        try:
            data = read_json(report)
            site_id = data["site"]["id"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        rec = records.get(site_id)
        if rec is not None:
            rec.status = SiteStatus.FOUND
            rec.finding = report.parent.relative_to(run_dir).as_posix()
            rec.steps = max(rec.steps, int(data.get("step", 0)))
            rec.checkpoint = None
