"""The terminal view: the live view fits any terminal (the headline and the bar always on its last
lines, the most telling sites first, the rest counted), its percentage ends at 100% once every site
ended (early or not), and the plain mode prints one line per status change and one last headline."""
from __future__ import annotations

import io
import math
import re

import pytest
from rich.console import Console

from fuzz_core.sites import OpSite
from fuzz_core.status import ExitReason, SiteStatus
from orchestrator.observers.progress import LiveView, shorten
from orchestrator.run.records import SiteRecord

MAX_STEPS = 200
SIZES = [(80, 24), (140, 45)]
ENDED = {SiteStatus.FOUND: ExitReason.TRIGGERED, SiteStatus.FLAKY: ExitReason.TRIGGERED_FLAKY,
         SiteStatus.EXHAUSTED: ExitReason.BUDGET_SPENT, SiteStatus.RETIRED: ExitReason.NO_PROGRESS,
         SiteStatus.UNREACHABLE: ExitReason.UNREACHABLE, SiteStatus.ERROR: ExitReason.TARGET_ERROR,
         SiteStatus.TIMEOUT: ExitReason.QUANTUM_TIMEOUT}


def site(i: int) -> SiteRecord:
    """A site with a label as long as a real one (``target:op@path/file.py:line#n``)."""
    op = ("log", "div", "exp", "log_grad", "sqrt")[i % 5]
    return SiteRecord(OpSite(f"s{i:04d}", f"log-one-minus-sigmoid-{i % 7}", op, op, "domain",
                             f"campaigns/targets/log_one_minus_sigmoid_{i % 3}.py:{40 + i}", i % 2))


def change(view: LiveView, rec: SiteRecord, status: SiteStatus, steps: int | None = None,
           best: float | None = None) -> None:
    """What the controller does: change the record, then tell the observer."""
    before = rec.status
    rec.status, rec.exit_reason = status, ENDED.get(status, ExitReason.NONE)
    if steps is not None:
        rec.steps = steps
    if best is not None:
        rec.best_loss = rec.last_loss = best
    if status.finding:
        rec.finding = f"findings/{rec.site.target}-{rec.site.op}-{rec.site.id}"
    view.site_changed(rec, before)


def mixed_campaign(n: int) -> tuple[LiveView, list[SiteRecord]]:
    """``n`` sites in every status: a few findings, many live searches, errors, pending, ended."""
    view = LiveView("all-torch", MAX_STEPS, 3600, live=False, stream=io.StringIO())
    recs = [site(i) for i in range(n)]
    view.sites_ready(recs)
    cycle = [SiteStatus.SEARCHING, SiteStatus.SEARCHING, SiteStatus.SEARCHING, SiteStatus.PENDING,
             SiteStatus.EXHAUSTED, SiteStatus.RETIRED, SiteStatus.UNREACHABLE, SiteStatus.ERROR,
             SiteStatus.SEARCHING, SiteStatus.FOUND, SiteStatus.SEARCHING, SiteStatus.FLAKY]
    for i, rec in enumerate(recs):
        status = cycle[i % len(cycle)]
        if status is SiteStatus.PENDING:
            continue
        change(view, rec, SiteStatus.SEARCHING, steps=0)
        if status is not SiteStatus.SEARCHING:
            change(view, rec, status, steps=MAX_STEPS if status is SiteStatus.EXHAUSTED else 20 + i % 50,
                   best=float(i % 13) / 3)
        else:
            rec.steps, rec.best_loss, rec.last_loss = 10 * (i % 15), 1000.0 / (i + 1), 1000.0 / (i + 1)
            view.quantum(rec, None)
    return view, recs


def draw(view: LiveView, width: int, height: int) -> list[str]:
    console = Console(file=io.StringIO(), width=width, height=height, force_terminal=True, color_system=None,
                      legacy_windows=False)
    console.print(view.renderable())
    return console.file.getvalue().rstrip("\n").split("\n")


def displayed_width(line: str) -> int:
    return len(line)       # the view writes one-column characters only (the ellipsis and the bar too)


@pytest.mark.parametrize("n", [32, 300])
@pytest.mark.parametrize("width,height", SIZES)
def test_live_view_fits_the_terminal_with_the_headline_last(n: int, width: int, height: int):
    view, recs = mixed_campaign(n)
    lines = draw(view, width, height)
    assert len(lines) <= height, "\n".join(lines)
    assert max(displayed_width(line) for line in lines) <= width, "\n".join(lines)
    assert lines[-1].startswith(f"[all-torch] steps {view.steps}/{view.budget} ("), lines[-1]
    assert re.search(r"━.* +\d+% \d+s/3600s$", lines[-2]), lines[-2]      # the bar, with the percentage
    assert lines[0].split()[:2] == ["site", "status"], lines[0]
    rows = [line for line in lines[1:-2] if not line.startswith("…")]
    assert rows, "\n".join(lines)
    shown = len(rows)
    if shown < n:                       # the others are counted, by status, in one line
        more = [line for line in lines if line.startswith("…")]
        assert len(more) == 1 and more[0].startswith(f"… {n - shown} more site(s): "), lines
        assert len(lines) >= height - 1, "the rows fill the terminal"
    else:
        assert not any(line.startswith("…") for line in lines)
    # every row is one line: its label ends with the site's file:line#n, its status follows
    by_end = {f"{rec.site.location.rsplit('/', 1)[-1]}#{rec.site.occurrence}": rec for rec in recs}
    statuses = []
    for row in rows:
        label, status = row.split()[:2]
        end = next(e for e in by_end if label.endswith(e))
        assert by_end[end].status.value == status, row
        assert f":{by_end[end].site.op}@" in label, row            # the op is kept too
        statuses.append(by_end[end].status)
    # findings first, then the live searches, then errors, then the rest
    ranks = [0 if s.finding else 1 if s is SiteStatus.SEARCHING else 2 if s is SiteStatus.ERROR else 3
             for s in statuses]
    assert ranks == sorted(ranks), statuses
    assert SiteStatus.SEARCHING in statuses, "findings leave room for the live searches"
    searching = [by_end[next(e for e in by_end if row.split()[0].endswith(e))] for row in rows
                 if row.split()[1] == "searching"]
    assert [r.best_loss for r in searching] == sorted(r.best_loss for r in searching)


def test_live_view_in_a_tiny_terminal_keeps_the_headline():
    view, _ = mixed_campaign(300)
    for width, height in [(40, 6), (30, 3), (20, 2), (12, 1)]:
        lines = draw(view, width, height)
        assert len(lines) <= height and max(map(displayed_width, lines)) <= width, lines
        assert lines[-1].startswith("[all-torch"), lines


def test_the_view_is_sized_when_drawn():
    """The same renderable (what the Live shows) follows the console's size: a resized terminal."""
    view, _ = mixed_campaign(300)
    small, large = draw(view, 80, 24), draw(view, 140, 45)
    assert len(small) == 24 and len(large) == 45
    assert max(map(len, large)) > 80


def test_labels_keep_the_op_and_file_line():
    label = "log-one-minus-sigmoid:log_grad@campaigns/targets/log_one_minus_sigmoid.py:43#1"
    assert shorten(label, 200) == label
    folders_out = "log-one-minus-sigmoid:log_grad@…/log_one_minus_sigmoid.py:43#1"
    assert shorten(label, len(folders_out)) == folders_out
    short = shorten(label, 50)
    assert len(short) == 50 and short.endswith(":log_grad@log_one_minus_sigmoid.py:43#1"), short
    for width in range(1, 90):
        short = shorten(label, width)
        assert len(short) <= width, (width, short)
        if width >= 8:
            assert short.endswith("43#1"), (width, short)
    assert shorten("a" * 30, 10) == "aaa…aaaaaa"


def test_percentage_reaches_100_when_every_site_ended_early():
    """Sites that ended before their budget leave the total (it was 21-37% on completed campaigns)."""
    view = LiveView("early", MAX_STEPS, 60, live=False, stream=io.StringIO())
    recs = [site(i) for i in range(32)]
    view.sites_ready(recs)
    assert (view.steps, view.budget, view.percent()) == (0, 32 * MAX_STEPS, 0.0)
    ends = [SiteStatus.FOUND, SiteStatus.RETIRED, SiteStatus.UNREACHABLE, SiteStatus.ERROR, SiteStatus.FLAKY,
            SiteStatus.TIMEOUT, SiteStatus.EXHAUSTED]
    for i, rec in enumerate(recs):
        change(view, rec, SiteStatus.SEARCHING)
        rec.steps = 5 + i
        view.quantum(rec, None)
        spent = sum(r.steps for r in recs[:i])
        assert view.budget == spent + (32 - i) * MAX_STEPS       # still searching: its budget counts
        status = ends[i % len(ends)]
        change(view, rec, status, steps=MAX_STEPS if status is SiteStatus.EXHAUSTED else rec.steps)
    used = sum(rec.steps for rec in recs)
    assert (view.steps, view.budget) == (used, used)
    assert view.percent() == 100.0
    assert "(100%)" in view.headline()
    bar = draw(view, 80, 24)[-2]
    assert re.fullmatch(r"━{60,} 100% \d+s/60s", bar), bar          # a full bar


def test_a_stopped_campaign_keeps_the_budget_it_did_not_spend():
    view = LiveView("stopped", 100, 60, live=False, stream=io.StringIO())
    recs = [site(i) for i in range(4)]
    view.sites_ready(recs)
    change(view, recs[0], SiteStatus.FOUND, steps=10)
    for rec in recs[1:]:
        change(view, rec, SiteStatus.STOPPED, steps=30)
    assert (view.steps, view.budget) == (100, 310)
    assert f"({100 * 100 / 310:.0f}%)" in view.headline()


def test_events_heard_late_or_twice_count_once():
    """The controller tells its observers after the commit: two changes of one site are heard with
    the record already final, and a quantum may be heard after the status changed."""
    view = LiveView("late", 100, 60, live=False, stream=io.StringIO())
    recs = [site(i) for i in range(3)]
    view.sites_ready(recs)
    rec = recs[0]
    rec.status, rec.exit_reason, rec.steps = SiteStatus.FOUND, ExitReason.TRIGGERED, 7
    view.quantum(rec, None)
    view.site_changed(rec, SiteStatus.PENDING)
    view.site_changed(rec, SiteStatus.SEARCHING)
    assert view.counts[SiteStatus.FOUND] == 1 and view.counts[SiteStatus.PENDING] == 2
    assert min(view.counts.values()) >= 0
    assert (view.steps, view.budget) == (7, 207)
    assert view.stream.getvalue().count(rec.site.label) == 1


def test_plain_mode_prints_a_line_per_event_and_one_final_headline():
    stream = io.StringIO()
    view = LiveView("plain", 100, 60, live=None, stream=stream)       # a StringIO is no terminal
    assert not view.live
    with view:
        recs = [site(i) for i in range(5)]
        view.sites_ready(recs)
        for rec in recs:
            view.tick()
            change(view, rec, SiteStatus.SEARCHING)
        view.tick()
        change(view, recs[0], SiteStatus.FOUND, steps=3, best=0.0)
        change(view, recs[1], SiteStatus.RETIRED, steps=40, best=2.5)
        change(view, recs[2], SiteStatus.EXHAUSTED, steps=100, best=1.25)
        recs[2].reach = {"message": "out of reach"}
        change(view, recs[3], SiteStatus.ERROR, steps=0)
        change(view, recs[4], SiteStatus.UNREACHABLE, steps=2)
        view.tick()
        view.run_ended(None)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 5 + 5 + 1, lines
    assert lines[:5] == [f"[plain] {rec.site.label} searching" for rec in recs]
    assert lines[5] == f"[plain] {recs[0].site.label} found (triggered) after 3 steps"
    assert lines[6] == f"[plain] {recs[1].site.label} retired (no progress) after 40 steps, closest suspect loss 2.5"
    assert lines[7] == f"[plain] {recs[2].site.label} exhausted (budget spent) after 100 steps, closest suspect loss 1.25"
    assert lines[8].startswith(f"[plain] {recs[3].site.label} error (target error) after 0 steps")
    assert not any("\x1b" in line for line in lines), "no terminal codes in a log"
    headlines = [line for line in lines if line.startswith("[plain] steps ")]
    assert headlines == [lines[-1]]
    assert lines[-1].startswith("[plain] steps 145/145 (100%), bugs 0, live sites 0/5, time ")   # none reported


def test_plain_mode_headline_every_ten_seconds(monkeypatch):
    import orchestrator.observers.progress as progress

    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    view = LiveView("slow", 100, 60, live=False, stream=stream)
    view.sites_ready([site(i) for i in range(2)])
    for _ in range(25):             # 25 s of turns, one every 1 s
        view.tick()
        now[0] += 1.0
    assert [line.split(" time ")[-1] for line in stream.getvalue().splitlines()] == ["10s/60s", "20s/60s"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_mode_draws_the_final_view_once_before_the_closing_lines():
    stream = Terminal()
    view = LiveView("live", 100, 60, live=None, stream=stream)
    assert view.live, "a terminal gets the live view"
    recs = [site(i) for i in range(40)]
    with view:
        view._live.console.size = (80, 24)
        view.sites_ready(recs)
        for rec in recs:
            change(view, rec, SiteStatus.SEARCHING)
            view.tick()
            change(view, rec, SiteStatus.RETIRED, steps=5)
            view.tick()
        view.run_ended(None)
        view.message("cdeepfuzz: 0 finding(s); summary: somewhere")
    out = stream.getvalue()
    assert out.count("[live] steps 200/200 (100%)") == 1, out[-3000:]
    assert out.rstrip().endswith("cdeepfuzz: 0 finding(s); summary: somewhere"), out[-500:]
    assert "retired" in out


def test_quiet_prints_nothing():
    stream = io.StringIO()
    view = LiveView("quiet", 100, 60, enabled=False, live=None, stream=stream)
    with view:
        recs = [site(i) for i in range(3)]
        view.sites_ready(recs)
        change(view, recs[0], SiteStatus.SEARCHING)
        view.tick()
        view.run_ended(None)
    assert stream.getvalue() == ""
    assert math.isclose(view.percent(), 0.0)
