"""Digits classifier that logs its predictive entropy: a NaN that never reaches the loss.

A 64-256-64-10 ReLU classifier on scikit-learn's 8x8 digits (pixels in [0, 1]) is trained
with ``F.cross_entropy`` (stable). For monitoring, the program also computes the mean
predictive entropy by hand, ``-(p * torch.log(p)).sum(1).mean()`` with
``p = softmax(logits)``, and returns it as the second element of ``(loss, entropy)``.
The factory fits the classifier for 400 Adam steps (deterministic from ``seed``); the
program keeps training with SGD.

Bug: ``torch.log(p)`` in :func:`entropy`. When the gap between a sample's largest and
smallest logit exceeds ~103.3, the smallest probability underflows to exactly 0,
``log(0) = -inf`` and ``0 * -inf = NaN``: the logged entropy is NaN. The loss never sees
it (``F.cross_entropy`` works on the logits), so a tool that checks only the loss misses
it; the NaN shows in the program's second output.

Why reachable within the bounds: over the pixel box ``[0, 1]^64`` the fitted classifier
reaches logit gaps well above 104, while real digits and uniformly random pixel images
stay far below.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

from fuzz_core import Target


class Classifier(nn.Module):
    def __init__(self, hidden: int = 256):
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def entropy(logits):
    p = torch.softmax(logits, dim=1)
    return -(p * torch.log(p)).sum(1).mean()


def load_data():
    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 400, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = load_data()
    model = Classifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x_all), torch.from_numpy(y_all)
    for _ in range(pretrain_steps):
        idx = torch.randint(0, len(xt), (64,), generator=gen)
        loss = F.cross_entropy(model(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def program(b):
        logits = model(b["x"])
        loss = F.cross_entropy(logits, b["y"])
        return loss, entropy(logits).detach()

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (0.0, 1.0)}, search=["x"])


def witness(target: Target, steps: int = 300) -> dict:
    """Gradient ascent on the logit gap, within the pixel box."""
    model = target.model
    x = torch.rand(8, 64, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    opt = torch.optim.Adam([x], lr=0.05)
    for _ in range(steps):
        z = model(x)
        opt.zero_grad()
        (-(z.max(1).values - z.min(1).values).sum()).backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(0.0, 1.0)
    return {"x": x.detach().numpy().copy(), "y": np.zeros(8, dtype=np.int64)}
