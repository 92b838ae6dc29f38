"""Guarded twin of ``mp_attn_softmax``: the hand-written softmax subtracts the row maximum.

The same classifier, data, bounds, loss and training step as ``mp_attn_softmax.py``; the
softmax is written as ``exp(logits - logits.amax(-1))`` over its sum, so every ``exp`` is of a
non-positive number (at most 1) and the denominator at least 1, in float16 as in float32.
Clean in fp32 and under fp16 autocast: no finding expected.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

CHANNELS, STEPS, D_MODEL, CLASSES, BOUND = 8, 16, 32, 4, 6.0


def softmax(logits):
    e = torch.exp(logits - logits.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


class Attention(nn.Module):
    def __init__(self, d: int = D_MODEL):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, h):
        logits = self.q(h) @ self.k(h).transpose(1, 2) / math.sqrt(h.shape[-1])
        return softmax(logits) @ self.v(h)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(CHANNELS, D_MODEL)
        self.attn = Attention()
        self.head = nn.Linear(D_MODEL, CLASSES)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.attn(h)
        return self.head(h.mean(1))


def make_target(seed: int = 0, batch: int = 8, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    mix = np.random.default_rng(seed).normal(0, 1, (CLASSES, CHANNELS))

    def program(b):
        return F.cross_entropy(model(b["x"]), b["y"])

    def sample(r: np.random.Generator):
        y = r.integers(0, CLASSES, batch)
        x = r.normal(0, 1, (batch, STEPS, CHANNELS)) + 0.5 * mix[y][:, None, :]
        return {"x": np.clip(x, -BOUND, BOUND).astype(np.float32), "y": y}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])


def witness(target: Target) -> dict:
    """The buggy subject's witness: the corner of the box with the largest attention logit."""
    batch = target.sample(np.random.default_rng(0))
    x = torch.tensor(batch["x"][:1], requires_grad=True)
    attn, embed = target.model.attn, target.model.embed
    for _ in range(50):
        h = embed(x)
        logit = (attn.q(h) @ attn.k(h).transpose(1, 2)).max() / math.sqrt(D_MODEL)
        (g,) = torch.autograd.grad(logit, x)
        with torch.no_grad():
            x += 0.5 * g.sign()
            x.clamp_(-BOUND, BOUND)
    batch["x"][0] = x.detach().numpy()[0]
    return batch
