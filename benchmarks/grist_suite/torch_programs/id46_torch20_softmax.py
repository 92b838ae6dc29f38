"""GRIST subject ID_46, "Study.torch20_softmax": a study note's softmax cost on a free logit
tensor, labels redrawn at every step.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_46/torch20_softmax.py
(github.com/Jacob-yen/GRIST), not copied. ``z`` (3x5) comes from ``torch.rand`` after
``torch.manual_seed(1)``; each pass of the endless loop takes ``softmax(z, dim=1)``, draws
three labels with ``torch.randint(5, (3,))``, one-hot encodes them (``zeros_like`` +
``scatter_``) and computes the hand-written cross-entropy. Nothing is trained.

Bug ID_46: ``(y_one_hot * -log(softmax(z))).sum(dim=1).mean()``: a logit gap above ~103.3
underflows a probability to 0; ``log(0) = -inf``; ``0 * -inf`` is NaN.

Data: ``z`` uniform in [0, 1) as the original draws it; labels are randomness inside the
program, one per row. Bounds ``+-bound`` for the logits (``_data.FREE_BOUND``; GRIST searched
``z`` unclipped).
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
        p = F.softmax(z, dim=1)
        y = torch.randint(5, (z.size(0),)).long()
        target = torch.zeros_like(p)
        target.scatter_(1, y.unsqueeze(1), 1)
        return (target * -torch.log(p)).sum(dim=1).mean()  # GRIST bug ID_46

    def sample(rng: np.random.Generator):
        return {"z": rng.uniform(0.0, 1.0, size=(3, 5)).astype(np.float32)}

    return Target(program=program, sample=sample, bounds={"z": (-bound, bound)}, search=["z"])
