"""Guarded twin of ``mp_t5_ff``: the feed-forward blocks run in float32 under autocast.

The same denoiser, data, bounds and loss as ``mp_t5_ff.py``; the fix Transformers applied
to T5 for fp16 (``keep_in_fp32_modules = ["wo"]``, and before it the clamp of the hidden
states to ``finfo(float16).max - 1000``), taken to the whole block: each
``T5DenseActDense`` leaves autocast (``torch.autocast(..., enabled=False)``) and computes in
float32, where a full-scale frame gives ~1e5, far from float32's limit. (The clamp alone
would not do here: it comes after ``wo``, which has already turned the ``inf`` of ``wi``
into NaN.) Clean in fp32 and under fp16 autocast: no finding expected.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

FRAME, FRAMES, FULL_SCALE = 32, 8, 32767.0


class T5DenseActDense(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.wi = nn.Linear(d, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d, bias=False)
        self.act = nn.ReLU()

    def forward(self, x):
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self.wo(self.act(self.wi(x.float())))


class T5LayerFF(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.DenseReluDense = T5DenseActDense(d, 4 * d)

    def forward(self, x):
        return x + self.DenseReluDense(x)


class Denoiser(nn.Module):
    def __init__(self, d: int = FRAME, layers: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(T5LayerFF(d) for _ in range(layers))
        self.out = nn.Linear(d, d)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self.out(x.float())


def speech(rng: np.random.Generator, batch: int) -> np.ndarray:
    t = np.arange(FRAMES * FRAME) / 16_000.0
    f0 = rng.uniform(90, 250, (batch, 1))
    amp = rng.uniform(200, 1_200, (batch, 3))
    wave = sum(amp[:, k:k + 1] * np.sin(2 * np.pi * (k + 1) * f0 * t + rng.uniform(0, 6.3, (batch, 1)))
               for k in range(3))
    return wave.reshape(batch, FRAMES, FRAME)


def make_target(seed: int = 0, batch: int = 8) -> Target:
    torch.manual_seed(seed)
    model = Denoiser()

    def program(b):
        return F.mse_loss(model(b["noisy"]), b["clean"])

    def sample(r: np.random.Generator):
        clean = speech(r, batch)
        noisy = np.clip(clean + r.normal(0, 300, clean.shape), -32768, FULL_SCALE)
        return {"noisy": noisy.astype(np.float32), "clean": clean.astype(np.float32)}

    return Target(program=program, sample=sample, model=model,
                  bounds={"noisy": (-32768.0, FULL_SCALE)}, search=["noisy"])


def witness(target: Target) -> dict:
    batch = target.sample(np.random.default_rng(0))
    wi = target.model.layers[0].DenseReluDense.wi.weight.detach().numpy()
    row = wi[np.abs(wi).sum(1).argmax()]
    batch["noisy"][0, 0] = FULL_SCALE * np.sign(row)
    return batch
