"""Triage: minimisation toward the original sample, deduplication by signature, triage states in MLflow."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fuzz_core import Target
from fuzz_core.backends.base import RunnerOptions
from fuzz_core.backends.torch import TorchRunner
from fuzz_core.dedupe import BugDatabase, rebuild_index, record_finding, size_key
from fuzz_core.engine import baseline_batch, confirm, confirmed, minimise
from fuzz_core.findings import Finding, write_finding
from fuzz_core.search import SearchConfig, SiteSearch
from fuzz_core.sites import make_site
from orchestrator.cli import app

BATCH, WIDTH, PLANTED_ROW = 64, 4, 37


def make_planted(seed: int = 0, pair: bool = False, **_) -> Target:
    """``log(x)`` on a batch of 64 rows in (0.5, 1); the bound (-1, 1) lets a row cross 0.
    With ``pair``, the bug needs two rows: ``log(1.5 - number of negative entries in the batch)``."""
    def program(b):
        if pair:
            return torch.log(1.5 - (b["x"] < 0).float().sum())
        return torch.log(b["x"]).sum() + b["y"].float().sum() * 0

    def sample(rng: np.random.Generator):
        return {"x": rng.uniform(0.5, 1.0, (BATCH, WIDTH)).astype(np.float32),
                "y": rng.integers(0, 3, BATCH)}

    return Target(program=program, sample=sample, bounds={"x": (-1.0, 1.0)}, search=["x"])


def _planted(pair: bool = False):
    runner = TorchRunner("planted", make_planted(pair=pair), RunnerOptions())
    rng = np.random.default_rng(0)
    original = runner.sample(rng)
    site = next(s for s in runner.discover(original, 0) if s.op == "log")
    return runner, site, original


def test_planted_bug_in_64_rows_shrinks_to_one_and_moves_toward_the_original():
    runner, site, original = _planted()
    cand = {k: v.copy() for k, v in original.items()}
    cand["x"][PLANTED_ROW] = [-0.5, 0.8, -0.9, 0.6]
    assert confirmed(confirm(runner, site, cand, None, 0), site)
    small, info = minimise(runner, site, cand, None, 0, original=original, bounds=runner.bounds(original))
    assert info["original_batch_size"] == BATCH and info["batch_size"] == 1 and info["rows"] == [PLANTED_ROW]
    assert small["x"].shape == (1, WIDTH) and small["y"].tolist() == [original["y"][PLANTED_ROW]]
    assert confirmed(confirm(runner, site, small, None, 0), site), "the minimised reproducer must still replay"
    before, after = info["distance_before"], info["distance"]
    assert after["l2"] < before["l2"] and after["linf"] < before["linf"]
    t = info["factors"][0]
    assert 0 < t < 1
    expected = original["x"][PLANTED_ROW] + t * (cand["x"][PLANTED_ROW] - original["x"][PLANTED_ROW])
    np.testing.assert_allclose(small["x"][0], expected, atol=1e-6)     # on the segment, at the reported factor
    assert small["x"][0].min() <= 0 < (original["x"][PLANTED_ROW] + (t - 2 ** -11) * (
        cand["x"][PLANTED_ROW] - original["x"][PLANTED_ROW])).min() + 1e-3   # barely past the edge
    assert np.sqrt(((small["x"][0] - original["x"][PLANTED_ROW]) ** 2).sum()) == pytest.approx(after["l2"], rel=1e-5)
    assert info["replay_seconds_original"] > 0 and info["replay_seconds_minimised"] > 0
    assert info["checks"] > 1 and info["searched"] == ["x"]


def test_a_bug_that_needs_two_rows_keeps_two_and_without_original_reports_no_distance():
    runner, site, original = _planted(pair=True)
    cand = {k: v.copy() for k, v in original.items()}
    cand["x"][[5, 50], 0] = -0.5
    small, info = minimise(runner, site, cand, None, 0)
    assert sorted(info["rows"]) == [5, 50] and info["batch_size"] == 2
    assert info["distance"] is None and info["factors"] is None
    assert confirmed(confirm(runner, site, small, None, 0), site)


def test_baseline_batch_is_the_batch_the_search_started_from():
    runner, site, _ = _planted()
    search = SiteSearch(runner, site, SearchConfig(max_steps=5, seed=7))
    base = baseline_batch(runner, site, 7)
    for k, v in search.original.items():
        np.testing.assert_array_equal(np.clip(base[k], *search.bounds[k]) if k in search.bounds else base[k], v)


# -- dedupe -------------------------------------------------------------------------------------------
def _finding(output: Path, run: str, site_id_seed: int, rows: int, l2: float | None, *, location: str = "m.py:3",
             seed: int = 0) -> Path:
    site = make_site("t", "log", "log", "log of x <= 0", location, site_id_seed)   # occurrence differs: another site
    f = Finding(site=site, target={"name": "t", "entry": "m.py:make", "args": {}, "framework": "torch", "seed": seed},
                inputs={"x": np.full((rows, 2), float(rows), np.float32)}, state=None, step=3, step_seed=1,
                strategy="adaptive", first_op=None, trigger="inputs", training=False, bounds={"x": (0.0, 1.0)},
                minimised={"original_batch_size": 8, "batch_size": rows,
                           "distance": None if l2 is None else {"l2": l2, "linf": l2 / 2}})
    (output / run).mkdir(parents=True, exist_ok=True)
    (output / run / "summary.json").write_text("{}")
    return write_finding(f, output / run / "findings" / f.folder_name)


def test_same_signature_is_one_bug_and_a_smaller_reproducer_replaces_the_stored_one(tmp_path: Path):
    db = BugDatabase(tmp_path)
    big = _finding(tmp_path, "c-1", 0, rows=3, l2=1.0)
    first = db.save(big)
    assert first.new_bug and first.replaced and first.occurrences == 1
    assert db.save(big).occurrences == 1 and not db.save(big).new_occurrence          # idempotent
    small = _finding(tmp_path, "c-2", 1, rows=1, l2=5.0, seed=9)                      # fewer rows wins over distance
    second = db.save(small)
    assert second.signature == first.signature and not second.new_bug and second.replaced
    closer = _finding(tmp_path, "c-3", 2, rows=1, l2=0.5)
    assert db.save(closer).replaced
    farther = _finding(tmp_path, "c-4", 3, rows=1, l2=0.7)
    result = db.save(farther)
    assert not result.replaced and result.occurrences == 4
    bug = db.fetch(first.signature)
    assert bug["best"]["folder"] == closer.relative_to(tmp_path).as_posix()
    assert {o["run"] for o in bug["occurrences"]} == {"c-1", "c-2", "c-3", "c-4"}
    assert {o["seed"] for o in bug["occurrences"]} == {0, 9}
    repro = Path(bug["reproducer"])
    report = json.loads((repro / "finding.json").read_text())
    assert report["minimised"]["distance"]["l2"] == 0.5 and report["replay"].endswith("reproducer")
    assert (repro / "values.safetensors").read_bytes() == (closer / "values.safetensors").read_bytes()
    assert (repro / "test_reproducer.py").read_text() == (closer / "test_reproducer.py").read_text()   # same depth
    other = _finding(tmp_path, "c-4", 4, rows=2, l2=None, location="m.py:9")          # another bug
    assert record_finding(tmp_path, other).new_bug
    assert len(db.signatures()) == 2
    assert not [p for p in (tmp_path / "bugs").rglob(".*") if p.name != ".lock"]     # no temporaries left


def test_rebuild_index_and_recovery_after_a_crash_mid_swap(tmp_path: Path):
    a = _finding(tmp_path, "c-1", 0, rows=2, l2=1.0)
    b = _finding(tmp_path, "c-2", 1, rows=1, l2=1.0)
    results = rebuild_index(tmp_path)
    assert [r.occurrences for r in results] == [1, 2] and results[1].replaced
    db = BugDatabase(tmp_path)
    sig = results[0].signature
    folder = tmp_path / "bugs" / sig
    os.rename(folder / "reproducer", folder / ".old-deadbeef")        # a crash between the two renames
    db.save(a)                                                          # the next save repairs it
    assert (folder / "reproducer" / "finding.json").is_file()
    assert db.fetch(sig)["best"]["folder"] == b.relative_to(tmp_path).as_posix()
    assert size_key(1, None, None) > size_key(1, 3.0, 1.0) > size_key(1, 2.0, 9.0)
    assert record_finding(tmp_path, tmp_path / "missing") is None     # never raises
    assert db.delete(sig) and db.fetch(sig) is None


# -- triage: per bug, not per run; the bug database holds it, MLflow mirrors it ----------------------------
def _campaign_run(output: Path, run: str, campaign: str) -> None:
    (output / run).mkdir(parents=True, exist_ok=True)
    (output / run / "summary.json").write_text(json.dumps({"campaign": {"name": campaign}}))


@pytest.mark.mlflow
def test_triage_sets_the_state_of_a_bug_once_for_every_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from mlflow.tracking import MlflowClient

    from orchestrator.observers.bug_registry import BUG_EXPERIMENT, find_bug_run
    from orchestrator.observers.tracking_sender import default_sqlite_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    uri = default_sqlite_uri(tmp_path)
    out = tmp_path / "runs"
    runs = {"camp-a-1": ("camp-a", [("a", 0), ("b", 1)]), "camp-b-1": ("camp-b", [("a", 2)])}
    folders = {}
    for run, (campaign, bugs_of_run) in runs.items():
        _campaign_run(out, run, campaign)
        for which, n in bugs_of_run:
            folders[(run, which)] = _finding(out, run, n, rows=1, l2=1.0,
                                             location="m.py:3" if which == "a" else "m.py:9")
            record_finding(out, folders[(run, which)], campaign)
    cli = CliRunner()
    client = MlflowClient(tracking_uri=uri)

    def bugs(*args: str) -> dict[str, dict]:
        res = cli.invoke(app, ["bugs", "--json", *args])          # found from the current directory: runs/
        assert res.exit_code == 0, res.output
        return {r["op"] + "@" + r["location"]: r for r in json.loads(res.output)}

    listed = bugs()
    assert set(listed) == {"log@m.py:3", "log@m.py:9"}                      # bugs, not runs: 3 findings, 2 bugs
    a, b = listed["log@m.py:3"], listed["log@m.py:9"]
    assert a["occurrences"] == 2 and a["runs"] == 2 and a["campaigns"] == ["camp-a", "camp-b"] and a["targets"] == ["t"]
    assert a["triage"] == "new" and a["first_seen"] <= a["last_seen"] and a["phase"] == "forward"
    assert set(bugs("--campaign", "camp-b")) == {"log@m.py:3"}
    assert set(bugs("--output", str(out))) == set(listed)

    res = cli.invoke(app, ["triage", a["signature"], "--state", "confirmed", "--note", "real", "--tracking-uri", uri])
    assert res.exit_code == 0, res.output
    assert "2 occurrence(s)" in res.output and "mirrored in MLflow" in res.output
    assert set(bugs("--state", "confirmed")) == {"log@m.py:3"} and set(bugs("--state", "new")) == {"log@m.py:9"}
    mirror = find_bug_run(client, client.get_experiment_by_name(BUG_EXPERIMENT).experiment_id, a["signature"])
    assert mirror.data.tags["triage"] == "confirmed" and mirror.data.tags["triage.note"] == "real"
    assert BugDatabase(out).fetch(a["signature"])["triage"]["state"] == "confirmed"     # the one home

    # by finding folder (its signature); without a tracking store the state is set all the same
    res = cli.invoke(app, ["triage", str(folders[("camp-a-1", "b")]), "--state", "fixed"])
    assert res.exit_code == 0, res.output
    assert bugs()["log@m.py:9"]["triage"] == "fixed"

    # a fixed bug that occurs again is reopened as regressed
    _campaign_run(out, "camp-c-1", "camp-c")
    record_finding(out, _finding(out, "camp-c-1", 3, rows=1, l2=1.0, location="m.py:9"), "camp-c")
    again = bugs()["log@m.py:9"]
    assert again["triage"] == "regressed" and again["occurrences"] == 2 and "occurred again" in again["note"]

    res = cli.invoke(app, ["triage", b["signature"], "--state", "not-reproduced"])
    assert res.exit_code == 0 and bugs()["log@m.py:9"]["triage"] == "not reproduced"
    bad = cli.invoke(app, ["triage", a["signature"], "--state", "maybe"])
    assert bad.exit_code == 2 and "maybe" in bad.output
    missing = cli.invoke(app, ["triage", "c" * 16, "--state", "fixed"])
    assert missing.exit_code == 2 and "no bug" in missing.output
    nothing = cli.invoke(app, ["triage", "0" * 32, "--state", "fixed"])
    assert nothing.exit_code == 2


def test_bugs_without_runs_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["bugs"])
    assert res.exit_code == 2 and "--output" in res.output
