"""Near-miss twin of ``softmax_xent_mlp``: ``torch.log(p.clamp_min(1e-12))``.

Same network, data, pre-training and SGD training as ``softmax_xent_mlp.py``, with the
customary guard on the hand-written cross-entropy: ``-(y * torch.log(p.clamp_min(1e-12)))``.
The search can drive ``p`` to exactly 0 (logit gaps above 104 are reachable within
``[0, 1]^64``), but ``log`` only ever sees ``>= 1e-12``: its input comes very close to
the edge of the domain (``log(1e-12) = -27.6``) without crossing it. Clean: a tool that
reports a finding here has a false positive.
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
    return -(y * torch.log(p.clamp_min(1e-12))).sum(1).mean()


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

