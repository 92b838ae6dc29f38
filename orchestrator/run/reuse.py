"""The reuse phase (Hypothesis replays its example database before generating anything new): a
campaign first replays every known bug of its targets on the targets as they are now.

Known bugs are those of the output folder's bug database (``<output>/bugs/<signature>/``, each with
its smallest reproducer and its triage state: :mod:`fuzz_core.dedupe`) whose reproducer's target
this campaign runs (matched by name). Each reproducer is replayed where the target is built (the
driver with ``--local``, an actor otherwise):

- a ``fixed`` bug that triggers again becomes ``regressed``, and the terminal says so loudly;
- a ``new``, ``confirmed`` or ``regressed`` bug that no longer triggers becomes ``not reproduced``
  (never silently dropped);
- a ``not reproduced`` bug that triggers again is ``new`` again; other states stay as they are;
- a bug whose reproducer cannot be read, or whose target cannot be built, keeps its state and
  says why.

Every outcome is kept in the run-state store (``known_bugs``) and in ``summary.json``; a new state
goes into the bug database, and, with tracking, MLflow mirrors it.
"""
from __future__ import annotations

import dataclasses
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fuzz_core.dedupe import BugDatabase, after_replay, triage_state
from fuzz_core.findings import FindingError, load_finding
from orchestrator.run.replays import KnownBug

log = logging.getLogger(__name__)


def known_bugs(ctl, root: Path) -> tuple[list[KnownBug], list[dict[str, Any]]]:
    """The known bugs of the campaign's targets that can be replayed, and a record for each of them
    (those that cannot be replayed say why)."""
    names = set(ctl.specs)
    bugs, records = [], []
    for info in BugDatabase(root).bugs():
        sig = info["signature"]
        best_target = (info.get("best") or {}).get("target")
        target = best_target if best_target in names else next((t for t in info.get("targets") or [] if t in names),
                                                               None)
        if target is None:
            continue
        state = triage_state(info)
        record = {"signature": sig, "target": target, "op": info.get("op"), "location": info.get("location"),
                  "position": info.get("position"), "phase": info.get("phase"), "hazard": info.get("hazard"),
                  "label": f"{info.get('op')} ({info.get('phase') or 'forward'}) at {info.get('position')}",
                  "state_before": state, "state": state, "replayed": False, "reproduced": None, "first_op": None,
                  "message": None, "reproducer": None}
        records.append(record)
        folder = Path(info["reproducer"])
        record["reproducer"] = str(folder)
        try:
            loaded = load_finding(folder)
        except FindingError as exc:
            record["message"] = f"the reproducer cannot be read: {exc}"
            continue
        made_by = (loaded.report.get("target") or {}).get("name")
        if made_by != target:
            record["message"] = f"its reproducer is of target {made_by!r}, which this campaign does not run"
            continue
        spec = ctl.specs[target]
        seed = int((loaded.report.get("target") or {}).get("seed", spec.seed))
        bugs.append(KnownBug(sig, record["state"], dataclasses.replace(spec), seed, loaded.report, loaded.inputs,
                             loaded.state, str(folder)))
    return bugs, records


def replay_known_bugs(ctl, root: Path) -> list[dict[str, Any]]:
    """Replay the known bugs of ``ctl``'s targets on its executor; record and report each outcome."""
    bugs, records = known_bugs(ctl, root)
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
    db = BugDatabase(root)
    for record in records:
        if record["state"] != record["state_before"]:
            db.set_triage(record["signature"], record["state"], record.get("message"))
    for record in records:
        ctl.observers.known_bug(record)
    return records
