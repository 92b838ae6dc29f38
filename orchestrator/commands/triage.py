"""``cdeepfuzz triage BUG --state STATE``: set a bug's triage state once, for every run where it occurred.

``BUG`` is a bug's signature (as ``cdeepfuzz bugs`` lists it), a finding folder (its
``finding.json`` names the signature) or the MLflow run id of one occurrence. The state is kept
in the bug's run of the ``cdeepfuzz-bugs`` experiment and copied onto every occurrence's run
(:mod:`orchestrator.observers.bug_registry`). The tracking store is found as every command finds
it: ``--tracking-uri``, the finding's run's own, ``MLFLOW_TRACKING_URI``, the newest run under the
current directory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fuzz_core.findings import REPORT
from fuzz_core.io import read_json
from orchestrator.observers.bug_registry import STATES, TriageState, parse_state as _parse

SIGNATURE = re.compile(r"[0-9a-f]{16}")


class TriageError(ValueError):
    """A bug that cannot be triaged as asked (exit 2)."""


@dataclass(frozen=True)
class TriageResult:
    uri: str
    signature: str
    bug_run_id: str
    state: TriageState
    note: str | None
    occurrences: int

    def describe(self) -> str:
        note = f" ({self.note})" if self.note else ""
        return (f"triage: bug {self.signature} -> {self.state}{note}, in {self.occurrences} occurrence run(s) "
                f"[MLflow: {self.uri}, bug run {self.bug_run_id}]")


def parse_state(state: str) -> TriageState:
    wanted = _parse(state)
    if wanted is None:
        raise TriageError(f"--state: {state!r} is not one of {', '.join(STATES)}")
    return wanted


def triage(bug: str | Path, state: str, note: str | None = None, tracking_uri: str | None = None,
           cwd: Path | None = None) -> TriageResult:
    """Set the triage state (and note) of a bug named by its signature, a finding folder or a run id."""
    from orchestrator.config import resolve_tracking_uri
    from orchestrator.observers.bug_registry import occurrences, set_state
    from orchestrator.observers.tracking_sender import _make_client

    wanted = parse_state(state)
    path = Path(bug)
    run_dir = None
    signature = None
    if path.is_dir():
        if not (path / REPORT).is_file():
            raise TriageError(f"{bug}: not a finding folder (no {REPORT})")
        report = read_json(path / REPORT)
        signature = str(report.get("signature") or "")
        run_dir = path.parent.parent if path.parent.name == "findings" else None
    elif path.exists() or "/" in str(bug):
        raise TriageError(f"{bug}: not a finding folder (no {REPORT}), a signature or an MLflow run id")
    uri = resolve_tracking_uri(tracking_uri, run_dir=run_dir, search=cwd or Path.cwd())
    if not uri:
        raise TriageError("no tracking store: give --tracking-uri, set MLFLOW_TRACKING_URI, "
                          "or run from a folder with runs")
    try:
        client = _make_client(uri)
        if signature is None:
            text = str(bug).strip()
            if SIGNATURE.fullmatch(text):
                signature = text
            else:
                try:
                    signature = client.get_run(text).data.tags.get("signature")
                except Exception:  # noqa: BLE001 - not a run id either
                    signature = None
                if not signature:
                    raise TriageError(f"{bug}: neither a bug signature (16 hex digits, see `cdeepfuzz bugs`) nor "
                                      f"the MLflow run id of a finding in {uri}")
        rid = set_state(client, None, signature, wanted.value, note)
        if rid is None:
            if not occurrences(client, signature):
                raise TriageError(f"no bug {signature} in {uri} (see `cdeepfuzz bugs`)")
            from orchestrator.observers.tracking_sender import experiment_ids

            rid = set_state(client, experiment_ids(uri), signature, wanted.value, note)
        count = len(occurrences(client, signature))
    except TriageError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow raises its own exception types
        raise TriageError(f"cannot set the triage of bug {signature} in {uri}: {exc}") from None
    return TriageResult(uri, signature, rid, wanted, note, count)
