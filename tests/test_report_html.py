"""The HTML report of a synthetic run: parsed (every page, link, value and verdict where it should be)
and, where a headless browser can be had, opened and used (zoom, hover, log scale, filter)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from benchmarks.report_size import Browser, find_browser, synthetic_run
from orchestrator.commands.report import MAX_POINTS, SiteTrace, downsample, png, write_report
from orchestrator.export import load_run as load_export
from test_report import parse

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory):
    run_dir = synthetic_run(tmp_path_factory.mktemp("synthetic"), 40, steps=3000)
    index = write_report(run_dir)
    return run_dir, index, json.loads((run_dir / "summary.json").read_text())


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_the_index_shows_every_target_site_and_finding_with_links_that_resolve(synthetic):
    run_dir, index, summary = synthetic
    page = parse(index)
    text = "".join(page.text)
    assert page.scripts == [] and page.inline_js == 2
    assert not re.search(r"<script[^>]+src=", index.read_text())
    for t in summary["targets"]:                                   # the clean target and the failed one too
        assert t["name"] in text
    assert "no bug in" in text and "unexpected keyword argument 'hiden'" in text
    bugs = load_export(run_dir)[0]["bugs"]
    found = [s for s in summary["sites"] if s["finding"]]
    assert found and len(bugs) < len(found)             # two occurrences of one call: one bug, one page
    for s in found:
        (bug,) = [b for b in bugs if s["id"] in b["sites"]]
        assert f"findings/{Path(bug['reproducer']).name}.html" in page.links
    for link in page.links:
        target = link.split("#")[0]
        if target and not target.startswith(("http:", "https:")):
            assert (index.parent / target).exists(), link
        if link.startswith("#"):
            assert link[1:] in page.ids, link
    zero = [s for s in summary["sites"] if s["status"] == "exhausted" and s["best_loss"] == 0]
    assert zero and "best loss 0: the search reached the edge" in text
    for s in summary["sites"]:
        if s.get("reach"):
            assert s["reach"]["message"] in text
    assert "http://127.0.0.1:5000/#/runs/" + "f" * 32 in page.links  # the campaign's MLflow run
    for f in [index, *(index.parent / "findings").glob("*.html")]:
        assert f.stat().st_mode & 0o777 == 0o666 & ~_umask(), f


def test_the_embedded_loss_series_are_downsampled_and_keep_the_trigger(synthetic):
    run_dir, index, summary = synthetic
    body = re.search(r'<script type="application/json" id="cdf-data">(.*?)</script>', index.read_text(), re.S)[1]
    data = json.loads(body.replace("<\\/", "</"))
    assert set(data["sites"]) == {s["id"] for s in summary["sites"]}
    assert set(data["charts"]) == {"alloc-time", "alloc-grant"}
    for s in summary["sites"]:
        series = data["sites"][s["id"]]
        assert series["n"] == s["steps"] and len(series["s"]) <= MAX_POINTS + 2
        assert series["s"] == sorted(series["s"]) and len(series["s"]) == len(series["l"])
        assert series["s"][0] == 1 and series["s"][-1] == s["steps"]
        if s["status"] == "found":
            assert series["e"]["trigger"] == [len(series["s"]) - 1] and series["l"][-1] == 0
        assert min(v for v in series["l"] if v is not None) == pytest.approx(s["best_loss"], rel=1e-3, abs=1e-9)


def test_a_finding_page_shows_source_op_values_image_replay_fix_and_mlflow(synthetic):
    run_dir, index, summary = synthetic
    sites = {s["id"]: s for s in summary["sites"]}
    images = 0
    for bug in load_export(run_dir)[0]["bugs"]:
        s = sites[bug["sites"][0]]
        path = index.parent / "findings" / f"{Path(bug['reproducer']).name}.html"
        page = parse(path)
        text = "".join(page.text)
        report = json.loads((run_dir / bug["reproducer"] / "finding.json").read_text())
        file, line = s["location"].rsplit(":", 1)
        source = (run_dir.parent.parent / file).read_text().splitlines()[int(line) - 1]
        assert source in text                                      # the source line, with its neighbours
        assert (run_dir.parent.parent / file).read_text().splitlines()[int(line) - 2] in text
        assert f"{report['first_op']['op']} ({report['first_op']['kind']}) output" in text
        assert ("NaN" if report["first_op"]["nan"] else "Inf") in text
        assert report["replay"] in text and "test_reproducer.py" in text
        assert "-4.25" in text                                     # the minimised input as numbers
        assert f"http://127.0.0.1:5000/#/runs/{s['mlflow_run_id']}" in page.links
        if report.get("fix"):
            assert "verified" in text and report["fix"]["recommended"]["code"] in text
            assert report["fix"]["diff"].splitlines()[-1] in text
        else:
            assert "not checked" in text
        for link in page.links:
            target = link.split("#")[0]
            if target and not target.startswith(("http:", "https:")):
                assert (path.parent / target).exists(), link
        pngs = [i for i in page.imgs if i.startswith("data:image/png;base64,")]
        if len(np.asarray(report["bounds"]["x"])) and "(1, 1, 16, 16)" in text:
            assert len(pngs) == 1
            images += 1
        assert page.hosts == [s["id"]] and page.scripts == []
    assert images >= 1


def test_downsample_keeps_the_ends_the_events_and_each_stretchs_extremes():
    rng = np.random.default_rng(0)
    n = 100_000
    losses = rng.uniform(1, 2, n)
    losses[12_345], losses[54_321] = 0.5, 9.0
    losses[100] = np.inf
    events = np.array(["step"] * n, dtype=object)
    events[777], events[-1] = "mutation", "trigger"
    steps, kept, ev = downsample(SiteTrace(np.arange(1, n + 1), losses, events), 500)
    assert len(steps) <= 520 and steps[0] == 1 and steps[-1] == n
    assert 12_346 in steps and 54_322 in steps and 778 in steps and ev[-1] == "trigger"
    assert np.all(np.diff(steps) > 0)
    short = SiteTrace(np.arange(5), np.arange(5.0), np.array(["step"] * 5, dtype=object))
    assert len(downsample(short, 500)[0]) == 5


def test_png_is_a_valid_image_of_the_right_size():
    img = np.linspace(-3, 3, 12 * 7 * 3).reshape(12, 7, 3)
    img[0, 0, 0] = np.nan
    data = png(img, -3.0, 3.0)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    assert (w, h) == (7, 12)
    idat = data[data.index(b"IDAT") + 4:data.index(b"IEND") - 8]
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w) and raw[1:4] == bytes((220, 0, 0))   # the NaN pixel, red


def _browser():
    exe, why = find_browser()
    if exe is None:
        pytest.skip(why)
    pytest.importorskip("aiohttp", reason="the headless-browser test drives Chromium with aiohttp's WebSocket client")
    return Browser(exe)


USE = """(async () => {
  const until = async (ok, ms) => { const t = performance.now();
    while (!ok()) { if (performance.now() - t > ms) return false; await new Promise(r => setTimeout(r, 10)); }
    return true; };
  const out = {};
  const hosts = Array.from(document.querySelectorAll('.cdf-host[data-site]'));
  out.sites = hosts.length;
  out.drawn_before = hosts.filter(h => h.cdfChart).length;
  const host = hosts[0];
  host.scrollIntoView();
  out.drew = await until(() => !!host.cdfChart, 10000);
  const ch = host.cdfChart, c = host.querySelector('canvas'), b = c.getBoundingClientRect();
  const at = (fx, fy) => ({clientX: b.left + b.width * fx, clientY: b.top + b.height * fy, bubbles: true,
                           cancelable: true, button: 0});
  out.canvas = [c.width, c.height];
  const full = ch.getView();
  c.dispatchEvent(new WheelEvent('wheel', Object.assign({deltaY: -400}, at(0.5, 0.5))));
  const wheel = ch.getView();
  out.wheel_zoomed = wheel.x1 - wheel.x0 < (full.x1 - full.x0) * 0.8;
  c.dispatchEvent(new MouseEvent('dblclick', at(0.5, 0.5)));
  out.reset = Math.abs(ch.getView().x1 - full.x1) < 1e-9 && Math.abs(ch.getView().x0 - full.x0) < 1e-9;
  c.dispatchEvent(new MouseEvent('mousedown', at(0.3, 0.3)));
  c.dispatchEvent(new MouseEvent('mousemove', at(0.6, 0.7)));
  window.dispatchEvent(new MouseEvent('mouseup', at(0.6, 0.7)));
  const box = ch.getView();
  out.box_zoomed = box.x0 > full.x0 && box.x1 < full.x1;
  host.querySelector('.cdf-reset').click();
  c.dispatchEvent(new MouseEvent('mousemove', at(0.5, 0.5)));
  const tip = host.querySelector('.cdf-tip');
  out.tip = tip.style.display === 'block' ? tip.textContent : null;
  host.querySelector('.cdf-log').click();
  out.log = ch.getView().log;
  const hidden = () => document.querySelectorAll('.card[style*="display: none"]').length;
  const f = document.getElementById('filter-status');
  f.value = 'found'; f.dispatchEvent(new Event('change'));
  out.hidden_by_filter = hidden();
  f.value = ''; f.dispatchEvent(new Event('change'));
  out.hidden_after = hidden();
  out.width = document.documentElement.scrollWidth;
  out.viewport = window.innerWidth;
  const alloc = document.querySelector('.cdf-host[data-chart]');
  alloc.scrollIntoView();
  out.alloc = await until(() => !!alloc.cdfChart, 10000);
  return out;
})()"""


def test_the_report_works_in_a_headless_browser(synthetic):
    run_dir, index, summary = synthetic
    with _browser() as browser:
        browser.open(index)
        out = browser.eval(USE)
        assert browser.errors == []
        assert out["drawn_before"] < out["sites"] and out["drew"], out   # drawn lazily, when in view
        assert out["canvas"][0] > 300 and out["canvas"][1] > 200, out
        assert out["wheel_zoomed"] and out["reset"] and out["box_zoomed"], out
        assert out["tip"] and "step" in out["tip"] and "loss" in out["tip"], out
        assert out["log"] is True, out
        found = sum(1 for s in summary["sites"] if s["status"] == "found")
        assert out["hidden_by_filter"] == len(summary["sites"]) - found and out["hidden_after"] == 0, out
        assert out["width"] <= out["viewport"], out                       # no page wider than the window
        assert out["alloc"], out
        image = next(s for s in summary["sites"] if s["finding"] and int(s["id"], 16) % 3 == 1)
        browser.open(index.parent / "findings" / f"{Path(image['finding']).name}.html")
        got = browser.eval("""(async () => {
          const img = document.querySelector('img.img');
          const host = document.querySelector('.cdf-host[data-site]');
          host.scrollIntoView();
          for (let i = 0; i < 500 && !host.cdfChart; i++) await new Promise(r => setTimeout(r, 10));
          return {image: img ? img.naturalWidth : 0, chart: !!host.cdfChart,
                  width: document.documentElement.scrollWidth, viewport: window.innerWidth};
        })()""")
        assert browser.errors == []
        assert got["image"] == 16 and got["chart"] and got["width"] <= got["viewport"], got


def test_report_size_benchmark_runs_on_10_sites():
    proc = subprocess.run([sys.executable, "benchmarks/report_size.py", "--sites", "10", "--steps", "50", "--no-write"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| 10 |"))
    assert " s |" in row and "kB" in row, row
    exe, _ = find_browser()
    if exe is not None and importlib.util.find_spec("aiohttp") is not None:
        assert "Browser figures" in proc.stdout and "—" not in row, proc.stdout[-2000:]
    else:
        assert "no headless browser" in proc.stdout
