"""``cdeepfuzz bugs``: bugs, not runs. One row per signature across every campaign of a tracking store.

Each row (``--json`` gives the same): ``signature``, ``triage`` (the bug's state, from its run in
the ``cdeepfuzz-bugs`` experiment), ``note``, ``target``, ``op``, ``location``, ``hazard``,
``first_seen`` and ``last_seen`` (ISO times of its first and last occurrence), ``occurrences``,
``campaigns`` and ``targets`` where it occurred, ``site_ids``, ``runs`` (the occurrences' MLflow
run ids), ``reproducer`` (the folder of its smallest reproducer) and ``bug_run_id``. The store is
found as every command finds it (:func:`orchestrator.config.resolve_tracking_uri`): ``--tracking-uri``,
``MLFLOW_TRACKING_URI``, else the store of the newest run under the current directory.
"""
from __future__ import annotations

from pathlib import Path


class BugsError(ValueError):
    """No store to list, or a bad filter (exit 2)."""


def list_bugs(tracking_uri: str | None, campaign: str | None = None, state: str | None = None,
              cwd: Path | None = None) -> tuple[str, list[dict]]:
    """(the tracking URI, its bugs)."""
    from orchestrator.config import resolve_tracking_uri
    from orchestrator.observers.bug_registry import STATES, list_bugs as registry_bugs, parse_state
    from orchestrator.observers.tracking_sender import _make_client

    uri = resolve_tracking_uri(tracking_uri, search=cwd or Path.cwd())
    if uri is None:
        raise BugsError("no tracking store: give --tracking-uri, set MLFLOW_TRACKING_URI, or run from a folder "
                        "with runs")
    wanted = None
    if state is not None:
        wanted = parse_state(state)
        if wanted is None:
            raise BugsError(f"--state: {state!r} is not one of {', '.join(STATES)}")
    try:
        rows = registry_bugs(_make_client(uri), campaign, wanted.value if wanted else None)
    except ValueError as exc:
        raise BugsError(str(exc)) from None
    return uri, rows
