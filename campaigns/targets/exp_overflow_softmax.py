"""Tabular classifier calibrated with a softmax written by hand: ``exp(z)`` overflows.

A 32-32-32-5 ReLU MLP classifies standardised sensor features (clipped to [-3, 3]). It
was fitted with ``F.cross_entropy`` (the factory replays that: 400 Adam steps on
synthetic data, deterministic from ``seed``); the program under test fine-tunes it for
calibration with a Brier score, and its author wrote the softmax out as
``torch.exp(z) / torch.exp(z).sum(1, keepdim=True)`` without subtracting the maximum.

Bug: ``torch.exp(z)`` in :func:`softmax`. In float32 ``exp`` overflows to ``inf`` for
``z > 88.72``; the division is then ``inf / inf = NaN``.

Why reachable within the bounds: with ``x`` in ``[-3, 3]^32`` the fitted network reaches
logits of 100-150 at corners of the box, while real rows (Gaussian) give logits below
~40 and uniformly random rows below ~60.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

N_FEATURES, N_CLASSES, BOUND = 32, 5, 3.0


class MLP(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(N_FEATURES, hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, N_CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


def softmax(z):
    return torch.exp(z) / torch.exp(z).sum(1, keepdim=True)


def brier(p, y):
    return ((p - y) ** 2).sum(1).mean()


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = np.clip(rng.standard_normal((n, N_FEATURES)), -BOUND, BOUND).astype(np.float32)
    w = rng.standard_normal((N_FEATURES, N_CLASSES))
    y = (x @ w + 0.5 * rng.standard_normal((n, N_CLASSES))).argmax(1)
    return x, np.eye(N_CLASSES, dtype=np.float32)[y]


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 400, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = make_data(4096, seed)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x_all), torch.from_numpy(y_all).argmax(1)
    for _ in range(pretrain_steps):
        idx = torch.randint(0, len(xt), (128,), generator=gen)
        loss = F.cross_entropy(model(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def program(b):
        p = softmax(model(b["x"]))
        return brier(p, b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])


def witness(target: Target, steps: int = 200) -> dict:
    """Gradient ascent on the largest logit, within the box."""
    x = torch.zeros(8, N_FEATURES, requires_grad=True)
    opt = torch.optim.Adam([x], lr=0.1)
    for _ in range(steps):
        z = target.model(x)
        opt.zero_grad()
        (-z.max(1).values.sum()).backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(-BOUND, BOUND)
    return {"x": x.detach().numpy().copy(), "y": np.eye(N_CLASSES, dtype=np.float32)[np.zeros(8, dtype=np.int64)]}
