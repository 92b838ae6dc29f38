"""The reuse phase (Hypothesis replays its example database before generating anything new): a
campaign first replays every known bug of its targets on the targets as they are now.

Known bugs are those of the output folder's bug store (``<output>/bugs/<signature>/``, each with
its smallest reproducer) and of the tracking store's bug registry
(:mod:`orchestrator.observers.bug_registry`, which holds their triage states), for the targets
this campaign runs (matched by name). Each reproducer is replayed where the target is built
(the driver with ``--local``, an actor otherwise):

- a ``fixed`` bug that triggers again becomes ``regressed``, and the terminal says so loudly;
- a ``new``, ``confirmed`` or ``regressed`` bug that no longer triggers becomes ``not reproduced``
  (never silently dropped);
- a ``not reproduced`` bug that triggers again is ``new`` again; other states stay as they are;
- a bug whose reproducer cannot be found, or whose target cannot be built, keeps its state and
  says why.

Every outcome is kept in the run-state store (``known_bugs``), in ``summary.json`` and, with
tracking, as the bug's new state in MLflow.
"""
from __future__ import annotations

import dataclasses
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fuzz_core.dedupe import BugDatabase
from fuzz_core.findings import FindingError, load_finding
from orchestrator.observers.bug_registry import after_replay
from orchestrator.observers.bugstore import reproducer_folder
from orchestrator.run.replays import KnownBug

log = logging.getLogger(__name__)


def registry_states(uri: str | None) -> dict[str, dict[str, Any]]:
    """The bug registry's runs (signature -> tags), or {} without tracking or when it cannot be read."""
    if not uri:
        return {}
    try:
        from orchestrator.observers.bug_registry import states
        from orchestrator.observers.tracking_sender import _make_client

        return states(_make_client(uri))
    except Exception as exc:  # noqa: BLE001 - the campaign goes on without the states
        log.warning("known bugs: cannot read the bug registry in %s: %s", uri, exc)
        return {}


def known_bugs(ctl, root: Path, uri: str | None) -> tuple[list[KnownBug], list[dict[str, Any]]]:
    """The known bugs of the campaign's targets that can be replayed, and a record for each of them
    (those that cannot be replayed say why)."""
    names = set(ctl.specs)
    registry = registry_states(uri)
    local = {b["signature"]: b for b in BugDatabase(root).bugs()}
    signatures = [s for s, b in local.items() if (b.get("target") or b.get("bug", {}).get("target")) in names]
    signatures += [s for s, b in registry.items() if b.get("site.target") in names and s not in local]
    bugs, records = [], []
    for sig in signatures:
        tags = registry.get(sig, {})
        info = local.get(sig, {})
        target = info.get("target") or tags.get("site.target")
        record = {"signature": sig, "target": target, "op": info.get("op") or tags.get("site.op"),
                  "location": info.get("location") or tags.get("site.location"),
                  "hazard": info.get("hazard") or tags.get("hazard"),
                  "label": f"{target} {info.get('op') or tags.get('site.op')} "
                           f"{info.get('location') or tags.get('site.location')}",
                  "state_before": tags.get("triage", "new"), "state": tags.get("triage", "new"),
                  "replayed": False, "reproduced": None, "first_op": None, "message": None,
                  "reproducer": None}
        records.append(record)
        folder = _reproducer(root, sig, tags.get("reproducer"))
        if folder is None:
            record["message"] = "no reproducer to replay (not in this output's bug store)"
            continue
        record["reproducer"] = str(folder)
        try:
            loaded = load_finding(folder)
        except FindingError as exc:
            record["message"] = f"the reproducer cannot be read: {exc}"
            continue
        spec = ctl.specs[target]
        seed = int((loaded.report.get("target") or {}).get("seed", spec.seed))
        bugs.append(KnownBug(sig, record["state"], dataclasses.replace(spec), seed, loaded.report, loaded.inputs,
                             loaded.state, str(folder)))
    return bugs, records


def _reproducer(root: Path, signature: str, tagged: str | None) -> Path | None:
    for folder in (reproducer_folder(root, signature), Path(tagged) if tagged else None):
        if folder is not None and (folder / "finding.json").is_file():
            return folder
    return None


def replay_known_bugs(ctl, root: Path, uri: str | None) -> list[dict[str, Any]]:
    """Replay the known bugs of ``ctl``'s targets on its executor; record and report each outcome."""
    bugs, records = known_bugs(ctl, root, uri)
    if not records:
        return []
    ctl.observers.message(f"cdeepfuzz: replaying {len(bugs)} known bug(s) of these targets first")
    outcomes = {o.signature: o for o in ctl.executor.replay(bugs)} if bugs else {}
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with ctl.store.transaction():
        for order, record in enumerate(records):
            outcome = outcomes.get(record["signature"])
            if outcome is not None:
                record.update(replayed=outcome.reproduced is not None, reproduced=outcome.reproduced,
                              first_op=outcome.first_op, replayed_at=stamp,
                              state=after_replay(record["state_before"], outcome.reproduced))
                if outcome.moved_to:        # a finding at its new lines is an occurrence of this bug
                    record["moved_to"] = outcome.moved_to
                if outcome.error:
                    record["message"] = f"the target could not be built or run: {outcome.error}"
                elif record["state"] != record["state_before"]:
                    record["message"] = (f"{record['state_before']} -> {record['state']}: the reproducer "
                                         f"{'triggers again' if outcome.reproduced else 'no longer triggers'}")
                if outcome.moves:
                    record["message"] = "; ".join([*filter(None, [record["message"]]),
                                                   "reproduced where its line of code sits now", *outcome.moves])
            ctl.store.put_known_bug(record["signature"], order, record)
    for record in records:
        ctl.observers.known_bug(record)
    return records
