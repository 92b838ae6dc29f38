"""ArcFace head on a digits embedding: ``acos`` of a cosine that rounds above 1.

An embedding network (64-128-16) on scikit-learn's 8x8 digits (pixels in [0, 1]) feeds
an additive-angular-margin (ArcFace) head: ``cos = normalize(e) @ normalize(W).T``,
``theta = torch.acos(cos)``, the target logit is ``s * cos(theta + m)``. The
factory fits it for 200 Adam steps (deterministic from ``seed``); the program evaluates
the fitted model's loss (no optimizer: a training step through ``acos`` at a cosine of
exactly 1 has an infinite gradient and poisons the weights one step before the forward
pass goes NaN, a backward hazard outside the catalogue's searched rows).

Bug: ``torch.acos(cos)`` in :meth:`ArcFace.forward`, without the customary clamp to
``[-1 + eps, 1 - eps]``. Two float32 unit vectors that are parallel have a computed dot
product of 1 +- a few ulps: about a third of such pairs give ``1.0000001`` and ``acos``
returns NaN.

Why reachable within the bounds: the embedding of a sample can be turned (by moving its
pixels within ``[0, 1]^64``) until it is parallel to a class centre to within ~1e-4 rad,
where the rounding decides; real digits and uniformly random pixel images stay at
angles above ~0.15 rad from every centre.

A hard subject (harder than ``acos_cosine``): the target is a near-point in a 16-D
embedding space reached through the network, and the last digits of the cosine are
rounding noise, so the search has to home in to ~1e-4 rad. ``1 - cos`` is a narrow
valley in pixel space: plain gradient steps zig-zag (plain Adam descent needs ~150
steps, Polyak steps stall near 1e-3 rad); a curvature-aware (quasi-Newton) step goes
down it in a few dozen.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

from fuzz_core import Target

N_IN, EMB, N_CLASSES = 64, 16, 10


class ArcFace(nn.Module):
    def __init__(self, emb: int = EMB, n_classes: int = N_CLASSES, s: float = 16.0, m: float = 0.3):
        super().__init__()
        self.W = nn.Parameter(torch.randn(n_classes, emb) * 0.1)
        self.s, self.m = s, m

    def forward(self, e, y):
        cos = F.linear(F.normalize(e), F.normalize(self.W))
        theta = torch.acos(cos)
        target = torch.cos(theta + self.m)
        onehot = F.one_hot(y, cos.shape[1]).to(cos.dtype)
        return self.s * (onehot * target + (1 - onehot) * cos)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(N_IN, 128), nn.ReLU(), nn.Linear(128, EMB))
        self.head = ArcFace()

    def forward(self, x, y):
        return self.head(self.embed(x), y)


def load_data():
    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 200) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = load_data()
    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x_all), torch.from_numpy(y_all)
    for _ in range(pretrain_steps):
        idx = torch.randint(0, len(xt), (64,), generator=gen)
        loss = F.cross_entropy(model(xt[idx], yt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()

    def program(b):
        return F.cross_entropy(model(b["x"], b["y"]), b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model,
                  bounds={"x": (0.0, 1.0)}, search=["x"])


def witness(target: Target, steps: int = 2000) -> dict:
    """Turn 16 digits' embeddings onto their class centres (descent on the angle), in the box,
    until the rounding of some cosine lands above 1 (checked on the model's own path)."""
    model = target.model
    x_all, y_all = load_data()
    x = torch.from_numpy(x_all[:16]).clone().requires_grad_(True)
    y = torch.from_numpy(y_all[:16])
    w = F.normalize(model.head.W.detach())
    centres = w[y]
    opt = torch.optim.Adam([x], lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=400, gamma=0.5)
    for i in range(steps):
        e = F.normalize(model.embed(x))
        with torch.no_grad():
            if (F.linear(e, w) > 1.0).any():
                break                     # parallel to within the last ulp: acos gives NaN here
        gap = (e - centres).pow(2).sum()
        opt.zero_grad()
        gap.backward()
        opt.step()
        sched.step()
        with torch.no_grad():
            x.clamp_(0.0, 1.0)
    return {"x": x.detach().numpy().copy(), "y": y_all[:16].copy()}
