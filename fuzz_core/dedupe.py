"""The bug database: one bug per signature, with every occurrence, the smallest reproducer and the
bug's triage state.

A small example database in the spirit of Hypothesis's ``DirectoryBasedExampleDatabase``,
kept in the output folder that all campaign runs share::

    <output>/bugs/<signature>/
        occurrences.json       # the bug (op, kind, path:line:col, hazard, direction), the targets and
                               # campaigns it occurred in, its triage state (the only copy: MLflow's
                               # bug runs mirror it), its best reproducer and every occurrence
        reproducer/            # a copy of the smallest finding folder seen so far
            finding.json       #   (replay points at this folder)
            values.safetensors
            test_reproducer.py #   the finding as a pytest regression test
            source.json        #   which occurrence it is, and its size

The signature (:class:`fuzz_core.findings.Bug`: the op that went non-finite first, the user's call
``path:line:col``, the hazard and the direction) does not depend on the target, the seed, the site whose
search found it, or the run: the same bug found by two sites, two seeds, two targets built from one
program or two campaign runs is one entry with several occurrences. Everything but the triage state
can be rebuilt from the runs' finding folders (:func:`rebuild_index`). A later reproducer replaces the
stored one only when it is strictly smaller: fewer rows, then a smaller L2 distance to the sample the
search started from, then a smaller Linf distance.

Writes are atomic: ``occurrences.json`` is written to a temporary name and renamed; a new
reproducer is written into a hidden folder, then swapped in by two renames, the reproducer
first and the occurrence list second. ``source.json`` inside the reproducer is the authority
on which occurrence is the best, so a crash between the two steps leaves a consistent
database, and saving the same finding again (idempotent) completes it. Concurrent writers
(two campaigns sharing an output) are serialised per signature by a lock file where the
platform has ``fcntl``.

Records of schema 1 (keyed by target, op, ``path:line`` and hazard, before bugs had a direction and
a column; their triage states lived in MLflow alone) are not read: :func:`rebuild_index` rebuilds
their finding folders under the new signatures, as ``new`` bugs, and removes them.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from enum import Enum
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from fuzz_core.findings import REPORT, VALUES, report_bug
from fuzz_core.io import atomic_write_json, read_json
from fuzz_core.reproducer import TEST_FILE

log = logging.getLogger(__name__)

__all__ = ["BUGS_DIR", "STATES", "BugDatabase", "TriageState", "after_occurrence", "after_replay", "parse_state",
           "triage_state", "Occurrence", "SaveResult", "find_output", "rebuild_index", "record_finding", "reproducer_folder",
           "size_key"]

class TriageState(str, Enum):
    """A bug's triage state: what people decided about it, and what the reuse phase saw of it since."""

    NEW = "new"
    CONFIRMED = "confirmed"
    DUPLICATE = "duplicate"
    WONTFIX = "wontfix"
    FIXED = "fixed"
    REGRESSED = "regressed"             # a fixed bug that triggered again
    NOT_REPRODUCED = "not reproduced"   # a bug whose reproducer no longer triggers

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


BUGS_DIR = "bugs"
OCCURRENCES = "occurrences.json"
REPRODUCER = "reproducer"
SOURCE = "source.json"
SCHEMA_VERSION = 2
TRIAGE_NEW = TriageState.NEW.value
_LOCK = ".lock"


@dataclass(frozen=True)
class Occurrence:
    """One finding folder of a bug."""

    folder: str                  # relative to the output folder when inside it (posix), else absolute
    run: str                     # the run folder's name ("" when the folder is not in a run)
    campaign: str                # the run's campaign ("" when the folder is not in a run)
    target: str
    site_id: str                 # the searched site whose search found it
    label: str
    seed: int
    step: int
    batch_size: int
    distance_l2: float | None
    distance_linf: float | None
    created: str

    @property
    def size(self) -> tuple[float, float, float]:
        return size_key(self.batch_size, self.distance_l2, self.distance_linf)


@dataclass(frozen=True)
class SaveResult:
    signature: str
    new_bug: bool               # the first occurrence of this signature
    new_occurrence: bool        # False when this folder was already recorded
    replaced: bool              # it became the reproducer (always True for a new bug)
    occurrences: int


def size_key(batch_size: int, l2: float | None, linf: float | None) -> tuple[float, float, float]:
    """Shortlex order of reproducers: rows, then L2 distance, then Linf distance (missing: inf)."""
    def num(x: float | None) -> float:
        return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else math.inf

    return (float(batch_size), num(l2), num(linf))


def occurrence_of(report: dict[str, Any], folder: Path, output: Path, campaign: str | None = None) -> Occurrence:
    """The occurrence that a finding folder's ``finding.json`` describes (``campaign``: its run's, when the
    caller knows it; else read from the run folder's ``summary.json``)."""
    mini = report.get("minimised") or {}
    dist = mini.get("distance") or {}
    folder = Path(folder)
    try:
        shown = folder.resolve().relative_to(Path(output).resolve()).as_posix()
    except ValueError:
        shown = folder.resolve().as_posix()
    in_run = folder.parent.name == "findings"
    run = folder.parent.parent.name if in_run else ""
    if campaign is None:
        campaign = _campaign_of(folder.parent.parent) if in_run else ""
    site = report.get("site") or {}
    return Occurrence(folder=shown, run=run, campaign=campaign or "",
                      target=str(site.get("target") or (report.get("target") or {}).get("name", "")),
                      site_id=str(site.get("id", "")), label=str(site.get("label", "")),
                      seed=int((report.get("target") or {}).get("seed", 0) or 0), step=int(report.get("step", 0)),
                      batch_size=int(report.get("batch_size", mini.get("batch_size", 0)) or 0),
                      distance_l2=dist.get("l2"), distance_linf=dist.get("linf"),
                      created=str(report.get("created") or _now()))


def _campaign_of(run_dir: Path) -> str:
    try:
        summary = read_json(run_dir / "summary.json")
        return str(((summary.get("campaign") or {}).get("name")) or "")
    except (OSError, ValueError, AttributeError):
        return ""


def signature_of(report: dict[str, Any]) -> str:
    """The bug a finding report shows: its recorded ``bug`` (a known bug's signature, when the finding is
    one found before its line moved), else the bug its site and first op show."""
    recorded = (report.get("bug") or {}).get("signature")
    return str(recorded) if recorded else report_bug(report).signature


def bug_fields(report: dict[str, Any]) -> dict[str, Any]:
    """The bug's fields (:meth:`fuzz_core.findings.Bug.to_dict`) as a finding report shows them."""
    fields = report_bug(report).to_dict()
    fields.pop("signature", None)
    return fields


class BugDatabase:
    """Bugs under ``<output>/bugs``: save (an occurrence), fetch, replace (the reproducer), delete."""

    def __init__(self, output: Path | str) -> None:
        self.output = Path(output)
        self.root = self.output / BUGS_DIR

    # -- reading ----------------------------------------------------------------------------
    def signatures(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / OCCURRENCES).is_file())

    def fetch(self, sig: str) -> dict[str, Any] | None:
        """The bug's record (``occurrences.json``, with ``best`` taken from the reproducer itself); None for
        no such bug, or a record of schema 1 (:func:`rebuild_index` rebuilds those)."""
        folder = self.root / sig
        if not (folder / OCCURRENCES).is_file():
            return None
        record = read_json(folder / OCCURRENCES)
        if int(record.get("schema_version", 1)) < SCHEMA_VERSION:
            return None
        source = folder / REPRODUCER / SOURCE
        if source.is_file():
            record["best"] = read_json(source)
        record["reproducer"] = (folder / REPRODUCER).as_posix()
        return record

    def bugs(self) -> list[dict[str, Any]]:
        return [b for b in (self.fetch(s) for s in self.signatures()) if b is not None]

    # -- writing ----------------------------------------------------------------------------
    def save(self, finding_folder: Path | str, campaign: str | None = None) -> SaveResult:
        """Record a finding folder as an occurrence of its bug; it becomes the reproducer if smaller."""
        finding_folder = Path(finding_folder)
        report = read_json(finding_folder / REPORT)
        sig = signature_of(report)
        occ = occurrence_of(report, finding_folder, self.output, campaign)
        folder = self.root / sig
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder / _LOCK):
            _recover(folder)
            record = self.fetch(sig)
            new_bug = record is None
            if record is None:
                record = {"schema_version": SCHEMA_VERSION, "signature": sig, **bug_fields(report),
                          "targets": [], "campaigns": [], "first_seen": occ.created,
                          "triage": {"state": TRIAGE_NEW, "note": None, "changed": None},
                          "occurrences": []}
            known = {o["folder"] for o in record["occurrences"]}
            new_occurrence = occ.folder not in known
            if new_occurrence:
                record["occurrences"].append(asdict(occ))
                before = triage_state(record)
                if after_occurrence(before) != before:        # a fixed bug regressed; one not reproduced is back
                    record["triage"] = {"state": after_occurrence(before),
                                        "note": f"{before} -> {after_occurrence(before)}: it occurred again in "
                                                f"{occ.run or occ.folder}", "changed": occ.created}
            for key, value in (("targets", occ.target), ("campaigns", occ.campaign)):
                if value and value not in record[key]:
                    record[key] = sorted([*record[key], value])
            best = record.get("best")
            smaller = best is None or occ.size < size_key(best.get("batch_size", math.inf),
                                                          best.get("distance_l2"), best.get("distance_linf"))
            replaced = smaller and (best or {}).get("folder") != occ.folder
            if replaced:
                self._install(folder, finding_folder, report, occ)
                record["best"] = asdict(occ)
            record.pop("reproducer", None)
            record["first_seen"] = min(record.get("first_seen") or occ.created, occ.created)
            record["last_seen"] = max(record.get("last_seen", ""), occ.created)
            atomic_write_json(folder / OCCURRENCES, record)
        return SaveResult(sig, new_bug, new_occurrence, replaced, len(record["occurrences"]))

    def set_triage(self, sig: str, state: str, note: str | None = None) -> dict[str, Any] | None:
        """Set a bug's triage state (the one copy of it; MLflow mirrors it). Returns the bug's record, or
        None when the database has no such bug."""
        folder = self.root / sig
        if not (folder / OCCURRENCES).is_file():
            return None
        with _locked(folder / _LOCK):
            record = read_json(folder / OCCURRENCES)
            if int(record.get("schema_version", 1)) < SCHEMA_VERSION:
                return None
            record["triage"] = {"state": state, "note": note, "changed": _now()}
            atomic_write_json(folder / OCCURRENCES, record)
        return self.fetch(sig)

    def delete(self, sig: str) -> bool:
        folder = self.root / sig
        if not folder.is_dir():
            return False
        trash = self.root / f".deleted-{sig}-{uuid.uuid4().hex[:8]}"
        os.rename(folder, trash)       # atomic: readers see the bug or nothing
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def _install(self, folder: Path, source: Path, report: dict[str, Any], occ: Occurrence) -> None:
        """Copy ``source`` into a hidden folder, then swap it in as ``reproducer``."""
        tmp = folder / f".{REPRODUCER}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            shutil.copyfile(source / VALUES, tmp / VALUES)
            if (source / TEST_FILE).is_file():     # at the same depth below the output: its root path holds
                shutil.copyfile(source / TEST_FILE, tmp / TEST_FILE)
            copy = dict(report)
            copy["replay"] = f"cdeepfuzz replay {(folder / REPRODUCER).as_posix()}"
            atomic_write_json(tmp / SOURCE, asdict(occ))
            atomic_write_json(tmp / REPORT, copy)
            current = folder / REPRODUCER
            old = folder / f".old-{uuid.uuid4().hex[:8]}"
            if current.exists():
                os.rename(current, old)
            os.rename(tmp, current)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(old, ignore_errors=True)
        for pattern in (f".{REPRODUCER}-*", ".old-*"):   # left by a crash: never installed / replaced
            for stale in folder.glob(pattern):
                shutil.rmtree(stale, ignore_errors=True)


def triage_state(record: dict[str, Any]) -> str:
    """A bug record's triage state (``new`` until someone set one)."""
    return str((record.get("triage") or {}).get("state") or TRIAGE_NEW)


def reproducer_folder(output: Path | str, sig: str) -> Path:
    """Where the smallest reproducer of bug ``sig`` lies in an output folder."""
    return Path(output) / BUGS_DIR / sig / REPRODUCER


def record_finding(output: Path | str, finding_folder: Path | str, campaign: str | None = None) -> SaveResult | None:
    """What the controller calls after writing a finding folder. Never raises (logs instead)."""
    try:
        result = BugDatabase(output).save(finding_folder, campaign)
    except Exception:  # noqa: BLE001 - deduplication must never stop a campaign
        log.exception("dedupe: could not record %s", finding_folder)
        return None
    log.info("dedupe: %s -> bug %s (%d occurrence(s)%s)", finding_folder, result.signature,
             result.occurrences, ", new reproducer" if result.replaced else "")
    return result


def finding_folders(output: Path | str) -> Iterator[Path]:
    """Every complete finding folder of every run under ``output``, oldest run first."""
    runs = sorted((p.parent for p in Path(output).glob("*/summary.json")), key=lambda p: p.stat().st_mtime)
    for run in runs:
        for report in sorted((run / "findings").glob(f"*/{REPORT}")):
            if (report.parent / VALUES).is_file():
                yield report.parent


def rebuild_index(output: Path | str) -> list[SaveResult]:
    """Record every finding of every run under ``output`` (idempotent: for runs made before the database,
    or copied in; records of schema 1 are rebuilt under their new signatures and then removed)."""
    db = BugDatabase(output)
    results = [db.save(folder) for folder in finding_folders(output)]
    for sig in db.signatures():
        if db.fetch(sig) is None:          # schema 1: its folders were saved again above
            db.delete(sig)
    return results


def find_output(folder: Path | str) -> Path | None:
    """The output folder of the newest run under ``folder`` (the folder that holds run folders and their
    ``bugs/``): ``folder`` itself when it holds runs, else the parent of the newest ``*/summary.json``
    below it; None when there is no run."""
    folder = Path(folder)
    newest, found = -1.0, None
    for summary in folder.glob("**/summary.json"):
        if BUGS_DIR in summary.parts:
            continue
        try:
            mtime = summary.stat().st_mtime
        except OSError:
            continue
        if mtime > newest:
            newest, found = mtime, summary.parent.parent
    return found


def _recover(folder: Path) -> None:
    """Finish a swap that a crash interrupted between its two renames."""
    if (folder / REPRODUCER).exists():
        return
    complete = [p for p in folder.glob(f".{REPRODUCER}-*") if all((p / n).is_file() for n in (REPORT, VALUES, SOURCE))]
    previous = sorted(folder.glob(".old-*"))
    if complete:
        os.rename(complete[0], folder / REPRODUCER)
    elif previous:
        os.rename(previous[0], folder / REPRODUCER)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX: one writer per output is assumed
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
