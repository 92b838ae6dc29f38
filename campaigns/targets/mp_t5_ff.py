"""Speech denoiser on raw 16-bit PCM frames, T5-style feed-forward blocks, evaluated under fp16 autocast.

Frames of 32 PCM samples (``int16`` read as floats, ``[-32768, 32767]``: the bounds; no
division by 32768, the "no pre-scaling" of the title) go through two T5 feed-forward layers
(``T5DenseActDense``: ``Linear(d, 4d, bias=False)``, ReLU, ``Linear(4d, d, bias=False)``, and
the residual ``x + ff(x)``) and a linear output layer. The program is the denoiser's
validation loss (``F.mse_loss`` against the clean frames; no training step). Speech in the
sampler peaks at a few thousand (a talker at a normal level); the same file serves an fp32
campaign and an fp16 one (``precision: {autocast: fp16}``).

Bug (fp16 only): the first layer's ``wi`` (the ``Linear(d, 4d)``) in :class:`T5DenseActDense`.
Under ``torch.autocast(fp16)`` its output is float16; a loud frame whose samples follow the
signs of one row of ``wi`` gives that hidden unit ``32767 * sum|w|`` (~90,000), past float16's
65,504 (the public T5 report: an FF activation of 66,246): ``inf``, and ``wo`` then mixes
``+inf`` and ``-inf`` into NaN. In fp32 the same frame gives ~1e5 and a finite loss (~1e10).
(On CUDA, autocast runs ``Linear`` in fp16 too: the same bug.)

Why reachable within the bounds: Kaiming-uniform rows of ``wi`` have ``sum|w|`` of 2.4-3.4
for 32 inputs, so a full-scale frame reaches 78,000-110,000; sampled speech (peaks below
~4,000) stays below ~3,000 in every unit, and a uniformly random frame in the box below
~45,000.
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
        return self.wo(self.act(self.wi(x)))


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
        return self.out(x)


def speech(rng: np.random.Generator, batch: int) -> np.ndarray:
    """``(batch, FRAMES, FRAME)`` clean frames: three harmonics of a voice at a normal level."""
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
    """A sampled batch whose first frame is clipped loud speech following the signs of the
    first layer's heaviest ``wi`` row."""
    batch = target.sample(np.random.default_rng(0))
    wi = target.model.layers[0].DenseReluDense.wi.weight.detach().numpy()
    row = wi[np.abs(wi).sum(1).argmax()]
    batch["noisy"][0, 0] = FULL_SCALE * np.sign(row)
    return batch
