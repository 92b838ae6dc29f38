"""GRIST subject ID_56, "start_beginner_kaggle.01": a beginner's logistic regression, its
binary cross-entropy written out by hand, trained by SGD on plain tensors.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_56/01_Logistic_Regression.py
(github.com/Jacob-yen/GRIST), not copied. The notebook first plots sigmoids with NumPy, then
trains ``sigmoid(x @ W + b)`` on six 2-feature rows (labels 0/0/0/1/1/1); ``W`` (2x1) and
``b`` (1) start at zero, are plain ``requires_grad`` tensors, and ``torch.optim.SGD(lr=1)``
steps on the full table in an endless loop.

Bug ID_56: ``-(y * log(h) + (1 - y) * log(1 - h)).mean()``: ``log(1 - h) = -inf`` once
``h`` rounds to 1.0 (``x @ W + b`` above ~16.6), ``log(h) = -inf`` once it underflows to 0.

Data: the program's own table. Bounds ``+-bound`` (see ``_data.FREE_BOUND``): GRIST
searched these features unclipped.
"""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

ROWS = np.array([[1, 2], [2, 3], [3, 1], [4, 3], [5, 3], [6, 2]], dtype=np.float32)
TARGETS = np.array([[0], [0], [0], [1], [1], [1]], dtype=np.float32)


def make_target(seed: int = 0, lr: float = 1.0, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)
    W = torch.zeros((2, 1), requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    sgd = torch.optim.SGD([W, b], lr=lr)

    def program(batch):
        x_train, y_train = batch["x"], batch["y"]
        h = torch.sigmoid(x_train.matmul(W) + b)
        return -(y_train * torch.log(h) + (1 - y_train) * torch.log(1 - h)).mean()  # GRIST bug ID_56

    def sample(rng: np.random.Generator):
        return {"x": ROWS.copy(), "y": TARGETS.copy()}

    return Target(program=program, sample=sample, optimizer=sgd,
                  bounds={"x": (-bound, bound)}, search=["x"])
