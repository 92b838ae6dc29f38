"""GRIST subject ID_33, "TodayILearned.logistic_classification": logistic regression with a
hand-written cross-entropy, SGD on plain tensors.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_33/logistic_classification.py
(github.com/Jacob-yen/GRIST), not copied. Six rows of two features, labels 0/0/0/1/1/1;
``W`` (2x1) and ``b`` (1) are zero-initialised plain tensors with ``requires_grad`` trained by
``torch.optim.SGD(lr=1)`` on the whole table at every step (an endless loop in the original,
``torch.manual_seed(1)`` at the top, though nothing in the loop is random).

Bug ID_33: ``-(y * log(h) + (1 - y) * log(1 - h)).mean()`` with ``h = sigmoid(x @ W + b)``:
``h`` rounds to 1.0 once ``x @ W + b`` passes ~16.6 (``log(1 - h) = -inf``, then NaN) or to 0
below ~-103.3. The original spreads the expression over two lines; here it is one line.

Data: the program's own table. Bounds ``+-bound`` for the unclipped features (see
``_data.FREE_BOUND``).
"""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

X_TABLE = np.array([[1, 2], [2, 3], [3, 1], [4, 3], [5, 3], [6, 2]], dtype=np.float32)
Y_TABLE = np.array([[0], [0], [0], [1], [1], [1]], dtype=np.float32)


def make_target(seed: int = 0, lr: float = 1.0, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)
    W = torch.zeros((2, 1), requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([W, b], lr=lr)

    def program(batch):
        hypothesis = torch.sigmoid(batch["x"].matmul(W) + b)
        y = batch["y"]
        cost = -(y * torch.log(hypothesis) + (1 - y) * torch.log(1 - hypothesis)).mean()  # GRIST bug ID_33
        return cost

    def sample(rng: np.random.Generator):
        return {"x": X_TABLE.copy(), "y": Y_TABLE.copy()}

    return Target(program=program, sample=sample, optimizer=optimizer,
                  bounds={"x": (-bound, bound)}, search=["x"])
