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
    from fuzz_core.io import read_json
    from orchestrator.observers.summary import FILENAME, tracking_uri_of

    cwd = cwd or Path.cwd()
    newest, uri = -1.0, None
    for summary in cwd.glob(f"**/{FILENAME}"):
        try:
            mtime = summary.stat().st_mtime
            if mtime > newest:
                run_uri = tracking_uri_of(read_json(summary))
                if run_uri:
                    newest, uri = mtime, run_uri
        except (OSError, ValueError):
            continue
    return uri


def list_bugs(uri: str, campaign: str | None = None, state: str | None = None) -> list[dict]:
    from orchestrator.observers.tracking_queries import query_findings

    return query_findings(uri, campaign=campaign, state=state)
