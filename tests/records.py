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
    """Counts what the observers hear: findings per folder and final transitions per site (a site that
    ended, then was found by another site's search, ended once)."""

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
        if rec.status.final and rec.status is not SiteStatus.STOPPED and not (before.final and rec.found_by):
            self.finals[rec.site.id] += 1       # (found after it ended, by another site's search: no second end)

    def run_ended(self, run) -> None:
        self.ended += 1

    def check_once(self) -> None:
        assert all(n == 1 for n in self.findings.values()), self.findings
        assert all(n == 1 for n in self.finals.values()), self.finals
        assert self.ended == 1


def check_run(run_dir: Path) -> dict:
    """Validate summary.json and every finding.json of a run; the summary agrees with state.db; every
    record tells one story of each bug (the summary's bugs, its totals, the found sites, the finding
    folders); one finding folder per finding, named by a found site's ``finding`` or a site's ``passed``;
    each site reached its final status once, or twice when another site's search found the bug at it
    after it ended (then ``found`` last, with ``found_by``). Returns the summary."""
    run_dir = Path(run_dir)
    validate(run_dir / "summary.json")
    summary = json.loads((run_dir / "summary.json").read_text())
    folders = sorted(run_dir.glob("findings/*/finding.json"))
    for path in folders:
        validate(path)
    on_disk = {f.parent.relative_to(run_dir).as_posix() for f in folders}
    found = {s["id"]: s for s in summary["sites"] if s["status"] in ("found", "flaky")}
    named = {s["finding"] for s in found.values()} | {p for s in summary["sites"] for p in s.get("passed", [])}
    if summary["run"]["state"] != "completed":
        # a stop between a worker's write and the controller's record leaves a folder no record names yet:
        # a site still live (stopped) whose quantum a resume runs again, finding it in the same folder
        stopped = {s["id"] for s in summary["sites"] if s["status"] == "stopped"}
        for extra in on_disk - named:
            report = json.loads((run_dir / extra / "finding.json").read_text())
            assert report["site"]["id"] in stopped, (extra, named)
        on_disk &= named
    assert on_disk == named, (folders, named)
    assert all(not s.get("finding") for s in summary["sites"] if s["id"] not in found)
    bugs = summary["bugs"]                                          # one bug, one record
    assert summary["totals"]["bugs"] == len(bugs) == len({b["signature"] for b in bugs})
    occurrences = [o["folder"] for b in bugs for o in b["occurrences"]]
    assert sorted(occurrences) == sorted(on_disk) and summary["totals"]["findings"] == len(on_disk)
    at = {site for b in bugs for site in b["sites"]}
    assert at == set(found), (at, set(found))                       # a site is found where a bug is at it
    for b in bugs:
        assert b["reproducer"] in [o["folder"] for o in b["occurrences"]]
        for folder in (o["folder"] for o in b["occurrences"]):
            report = json.loads((run_dir / folder / "finding.json").read_text())
            assert report["bug"]["signature"] == b["signature"] == report["signature"]
    db = sqlite3.connect(f"file:{run_dir / 'state.db'}?mode=ro", uri=True)
    try:
        stored = dict(db.execute("SELECT id, status FROM sites").fetchall())
        assert stored == {s["id"]: s["status"] for s in summary["sites"]}
        assert sorted(r[0] for r in db.execute("SELECT folder FROM findings")) == sorted(on_disk)
        state, reason, code = db.execute("SELECT state, exit_reason, exit_code FROM run").fetchone()
        assert (state, reason, code) == (summary["run"]["state"], summary["run"]["exit_reason"],
                                         summary["run"]["exit_code"])
        finals: dict[str, list[str]] = {}
        for site, status in db.execute("SELECT site_id, status FROM transitions ORDER BY seq"):
            if status not in ("pending", "searching", "stopped"):
                finals.setdefault(site, []).append(status)
        by_id = {s["id"]: s for s in summary["sites"]}
        for site, ends in finals.items():
            assert len(ends) == 1 or (len(ends) == 2 and ends[-1] in ("found", "flaky") and by_id[site]["found_by"]), \
                (site, ends)
    finally:
        db.close()
    return summary
