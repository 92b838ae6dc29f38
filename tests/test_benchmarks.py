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
