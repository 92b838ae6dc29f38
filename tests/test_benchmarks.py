"""The benchmark scripts import and run (a broken one would only show when someone reruns it)."""
from __future__ import annotations

import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")))
def test_benchmark_script_compiles(script: str):
    py_compile.compile(str(ROOT / "benchmarks" / script), doraise=True)


def test_write_section_replaces_its_block_and_names_the_arguments(tmp_path: Path, monkeypatch):
    from benchmarks import _results

    monkeypatch.setattr(_results, "RESULTS", tmp_path / "RESULTS.md")
    _results.write_section("demo", "first", script="demo_bench", args="--fast")
    _results.write_section("other", "kept")
    _results.write_section("demo", "second", script="demo_bench", args="--fast")
    text = (tmp_path / "RESULTS.md").read_text()
    assert "second" in text and "first" not in text and "kept" in text
    assert "_Written by `benchmarks/demo_bench.py --fast`" in text
    assert "_Written by `benchmarks/other.py`" in text


def test_steps_to_trigger_runs_on_one_subject():
    proc = subprocess.run([sys.executable, "benchmarks/steps_to_trigger.py", "--only", "softmax_xent_mlp",
                           "--strategies", "adaptive", "--max-steps", "20", "--no-write"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| softmax_xent_mlp |" in proc.stdout and "adaptive | 1/1" in proc.stdout, proc.stdout[-2000:]


def test_raw_units_feeds_a_subject_scaled_inputs_and_keeps_its_program():
    import numpy as np
    import torch

    from benchmarks.subjects import subject_entry
    from benchmarks.targets.raw_units import make_target
    from fuzz_core import TargetError
    from fuzz_core.backends.torch import program_optimizers
    from fuzz_core.loader import load_factory

    plain = load_factory(subject_entry("log_one_minus_sigmoid"), ROOT)(pretrain_steps=5)
    raw = make_target("log_one_minus_sigmoid", scale=5.0, pretrain_steps=5)
    assert raw.bounds == {"x": (-15.0, 15.0)} and raw.search == ["x"]
    a, b = plain.sample(np.random.default_rng(0)), raw.sample(np.random.default_rng(0))
    np.testing.assert_allclose(b["x"], 5 * a["x"], rtol=1e-6)
    assert b["x"].dtype == np.float32 and np.array_equal(b["y"], a["y"])      # unsearched: as they are
    with torch.no_grad():
        same = [t.program({k: torch.as_tensor(v) for k, v in batch.items()}) for t, batch in ((plain, a), (raw, b))]
    assert torch.allclose(*same)
    # a train_step's optimizers stay visible to the runner through the wrapper (a GAN's two Adams)
    assert len(program_optimizers(make_target("gan_log_d", pretrain_steps=0))) == 2
    with pytest.raises(TargetError, match="scale"):
        make_target("log_one_minus_sigmoid", scale=0)


def _run(found_at: dict, unspent: dict, total: int) -> dict:
    return {"found_at": found_at, "unspent": unspent, "total": total, "max_steps": 100,
            "bugs": sorted([*found_at, *unspent])}


def test_steps_until_found_charges_a_missed_bug_its_campaign_and_unspent_budget():
    from benchmarks.campaign_bench import steps_until_found

    run = _run({"a": 40, "b": 90}, {"c": 70}, total=500)
    assert steps_until_found(run, ["a", "b"]) == 90
    assert steps_until_found(run, ["a", "b", "c"]) == 570
    assert steps_until_found(run, []) == 0


def test_scheduler_benefit_judges_the_bugs_either_policy_finds(monkeypatch):
    """A bug both policies miss is left out of the judged figure (it stays in the strict one); a
    bug only one policy misses is charged to that one."""
    import benchmarks.campaign_bench as cb

    monkeypatch.setattr(cb, "SCHED_CAMPAIGNS", {"raw units": [("a", "log", 0), ("b", "div", 0), ("c", "exp", 0)]})
    runs = {
        # seed 0: both miss c; loss-slope finds a and b three times sooner
        ("raw units", "grist", "round-robin", 0): _run({"a": 300, "b": 900}, {"c": 50}, total=2000),
        ("raw units", "grist", "loss-slope", 0): _run({"a": 100, "b": 300}, {"c": 50}, total=1000),
        # seed 1: loss-slope misses b, which round-robin finds
        ("raw units", "grist", "round-robin", 1): _run({"a": 300, "b": 600, "c": 900}, {}, total=2000),
        ("raw units", "grist", "loss-slope", 1): _run({"a": 100, "c": 200}, {"b": 40}, total=1000),
    }
    for (kind, _, po, seed), r in list(runs.items()):   # adaptive: the same runs
        runs[kind, "adaptive", po, seed] = r
    text = cb._benefit_section("raw units", runs, [0, 1])
    assert "| grist | 0 | 2/3: 300, 900 | 2/3: 100, 300 | 2 | 900 | 300 | 3.00x |" in text
    assert "| grist | 1 | 3/3: 300, 600, 900 | 2/3: 100, 200 | 3 | 900 | 1040 | 0.87x |" in text
    assert "round-robin 1800, loss-slope 1340, **1.34x**" in text and "target >= 3x: NOT met" in text
    assert "Strict (every planted bug, a missed one charged): 2950 against 2090" in text
    assert "target never more steps: NOT met" in text


def test_scheduler_benefit_names_the_seeds_that_miss_and_sums_the_held_out_ones(monkeypatch):
    import benchmarks.campaign_bench as cb

    monkeypatch.setattr(cb, "SCHED_CAMPAIGNS", {"raw units": [("a", "log", 0)]})
    runs = {}
    for st in ("grist", "adaptive"):
        for seed, (rr, ls) in {0: (300, 100), 16: (200, 400), 17: (600, 100)}.items():
            runs["raw units", st, "round-robin", seed] = _run({"a": rr}, {}, total=rr)
            runs["raw units", st, "loss-slope", seed] = _run({"a": ls}, {}, total=ls)
    text = cb._benefit_section("raw units", runs, [0, 16, 17])
    assert "target never more steps: NOT met, seed 16)" in text
    assert "Seeds 16-17 alone (held out): 800 against 500, 1.60x" in text
    assert "Seeds" not in cb._benefit_section("raw units", runs, [16, 17])   # all held out: no split
