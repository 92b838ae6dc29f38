"""``cdeepfuzz report``: an HTML report of a campaign run, with PNG charts, that opens offline.

Written into ``<run folder>/report/``: ``index.html`` and its PNGs (relative links, no
scripts, no CDN, no remote URL):

- the run (campaign, state, totals) and the targets that failed;
- the findings: hazard, first op, location, steps, minimised size and distance to the
  original sample, replay time, the bug it is an occurrence of (``<output>/bugs``, when the
  output has one), the fix suggestion (``fix`` section of ``finding.json``), the replay command;
- the scheduler's budget allocation over time: cumulative steps of every site against the
  time its trace shards were written (the controller writes one shard per site and quantum,
  as the quantum ends), read from the Parquet traces; with an ``allocation.json`` in the run
  folder (the scheduler's grants, ``[{site_id, steps, total}]``), the grants as well;
- the suspect loss of each site against its steps, one small chart each, found sites first, then
  the closest (at most ``MAX_CHARTS``: a 1,000-site campaign reads through its findings table,
  its sites table and ``cdeepfuzz bugs``).

Given an output folder that holds several runs, the newest run (by ``run.started`` in its
``summary.json``) is reported; ``all_runs=True`` reports every run and writes
``<output>/report/index.html`` linking them.
"""
from __future__ import annotations

import html
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from fuzz_core.io import atomic_write_bytes, read_json
from orchestrator.observers.summary import FILENAME as SUMMARY

log = logging.getLogger(__name__)

REPORT_DIR = "report"
INDEX = "index.html"
ALLOCATION = "allocation.json"
CHART_SIZE = (3.4, 2.1)     # inches, per site
CHART_DPI = 72
MAX_CHARTS = 60
FOUND = ("found", "flaky")
_SEQ = re.compile(r"-(\d{6})-[0-9a-f]{8}\.parquet$")


class ReportError(ValueError):
    """A folder that holds no campaign run."""


@dataclass
class SiteTrace:
    steps: np.ndarray
    losses: np.ndarray
    events: list[str]


@dataclass
class RunData:
    run_dir: Path
    summary: dict[str, Any]
    traces: dict[str, SiteTrace] = field(default_factory=dict)
    shards: list[tuple[float, str, int]] = field(default_factory=list)   # (written at, site id, last step)
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)   # site id -> finding.json
    bugs: dict[str, dict[str, Any]] = field(default_factory=dict)       # signature -> bug record
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
    data = RunData(run_dir, read_json(run_dir / SUMMARY))
    campaign = (data.summary.get("campaign") or {}).get("name", "")
    _read_traces(data, run_dir.parent, campaign, run_dir.name)
    for site in data.summary.get("sites", []):
        if site.get("finding"):
            try:
                data.findings[site["id"]] = read_json(run_dir / site["finding"] / "finding.json")
            except (OSError, ValueError) as exc:
                log.warning("report: cannot read the finding of %s: %s", site.get("label"), exc)
    from fuzz_core.dedupe import BugDatabase

    data.bugs = {b["signature"]: b for b in BugDatabase(run_dir.parent).bugs()}
    if (run_dir / ALLOCATION).is_file():
        data.allocation = list(read_json(run_dir / ALLOCATION))
    return data


def _read_traces(data: RunData, root: Path, campaign: str, run: str) -> None:
    """This run's trace rows, per site, and its shards in the order they were written."""
    folder = root / "traces" / f"campaign={campaign}"
    rows: dict[str, list[tuple[int, float, str]]] = {}
    for path in folder.glob("site_id=*/part-*.parquet"):
        try:
            table = pq.read_table(path, columns=["run", "step", "suspect_loss", "event"])
        except Exception as exc:  # noqa: BLE001 - one unreadable shard must not lose the report
            log.warning("report: skipping %s: %s", path, exc)
            continue
        cols = table.to_pydict()
        keep = [i for i, r in enumerate(cols["run"]) if r == run]
        if not keep:
            continue
        site_id = path.parent.name.split("=", 1)[1]
        rows.setdefault(site_id, []).extend(
            (int(cols["step"][i]), _num(cols["suspect_loss"][i]), str(cols["event"][i])) for i in keep)
        seq = _SEQ.search(path.name)
        data.shards.append((path.stat().st_mtime, site_id, max(int(cols["step"][i]) for i in keep),
                            int(seq.group(1)) if seq else 0))
    data.shards = [(t, s, step) for t, s, step, _ in sorted(data.shards, key=lambda x: (x[0], x[3]))]
    for site_id, points in rows.items():
        points.sort(key=lambda p: p[0])
        data.traces[site_id] = SiteTrace(np.array([p[0] for p in points]), np.array([p[1] for p in points]),
                                         [p[2] for p in points])


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


# -- charts ----------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def site_chart(fig, site: dict[str, Any], trace: SiteTrace | None, path: Path) -> None:
    """One small chart: suspect loss against step (symlog), refreshes, mutations and the trigger marked.
    ``fig`` is reused from site to site (a fixed layout: thousands of sites stay cheap)."""
    fig.clf()
    ax = fig.add_axes((0.17, 0.2, 0.79, 0.68))
    found = site.get("status") in FOUND
    if trace is not None and len(trace.steps):
        losses = np.where(np.isfinite(trace.losses), trace.losses, np.nan)
        ax.plot(trace.steps, losses, color="#c0392b" if found else "#2c6fbb", lw=1.2)
        marked = False
        for name, marker in (("refresh", "s"), ("mutation", "^"), ("trigger", "*")):
            idx = [i for i, e in enumerate(trace.events) if e == name]
            if idx:
                marked = True
                ax.plot(trace.steps[idx], np.nan_to_num(losses[idx], nan=0.0), marker, ms=5 if name != "trigger" else 9,
                        ls="none", color="black" if name != "trigger" else "#c0392b", label=name)
        ax.set_yscale("symlog", linthresh=1e-3)
        top = np.nanmax(losses) if np.isfinite(losses).any() else 1.0
        ax.set_ylim(0.0, max(top * 2.0, 1e-2))             # 0 (the boundary) always in view
        if marked:
            ax.legend(fontsize=6, loc="lower left", frameon=False)
    else:
        ax.text(0.5, 0.5, "no trace (never searched)", ha="center", va="center", transform=ax.transAxes, fontsize=8)
    ax.set_title(_short(_site_name(site), 44) + f"  [{site.get('status')}]", fontsize=7)
    ax.set_xlabel("step", fontsize=7, labelpad=1)
    ax.set_ylabel("suspect loss", fontsize=7, labelpad=1)
    ax.tick_params(labelsize=6)
    fig.savefig(path)


def _step_series(ax, series: dict[str, list[tuple[float, int]]], labels: dict[str, str]) -> None:
    """One post-step line per site, labelled with its (shortened) name."""
    for site, pts in series.items():
        xs, ys = zip(*pts)
        ax.step(xs, ys, where="post", lw=1, label=_short(labels.get(site, site), 40))


def allocation_chart(plt, data: RunData, labels: dict[str, str], path: Path) -> bool:
    """Cumulative steps per site against seconds since the first shard (and the scheduler's grants)."""
    if not data.shards and not data.allocation:
        return False
    panels = 2 if data.allocation and data.shards else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 3.6), dpi=80, squeeze=False)
    ax = axes[0][0]
    if data.shards:
        t0 = data.shards[0][0]
        series: dict[str, list[tuple[float, int]]] = {}
        for t, site, step in data.shards:
            series.setdefault(site, [(0.0, 0)]).append((t - t0, step))
        _step_series(ax, series, labels)
        ax.set_xlabel("seconds since the first quantum ended (trace shard written)")
        ax.set_ylabel("cumulative steps of the site")
        ax.set_title("budget spent per site over time (from the traces)", fontsize=9)
        if len(series) <= 12:
            ax.legend(fontsize=6, frameon=False)
    if data.allocation:
        ax2 = axes[0][panels - 1]
        granted: dict[str, list[tuple[int, int]]] = {}
        for a in data.allocation:
            pts = granted.setdefault(a["site_id"], [(0, 0)])
            pts.append((int(a["total"]), pts[-1][1] + int(a["steps"])))
        _step_series(ax2, granted, labels)
        ax2.set_xlabel("steps granted in the whole campaign")
        ax2.set_ylabel("steps granted to the site")
        ax2.set_title("scheduler grants (allocation.json)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


# -- HTML ----------------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font-size:0.85em;margin-bottom:1.5em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0} code{font-size:0.9em;background:#f6f6f6;padding:1px 3px}
.found{color:#c0392b;font-weight:bold} .verified{color:#1e8449} .bad{color:#c0392b}
.grid{display:flex;flex-wrap:wrap;gap:6px} .grid figure{margin:0} .grid img{border:1px solid #ddd}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _short(text: str, n: int) -> str:
    text = str(text)
    return text if len(text) <= n else "…" + text[-(n - 1):]


def _site_name(site: dict[str, Any]) -> str:
    """``target:op@file.py:line#occurrence``, the path shortened to its file name."""
    loc = str(site.get("location", ""))
    return f"{site.get('target')}:{site.get('op')}@{loc.rsplit('/', 1)[-1]}#{site.get('occurrence', 0)}"


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return _e(x)


def _distance(mini: dict[str, Any]) -> str:
    after, before = mini.get("distance"), mini.get("distance_before")
    if not after:
        return "—"
    text = f"L2 {_fmt(after.get('l2'))}, Linf {_fmt(after.get('linf'))}"
    if before:
        text += f" (search ended at L2 {_fmt(before.get('l2'))}, Linf {_fmt(before.get('linf'))})"
    return text


def _fix_cell(fix: dict[str, Any] | None) -> str:
    if not fix:
        return "— (<code>cdeepfuzz fix</code>)"
    cls = "verified" if fix.get("status") == "verified" else "bad"
    out = f'<span class="{cls}">{_e(fix.get("message", fix.get("status", "")))}</span>'
    rec = fix.get("recommended")
    if rec:
        out += f"<br><code>{_e(rec.get('code'))}</code>"
    return out


def _bug_cell(data: RunData, report: dict[str, Any], folder: str) -> str:
    sig = report.get("signature", "")
    bug = data.bugs.get(sig)
    if bug is None:
        return f"<code>{_e(sig)}</code>"
    best = (bug.get("best") or {}).get("folder", "")
    mine = bool(best and folder) and best.endswith(f"{data.run_dir.name}/{folder}")
    return (f"<code>{_e(sig)}</code><br>{len(bug.get('occurrences', []))} occurrence(s); "
            + ("this is the smallest reproducer" if mine else f"smallest: <code>{_e(best)}</code>"))


def _findings_table(data: RunData, sites: list[dict[str, Any]]) -> str:
    rows = []
    for s in sites:
        report = data.findings.get(s["id"])
        if report is None:
            continue
        mini = report.get("minimised") or {}
        first = report.get("first_op") or {}
        size = f"{mini.get('original_batch_size', report.get('batch_size'))} → {report.get('batch_size')}"
        replay_t = (f"{_fmt(mini.get('replay_seconds_original'))} s → {_fmt(mini.get('replay_seconds_minimised'))} s"
                    if mini.get("replay_seconds_original") is not None else "—")
        rows.append(
            f"<tr><td><a href='#site-{_e(s['id'])}'>{_e(s.get('label'))}</a></td><td>{_e(report.get('hazard'))}</td>"
            f"<td>{_e(first.get('kind'))} at <code>{_e(first.get('location'))}</code></td>"
            f"<td><code>{_e(s.get('location'))}</code></td><td>{_e(report.get('step'))}</td><td>{size}</td>"
            f"<td>{_distance(mini)}</td><td>{replay_t}</td><td>{_bug_cell(data, report, s.get('finding') or '')}</td>"
            f"<td>{_fix_cell(report.get('fix'))}</td><td><code>{_e(report.get('replay'))}</code></td></tr>")
    if not rows:
        return "<p>No finding.</p>"
    head = ("<tr><th>site</th><th>hazard</th><th>first non-finite op</th><th>location</th><th>steps</th>"
            "<th>batch (original → minimised)</th><th>distance to the original sample</th>"
            "<th>one replay (original → minimised)</th><th>bug (dedupe)</th><th>fix</th><th>replay</th></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _sites_table(sites: list[dict[str, Any]]) -> str:
    rows = []
    for s in sites:
        cls = ' class="found"' if s.get("status") in FOUND else ""
        rows.append(f"<tr><td><a href='#site-{_e(s['id'])}'>{_e(s.get('label'))}</a></td><td{cls}>{_e(s.get('status'))}"
                    f"{' (' + _e(s['exit_reason']) + ')' if s.get('exit_reason') not in (None, 'none') else ''}</td><td>{_e(s.get('op'))}</td><td><code>{_e(s.get('location'))}</code></td>"
                    f"<td>{_e(s.get('steps'))}</td><td>{_fmt(s.get('seconds'))}</td><td>{_fmt(s.get('best_loss'))}</td>"
                    f"<td>{_e(_short(s.get('error') or '', 200))}</td></tr>")
    head = ("<tr><th>site</th><th>status</th><th>op</th><th>location</th><th>steps</th><th>seconds</th>"
            "<th>best loss</th><th>error</th></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def render_html(data: RunData, sites: list[dict[str, Any]], charts: dict[str, str], allocation: str | None) -> str:
    s, run = data.summary, data.summary.get("run") or {}
    totals = s.get("totals") or {}
    name = (s.get("campaign") or {}).get("name", "")
    failed = [t for t in s.get("targets", []) if t.get("status") == "error"]
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>cdeepfuzz report: {_e(name)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>Campaign {_e(name)}</h1>",
             f"<p>run <code>{_e(data.run_dir.name)}</code>, state <b>{_e(run.get('state'))}</b>, "
             f"exit code {_e(run.get('exit_code'))}, {_fmt(run.get('seconds'))} s, executor {_e(run.get('executor'))}; "
             f"{_e(totals.get('targets'))} target(s), {_e(totals.get('sites'))} site(s), "
             f"{_e(totals.get('steps'))} steps, <b>{_e(totals.get('findings'))} finding(s)</b>. "
             f"MLflow: <code>{_e(run.get('tracking_uri'))}</code></p>"]
    if failed:
        parts.append("<h2>Targets that could not be built or run</h2><ul>"
                     + "".join(f"<li><b>{_e(t['name'])}</b>: {_e(t.get('error'))}</li>" for t in failed) + "</ul>")
    parts += ["<h2>Findings</h2>", _findings_table(data, sites), "<h2>Budget allocation over time</h2>"]
    parts.append(f"<img src='{_e(allocation)}' alt='budget allocation'>" if allocation else "<p>No trace.</p>")
    parts += ["<h2>Sites</h2>", _sites_table(sites), "<h2>Suspect loss per site</h2>"]
    if len(charts) < len(sites):
        parts.append(f"<p>The {len(charts)} sites that found a bug or came closest; the other "
                     f"{len(sites) - len(charts)} are in the table above.</p>")
    parts.append("<div class='grid'>")
    for site in sites:
        if site["id"] not in charts:
            continue
        parts.append(f"<figure id='site-{_e(site['id'])}'><img src='{_e(charts[site['id']])}' "
                     f"alt='suspect loss of {_e(site.get('label'))}'></figure>")
    parts.append("</div></body></html>\n")
    return "\n".join(parts)


def write_report(run_dir: Path) -> Path:
    """Write ``<run>/report/index.html`` and its PNGs; return the index path."""
    data = load_run(run_dir)
    out = Path(run_dir) / REPORT_DIR
    out.mkdir(exist_ok=True)
    plt = _pyplot()
    sites = ordered_sites(data.summary)
    charts = {}
    fig = plt.figure(figsize=CHART_SIZE, dpi=CHART_DPI)
    try:
        for site in sites[:MAX_CHARTS]:
            charts[site["id"]] = f"loss-{site['id']}.png"
            site_chart(fig, site, data.traces.get(site["id"]), out / charts[site["id"]])
    finally:
        plt.close(fig)
    labels = {s["id"]: _site_name(s) for s in sites}
    allocation = "allocation.png" if allocation_chart(plt, data, labels, out / "allocation.png") else None
    page = out / INDEX
    atomic_write_bytes(page, render_html(data, sites, charts, allocation).encode("utf-8"))
    return page


def _write_output_index(output: Path, runs: list[Path]) -> Path:
    out = output / REPORT_DIR
    out.mkdir(exist_ok=True)
    items = []
    for run in reversed(runs):
        summary = read_json(run / SUMMARY)
        totals = summary.get("totals") or {}
        items.append(f"<li><a href='../{_e(run.name)}/{REPORT_DIR}/{INDEX}'>{_e(run.name)}</a>: "
                     f"{_e(totals.get('sites'))} site(s), {_e(totals.get('findings'))} finding(s)</li>")
    page = out / INDEX
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>cdeepfuzz runs</title>"
                    f"<style>{_CSS}</style></head><body><h1>Runs in {_e(output.name)}</h1><ul>{''.join(items)}"
                    f"</ul></body></html>\n", encoding="utf-8")
    return page


def describe(pages: list[Path]) -> str:
    return "\n".join(f"report: {p}" for p in pages)


__all__ = ["ReportError", "describe", "load_run", "ordered_sites", "run_folders", "write_report", "write_reports"]
