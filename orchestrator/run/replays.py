"""Replaying a known bug's reproducer on the target as it is now (the reuse phase's unit of work).

It runs where the target can be built: in the driver with ``--local``, on an actor otherwise
(the reproducer's values travel with the task, so the actor needs no shared disk).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fuzz_core.backends.base import Precision, RunnerOptions
from fuzz_core.engine import TargetSpec, fresh_runner, replay, replay_verdict
from fuzz_core.findings import LoadedFinding, report_signature


@dataclass
class KnownBug:
    """A bug of a campaign's target, with its smallest reproducer, to replay on today's code."""

    signature: str
    state: str                          # its triage state before the replay
    spec: TargetSpec                    # the campaign's spec of the target
    seed: int                           # the seed the reproducer's factory was called with
    report: dict[str, Any]              # the reproducer's finding.json
    inputs: dict[str, np.ndarray]
    values_state: dict[str, np.ndarray] | None
    folder: str                         # the reproducer folder, for the record


@dataclass
class ReplayOutcome:
    signature: str
    reproduced: bool | None             # None: the target could not be built, or the replay raised
    first_op: str | None = None
    error: str | None = None
    traceback: str | None = None
    moves: tuple[str, ...] = ()          # reproduced where its lines of code sit now: what moved
    moved_to: str | None = None         # ... and the signature the bug has at those lines


def replay_known(worker, bug: KnownBug) -> ReplayOutcome:
    """Replay ``bug`` in a fresh build of its target (from the seed its reproducer was found with)."""
    from orchestrator.run.failures import from_exception

    try:
        live = tuple(r for r in [worker.runners.get(bug.spec.name)] if r is not None)
        runner = fresh_runner(dataclasses.replace(bug.spec, seed=bug.seed),
                              RunnerOptions(device=worker.options.device, search_weights=worker.options.search_weights,
                                            precision=Precision.from_dict(bug.report.get("precision"))),
                              live)
        loaded = LoadedFinding(Path(bug.folder), bug.report, bug.inputs, bug.values_state)
        result = replay(runner, loaded)
        first = result.first_op
        ok, judged, moves = replay_verdict(result, loaded.report)
        # the signature of the bug's lines as they are now: another when its code moved, now or before
        # (a reproducer kept from an occurrence at the new lines names them, under the bug's signature)
        moved_to = report_signature(judged) if ok else None
        return ReplayOutcome(bug.signature, ok, f"{first.kind} at {first.position}" if first else None,
                             moves=tuple(moves), moved_to=moved_to if moved_to != bug.signature else None)
    except Exception as exc:  # noqa: BLE001 - reported per bug, the campaign goes on
        failure = from_exception(exc)
        return ReplayOutcome(bug.signature, None, error=failure.message, traceback=failure.traceback)
