"""Set classifier with a hand-written attention pooling: ``e / e.sum()`` where every ``e`` underflows.

A multiple-instance classifier reads a bag of 6 instances (16 standardised features
each, clipped to [-3, 3]), embeds them (16-32-32), scores every instance against a query
built from the bag mean (dot-product attention scaled by ``sqrt(d)``) and pools with
weights normalised by hand. To keep ``exp`` from overflowing, the author subtracts
``s.max()``: the maximum over the whole batch instead of over each bag (``dim=-1``
forgotten). The factory fits it for 200 Adam steps on synthetic bags (deterministic from
``seed``); the program evaluates it (no optimizer: in a training program the backward of
the division, ``-e / sum**2``, overflows a step before the forward does).

Bug: ``w = e / e.sum(-1, keepdim=True)`` in :meth:`AttentionPool.forward`.
``exp(s - c)`` underflows to exactly 0 where ``s - c < ~-103.9``; a bag whose every score
lies that far below the highest score in the batch has ``e.sum() == 0`` and the division
is ``0 / 0 = NaN``.

Why reachable within the bounds: scores are a quadratic form of the inputs; pushing one
bag's scores up (both searched) opens a gap of ~400 between it and the other bags, while
real bags keep the gap between the batch maximum and any bag's maximum below ~25 and
uniformly random bags below ~70.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

N_INST, N_FEAT, D, N_CLASSES = 6, 16, 32, 4
BOUND = 3.0


class AttentionPool(nn.Module):
    def __init__(self, d: int = D):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.scale = math.sqrt(d)

    def forward(self, h):                                   # h: (B, N, d)
        q = self.q(h.mean(1, keepdim=True))                 # (B, 1, d)
        s = (self.k(h) * q).sum(-1) / self.scale            # (B, N)
        e = torch.exp(s - s.max())                          # "stable" softmax
        w = e / e.sum(-1, keepdim=True)
        return (w.unsqueeze(-1) * h).sum(1)


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(N_FEAT, D), nn.ReLU(), nn.Linear(D, D))
        self.pool = AttentionPool(D)
        self.head = nn.Linear(D, N_CLASSES)

    def forward(self, x):
        return self.head(self.pool(self.embed(x)))


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = np.clip(rng.standard_normal((n, N_INST, N_FEAT)), -BOUND, BOUND).astype(np.float32)
    proto = rng.standard_normal((N_CLASSES, N_FEAT)).astype(np.float32)
    # the label is the class whose prototype the bag's most prominent instance matches
    y = (x @ proto.T).max(1).argmax(1).astype(np.int64)
    return x, y


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 200) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = make_data(2048, seed)
    model = BagClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x_all), torch.from_numpy(y_all)
    for _ in range(pretrain_steps):
        idx = torch.randint(0, len(xt), (64,), generator=gen)
        loss = F.cross_entropy(model(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()

    def program(b):
        return F.cross_entropy(model(b["x"]), b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])


def _scores(model, x):
    h = model.embed(x)
    q = model.pool.q(h.mean(1, keepdim=True))
    return (model.pool.k(h) * q).sum(-1) / model.pool.scale


def witness(target: Target, steps: int = 300) -> dict:
    """Bag 0 pushed to high scores, the other bags to low ones (gradient steps in the box)."""
    model = target.model
    x = torch.zeros(8, N_INST, N_FEAT)
    x.normal_(generator=torch.Generator().manual_seed(0))
    x.requires_grad_(True)
    opt = torch.optim.Adam([x], lr=0.05)
    sign = torch.ones(8, 1)
    sign[1:] = -1
    for _ in range(steps):
        s = _scores(model, x)
        opt.zero_grad()
        (-(sign * s).sum()).backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(-BOUND, BOUND)
    return {"x": x.detach().numpy().copy(), "y": np.zeros(8, dtype=np.int64)}
