"""Digits MLP with a hand-written softmax cross-entropy: ``log`` of a probability that underflows.

The program is an ordinary classifier on scikit-learn's 8x8 digits (pixels scaled to
[0, 1]): a 64-128-128-10 ReLU MLP ends in ``torch.softmax`` and the loss is written by
hand as ``-(y * torch.log(p)).sum(1).mean()``. The factory pre-trains it for 400 Adam
steps (as its author would before evaluating it; deterministic from ``seed``), and the
program keeps training with SGD.

Bug: ``torch.log(p)`` in :func:`cross_entropy`. ``softmax`` computes
``exp(z_k - max z)``; once the gap between the largest and the smallest logit of a sample
exceeds ~103.3 the smallest probability underflows to exactly 0 in float32, ``log`` returns
``-inf`` and ``0 * -inf`` makes the loss NaN (for any label).

Why reachable within the bounds: with ``x`` in ``[0, 1]^64`` the trained network reaches
logit gaps of 110-140 by ascent from most digits (bright pixels where a digit never has
ink), while real digits give gaps below ~60 and uniformly random pixels below ~50:
sampled and random batches never trigger it, gradient search does.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from sklearn.datasets import load_digits

from fuzz_core import Target


class MLP(nn.Module):
    def __init__(self, n_in: int = 64, hidden: int = 128, n_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_in, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, n_classes),
        )

    def forward(self, x):
        return torch.softmax(self.net(x), dim=1)


def cross_entropy(p, y):
    return -(y * torch.log(p)).sum(1).mean()


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[digits.target]
    return x, y


def pretrain(model, x, y, steps: int, seed: int, lr: float = 1e-2, batch: int = 64):
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=gen)
        loss = cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()


def make_target(seed: int = 0, batch: int = 8, hidden: int = 128, pretrain_steps: int = 400,
                lr: float = 0.05) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = load_data()
    model = MLP(hidden=hidden)
    pretrain(model, x_all, y_all, pretrain_steps, seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def program(b):
        p = model(b["x"])
        return cross_entropy(p, b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (0.0, 1.0)}, search=["x"])


def witness(target: Target, steps: int = 300) -> dict:
    """A batch within bounds that triggers the bug: gradient ascent on the logit gap, each row
    from its own start (the centre of the box, then seeded random points): the ascent ends in a
    corner of the box, and which corner depends on the start and on the float rounding of the
    fitted weights (the thread count changes it)."""
    model = target.model
    x = torch.rand((8, 64), generator=torch.Generator().manual_seed(0))
    x[0] = 0.5
    x.requires_grad_(True)
    opt = torch.optim.Adam([x], lr=0.05)
    for _ in range(steps):
        z = model.net(x)
        gap = (z.max(1).values - z.min(1).values).sum()
        opt.zero_grad()
        (-gap).backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(0.0, 1.0)
    y = np.eye(10, dtype=np.float32)[np.zeros(8, dtype=np.int64)]
    return {"x": x.detach().numpy().copy(), "y": y}
