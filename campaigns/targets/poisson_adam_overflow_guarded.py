"""Guarded twin of ``poisson_adam_overflow``: the log-rate is clamped before ``exp``, ``torch.exp(eta.clamp(max=20))``.

Same claims data, GLM, pre-training and Adam training as ``poisson_adam_overflow.py``;
only :func:`poisson_nll` differs. Rates above ``e^20`` (half a billion claims) are not
counts: past the clamp the rate is constant and its gradient 0, so the gradient stays
below about ``e^20 * 5`` and Adam's squared gradient far from overflow. Clean: no finding
expected.
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
    return (torch.exp(eta.clamp(max=20.0)) - y * eta).mean()


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
