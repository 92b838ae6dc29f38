"""The whole training step under watch: no NaN goes unreported, and each is named by its phase.

A non-finite value anywhere in a step (a forward op, the loss, a gradient of the program's own
backward, the optimizer's update) ends the search with a candidate named by the first op that
produced it; a candidate that fresh replays do not always reproduce is a flaky finding, never
dropped; a NaN margin is never "at the edge".
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fuzz_core import Target
from fuzz_core.backends.base import Evaluation
from fuzz_core.backends.torch import TorchRunner
from fuzz_core.catalogue import DEFAULT_CATALOGUE
from fuzz_core.engine import TargetSpec, discover_sites, finding_from
from fuzz_core.errors import classify
from fuzz_core.search import SearchConfig, SiteSearch, suspect_loss
from fuzz_core.status import ExitReason

HERE = "tests/test_step_watch.py"


def _line(marker: str) -> int:
    with open(HERE) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}"))


def vae(seed: int = 0, eps: float = 0.0, clamp: float | None = None) -> Target:
    """A VAE's std = sqrt(var): var = exp(logvar) underflows to 0 for logvar < -104, sqrt(0) is
    finite but its gradient is not, and the program's own backward turns it into NaN weights."""
    torch.manual_seed(seed)
    enc, dec = torch.nn.Linear(6, 4), torch.nn.Linear(2, 6)
    model = torch.nn.ModuleList([enc, dec])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def program(batch):
        h = enc(batch["x"])
        mu, logvar = h[:, :2], h[:, 2:]
        if clamp is not None:
            logvar = logvar.clamp(-clamp, clamp)
        std = torch.sqrt(torch.exp(logvar) + eps)   # VAE-SQRT
        recon = dec(mu + std * batch["eps"])
        return ((recon - batch["x"]) ** 2).mean() + (mu ** 2 + std ** 2).mean()

    def sample(rng):
        return {"x": rng.uniform(0, 1, (8, 6)).astype(np.float32), "eps": rng.normal(size=(8, 2)).astype(np.float32)}

    return Target(program=program, sample=sample, model=model, optimizer=opt, bounds={"x": (-100.0, 100.0)},
                  search=["x"])


def vae_guarded(seed: int = 0) -> Target:
    """The usual guards: an eps inside the sqrt, and a log-variance kept where exp is finite."""
    return vae(seed, eps=1e-6, clamp=30.0)


def adam_without_eps(seed: int = 0, eps: float = 0.0) -> Target:
    """Adam with eps = 0: a weight whose gradient is exactly 0 gets 0 / 0 = NaN from its update."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=eps)

    def program(batch):  # ADAM-PROGRAM
        return torch.log(torch.sigmoid(net(batch["x"])) + 1.0).mean()

    return Target(program=program, sample=lambda rng: {"x": rng.uniform(-1, 1, (4, 4)).astype(np.float32)},
                  model=net, optimizer=opt, bounds={"x": (-1.0, 1.0)}, search=["x"])


def adam_guarded(seed: int = 0) -> Target:
    return adam_without_eps(seed, eps=1e-8)


def _search(make, op: str | None = None, steps: int = 60, strategy: str = "adaptive"):
    runner = TorchRunner("t", make())
    sites = [s for s in discover_sites(runner, 0) if op is None or s.op == op]
    config = SearchConfig(strategy, steps, 0)
    return runner, sites, [(s, SiteSearch(runner, s, config).run(steps)) for s in sites], config


def test_sqrt_at_zero_in_a_vae_is_found_in_the_backward_phase_and_named_by_the_forward_line():
    runner, sites, results, config = _search(vae, "sqrt_grad")
    (site, res), = results
    cand = res.candidate
    assert cand is not None and cand.phase == "backward" and cand.own, "the sqrt_grad site triggered"
    assert res.steps <= 10
    assert cand.first_op.op == "sqrt" and cand.first_op.location == f"{HERE}:{_line('VAE-SQRT')}"
    finding = finding_from(runner, TargetSpec("t", f"{HERE}:vae"), site, config, cand, res.seconds)
    assert finding.replays == (3, 3) and finding.phase == "backward"
    assert finding.state is None or all(np.isfinite(v).all() for k, v in finding.state.items()
                                        if np.issubdtype(v.dtype, np.floating)), "the state the bad step began from"


def test_the_vae_guarded_inside_the_sqrt_stays_clean():
    _, sites, results, _ = _search(vae_guarded, steps=60)
    assert sites
    assert all(res.candidate is None for _, res in results), [r.candidate.first_op for _, r in results if r.candidate]


def test_adam_without_eps_is_found_in_the_update_phase():
    runner, sites, results, config = _search(adam_without_eps, "log", steps=10)
    (site, res), = results
    cand = res.candidate
    assert cand is not None and cand.phase == "update" and not cand.own
    assert cand.first_op.op == "update" and "Adam" in cand.first_op.kind
    finding = finding_from(runner, TargetSpec("t", f"{HERE}:adam_without_eps"), site, config, cand, res.seconds)
    assert finding.replays == (3, 3)
    assert finding.first_op["op"] == "update" and not finding.site_triggered
    assert finding.first_op["location"] == f"{HERE}:{_line('ADAM-PROGRAM')}"   # the program it trains


def test_adam_with_eps_stays_clean():
    _, _, results, _ = _search(adam_guarded, steps=30)
    assert all(res.candidate is None for _, res in results)


@pytest.mark.parametrize("hard", [math.nan, -math.nan])
def test_a_nan_margin_is_never_at_the_edge(hard):
    ev = Evaluation(seen=True, hard=hard, log_loss=math.nan, triggered=False, event=False)
    assert suspect_loss(ev, DEFAULT_CATALOGUE["log"]) == math.inf
    assert suspect_loss(ev, DEFAULT_CATALOGUE["sqrt"]) == math.inf


CALLS = [0]


def flaky(seed: int = 0) -> Target:
    """NaN on every fourth call in the process: randomness the engine cannot re-seed."""
    def program(batch):
        CALLS[0] += 1
        x = batch["x"] if CALLS[0] % 4 else -batch["x"]
        return torch.sqrt(x).mean()

    return Target(program=program, sample=lambda rng: {"x": rng.uniform(1, 2, (4, 3)).astype(np.float32)},
                  bounds={"x": (1.0, 2.0)}, search=["x"])


def test_a_candidate_that_replays_do_not_always_reproduce_is_a_flaky_finding():
    CALLS[0] = 0
    runner, sites, results, config = _search(flaky, "sqrt", steps=10, strategy="random")
    (site, res), = results
    assert res.candidate is not None
    finding = finding_from(runner, TargetSpec("t", f"{HERE}:flaky"), site, config, res.candidate, res.seconds)
    assert finding.flaky and finding.replays[0] < finding.replays[1] == 3
    report = finding.report()
    assert report["flaky"] is True and report["replays"] == {"reproduced": finding.replays[0], "of": 3}
    assert not finding.minimised, "a reproducer that does not always replay is not minimised"


def _user_raises(batch):
    raise ValueError("the user's own message")


def test_an_exception_of_the_program_is_a_target_error_and_one_of_the_tool_an_internal_error():
    target = Target(program=lambda b: _user_raises(b), sample=lambda rng: {"x": np.ones((2, 2), np.float32)},
                    search=["x"])
    runner = TorchRunner("t", target)
    with pytest.raises(ValueError) as info:
        runner.discover(runner.sample(np.random.default_rng(0)), 0)
    assert classify(info.value) is ExitReason.TARGET_ERROR

    def tool_bug(batch):      # a program calling into the tool's own code, which fails there
        from fuzz_core.backends.base import bisect_last
        return bisect_last(None, 0.0, 1.0, None, None)

    runner = TorchRunner("t", Target(program=tool_bug, sample=target.sample, search=["x"]))
    with pytest.raises(TypeError) as info:
        runner.discover(runner.sample(np.random.default_rng(0)), 0)
    assert classify(info.value) is ExitReason.INTERNAL_ERROR


def test_an_error_raised_by_torch_inside_the_recorder_is_the_programs():
    def program(batch):
        return batch["x"] @ torch.ones(5, 1)       # a shape mismatch: torch raises through the recorder

    runner = TorchRunner("t", Target(program=program, sample=lambda rng: {"x": np.ones((2, 3), np.float32)},
                                     search=["x"]))
    with pytest.raises(RuntimeError) as info:
        runner.discover(runner.sample(np.random.default_rng(0)), 0)
    assert classify(info.value) is ExitReason.TARGET_ERROR


def clamped_log(seed: int = 0) -> Target:
    """log(x + 52) with x within [-31, 31]: never triggered inside the bounds, at -52 outside them."""
    def program(batch):
        return torch.log(batch["x"] + 52.0).sum()

    return Target(program=program, sample=lambda rng: {"x": rng.uniform(-1, 1, (4, 2)).astype(np.float32)},
                  bounds={"x": (-31.0, 31.0)}, search=["x"])


def test_a_site_out_of_reach_says_where_its_nearest_trigger_lies():
    _, _, results, _ = _search(clamped_log, "log", steps=30)
    (site, res), = results
    assert res.candidate is None and res.status.value == "exhausted"
    reach = res.reach
    assert reach["triggered"] and reach["probe_steps"] <= 40
    out = reach["outside"]
    assert out["input"] == "x" and out["value"] <= -52.0 and out["bounds"] == [-31.0, 31.0]
    assert reach["message"].startswith("would trigger if x[") and "bounds are [-31, 31]" in reach["message"]
    assert res.steps == 30, "the probe's steps are not the site's"


# -- the cheap checks of a step ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None])
def test_the_step_checks_see_every_nonfinite_value_and_no_other(dtype, bad):
    """The update/gradient check (a sum first, settled by both ends) and the input check of a
    searched call (both ends) find inf, -inf and NaN in any float dtype, and pass finite values,
    among them finite values whose sum overflows the dtype (a false alarm of the sum alone)."""
    from fuzz_core.backends.torch import _maybe_nonfinite
    from fuzz_core.backends.torch_recorder import _all_finite, any_nonfinite
    from fuzz_core.backends.torch_recorder import nonfinite as _nonfinite

    big = torch.finfo(dtype).max / 2
    tensors = [torch.ones(3, dtype=dtype), torch.full((64,), big, dtype=dtype), torch.empty(0, dtype=dtype)]
    if bad is not None:
        tensors[0][1] = bad
    expected = bad is not None
    assert bool(_nonfinite(tensors)) is expected
    assert bool(_maybe_nonfinite(tensors)) or not expected     # only False is conclusive
    assert bool(_maybe_nonfinite(tensors[:1])) is expected
    if dtype in (torch.float32, torch.float64):                # a sum past the range: a false alarm
        assert bool(_maybe_nonfinite(tensors[1:])) and not bool(_nonfinite(tensors[1:]))
    assert bool(_all_finite(tensors)) is not expected
    assert bool(any_nonfinite(tensors)) is expected


def test_a_nan_made_inside_ops_that_cannot_make_one_is_named_by_the_op_that_made_it():
    """relu and reshapes are not checked for NaN (they cannot make one); the NaN they carry is
    named by the op before them, and a NaN made by ``0 * inf`` after a relu by the ``mul``."""
    def first(program, x):
        target = Target(program=program, sample=lambda rng: {"x": x}, search=["x"], bounds={"x": (-1e30, 1e30)})
        runner = TorchRunner("t", target)
        return runner.check({"x": x}, seed=0).first_op

    x = np.array([1.0, -2.0, 3.0], dtype=np.float32)
    op = first(lambda b: torch.relu((b["x"] - b["x"]) * float("inf")).reshape(3, 1).sum(), x)
    assert op is not None and op.op == "mul", op
    op = first(lambda b: (torch.relu(b["x"]) * torch.tensor([1.0, float("inf"), 1.0])).reshape(-1).sum(), x)
    assert op is not None and op.op == "mul", op
