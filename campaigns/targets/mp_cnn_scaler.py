"""Crowd-counting CNN fine-tuned with its own AMP loop (``torch.autocast`` + ``GradScaler``).

A small fully convolutional counter (``Conv2d(1, 8, 3)``, ReLU, ``Conv2d(8, 8, 3)``, ReLU, a
1x1 ``Conv2d`` to a density map) reads 20x20 grey frames (8-bit pixels, ``[0, 255]``: the
bounds; the model divides by 255) and predicts the number of people as the sum of the
density map (taken in float32); the loss is ``F.mse_loss`` against the true count.
``train_step`` is the usual AMP loop: ``zero_grad``, the forward and loss under
``torch.autocast(fp16)``, ``scaler.scale(loss).backward()``, ``scaler.step(opt)``,
``scaler.update()`` (a ``torch.amp.GradScaler``, default settings). The factory replays the
run: 150 Adam steps in fp32 (the checkpoint), then 40 steps of the AMP loop, in which the
scaler backs off from 65,536 to the scale the first batches allow (16 for seed 0).

Bug (fp16 only; a loss-scale collapse): the convolutions' weight gradients, computed in
float16 by autocast's backward, are sums over every pixel of the batch. A saturated frame
(an over-exposed camera) makes the counter extrapolate to far more people than any scene holds: the
count error and the true (unscaled) weight gradients (~3.7e5) are past float16's 65,504
whatever the scale >= 1. Each step on such a batch is skipped and the scale halves, step
after step, until it falls below 1 (7 consecutive skips: 16 -> 0.125), where ordinary
gradients start to underflow. In fp32 (``amp=False``: autocast and the scaler disabled, as
``enabled=use_amp`` does in the usual loop) the same batch trains with finite gradients.

Why reachable within the bounds: an all-255 frame is a valid 8-bit image; sampled frames
(dark scenes, background below 20, people as blobs of ~80) give scaled gradients ~80x below
float16's limit at the settled scale, and no skip.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

SIZE = 20


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.density = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        return self.density(self.features(x / 255.0)).float().sum((1, 2, 3))


class AmpTrainer:
    """The AMP training loop of one step (the engine calls ``step`` as ``train_step``)."""

    def __init__(self, model: nn.Module, lr: float, amp: bool):
        self.model, self.amp = model, amp
        self.opt = torch.optim.Adam(model.parameters(), lr=lr)
        self.scaler = torch.amp.GradScaler("cpu", enabled=amp)

    def loss(self, b):
        return F.mse_loss(self.model(b["x"]), b["count"])

    def step(self, b):
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, enabled=self.amp):
            loss = self.loss(b)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return loss


def frames(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` dark frames with 0-4 people (Gaussian blobs) each, and their counts."""
    yy, xx = np.mgrid[:SIZE, :SIZE]
    img = rng.uniform(0, 20, (n, 1, SIZE, SIZE))
    count = rng.integers(0, 5, n)
    for i in range(n):
        for _ in range(count[i]):
            cy, cx = rng.uniform(2, SIZE - 2, 2)
            img[i, 0] += 80 * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 2)
    return np.clip(img, 0, 255).astype(np.float32), count.astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 150, amp_steps: int = 40,
                lr: float = 1e-3, amp: bool = True) -> Target:
    torch.manual_seed(seed)
    model = Counter()
    trainer = AmpTrainer(model, lr, amp)
    rng = np.random.default_rng(seed)
    checkpoint = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(pretrain_steps):                   # the fp32 checkpoint
        x, c = frames(rng, batch)
        loss = F.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(c))
        checkpoint.zero_grad()
        loss.backward()
        checkpoint.step()
    for _ in range(amp_steps):                        # fine-tuning in AMP: the scale settles
        x, c = frames(rng, batch)
        trainer.step({"x": torch.from_numpy(x), "count": torch.from_numpy(c)})

    def sample(r: np.random.Generator):
        x, c = frames(r, batch)
        return {"x": x, "count": c}

    return Target(program=trainer.loss, sample=sample, model=model, train_step=trainer.step,
                  bounds={"x": (0.0, 255.0)}, search=["x"])


def witness(target: Target) -> dict:
    """A sampled batch of saturated (all-255) frames."""
    batch = target.sample(np.random.default_rng(0))
    batch["x"][:] = 255.0
    return batch
