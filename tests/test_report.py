"""Two campaign runs into one output: their findings deduplicate into bugs, and the report renders offline."""
from __future__ import annotations

import json
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuzz_core.dedupe import BugDatabase, rebuild_index, size_key
from orchestrator.run.campaign import RunOptions, run_campaign
from orchestrator.cli import app
from orchestrator.config import load_campaign
from orchestrator.commands.report import write_reports
from orchestrator.wording import site_outcome
from records import check_run

TARGETS = {"sig": "campaigns/targets/log_one_minus_sigmoid.py:make_target",
           "pow": "campaigns/targets/pow_fractional.py:make_target"}


def _campaign(tmp: Path, seed: int) -> Path:
    path = tmp / f"rep-{seed}.yaml"
    targets = "\n".join(f"  - {{name: {n}, entry: {e}}}" for n, e in TARGETS.items())
    path.write_text(f"name: rep\ntargets:\n{targets}\n" + textwrap.dedent(f"""\
        search: {{strategy: adaptive, max_steps: 40, seed: {seed}}}
        scheduler: {{policy: loss-slope, quantum: 10}}
        resources: {{num_actors: 0, num_cpus: 1, num_gpus: 0}}
        device: cpu
        time_limit_s: 120
        output: {tmp / 'runs'}
        tracking: {{enabled: false}}
        """))
    return path


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("report")
    outcomes = []
    for seed in (0, 1):
        path = _campaign(tmp, seed)
        outcomes.append(run_campaign(load_campaign(path), path, RunOptions(progress=False)))
    assert [o.exit_code for o in outcomes] == [1, 1]
    for outcome in outcomes:
        check_run(outcome.run_dir)
    return tmp / "runs", outcomes


def test_the_same_bugs_found_by_two_campaign_runs_are_one_bug_each(two_runs):
    output, outcomes = two_runs
    rebuild_index(output)
    again = rebuild_index(output)                               # idempotent
    assert not any(r.new_occurrence for r in again)
    db = BugDatabase(output)
    bugs = {b["signature"]: b for b in db.bugs()}
    summaries = [json.loads(Path(o.summary).read_text()) for o in outcomes]
    found = [{b["signature"] for b in sm["bugs"]} for sm in summaries]
    assert found[0] & found[1], "both runs must find a common bug"   # a bug: one signature, any sites
    assert set(bugs) == found[0] | found[1]
    for key in found[0] & found[1]:
        bug = bugs[key]
        occ = bug["occurrences"]
        assert {o["run"] for o in occ} == {o.run_dir.name for o in outcomes}
        assert {o["seed"] for o in occ} == {0, 1}
        best = min(occ, key=lambda o: size_key(o["batch_size"], o["distance_l2"], o["distance_linf"]))
        assert bug["best"]["folder"] == best["folder"]               # the smaller one is the reproducer
        assert (Path(bug["reproducer"]) / "values.safetensors").is_file()
    res = CliRunner().invoke(app, ["replay", bugs[sorted(found[0] & found[1])[0]]["reproducer"]])
    assert res.exit_code == 0, res.output


class _Page(HTMLParser):
    """The links, scripts, ids, images and text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.scripts: list[str] = []
        self.inline_js = 0
        self.imgs: list[str] = []
        self.ids: list[str] = []
        self.hosts: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("a", "link"):
            self.links.append(a.get("href") or "")
        if tag == "script":
            if a.get("src"):
                self.scripts.append(a["src"])
            elif a.get("type") != "application/json":
                self.inline_js += 1
        if tag == "img":
            self.imgs.append(a.get("src") or "")
        if "id" in a:
            self.ids.append(a["id"])
        if a.get("data-site"):
            self.hosts.append(a["data-site"])

    def handle_data(self, data):
        self.text.append(data)


def parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def test_report_renders_offline_with_a_page_per_bug(two_runs):
    output, outcomes = two_runs
    rebuild_index(output)
    res = CliRunner().invoke(app, ["report", str(output)])      # an output folder: its newest run
    assert res.exit_code == 0, res.output
    newest = outcomes[-1].run_dir
    page = newest / "report" / "index.html"
    assert str(page) in res.output and not (outcomes[0].run_dir / "report").exists()
    text = page.read_text()
    index = parse(page)
    assert index.scripts == [] and index.inline_js >= 2            # the chart script is inlined
    for src in index.links + index.imgs:
        assert not src.startswith(("http:", "https:", "//")), src
    summary = json.loads(Path(outcomes[-1].summary).read_text())
    sites = summary["sites"]
    order = [i[len("site-"):] for i in index.ids if i.startswith("site-")]
    found = [s["id"] for s in sites if s["status"] == "found"]
    assert set(order) == {s["id"] for s in sites}                   # a loss curve per site
    assert set(order[:len(found)]) == set(found)                    # found sites first
    assert set(index.hosts) == {s["id"] for s in sites if s["steps"]}
    for t in summary["targets"]:
        assert t["name"] in text
    for s in sites:
        if s["status"] not in ("found", "flaky"):
            outcome = site_outcome(s)
            assert (outcome.split(", ", 1)[1] if ", " in outcome else "") in "".join(index.text)
    assert summary["bugs"], "the runs found bugs"
    assert text.count("finding(s) in this run") == len(summary["bugs"])        # one row per bug
    for bug in summary["bugs"]:
        report = json.loads((newest / bug["reproducer"] / "finding.json").read_text())
        assert bug["signature"] in text
        href = f"findings/{Path(bug['reproducer']).name}.html"
        assert href in index.links
        finding_page = page.parent / href
        fp = parse(finding_page)
        body = "".join(fp.text)
        assert report["replay"] in body and bug["position"] in body and bug["hazard"] in body
        line = int(bug["location"].rsplit(":", 1)[1])
        source = (Path.cwd() / bug["location"].rsplit(":", 1)[0]).read_text().splitlines()[line - 1]
        assert source in body                                       # the source line, from the repo
        assert "input x" in body.replace("\n", " ")
        for link in fp.links:
            if not link.startswith("#"):
                assert (finding_page.parent / link.split("#")[0]).exists(), link
        assert fp.scripts == []
        for site_id in bug["sites"]:                                # the site a bug is at links to its page
            assert next(s for s in sites if s["id"] == site_id)["status"] in ("found", "flaky")
    import re

    assert any(int(n) >= 2 for n in re.findall(r"(\d+) in \d+ run\(s\) of this output", text))
    for f in [page, *(page.parent / "findings").glob("*.html")]:
        assert f.stat().st_mode & 0o777 == 0o666 & ~_umask(), f
    # a run folder directly, and every run with --all
    assert write_reports(outcomes[0].run_dir) == [outcomes[0].run_dir / "report" / "index.html"]
    res = CliRunner().invoke(app, ["report", str(output), "--all"])
    assert res.exit_code == 0, res.output
    index = (output / "report" / "index.html").read_text()
    assert all(f"../{o.run_dir.name}/report/index.html" in index for o in outcomes)


def _umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_report_of_a_folder_without_runs_is_a_usage_error(tmp_path: Path):
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "no campaign run" in res.output
