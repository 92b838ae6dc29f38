"""Vibration-window CNN whose instance norm, written by hand, puts its eps outside the sqrt.

Machine-state monitoring from 3-axis accelerometer windows (3 channels x 36 readings,
scaled to ``[-1, 1]``, the sensor's range: the bounds). A 1-D CNN tells 4 machine
states apart by their dominant frequency: ``nn.Conv1d`` (3-16, width 5, no padding),
an instance norm written by hand, ``(h - mean) / (torch.sqrt(var) + 1e-5)`` over the 32
positions of each channel (the gain of the sensor varies between machines), ReLU, a
second convolution, global average pooling and a linear head, scored with
``F.cross_entropy``. The factory trains it for 60 Adam steps on synthetic windows
(deterministic from ``seed``); the program keeps training.

Bug: ``torch.sqrt(var)`` in :func:`instance_norm`, in the backward pass only. A window
whose readings do not change (a disconnected sensor reading 0 on every axis, one stuck
at a rail) makes every channel of the first convolution constant over time: ``var == 0``
(exactly, for most values), the forward pass is finite (``0 / (0 + 1e-5) == 0``), but the
gradient of ``sqrt`` at 0 is infinite, ``h - mean == 0`` turns it into NaN, and the
program's own backward and Adam step write NaN into the first convolution's weights.

Why reachable within the bounds: a constant window is a valid input; synthetic windows
and uniformly random ones always vary.
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
    return (h - mean) / (torch.sqrt(var) + eps)


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


def witness(target: Target) -> dict:
    """Sampled windows, one of them from a disconnected sensor (0 on every axis)."""
    batch = target.sample(np.random.default_rng(0))
    batch["x"][0] = 0.0
    return batch
