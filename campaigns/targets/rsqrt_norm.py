"""Tabular classifier with a hand-written layer norm without ``eps``: ``rsqrt(0)``.

A 20-16-3 network: a linear layer and a ReLU, then a normalisation layer written by hand,
``(h - mu) * torch.rsqrt(var) * gain + bias`` over the 16 hidden units, with no ``eps``,
then a linear classifier (``F.cross_entropy``). The factory fits it for 200 Adam steps
on synthetic standardised features (deterministic from ``seed``); the program keeps
training with SGD.

Bug: ``torch.rsqrt(var)`` in :meth:`RowNorm.forward`. ``var`` is exactly 0 when a row's
16 hidden units are all equal, which happens when the ReLU silences all of them
(``h == 0``): ``rsqrt(0) = inf`` and ``(h - mu) * inf = 0 * inf = NaN``.

Why reachable within the bounds: the 16 hyperplanes of the first layer leave a region
of ``[-3, 3]^20`` where every pre-activation is negative (20 inputs, 16 units), and
descent on ``var`` pushes the last active units below 0 (the ReLU then sets them to
exactly 0). A random row (Gaussian or uniform) has at least one active unit: the chance
that all 16 are off together is far below 1/1600.
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

    def __init__(self, n: int):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, h):
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        return (h - mu) * torch.rsqrt(var) * self.gain + self.bias


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


def witness(target: Target, steps: int = 300) -> dict:
    """Descent on the hidden pre-activations until the ReLU silences every unit."""
    fc1 = target.model.fc1
    x = torch.zeros(8, N_FEATURES, requires_grad=True)
    opt = torch.optim.Adam([x], lr=0.05)
    for _ in range(steps):
        pre = fc1(x)
        opt.zero_grad()
        torch.relu(pre + 0.5).sum().backward()       # aim a little below 0
        opt.step()
        with torch.no_grad():
            x.clamp_(-BOUND, BOUND)
    return {"x": x.detach().numpy().copy(), "y": np.zeros(8, dtype=np.int64)}
