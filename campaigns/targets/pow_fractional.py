"""Insurance-claims regression with a hand-written Tweedie loss on an unconstrained mean: ``pow``.

The Tweedie deviance (power ``p = 1.5``) is the usual loss for claim amounts:
``-y * mu ** (1 - p) / (1 - p) + mu ** (2 - p) / (2 - p)``. The predicted mean ``mu``
should come through a log link (``exp``); here it is the raw output of a 64-16-1 ReLU
network whose output bias is initialised to the mean claim, which keeps it positive on
the training data. The factory fits it for 300 Adam steps on synthetic claims
(deterministic from ``seed``); the program keeps training with SGD.

Bug: ``mu.pow(1 - p)`` and ``mu.pow(2 - p)`` in :func:`tweedie_loss`: a negative base
with a fractional exponent gives NaN (and ``mu == 0`` gives ``inf`` for ``1 - p < 0``).

Why reachable within the bounds: features are standardised and clipped to ``[-3, 3]``;
the fitted ``mu`` stays above ~0.5 on real rows and on uniformly random rows, but over
the box it goes below 0 (rows that combine the features the network learnt to read as
"low risk").
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target

N_FEATURES, BOUND, P = 64, 3.0, 1.5


class ClaimNet(nn.Module):
    def __init__(self, mean_claim: float, hidden: int = 16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(N_FEATURES, hidden), nn.ReLU())
        self.out = nn.Linear(hidden, 1)
        nn.init.constant_(self.out.bias, mean_claim)

    def forward(self, x):
        return self.out(self.body(x)).squeeze(1)


def tweedie_loss(mu, y, p: float = P):
    return (-y * mu.pow(1 - p) / (1 - p) + mu.pow(2 - p) / (2 - p)).mean()


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = np.clip(rng.standard_normal((n, N_FEATURES)), -BOUND, BOUND).astype(np.float32)
    w = rng.standard_normal(N_FEATURES) / np.sqrt(N_FEATURES)
    mean = 3.0 * np.exp(0.1 * (x @ w))
    y = rng.gamma(4.0, mean / 4.0).astype(np.float32)
    return x, y


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300, lr: float = 1e-4) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = make_data(4096, seed)
    model = ClaimNet(float(y_all.mean()))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x_all), torch.from_numpy(y_all)
    for _ in range(pretrain_steps):
        idx = torch.randint(0, len(xt), (128,), generator=gen)
        loss = tweedie_loss(model(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def program(b):
        return tweedie_loss(model(b["x"]), b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])


def witness(target: Target, steps: int = 300) -> dict:
    """Descent on the predicted mean, within the box."""
    x = torch.zeros(8, N_FEATURES)
    x.normal_(generator=torch.Generator().manual_seed(0))
    x.requires_grad_(True)
    opt = torch.optim.Adam([x], lr=0.05)
    for _ in range(steps):
        mu = target.model(x)
        opt.zero_grad()
        mu.sum().backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(-BOUND, BOUND)
    return {"x": x.detach().numpy().copy(), "y": np.ones(8, dtype=np.float32)}
