"""GRIST subject ID_26, "PyTorchDeepLearningStart.0401_logistic_regression": a hand-written
binary cross-entropy trained by SGD on plain tensors.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_26/0401_logistic_regression.py
(github.com/Jacob-yen/GRIST), not copied. The tutorial fits a logistic regression
``sigmoid(x @ W + b)`` to six 2-feature rows with labels 0/0/0/1/1/1. ``W`` (2x1) and ``b`` (1)
are plain tensors created as zeros with ``requires_grad``, handed to ``torch.optim.SGD`` at
``lr=1``; the loop runs forever, training on the full six-row table at every step.

Bug ID_26: the cost is written by hand as ``-(y log h + (1 - y) log(1 - h)).mean()``. Once a
row's ``x @ W + b`` exceeds ~16.6, ``h`` rounds to exactly 1.0 in float32 and
``log(1 - h) = -inf`` (and ``0 * -inf`` is NaN); below ~-103.3 ``h`` is 0 and ``log(h) = -inf``.
Both logs sit on the marked line, as in the original.

Data: the program's own six rows (no download). GRIST searched ``x`` unclipped; bounds are
``+-bound`` (see ``_data.FREE_BOUND``). With ``W = 0`` at the start no input can trigger it:
the program's own SGD step has to move ``W`` first.
"""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

FEATURES = np.array([[1, 2], [2, 3], [3, 1], [4, 3], [5, 3], [6, 2]], dtype=np.float32)
LABELS = np.array([[0], [0], [0], [1], [1], [1]], dtype=np.float32)


def make_target(seed: int = 0, lr: float = 1.0, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)
    weight = torch.zeros((2, 1), requires_grad=True)
    bias = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight, bias], lr=lr)

    def program(batch):
        x, y = batch["x"], batch["y"]
        h = torch.sigmoid(x.matmul(weight) + bias)
        return -(y * torch.log(h) + (1 - y) * torch.log(1 - h)).mean()  # GRIST bug ID_26

    def sample(rng: np.random.Generator):
        return {"x": FEATURES.copy(), "y": LABELS.copy()}

    return Target(program=program, sample=sample, optimizer=optimizer,
                  bounds={"x": (-bound, bound)}, search=["x"])
