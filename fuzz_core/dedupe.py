"""Deduplication of findings: one bug per signature, with every occurrence and the smallest reproducer.

A small example database in the spirit of Hypothesis's ``DirectoryBasedExampleDatabase``,
kept in the output folder that all campaign runs share::

    <output>/bugs/<signature>/
        occurrences.json       # the bug (signature, target, op, location, hazard), its best
                               # reproducer and every occurrence (run, site, folder, size)
        reproducer/            # a copy of the smallest finding folder seen so far
            finding.json       #   (replay points at this folder)
            values.safetensors
            test_reproducer.py #   the finding as a pytest regression test
            source.json        #   which occurrence it is, and its size

The signature (target, op kind, user location, hazard; see :func:`fuzz_core.findings.signature`)
does not depend on the seed, the site's occurrence index or the run: the same bug found by two
sites, two seeds or two campaign runs is one entry with several occurrences. A later
reproducer replaces the stored one only when it is strictly smaller: fewer rows, then a
smaller L2 distance to the sample the search started from, then a smaller Linf distance.

Writes are atomic: ``occurrences.json`` is written to a temporary name and renamed; a new
reproducer is written into a hidden folder, then swapped in by two renames, the reproducer
first and the occurrence list second. ``source.json`` inside the reproducer is the authority
on which occurrence is the best, so a crash between the two steps leaves a consistent
database, and saving the same finding again (idempotent) completes it. Concurrent writers
(two campaigns sharing an output) are serialised per signature by a lock file where the
platform has ``fcntl``.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from fuzz_core.findings import REPORT, VALUES, signature
from fuzz_core.io import atomic_write_json, read_json
from fuzz_core.reproducer import TEST_FILE

log = logging.getLogger(__name__)

__all__ = ["BUGS_DIR", "BugDatabase", "Occurrence", "SaveResult", "rebuild_index", "record_finding", "size_key"]

BUGS_DIR = "bugs"
OCCURRENCES = "occurrences.json"
REPRODUCER = "reproducer"
SOURCE = "source.json"
SCHEMA_VERSION = 1
_LOCK = ".lock"


@dataclass(frozen=True)
class Occurrence:
    """One finding folder of a bug."""

    folder: str                  # relative to the output folder when inside it (posix), else absolute
    run: str                     # the run folder's name ("" when the folder is not in a run)
    site_id: str
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


def occurrence_of(report: dict[str, Any], folder: Path, output: Path) -> Occurrence:
    """The occurrence that a finding folder's ``finding.json`` describes."""
    mini = report.get("minimised") or {}
    dist = mini.get("distance") or {}
    folder = Path(folder)
    try:
        shown = folder.resolve().relative_to(Path(output).resolve()).as_posix()
    except ValueError:
        shown = folder.resolve().as_posix()
    run = folder.parent.parent.name if folder.parent.name == "findings" else ""
    site = report.get("site") or {}
    return Occurrence(folder=shown, run=run, site_id=str(site.get("id", "")), label=str(site.get("label", "")),
                      seed=int((report.get("target") or {}).get("seed", 0) or 0), step=int(report.get("step", 0)),
                      batch_size=int(report.get("batch_size", mini.get("batch_size", 0)) or 0),
                      distance_l2=dist.get("l2"), distance_linf=dist.get("linf"),
                      created=str(report.get("created") or _now()))


def signature_of(report: dict[str, Any]) -> str:
    site = report.get("site") or {}
    return str(report.get("signature") or signature(site.get("target", ""), site.get("op", ""),
                                                    site.get("location", ""), site.get("hazard", "")))


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
        """The bug's record (``occurrences.json``, with ``best`` taken from the reproducer itself)."""
        folder = self.root / sig
        if not (folder / OCCURRENCES).is_file():
            return None
        record = read_json(folder / OCCURRENCES)
        source = folder / REPRODUCER / SOURCE
        if source.is_file():
            record["best"] = read_json(source)
        record["reproducer"] = (folder / REPRODUCER).as_posix()
        return record

    def bugs(self) -> list[dict[str, Any]]:
        return [b for b in (self.fetch(s) for s in self.signatures()) if b is not None]

    # -- writing ----------------------------------------------------------------------------
    def save(self, finding_folder: Path | str) -> SaveResult:
        """Record a finding folder as an occurrence of its bug; it becomes the reproducer if smaller."""
        finding_folder = Path(finding_folder)
        report = read_json(finding_folder / REPORT)
        sig = signature_of(report)
        occ = occurrence_of(report, finding_folder, self.output)
        folder = self.root / sig
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder / _LOCK):
            _recover(folder)
            record = self.fetch(sig)
            new_bug = record is None
            if record is None:
                site = report.get("site") or {}
                record = {"schema_version": SCHEMA_VERSION, "signature": sig,
                          **{k: site.get(k, "") for k in ("target", "op", "location", "hazard")},
                          "first_seen": occ.created, "occurrences": []}
            known = {o["folder"] for o in record["occurrences"]}
            new_occurrence = occ.folder not in known
            if new_occurrence:
                record["occurrences"].append(asdict(occ))
            best = record.get("best")
            smaller = best is None or occ.size < size_key(best.get("batch_size", math.inf),
                                                          best.get("distance_l2"), best.get("distance_linf"))
            replaced = smaller and (best or {}).get("folder") != occ.folder
            if replaced:
                self._install(folder, finding_folder, report, occ)
                record["best"] = asdict(occ)
            record.pop("reproducer", None)
            record["last_seen"] = max(record.get("last_seen", ""), occ.created)
            atomic_write_json(folder / OCCURRENCES, record)
        return SaveResult(sig, new_bug, new_occurrence, replaced, len(record["occurrences"]))

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


def record_finding(output: Path | str, finding_folder: Path | str) -> SaveResult | None:
    """What the controller calls after writing a finding folder. Never raises (logs instead)."""
    try:
        result = BugDatabase(output).save(finding_folder)
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
    """Record every finding of every run under ``output`` (idempotent; for runs made before dedupe)."""
    db = BugDatabase(output)
    return [db.save(folder) for folder in finding_folders(output)]


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
