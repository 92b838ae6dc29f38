"""GRIST subject ID_23, "pytorch_tu": the low-level softmax cost of a tutorial, on a free logit
tensor, with fresh random labels at every step.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_23/ch5.3_softmax.py
(github.com/Jacob-yen/GRIST), not copied. ``z`` is a 3x5 logit tensor drawn by
``torch.rand`` (uniform in [0, 1)); every iteration of the endless loop draws three labels
with ``torch.randint(5, (3,))``, one-hot encodes them with ``zeros_like`` + ``scatter_`` and
evaluates the cost. Nothing is trained.

Bug ID_23: ``(y_one_hot * -log(softmax(z, dim=1))).sum(dim=1).mean()``: at a logit gap above
~103.3 a probability underflows to 0, ``log(0) = -inf`` and ``0 * -inf`` is NaN.

Data: ``z`` sampled as the original draws it; the labels are randomness inside the program
(one per row of ``z``, so the program runs on any number of rows). ``z`` holds logits, which
have no natural range; GRIST searched it unclipped: bounds ``+-bound`` (``_data.FREE_BOUND``).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

ROWS, CLASSES = 3, 5


def make_target(seed: int = 0, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)

    def program(batch):
        z = batch["z"]
        hypothesis = F.softmax(z, dim=1)
        y = torch.randint(CLASSES, (z.shape[0],)).long()
        y_one_hot = torch.zeros_like(hypothesis)
        y_one_hot.scatter_(1, y.unsqueeze(1), 1)
        return (y_one_hot * -torch.log(hypothesis)).sum(dim=1).mean()  # GRIST bug ID_23

    def sample(rng: np.random.Generator):
        return {"z": rng.random((ROWS, CLASSES), dtype=np.float32)}

    return Target(program=program, sample=sample, bounds={"z": (-bound, bound)}, search=["z"])
