"""Guarded twin of ``poincare_hierarchy``: the argument of ``acosh`` is clamped to ``1 + 1e-7``, as geoopt does.

Same taxonomy, encoder into the Poincare ball, contrastive loss, pre-training and Adam
training as ``poincare_hierarchy.py``; only :func:`poincare_distance` differs. A pair of
equal points still has the argument ``1 + 0``, but the clamp lifts it to ``1 + 1e-7``
(``acosh`` has a finite gradient there) and passes no gradient below it. Clean: no
finding expected.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target

N_ATTR, DIM, DEPTH, BRANCH = 24, 5, 3, 4


class BallEncoder(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_ATTR, hidden), nn.Tanh(), nn.Linear(hidden, DIM))

    def forward(self, x):
        v = self.net(x)
        return v / (1.0 + v.norm(dim=-1, keepdim=True))      # strictly inside the unit ball


def poincare_distance(u, w):
    sq = ((u - w) ** 2).sum(-1)
    denom = (1 - (u ** 2).sum(-1)) * (1 - (w ** 2).sum(-1))
    return torch.acosh((1 + 2 * sq / denom).clamp_min(1 + 1e-7))


def contrastive_loss(model, pairs, related, margin: float = 2.0):
    d = poincare_distance(model(pairs[:, 0]), model(pairs[:, 1]))
    return (related * d + (1 - related) * torch.relu(margin - d)).mean()


def make_taxonomy(seed: int):
    """Categories of a tree; attributes: a noisy random code of the path from the root."""
    rng = np.random.default_rng(seed)
    parents, paths = [-1], [[]]
    frontier = [0]
    for _ in range(DEPTH):
        nxt = []
        for node in frontier:
            for k in range(BRANCH):
                parents.append(node)
                paths.append(paths[node] + [k])
                nxt.append(len(parents) - 1)
        frontier = nxt
    codes = rng.random((DEPTH, BRANCH, N_ATTR))
    attrs = np.full((len(paths), N_ATTR), 0.5)
    for i, path in enumerate(paths):
        for level, k in enumerate(path):
            attrs[i] += (codes[level, k] - 0.5) * 0.5 ** level
    attrs = np.clip(attrs + 0.03 * rng.standard_normal(attrs.shape), 0, 1).astype(np.float32)
    return attrs, np.array(parents)


def sample_pairs(attrs, parents, n: int, rng: np.random.Generator):
    """Half parent-child pairs, half pairs of unrelated categories (never a category with itself)."""
    child = rng.integers(1, len(attrs), size=n)
    other = rng.integers(0, len(attrs), size=n)
    related = (np.arange(n) % 2 == 0)
    other = np.where(related, parents[child], other)
    clash = (other == child) | (~related & (parents[child] == other))
    other[clash] = (other[clash] + 1) % len(attrs)
    other[clash & (other == child)] = 0
    return np.stack([attrs[child], attrs[other]], 1), related.astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 200, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    attrs, parents = make_taxonomy(seed)
    model = BallEncoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    fit = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(pretrain_steps):
        pairs, related = sample_pairs(attrs, parents, 64, rng)
        loss = contrastive_loss(model, torch.from_numpy(pairs), torch.from_numpy(related))
        fit.zero_grad()
        loss.backward()
        fit.step()

    def program(b):
        return contrastive_loss(model, b["pairs"], b["related"])

    def sample(r: np.random.Generator):
        pairs, related = sample_pairs(attrs, parents, batch, r)
        return {"pairs": pairs, "related": related}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"pairs": (0.0, 1.0)}, search=["pairs"])
