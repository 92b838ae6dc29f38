"""The read side of MLflow tracking: findings of past campaigns, and their triage.

:func:`query_findings` lists the site runs that found a bug, from their tags;
:func:`set_triage` tags one with a triage state (and a note). The runs are those
:class:`orchestrator.observers.tracking.Tracker` wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.observers.tracking import MAX_TAG_VALUE
from orchestrator.observers.tracking_sender import PARENT_TAG, _make_client

__all__ = ["query_findings", "set_triage"]

# query_findings columns read from tags of a site run
_FINDING_TAGS = {
    "site_id": "site.id",
    "target": "site.target",
    "op": "site.op",
    "hazard": "hazard",
    "location": "site.location",
    "status": "status",
    "triage": "triage",
    "signature": "signature",
}


def _pages(fetch: Callable[[str | None], Any]) -> Iterator[Any]:
    """Every item of a paged MLflow search."""
    token: str | None = None
    while True:
        page = fetch(token)
        yield from page
        token = page.token
        if not token:
            return


def _as_int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def query_findings(uri: str, campaign: str | None = None, state: str | None = None) -> list[dict]:
    """Site runs tagged ``status=found`` (optionally of one campaign, in one triage state).

    Each dict: site_id, label (run name), target, op, hazard, location, steps (metric or
    tag ``steps``), status, triage, signature, run_id, campaign (experiment name).
    """
    if state is not None and ("'" in state or "\\" in state):
        raise ValueError(f"triage state {state!r} must not contain quotes or backslashes")
    client = _make_client(uri)
    if campaign is not None:
        exp = client.get_experiment_by_name(campaign)
        experiments = {exp.experiment_id: exp.name} if exp is not None else {}
    else:
        found = _pages(lambda t: client.search_experiments(max_results=1000, page_token=t))
        experiments = {e.experiment_id: e.name for e in found}
    if not experiments:
        return []
    where = "tags.status = 'found'" + (f" and tags.triage = '{state}'" if state is not None else "")
    ids = list(experiments)
    runs = _pages(lambda t: client.search_runs(ids, where, max_results=1000, page_token=t))
    return [
        {
            **{name: run.data.tags.get(tag) for name, tag in _FINDING_TAGS.items()},
            "label": run.info.run_name,
            "steps": _as_int(run.data.metrics.get("steps", run.data.tags.get("steps"))),
            "run_id": run.info.run_id,
            "campaign": experiments[run.info.experiment_id],
        }
        for run in runs
        if PARENT_TAG in run.data.tags
    ]


def set_triage(uri: str, run_id: str, state: str, note: str | None = None) -> None:
    """Set tags ``triage`` (and ``triage.note``) on a site run."""
    from mlflow.entities import RunTag

    tags = [RunTag("triage", str(state)[:MAX_TAG_VALUE])]
    if note is not None:
        tags.append(RunTag("triage.note", str(note)[:MAX_TAG_VALUE]))
    _make_client(uri).log_batch(run_id, tags=tags)
