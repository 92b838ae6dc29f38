"""Guarded twin of ``logreg_focal_plain``: the focal factor clamps its base, ``(1 - p_t).clamp_min(1e-6) ** gamma``.

Same fraud data, plain-tensor logistic regression, hand-written training and focal loss
with ``gamma = 0.5`` as ``logreg_focal_plain.py``; only :func:`focal_loss` differs. A
transaction the model is certain of still has ``p_t == 1``, but ``pow`` then sees ``1e-6``
(finite gradient) and the clamp passes no gradient below it. Clean: no finding expected.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fuzz_core import Target

N_FEATURES, BOUND = 20, 5.0


def focal_loss(logits, y, alpha: float = 0.25, gamma: float = 0.5):
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    p_t = p * y + (1 - p) * (1 - y)
    alpha_t = alpha * y + (1 - alpha) * (1 - y)
    return (alpha_t * (1 - p_t).clamp_min(1e-6) ** gamma * ce).mean()


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, N_FEATURES))
    true_w = rng.standard_normal(N_FEATURES) * 0.5
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ true_w - 4.0)))).astype(np.float32)
    return np.clip(x, -BOUND, BOUND).astype(np.float32), y


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300, lr: float = 0.5) -> Target:
    torch.manual_seed(seed)
    x_all, y_all = make_data(4096, seed)
    w = torch.zeros(N_FEATURES, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)

    def program(batch_):
        return focal_loss(batch_["x"] @ w + b, batch_["y"])

    def train_step(batch_):
        loss = program(batch_)
        loss.backward()
        with torch.no_grad():
            for p in (w, b):
                p -= lr * p.grad
                p.grad = None

    xt, yt = torch.from_numpy(x_all), torch.from_numpy(y_all)
    for _ in range(pretrain_steps):
        train_step({"x": xt, "y": yt})

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, train_step=train_step,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])
