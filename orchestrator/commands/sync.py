"""``cdeepfuzz sync RUN_FOLDER``: send what a run spooled while its MLflow server was unreachable, once,
then make MLflow agree with the run's state store (a run already in agreement is left as it is: a
finished run is never changed)."""
from __future__ import annotations

from pathlib import Path

from orchestrator.config import ConfigError


def sync(run_folder: Path, tracking_uri: str | None = None) -> tuple[str, object]:
    """(the URI, the replay's counts: sent, dropped, left, mirrored); ConfigError for usage."""
    from fuzz_core.io import read_json
    from orchestrator.config import resolve_tracking_uri
    from orchestrator.observers.tracking_sender import replay_spool

    summary = run_folder / "summary.json"
    if tracking_uri is None and summary.is_file():
        try:
            read_json(summary)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{summary}: cannot be read ({exc}): give --tracking-uri") from None
    uri = resolve_tracking_uri(tracking_uri, run_dir=run_folder)
    if not uri:
        raise ConfigError(f"{run_folder}: no tracking URI: give --tracking-uri")
    return uri, replay_spool(uri, run_folder)
