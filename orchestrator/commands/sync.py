"""``cdeepfuzz sync RUN_FOLDER``: send what a run spooled while its MLflow server was unreachable."""
from __future__ import annotations

from pathlib import Path

from orchestrator.config import ConfigError


def sync(run_folder: Path, tracking_uri: str | None = None) -> tuple[str | None, object]:
    """(the URI, the replay's counts), or (None, None) when nothing is spooled; ConfigError for usage."""
    from fuzz_core.io import read_json
    from orchestrator.config import resolve_tracking_uri
    from orchestrator.observers.tracking_sender import SPOOL_NAME, replay_spool

    summary = run_folder / "summary.json"
    if tracking_uri is None and summary.is_file():
        try:
            read_json(summary)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{summary}: cannot be read ({exc}): give --tracking-uri") from None
    uri = resolve_tracking_uri(tracking_uri, run_dir=run_folder)
    if not uri:
        raise ConfigError(f"{run_folder}: no tracking URI: give --tracking-uri")
    if not (run_folder / SPOOL_NAME).is_file():
        return None, run_folder / SPOOL_NAME
    return uri, replay_spool(uri, run_folder)
