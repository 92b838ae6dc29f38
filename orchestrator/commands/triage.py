"""``cdeepfuzz triage BUG --state STATE``: set a bug's triage state once, for every run where it occurred.

``BUG`` is a bug's signature (as ``cdeepfuzz bugs`` lists it), a finding folder (its ``finding.json``
names the signature; its run's output folder is then the bug database's), or the MLflow run id of
one occurrence. The state is kept in the output folder's bug database (``<output>/bugs/``: its one
home, :mod:`fuzz_core.dedupe`), found as ``cdeepfuzz bugs`` finds it; then, when a tracking store is
known (``--tracking-uri``, the run's own, ``MLFLOW_TRACKING_URI``, the newest run's under the current
directory), MLflow's bug run mirrors it (:mod:`orchestrator.observers.bug_registry`). A tracking store
that cannot be reached leaves MLflow behind, says so, and changes nothing else: the next
``cdeepfuzz triage`` of the bug, or the next run that occurs it, mirrors it again.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fuzz_core.dedupe import STATES, TriageState, parse_state as _parse
from fuzz_core.findings import REPORT
from fuzz_core.io import read_json

SIGNATURE = re.compile(r"[0-9a-f]{16}")


class TriageError(ValueError):
    """A bug that cannot be triaged as asked (exit 2)."""


@dataclass(frozen=True)
class TriageResult:
    output: Path
    signature: str
    state: TriageState
    note: str | None
    occurrences: int
    mlflow: str              # what became of MLflow's mirror: "" when no tracking store is known

    def describe(self) -> str:
        note = f" ({self.note})" if self.note else ""
        text = (f"triage: bug {self.signature} -> {self.state}{note}, {self.occurrences} occurrence(s) "
                f"[{self.output / 'bugs' / self.signature}]")
        return text + (f"\ntriage: {self.mlflow}" if self.mlflow else "")


def parse_state(state: str) -> TriageState:
    wanted = _parse(state)
    if wanted is None:
        raise TriageError(f"--state: {state!r} is not one of {', '.join(STATES)}")
    return wanted


def triage(bug: str | Path, state: str, note: str | None = None, tracking_uri: str | None = None,
           cwd: Path | None = None, output: Path | None = None) -> TriageResult:
    """Set the triage state (and note) of a bug named by its signature, a finding folder or a run id."""
    from orchestrator.commands.bugs import BugsError, brought_up_to_date, output_folder
    from orchestrator.config import resolve_tracking_uri

    wanted = parse_state(state)
    cwd = cwd or Path.cwd()
    path = Path(bug)
    run_dir = signature = None
    if path.is_dir():
        if not (path / REPORT).is_file():
            raise TriageError(f"{bug}: not a finding folder (no {REPORT})")
        report = read_json(path / REPORT)
        signature = str((report.get("bug") or {}).get("signature") or report.get("signature") or "")
        if path.parent.name == "findings":
            run_dir = path.parent.parent
            output = output or run_dir.parent
    elif path.exists() or "/" in str(bug):
        raise TriageError(f"{bug}: not a finding folder (no {REPORT}), a signature or an MLflow run id")
    try:
        folder = output_folder(output, cwd)
    except BugsError as exc:
        raise TriageError(str(exc)) from None
    uri = resolve_tracking_uri(tracking_uri, run_dir=run_dir, search=cwd)
    if signature is None:
        text = str(bug).strip()
        signature = text if SIGNATURE.fullmatch(text) else _signature_of_run(text, uri)
    db = brought_up_to_date(folder)
    record = db.set_triage(signature, wanted.value, note)
    if record is None:
        raise TriageError(f"no bug {signature} in {folder / 'bugs'} (see `cdeepfuzz bugs`)")
    return TriageResult(folder, signature, wanted, note, len(record["occurrences"]),
                        _mirror(uri, signature, wanted.value, note, record))


def _signature_of_run(run_id: str, uri: str | None) -> str:
    """The signature an MLflow run of an occurrence carries."""
    if uri:
        try:
            from orchestrator.observers.tracking_sender import _make_client

            signature = _make_client(uri).get_run(run_id).data.tags.get("signature")
            if signature:
                return signature
        except Exception:  # noqa: BLE001 - not a run id of that store
            pass
    raise TriageError(f"{run_id}: neither a bug signature (16 hex digits, see `cdeepfuzz bugs`) nor the MLflow "
                      f"run id of a finding" + (f" in {uri}" if uri else " (no tracking store is known)"))


def _mirror(uri: str | None, signature: str, state: str, note: str | None, record: dict) -> str:
    """Copy the state to MLflow's bug run (created when the bug has none yet); what happened, in words."""
    if not uri:
        return ""
    try:
        from orchestrator.observers.bug_registry import set_state
        from orchestrator.observers.tracking_sender import _make_client, experiment_ids

        set_state(_make_client(uri), experiment_ids(uri), signature, state, note,
                  {"bug.op": record.get("op"), "bug.position": record.get("position"),
                   "bug.phase": record.get("phase"), "hazard": record.get("hazard"),
                   "targets": ", ".join(record.get("targets") or [])})
    except Exception as exc:  # noqa: BLE001 - MLflow raises its own exception types
        return f"MLflow ({uri}) not updated: {type(exc).__name__}: {exc}"
    return f"mirrored in MLflow: {uri}"
