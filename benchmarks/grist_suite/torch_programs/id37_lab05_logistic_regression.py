"""GRIST subject ID_37, "MachineLearning.lab05": a ``Linear(2, 1) + Sigmoid`` classifier whose
cross-entropy is written by hand, trained by SGD.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_37/lab-05-1-logistic_regression.py
(github.com/Jacob-yen/GRIST), not copied. Six rows of two features (labels 0/0/0/1/1/1),
a ``torch.nn.Sequential(Linear(2, 1), Sigmoid())`` initialised by PyTorch's defaults after
``torch.manual_seed(777)``, ``torch.optim.SGD(lr=0.01)`` stepping on the full table forever.

Bug ID_37: ``-(Y * log(h) + (1 - Y) * log(1 - h)).mean()``: ``h`` rounds to 1.0 once the
linear output passes ~16.6 (``log(1 - h) = -inf``, NaN after ``0 * -inf``) and to 0 below
~-103.3. The original breaks the expression over two lines; it is one line here.

Data: the program's own table. Bounds ``+-bound`` (see ``_data.FREE_BOUND``; GRIST searched
``X`` unclipped). The original's seed (777) is ``init_seed``; the campaign seed is added to it.
"""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

X_DATA = np.array([[1, 2], [2, 3], [3, 1], [4, 3], [5, 3], [6, 2]], dtype=np.float32)
Y_DATA = np.array([[0], [0], [0], [1], [1], [1]], dtype=np.float32)


def make_target(seed: int = 0, lr: float = 0.01, init_seed: int = 777, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(init_seed + seed)
    model = torch.nn.Sequential(torch.nn.Linear(2, 1, bias=True), torch.nn.Sigmoid())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def program(batch):
        X, Y = batch["x"], batch["y"]
        hypothesis = model(X)
        return -(Y * torch.log(hypothesis) + (1 - Y) * torch.log(1 - hypothesis)).mean()  # GRIST bug ID_37

    def sample(rng: np.random.Generator):
        return {"x": X_DATA.copy(), "y": Y_DATA.copy()}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-bound, bound)}, search=["x"])
