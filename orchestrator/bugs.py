"""``cdeepfuzz bugs``: findings from MLflow, wherever the store is."""
from __future__ import annotations

import os
from pathlib import Path


def find_tracking_uri(cli_uri: str | None, cwd: Path | None = None) -> str | None:
    """``--tracking-uri``, else MLFLOW_TRACKING_URI, else the store of the newest run under the cwd."""
    if cli_uri:
        return cli_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    import json

    from orchestrator.summary import FILENAME

    cwd = cwd or Path.cwd()
    newest, uri = -1.0, None
    for summary in cwd.glob(f"**/{FILENAME}"):
        try:
            mtime = summary.stat().st_mtime
            if mtime > newest:
                data = json.loads(summary.read_text())
                run_uri = (data.get("run") or {}).get("tracking_uri")
                if run_uri:
                    newest, uri = mtime, run_uri
        except (OSError, ValueError):
            continue
    return uri


def list_bugs(uri: str, campaign: str | None = None, state: str | None = None) -> list[dict]:
    from orchestrator.tracking_queries import query_findings

    return query_findings(uri, campaign=campaign, state=state)
