"""The single-process engine on small programs written here: determinism, errors, replay."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fuzz_core.engine import TargetSpec, build_runner, confirm, confirmed, finding_from, search_site
from fuzz_core.findings import load_finding, write_finding
from fuzz_core.search import SearchConfig
from orchestrator.run.campaign import RunOptions, run_campaign
from orchestrator.config import load_campaign

DROPOUT = '''
import numpy as np, torch
from fuzz_core import Target

def make_target(seed=0, raise_above=None):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4))
    def program(b):
        if raise_above is not None and float(b["x"].max()) > raise_above:
            raise RuntimeError("the program refuses inputs above %s" % raise_above)
        noise = torch.randn(b["x"].shape[0], 4) * 0.1          # randomness inside the program
        p = torch.softmax(net(b["x"]) + noise, 1)
        return -(b["y"] * torch.log(p)).sum(1).mean()
    def sample(rng):
        return {"x": rng.uniform(-1, 1, (6, 16)).astype(np.float32),
                "y": np.eye(4, dtype=np.float32)[rng.integers(0, 4, 6)]}
    return Target(program=program, sample=sample, model=net, bounds={"x": (-60.0, 60.0)}, search=["x"])

def make_broken(seed=0):
    net = torch.nn.Linear(3, 2)
    return Target(program=lambda b: net(b["x"]).sum(), sample=lambda rng: {"x": np.zeros((2, 5), np.float32)},
                  model=net, search=["x"])
'''


@pytest.fixture()
def module(tmp_path: Path) -> Path:
    path = tmp_path / "dropout_prog.py"
    path.write_text(DROPOUT)
    return path


def _site(runner, op="log"):
    batch = runner.sample(np.random.default_rng(0))
    return next(s for s in runner.discover(batch, 0) if s.op == op)


def test_randomness_inside_the_program_is_deterministic_and_replays(module: Path):
    results = []
    for _ in range(2):
        spec = TargetSpec("drop", f"{module}:make_target")
        runner = build_runner(spec)
        site = _site(runner)
        config = SearchConfig("adaptive", 100, seed=7)
        res = search_site(runner, site, config)
        assert res.candidate is not None, res.trace
        finding = finding_from(runner, spec, site, config, res.candidate, res.seconds)
        assert finding is not None
        results.append((res.steps, res.candidate.seed, finding.inputs["x"].copy()))
    assert results[0][0] == results[1][0] and results[0][1] == results[1][1]
    np.testing.assert_array_equal(results[0][2], results[1][2])


def test_saved_finding_replays_on_a_fresh_runner(module: Path, tmp_path: Path):
    spec = TargetSpec("drop", f"{module}:make_target")
    runner = build_runner(spec)
    site = _site(runner)
    config = SearchConfig("adaptive", 100)
    res = search_site(runner, site, config)
    folder = write_finding(finding_from(runner, spec, site, config, res.candidate, res.seconds), tmp_path / "f")
    loaded = load_finding(folder)
    fresh = build_runner(TargetSpec("drop", f"{module}:make_target"))
    result = confirm(fresh, loaded.site, loaded.inputs, loaded.state, loaded.report["step_seed"])
    assert confirmed(result, loaded.site)
    assert result.first_op.op == "log"
    # the noise is drawn per batch row, so a smaller batch sees other noise: minimisation keeps what replays
    assert loaded.report["minimised"]["batch_size"] <= loaded.report["minimised"]["original_batch_size"]


BF16 = '''
import numpy as np, torch
from fuzz_core import Target

def make_target(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(torch.bfloat16)
    opt = torch.optim.Adam(net.parameters(), lr=0.5)
    def program(b):                     # a model kept in bfloat16, as pure-bf16 training keeps it
        return torch.log(torch.sigmoid(net(b["x"].to(torch.bfloat16)))).mean()   # training drives it to 0
    return Target(program=program, sample=lambda rng: {"x": rng.uniform(-1, 1, (8, 8)).astype(np.float32)},
                  model=net, optimizer=opt, bounds={"x": (-1.0, 1.0)}, search=["x"])
'''


def test_a_bfloat16_model_is_searched_and_its_finding_replays_with_the_trained_weights(tmp_path: Path):
    """NumPy has no bfloat16: the model's weights and Adam's moments are kept as float32 (each bf16
    value is exactly one) and cast back on restore. Before, building the runner raised TypeError
    ("unsupported ScalarType BFloat16") from CDeepFuzz itself, an internal error on any bf16 model."""
    import torch

    (tmp_path / "bf16_prog.py").write_text(BF16)
    spec = TargetSpec("bf16", f"{tmp_path / 'bf16_prog.py'}:make_target")
    runner = build_runner(spec)
    site = _site(runner)
    config = SearchConfig("adaptive", 200)
    res = search_site(runner, site, config)
    assert res.candidate is not None, res.trace
    folder = write_finding(finding_from(runner, spec, site, config, res.candidate, res.seconds), tmp_path / "f")
    loaded = load_finding(folder)
    assert loaded.state is not None and loaded.state["model.0.weight"].dtype == np.float32
    fresh = build_runner(spec)
    result = confirm(fresh, loaded.site, loaded.inputs, loaded.state, loaded.report["step_seed"])
    assert confirmed(result, loaded.site)
    fresh.set_state(loaded.state)
    weight = fresh.target.model[0].weight
    assert weight.dtype == torch.bfloat16
    assert torch.equal(weight.detach(), torch.from_numpy(loaded.state["model.0.weight"]).to(torch.bfloat16))
    assert torch.equal(weight.detach().float(), torch.from_numpy(loaded.state["model.0.weight"]))   # exact


def test_program_that_raises_is_an_error_with_traceback_and_the_run_goes_on(module: Path, tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: errs
        targets:
          - {{name: ok, entry: '{module}:make_target'}}
          - {{name: raises, entry: '{module}:make_target', args: {{raise_above: 30.0}}}}
          - {{name: broken, entry: '{module}:make_broken'}}
        search: {{max_steps: 40}}
        resources: {{num_actors: 0}}
        device: cpu
        tracking: {{enabled: false}}
        output: {tmp_path / 'out'}
        """))
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False))
    assert outcome.exit_code == 3
    summary = json.loads(outcome.summary.read_text())
    targets = {t["name"]: t for t in summary["targets"]}
    assert targets["broken"]["status"] == "error" and "Traceback" in targets["broken"]["traceback"]
    assert "mat1 and mat2" in targets["broken"]["error"]
    sites = {s["target"]: s for s in summary["sites"]}
    assert sites["ok"]["status"] == "found"
    assert sites["raises"]["status"] == "error"
    assert "refuses inputs above" in sites["raises"]["error"] and "Traceback" in sites["raises"]["traceback"]


MUTATE = '''
import numpy as np
from fuzz_core.strategies.adaptive.steps import MUTATIONS, mutate
x = np.linspace(0.1, 0.9, 32, dtype=np.float32).reshape(4, 8)
print([mutate(kind, x, [1], 0.0, 1.0, salt).tobytes().hex() for salt, kind in enumerate(MUTATIONS)])
'''


def test_mutations_are_the_same_in_another_process():
    """A search must not depend on per-process state such as ``hash()`` of bytes
    (randomised by PYTHONHASHSEED): a site resumed on another actor, or a campaign run
    again, must take the same steps. The jitter mutation draws its noise from the values."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    outs = []
    for hashseed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=str(root))
        proc = subprocess.run([sys.executable, "-c", MUTATE], cwd=root, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(proc.stdout)
    assert outs[0] == outs[1]
