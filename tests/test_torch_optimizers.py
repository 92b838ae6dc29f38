"""The program's optimizers are part of its state: saved, restored and reset with the weights,
also those a ``train_step`` holds (a GAN's two Adams), so that no site starts from moments
another site's search left behind."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fuzz_core import Target
from fuzz_core.backends.torch import TorchRunner, program_optimizers
from fuzz_core.engine import discover_sites
from fuzz_core.search import SearchConfig, SiteSearch
from fuzz_core.target import TargetError


def _gan_like(seed: int = 0, hidden_in_closure: bool = True) -> Target:
    """Two nets, two Adams that only ``train_step`` knows; two suspect ops (log, sqrt)."""
    torch.manual_seed(seed)
    net = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4), "b": torch.nn.Linear(4, 1)})
    opt_a = torch.optim.Adam(net["a"].parameters(), lr=1e-2)
    opt_b = torch.optim.Adam(net["b"].parameters(), lr=1e-2)

    def program(batch):
        h = torch.tanh(net["a"](batch["x"]))
        p = torch.sigmoid(net["b"](h))
        return -torch.log(p).mean() + torch.sqrt(h.pow(2).sum(1)).mean()

    def train_step(batch):
        for opt in (opt_a, opt_b):
            opt.zero_grad()
            program(batch).backward()
            opt.step()

    return Target(program=program, sample=lambda rng: {"x": rng.uniform(-1, 1, (8, 4)).astype(np.float32)},
                  model=net, train_step=train_step, bounds={"x": (-1.0, 1.0)}, search=["x"])


def _losses(runner, site, steps=12):
    search = SiteSearch(runner, site, SearchConfig("grist", steps, 0))
    return [p.suspect_loss for p in search.run(steps).trace]


def test_train_step_optimizers_are_found_in_its_closure():
    target = _gan_like()
    opts = program_optimizers(target)
    assert len(opts) == 2 and all(isinstance(o, torch.optim.Adam) for o in opts)


def test_a_site_searches_the_same_alone_or_after_another_site_trained_the_program():
    runner = TorchRunner("gan", _gan_like())
    sites = [s for s in discover_sites(runner, 0) if s.op in ("log", "sqrt")]   # their backward rows too
    assert len(sites) == 2
    alone = _losses(TorchRunner("gan", _gan_like()), sites[1])
    _losses(runner, sites[0], steps=30)          # trains both nets and moves both Adams
    after = _losses(runner, sites[1])
    assert after == alone


def test_checkpointed_state_holds_every_optimizer_and_restores_it():
    runner = TorchRunner("gan", _gan_like())
    initial = runner.get_state()
    _losses(runner, discover_sites(runner, 0)[0], steps=5)
    trained = runner.get_state()
    assert any(k.startswith("optim.") and k.endswith("exp_avg") for k in trained)
    assert any(k.startswith("optim1.") and k.endswith("exp_avg") for k in trained)
    runner.reset()
    assert runner.get_state().keys() == initial.keys()
    assert all(o.state == {} for o in runner._optimizers)     # back to fresh Adams
    runner.set_state(trained)
    again = runner.get_state()
    assert again.keys() == trained.keys()
    assert all(np.array_equal(again[k], trained[k]) for k in trained)


def test_state_through_a_safetensors_file_keeps_its_0d_tensors_0d(tmp_path):
    """What a finding folder or a campaign checkpoint keeps: Adam's ``step`` and a BatchNorm's
    ``num_batches_tracked`` are 0-d tensors, and a replay must restore them 0-d, not shape (1,)."""
    from fuzz_core.io import atomic_save_arrays, load_arrays

    def target():
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        return Target(program=lambda b: -torch.log(torch.sigmoid(net(b["x"]))).mean(),
                      sample=lambda rng: {"x": rng.uniform(-1, 1, (8, 4)).astype(np.float32)},
                      model=net, optimizer=opt, bounds={"x": (-1.0, 1.0)}, search=["x"])

    runner = TorchRunner("bn", target())
    _losses(runner, discover_sites(runner, 0)[0], steps=4)
    trained = runner.get_state()
    scalars = sorted(k for k, v in trained.items() if np.ndim(v) == 0)
    assert any(k.endswith("num_batches_tracked") for k in scalars) and any(k.endswith(".step") for k in scalars)
    atomic_save_arrays(tmp_path / "values.safetensors", trained)
    loaded = load_arrays(tmp_path / "values.safetensors")
    assert {k: np.shape(v) for k, v in loaded.items()} == {k: np.shape(v) for k, v in trained.items()}
    fresh = TorchRunner("bn", target())
    fresh.set_state(loaded)
    again = fresh.get_state()
    assert all(np.shape(again[k]) == np.shape(trained[k]) and np.array_equal(again[k], trained[k]) for k in trained)


def test_a_list_of_optimizers_trains_with_the_programs_own_step():
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    extra = torch.nn.Parameter(torch.zeros(1))
    opts = [torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.SGD([extra], lr=0.1)]
    target = Target(program=lambda b: torch.log(torch.sigmoid(net(b["x"]) + extra)).neg().mean(),
                    sample=lambda rng: {"x": rng.uniform(-1, 1, (8, 4)).astype(np.float32)},
                    model=net, optimizer=opts, bounds={"x": (-1.0, 1.0)}, search=["x"])
    runner = TorchRunner("two", target)
    _losses(runner, discover_sites(runner, 0)[0], steps=3)
    assert extra.item() != 0.0                      # the second optimizer stepped too


def test_an_optimizer_that_is_not_one_is_a_target_error():
    target = _gan_like()
    target.optimizer = "adam"
    with pytest.raises(TargetError, match="optimizer"):
        TorchRunner("bad", target)
