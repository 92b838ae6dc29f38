"""Progress on the terminal: a live rich table on a TTY, plain lines elsewhere (ray job logs, CI)."""
from __future__ import annotations

import math
import sys
import time
from typing import Iterable

from orchestrator.observers.summary import SiteRecord

MAX_ROWS = 30


def _loss(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.4g}"


class Progress:
    def __init__(self, campaign: str, budget_steps: int, time_limit_s: float, enabled: bool = True,
                 live: bool | None = None, stream=None) -> None:
        self.campaign = campaign
        self.budget = max(1, budget_steps)
        self.time_limit = time_limit_s
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.live = (self.stream.isatty() if live is None else live) and enabled
        self._t0 = time.monotonic()
        self._last_line = 0.0
        self._live = None
        self._last_status: dict[str, str] = {}

    def __enter__(self) -> "Progress":
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

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.console.print(text)
        else:
            print(text, file=self.stream, flush=True)

    def update(self, sites: Iterable[SiteRecord], force: bool = False) -> None:
        if not self.enabled:
            return
        sites = list(sites)
        if self._live is not None:
            self._live.update(self._table(sites))
            return
        for rec in sites:   # plain mode: one line per status change, and a heartbeat
            if self._last_status.get(rec.site.id) != rec.status.value:
                self._last_status[rec.site.id] = rec.status.value
                if rec.status.value != "pending":
                    self.message(f"[{self.campaign}] {rec.site.label} {rec.status.value} steps={rec.steps} "
                                 f"best_loss={_loss(rec.best_loss)}" + (f" finding={rec.finding}" if rec.finding else ""))
        now = time.monotonic()
        if force or now - self._last_line > 10:
            self._last_line = now
            self.message(self._headline(sites))

    def _headline(self, sites: list[SiteRecord]) -> str:
        used = sum(r.steps for r in sites)
        found = sum(1 for r in sites if r.finding)
        live = sum(1 for r in sites if not r.status.final)
        elapsed = time.monotonic() - self._t0
        return (f"[{self.campaign}] steps {used}/{self.budget} ({100 * used / self.budget:.0f}%), "
                f"findings {found}, live sites {live}/{len(sites)}, "
                f"time {elapsed:.0f}s/{self.time_limit:.0f}s")

    def _table(self, sites: list[SiteRecord]):
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table(title=f"cdeepfuzz · {self.campaign}", expand=False)
        for col in ("site", "status", "steps", "loss", "best", "finding"):
            table.add_column(col, overflow="fold")
        order = sorted(sites, key=lambda r: (r.status.final, r.status.value != "found", r.site.label))
        for rec in order[:MAX_ROWS]:
            style = {"found": "bold red", "searching": "cyan", "error": "magenta", "timeout": "magenta"}.get(
                rec.status.value, "")
            table.add_row(rec.site.label, f"[{style}]{rec.status.value}[/]" if style else rec.status.value,
                          str(rec.steps), _loss(rec.last_loss), _loss(rec.best_loss), rec.finding or "")
        if len(order) > MAX_ROWS:
            table.add_row(f"... {len(order) - MAX_ROWS} more", "", "", "", "", "")
        used = sum(r.steps for r in sites)
        bar = ProgressBar(total=self.budget, completed=min(used, self.budget), width=50)
        return Group(table, bar, self._headline(sites))
