"""Mixed precision (PyTorch side): autocast fp16/bf16 and a GradScaler from the campaign's ``precision:``,
the ``half_overflow`` catalogue row, the precision facts of a finding, and replay under the same
settings. Real torch on CPU (fp16 and bf16 autocast both run here)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fuzz_core.backends.base import Precision, RunnerOptions
from fuzz_core.backends.torch import SCALER_KEY
from fuzz_core.catalogue import DEFAULT_CATALOGUE, half_overflow_margin
from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, search_site
from fuzz_core.search import SearchConfig
from orchestrator.cli import app
from orchestrator.config import ConfigError, load_campaign
from orchestrator.observers.parquet import read_findings
from orchestrator.observers.progress import finding_lines
from orchestrator.run.campaign import RunOptions, run_campaign
from orchestrator.schemas import validate

SUBJECTS = "tests/targets/precision.py"
FP16, BF16, SCALED = Precision("fp16"), Precision("bf16"), Precision("fp16", grad_scaler=True)


def runner(factory: str, precision: Precision = Precision(), **args):
    spec = TargetSpec(factory, f"{SUBJECTS}:{factory}", args)
    return spec, build_runner(spec, RunnerOptions(precision=precision))


def half_sites(r) -> list:
    return [s for s in discover_sites(r, 0) if s.op == "half_overflow"]


# ---- the catalogue row ----------------------------------------------------------------------------

def test_half_overflow_row_is_an_output_row_beside_the_op_rows():
    spec = DEFAULT_CATALOGUE["half_overflow"]
    assert spec.on_output and spec.phase == "forward" and spec.searched
    assert DEFAULT_CATALOGUE.for_torch_output("addmm") is spec and DEFAULT_CATALOGUE.for_torch("addmm") is None
    assert DEFAULT_CATALOGUE.for_torch("exp").name == "exp"          # exp keeps its own row ...
    assert DEFAULT_CATALOGUE.for_torch_output("exp") is spec           # ... and has the output row too
    for op in ("MatMul", "BatchMatMulV2", "Sum", "Exp", "Pow", "Mul", "AddV2", "Softmax", "Conv2D"):
        assert DEFAULT_CATALOGUE.for_tf_output(op) is spec


@pytest.mark.parametrize("dtype,limit", [(torch.float16, 65504.0), (torch.bfloat16, float(torch.finfo(torch.bfloat16).max))])
def test_half_overflow_margin_is_the_log_distance_to_the_dtype_max(dtype, limit):
    from fuzz_core.backends.torch import XP

    out = torch.tensor([1.0, -1000.0, 0.0, float("inf")], dtype=dtype)
    m = half_overflow_margin([out], XP)
    assert m.dtype == torch.float32
    assert m[0].item() == pytest.approx(np.log(limit), rel=1e-5)
    assert m[1].item() == pytest.approx(np.log(limit) - np.log(1000.0), rel=1e-4)
    assert m[2].item() > m[0].item()              # a zero output is far from overflowing, not -inf
    assert m[3].item() == -np.inf


# ---- the recorder ---------------------------------------------------------------------------------

def test_fp32_runs_record_no_output_rows():
    _, r = runner("make_linear")
    assert half_sites(r) == []
    _, r16 = runner("make_linear", FP16)
    _, rbf = runner("make_linear", BF16)
    for r in (r16, rbf):
        sites = half_sites(r)
        assert [(s.kind, s.location) for s in sites] == [("addmm", f"{SUBJECTS}:25")]


def test_linear_overflow_found_under_fp16_precision_only_and_clean_in_fp32():
    spec, r = runner("make_linear", FP16)
    (site,) = half_sites(r)
    config = SearchConfig("adaptive", 40, 0, False)
    result = search_site(r, site, config)
    assert result.status.value == "found", result
    cand = result.candidate
    assert cand.phase == "forward" and cand.first_op.op == "half_overflow" and cand.first_op.kind == "addmm"
    finding = finding_from(r, spec, site, config, cand, result.seconds)
    report = finding.report()
    assert report["phase"] == "forward" and report["first_op"]["op"] == "half_overflow"
    assert report["precision"] == {"autocast": "fp16", "grad_scaler": False, "policy": None}
    assert report["precision_only"] is True
    overflow = report["overflow"]
    assert overflow["dtype"] == "float16" and overflow["limit"] == 65504.0
    assert overflow["value"] > 65504.0 and overflow["excess"] == pytest.approx(overflow["value"] / 65504.0)
    assert overflow["excess"] > 1
    assert report["scaler_skips"] is None
    line = finding_lines(finding, "f")[0]
    assert "precision-only (float16)" in line and line.startswith(f"BUG: half_overflow (forward) at {site.position}")
    assert "x float16's largest finite value" in line, line
    # the same values in fp32: finite
    _, r32 = runner("make_linear")
    assert not r32.check(finding.inputs, finding.step_seed).event


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_linear_overflow_found_under_fp16_autocast_on_cuda_precision_only():
    """The same search on a GPU (``device: cuda``): CUDA autocast runs the linear layer in float16 too."""
    spec = TargetSpec("make_linear", f"{SUBJECTS}:make_linear", {})
    r = build_runner(spec, RunnerOptions(device="cuda", precision=FP16))
    (site,) = half_sites(r)
    config = SearchConfig("adaptive", 40, 0, False)
    result = search_site(r, site, config)
    assert result.status.value == "found", result
    assert result.candidate.first_op.op == "half_overflow"
    finding = finding_from(r, spec, site, config, result.candidate, result.seconds, device="cuda")
    report = finding.report()
    assert report["precision_only"] is True and report["overflow"]["dtype"] == "float16"
    assert report["overflow"]["excess"] > 1


def test_guarded_twin_stays_clean():
    _, r = runner("make_linear", FP16, scale=0.01)
    (site,) = half_sites(r)
    result = search_site(r, site, SearchConfig("adaptive", 30, 0, False))
    assert result.candidate is None and result.status.value != "found"


def test_bf16_range_is_judged_in_bf16():
    _, r = runner("make_linear", BF16)
    (site,) = half_sites(r)
    x = {"x": np.full((4, 4), 100.0, np.float32)}
    ev = r.evaluate(x, site, grad=False, seed=0)
    assert ev.seen and not ev.event                          # 120000 overflows fp16, not bf16
    assert ev.hard == pytest.approx(np.log(float(torch.finfo(torch.bfloat16).max)) - np.log(120000.0), rel=1e-3)
    _, r16 = runner("make_linear", FP16)
    c = r16.check(x, 0)
    assert c.event and c.first_op.op == "half_overflow" and c.triggered[half_sites(r16)[0].key]


def test_underflow_to_zero_then_log_is_the_log_row_under_autocast():
    x = {"x": np.full((2, 2), 1e-4, np.float32)}            # h * h = 1e-8: 0 in float16, not in float32
    _, r16 = runner("make_underflow", FP16)
    c = r16.check(x, 0)
    assert c.event and c.first_op.op == "log"
    _, r32 = runner("make_underflow")
    assert not r32.check(x, 0).event


# ---- a hazard the program's own training fights ------------------------------------------------------

def test_summed_loss_is_found_once_the_search_stops_keeping_the_training_that_undoes_it():
    """mp_sum_loss: the fp16 ``.sum()`` of the loss overflows when the whole batch's error is large;
    each training step on such a batch teaches the student to match the teacher there (the loss is
    what it lowers), faster than the search raises it. The freeze tactic's re-measurement sees the
    training take the progress back and freezes the site at its start state: found, and precision-only."""
    from fuzz_core.search import SiteSearch

    spec = TargetSpec("mp_sum_loss", "campaigns/targets/mp_sum_loss.py:make_target")
    r = build_runner(spec, RunnerOptions(precision=FP16))
    (site,) = [s for s in half_sites(r) if s.kind == "sum"]
    config = SearchConfig("adaptive", 40, 0, reach_steps=0)
    search = SiteSearch(r, site, config)
    result = search.run(40)
    assert result.status.value == "found" and search.frozen, [(p.event, p.suspect_loss) for p in result.trace]
    assert any(p.event == "freeze" for p in result.trace)
    arrays, meta = search.checkpoint()                              # a resumed site stays frozen
    again = SiteSearch(r, site, config)
    again.restore(arrays, meta)
    assert meta["frozen"] is True and again.frozen
    cand = result.candidate
    assert cand.first_op.kind == "sum"
    r.reset()
    factory = r.get_state()                                          # the step ran from the factory's state
    assert all(np.array_equal(cand.state[k], v) for k, v in factory.items() if k.startswith("model."))
    finding = finding_from(r, spec, site, config, cand, result.seconds, minimise_batch=False)
    assert finding.replays == (3, 3) and finding.precision_only is True
    assert finding.overflow["dtype"] == "float16" and finding.overflow["excess"] > 1


# ---- GradScaler -----------------------------------------------------------------------------------

def test_grad_scaler_skips_are_counted_not_reported_and_a_collapse_is_an_update_finding():
    _, r = runner("make_scaled", SCALED)
    assert r.scaler is not None and SCALER_KEY in r.get_state()
    (site,) = half_sites(r)
    small = {"x": np.array([[100.0]], np.float32)}
    ev = r.evaluate(small, site, grad=True, train=True, seed=1)
    # dL/dW = 2 * 100 * 100 = 20000: at 65536 x 2**-k it fits float16 after 15 halvings
    assert not ev.event and ev.trained and ev.scaler_skips == 15
    assert r.scaler.get_scale() == 2.0
    ev = r.evaluate(small, site, grad=True, train=True, seed=1)
    assert not ev.event and ev.scaler_skips == 0             # the smaller scale fits: no skip
    r.reset()
    assert r.scaler.get_scale() == 65536.0                   # reset with the rest of the state
    big = {"x": np.array([[50000.0]], np.float32)}           # dL/dh = 1e5 > 65504 whatever the scale
    ev = r.evaluate(big, site, grad=True, train=True, seed=1)
    assert ev.event and ev.phase == "update" and ev.first_op.op == "loss_scale"
    assert "collapse" in ev.first_op.kind and ev.scaler_skips == 17
    r.reset()
    c = r.check(big, 1)
    assert c.event and c.phase == "update" and c.first_op.op == "loss_scale" and c.scaler_skips == 17
    _, r32 = runner("make_scaled")                            # fp32, no scaler: finite
    assert not r32.check(big, 1).event


def test_program_owned_scaler_skips_are_counted_and_its_float32_replay_is_float32():
    """mp_cnn_scaler runs its own AMP loop (``torch.autocast(enabled=amp)`` and a GradScaler in its
    train_step; ``amp`` is a factory argument, True by default): the float32 re-check builds it as
    the factory does and replays it with every autocast region disabled, and the skips its own
    scaler makes on the found values are counted (the docstring's 7: 16 -> 0.125)."""
    from campaigns.targets.mp_cnn_scaler import witness
    from fuzz_core.precision import precision_facts

    spec = TargetSpec("mp_cnn_scaler", "campaigns/targets/mp_cnn_scaler.py:make_target")
    r = build_runner(spec, RunnerOptions(precision=FP16))
    assert r.scaler is None and len(r.program_scalers) == 1       # the engine adds no scaler of its own
    scaler = r.program_scalers[0]
    batch = witness(r.target)
    r.reset()
    start = scaler.get_scale()
    c = r.check(batch, 0)
    assert c.event and c.phase == "backward" and c.scaler_skips == 7, c
    r.reset()
    assert scaler.get_scale() == start                               # reset with the rest of the state
    sampled = r.sample(np.random.default_rng(3))
    assert r.check(sampled, 0).scaler_skips == 0
    r32 = build_runner(spec, RunnerOptions())                        # fp32 campaign: the program's amp is still on
    assert r32.check(batch, 0).event
    r32.reset()
    with r32.float32():
        assert not r32.check(batch, 0).event                         # its float32 program: finite
        assert not torch.is_autocast_enabled("cpu")
    with torch.autocast("cpu", dtype=torch.float16):                 # and autocast works again after it
        assert torch.is_autocast_enabled("cpu")
    (site,) = [s for s in discover_sites(r, 0) if s.searched][:1]
    facts = precision_facts(r, spec, site, batch, None, 0, c.first_op.to_dict())
    assert facts["precision_only"] is True and facts["scaler_skips"] == 7


def test_state_saves_and_restores_the_scale():
    _, r = runner("make_scaled", SCALED)
    (site,) = half_sites(r)
    r.evaluate({"x": np.array([[100.0]], np.float32)}, site, grad=True, train=True, seed=1)
    state = r.get_state()
    r.reset()
    r.set_state(state)
    assert r.scaler.get_scale() == 2.0


# ---- the campaign ---------------------------------------------------------------------------------

def campaign(tmp_path: Path, precision: str, entry: str = f"{SUBJECTS}:make_linear") -> Path:
    path = tmp_path / "mp.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: mp
        targets:
          - {{name: lin, entry: {entry}}}
        search: {{strategy: adaptive, max_steps: 40, seed: 0}}
        scheduler: {{quantum: 10}}
        resources: {{num_actors: 0}}
        device: cpu
        time_limit_s: 120
        output: {tmp_path / 'runs'}
        tracking: {{enabled: false}}
        """) + precision)
    return path


def test_campaign_with_precision_finds_records_and_replays_in_a_fresh_process(tmp_path: Path, capsys):
    path = campaign(tmp_path, "precision: {autocast: fp16}\n")
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=True, local=True))
    assert outcome.exit_code == 1
    out = capsys.readouterr()
    assert "precision-only (float16)" in out.out + out.err
    summary = json.loads(Path(outcome.summary).read_text())
    assert summary["campaign"]["config"]["precision"] == {"autocast": "fp16", "grad_scaler": False, "policy": None}
    (site,) = [s for s in summary["sites"] if s["status"] == "found"]
    assert site["op"] == "half_overflow"
    folder = outcome.run_dir / site["finding"]
    report = json.loads((folder / "finding.json").read_text())
    assert report["precision"]["autocast"] == "fp16" and report["precision_only"] is True
    assert report["overflow"]["dtype"] == "float16" and report["overflow"]["excess"] > 1
    validate(folder / "finding.json")                    # the published schema holds the precision facts
    (row,) = read_findings(tmp_path / "runs", campaign="mp").to_pylist()   # and so does the Parquet row
    assert row["precision"] == "fp16" and row["precision_only"] is True and row["scaler_skips"] is None
    assert row["overflow_dtype"] == "float16" and row["overflow_limit"] == 65504.0
    assert row["overflow_value"] == pytest.approx(report["overflow"]["value"])
    assert row["overflow_excess"] == pytest.approx(report["overflow"]["excess"]) and row["overflow_excess"] > 1
    assert "PRECISION = " in (folder / "test_reproducer.py").read_text()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    replay = subprocess.run([sys.executable, "-m", "orchestrator.cli", "replay", str(folder)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "reproduced" in replay.stdout and "half_overflow" in replay.stdout
    # the regression test written beside it fails (the bug is there) under the same autocast
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(folder / "test_reproducer.py")], capture_output=True, text=True, env=env, timeout=120)
    assert test.returncode == 1 and "half_overflow" in test.stdout


def test_same_campaign_in_fp32_is_clean(tmp_path: Path):
    path = campaign(tmp_path, "")
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False, local=True))
    assert outcome.exit_code == 0


def test_precision_columns_of_a_finding_row():
    """The Parquet row of a finding carries its precision facts; a float32 finding's are null, and the
    schema of finding.json accepts a report with every fact filled or null."""
    import jsonschema

    from fuzz_core.findings import Finding
    from fuzz_core.sites import OpSite
    from orchestrator.observers.parquet import FINDING_SCHEMA, precision_columns
    from orchestrator.schemas import schema

    site = OpSite("abc123", "t", "half_overflow", "sum", "overflow", "t.py:3", 0, True)
    base = dict(site=site, target={"name": "t", "entry": "t.py:make", "args": {}, "framework": "torch", "seed": 0},
                inputs={"x": np.zeros((1, 2), np.float32)}, state=None, step=3, step_seed=1, strategy="adaptive",
                first_op=None, trigger="inputs", training=True, bounds={"x": (0.0, 1.0)})
    scaled = Finding(**base, precision=SCALED.to_dict(), precision_only=False, scaler_skips=7,
                     overflow={"dtype": "float16", "value": None, "limit": None, "excess": None})
    cols = precision_columns(scaled.report())
    assert cols == {"precision": "fp16+grad_scaler", "precision_only": False, "overflow_dtype": "float16",
                    "overflow_value": None, "overflow_limit": None, "overflow_excess": None, "scaler_skips": 7}
    assert set(cols) <= set(FINDING_SCHEMA.names)
    assert precision_columns(Finding(**base).report()) == {}           # float32: the columns stay null
    keras = Finding(**base, precision=Precision(policy="mixed_bfloat16").to_dict(), precision_only=None)
    assert precision_columns(keras.report())["precision"] == "mixed_bfloat16"
    validator = jsonschema.Draft202012Validator(schema("finding.json"))
    for f in (scaled, Finding(**base), keras):
        validator.validate(json.loads(json.dumps(f.report())))
    bad = json.loads(json.dumps(scaled.report()))
    bad["scaler_skips"] = -1
    assert not validator.is_valid(bad)


@pytest.mark.parametrize("text,field,value", [
    ("precision: {autocast: fp8}\n", "precision.autocast", "'fp8'"),
    ("precision: {grad_scaler: true}\n", "precision.grad_scaler", "True"),
    ("precision: {policy: float16}\n", "precision.policy", "'float16'"),
    ("precision: {autocst: fp16}\n", "precision.autocst: unknown field", "'fp16'"),
    ("precision: fp16\n", "precision", "'fp16'"),
])
def test_bad_precision_is_a_one_line_error_naming_file_field_and_value(tmp_path: Path, text, field, value):
    path = campaign(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_campaign(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(path))
    assert field in message and f"(got {value})" in message, message
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2 and field in result.output
