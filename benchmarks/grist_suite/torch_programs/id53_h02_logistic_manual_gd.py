"""GRIST subject ID_53, "DataScience.h02": a one-feature logistic regression trained by hand-written
gradient descent (no optimizer object), its cross-entropy written out.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_53/h02_20191644.py
(github.com/Jacob-yen/GRIST), not copied. Twelve rows of one feature (hours, 0..5) with 0/1
labels; ``W`` (1x1) and ``b`` (1x1) are plain zero tensors. Each step turns on
``requires_grad``, computes ``sigmoid(x @ W + b)`` and the cost, calls ``cost.backward()``
and, under ``torch.no_grad()``, rebinds ``W = W - lr * W.grad`` and ``b = b - lr * b.grad``
with ``lr = 1.0`` (fresh tensors: gradients never accumulate).

That training is the factory's ``train_step`` (the engine calls it after each search step
on the searched batch, as the original loop trains on its data); ``W`` and ``b`` are rebound
in the enclosing scope exactly as the original rebinds its globals.

Bug ID_53: ``mean(-y * log(h) - (1 - y) * log(1 - h))``: ``h`` rounds to 1.0 once
``x @ W + b`` passes ~16.6 (``log(1 - h) = -inf``; ``0 * -inf`` is NaN) and to 0 below ~-103.3.

Data: the program's own twelve rows. Bounds ``+-bound`` (``_data.FREE_BOUND``; GRIST searched
``x`` unclipped).
"""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

HOURS = np.array([[1], [2], [3], [4], [5], [2.5], [3.5], [0], [3.1], [2.7], [2.8], [2.9]], dtype=np.float32)
PASSED = np.array([[1], [1], [1], [0], [0], [0], [0], [1], [0], [1], [1], [1]], dtype=np.float32)


def make_target(seed: int = 0, lr: float = 1.0, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)
    W = torch.zeros(1, 1)
    b = torch.zeros(1, 1)

    def cost_of(x, y):
        hypothesis = torch.sigmoid(torch.mm(x, W) + b)
        return torch.mean(-y * torch.log(hypothesis) - (1 - y) * torch.log(1 - hypothesis))  # GRIST bug ID_53

    def program(batch):
        return cost_of(batch["x"], batch["y"])

    def train_step(batch):
        nonlocal W, b
        W.requires_grad_(True)
        b.requires_grad_(True)
        cost = cost_of(batch["x"], batch["y"])
        cost.backward()
        with torch.no_grad():
            W = W - lr * W.grad
            b = b - lr * b.grad
        return cost

    def sample(rng: np.random.Generator):
        return {"x": HOURS.copy(), "y": PASSED.copy()}

    return Target(program=program, sample=sample, train_step=train_step,
                  bounds={"x": (-bound, bound)}, search=["x"])
