"""Guarded twin of ``mp_layernorm``: the hand-written LayerNorm computes its statistics in float32.

The same recogniser, data, bounds, loss and training step as ``mp_layernorm.py``; the
normalisation starts with ``x = x.float()`` (as ``T5LayerNorm`` and the Llama ``RMSNorm`` do)
and casts its result back to the input's dtype, so the squares (at most ~1e6 within the
bounds) are float32. Clean in fp32 and under fp16 autocast: no finding expected.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

SAMPLES, AXES, HIDDEN, CLASSES = 32, 3, 64, 6
FULL_SCALE = 156.9                     # +-16 g in m/s^2


class HandLayerNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        dtype, x = x.dtype, x.float()
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (self.gain * (x - mean) / torch.sqrt(var + self.eps) + self.bias).to(dtype)


class Recogniser(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(SAMPLES * AXES, HIDDEN)
        self.norm = HandLayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.head(F.relu(self.norm(self.embed(x))))


def windows(rng: np.random.Generator, n: int, y: np.ndarray) -> np.ndarray:
    """``(n, 96)`` windows: gravity on a random-ish axis, plus a motion whose size the class sets."""
    t = np.arange(SAMPLES) / 50.0
    gravity = np.array([0.0, 0.0, 9.81]) + rng.normal(0, 1.0, (n, AXES))
    freq = 0.5 + y[:, None] * 0.5
    motion = (1.0 + y[:, None, None]) * np.sin(2 * np.pi * freq[:, :, None] * t[None, None, :]
                                                 + rng.uniform(0, 6.3, (n, AXES, 1)))
    w = gravity[:, :, None] + motion + rng.normal(0, 0.3, (n, AXES, SAMPLES))
    return w.reshape(n, AXES * SAMPLES)


def make_target(seed: int = 0, batch: int = 8, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    model = Recogniser()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def program(b):
        return F.cross_entropy(model(b["x"]), b["y"])

    def sample(r: np.random.Generator):
        y = r.integers(0, CLASSES, batch)
        x = np.clip(windows(r, batch, y), -FULL_SCALE, FULL_SCALE)
        return {"x": x.astype(np.float32), "y": y}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-FULL_SCALE, FULL_SCALE)}, search=["x"])


def witness(target: Target) -> dict:
    """The buggy subject's witness: a full-scale impact along the embedding's heaviest row."""
    batch = target.sample(np.random.default_rng(0))
    w = target.model.embed.weight.detach().numpy()
    batch["x"][0] = FULL_SCALE * np.sign(w[np.abs(w).sum(1).argmax()])
    return batch
