"""Guarded twin of ``instnorm_flatline``: the instance norm takes its eps inside the sqrt, ``torch.sqrt(var + 1e-5)``.

Same vibration windows, 1-D CNN, pre-training and Adam training as
``instnorm_flatline.py``; only :func:`instance_norm` differs. A constant window still
gives every channel of the first convolution a variance of exactly 0, but ``sqrt`` then
sees ``1e-5``: its value and its gradient are finite. Clean: no finding expected.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

CHANNELS, LENGTH, STATES = 3, 36, 4


def instance_norm(h, eps: float = 1e-5):
    mean = h.mean(-1, keepdim=True)
    var = ((h - mean) ** 2).mean(-1, keepdim=True)
    return (h - mean) / torch.sqrt(var + eps)


class WindowCNN(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.conv1 = nn.Conv1d(CHANNELS, width, 5)
        self.conv2 = nn.Conv1d(width, width, 5, padding=2)
        self.head = nn.Linear(width, STATES)

    def forward(self, x):                                   # x: (B, 3, 36)
        h = F.relu(instance_norm(self.conv1(x)))
        h = F.relu(self.conv2(h))
        return self.head(h.mean(-1))


def make_windows(n: int, rng: np.random.Generator):
    """Each state vibrates at its own frequency; gain, phase and noise vary per window."""
    state = rng.integers(0, STATES, size=n)
    t = np.arange(LENGTH)[None, None, :]
    freq = (1.5 + 2.0 * state)[:, None, None] + 0.3 * rng.standard_normal((n, CHANNELS, 1))
    phase = rng.uniform(0, 2 * np.pi, size=(n, CHANNELS, 1))
    gain = rng.uniform(0.1, 0.7, size=(n, CHANNELS, 1))
    x = gain * np.sin(2 * np.pi * freq * t / LENGTH + phase) + 0.05 * rng.standard_normal((n, CHANNELS, LENGTH))
    return np.clip(x, -1, 1).astype(np.float32), state.astype(np.int64)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 60, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    model = WindowCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    for _ in range(pretrain_steps):
        x, y = make_windows(32, rng)
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def program(b):
        return F.cross_entropy(model(b["x"]), b["y"])

    def sample(r: np.random.Generator):
        x, y = make_windows(batch, r)
        return {"x": x, "y": y}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-1.0, 1.0)}, search=["x"])
