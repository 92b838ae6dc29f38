"""Checks every test of a campaign makes: each file valid against its published schema, every record
saying the same thing, each finding written once and each site ended once."""
from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path

from fuzz_core.status import SiteStatus
from orchestrator.observers.base import Observer
from orchestrator.schemas import validate


class Recorder(Observer):
    """Counts what the observers hear: findings per folder and final transitions per site."""

    def __init__(self) -> None:
        self.findings: Counter = Counter()
        self.finals: Counter = Counter()
        self.transitions: list[tuple[str, str, str]] = []
        self.quanta = 0
        self.ended = 0

    def quantum(self, rec, result) -> None:
        self.quanta += 1

    def finding(self, rec, finding, folder) -> None:
        self.findings[Path(folder).name] += 1      # a site may report others' findings it steps past

    def site_changed(self, rec, before) -> None:
        self.transitions.append((rec.site.id, before.value, rec.status.value))
        if rec.status.final and rec.status is not SiteStatus.STOPPED:
            self.finals[rec.site.id] += 1

    def run_ended(self, run) -> None:
        self.ended += 1

    def check_once(self) -> None:
        assert all(n == 1 for n in self.findings.values()), self.findings
        assert all(n == 1 for n in self.finals.values()), self.finals
        assert self.ended == 1


def check_run(run_dir: Path) -> dict:
    """Validate summary.json and every finding.json of a run; the summary agrees with state.db;
    one finding folder per found site, and one per finding a site's search stepped past (named by the site's
    ``passed``); each site reached its final status once. Returns the summary."""
    run_dir = Path(run_dir)
    validate(run_dir / "summary.json")
    summary = json.loads((run_dir / "summary.json").read_text())
    folders = sorted(run_dir.glob("findings/*/finding.json"))
    for path in folders:
        validate(path)
    found = {s["id"]: s for s in summary["sites"] if s["status"] in ("found", "flaky")}
    named = {s["finding"] for s in found.values()} | {p for s in summary["sites"] for p in s.get("passed", [])}
    assert {f.parent.relative_to(run_dir).as_posix() for f in folders} == named, (folders, named)
    assert all(not s.get("finding") for s in summary["sites"] if s["id"] not in found)
    db = sqlite3.connect(f"file:{run_dir / 'state.db'}?mode=ro", uri=True)
    try:
        stored = dict(db.execute("SELECT id, status FROM sites").fetchall())
        assert stored == {s["id"]: s["status"] for s in summary["sites"]}
        state, reason, code = db.execute("SELECT state, exit_reason, exit_code FROM run").fetchone()
        assert (state, reason, code) == (summary["run"]["state"], summary["run"]["exit_reason"],
                                         summary["run"]["exit_code"])
        finals = Counter(site for site, status in db.execute("SELECT site_id, status FROM transitions")
                         if status not in ("pending", "searching", "stopped"))
        assert all(n == 1 for n in finals.values()), finals
    finally:
        db.close()
    return summary
