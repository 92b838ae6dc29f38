"""Searched weights in a program that trains (``search_weights``): the search steps from the weights
the program's training step left, and lands on divisors that are weights or sums of weights.

The shape of GRIST's SC_DNN programs (TF ID_28): a layer divides by the column sums ``S = sum |w|``
of its weights and by a trained gain, and Adam at 0.1 moves every weight by about 0.1 after each
forward pass. Two things kept ``adaptive`` off those divisions:

- its Polyak step removed the margin it measured, from weights that training had already moved by as
  much again (the step overshot by the training's own move, every step);
- a column sum reaches 0 only with all its entries at exactly 0, where a gradient step moves each
  entry by the same amount and lands on none.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fuzz_core import Target
from fuzz_core.backends.base import RunnerOptions
from fuzz_core.backends.torch import make_runner
from fuzz_core.search import SearchConfig, SiteSearch
from fuzz_core.status import SiteStatus


def _scaled_layer(guard: float) -> Target:
    """``(x w / S) gain / (gain + guard)``, S the column sums of ``|w|`` (an SC_DNN-like layer)."""
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.randn(16, 4))
    model.gain = torch.nn.Parameter(torch.rand(4) * 16)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)

    def program(batch):
        s = model.w.abs().sum(0)
        z = (batch["x"] @ model.w) / s                    # the column-sum division
        up = (z * model.gain) / (model.gain + guard)       # the gain division
        return ((up - batch["y"]) ** 2).mean()

    def sample(rng: np.random.Generator):
        return {"x": rng.random((8, 16), dtype=np.float32), "y": rng.random((8, 4), dtype=np.float32)}

    return Target(program=program, sample=sample, model=model, optimizer=opt,
                  bounds={"x": (0.0, 1.0)}, search=["x"])


def _search(guard: float, op: str, line_has: str, budget: int = 60):
    runner = make_runner("scaled", _scaled_layer(guard), RunnerOptions(search_weights=True))
    batch = dict(runner.sample(np.random.default_rng(0)))
    sites = [s for s in runner.discover(batch, 0) if s.op == op and s.searched]
    site = next(s for s in sites if line_has in runner_source_line(s.location))
    search = SiteSearch(runner, site, SearchConfig(strategy="adaptive", max_steps=budget, seed=0,
                                                    search_weights=True, reach_steps=0))
    return search, search.run(budget)


def runner_source_line(location: str) -> str:
    path, _, line = location.rpartition(":")
    return open(path).read().splitlines()[int(line) - 1]


def test_a_column_sum_of_weights_is_zeroed_whole():
    search, result = _search(1e-7, "div", "column-sum")
    assert result.status is SiteStatus.FOUND, f"missed (best {result.best_loss:.3g})"
    assert result.candidate.weights_searched
    w = result.candidate.state["model.w"]
    assert (np.abs(w).sum(0) == 0).any(), "a whole column of w at 0: its sum is the zero divisor"
    assert result.steps <= 10, f"the support mutation is tried at the first point ({result.steps} steps)"


def test_a_guarded_gain_is_driven_to_minus_the_guard_through_the_training():
    """``1 / (gain + 1e-7)``: the gain must land on -1e-7 exactly, while Adam moves it by ~0.1 after
    every forward pass. From the trained weights the step removes the margin predicted there."""
    search, result = _search(1e-7, "div", "gain division")
    assert result.status is SiteStatus.FOUND, f"missed (best {result.best_loss:.3g})"
    gain = result.candidate.state["model.gain"]
    assert (gain.astype(np.float32) + np.float32(1e-7) == 0).any()
    assert result.steps <= 30, result.steps


def test_train_shift_is_the_margins_first_order_change_under_the_training_step():
    # a guard of 1, not 1e-7: with gain + 1e-7 == gain in float32 the loss's gradient on the gain,
    # z / (g + e) - z g / (g + e)^2, cancels to exactly 0 on some CPUs, and Adam leaves the gain alone
    runner = make_runner("scaled", _scaled_layer(1.0), RunnerOptions(search_weights=True))
    batch = dict(runner.sample(np.random.default_rng(0)))
    site = next(s for s in runner.discover(batch, 0) if s.op == "div" and s.searched
                and "gain division" in runner_source_line(s.location))
    search = SiteSearch(runner, site, SearchConfig(max_steps=10, search_weights=True))
    search._end = 10
    before = {k: v.copy() for k, v in search.values.items()}
    values = dict(search.values)
    ev = search.evaluate(values)
    assert ev.weights is not None and ev.trained
    expected = sum(float(np.sum(ev.grads[k].astype(np.float64) * (ev.weights[k] - before[k])))
                   for k in ev.weights if k in ev.grads)
    assert ev.train_shift == pytest.approx(expected)
    assert ev.train_shift != 0.0, "Adam moved the gain the margin depends on"
    # measured again at the trained weights, the margin is about the predicted one (the divisor is linear)
    again = search.evaluate(dict(values), grad=False)
    assert again.hard == pytest.approx(ev.hard + ev.train_shift, rel=1e-4, abs=1e-6)


def test_input_only_searches_are_not_touched_by_the_weight_mutation():
    from fuzz_core.strategies.adaptive.steps import zero_support
    runner = make_runner("scaled", _scaled_layer(1e-7), RunnerOptions())
    batch = dict(runner.sample(np.random.default_rng(0)))
    site = next(s for s in runner.discover(batch, 0) if s.op == "div" and s.searched)
    search = SiteSearch(runner, site, SearchConfig(max_steps=5))
    search._end = 5
    ev = search.evaluate(dict(search.values))
    assert ev.train_shift == 0.0
    assert zero_support(search.values, ev.grads, search.bounds) is None


ID_28 = "benchmarks/grist_suite/tf_programs/id28_sc_dnn.py:make_target"


@pytest.mark.tf
@pytest.mark.parametrize("variant, bug", [("creg", "ID_28a"), ("creg_div2", "ID_28b")])
def test_grists_sc_dnn_divisions_are_found_by_searching_its_weights(variant, bug):
    """GRIST's SC_DNN (TF ID_28; not written here): the division by a gain guarded by ``+1e-7``
    (ID_28a) and by the column sums of ``w1`` (ID_28b), searched through the weights as GRIST did,
    under Adam at 0.1. Both ended at 1000 steps without a finding before."""
    pytest.importorskip("tensorflow")
    import os

    from benchmarks.grist_suite.model import marked_lines
    from fuzz_core.engine import TargetSpec, build_runner, discover_sites

    options = RunnerOptions(search_weights=True)
    runner = build_runner(TargetSpec("grist-id28", ID_28, {"variant": variant}, framework="tensorflow", seed=0,
                                     base_dir=os.getcwd()), options)
    lines = marked_lines(ID_28)[bug]
    site = next(s for s in discover_sites(runner, 0) if s.searched and s.op == "div"
                and int(s.location.rpartition(":")[2]) in lines)
    result = SiteSearch(runner, site, SearchConfig(strategy="adaptive", max_steps=40, seed=0, search_weights=True,
                                                    reach_steps=0)).run(40)
    assert result.status is SiteStatus.FOUND, f"{bug} missed (best {result.best_loss:.3g})"
    assert result.candidate.first_op.location == site.location


def _unreachable_mlp(hidden: int) -> Target:
    """A small MLP that trains, with searched weights whose first dimension (``hidden``) is not the
    batch's (8), and a ``log`` whose input never falls below 0.5 (the last row's: the weakest): the
    search spends its whole budget, so every move it has (rides of the training, rides on the
    program's own data) is taken."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def program(batch):
        p = torch.softmax(model(batch["x"]), 1)
        floor = torch.linspace(1.0, 0.5, 8)[:, None]       # row 7 is always the nearest the edge
        return -(batch["y"] * torch.log(p + floor)).sum(1).mean()

    def sample(rng: np.random.Generator):
        return {"x": rng.random((8, 6), dtype=np.float32),
                "y": np.eye(3, dtype=np.float32)[rng.integers(0, 3, 8)]}

    return Target(program=program, sample=sample, model=model, optimizer=opt,
                  bounds={"x": (0.0, 1.0)}, search=["x"])


@pytest.mark.parametrize("hidden", [1, 16])
def test_searched_weights_shorter_or_longer_than_the_batch_survive_a_whole_budget(hidden):
    """Issue 56, item 4: a ride on the program's own data put the site's first batch back and copied the
    weakest batch row into every searched value, weights included: an IndexError where a weight has
    fewer rows than the batch, weight rows silently overwritten where it has more. Inputs and weights
    are different spaces: the batch goes back to its first data, the weights stay where the search
    left them."""
    runner = make_runner("mlp", _unreachable_mlp(hidden), RunnerOptions(search_weights=True))
    batch = dict(runner.sample(np.random.default_rng(0)))
    site = next(s for s in runner.discover(batch, 0) if s.op == "log" and s.searched)
    search = SiteSearch(runner, site, SearchConfig(strategy="adaptive", max_steps=1200, seed=0,
                                                    search_weights=True, reach_steps=0))
    result = search.run(1200)
    assert result.status is SiteStatus.EXHAUSTED, result.status
    assert result.steps == 1200
    assert any(k.startswith("weight:") for k in search.values), "weights are searched"


def test_a_ride_on_the_programs_own_data_leaves_searched_weights_where_they_are():
    """A ride after a give-up goes on the program's own data: the batch back to the site's first one, the
    weakest row kept; a weight with more rows than the batch (16 > 8) was silently overwritten at the
    weakest row's index."""
    from fuzz_core.strategies.adaptive import Adaptive

    runner = make_runner("mlp", _unreachable_mlp(16), RunnerOptions(search_weights=True))
    site = next(s for s in runner.discover(dict(runner.sample(np.random.default_rng(0))), 0)
                if s.op == "log" and s.searched)
    search = SiteSearch(runner, site, SearchConfig(strategy="adaptive", max_steps=200, seed=0,
                                                    search_weights=True, reach_steps=0))
    while "current" not in search.cache:
        search.run(1)
    search.values["weight:0.weight"] = search.values["weight:0.weight"] + 1.0   # today's, unlike the first
    today = {k: v.copy() for k, v in search.values.items()}
    strategy = Adaptive()
    ctx = strategy._open(search)
    ride = next(t for t in ctx.tactics if t.name == "ride")
    ride.st.rides = 1                       # a ride gave up: the next starts on the first batch
    ride._start(ctx, "box", search.cache["current"])
    strategy._close(ctx)
    for k, v in today.items():
        if k.startswith("weight:"):
            assert np.array_equal(search.values[k], v), f"{k} changed"
    assert np.array_equal(search.values["x"][:7], search.original["x"][:7]), "the first batch is back"
    assert np.array_equal(search.values["x"][7], today["x"][7]), "the weakest row is kept"
