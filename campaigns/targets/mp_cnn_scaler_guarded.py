"""Guarded twin of ``mp_cnn_scaler``: the count is fitted with a Huber loss, whose gradient is bounded.

The same counter, frames, bounds, checkpoint and AMP loop as ``mp_cnn_scaler.py``; the loss
is ``F.smooth_l1_loss`` (Huber, ``beta=1``) instead of ``F.mse_loss``: its gradient is at most
1 per image however wrong the count, so a saturated frame gives weight gradients of the
order of the ordinary ones. The scaler may back off once or twice on it (as dynamic loss
scaling does on outliers) but never collapses: the scale stays far above 1. No finding
expected (a loss-scale collapse or a non-finite weight).
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
        return F.smooth_l1_loss(self.model(b["x"]), b["count"])

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
        loss = F.smooth_l1_loss(model(torch.from_numpy(x)), torch.from_numpy(c))
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
    """The buggy subject's witness: a batch of saturated (all-255) frames."""
    batch = target.sample(np.random.default_rng(0))
    batch["x"][:] = 255.0
    return batch
