"""GRIST subject ID_47, "Study.torch21_Softmax_Reg1": softmax regression over three classes, the
cross-entropy written by hand, SGD on plain tensors.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_47/torch21_Softmax_Reg1.py
(github.com/Jacob-yen/GRIST), not copied. Eight 4-feature rows, labels ``2 2 2 1 1 1 0 0``
one-hot encoded once (8x3); ``W`` (4x3) and a per-class bias ``b`` (3) are zero plain
``requires_grad`` tensors trained by ``torch.optim.SGD(lr=0.1)`` on the whole table at every
step (``torch.manual_seed(1)``; the loop never ends).

Bug ID_47: ``(y_one_hot * -log(softmax(x @ W + b, dim=1))).sum(dim=1).mean()``: a logit gap
above ~103.3 underflows a probability to 0; ``log(0) = -inf``, times a 0 label is NaN.

Data: the program's own table. Bounds ``+-bound`` (``_data.FREE_BOUND``; GRIST searched the
features unclipped).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

FEATURES = np.array([[1, 2, 1, 1], [2, 1, 3, 2], [3, 1, 3, 4], [4, 1, 5, 5],
                     [1, 7, 5, 5], [1, 2, 5, 6], [1, 6, 6, 6], [1, 7, 7, 7]], dtype=np.float32)
TARGET_ONE_HOT = np.eye(3, dtype=np.float32)[[2, 2, 2, 1, 1, 1, 0, 0]]


def make_target(seed: int = 0, lr: float = 0.1, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)
    W = torch.zeros((4, 3), requires_grad=True)
    b = torch.zeros(3, requires_grad=True)
    optimizer = torch.optim.SGD([W, b], lr=lr)

    def program(batch):
        probs = F.softmax(batch["x"].matmul(W) + b, dim=1)
        return (batch["y"] * -torch.log(probs)).sum(dim=1).mean()  # GRIST bug ID_47

    def sample(rng: np.random.Generator):
        return {"x": FEATURES.copy(), "y": TARGET_ONE_HOT.copy()}

    return Target(program=program, sample=sample, optimizer=optimizer,
                  bounds={"x": (-bound, bound)}, search=["x"])
