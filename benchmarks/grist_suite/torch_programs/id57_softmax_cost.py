"""GRIST subject ID_57, "start_beginner_kaggle.03": a beginner's hand-written softmax cost on a
free 3x5 logit tensor, labels redrawn at every step.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_57/03_softmax_cost.py
(github.com/Jacob-yen/GRIST), not copied. ``z`` is drawn by ``torch.rand(3, 5)`` after
``torch.manual_seed(1)``; the endless loop computes ``softmax(z, dim=1)``, draws labels with
``torch.randint(5, (3,))``, builds their one-hot with ``zeros_like`` + ``scatter_`` and the
cross-entropy. No training.

Bug ID_57: ``(y_one_hot * -log(softmax(z, dim=1))).sum(dim=1).mean()``: ``log`` of a
probability that underflowed to 0 (logit gap above ~103.3) is ``-inf``; the cost turns NaN.

Data: ``z`` uniform in [0, 1) as drawn by the original; one random label per row, drawn
inside the program. Bounds ``+-bound`` (``_data.FREE_BOUND``; GRIST searched ``z`` unclipped).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

SHAPE = (3, 5)


def make_target(seed: int = 0, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)

    def program(batch):
        z = batch["z"]
        hypothesis = F.softmax(z, dim=1)
        y = torch.randint(SHAPE[1], (z.shape[0],)).long()
        y_one_hot = torch.zeros_like(hypothesis)
        y_one_hot.scatter_(1, y.unsqueeze(1), 1)
        cost = (y_one_hot * -torch.log(hypothesis)).sum(dim=1).mean()  # GRIST bug ID_57
        return cost

    def sample(rng: np.random.Generator):
        return {"z": rng.random(SHAPE, dtype=np.float32)}

    return Target(program=program, sample=sample, bounds={"z": (-bound, bound)}, search=["z"])
