"""Activity recogniser on raw accelerometer windows with a LayerNorm written by hand, under fp16 autocast.

Windows of 32 samples of a 3-axis accelerometer (m/s^2, flattened to 96 values; the
sensor's full scale is +-16 g, +-156.9 m/s^2: the bounds) are embedded by ``Linear(96, 64)``,
normalised by a hand-written LayerNorm (the statistics as in many pre-``nn.LayerNorm``
codebases: ``mean``, ``((x - mean) ** 2).mean(-1)``, ``(x - mean) / sqrt(var + eps)``),
passed through ReLU and classified into 6 activities (``F.cross_entropy``; an Adam step per
batch). Under ``torch.autocast(fp16)`` the embedding and the whole normalisation are float16.

Bug (fp16 only): ``(x - mean) ** 2`` in :class:`HandLayerNorm`. A square passes float16's
65,504 once a unit is 256 away from its row's mean: the square is ``inf``, so is the
variance, and the row is silently normalised to 0 (``finite / inf``): the activations of
that window are erased (and would be NaN had ``x - mean`` itself overflowed). In fp32 the
squares (~1e6) are finite and the row is normalised as it should be.

Why reachable within the bounds: a window whose samples follow the signs of one row of the
embedding (a hard impact at full scale, the witness) puts that unit at ``156.9 * sum|w|``
(~810) while the row's mean stays near 0; real activity (gravity plus motion of a few
m/s^2) keeps every unit within ~12 of its mean (20 sampled batches), uniformly random
windows in the box within ~245 (2,000 draws; just short of 256).
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
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return self.gain * (x - mean) / torch.sqrt(var + self.eps) + self.bias


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
    """A sampled batch whose first window is a full-scale impact following the signs of the
    embedding's heaviest row."""
    batch = target.sample(np.random.default_rng(0))
    w = target.model.embed.weight.detach().numpy()
    batch["x"][0] = FULL_SCALE * np.sign(w[np.abs(w).sum(1).argmax()])
    return batch
