"""GRIST subject ID_54, "DataScience.h03": softmax regression with a hand-written cross-entropy,
trained by Adam on plain tensors.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_54/h03_20191644.py
(github.com/Jacob-yen/GRIST), not copied. Eight 4-feature rows with one-hot float labels
(classes ``2 2 2 1 1 1 0 0``); ``W`` (4x3) and ``b`` (1x3) are zero plain ``requires_grad``
tensors handed to ``torch.optim.Adam(lr=0.1)``, which steps on the full table forever.

Bug ID_54: ``-mean(sum(y * log(softmax(x @ W + b, dim=1)), dim=1))``: once a row's logit gap
passes ~103.3 a probability is exactly 0 and ``log`` returns ``-inf`` (NaN after ``0 * -inf``).

Data: the program's own table: four features per row that are small counts, 1 to 7.

Bounds: none declared, so the engine's box for an input without bounds applies: the data's range
grown by its spread on each side, never across zero (``fuzz_core.backends.base.data_box``): ``[0, 13]``.
GRIST's entry (``h03_20191644_grist.py``) searched the features unclipped (``update_batch_data(...,
clip=False)``) by sign steps of 0.15, so after ``k`` iterations a feature was at most ``7 + 0.15 k``;
an engine's box must be finite, and the suite's old ``+-100`` (``_data.FREE_BOUND``, sized for free
logits) put a logit gap of 103 within one step of data that are counts: ``adaptive`` found it in 3
steps, and any box as wide makes the bug a matter of the box, not of the search. GRIST's clip, where it
clips, is the first batch's range (``GradientSearcher.build(min_val, max_val)``): ``[1, 7]`` here, in
which no search of 1000 steps reaches the edge (five seeds of ``adaptive``, and ``random``). The
engine's own default is what a user who declares no bounds gets; ``bound`` still gives ``+-bound``.
"""
from __future__ import annotations

import numpy as np
import torch

from fuzz_core import Target

X_T = np.array([[1, 2, 1, 1], [2, 1, 3, 2], [3, 1, 3, 4], [4, 1, 5, 5],
                [1, 7, 5, 5], [1, 2, 5, 6], [1, 6, 6, 6], [1, 7, 7, 7]], dtype=np.float32)
Y_T = np.array([[0, 0, 1], [0, 0, 1], [0, 0, 1], [0, 1, 0],
                [0, 1, 0], [0, 1, 0], [1, 0, 0], [1, 0, 0]], dtype=np.float32)


def make_target(seed: int = 0, lr: float = 0.1, bound: float | None = None) -> Target:
    torch.manual_seed(seed)
    W = torch.zeros(4, 3, requires_grad=True)
    b = torch.zeros(1, 3, requires_grad=True)
    optimizer = torch.optim.Adam([W, b], lr=lr)

    def program(batch):
        hypothesis = torch.softmax(torch.mm(batch["x"], W) + b, dim=1)
        return -torch.mean(torch.sum(batch["y"] * torch.log(hypothesis), dim=1))  # GRIST bug ID_54

    def sample(rng: np.random.Generator):
        return {"x": X_T.copy(), "y": Y_T.copy()}

    return Target(program=program, sample=sample, optimizer=optimizer,
                  bounds={} if bound is None else {"x": (-bound, bound)}, search=["x"])
