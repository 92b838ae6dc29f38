"""The terminal view: a live rich table on a TTY, plain lines elsewhere (ray job logs, CI).

An observer: it prints a line per status change (plain mode), a headline at most every 10 s,
and redraws the table at most 4 times a second; its counts are kept as transitions come, so a
turn of the controller costs it O(1), not O(sites).
"""
from __future__ import annotations

import math
import sys
import time
from collections import Counter

from fuzz_core.status import SiteStatus
from orchestrator.observers.base import Observer

MAX_ROWS = 30
HEADLINE_S = 10.0
REDRAW_S = 0.25


def _loss(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.4g}"


def finding_lines(label: str, finding, folder: str) -> list[str]:
    """``FOUND <site>: <op> (<phase>) at step N -> <folder>``, the op that went non-finite first
    when it is not the site's own, a warning for a flaky finding, and each note on the data."""
    lines = [f"FOUND {label}: {finding.site.op} ({finding.phase}) at step {finding.step} -> {folder}"]
    first = finding.first_op or {}
    if first and not finding.site_triggered:
        where = f" at {first['location']}#{first.get('occurrence', 0)}" if first.get("location") else ""
        lines.append(f"  the first non-finite value came from {first.get('op', '?')}{where}, not from this site's op")
    if finding.flaky:
        done, runs = finding.replays
        lines.append(f"  WARNING: flaky: reproduced in {done} of {runs} fresh replays "
                     "(randomness in the program that the replay could not re-seed)")
    lines += [f"  note: {n}" for n in finding.notes]
    return lines


class LiveView(Observer):
    def __init__(self, campaign: str, max_steps: int, time_limit_s: float, enabled: bool = True,
                 live: bool | None = None, stream=None, started: float | None = None) -> None:
        self.campaign = campaign
        self.max_steps = max_steps
        self.budget = 1
        self.time_limit = time_limit_s
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.live = (self.stream.isatty() if live is None else live) and enabled
        self._t0 = time.monotonic() if started is None else started
        self._last_line = 0.0
        self._last_draw = 0.0
        self._live = None
        self.sites: list = []
        self.counts: Counter = Counter()
        self.steps = 0

    def __enter__(self) -> "LiveView":
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(file=self.stream), refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    # -- observer -------------------------------------------------------------------------------
    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def sites_ready(self, sites) -> None:
        self.sites = list(sites)
        self.budget = max(1, self.max_steps * len(self.sites))
        self.counts = Counter(rec.status for rec in self.sites)
        self.steps = sum(rec.steps for rec in self.sites)

    def quantum(self, rec, result) -> None:
        self.steps += int(getattr(result, "steps_quantum", 0) or 0)

    def site_changed(self, rec, before) -> None:
        self.counts[before] -= 1
        self.counts[rec.status] += 1
        if self._live is None and rec.status is not SiteStatus.PENDING:
            reason = f" ({rec.exit_reason.value})" if rec.status.final else ""
            self.message(f"[{self.campaign}] {rec.site.label} {rec.status.value}{reason} steps={rec.steps} "
                         f"best_loss={_loss(rec.best_loss)}" + (f" finding={rec.finding}" if rec.finding else "")
                         + (f": {rec.reach['message']}" if rec.status.final and rec.reach else ""))

    def finding(self, rec, finding, folder) -> None:
        """The finding's own lines, live table or not: what broke and where, and what to check."""
        for line in finding_lines(rec.site.label, finding, rec.finding or str(folder)):
            self.message(line)

    def known_bug(self, record) -> None:
        state, before = record.get("state"), record.get("state_before")
        if state == "regressed" and before != "regressed":
            self.message(f"REGRESSED: bug {record['signature']} ({record.get('label', '')}), marked fixed, "
                         f"triggers again: {record.get('reproducer')}")
        elif state != before or record.get("message"):
            self.message(f"known bug {record['signature']} ({record.get('label', '')}): "
                         + (record.get("message") or f"{before} -> {state}"))

    def tick(self) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self._live is not None:
            if now - self._last_draw >= REDRAW_S:
                self._last_draw = now
                self._live.update(self._table())
        elif now - self._last_line > HEADLINE_S:
            self._last_line = now
            self.message(self.headline())

    def run_ended(self, run) -> None:
        if self._live is not None:
            self._live.update(self._table())
        else:
            self.message(self.headline())

    # -- rendering ------------------------------------------------------------------------------
    def headline(self) -> str:
        found = self.counts[SiteStatus.FOUND] + self.counts[SiteStatus.FLAKY]
        live = self.counts[SiteStatus.PENDING] + self.counts[SiteStatus.SEARCHING]
        elapsed = time.monotonic() - self._t0
        return (f"[{self.campaign}] steps {self.steps}/{self.budget} ({100 * self.steps / self.budget:.0f}%), "
                f"findings {found}, live sites {live}/{len(self.sites)}, "
                f"time {elapsed:.0f}s/{self.time_limit:.0f}s")

    def _table(self):
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table(title=f"cdeepfuzz · {self.campaign}", expand=False)
        for col in ("site", "status", "steps", "loss", "best", "finding"):
            table.add_column(col, overflow="fold")
        order = sorted(self.sites, key=lambda r: (r.status.final, not r.status.finding, r.site.label))
        for rec in order[:MAX_ROWS]:
            style = {"found": "bold red", "flaky": "red", "searching": "cyan", "error": "magenta",
                     "timeout": "magenta"}.get(rec.status.value, "")
            table.add_row(rec.site.label, f"[{style}]{rec.status.value}[/]" if style else rec.status.value,
                          str(rec.steps), _loss(rec.last_loss), _loss(rec.best_loss), rec.finding or "")
        if len(order) > MAX_ROWS:
            table.add_row(f"... {len(order) - MAX_ROWS} more", "", "", "", "", "")
        bar = ProgressBar(total=self.budget, completed=min(self.steps, self.budget), width=50)
        return Group(table, bar, self.headline())
