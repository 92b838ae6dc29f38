"""What the HTML report costs as a campaign grows: build time and size at 10, 100 and 1,000 sites, and
how the 1,000-site report behaves in a real headless browser (issue 18).

The runs are synthetic (:func:`synthetic_run`): a summary.json in the current schema, Parquet trace
shards as the controller writes them (``--steps`` steps per site, in two shards), allocation.json,
and a finding folder (finding.json, values.safetensors, test_reproducer.py) for one site in twenty,
every third with an image-shaped input, some with a fix verdict; the sources the sites name exist,
so every finding page shows its source line. ``cdeepfuzz report``'s own code writes the report.

In the browser (headless Chromium over the DevTools protocol, :class:`Browser`), each index page is
opened from disk and timed: the first chart drawn (time to first render, from navigation start),
the load event, scrolling to the last site's chart and waiting for it, one wheel-zoom redraw, and
the longest main-thread task seen. Without a browser (none found: see :func:`find_browser`), the
table says so and gives the time to parse the page instead.

    python benchmarks/report_size.py [--sites 10 100 1000] [--steps 500] [--no-browser] [--no-write]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks._results import table, write_section  # noqa: E402

CAMPAIGN = "synthetic"
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
            "headless_shell", "chrome")
NO_BROWSER = ("no headless browser found (looked for $CDEEPFUZZ_BROWSER and " + ", ".join(BROWSERS)
              + " on PATH); install one, e.g. Debian's chromium-headless-shell package")
SOURCE = '''"""A synthetic model for the report benchmark."""
import torch


def forward(x, w):
    h = torch.tanh(x @ w)
    z = torch.sigmoid(h).sum(dim=1)
    y = torch.log(1 - z / z.max())
    q = torch.sqrt(h.var(dim=1))
    return (y + q).mean()
'''
OPS = [("log", "log of x <= 0 (-inf at 0, NaN below)", 8), ("sqrt", "sqrt of x < 0 (NaN)", 9),
       ("div", "division by 0", 7), ("exp", "exp overflow (inf above 88.7 in float32)", 6)]


# -- a synthetic run ----------------------------------------------------------------------------------
def synthetic_run(root: Path, n_sites: int, steps: int = 500, seed: int = 0) -> Path:
    """Write a campaign run of ``n_sites`` sites under ``root`` (``root/runs/<run>``); return its folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fuzz_core.io import atomic_write_json

    rng = np.random.default_rng(seed)
    root = Path(root)
    n_targets = max(3, n_sites // 10 + 2)       # the first finds nothing, the last fails to build
    (root / "synthetic").mkdir(parents=True, exist_ok=True)
    for t in range(n_targets):
        (root / "synthetic" / f"model_{t}.py").write_text(SOURCE)
    (root / "campaign.yaml").write_text(f"name: {CAMPAIGN}\n")
    run_name = f"{CAMPAIGN}-20260101-000000"
    output = root / "runs"
    run_dir = output / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    traces = output / "traces" / f"campaign={CAMPAIGN}"
    t0 = time.time() - 3600
    sites, allocation, total = [], [], 0
    for i in range(n_sites):
        t = i % (n_targets - 1)
        target = f"t{t}" if t else "clean"
        op, hazard, line = OPS[i % len(OPS)]
        location = f"synthetic/model_{t}.py:{line}"
        occurrence = (i // n_targets) % 3
        sid = f"{i:012x}"
        label = f"{target}:{op}@{location}#{occurrence}"
        found = target != "clean" and i % 20 == 1
        status = "found" if found else ("exhausted", "retired", "unreachable", "exhausted")[i % 4]
        n = max(2, int(steps * (0.2 if found else 1.0)))
        base = rng.uniform(5, 200)
        loss = np.maximum(0.0, base * np.exp(-np.linspace(0, rng.uniform(0.5, 4), n)) + rng.normal(0, base / 50, n))
        loss[rng.random(n) < 0.01] = np.inf                        # steps where the op was not reached
        events = rng.choice(["step", "step", "step", "mutation", "escape", "refresh"], n).astype(object)
        if found:
            loss[-1] = 0.0
            events[-1] = "trigger"
        best_zero = status == "exhausted" and i % 8 == 0
        if best_zero:
            loss[n // 2] = 0.0
        best = float(np.min(loss[np.isfinite(loss)]))
        for shard, part in enumerate(np.array_split(np.arange(n), 2)):
            folder = traces / f"site_id={sid}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"part-{run_name}-{shard + 1:06d}-{i:08x}.parquet"
            pq.write_table(pa.table({"run": [run_name] * len(part), "step": (part + 1).tolist(),
                                     "suspect_loss": loss[part].tolist(), "event": events[part].tolist()}), path)
            stamp = t0 + shard * 60 + i * 0.05
            os.utime(path, (stamp, stamp))
            total += len(part)
            allocation.append({"site_id": sid, "steps": len(part), "total": total})
        finding = None
        if found:
            finding = f"findings/{target}-{op}-{sid}"
            _finding(run_dir / finding, rng, label, sid, target, op, hazard, location, occurrence, run_dir, i)
        reach = None
        if status == "exhausted":
            reach = {"message": f"would trigger if x[0, {i % 20}] reached {-12.5 - i % 7:.1f}; bounds are [-3, 3]",
                     "triggered": True, "probe_steps": 8, "best_loss": best}
        sites.append({"id": sid, "label": label, "target": target, "op": op, "kind": op, "hazard": hazard,
                      "location": location, "occurrence": occurrence, "status": status,
                      "exit_reason": {"found": "triggered", "exhausted": "budget_spent", "retired": "no_progress",
                                      "unreachable": "unreachable"}[status],
                      "steps": n, "seconds": round(n * 0.004, 3), "best_loss": best, "finding": finding,
                      "error": None, "traceback": None, "mlflow_run_id": f"{i:032x}", "reach": reach})
    targets = []
    for t in range(n_targets):
        name = f"t{t}" if t else "clean"
        mine = [s for s in sites if s["target"] == name]
        failed = t == n_targets - 1
        targets.append({"name": name, "entry": f"synthetic/model_{t}.py:make_target", "framework": "torch",
                        "status": "error" if failed else ("found" if any(s["finding"] for s in mine) else "exhausted"),
                        "exit_reason": "target_error" if failed else "completed",
                        "error": "TypeError: make_target() got an unexpected keyword argument 'hiden'" if failed else None,
                        "traceback": None, "sites": len(mine), "recorded": []})
    counts = {k: sum(1 for s in sites if s["status"] == k) for k in
              ("pending", "searching", "found", "flaky", "exhausted", "retired", "unreachable", "error", "timeout",
               "stopped")}
    summary = {
        "schema_version": 2,
        "campaign": {"name": CAMPAIGN, "file": str(root / "campaign.yaml"), "config": {}},
        "run": {"folder": str(run_dir), "campaign_file": str(root / "campaign.yaml"),
                "started": "2026-01-01T00:00:00+00:00", "updated": "2026-01-01T01:00:00+00:00",
                "state": "completed", "exit_reason": "completed", "seconds": 3600.0, "exit_code": 1,
                "tracking_uri": "http://127.0.0.1:5000", "mlflow_run_id": "f" * 32, "stopped": None,
                "executor": "local", "resumed": False},
        "targets": targets, "sites": sites,
        "totals": {"targets": n_targets, "sites": len(sites), "steps": total,
                   "findings": sum(1 for s in sites if s["finding"]), **counts},
    }
    atomic_write_json(run_dir / "summary.json", summary)
    atomic_write_json(run_dir / "allocation.json", allocation)
    return run_dir


def _finding(folder: Path, rng: np.random.Generator, label: str, sid: str, target: str, op: str, hazard: str,
             location: str, occurrence: int, run_dir: Path, i: int) -> None:
    from fuzz_core.io import atomic_save_arrays, atomic_write_json

    image = i % 3 == 1
    shape = (1, 1, 16, 16) if image else (1, 20)
    x = rng.uniform(-3, 3, shape).astype(np.float32)
    x.reshape(-1)[3] = -4.25                                   # one value outside the bounds
    atomic_save_arrays(folder / "values.safetensors", {"input.x": x, "input.y": np.ones(1, np.float32)})
    (folder / "test_reproducer.py").write_text("def test_reproducer():\n    pass\n")
    fix = None
    if i % 2:
        line = SOURCE.splitlines()[int(location.rsplit(":", 1)[1]) - 1]
        fix = {"status": "verified", "message": "verified: none found in 200 steps over 3 site(s) with the guard",
               "recommended": {"name": "clamp_min", "op": op, "location": location,
                               "description": "clamp the input to >= 1.1754944e-38",
                               "code": line.strip().replace("1 - z", "(1 - z).clamp_min(1.1754944e-38)")},
               "diff": f"--- a/{location.split(':')[0]}\n+++ b/{location.split(':')[0]}\n-{line}\n+"
                       + line.replace("1 - z", "(1 - z).clamp_min(1.1754944e-38)"),
               "attempts": []}
    report = {
        "schema_version": 1,
        "site": {"id": sid, "target": target, "op": op, "kind": op, "hazard": hazard, "location": location,
                 "occurrence": occurrence, "searched": True, "label": label},
        "hazard": hazard, "signature": f"{i:016x}",
        "first_op": {"op": op, "kind": op, "location": location, "occurrence": occurrence, "nan": i % 4 != 1},
        "phase": "forward", "site_triggered": True, "replays": {"reproduced": 3, "of": 3}, "flaky": False,
        "notes": [], "step": 100, "step_seed": 1, "seconds": 0.5, "strategy": "adaptive", "trigger": "inputs",
        "training": True, "target": {"name": target, "entry": f"{location.split(':')[0]}:make_target", "args": {},
                                     "framework": None, "seed": 0},
        "bounds": {"x": [-3.0, 3.0]}, "batch_size": 1,
        "minimised": {"original_batch_size": 8, "batch_size": 1, "distance": {"l2": 3.5, "linf": 1.25},
                      "distance_before": {"l2": 9.0, "linf": 2.5}},
        "device": "cpu", "versions": {}, "created": "2026-01-01T00:30:00+00:00",
        "replay": f"cdeepfuzz replay {run_dir.name}/{folder.parent.name}/{folder.name}",
    }
    if fix:
        report["fix"] = fix
    atomic_write_json(folder / "finding.json", report)


# -- a headless browser ---------------------------------------------------------------------------------
def find_browser() -> tuple[str | None, str]:
    """A headless-capable Chromium: its path, or None and why not."""
    env = os.environ.get("CDEEPFUZZ_BROWSER")
    if env:
        return (env, "") if shutil.which(env) or Path(env).is_file() else (None, f"no headless browser: CDEEPFUZZ_BROWSER={env} is not found")
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path, ""
    return None, NO_BROWSER


class BrowserError(RuntimeError):
    pass


class Browser:
    """Headless Chromium, one page, driven over the DevTools protocol (aiohttp's WebSocket client).

    ``open(path)`` loads a file; ``eval(js)`` evaluates an expression in the page (awaiting a
    promise) and returns its JSON value; ``errors`` collects the page's uncaught exceptions and
    console errors."""

    def __init__(self, executable: str, width: int = 1400, height: int = 1000, timeout: float = 60.0) -> None:
        import aiohttp  # noqa: F401 - fail here, with the module's name, when it is missing

        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="cdf-browser-")
        self.proc = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
             "--remote-allow-origins=*", f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.loop = asyncio.new_event_loop()
        self.errors: list[str] = []
        self._id = 0
        self._events: list[dict[str, Any]] = []
        try:
            self.loop.run_until_complete(self._connect())
        except BaseException:
            self.close()
            raise

    async def _connect(self) -> None:
        import aiohttp

        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BrowserError("the browser did not start (no DevToolsActivePort)")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        ws_url = None
        while ws_url is None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t.get("type") == "page"]
            if pages:
                ws_url = pages[0]["webSocketDebuggerUrl"]
            elif time.monotonic() > deadline:
                raise BrowserError("the browser has no page")
            else:
                await asyncio.sleep(0.05)
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(ws_url, max_msg_size=0)
        for domain in ("Page", "Runtime", "Log"):
            await self._send(f"{domain}.enable")

    async def _send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        mine = self._id
        await self.ws.send_str(json.dumps({"id": mine, "method": method, "params": params or {}}))
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), self.timeout)
            if msg.get("id") == mine:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails") or {}
            self.errors.append(str((d.get("exception") or {}).get("description") or d.get("text")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            self.errors.append(str(params["entry"].get("text")))
        self._events.append(msg)

    async def _wait_event(self, name: str) -> None:
        if any(e.get("method") == name for e in self._events):
            return
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), self.timeout)
            self._event(msg)
            if msg.get("method") == name:
                return

    def open(self, path: Path) -> None:
        async def go() -> None:
            self._events.clear()
            await self._send("Page.navigate", {"url": Path(path).resolve().as_uri()})
            await self._wait_event("Page.loadEventFired")
        self.loop.run_until_complete(go())

    def eval(self, expression: str) -> Any:
        async def go() -> Any:
            res = await self._send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                        "returnByValue": True})
            if res.get("exceptionDetails"):
                d = res["exceptionDetails"]
                raise BrowserError(str((d.get("exception") or {}).get("description") or d.get("text")))
            return (res.get("result") or {}).get("value")
        return self.loop.run_until_complete(go())

    def close(self) -> None:
        async def down() -> None:
            if getattr(self, "ws", None) is not None:
                await self.ws.close()
            if getattr(self, "session", None) is not None:
                await self.session.close()
        try:
            self.loop.run_until_complete(down())
        except Exception:  # noqa: BLE001 - closing what is already gone
            pass
        self.loop.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# what the page did: first chart, load, and a scripted use (scroll to the last chart, zoom it)
MEASURE = """(async () => {
  const until = async (ok, ms) => { const t = performance.now();
    while (!ok()) { if (performance.now() - t > ms) return false; await new Promise(r => setTimeout(r, 5)); }
    return true; };
  const longest = [];
  try { new PerformanceObserver(l => l.getEntries().forEach(e => longest.push(e.duration)))
        .observe({type: 'longtask', buffered: true}); } catch (e) {}
  const nav = performance.getEntriesByType('navigation')[0];
  await until(() => performance.getEntriesByName('first-contentful-paint').length > 0, 10000);
  const fcp = (performance.getEntriesByName('first-contentful-paint')[0] || {startTime: -1}).startTime;
  const hosts0 = document.querySelectorAll('.cdf-host[data-site]');
  let t = performance.now();
  hosts0[0].scrollIntoView();
  await until(() => !!hosts0[0].cdfChart, 20000);
  const first = performance.now() - t;
  const drawnAtFirst = Array.from(hosts0).filter(h => h.cdfChart).length;
  const hosts = document.querySelectorAll('.cdf-host[data-site]');
  const last = hosts[hosts.length - 1];
  t = performance.now();
  last.scrollIntoView();
  await until(() => !!last.cdfChart, 20000);
  const scroll = performance.now() - t;
  const c = last.querySelector('canvas'), b = c.getBoundingClientRect(), before = last.cdfChart.getView();
  t = performance.now();
  c.dispatchEvent(new WheelEvent('wheel', {deltaY: -400, clientX: b.left + b.width / 2,
                                           clientY: b.top + b.height / 2, bubbles: true, cancelable: true}));
  const zoom = performance.now() - t;
  const after = last.cdfChart.getView();
  await new Promise(r => setTimeout(r, 300));
  return {fcp_ms: fcp, first_chart_ms: first, load_ms: nav.loadEventEnd, dom_ms: nav.domContentLoadedEventEnd,
          charts_at_first: drawnAtFirst, charts: hosts.length, scroll_ms: scroll, zoom_ms: zoom,
          zoomed: after.x1 - after.x0 < before.x1 - before.x0,
          longest_task_ms: longest.length ? Math.max(...longest) : 0,
          width: document.documentElement.scrollWidth, viewport: window.innerWidth};
})()"""


# -- the measurement ----------------------------------------------------------------------------------------
def _size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def measure(n_sites: int, steps: int, browser: Browser | None) -> dict[str, Any]:
    from orchestrator.commands.report import write_report

    with tempfile.TemporaryDirectory(prefix="report-size-") as tmp:
        run_dir = synthetic_run(Path(tmp), n_sites, steps)
        t = time.perf_counter()
        index = write_report(run_dir)
        build = time.perf_counter() - t
        pages = sorted((index.parent / "findings").glob("*.html"))
        row: dict[str, Any] = {"sites": n_sites, "findings": len(pages), "build_s": build,
                               "index_bytes": index.stat().st_size, "total_bytes": _size([index, *pages]),
                               "finding_bytes": max((p.stat().st_size for p in pages), default=0)}
        t = time.perf_counter()
        parser = HTMLParser()
        parser.feed(index.read_text(encoding="utf-8"))
        parser.close()
        row["parse_s"] = time.perf_counter() - t
        if browser is not None:
            browser.open(index)
            row["browser"] = browser.eval(MEASURE)
            row["errors"] = list(browser.errors)
    return row


def render(rows: list[dict[str, Any]], browser_note: str) -> str:
    headers = ["sites", "findings", "build", "index.html", "all pages", "largest finding page", "parse (Python)",
               "first paint (browser)", "load event", "first loss curve", "charts drawn then", "scroll to last chart",
               "wheel-zoom redraw", "longest task", "page width"]
    out = []
    for r in rows:
        b = r.get("browser") or {}
        cells = [r["sites"], r["findings"], f"{r['build_s']:.2f} s", _mb(r["index_bytes"]), _mb(r["total_bytes"]),
                 _mb(r["finding_bytes"]), f"{r['parse_s'] * 1000:.0f} ms"]
        if b:
            cells += [f"{b['fcp_ms']:.0f} ms", f"{b['load_ms']:.0f} ms", f"{b['first_chart_ms']:.0f} ms",
                      f"{b['charts_at_first']} of {b['charts']}",
                      f"{b['scroll_ms']:.0f} ms", f"{b['zoom_ms']:.1f} ms" + ("" if b["zoomed"] else " (no zoom!)"),
                      f"{b['longest_task_ms']:.0f} ms", f"{b['width']} px in {b['viewport']}"]
        else:
            cells += ["—"] * 8
        out.append(cells)
    text = table(headers, out)
    return text + "\n\n" + browser_note


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--steps", type=int, default=500, help="trace steps of a site that found nothing")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="print the table only (leave RESULTS.md)")
    args = ap.parse_args(argv)
    browser, why = None, "no browser asked (--no-browser)"
    if not args.no_browser:
        exe, why = find_browser()
        if exe:
            try:
                browser = Browser(exe)
                version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
                why = f"Browser figures: {version or exe}, headless, 1400×1000 window, the page opened from disk."
            except Exception as exc:  # noqa: BLE001 - the table says why
                browser, why = None, f"no browser figures: {type(exc).__name__}: {exc}"
    try:
        rows = [measure(n, args.steps, browser) for n in args.sites]
    finally:
        if browser is not None:
            browser.close()
    errors = [e for r in rows for e in r.get("errors", [])]
    note = (f"{why} Synthetic runs, {args.steps} trace steps per site that found nothing (a fifth for a found "
            "one), one finding in twenty sites; *first paint* is the browser's first contentful paint from "
            "navigation start (time to first render), *first loss curve* the time from scrolling to the first "
            "site's chart to its being drawn, and *charts drawn then* shows that the others wait until scrolled "
            "into view; "
            "*scroll to last chart* scrolls to the last site and waits for its chart, *longest task* is the longest "
            "main-thread task the browser reported (responsiveness).")
    if errors:
        note += f" Page errors: {errors[:5]}"
    text = render(rows, note)
    print(text)
    if not args.no_write:
        write_section("report_size", "## Report build time and size (`cdeepfuzz report`)\n\n" + text,
                      args=" ".join(f"--sites {' '.join(map(str, args.sites))}".split()) if args.sites != [10, 100, 1000]
                      else "")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
