"""``summary.json``: what a run did, per target and per site (schema_version 1).

Written atomically at the start of the run, after every change of a site's
status, and at the end, so a killed run still leaves a readable summary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fuzz_core.io import atomic_write_json
from fuzz_core.sites import OpSite
from fuzz_core.status import SiteStatus

SCHEMA_VERSION = 1
FILENAME = "summary.json"


def tracking_uri_of(summary: Any) -> str | None:
    """The tracking URI a parsed summary.json names for its run; None when the file names none
    or is not shaped like a summary (a hand-edited or truncated file)."""
    run = summary.get("run") if isinstance(summary, dict) else None
    uri = run.get("tracking_uri") if isinstance(run, dict) else None
    return uri or None


@dataclass
class SiteRecord:
    site: OpSite
    status: SiteStatus = SiteStatus.PENDING
    steps: int = 0
    seconds: float = 0.0
    best_loss: float = math.inf
    last_loss: float = math.inf
    finding: str | None = None          # finding folder, relative to the run folder
    error: str | None = None
    checkpoint: Any = None
    deaths: int = 0
    timeouts: int = 0
    mlflow_run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        s = self.site
        return {
            "id": s.id, "label": s.label, "target": s.target, "op": s.op, "kind": s.kind,
            "hazard": s.hazard, "location": s.location, "occurrence": s.occurrence,
            "status": self.status.value, "steps": self.steps, "seconds": round(self.seconds, 4),
            "best_loss": _finite(self.best_loss), "finding": self.finding, "error": self.error,
            "mlflow_run_id": self.mlflow_run_id,
        }


@dataclass
class TargetRecord:
    name: str
    entry: str
    framework: str | None
    status: str = "ok"                  # ok | error
    error: str | None = None
    traceback: str | None = None
    sites: int = 0
    recorded: list[dict] = field(default_factory=list)   # stable ops recorded but not searched

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "entry": self.entry, "framework": self.framework, "status": self.status,
                "error": self.error, "traceback": self.traceback, "sites": self.sites, "recorded": self.recorded}


def _finite(x: float) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_summary(run_dir: Path, campaign: dict, run: dict, targets: list[TargetRecord],
                  sites: list[SiteRecord]) -> Path:
    counts = {status.value: 0 for status in SiteStatus}
    for rec in sites:
        counts[rec.status.value] += 1
    data = {
        "schema_version": SCHEMA_VERSION,
        "campaign": campaign,
        "run": run,
        "targets": [t.to_dict() for t in targets],
        "sites": [s.to_dict() for s in sites],
        "totals": {"targets": len(targets), "sites": len(sites), "steps": sum(s.steps for s in sites),
                   "findings": sum(1 for s in sites if s.finding), **counts},
    }
    path = Path(run_dir) / FILENAME
    atomic_write_json(path, data)
    return path
