"""GRIST subject ID_34, "TodayILearned.softmax_classification": low-level softmax classification,
the one-hot labels and the cross-entropy built by hand inside the training loop.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_34/softmax_classification.py
(github.com/Jacob-yen/GRIST), not copied. Eight 4-feature rows with integer labels
``2 2 2 1 1 1 0 0``; ``W`` (4x3) and a single bias ``b`` (1) start at zero as plain
``requires_grad`` tensors; every step builds ``y_one_hot`` with ``zeros_like`` and
``scatter_``, computes the cost and lets ``torch.optim.SGD(lr=0.1)`` step (endless loop).

Bug ID_34: ``(y_one_hot * -log(softmax(x @ W + b, dim=1))).sum(dim=1).mean()``: a probability
underflows to 0 at a logit gap of ~103.3, ``log`` gives ``-inf`` and the cost NaN.

Data: the program's own table (labels as int64). Bounds ``+-bound`` (``_data.FREE_BOUND``:
GRIST searched the features unclipped).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

X_ROWS = np.array([[1, 2, 1, 1], [2, 1, 3, 2], [3, 1, 3, 4], [4, 1, 5, 5],
                   [1, 7, 5, 5], [1, 2, 5, 6], [1, 6, 6, 6], [1, 7, 7, 7]], dtype=np.float32)
Y_ROWS = np.array([2, 2, 2, 1, 1, 1, 0, 0], dtype=np.int64)


def make_target(seed: int = 0, lr: float = 0.1, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)
    W = torch.zeros((4, 3), requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([W, b], lr=lr)

    def program(batch):
        hypothesis = F.softmax(batch["x"].matmul(W) + b, dim=1)
        y_one_hot = torch.zeros_like(hypothesis)
        y_one_hot.scatter_(1, batch["y"].unsqueeze(1), 1)
        return (y_one_hot * -torch.log(hypothesis)).sum(dim=1).mean()  # GRIST bug ID_34

    def sample(rng: np.random.Generator):
        return {"x": X_ROWS.copy(), "y": Y_ROWS.copy()}

    return Target(program=program, sample=sample, optimizer=optimizer,
                  bounds={"x": (-bound, bound)}, search=["x"])
