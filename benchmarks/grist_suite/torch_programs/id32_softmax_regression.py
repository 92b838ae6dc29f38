"""GRIST subject ID_32, "PyTorchDeepLearningStart.0504_softmax_regression": a 3-class softmax
regression with a hand-written cross-entropy, trained by SGD on plain tensors.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_32/0504_softmax_regression.py
(github.com/Jacob-yen/GRIST), not copied. Eight rows of four features, labels
``2 2 2 1 1 1 0 0`` turned into a one-hot (8x3) table before the loop; ``W`` (4x3) and a
single shared bias ``b`` (shape (1,)) start at zero as plain ``requires_grad`` tensors,
``torch.optim.SGD(lr=0.1)`` steps on the full table forever (``torch.manual_seed(1)``).

Bug ID_32: ``(y_one_hot * -log(softmax(x @ W + b))).sum().mean()``: once the gap between a
row's largest and smallest logit passes ~103.3 the smallest probability underflows to 0,
``log`` gives ``-inf`` and ``0 * -inf`` makes the cost NaN whatever the label.

Data: the program's own table. Bounds ``+-bound`` (``_data.FREE_BOUND``: GRIST searched the
features unclipped). With ``W = 0`` the logits start equal: only the program's own SGD steps
give the inputs any leverage.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

X_TRAIN = np.array([[1, 2, 1, 1], [2, 1, 3, 2], [3, 1, 3, 4], [4, 1, 5, 5],
                    [1, 7, 5, 5], [1, 2, 5, 6], [1, 6, 6, 6], [1, 7, 7, 7]], dtype=np.float32)
CLASSES = np.array([2, 2, 2, 1, 1, 1, 0, 0])
ONE_HOT = np.eye(3, dtype=np.float32)[CLASSES]


def make_target(seed: int = 0, lr: float = 0.1, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)
    W = torch.zeros((4, 3), requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([W, b], lr=lr)

    def program(batch):
        hypothesis = F.softmax(batch["x"].matmul(W) + b, dim=1)
        return (batch["y"] * -torch.log(hypothesis)).sum().mean()  # GRIST bug ID_32

    def sample(rng: np.random.Generator):
        return {"x": X_TRAIN.copy(), "y": ONE_HOT.copy()}

    return Target(program=program, sample=sample, optimizer=optimizer,
                  bounds={"x": (-bound, bound)}, search=["x"])
