"""Poisson regression trained with a learning rate that is too large: reachable only by training.

A count model (10 features scaled to [-1, 1], a 10-16-1 tanh network predicting the log
rate, ``rate = torch.exp(...)``) with the Poisson negative log-likelihood written by hand
as ``(rate - y * torch.log(rate)).mean()``, trained from scratch by plain SGD at
``lr=0.5``, some 25 times what this loss tolerates (the targets are counts up to ~150).

Bug: ``torch.exp`` in :meth:`CountModel.forward` (or, on the way down, ``torch.log`` of a
rate that underflowed to 0 in :func:`poisson_nll`), reached only through training. The
gradient of the loss is ``(rate - y) * dlog_rate``: a step on a batch with large counts
overshoots, the next predicts a huge rate whose gradient is huger still, and within a
handful of steps on one batch the output weights blow up until the log rate passes
88.72 and ``exp`` overflows to ``inf`` (or falls below -103 and ``log(0) = -inf``).

Why *not* reachable from the inputs alone: the hidden layer is a ``tanh``, so for any
input ``|log rate| <= |b2| + sum|w2|`` (about 2 with the initial weights): with the
weights frozen no input within the bounds, or anywhere, makes ``exp`` overflow or the
rate underflow. Only the program's own optimizer, run on the searched batch, gets there.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target

N_FEATURES = 10


class CountModel(nn.Module):
    def __init__(self, hidden: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(N_FEATURES, hidden)
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, x):
        return torch.exp(self.fc2(torch.tanh(self.fc1(x))).squeeze(1))


def poisson_nll(rate, y):
    return (rate - y * torch.log(rate)).mean()


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(n, N_FEATURES)).astype(np.float32)
    w = rng.standard_normal(N_FEATURES) * 0.6
    y = rng.poisson(np.exp(1.5 + x @ w)).astype(np.float32)
    return x, y


def make_target(seed: int = 0, batch: int = 8, lr: float = 0.5) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = make_data(4096, seed)
    model = CountModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def program(b):
        rate = model(b["x"])
        return poisson_nll(rate, b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-1.0, 1.0)}, search=["x"])
