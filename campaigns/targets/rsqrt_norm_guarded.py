"""Guarded twin of ``rsqrt_norm``: the hand-written layer norm with ``eps = 1e-5``.

Same network, data, pre-training and SGD training as ``rsqrt_norm.py``, but the
normalisation is ``(h - mu) * torch.rsqrt(var + eps)`` with ``eps = 1e-5`` (the default of
``nn.LayerNorm``). The search can still silence every hidden unit (``var == 0``), but
``rsqrt`` then sees ``1e-5`` and returns 316: finite. Clean: no finding expected.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

N_FEATURES, HIDDEN, N_CLASSES, BOUND = 20, 16, 3, 3.0


class RowNorm(nn.Module):
    """Layer normalisation over the last dimension, written out."""

    def __init__(self, n: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gain = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, h):
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        return (h - mu) * torch.rsqrt(var + self.eps) * self.gain + self.bias


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(N_FEATURES, HIDDEN)
        self.norm = RowNorm(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, N_CLASSES)

    def forward(self, x):
        return self.fc2(self.norm(torch.relu(self.fc1(x))))


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = np.clip(rng.standard_normal((n, N_FEATURES)), -BOUND, BOUND).astype(np.float32)
    w = rng.standard_normal((N_FEATURES, N_CLASSES))
    y = np.argmax(np.tanh(x @ w) + 0.3 * rng.standard_normal((n, N_CLASSES)), 1).astype(np.int64)
    return x, y


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 200, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = make_data(4096, seed)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x_all), torch.from_numpy(y_all)
    for _ in range(pretrain_steps):
        idx = torch.randint(0, len(xt), (128,), generator=gen)
        loss = F.cross_entropy(model(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def program(b):
        return F.cross_entropy(model(b["x"]), b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])

