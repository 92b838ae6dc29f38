"""The terminal view: a live rich table on a TTY, plain lines elsewhere (ray job logs, CI).

An observer: it prints a line per status change (plain mode), a headline at most every 10 s,
and redraws the view at most 4 times a second. Its counts (sites per status, steps, the step
budget) are kept as transitions come, so an event costs it O(1), not O(sites); the sites are
sorted only when the view is drawn.

The live view always fits the terminal, whatever its size: the headline and the bar are its
last two lines, the sites that matter most fill the rows above them (findings, then the live
searches closest to a trigger, then errors, then the rest), the sites that do not fit are
counted in one line, and every line is cut to the width (a site's label loses the middle of
its path first, never its op nor its ``file:line``).

The budget (the total of the bar and of the percentage) is ``max_steps`` for each live (or
stopped) site, and only the steps it used for a site that ended on its own (found, retired,
unreachable, an error...): the budget a retired site did not spend leaves the total, so a
completed campaign ends at 100%, and a stopped one short of it.
"""
from __future__ import annotations

import math
import sys
import time
from collections import Counter

from fuzz_core.status import SiteStatus
from orchestrator.observers.base import Observer
from orchestrator.wording import bug_words, site_outcome

HEADLINE_S = 10.0
REDRAW_S = 0.25
ELLIPSIS = "…"

# the order in which the live view shows sites, most telling first; the summary line follows it too
RANK = {SiteStatus.FOUND: 0, SiteStatus.FLAKY: 1, SiteStatus.SEARCHING: 2, SiteStatus.ERROR: 3,
        SiteStatus.TIMEOUT: 4, SiteStatus.PENDING: 5, SiteStatus.STOPPED: 6, SiteStatus.EXHAUSTED: 7,
        SiteStatus.RETIRED: 8, SiteStatus.UNREACHABLE: 9}
STYLE = {SiteStatus.FOUND: "bold red", SiteStatus.FLAKY: "red", SiteStatus.SEARCHING: "cyan",
         SiteStatus.ERROR: "magenta", SiteStatus.TIMEOUT: "magenta"}
GAP = 2            # the blank columns between two columns of the table
STATUS_W = max(len(s.value) for s in SiteStatus)
LOSS_W = 9         # "1.234e+05", "-1.23e-07"
MIN_SITE_W = 16


def _loss(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.4g}"


def finding_lines(finding, folder: str, number: int | None = None, by: str | None = None) -> list[str]:
    """``BUG n: <op> (<phase>) at <path:line:col>: <hazard> [...] -> <folder>`` for a bug's first finding:
    what broke and where (the bug, not the site whose search found it: ``by`` names that site when it
    is not the bug's own), a warning for a flaky finding, and each note on the data."""
    bug = {**finding.bug.to_dict(), "flaky": finding.flaky, "precision_only": finding.precision_only,
           "overflow": finding.overflow}
    head = f"BUG {number}" if number is not None else "BUG"
    lines = [f"{head}: {bug_words(bug)} [{finding.site.target}], step {finding.step} -> {folder}"]
    if by:
        lines.append(f"  found by the search of {by}")
    if finding.flaky:
        done, runs = finding.replays
        lines.append(f"  WARNING: flaky: reproduced in {done} of {runs} fresh replays "
                     "(randomness in the program that the replay could not re-seed)")
    lines += [f"  note: {n}" for n in finding.notes]
    return lines


def shorten(label: str, width: int) -> str:
    """``label`` in at most ``width`` characters, on one line: a site label
    (``target:op@path/file.py:line:col#n``) loses its folders first, then the middle of its target,
    and keeps its op and ``file:line:col#n`` to the last; anything else loses its middle."""
    if len(label) <= width:
        return label
    if width <= 1:
        return label[:max(0, width)]
    head, at, loc = label.rpartition("@")
    if at:
        base = loc.rsplit("/", 1)[-1]
        if base != loc:
            short = f"{head}@{ELLIPSIS}/{base}"
            if len(short) <= width:
                return short
        target, colon, op = head.rpartition(":")
        tail = f"{colon}{op}@{base}"            # ":op@file.py:line#n"
        room = width - len(tail) - 1
        if target and room >= 3:
            return target[:room] + ELLIPSIS + tail
        if len(tail) + 1 <= width:
            return ELLIPSIS + tail
        label = tail.lstrip(":")
        if len(label) <= width:
            return label
    keep = width - 1                    # the end (file:line) matters more than the start
    front = keep // 3
    return label[:front] + ELLIPSIS + label[len(label) - (keep - front):]


class _Screen:
    """The live view as a rich renderable, drawn at the console's size when it is drawn."""

    def __init__(self, view: "LiveView") -> None:
        self.view = view

    def __rich_console__(self, console, options):
        yield self.view.render(options.max_width, options.size.height)


class LiveView(Observer):
    def __init__(self, campaign: str, max_steps: int, time_limit_s: float, enabled: bool = True,
                 live: bool | None = None, stream=None, started: float | None = None) -> None:
        self.campaign = campaign
        self.max_steps = max(0, int(max_steps))
        self.time_limit = time_limit_s
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.live = (self.stream.isatty() if live is None else live) and enabled
        self._t0 = time.monotonic() if started is None else started
        self._last_line = time.monotonic()  # the first plain headline comes HEADLINE_S from now
        self._last_draw = 0.0
        self._live = None
        self.sites: list = []
        self.counts: Counter = Counter()
        self.steps = 0
        self.budget = 0
        self._seen: dict[str, tuple] = {}   # site id -> (status, steps, budget) as counted
        self._said: dict[str, tuple] = {}   # site id -> (status, exit reason) of its last plain line
        self._bugs: set[str] = set()        # the signatures of the run's bugs so far

    def __enter__(self) -> "LiveView":
        if self.live:
            from rich.console import Console
            from rich.live import Live

            # redrawn from tick() only: no refresh thread reading the counts while the controller writes them
            self._live = Live(_Screen(self), console=Console(file=self.stream), auto_refresh=False, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            live.__exit__(*exc)

    # -- the counts -------------------------------------------------------------------------------
    def _budget_of(self, rec) -> int:
        """A live (or stopped) site may spend its whole budget; one that ended on its own spent what it used."""
        if rec.status.final and rec.status is not SiteStatus.STOPPED:
            return rec.steps
        return max(self.max_steps, rec.steps)

    def _count(self, rec) -> None:
        """Bring the counts up to ``rec`` as it is now (idempotent: events may come late, or twice)."""
        key = rec.site.id
        old = self._seen.get(key)
        if old is None:
            return                          # not one of the sites announced by sites_ready (yet)
        new = (rec.status, rec.steps, self._budget_of(rec))
        if new == old:
            return
        self.counts[old[0]] -= 1
        self.counts[new[0]] += 1
        self.steps += new[1] - old[1]
        self.budget += new[2] - old[2]
        self._seen[key] = new

    def percent(self) -> float:
        if self.budget <= 0:
            return 100.0 if self.sites and not self.live_sites() else 0.0
        return min(100.0, 100.0 * self.steps / self.budget)

    def live_sites(self) -> int:
        return self.counts[SiteStatus.PENDING] + self.counts[SiteStatus.SEARCHING]

    def bugs(self) -> int:
        return len(self._bugs)

    # -- observer -------------------------------------------------------------------------------
    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._live is not None:     # above the view; the terminal wraps it (a path stays one string)
            self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)

    def sites_ready(self, sites) -> None:
        self.sites = list(sites)
        self._seen = {rec.site.id: (rec.status, rec.steps, self._budget_of(rec)) for rec in self.sites}
        self.counts = Counter(s for s, _, _ in self._seen.values())
        self.steps = sum(steps for _, steps, _ in self._seen.values())
        self.budget = sum(budget for _, _, budget in self._seen.values())

    def quantum(self, rec, result) -> None:
        self._count(rec)

    def site_changed(self, rec, before) -> None:
        self._count(rec)
        if self._live is not None or rec.status is SiteStatus.PENDING:
            return
        said = (rec.status, rec.exit_reason)
        if self._said.get(rec.site.id) == said:   # two changes heard after one commit: one line
            return
        self._said[rec.site.id] = said
        self.message(self.event_line(rec))

    def event_line(self, rec) -> str:
        """A plain line for a site's new status: the label, how it stands (:func:`site_outcome`), its steps."""
        if rec.status is SiteStatus.SEARCHING and not rec.steps:
            return f"[{self.campaign}] {rec.site.label} searching"
        return f"[{self.campaign}] {rec.site.label} {site_outcome(rec.to_dict(), steps=True)}"

    def findings_restored(self, findings) -> None:
        self._bugs.update(f.signature for f in findings)

    def finding(self, rec, finding, folder) -> None:
        """The first finding of each bug in this run gets its lines, live view or not: what broke and
        where; later occurrences of the same bug say nothing (``summary.json`` lists them)."""
        if finding.signature in self._bugs:
            return
        self._bugs.add(finding.signature)
        by = None if finding.site_triggered else rec.site.label
        for line in finding_lines(finding, str(folder), len(self._bugs), by):
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
                self._live.refresh()
        elif now - self._last_line >= HEADLINE_S:
            self._last_line = now
            self.message(self.headline())

    def run_ended(self, run) -> None:
        """The last view once (the closing lines then follow it, not above it), or the last headline."""
        if not self.enabled:
            return
        if self._live is not None:
            live, self._live = self._live, None
            live.__exit__(None, None, None)      # draws it a last time
        else:
            self.message(self.headline())

    # -- rendering ------------------------------------------------------------------------------
    def headline(self) -> str:
        elapsed = time.monotonic() - self._t0
        return (f"[{self.campaign}] steps {self.steps}/{self.budget} ({self.percent():.0f}%), "
                f"bugs {self.bugs()}, live sites {self.live_sites()}/{len(self.sites)}, "
                f"time {elapsed:.0f}s/{self.time_limit:.0f}s")

    def ordered(self) -> list:
        """The sites, most telling first: findings, live searches (lowest best loss, then most steps
        first), errors, pending sites, then those that ended without a finding."""
        def key(item):
            index, rec = item
            if rec.status is SiteStatus.SEARCHING:
                best = rec.best_loss if math.isfinite(rec.best_loss) else math.inf
                return (RANK[rec.status], best, -rec.steps, index)
            return (RANK.get(rec.status, len(RANK)), 0.0, 0, index)
        return [rec for _, rec in sorted(enumerate(self.sites), key=key)]

    @staticmethod
    def _pick(order: list, rows: int) -> list:
        """The first ``rows`` of ``order``, except that findings leave at least half the rows to the
        sites after them (their FOUND lines were printed above the view already)."""
        findings = [rec for rec in order if rec.status.finding]
        others = order[len(findings):]
        keep = max(rows - len(others), rows - rows // 2)
        findings = findings[:keep]
        return findings + others[:rows - len(findings)]

    def renderable(self) -> _Screen:
        """What a rich Console prints or a Live shows: the view, at the console's size when drawn."""
        return _Screen(self)

    def render(self, width: int, height: int):
        """The view in at most ``width`` columns and ``height`` lines: the rows that fit, a line for
        the sites that do not, the bar and the headline (the last two lines, always there)."""
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        width, height = max(1, width), max(1, height)
        pct = self.percent()
        elapsed = time.monotonic() - self._t0
        suffix = f" {pct:3.0f}% {elapsed:.0f}s/{self.time_limit:.0f}s"
        footer = [Text(self.headline(), no_wrap=True, overflow="ellipsis", end="")]
        if height >= 2:
            bar_w = width - len(suffix)
            if bar_w >= 10:
                bar = Table.grid(padding=0)
                bar.add_column(width=bar_w, no_wrap=True)
                bar.add_column(width=len(suffix), no_wrap=True)
                bar.add_row(ProgressBar(total=max(1, self.budget), width=bar_w,
                                        completed=min(self.steps, self.budget) if self.budget else
                                        (1 if pct >= 100 else 0)), suffix)
            else:
                bar = Text(suffix.strip(), no_wrap=True, overflow="ellipsis")
            footer.insert(0, bar)
        room = height - len(footer)           # the lines left for the table (with its header) and the rest
        if room < 1 or not self.sites:
            return Group(*footer)
        order = self.ordered()
        if len(order) + 1 <= room:
            shown, rest = order, []
        else:
            shown = self._pick(order, max(0, room - 2))   # the header, the rows, one line for the others
            picked = {id(rec) for rec in shown}
            rest = [rec for rec in order if id(rec) not in picked]
        parts: list = []
        if shown:
            parts.append(self._table(width, shown))
        if rest:
            counts = Counter(rec.status for rec in rest)
            what = ", ".join(f"{counts[s]} {s.value}" for s in sorted(counts, key=lambda s: RANK.get(s, 99)))
            more = f"{ELLIPSIS} {len(rest)} more site(s): " if shown else f"{len(rest)} site(s): "
            parts.append(Text(more + what, no_wrap=True, overflow="ellipsis", style="dim"))
        return Group(*parts, *footer)

    def _table(self, width: int, shown: list):
        from rich.table import Table
        from rich.text import Text

        columns = self._columns(width, shown)
        table = Table(box=None, pad_edge=False, padding=(0, GAP // 2), show_edge=False, expand=False,
                      header_style="bold")
        for name, w, justify in columns:
            table.add_column(name, width=w, min_width=w, max_width=w, no_wrap=True, overflow="ellipsis",
                             justify=justify)
        site_w = columns[0][1]
        for rec in shown:
            style = STYLE.get(rec.status)
            cells = {"site": shorten(rec.site.label, site_w),
                     "status": Text(rec.status.value, style=style or ""),
                     "steps": str(rec.steps), "best": _loss(rec.best_loss), "loss": _loss(rec.last_loss),
                     "finding": (rec.finding or "").rsplit("/", 1)[-1]}
            table.add_row(*(cells[name] for name, _, _ in columns))
        return table

    def _columns(self, width: int, shown: list) -> list[tuple[str, int, str]]:
        """(name, width, justify) of each column that fits ``width``: site first, the rest as room allows
        (the last loss and the finding's folder on wide terminals only)."""
        steps_w = max(len("steps"), len(str(max([self.max_steps] + [r.steps for r in shown]))))
        finding_w = max([len((r.finding or "").rsplit("/", 1)[-1]) for r in shown] + [len("finding")])
        wanted = [("status", STATUS_W, "left"), ("steps", steps_w, "right"), ("best", LOSS_W, "right"),
                  ("loss", LOSS_W, "right"), ("finding", min(finding_w, 44), "left")]
        optional = {"loss": 100, "finding": 120}       # the widths from which they are shown
        columns = [c for c in wanted if width >= optional.get(c[0], 0)]
        while columns:
            used = sum(w + GAP for _, w, _ in columns)
            if width - used >= MIN_SITE_W or len(columns) == 1 and width - used >= 4:
                break
            columns.pop()
        site_w = max(1, width - sum(w + GAP for _, w, _ in columns))
        return [("site", site_w, "left"), *columns]
