"""Sensor-sequence classifier whose attention softmax is written by hand: ``exp`` overflows float16.

Windows of 16 time steps of 8 standardised sensor channels (z-scores clipped to ``[-6, 6]``:
the bounds) are embedded (``Linear(8, 32)``), go through one self-attention layer whose
author wrote the softmax out as ``exp(logits) / exp(logits).sum(-1)`` (without subtracting the
row maximum), are mean-pooled and classified into 4 activities (``F.cross_entropy``; an Adam
step per batch: the program keeps training). Under ``torch.autocast(fp16)`` the projections
and the scores ``q @ k^T / sqrt(32)`` are float16, and so is the hand-written softmax.

Bug (fp16 only): ``torch.exp(logits)`` in :func:`softmax`. A float16 ``exp`` overflows for
logits above ``log(65504) = 11.09`` (float32: 88.7): the row becomes ``inf / inf = NaN`` and
so does the loss. Logits between 11.1 and 88.7 are fine in fp32: precision-only. (CPU
autocast keeps ``exp`` in its input's float16, as here; CUDA autocast runs ``exp`` in float32,
where the bug needs logits past 88.7.)

Why reachable within the bounds: logits are quadratic in the input; a window at a corner of
the box found by gradient ascent on the largest logit (the witness) reaches ~14.5 (``exp``:
~2e6 in fp16's range of 65,504), while sampled windows (Gaussian z-scores) stay below ~1
and uniformly random windows in the box below ~8.5 (1,000 draws).
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
    e = torch.exp(logits)
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
    """A sampled batch whose first window climbs (sign-gradient ascent in float32, clipped to the
    box) to the corner with the largest attention logit (~14.5)."""
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
