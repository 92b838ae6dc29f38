"""Transformer block over padded event sequences: an all-padding sequence masks every key, and its RMSNorm's sqrt(0) has an infinite gradient.

A classifier of maintenance-event sequences (up to 10 events of 8 float features;
shorter sequences are padded with all-zero rows, and the program finds the padding the
usual way, ``(x == 0).all(-1)``). Events are embedded (``nn.Linear`` plus a learned
position), padding positions zeroed, then one post-norm Transformer block with the
bias-free projections of recent LLM blocks: ``nn.MultiheadAttention(bias=False)`` with
the padding as ``key_padding_mask``, a residual, an RMSNorm written by hand as
``x / (torch.sqrt(mean(x ** 2)) + 1e-6)`` (the eps outside the sqrt), a feed-forward
layer with its residual and a second RMSNorm; then a masked mean over the real events
(``/ count.clamp_min(1)``), a linear head and ``F.cross_entropy``. The factory trains it
for 100 AdamW steps (deterministic from ``seed``); the program keeps training.

Bug: ``torch.sqrt`` in :func:`rms_norm` (the block's first norm), in the backward pass
only. A sequence with no real event (every row padding: a machine with no events in the
window) masks every key of every query. PyTorch's attention kernels guard such fully
masked rows (their output is 0, not NaN), the bias-free projections keep it 0, and the
residual adds the zeroed padding embedding: the norm sees an exact zero vector.
``0 / (sqrt(0) + 1e-6) == 0`` is finite, but the gradient of ``sqrt`` at 0 is infinite: the
program's own backward writes NaN into the attention's projections, and AdamW into the
weights. A sequence with at least one real event never gets there: its padding rows
attend to the real events.

Why reachable within the bounds: an all-zero sequence is a valid batch row (features in
``[-3, 3]``); sampled sequences hold 3 to 10 events, and uniformly random rows are never
exactly zero.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

T, N_FEAT, D_MODEL, CLASSES, BOUND = 10, 8, 32, 3, 3.0


def rms_norm(x, gain, eps: float = 1e-6):
    return gain * x / (torch.sqrt((x ** 2).mean(-1, keepdim=True)) + eps)


class EventBlock(nn.Module):
    def __init__(self, d_model: int = D_MODEL, heads: int = 4):
        super().__init__()
        self.embed = nn.Linear(N_FEAT, d_model)
        self.pos = nn.Parameter(0.1 * torch.randn(T, d_model))
        self.attn = nn.MultiheadAttention(d_model, heads, bias=False, batch_first=True)
        self.g1 = nn.Parameter(torch.ones(d_model))
        self.ff = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))
        self.g2 = nn.Parameter(torch.ones(d_model))
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, x):                                    # x: (B, T, 8), padding rows all zero
        pad = (x == 0).all(-1)
        h = (self.embed(x) + self.pos).masked_fill(pad[..., None], 0.0)
        a, _ = self.attn(h, h, h, key_padding_mask=pad, need_weights=False)
        h = rms_norm(h + a, self.g1)
        h = rms_norm(h + self.ff(h), self.g2)
        keep = (~pad).float()[..., None]
        pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        return self.head(pooled)


def make_sequences(n: int, rng: np.random.Generator):
    """Event sequences of 3 to 10 events; the class is the dominant event type."""
    label = rng.integers(0, CLASSES, size=n)
    centers = np.linspace(-1.5, 1.5, CLASSES)[:, None] * np.ones(N_FEAT)
    x = rng.standard_normal((n, T, N_FEAT)) * 0.8
    x += np.where(rng.random((n, T, 1)) < 0.6, centers[label][:, None, :], 0.0)
    length = rng.integers(3, T + 1, size=n)
    x[np.arange(T)[None, :] >= length[:, None]] = 0.0
    return np.clip(x, -BOUND, BOUND).astype(np.float32), label.astype(np.int64)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 100, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    model = EventBlock()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    fit = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(pretrain_steps):
        x, y = make_sequences(32, rng)
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        fit.zero_grad()
        loss.backward()
        fit.step()

    def program(b):
        return F.cross_entropy(model(b["x"]), b["y"])

    def sample(r: np.random.Generator):
        x, y = make_sequences(batch, r)
        return {"x": x, "y": y}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])


def witness(target: Target) -> dict:
    """Sampled sequences, the first of them with no event at all (all padding)."""
    batch = target.sample(np.random.default_rng(0))
    batch["x"][0] = 0.0
    return batch
