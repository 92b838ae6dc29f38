"""Claims-count regression trained with Adam: a gradient of 1e27 squared overflows Adam's second moment.

A Poisson GLM in ``torch.nn`` (one ``nn.Linear`` predicting the log-rate) of insurance
claim counts from 64 standardised policy features (z-scores clipped to ``[-5, 5]``: the
bounds), with the negative log-likelihood written by hand, ``mean(exp(eta) - y * eta)``.
The factory fits it for 200 Adam steps (deterministic from ``seed``); the program keeps
training with ``torch.optim.Adam``.

Bug: the Adam update, in the update phase only. The forward pass never overflows within
the bounds (the largest log-rate in the box is about 58, ``exp`` overflows past 88.7), and
the gradient stays finite: ``exp(eta) - y`` is at most about 1e25. But Adam keeps the
running mean of the *squared* gradient: past ``|g| = 1.8e19`` (a log-rate above ~46 on one
policy of the batch) ``g * g`` overflows and ``exp_avg_sq`` becomes ``inf``. From then on
every update of those weights is ``m / inf == 0``: they stop learning without a word (and
the first infinite gradient turns them NaN, ``inf / inf``).

Why reachable within the bounds: a policy with every feature at the edge of the box on
the side of the weights has a log-rate of about 58; real policies stay below about 8 and
uniformly random ones stayed below 22 in 100,000 draws.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target

N_FEATURES, BOUND = 64, 5.0


class ClaimsModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(N_FEATURES, 1)

    def forward(self, x):
        return self.linear(x).squeeze(1)                  # the log-rate


def poisson_nll(eta, y):
    return (torch.exp(eta) - y * eta).mean()


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, N_FEATURES))
    true_w = rng.standard_normal(N_FEATURES) * 0.22
    y = rng.poisson(np.exp(x @ true_w + 0.5))
    return np.clip(x, -BOUND, BOUND).astype(np.float32), y.astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 200, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = make_data(4096, seed)
    model = ClaimsModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x_all), torch.from_numpy(y_all)
    fit = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(pretrain_steps):
        idx = torch.randint(0, len(xt), (256,), generator=gen)
        loss = poisson_nll(model(xt[idx]), yt[idx])
        fit.zero_grad()
        loss.backward()
        fit.step()

    def program(b):
        return poisson_nll(model(b["x"]), b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])


def witness(target: Target) -> dict:
    """A sampled batch with its first policy at the corner of the box that maximises the rate."""
    batch = target.sample(np.random.default_rng(0))
    batch["x"][0] = BOUND * np.sign(target.model.linear.weight.detach().numpy()[0])
    return batch
