"""``cdeepfuzz report``: a self-contained HTML report of a campaign run that opens offline.

Written into ``<run folder>/report/``, every link relative, nothing loaded from the network
(the chart script ships with the package, in ``orchestrator/report_assets``, and is inlined):

- ``index.html``: the run (campaign, state, totals); every target, the clean ones too; the
  bugs (one per signature, as ``summary.json`` lists them), each linked to its own page; the scheduler's budget allocation over time
  (cumulative steps of the sites against the time their trace shards were written, and the
  grants of ``allocation.json`` when the run folder has one); the suspect loss of every site
  against its steps, found sites first, then the closest, drawn as each chart scrolls into view
  (zoom with the wheel or a dragged box, hover for the values, a log-scale switch); and the sites
  table, with how each site stands (:func:`orchestrator.wording.site_outcome`).
- ``findings/<finding>.html``, one per bug, from its smallest reproducer: the source line with its
  context, the op and its first non-finite output, the minimised input as numbers (and as an image
  when it is image-shaped), the replay and pytest commands, links to the finding's files, the fix
  verdict, the bug's occurrences and triage state, the MLflow run when there is one, and the loss curve
  of the site it is at (else of the site whose search found it).

Loss traces are downsampled (minimum and maximum per bucket, events kept) to at most
``MAX_POINTS`` points per site and ``TOTAL_POINTS`` in all, so a 1,000-site report stays small.

Given an output folder that holds several runs, the newest run (by ``run.started`` in its
``summary.json``) is reported; ``all_runs=True`` reports every run and writes
``<output>/report/index.html`` linking them.
"""
from __future__ import annotations

import html
import json
import logging
import math
import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from fuzz_core.io import atomic_write_bytes, load_arrays, read_json
from fuzz_core.sites import position_of
from orchestrator.export import load_run as load_export
from orchestrator.observers.summary import FILENAME as SUMMARY
from orchestrator.wording import bug_words, site_outcome

log = logging.getLogger(__name__)

REPORT_DIR = "report"
INDEX = "index.html"
FINDING_PAGES = "findings"
ALLOCATION = "allocation.json"
MAX_POINTS = 2000          # per site
TOTAL_POINTS = 250_000     # per report: long campaigns get fewer points per site
MAX_ALLOCATION_SERIES = 12
SOURCE_CONTEXT = 5         # lines either side of the site's line
MAX_TABLE_ROWS, MAX_TABLE_COLS = 16, 64
MAX_TEXT_VALUES = 20_000
MAX_IMAGES = 16
FOUND = ("found", "flaky")
PLAIN_EVENTS = ("", "step")
_SEQ = re.compile(r"-(\d{6})-[0-9a-f]{8}\.parquet$")
_LOC = re.compile(r"^(?P<path>.+?):(?P<line>\d+)(?::(?P<col>\d+))?$")


class ReportError(ValueError):
    """A folder that holds no campaign run."""


@dataclass
class SiteTrace:
    steps: np.ndarray
    losses: np.ndarray
    events: np.ndarray      # of str


@dataclass
class RunData:
    run_dir: Path
    summary: dict[str, Any]
    traces: dict[str, SiteTrace] = field(default_factory=dict)
    shards: list[tuple[float, str, int]] = field(default_factory=list)   # (written at, site id, last step)
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)   # signature -> its reproducer's finding.json
    bugs: dict[str, dict[str, Any]] = field(default_factory=dict)       # signature -> the bug database's record
    allocation: list[dict[str, Any]] = field(default_factory=list)


# -- finding the runs ----------------------------------------------------------------------------
def run_folders(path: Path, all_runs: bool = False) -> list[Path]:
    """The run folder itself, or the newest run (every run with ``all_runs``) of an output folder."""
    path = Path(path)
    if (path / SUMMARY).is_file():
        return [path]
    runs = [p.parent for p in path.glob(f"*/{SUMMARY}")]
    if not runs:
        raise ReportError(f"{path}: no campaign run here (no {SUMMARY} in it or in its sub-folders)")
    runs.sort(key=_started)
    return runs if all_runs else runs[-1:]


def _started(run: Path) -> tuple[str, float]:
    try:
        started = str((read_json(run / SUMMARY).get("run") or {}).get("started") or "")
    except (OSError, ValueError):
        started = ""
    return started, (run / SUMMARY).stat().st_mtime


def write_reports(path: Path, all_runs: bool = False) -> list[Path]:
    """Report the run (or the newest / every run of an output folder); return the index files."""
    runs = run_folders(path, all_runs)
    pages = [write_report(run) for run in runs]
    if all_runs and not (Path(path) / SUMMARY).is_file():
        pages.append(_write_output_index(Path(path), runs))
    return pages


# -- reading a run -------------------------------------------------------------------------------
def load_run(run_dir: Path) -> RunData:
    run_dir = Path(run_dir)
    summary, data_findings = load_export(run_dir)
    data = RunData(run_dir, summary, findings=data_findings)
    campaign = (data.summary.get("campaign") or {}).get("name", "")
    _read_traces(data, run_dir.parent, campaign, run_dir.name)
    from fuzz_core.dedupe import BugDatabase

    data.bugs = {b["signature"]: b for b in BugDatabase(run_dir.parent).bugs()}
    if (run_dir / ALLOCATION).is_file():
        data.allocation = list(read_json(run_dir / ALLOCATION))
    return data


def _read_traces(data: RunData, root: Path, campaign: str, run: str) -> None:
    """This run's trace rows, per site, and its shards in the order they were written."""
    folder = root / "traces" / f"campaign={campaign}"
    rows: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for path in folder.glob("site_id=*/part-*.parquet"):
        try:
            table = pq.read_table(path, columns=["run", "step", "suspect_loss", "event"], use_threads=False)
            mine = np.asarray(table.column("run").to_pylist(), dtype=object) == run
            if not mine.any():
                continue
            steps = np.asarray(table.column("step").to_numpy(zero_copy_only=False), dtype=np.int64)[mine]
            losses = np.asarray(table.column("suspect_loss").to_numpy(zero_copy_only=False), dtype=np.float64)[mine]
            events = np.asarray([str(e) for e in table.column("event").to_pylist()], dtype=object)[mine]
        except Exception as exc:  # noqa: BLE001 - one unreadable shard must not lose the report
            log.warning("report: skipping %s: %s", path, exc)
            continue
        site_id = path.parent.name.split("=", 1)[1]
        rows.setdefault(site_id, []).append((steps, losses, events))
        seq = _SEQ.search(path.name)
        data.shards.append((path.stat().st_mtime, site_id, int(steps.max()), int(seq.group(1)) if seq else 0))
    data.shards = [(t, s, step) for t, s, step, _ in sorted(data.shards, key=lambda x: (x[0], x[3]))]
    for site_id, parts in rows.items():
        steps = np.concatenate([p[0] for p in parts])
        order = np.argsort(steps, kind="stable")
        data.traces[site_id] = SiteTrace(steps[order], np.concatenate([p[1] for p in parts])[order],
                                         np.concatenate([p[2] for p in parts])[order])


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def ordered_sites(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Found sites first (fewest steps first), then the others by best loss."""
    def key(s: dict[str, Any]) -> tuple:
        best = s.get("best_loss")
        return (s.get("status") not in FOUND, s.get("steps", 0) if s.get("status") in FOUND else 0,
                best if isinstance(best, (int, float)) else math.inf, s.get("label", ""))

    return sorted(summary.get("sites", []), key=key)


# -- the loss series, downsampled --------------------------------------------------------------------
def downsample(trace: SiteTrace, n: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """At most about ``n`` points of a trace: the first and the last, the trigger and (up to a
    quarter of ``n``) the other events, and the lowest and highest loss of each bucket."""
    m = len(trace.steps)
    if m <= n:
        keep = np.arange(m)
    else:
        events = np.asarray(trace.events, dtype=object)
        marked = np.flatnonzero(~np.isin(events, PLAIN_EVENTS))
        is_trigger = events[marked] == "trigger"
        triggers, others = marked[is_trigger].tolist(), marked[~is_trigger]
        if len(others) > n // 4:
            others = others[::math.ceil(len(others) / max(n // 4, 1))]
        others = others.tolist()
        fixed = np.array(sorted({0, m - 1, *triggers, *others}), dtype=np.int64)
        buckets = max(1, (n - len(fixed)) // 2)
        width = math.ceil(m / buckets)
        rows = math.ceil(m / width)
        vals = np.asarray(trace.losses, dtype=np.float64)
        finite = np.isfinite(vals)
        lo = np.full(rows * width, np.inf)
        hi = np.full(rows * width, -np.inf)
        lo[:m] = np.where(finite, vals, np.inf)
        hi[:m] = np.where(finite, vals, -np.inf)
        base = np.arange(rows) * width
        keep = np.unique(np.concatenate([fixed, base + lo.reshape(rows, width).argmin(axis=1),
                                         base + hi.reshape(rows, width).argmax(axis=1)]))
        keep = keep[keep < m]
    return trace.steps[keep], trace.losses[keep], [str(e) for e in np.asarray(trace.events, dtype=object)[keep]]


def _nums(values: Any) -> str:
    """A JSON array of numbers, four significant digits, ``null`` for a non-finite one."""
    out = []
    for v in np.asarray(values, dtype=np.float64).tolist():
        out.append(f"{v:.4g}" if math.isfinite(v) else "null")
    return "[" + ",".join(out) + "]"


def _ints(values: Any) -> str:
    return "[" + ",".join(str(int(v)) for v in np.asarray(values).tolist()) + "]"


def _site_series(site: dict[str, Any], trace: SiteTrace, n: int) -> str:
    steps, losses, events = downsample(trace, n)
    marks: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        if e not in PLAIN_EVENTS:
            marks.setdefault(e, []).append(i)
    return (f'{{"name":{json.dumps(str(site.get("label", site["id"])))},"s":{_ints(steps)},"l":{_nums(losses)},'
            f'"e":{json.dumps(marks)},"n":{len(trace.steps)},"found":{json.dumps(site.get("status") in FOUND)}}}')


def _points_per_site(data: RunData) -> int:
    return max(100, min(MAX_POINTS, TOTAL_POINTS // max(1, len(data.traces))))


def _allocation_charts(data: RunData, labels: dict[str, str]) -> dict[str, str]:
    """The budget charts as JSON specs: steps per site against the time its shards were written,
    and the scheduler's grants; the ``MAX_ALLOCATION_SERIES`` sites that spent most."""
    charts: dict[str, str] = {}

    def spec(series: dict[str, list[tuple[float, float]]], xlabel: str, xname: str, ylabel: str) -> str:
        top = sorted(series, key=lambda k: -series[k][-1][1])[:MAX_ALLOCATION_SERIES]
        parts = [f'{{"name":{json.dumps(_short(labels.get(k, k), 60))},"x":{_nums([p[0] for p in series[k]])},'
                 f'"y":{_ints([p[1] for p in series[k]])}}}' for k in top]
        return (f'{{"xlabel":{json.dumps(xlabel)},"xname":{json.dumps(xname)},"ylabel":{json.dumps(ylabel)},'
                f'"shown":{len(top)},"of":{len(series)},"series":[{",".join(parts)}]}}')

    if data.shards:
        t0 = data.shards[0][0]
        series: dict[str, list[tuple[float, float]]] = {}
        for t, site, step in data.shards:
            series.setdefault(site, [(0.0, 0)]).append((round(t - t0, 3), step))
        charts["alloc-time"] = spec(series, "seconds since the first quantum ended (trace shard written)",
                                    "seconds", "cumulative steps of the site")
    if data.allocation:
        granted: dict[str, list[tuple[float, float]]] = {}
        for a in data.allocation:
            pts = granted.setdefault(str(a["site_id"]), [(0, 0)])
            pts.append((int(a["total"]), pts[-1][1] + int(a["steps"])))
        charts["alloc-grant"] = spec(granted, "steps granted in the whole campaign", "campaign steps",
                                     "steps granted to the site")
    return charts


def _data_script(sites: dict[str, str], charts: dict[str, str]) -> str:
    body = ('{"sites":{' + ",".join(f"{json.dumps(k)}:{v}" for k, v in sites.items()) + '},"charts":{'
            + ",".join(f"{json.dumps(k)}:{v}" for k, v in charts.items()) + "}}")
    safe = body.replace("</", "<\\/")
    return f'<script type="application/json" id="cdf-data">{safe}</script>'


# -- HTML helpers ----------------------------------------------------------------------------------------
def _asset(name: str) -> str:
    return (resources.files("orchestrator") / "report_assets" / name).read_text(encoding="utf-8")


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _short(text: str, n: int) -> str:
    text = str(text)
    return text if len(text) <= n else "…" + text[-(n - 1):]


def _site_name(site: dict[str, Any]) -> str:
    """``target:op@file.py:line:col#occurrence``, the path shortened to its file name."""
    loc = position_of(site)
    return f"{site.get('target')}:{site.get('op')}@{loc.rsplit('/', 1)[-1]}#{site.get('occurrence', 0)}"


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return _e(x)


def _page(title: str, body: list[str], scripts: bool = True) -> str:
    js = f"<script>{_asset('chart.js')}</script>\n<script>{_asset('report.js')}</script>\n" if scripts else ""
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{_e(title)}</title>"
            f"<style>{_asset('report.css')}</style></head><body>\n" + "\n".join(body) + "\n" + js + "</body></html>\n")


def _table(head: list[str], rows: list[str], cls: str = "") -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    return f"<div class='scroll'><table class='{cls}'><thead><tr>{th}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"


def _distance(mini: dict[str, Any]) -> str:
    after, before = mini.get("distance"), mini.get("distance_before")
    if not after:
        return "—"
    text = f"L2 {_fmt(after.get('l2'))}, Linf {_fmt(after.get('linf'))}"
    if before:
        text += f" (search ended at L2 {_fmt(before.get('l2'))}, Linf {_fmt(before.get('linf'))})"
    return text


def _fix_cell(fix: dict[str, Any] | None, short: bool = False) -> str:
    if not fix:
        return "<span class='muted'>not checked (<code>cdeepfuzz fix</code>)</span>"
    status = str(fix.get("status", ""))
    cls = "verified" if status == "verified" else "bad"
    if short:
        return f"<span class='{cls}'>{_e(status or fix.get('message'))}</span>"
    out = f"<p><span class='{cls}'>{_e(status)}</span>: {_e(fix.get('message', ''))}</p>"
    rec = fix.get("recommended") or {}
    if rec.get("code"):
        out += f"<p>write instead ({_e(rec.get('description'))}):</p><pre>{_e(rec['code'])}</pre>"
    diff = fix.get("diff") or fix.get("patch")
    if isinstance(diff, str) and diff:
        out += f"<p>as a patch:</p><pre>{_e(diff)}</pre>"
    attempts = fix.get("attempts") or []
    if attempts:
        out += "<ul class='small'>" + "".join(
            f"<li>{_e((a.get('guard') or {}).get('description'))}: {_e(a.get('status'))}"
            f" ({_e(a.get('steps'))} steps)</li>" for a in attempts) + "</ul>"
    return out


def _bug_cell(data: RunData, bug: dict[str, Any]) -> str:
    """The bug's signature, its triage state, its occurrences here and across the output's runs."""
    sig = bug["signature"]
    here = len(bug.get("occurrences") or [])
    known = data.bugs.get(sig)
    if known is None:
        return f"<code>{_e(sig)}</code><br>{here} finding(s) in this run"
    from fuzz_core.dedupe import triage_state

    runs = len({o.get("run") for o in known.get("occurrences") or []})
    return (f"<code>{_e(sig)}</code> <span class='badge'>{_e(triage_state(known))}</span><br>{here} finding(s) in "
            f"this run; {len(known.get('occurrences') or [])} in {runs} run(s) of this output")


def _first_op(first: dict[str, Any] | None, phase: str | None = None) -> str:
    if not first:
        return "—"
    out = "NaN" if first.get("nan", True) else "±Inf"
    where = f"{position_of(first)}#{first.get('occurrence', 0)}"
    return (f"<b>{_e(first.get('op'))}</b> ({_e(first.get('kind'))}) output <b class='bad'>{out}</b> "
            f"at <code>{_e(where)}</code>" + (f", {_e(phase)} pass" if phase else ""))


def _site_note(site: dict[str, Any]) -> str:
    """How a site stands beyond its status (:func:`site_outcome`): its error, who found the bug at it, how
    close it came and what the search outside its bounds saw, and what a best loss of 0 without a bug
    means."""
    if site.get("error"):
        return _e(_short(site["error"], 300))
    outcome = site_outcome(site)
    notes = [outcome.split(", ", 1)[1]] if ", " in outcome else []
    if site.get("best_loss") == 0 and site.get("status") not in FOUND:
        notes.append("best loss 0: the search reached the edge of the op's domain, but no step's output there "
                     "went non-finite (the op may handle its edge finitely, or a guard holds)")
    return "<br>".join(_e(n) for n in notes)


def _status(site: dict[str, Any]) -> str:
    st = str(site.get("status"))
    why = site.get("exit_reason")
    return f"<span class='badge {_e(st)}'>{_e(st)}</span>" + (
        f" <span class='small muted'>{_e(why)}</span>" if why not in (None, "none") else "")


def _mlflow(uri: Any, run_id: Any) -> str:
    """A link to the MLflow run on a tracking server, or how to open it for a local store."""
    if not run_id:
        return ""
    if isinstance(uri, str) and uri.startswith(("http://", "https://")):
        url = f"{uri.rstrip('/')}/#/runs/{run_id}"
        return f"<a href='{_e(url)}'>{_e(run_id)}</a>"
    how = "cdeepfuzz ui <this run's folder>"
    return (f"<code>{_e(run_id)}</code> <span class='small muted'>(a local store: run <code>{_e(how)}</code>, "
            f"then open <code>http://127.0.0.1:5000/#/runs/{_e(run_id)}</code>)</span>")


# -- the index page ----------------------------------------------------------------------------------------
def _targets_table(data: RunData) -> str:
    by_target: dict[str, list[dict[str, Any]]] = {}
    for s in data.summary.get("sites", []):
        by_target.setdefault(str(s.get("target")), []).append(s)
    rows = []
    for t in data.summary.get("targets", []):
        mine = by_target.get(str(t.get("name")), [])
        found = sum(1 for b in data.summary.get("bugs", []) if t.get("name") in (b.get("targets") or []))
        verdict = (f"<span class='found'>{found} bug(s)</span>" if found else
                   "" if t.get("status") == "error" else f"no bug in {len(mine)} site(s)")
        rows.append(f"<tr><td><b>{_e(t.get('name'))}</b></td><td><code>{_e(t.get('entry'))}</code></td>"
                    f"<td>{_e(t.get('framework') or 'torch')}</td><td>{_status(t)}</td>"
                    f"<td class='num'>{_e(t.get('sites'))}</td><td>{verdict}</td>"
                    f"<td>{_e(_short(t.get('error') or '', 300))}</td></tr>")
    if not rows:
        return "<p>No target.</p>"
    return _table(["target", "entry", "framework", "status", "sites", "result", "error"], rows)


def _bugs_table(data: RunData, pages: dict[str, str]) -> str:
    rows = []
    for bug in data.summary.get("bugs", []):
        report = data.findings.get(bug["signature"]) or {}
        mini = report.get("minimised") or {}
        size = f"{mini.get('original_batch_size', report.get('batch_size'))} → {report.get('batch_size')}"
        href = pages.get(bug["signature"])
        what = _e(bug_words(bug))
        name = f"<a href='{_e(href)}'>{what}</a>" if href else what
        curve = next(iter(bug.get("sites") or []), None) or (bug.get("occurrences") or [{}])[0].get("site")
        rows.append(
            f"<tr><td class='label'>{name}</td><td>{_e(', '.join(bug.get('targets') or []))}</td>"
            f"<td>{_first_op(report.get('first_op'), report.get('phase'))}</td>"
            f"<td class='num'>{_e(report.get('step'))}</td><td>{size}</td><td>{_distance(mini)}</td>"
            f"<td>{_bug_cell(data, bug)}</td><td>{_fix_cell(report.get('fix'), short=True)}</td>"
            + (f"<td><a href='#site-{_e(curve)}'>curve</a></td>" if curve else "<td></td>") + "</tr>")
    if not rows:
        return "<p>No bug.</p>"
    return _table(["bug (its page)", "targets", "first non-finite op", "steps", "batch (original → minimised)",
                   "distance to the original sample", "signature, triage, findings", "fix", "loss"], rows)


def _filter_text(site: dict[str, Any]) -> str:
    return _e(f"{site.get('label', '')} {site.get('status', '')} {site.get('hazard', '')}".lower())


def _site_cards(data: RunData, sites: list[dict[str, Any]], pages: dict[str, str]) -> str:
    cards = []
    for s in sites:
        trace = data.traces.get(s["id"])
        chart = (f"<div class='cdf-host' data-site='{_e(s['id'])}'></div>" if trace is not None and len(trace.steps)
                 else "<p class='muted'>no trace (never searched)</p>")
        link = f" · <a href='{_e(pages[s['id']])}'>bug</a>" if s["id"] in pages else ""
        note = _site_note(s)
        cards.append(f"<div class='card' id='site-{_e(s['id'])}' data-filter='{_filter_text(s)}' "
                     f"data-status='{_e(s.get('status'))}'><h3 class='label'>{_e(s.get('label'))}</h3>"
                     f"<div class='small'>{_status(s)} · {_e(s.get('steps'))} steps · best loss "
                     f"{_fmt(s.get('best_loss'))}{link}</div>"
                     + (f"<div class='small muted'>{note}</div>" if note else "") + chart + "</div>")
    return "<div class='cards'>" + "".join(cards) + "</div>"


def _sites_table(sites: list[dict[str, Any]], pages: dict[str, str]) -> str:
    rows = []
    for s in sites:
        finding = f"<a href='{_e(pages[s['id']])}'>bug</a>" if s["id"] in pages else ""
        rows.append(f"<tr data-filter='{_filter_text(s)}' data-status='{_e(s.get('status'))}'>"
                    f"<td class='label'><a href='#site-{_e(s['id'])}'>{_e(s.get('label'))}</a></td>"
                    f"<td>{_status(s)}</td><td>{_e(s.get('op'))}</td><td>{_e(s.get('hazard'))}</td>"
                    f"<td class='num'>{_e(s.get('steps'))}</td><td class='num'>{_fmt(s.get('seconds'))}</td>"
                    f"<td class='num'>{_fmt(s.get('best_loss'))}</td><td>{finding}</td><td>{_site_note(s)}</td></tr>")
    return _table(["site", "status", "op", "hazard", "steps", "seconds", "best loss", "bug", "how it stands"],
                  rows)


def _header(data: RunData) -> list[str]:
    s, run = data.summary, data.summary.get("run") or {}
    totals = s.get("totals") or {}
    name = (s.get("campaign") or {}).get("name", "")
    mlflow = _mlflow(run.get("tracking_uri"), run.get("mlflow_run_id"))
    return [f"<h1>Campaign {_e(name)}</h1>",
            f"<p>run <code>{_e(data.run_dir.name)}</code>, state <b>{_e(run.get('state'))}</b>, "
            f"exit code {_e(run.get('exit_code'))}, {_fmt(run.get('seconds'))} s, executor {_e(run.get('executor'))}; "
            f"{_e(totals.get('targets'))} target(s), {_e(totals.get('sites'))} site(s), "
            f"{_e(totals.get('steps'))} steps, <b>{_e(len(s.get('bugs') or []))} bug(s)</b> "
            f"({_e(sum(len(b.get('occurrences') or []) for b in s.get('bugs') or []))} finding(s)).</p>",
            f"<p class='small'>MLflow: {mlflow or _e(run.get('tracking_uri') or 'tracking off')} · "
            f"<a href='../{SUMMARY}'>{SUMMARY}</a></p>"]


def render_index(data: RunData, sites: list[dict[str, Any]], pages: dict[str, str]) -> str:
    name = (data.summary.get("campaign") or {}).get("name", "")
    per_site = _points_per_site(data)
    series = {s["id"]: _site_series(s, data.traces[s["id"]], per_site)
              for s in sites if s["id"] in data.traces and len(data.traces[s["id"]].steps)}
    labels = {s["id"]: str(s.get("label", s["id"])) for s in sites}
    charts = _allocation_charts(data, labels)
    statuses = sorted({str(s.get("status")) for s in sites})
    body = _header(data)
    body += ["<h2>Targets</h2>", _targets_table(data),
             "<h2>Bugs</h2>", _bugs_table(data, pages),
             "<h2>Budget allocation over time</h2>"]
    if charts:
        for key, title in (("alloc-time", "budget spent per site over time (from the traces)"),
                           ("alloc-grant", f"scheduler grants ({ALLOCATION})")):
            if key in charts:
                spec = json.loads(charts[key])
                more = (f" (the {spec['shown']} sites that spent most, of {spec['of']})"
                        if spec["shown"] < spec["of"] else "")
                body.append(f"<h3>{_e(title)}{_e(more)}</h3><div class='cdf-host' data-chart='{key}'></div>")
    else:
        body.append("<p>No trace.</p>")
    options = "".join(f"<option value='{_e(st)}'>{_e(st)}</option>" for st in statuses)
    body += ["<h2>Suspect loss per site</h2>",
             f"<p class='small muted'>{len(sites)} site(s), found first, then the closest. Each chart is drawn "
             f"when it scrolls into view; long traces are shown with at most {per_site} points (the lowest and "
             f"highest loss of each stretch, and the events).</p>",
             "<div class='filters'><label>filter <input id='filter-text' type='search' placeholder='label, status, hazard'>"
             f"</label><label>status <select id='filter-status'><option value=''>any</option>{options}</select></label></div>",
             _site_cards(data, sites, pages),
             "<h2>Sites</h2>", _sites_table(sites, pages),
             _data_script(series, charts)]
    return _page(f"cdeepfuzz report: {name}", body)


# -- a finding's page --------------------------------------------------------------------------------------
class _Sources:
    """The lines of the user's source files, found under the run's likely roots (cached)."""

    def __init__(self, data: RunData) -> None:
        run = data.summary.get("run") or {}
        roots: list[Path] = []
        campaign = run.get("campaign_file") or (data.summary.get("campaign") or {}).get("file")
        if campaign:
            p = Path(campaign)
            p = p if p.is_absolute() else Path.cwd() / p
            roots += [p.parent, *p.parent.parents]
        roots.append(Path.cwd())
        here = data.run_dir.resolve()
        roots += [here.parent, *here.parent.parents]
        self.roots = list(dict.fromkeys(roots))
        self.files: dict[str, tuple[Path, list[str]] | None] = {}

    def lines(self, path: str, extra: list[Path]) -> tuple[Path, list[str]] | None:
        if path not in self.files:
            found = None
            candidates = [Path(path)] if Path(path).is_absolute() else [r / path for r in [*extra, *self.roots]]
            for c in candidates:
                try:
                    if c.is_file():
                        found = (c, c.read_text(encoding="utf-8", errors="replace").splitlines())
                        break
                except OSError:
                    continue
            self.files[path] = found
        return self.files[path]

    def context(self, location: str, extra: list[Path] = ()) -> str:
        m = _LOC.match(str(location or ""))
        if not m:
            return f"<p class='muted'>no source location (<code>{_e(location)}</code>)</p>"
        got = self.lines(m["path"], list(extra))
        line = int(m["line"])
        if got is None or not 1 <= line <= len(got[1]):
            return (f"<p class='muted'><code>{_e(location)}</code>: the source file is not found from here "
                    f"(looked beside the campaign file, the current directory and the run folder)</p>")
        lines = got[1]
        lo, hi = max(1, line - SOURCE_CONTEXT), min(len(lines), line + SOURCE_CONTEXT)
        rows = []
        for n in range(lo, hi + 1):
            rows.append(f"<tr{' class=hit' if n == line else ''}><td class='ln'>{n}</td><td>{_e(lines[n - 1])}</td></tr>")
            if n == line and m["col"]:
                rows.append(f"<tr><td class='ln'></td><td>{' ' * (int(m['col']) - 1)}^</td></tr>")
        return f"<p><code>{_e(location)}</code></p><div class='src'><table>{''.join(rows)}</table></div>"


def _image_views(arr: np.ndarray) -> tuple[np.ndarray | None, str]:
    """The batch as images (B, H, W, C) when the input is image-shaped, and how it was read."""
    a = arr
    if a.ndim == 4 and a.shape[1] in (1, 3, 4) and min(a.shape[2:]) >= 4:
        return a.transpose(0, 2, 3, 1), "channels first (N, C, H, W)"
    if a.ndim == 4 and a.shape[3] in (1, 3, 4) and min(a.shape[1:3]) >= 4:
        return a, "channels last (N, H, W, C)"
    if a.ndim == 3 and min(a.shape[1:]) >= 4:
        return a[..., None], "one channel (N, H, W)"
    if a.ndim == 2:
        side = math.isqrt(a.shape[1])
        if side >= 8 and side * side == a.shape[1]:
            return a.reshape(a.shape[0], side, side, 1), f"each row of {a.shape[1]} values reshaped to {side}×{side}"
    return None, ""


def png(img: np.ndarray, lo: float, hi: float) -> bytes:
    """An (H, W, C) array as an 8-bit RGB PNG, ``[lo, hi]`` mapped to black..white, non-finite red."""
    x = np.asarray(img, dtype=np.float64)
    h, w, c = x.shape
    bad = ~np.isfinite(x).all(axis=2)
    scale = (hi - lo) if hi > lo else 1.0
    v = (np.clip((np.nan_to_num(x, nan=lo, posinf=hi, neginf=lo) - lo) / scale, 0.0, 1.0) * 255).astype(np.uint8)
    rgb = np.repeat(v[..., :1], 3, axis=2) if c < 3 else np.ascontiguousarray(v[..., :3])
    rgb[bad] = (220, 0, 0)
    raw = b"".join(b"\x00" + rgb[r].tobytes() for r in range(h))

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _cell(v: float, bounds: tuple[float, float] | None) -> str:
    if not math.isfinite(v):
        return f"<td class='nf'>{v}</td>"
    out = bounds is not None and not bounds[0] <= v <= bounds[1]
    return f"<td{' class=out' if out else ''}>{v:.6g}</td>"


def _value_view(name: str, arr: np.ndarray, bounds: Any) -> str:
    import base64

    b = (float(bounds[0]), float(bounds[1])) if isinstance(bounds, (list, tuple)) and len(bounds) == 2 else None
    num = np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_
    flat = arr.reshape(-1).astype(np.float64) if num else None
    parts = [f"<h3>input <code>{_e(name)}</code></h3>"]
    facts = [f"shape {tuple(arr.shape)}", f"dtype {arr.dtype}"]
    if flat is not None and flat.size:
        finite = flat[np.isfinite(flat)]
        if finite.size:
            facts.append(f"min {finite.min():.6g}, max {finite.max():.6g}, mean {finite.mean():.6g}")
        if finite.size < flat.size:
            facts.append(f"<span class='bad'>{flat.size - finite.size} non-finite</span>")
        if b is not None:
            outside = int(((finite < b[0]) | (finite > b[1])).sum())
            facts.append(f"bounds [{b[0]:g}, {b[1]:g}]" + (f", <span class='bad'>{outside} outside</span>" if outside else ""))
        else:
            facts.append("not searched (as sampled)")
    parts.append("<p class='small'>" + "; ".join(facts) + "</p>")
    if flat is None or not flat.size:
        return "".join(parts)
    imgs, how = _image_views(arr) if np.issubdtype(arr.dtype, np.floating) else (None, "")
    if imgs is not None:
        finite = flat[np.isfinite(flat)]
        lo, hi = b if b is not None else ((finite.min(), finite.max()) if finite.size else (0.0, 1.0))
        tags = []
        for i, img in enumerate(imgs[:MAX_IMAGES]):
            h, w = img.shape[:2]
            zoom = max(1, min(12, 192 // max(h, w)))
            data = base64.b64encode(png(img, float(lo), float(hi))).decode()
            tags.append(f"<img class='img' src='data:image/png;base64,{data}' width='{w * zoom}' height='{h * zoom}' "
                        f"alt='{_e(name)}[{i}]' title='{_e(name)}[{i}]'>")
        parts.append(f"<p class='small'>as images ({_e(how)}; black {lo:.4g} … white {hi:.4g}, red not finite"
                     + (f"; the first {MAX_IMAGES} of {len(imgs)}" if len(imgs) > MAX_IMAGES else "") + "):</p>"
                     + "".join(tags))
    table = arr.reshape(arr.shape[0], -1) if arr.ndim >= 2 else arr.reshape(1, -1)
    rows = []
    for r, row in enumerate(table[:MAX_TABLE_ROWS]):
        cells = "".join(_cell(float(v), b) for v in row[:MAX_TABLE_COLS])
        more = f"<td>… {row.size - MAX_TABLE_COLS} more</td>" if row.size > MAX_TABLE_COLS else ""
        rows.append(f"<tr><th>{r}</th>{cells}{more}</tr>")
    cut = " (the first rows and columns; all values below)" if table.shape[0] > MAX_TABLE_ROWS or table.shape[1] > MAX_TABLE_COLS else ""
    head = "row of the batch, then its values flattened" if arr.ndim > 2 else "row of the batch, then its values"
    parts.append(f"<p class='small muted'>{head}{cut}; outside the bounds shaded, non-finite red</p>"
                 f"<div class='scroll'><table class='vals'>{''.join(rows)}</table></div>")
    shown = arr if arr.size <= MAX_TEXT_VALUES else arr.reshape(-1)[:MAX_TEXT_VALUES]
    text = np.array2string(shown, threshold=MAX_TEXT_VALUES + 1, max_line_width=120, precision=8, separator=", ")
    parts.append(f"<details><summary>all {arr.size} values as text"
                 + (f" (the first {MAX_TEXT_VALUES}, flattened)" if shown is not arr else "")
                 + f"</summary><pre>{_e(text)}</pre></details>")
    return "".join(parts)


def _values_section(folder: Path, report: dict[str, Any]) -> str:
    from fuzz_core.findings import VALUES

    try:
        arrays = load_arrays(folder / VALUES)
    except Exception as exc:  # noqa: BLE001 - the page still shows the rest
        return f"<p class='bad'>cannot read <code>{VALUES}</code>: {_e(exc)}</p>"
    bounds = report.get("bounds") or {}
    out = [_value_view(k[len("input."):], v, bounds.get(k[len("input."):]))
           for k, v in arrays.items() if k.startswith("input.")]
    state = [(k[len("state."):], v) for k, v in arrays.items() if k.startswith("state.")]
    if state:
        out.append("<h3>model and optimizer state</h3><p class='small'>saved because the weights differ from the "
                   "factory's (searched or trained): " + ", ".join(
                       f"<code>{_e(k)}</code> {tuple(v.shape)}" for k, v in state[:40])
                   + (f" and {len(state) - 40} more" if len(state) > 40 else "") + "</p>")
    return "".join(out) or "<p>No input saved.</p>"


def render_finding(data: RunData, bug: dict[str, Any], site: dict[str, Any], report: dict[str, Any],
                   sources: _Sources, page_dir: Path) -> str:
    """A bug's page, from its smallest reproducer (``report``); ``site``: the site it is at, else the site
    whose search found that reproducer."""
    from fuzz_core.findings import REPORT, VALUES

    folder = data.run_dir / bug["reproducer"]
    rel = Path(os.path.relpath(folder, page_dir)).as_posix()
    first = report.get("first_op") or {}
    mini = report.get("minimised") or {}
    replays = report.get("replays") or {}
    extra = [Path(r) for r in (report.get("root"), (report.get("target") or {}).get("root")) if isinstance(r, str) and r]
    run = data.summary.get("run") or {}
    files = [f"<a href='{_e(rel)}/{name}'>{name}</a>" for name in (REPORT, VALUES, "test_reproducer.py")
             if (folder / name).is_file()]
    mlflow = _mlflow(run.get("tracking_uri"), site.get("mlflow_run_id"))
    campaign_mlflow = _mlflow(run.get("tracking_uri"), run.get("mlflow_run_id"))
    searcher = (report.get("site") or {}).get("label")
    body = [f"<p class='small'><a href='../{INDEX}#site-{_e(site['id'])}'>← the report of run {_e(data.run_dir.name)}</a></p>",
            f"<h1 class='label'>{_e(bug['op'])} ({_e(bug.get('phase') or 'forward')}) at {_e(bug['position'])}</h1>",
            f"<p>{_e(bug_words(bug))}</p>",
            "<dl class='kv'>",
            f"<dt>site</dt><dd>{_e(site.get('label'))} {_status(site)}</dd>",
            f"<dt>first non-finite op</dt><dd>{_first_op(first, report.get('phase'))}"
            + ("" if report.get("site_triggered", True) else
               " <span class='small'>(another op than the searched site's went non-finite first)</span>") + "</dd>",
            f"<dt>found at</dt><dd>step {_e(report.get('step'))} of the search of {_e(searcher)} ({_e(report.get('strategy'))}, "
            f"trigger by {_e(report.get('trigger'))}, {'training' if report.get('training') else 'inference'}, "
            f"{_e(report.get('device'))})</dd>",
            f"<dt>fresh replays</dt><dd>{_e(replays.get('reproduced'))} of {_e(replays.get('of'))} reproduced"
            + (" <span class='bad'>(flaky)</span>" if report.get("flaky") else "") + "</dd>",
            f"<dt>minimised</dt><dd>batch {_e(mini.get('original_batch_size', report.get('batch_size')))} → "
            f"{_e(report.get('batch_size'))}; distance to the original sample {_distance(mini)}</dd>",
            f"<dt>bug</dt><dd>{_bug_cell(data, bug)}</dd>",
            f"<dt>files</dt><dd>{' · '.join(files) or '—'}</dd>",
            f"<dt>MLflow</dt><dd>{mlflow or campaign_mlflow or 'no MLflow run (tracking off)'}"
            + (f" · campaign run {campaign_mlflow}" if mlflow and campaign_mlflow else "") + "</dd>",
            "</dl>"]
    for note in report.get("notes") or []:
        body.append(f"<p class='small'>note: {_e(note)}</p>")
    body += ["<h2>Source</h2>", sources.context(bug["position"], extra)]
    body += ["<h2>Replay</h2>", f"<pre>{_e(report.get('replay'))}</pre>"]
    if (folder / "test_reproducer.py").is_file():
        body.append(f"<p class='small'>as a regression test (fails while the bug is there):</p>"
                    f"<pre>pytest {_e((folder / 'test_reproducer.py').as_posix())}</pre>")
    body += ["<h2>Fix</h2>", _fix_cell(report.get("fix")),
             "<h2>Minimised input</h2>", _values_section(folder, report)]
    trace = data.traces.get(site["id"])
    if trace is not None and len(trace.steps):
        body += ["<h2>Suspect loss</h2>", f"<div class='cdf-host' data-site='{_e(site['id'])}'></div>",
                 _data_script({site["id"]: _site_series(site, trace, MAX_POINTS)}, {})]
    return _page(f"cdeepfuzz finding: {site.get('label')}", body)


# -- writing ----------------------------------------------------------------------------------------------
def write_text(path: Path, text: str) -> None:
    """Write atomically, readable by others as any file the user makes (0666 less the umask)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def finding_page_name(bug: dict[str, Any]) -> str:
    return f"{FINDING_PAGES}/{Path(str(bug['reproducer'])).name}.html"


def write_report(run_dir: Path) -> Path:
    """Write ``<run>/report/index.html`` and a page per bug; return the index path."""
    data = load_run(run_dir)
    out = Path(run_dir) / REPORT_DIR
    sites = ordered_sites(data.summary)
    by_id = {s["id"]: s for s in sites}
    sources = _Sources(data)
    pages: dict[str, str] = {}        # a bug's signature, and the id of each site it is at -> its page
    for bug in data.summary.get("bugs", []):
        report = data.findings.get(bug["signature"])
        if report is None:
            continue
        at = [by_id[i] for i in bug.get("sites") or [] if i in by_id]
        site = at[0] if at else by_id.get((report.get("site") or {}).get("id"), report.get("site") or {"id": ""})
        name = finding_page_name(bug)
        try:
            write_text(out / name, render_finding(data, bug, site, report, sources, out / FINDING_PAGES))
        except Exception as exc:  # noqa: BLE001 - one broken finding must not lose the report
            log.warning("report: cannot write the page of bug %s: %s", bug["signature"], exc)
            continue
        pages[bug["signature"]] = name
        pages.update({s["id"]: name for s in at})
    page = out / INDEX
    write_text(page, render_index(data, sites, pages))
    return page


def _write_output_index(output: Path, runs: list[Path]) -> Path:
    items = []
    for run in reversed(runs):
        summary = read_json(run / SUMMARY)
        totals = summary.get("totals") or {}
        items.append(f"<li><a href='../{_e(run.name)}/{REPORT_DIR}/{INDEX}'>{_e(run.name)}</a>: "
                     f"{_e(totals.get('sites'))} site(s), {_e(totals.get('bugs', totals.get('findings')))} bug(s)</li>")
    page = output / REPORT_DIR / INDEX
    write_text(page, _page("cdeepfuzz runs", [f"<h1>Runs in {_e(output.name)}</h1><ul>{''.join(items)}</ul>"],
                           scripts=False))
    return page


def describe(pages: list[Path]) -> str:
    return "\n".join(f"report: {p}" for p in pages)


__all__ = ["ReportError", "describe", "downsample", "load_run", "ordered_sites", "png", "render_finding",
           "render_index", "run_folders", "write_report", "write_reports", "write_text"]
