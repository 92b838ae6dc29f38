"""Bugs in MLflow: one place per bug that holds its triage state, and a tag on each occurrence's run.

Layout (in the tracking store every campaign writes to):

- the experiment ``cdeepfuzz-bugs`` holds **one run per bug** (per signature), named
  ``<target> <op> <location>``, with tags ``signature``, ``triage`` (the bug's state, the only
  authoritative copy), ``triage.note``, ``site.target``, ``site.op``, ``site.location``, ``hazard``
  and ``reproducer`` (the smallest reproducer's folder). ``cdeepfuzz triage`` and the reuse
  phase change it there.
- each **occurrence** (a site run with ``status`` found or flaky, in its campaign's experiment)
  carries ``signature``, ``bug.run_id`` (the bug's run) and ``triage``: a copy of the bug's state
  for filtering in the campaign's own view, rewritten on every change of the state.

``cdeepfuzz bugs`` reads both: the states from the bug runs, and first seen, last seen,
occurrences, campaigns and targets from the occurrence runs.

Triage states: ``new``, ``confirmed``, ``duplicate``, ``wontfix``, ``fixed``, ``regressed`` (a fixed
bug that triggered again), ``not reproduced`` (a bug whose reproducer no longer triggers).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

log = logging.getLogger(__name__)

BUG_EXPERIMENT = "cdeepfuzz-bugs"
PARENT_TAG = "mlflow.parentRunId"
MAX_TAG = 8000


class TriageState(str, Enum):
    NEW = "new"
    CONFIRMED = "confirmed"
    DUPLICATE = "duplicate"
    WONTFIX = "wontfix"
    FIXED = "fixed"
    REGRESSED = "regressed"
    NOT_REPRODUCED = "not reproduced"

    def __str__(self) -> str:
        return self.value


STATES = tuple(s.value for s in TriageState)


def parse_state(text: str) -> TriageState | None:
    """A state from what a person types (``not-reproduced``, ``Not_Reproduced`` ...); None if unknown."""
    key = str(text).strip().lower().replace("-", " ").replace("_", " ")
    return next((s for s in TriageState if s.value == key), None)


def after_occurrence(state: str) -> str:
    """A bug's state once it occurred again: a fixed bug regressed; one not reproduced is new again."""
    if state == TriageState.FIXED.value:
        return TriageState.REGRESSED.value
    if state == TriageState.NOT_REPRODUCED.value:
        return TriageState.NEW.value
    return state


def after_replay(state: str, reproduced: bool | None) -> str:
    """A bug's state after the reuse phase replayed its reproducer (None: it could not be replayed)."""
    if reproduced is None:
        return state
    if reproduced:
        return after_occurrence(state)
    if state in (TriageState.NEW.value, TriageState.CONFIRMED.value, TriageState.REGRESSED.value):
        return TriageState.NOT_REPRODUCED.value
    return state


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
    """Record an occurrence: create the bug's run if new (``triage`` ``new``), reopen a fixed bug as
    regressed, refresh its tags, and link the occurrence's run to it. Returns the bug's run id."""
    from mlflow.entities import RunTag

    eid = experiment_id(BUG_EXPERIMENT)
    run = find_bug_run(client, eid, signature)
    changed = False
    if run is None:
        run = client.create_run(eid, tags={**tags, "signature": signature, "triage": TriageState.NEW.value},
                                run_name=name)
        client.set_terminated(run.info.run_id, "FINISHED")
        state = TriageState.NEW.value
    else:
        before = run.data.tags.get("triage", TriageState.NEW.value)
        state = after_occurrence(before)
        updates = {**tags, "triage": state}
        changed = state != before
        if changed:
            updates["triage.note"] = f"{before} -> {state}: it occurred again"
        client.log_batch(run.info.run_id, tags=[RunTag(k, str(v)[:MAX_TAG]) for k, v in updates.items()])
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


def states(client) -> dict[str, dict[str, Any]]:
    """Every bug's run: signature -> its tags and run id (the oldest run per signature)."""
    eid = bug_experiment(client)
    if eid is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    runs = _pages(lambda t: client.search_runs([eid], "", order_by=["attributes.start_time ASC"],
                                               max_results=1000, page_token=t))
    for run in runs:
        sig = run.data.tags.get("signature")
        if sig and sig not in out:
            out[sig] = {**run.data.tags, "bug_run_id": run.info.run_id}
    return out


def list_bugs(client, campaign: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
    """One row per signature: its state, first and last seen, occurrences, campaigns, targets, reproducer."""
    names = {e.experiment_id: e.name
             for e in _pages(lambda t: client.search_experiments(max_results=1000, page_token=t))}
    known = states(client)
    rows: dict[str, dict[str, Any]] = {}
    for run in occurrences(client):
        tags = run.data.tags
        sig = tags["signature"]
        row = rows.setdefault(sig, {"signature": sig, "target": tags.get("site.target"), "op": tags.get("site.op"),
                                    "location": tags.get("site.location"), "hazard": tags.get("hazard"),
                                    "first_seen": run.info.start_time, "last_seen": run.info.start_time,
                                    "occurrences": 0, "campaigns": set(), "targets": set(), "site_ids": set(),
                                    "runs": []})
        row["occurrences"] += 1
        row["first_seen"] = min(row["first_seen"], run.info.start_time)
        row["last_seen"] = max(row["last_seen"], run.info.start_time)
        row["campaigns"].add(names.get(run.info.experiment_id, run.info.experiment_id))
        row["targets"].add(tags.get("site.target"))
        row["site_ids"].add(tags.get("site.id"))
        row["runs"].append(run.info.run_id)
    for sig, bug in known.items():
        row = rows.setdefault(sig, {"signature": sig, "target": bug.get("site.target"), "op": bug.get("site.op"),
                                    "location": bug.get("site.location"), "hazard": bug.get("hazard"),
                                    "first_seen": None, "last_seen": None, "occurrences": 0, "campaigns": set(),
                                    "targets": {bug.get("site.target")}, "site_ids": set(), "runs": []})
    out = []
    for sig, row in rows.items():
        bug = known.get(sig, {})
        row.update(triage=bug.get("triage", TriageState.NEW.value), note=bug.get("triage.note"),
                   reproducer=bug.get("reproducer"), bug_run_id=bug.get("bug_run_id"),
                   first_seen=_iso(row["first_seen"]), last_seen=_iso(row["last_seen"]),
                   campaigns=sorted(c for c in row["campaigns"] if c), targets=sorted(t for t in row["targets"] if t),
                   site_ids=sorted(s for s in row["site_ids"] if s))
        if campaign is not None and campaign not in row["campaigns"]:
            continue
        if state is not None and row["triage"] != state:
            continue
        out.append(row)
    return sorted(out, key=lambda r: (r["last_seen"] or "", r["signature"]), reverse=True)


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds")
