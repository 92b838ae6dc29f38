"""Credit-default style binary classifier with a hand-written binary cross-entropy.

A 24-32-1 ReLU network scores standardised tabular features; the loss is written out as
``-(y * log(sigmoid(z)) + (1 - y) * log(1 - sigmoid(z)))``. The factory fits the network
for 300 Adam steps on synthetic data (a noisy linear rule, 10% of the labels flipped, so
the fitted logits stay moderate; deterministic from ``seed``); the program keeps
training with SGD at ``lr=1e-3``.

Bug: ``torch.log(1 - p)`` in :func:`bce`, ``p = torch.sigmoid(z)``. In float32
``sigmoid(z)`` rounds to exactly 1 once ``z > ~16.6``; ``1 - 1 = 0`` and ``log`` returns
``-inf``, so the loss is ``inf`` for a label 0 and NaN (``0 * -inf``) for a label 1.
Its mirror, ``log(p)``, needs ``z < -88.7``: out of reach within the bounds (a true
negative).

Why reachable within the bounds: features are standardised and clipped to ``[-3, 3]``;
the fitted network reaches logits above 20 at corners of that box, while real
(Gaussian) rows give logits within about +-7 and uniformly random rows within about +-11.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target

N_FEATURES = 24
BOUND = 3.0


class Scorer(nn.Module):
    def __init__(self, n_in: int = N_FEATURES, hidden: int = 32):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))).squeeze(1)


def bce(z, y):
    p = torch.sigmoid(z)
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = np.clip(rng.standard_normal((n, N_FEATURES)), -BOUND, BOUND).astype(np.float32)
    w = rng.standard_normal(N_FEATURES) / np.sqrt(N_FEATURES)
    y = (x @ w + 0.3 * rng.standard_normal(n) > 0).astype(np.float32)
    flip = rng.random(n) < 0.1
    y[flip] = 1 - y[flip]
    return x, y


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = make_data(4096, seed)
    model = Scorer()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x_all), torch.from_numpy(y_all)
    for _ in range(pretrain_steps):
        idx = torch.randint(0, len(xt), (128,), generator=gen)
        loss = bce(model(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def program(b):
        return bce(model(b["x"]), b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])


def witness(target: Target, steps: int = 200) -> dict:
    """Gradient ascent on the logit, within the box."""
    x = torch.zeros(8, N_FEATURES, requires_grad=True)
    opt = torch.optim.Adam([x], lr=0.1)
    for _ in range(steps):
        z = target.model(x)
        opt.zero_grad()
        (-z.sum()).backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(-BOUND, BOUND)
    return {"x": x.detach().numpy().copy(), "y": np.zeros(8, dtype=np.float32)}
