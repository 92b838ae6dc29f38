"""GRIST subject ID_38, "MachineLearning.lab09": XOR fitted by a single ``Linear(2, 1) + Sigmoid``
with a hand-written cross-entropy, trained by SGD.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_38/lab-09-1-xor.py
(github.com/Jacob-yen/GRIST), not copied. The four XOR rows (``[0,0] [0,1] [1,0] [1,1]`` ->
``0 1 1 0``), ``torch.nn.Sequential(Linear(2, 1), Sigmoid())`` with PyTorch's default
initialisation after ``torch.manual_seed(777)``, ``torch.optim.SGD(lr=0.1)`` on the full
table at every step of an endless loop (a linear model cannot learn XOR: it never converges).

Bug ID_38: ``-(Y * log(h) + (1 - Y) * log(1 - h)).mean()``: ``h`` is exactly 1.0 once the
linear output passes ~16.6 (``log(1 - h) = -inf``) and exactly 0 below ~-103.3.

Data: the program's own four rows. The inputs are bits in the tutorial, but the program
takes any float and GRIST searched them unclipped: bounds ``+-bound`` (``_data.FREE_BOUND``).
Seed: ``init_seed`` (the original's 777) plus the campaign seed.
"""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

XOR_IN = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=np.float32)
XOR_OUT = np.array([[0], [1], [1], [0]], dtype=np.float32)


def make_target(seed: int = 0, lr: float = 0.1, init_seed: int = 777, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(init_seed + seed)
    linear = torch.nn.Linear(2, 1, bias=True)
    model = torch.nn.Sequential(linear, torch.nn.Sigmoid())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def program(batch):
        h = model(batch["x"])
        Y = batch["y"]
        return -(Y * torch.log(h) + (1 - Y) * torch.log(1 - h)).mean()  # GRIST bug ID_38

    def sample(rng: np.random.Generator):
        return {"x": XOR_IN.copy(), "y": XOR_OUT.copy()}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-bound, bound)}, search=["x"])
