"""GRIST subject ID_27, "PyTorchDeepLearningStart.0503_softmax_regression_cost": the softmax
cost of a tutorial chapter, written by hand on a free 3x5 logit tensor.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_27/0503_softmax_regression_cost.py
(github.com/Jacob-yen/GRIST), not copied. After printing a few worked examples the chapter
loops forever over: ``softmax`` of ``z`` (3x5, drawn by ``torch.rand`` after
``torch.manual_seed(1)``), three labels drawn by ``torch.randint(5, (3,))``, a one-hot made
with ``zeros_like`` + ``scatter_``, and the cost. No training.

Bug ID_27: ``(y_one_hot * -log(softmax(z, dim=1))).sum(dim=1).mean()``: a logit gap of more
than ~103.3 makes a probability exactly 0; ``log`` returns ``-inf`` and the cost NaN.

Data: ``z`` uniform in [0, 1) as drawn; labels are randomness inside the program (one per row).
Logits have no natural range and GRIST searched ``z`` unclipped: bounds ``+-bound``
(``_data.FREE_BOUND``).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target


def make_target(seed: int = 0, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)

    def program(batch):
        z = batch["z"]
        hypothesis = F.softmax(z, dim=1)
        labels = torch.randint(5, (len(z),)).long()
        one_hot = torch.zeros_like(hypothesis)
        one_hot.scatter_(1, labels.unsqueeze(1), 1)
        loss = (one_hot * -torch.log(hypothesis)).sum(dim=1).mean()  # GRIST bug ID_27
        return loss

    def sample(rng: np.random.Generator):
        return {"z": rng.random((3, 5)).astype(np.float32)}

    return Target(program=program, sample=sample, bounds={"z": (-bound, bound)}, search=["z"])
