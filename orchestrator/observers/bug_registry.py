"""Bugs in MLflow: a mirror of the bug database (:mod:`fuzz_core.dedupe`, ``<output>/bugs/``), which
holds each bug's triage state; MLflow shows it, it never decides it.

Layout (in the tracking store every campaign writes to):

- the experiment ``cdeepfuzz-bugs`` holds **one run per bug** (per signature), named
  ``<op> <path:line:col>``, with tags ``signature``, ``triage`` and ``triage.note`` (copied from the
  bug database), ``bug.op``, ``bug.position``, ``bug.phase``, ``hazard``, ``targets`` and
  ``reproducer`` (the smallest reproducer's folder);
- the **site run** a bug is at (the op site of its call, when the campaign searched one and has a run
  per site) carries ``signature``, ``bug.run_id`` (the bug's run) and ``triage``: a copy of the bug's
  state for filtering in the campaign's own view, rewritten on every change of the state.

``cdeepfuzz bugs`` and ``cdeepfuzz triage`` read and write the bug database; ``triage`` and the reuse
phase then mirror the new state here.

Triage states: ``new``, ``confirmed``, ``duplicate``, ``wontfix``, ``fixed``, ``regressed`` (a fixed
bug that triggered again), ``not reproduced`` (a bug whose reproducer no longer triggers).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from fuzz_core.dedupe import TriageState

log = logging.getLogger(__name__)

BUG_EXPERIMENT = "cdeepfuzz-bugs"
PARENT_TAG = "mlflow.parentRunId"
MAX_TAG = 8000


def _pages(fetch: Callable[[str | None], Any]) -> Iterator[Any]:
    token: str | None = None
    while True:
        page = fetch(token)
        yield from page
        token = page.token
        if not token:
            return


def _quote(value: str) -> str:
    if "'" in value or "\\" in value:
        raise ValueError(f"{value!r} must not contain quotes or backslashes")
    return value


def find_bug_run(client, experiment_id: str, signature: str):
    """The bug's run (the oldest, should two campaigns have created one at once), or None."""
    runs = client.search_runs([experiment_id], f"tags.signature = '{_quote(signature)}'",
                              order_by=["attributes.start_time ASC"], max_results=1)
    return runs[0] if runs else None


def bug_experiment(client) -> str | None:
    exp = client.get_experiment_by_name(BUG_EXPERIMENT)
    return exp.experiment_id if exp is not None else None


def occurrences(client, signature: str | None = None) -> list:
    """Every occurrence run (of one signature, or of all) in every campaign experiment."""
    exps = [e.experiment_id for e in _pages(lambda t: client.search_experiments(max_results=1000, page_token=t))
            if e.name != BUG_EXPERIMENT]
    if not exps:
        return []
    where = "tags.status = '{}'" + (f" and tags.signature = '{_quote(signature)}'" if signature else "")
    out = []
    for status in ("found", "flaky"):
        out += [r for r in _pages(lambda t, s=status: client.search_runs(
                    exps, where.format(s), max_results=1000, page_token=t))
                if "signature" in r.data.tags]
    return out


def note_occurrence(client, experiment_id: Callable[[str], str], signature: str, name: str,
                    tags: dict[str, str], occurrence_run_id: str | None) -> str:
    """Mirror an occurrence: create the bug's run if new, set its tags (``triage``: the bug database's
    state), and link the run of the site the bug is at, when it has one. Returns the bug's run id."""
    from mlflow.entities import RunTag

    eid = experiment_id(BUG_EXPERIMENT)
    run = find_bug_run(client, eid, signature)
    state = tags.get("triage") or TriageState.NEW.value
    changed = False
    if run is None:
        run = client.create_run(eid, tags={**tags, "signature": signature, "triage": state}, run_name=name)
        client.set_terminated(run.info.run_id, "FINISHED")
    else:
        changed = run.data.tags.get("triage") != state
        client.log_batch(run.info.run_id, tags=[RunTag(k, str(v)[:MAX_TAG]) for k, v in
                                                {**tags, "triage": state}.items()])
    if occurrence_run_id:
        client.log_batch(occurrence_run_id, tags=[RunTag("bug.run_id", run.info.run_id), RunTag("triage", state),
                                                  RunTag("signature", signature)])
    if changed:
        _mirror(client, signature, state)
    return run.info.run_id


def set_state(client, experiment_id: Callable[[str], str] | None, signature: str, state: str,
              note: str | None = None, tags: dict[str, str] | None = None) -> str | None:
    """Set a bug's state in its run (creating the run when ``experiment_id`` is given and it has none)
    and copy it onto every occurrence's run. Returns the bug's run id (None: no such bug)."""
    from mlflow.entities import RunTag

    eid = experiment_id(BUG_EXPERIMENT) if experiment_id is not None else bug_experiment(client)
    run = find_bug_run(client, eid, signature) if eid is not None else None
    if run is None:
        if experiment_id is None:
            return None
        run = client.create_run(eid, tags={**(tags or {}), "signature": signature}, run_name=signature)
        client.set_terminated(run.info.run_id, "FINISHED")
    updates = {**(tags or {}), "triage": state}
    if note is not None:
        updates["triage.note"] = note
    client.log_batch(run.info.run_id, tags=[RunTag(k, str(v)[:MAX_TAG]) for k, v in updates.items()])
    _mirror(client, signature, state)
    return run.info.run_id


def _mirror(client, signature: str, state: str) -> None:
    from mlflow.entities import RunTag

    for run in occurrences(client, signature):
        if run.data.tags.get("triage") != state:
            client.log_batch(run.info.run_id, tags=[RunTag("triage", state)])


