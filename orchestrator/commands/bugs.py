"""``cdeepfuzz bugs``: bugs, not runs. One row per bug across every run of an output folder.

The rows come from the output folder's bug database (``<output>/bugs/``, :mod:`fuzz_core.dedupe`), the
one home of a bug and of its triage state; MLflow's bug runs mirror it, and a run without tracking
lists its bugs all the same. The database is brought up to date with the finding folders of every run
under the output first (a run copied in, or one whose bug store observer could not write).

Each row (``--json`` gives the same): ``signature``, ``triage`` (the bug's state), ``note``, ``op``,
``kind``, ``hazard``, ``location`` (``path:line``), ``column``, ``position`` (``path:line:col``), ``phase``
(the direction in which it went non-finite), ``first_seen`` and ``last_seen`` (ISO times of its first
and last occurrence), ``runs`` (how many runs it occurred in), ``occurrences`` (how many findings),
``campaigns`` and ``targets`` where it occurred, and ``reproducer`` (the folder of its smallest
reproducer, the first found among equals); with ``--occurrences``, ``occurrence_list``: each finding
(its folder, run, campaign, target, the site whose search found it, its step and size). The output folder
is ``--output``, else the one that holds the newest run under the current directory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fuzz_core.dedupe import (
    STATES, BugDatabase, find_output, finding_folders, parse_state, rebuild_index, triage_state,
)


class BugsError(ValueError):
    """No output folder to list, or a bad filter (exit 2)."""


def output_folder(output: Path | None, cwd: Path | None = None) -> Path:
    """``output`` (it must exist), else the output folder of the newest run under ``cwd``."""
    if output is not None:
        if not Path(output).is_dir():
            raise BugsError(f"--output: {output} is not a folder")
        return Path(output)
    found = find_output(cwd or Path.cwd())
    if found is None:
        raise BugsError("no runs under the current directory: give --output (the campaign's output folder)")
    return found


def brought_up_to_date(output: Path) -> BugDatabase:
    """The output's bug database, with every finding folder of its runs recorded (records of schema 1:
    rebuilt under their new signatures)."""
    db = BugDatabase(output)
    if len(db.signatures()) != len(db.bugs()):
        rebuild_index(output)
        return db
    listed = {o["folder"] for b in db.bugs() for o in b["occurrences"]}
    for folder in finding_folders(output):
        if folder.resolve().relative_to(output.resolve()).as_posix() not in listed:
            db.save(folder)
    return db


def bug_row(record: dict[str, Any], occurrences: bool = False) -> dict[str, Any]:
    """A bug database record as ``bugs`` shows it."""
    occ = record.get("occurrences") or []
    row = {"signature": record["signature"], "triage": triage_state(record),
           "note": (record.get("triage") or {}).get("note"), "op": record.get("op"), "kind": record.get("kind"),
           "hazard": record.get("hazard"), "location": record.get("location"), "column": record.get("column"),
           "position": record.get("position"), "phase": record.get("phase"),
           "first_seen": record.get("first_seen"), "last_seen": record.get("last_seen"),
           "runs": len({o.get("run") or o.get("folder") for o in occ}), "occurrences": len(occ),
           "campaigns": list(record.get("campaigns") or []), "targets": list(record.get("targets") or []),
           "reproducer": record.get("reproducer")}
    if occurrences:
        row["occurrence_list"] = occ
    return row


def list_bugs(output: Path | None = None, campaign: str | None = None, state: str | None = None,
              cwd: Path | None = None, occurrences: bool = False) -> tuple[Path, list[dict[str, Any]]]:
    """(the output folder, its bugs), newest last seen first."""
    wanted = None
    if state is not None:
        wanted = parse_state(state)
        if wanted is None:
            raise BugsError(f"--state: {state!r} is not one of {', '.join(STATES)}")
    folder = output_folder(output, cwd)
    rows = [bug_row(b, occurrences) for b in brought_up_to_date(folder).bugs()]
    rows = [r for r in rows if (campaign is None or campaign in r["campaigns"])
            and (wanted is None or r["triage"] == wanted.value)]
    return folder, sorted(rows, key=lambda r: (r["last_seen"] or "", r["signature"]), reverse=True)
