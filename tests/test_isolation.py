"""Every site starts from the state the factory built, whatever the program's shape.

The programs here keep their state in the three shapes users write: an ``nn.Module``, plain
tensors handed to an optimizer (a logistic regression trained by hand), and tensors captured
in ``program``'s closure (or the script's globals). Each test searches one site long enough to
train the program, then checks that the next site starts from the factory's state: the same
trace as a site searched first in a fresh build. A program that keeps state the engine cannot
reach (a cache it fills between calls) is caught by the write watch, and every site then gets
a build of its own.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fuzz_core import Target
from fuzz_core.backends.torch import TorchRunner
from fuzz_core.engine import TargetSpec, confirm, confirmed, discover_sites, finding_from
from fuzz_core.search import SearchConfig, SiteSearch
from orchestrator.worker import Worker, WorkerOptions

GLOBAL_W = torch.zeros(4, 1, requires_grad=True)     # a script's module-level weights


def _sample(rng: np.random.Generator) -> dict:
    return {"x": rng.uniform(0, 10, (8, 4)).astype(np.float32),
            "y": (rng.random((8, 1)) > 0.5).astype(np.float32)}


def plain_tensors(seed: int = 0) -> Target:
    """Logistic regression by hand: W and b are plain tensors, only the optimizer knows them."""
    torch.manual_seed(seed)
    W = torch.zeros(4, 1, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([W, b], lr=1.0)

    def program(batch):
        h = torch.sigmoid(batch["x"] @ W + b)
        return -(batch["y"] * torch.log(h) + (1 - batch["y"]) * torch.log(1 - h)).mean()

    return Target(program=program, sample=_sample, optimizer=opt, bounds={"x": (0.0, 10.0)}, search=["x"])


def closure_captured(seed: int = 0) -> Target:
    """The weights live in the closure; a train_step updates them in place, no optimizer object."""
    torch.manual_seed(seed)
    state = {"W": torch.zeros(4, 1), "b": torch.zeros(1)}

    def program(batch):
        h = torch.sigmoid(batch["x"] @ state["W"] + state["b"])
        return -(batch["y"] * torch.log(h) + (1 - batch["y"]) * torch.log(1 - h)).mean()

    def train_step(batch):
        h = torch.sigmoid(batch["x"] @ state["W"] + state["b"])
        err = h - batch["y"]
        state["W"].sub_(batch["x"].T @ err / len(err))
        state["b"].sub_(err.mean(0))

    return Target(program=program, sample=_sample, train_step=train_step, bounds={"x": (0.0, 10.0)}, search=["x"])


def global_weights(seed: int = 0) -> Target:
    """Weights a script keeps at module level, trained in place by the program's train_step."""
    with torch.no_grad():
        GLOBAL_W.zero_()

    def program(batch):
        h = torch.sigmoid(batch["x"] @ GLOBAL_W)
        return -(batch["y"] * torch.log(h) + (1 - batch["y"]) * torch.log(1 - h)).mean()

    def train_step(batch):
        loss = program(batch)
        (g,) = torch.autograd.grad(loss, [GLOBAL_W])
        with torch.no_grad():
            GLOBAL_W.sub_(g)

    return Target(program=program, sample=_sample, train_step=train_step, bounds={"x": (0.0, 10.0)}, search=["x"])


def module(seed: int = 0) -> Target:
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 1)
    torch.nn.init.zeros_(net.weight)
    torch.nn.init.zeros_(net.bias)
    opt = torch.optim.Adam(net.parameters(), lr=0.5)

    def program(batch):
        h = torch.sigmoid(net(batch["x"]))
        return -(batch["y"] * torch.log(h) + (1 - batch["y"]) * torch.log(1 - h)).mean()

    return Target(program=program, sample=_sample, model=net, optimizer=opt, bounds={"x": (0.0, 10.0)}, search=["x"])


def rebinding(seed: int = 0) -> Target:
    """Gradient descent by hand that rebinds its closure variables (``W = W - lr * W.grad``)
    instead of writing into them: no in-place write for a watch to see."""
    W = torch.zeros(4, 1)
    b = torch.zeros(1)

    def program(batch):
        h = torch.sigmoid(batch["x"] @ W + b)
        return -(batch["y"] * torch.log(h) + (1 - batch["y"]) * torch.log(1 - h)).mean()

    def train_step(batch):
        nonlocal W, b
        W.requires_grad_(True)
        b.requires_grad_(True)
        program(batch).backward()
        with torch.no_grad():
            W = W - 1.0 * W.grad
            b = b - 1.0 * b.grad

    return Target(program=program, sample=_sample, train_step=train_step, bounds={"x": (0.0, 10.0)}, search=["x"])


SHAPES = {"plain": plain_tensors, "closure": closure_captured, "global": global_weights, "module": module,
          "rebinding": rebinding}


def _trace(runner, site, steps: int) -> list[tuple]:
    res = SiteSearch(runner, site, SearchConfig("grist", steps, 0)).run(steps)
    return [(p.step, p.suspect_loss, p.event) for p in res.trace]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_site_starts_from_the_factory_state_after_another_site_trained(shape):
    make = SHAPES[shape]
    runner = TorchRunner(shape, make())
    assert not runner.untracked, "every tensor the program writes is tracked"
    sites = discover_sites(runner, 0)
    first, second = sites[0], sites[-1]
    alone = _trace(TorchRunner(shape, make()), discover_sites(TorchRunner(shape, make()), 0)[-1], 6)
    _trace(runner, first, 6)                         # trains the program's state
    assert runner.state.changed()
    after = _trace(runner, second, 6)
    assert after == alone, f"{shape}: the second site did not start from the factory's state"


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_reset_restores_every_tensor_the_program_holds(shape):
    runner = TorchRunner(shape, SHAPES[shape]())
    initial = {k: v.detach().clone() for k, v in runner.state.tensors.items()}
    site = discover_sites(runner, 0)[0]
    SiteSearch(runner, site, SearchConfig("grist", 50, 0)).run(5)     # budget left: the state is kept
    assert any(not torch.equal(initial[k], t) for k, t in runner.state.current().items()), "nothing trained"
    runner.reset()
    assert all(torch.equal(initial[k], t) for k, t in runner.state.current().items())
    assert all(runner.state.current()[k] is t for k, t in runner.state.tensors.items()), "rebound back"
    assert not runner.state.changed()


def test_the_plain_tensor_finding_replays_in_a_fresh_build_and_counts_its_real_steps():
    """The issue's false finding: before, another site's trained weights leaked into this one
    (FOUND at step 1, and replay said 'stayed finite')."""
    runner = TorchRunner("plain", plain_tensors())
    sites = discover_sites(runner, 0)
    config = SearchConfig("adaptive", 60, 0)
    for site in sites:                                # the first site trains W and b a long way
        SiteSearch(runner, site, config).run(60)
    target_site = sites[-1]
    res = SiteSearch(runner, target_site, config).run(60)
    alone = SiteSearch(TorchRunner("plain", plain_tensors()), target_site, config).run(60)
    assert res.candidate is not None and res.steps == alone.steps
    spec = TargetSpec("plain", "tests/test_isolation.py:plain_tensors")
    finding = finding_from(runner, spec, target_site, config, res.candidate, res.seconds)
    assert finding.replays == (3, 3) and not finding.flaky
    fresh = TorchRunner("plain", plain_tensors())
    assert confirmed(confirm(fresh, target_site, finding.inputs, finding.state, finding.step_seed),
                     target_site, res.candidate)


def cached(seed: int = 0, through_view: bool = False) -> Target:
    """A program that keeps a running mean in a tensor it creates on its first call: the walk,
    made when the target is built, cannot find what does not exist yet. ``through_view``: it
    scales the mean through a view of it (``running.view(2, 2).mul_``)."""
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    memo: dict = {}

    def program(batch):
        x = batch["x"]
        if "mean" not in memo:
            memo["mean"] = torch.zeros(4)
        running = memo["mean"]
        (running.view(2, 2) if through_view else running).mul_(0.5)
        running.add_(0.5 * x.mean(0).detach())
        return torch.log(torch.sigmoid(net(x - running))).neg().mean()

    return Target(program=program, sample=_sample, model=net, optimizer=opt, bounds={"x": (0.0, 10.0)}, search=["x"])


def test_a_write_the_engine_cannot_undo_is_caught_and_sites_get_their_own_builds():
    runner = TorchRunner("cached", cached())
    discover_sites(runner, 0)
    assert not runner.untracked, "the first pass only created the cache"
    discover_sites(runner, 0)
    assert any("mul_" in u for u in runner.untracked), "the second pass wrote into it"
    assert any("tests/test_isolation.py" in u for u in runner.untracked), "named by the user's line"

    worker = Worker(WorkerOptions())
    spec = TargetSpec("cached", "tests/test_isolation.py:cached")
    sites = worker.try_discover(spec)
    assert not isinstance(sites, Exception)
    worker.discover(spec)                             # the second pass writes into the cache
    assert "cached" in worker.isolated
    config = SearchConfig("grist", 20, 0)
    a = worker.run(spec, sites[0], config, 5)
    b = worker.run(spec, sites[-1], config, 5) if len(sites) > 1 else a
    assert worker.private, "sites of an isolated target run on builds of their own"
    assert a.result.steps == 5 and b.result.steps == 5
    if len(sites) > 1:
        assert worker.searches[sites[0].id].runner is not worker.searches[sites[-1].id].runner


def test_a_write_through_a_view_of_memory_the_engine_cannot_undo_is_caught_too():
    """A view shares its base's memory: making one must not make an untracked base writable."""
    runner = TorchRunner("cached_view", cached(through_view=True))
    discover_sites(runner, 0)
    assert not runner.untracked, "the first pass only created the cache"
    discover_sites(runner, 0)
    assert any("mul_" in u for u in runner.untracked), runner.untracked
