"""Fraud-detection logistic regression on plain tensors, trained by hand with a focal loss of gamma 0.5.

No ``nn.Module`` and no optimizer object: the weights are two plain tensors
(``w``, ``b``, ``requires_grad=True``) and ``train_step`` does ``loss.backward()`` and
``w -= lr * w.grad`` itself, as many logistic-regression scripts do. The data are 20
standardised transaction features (z-scores clipped to ``[-5, 5]``: the bounds) with
about 10% frauds and noisy labels. The loss is the sigmoid focal loss written as in
torchvision (``ce * (1 - p_t) ** gamma``, with the cross-entropy from
``F.binary_cross_entropy_with_logits``), with ``gamma = 0.5``: a milder focus than the
usual 2, which the author picked on validation. The factory fits the model for 300
full-batch steps (deterministic from ``seed``); the program keeps training on each batch.

Bug: ``(1 - p_t) ** gamma`` in :func:`focal_loss`, in the backward pass only. Once the
model is certain of a transaction (``|logit| > 16.6`` on the right side), ``p_t`` rounds
to 1, ``0 ** 0.5 == 0`` is finite and so is the loss, but the gradient of ``x ** 0.5`` at 0
is infinite; ``p * (1 - p) == 0`` then turns it into NaN and the hand-written update
writes NaN into ``w`` and ``b``. With ``gamma >= 1`` the gradient at 0 is finite.

Why reachable within the bounds: ``sum |w| * 5`` is about 22 (the bias is about -3), so a
transaction with every feature at the edge of the box on the side of the weights gets a
logit of about 19 (or -25 on the other side); real transactions stay within about 7, and
uniformly random ones never passed 16 in 100,000 draws.
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
    return (alpha_t * (1 - p_t) ** gamma * ce).mean()


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


def witness(target: Target) -> dict:
    """A sampled batch with its first transaction pushed to the corner its label agrees with."""
    batch = target.sample(np.random.default_rng(0))
    w = next(c.cell_contents for c in target.program.__closure__ if getattr(c.cell_contents, "shape", None) == (N_FEATURES,))
    sign = 1.0 if batch["y"][0] == 1 else -1.0
    batch["x"][0] = sign * BOUND * np.sign(w.detach().numpy())
    return batch
