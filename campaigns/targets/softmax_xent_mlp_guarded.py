"""Guarded twin of ``softmax_xent_mlp``: the same digits MLP with ``F.log_softmax`` + ``F.nll_loss``.

Same network, data, pre-training (400 Adam steps) and SGD training as
``softmax_xent_mlp.py``, but the model returns logits and the loss is
``F.nll_loss(F.log_softmax(z, 1), y)``: ``log_softmax`` computes ``z - logsumexp(z)``,
finite for every finite logit however large the gap. No input (within the bounds
``[0, 1]^64`` or anywhere) makes any op non-finite: a clean subject, expected to yield
no finding.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
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
        return self.net(x)                           # logits


def cross_entropy(z, y):
    return F.nll_loss(F.log_softmax(z, dim=1), y)


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    return x, digits.target.astype(np.int64)


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
        return cross_entropy(model(b["x"]), b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (0.0, 1.0)}, search=["x"])

