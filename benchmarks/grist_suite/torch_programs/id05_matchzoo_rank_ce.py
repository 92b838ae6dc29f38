"""GRIST subject ID_5, "MatchZoo": MatchZoo's rank cross-entropy loss, ``log`` of a softmax.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_5/tests/test_losses.py and
scripts/study_case/ID_5/matchzoo/losses/rank_cross_entropy_loss.py
(github.com/Jacob-yen/GRIST), not copied. The test scores six documents (``pred``, 6x1,
redrawn with ``torch.rand`` at every step of an endless loop) against relevance labels
``1 0 0 0 1 0`` with ``num_neg=2``: the loss takes every third row as a positive and the next
two as its negatives, concatenates each group's scores into one row of logits (2x3) and
labels, and returns ``-mean(sum(labels * log(softmax(logits, dim=-1)), dim=-1))``.

Bug ID_5: ``torch.log(F.softmax(logits))``: a probability underflows to 0 at a score gap of
~103.3 within a group, ``log(0) = -inf`` and ``0 * -inf`` is NaN. (MatchZoo later added an
epsilon inside the log.) GRIST's harness called a variant of the loss that takes ``sqrt``
in place of ``log``, which cannot go non-finite; this factory keeps the library's ``log``.

Data: scores uniform in [0, 1) as the test draws them, labels fixed. Rows are grouped by
position (batch on dimension 0: six scored documents), so the program needs all six rows.
Model scores have no natural range; GRIST searched them unclipped: bounds ``+-bound``
(``_data.FREE_BOUND``).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

RELEVANCE = np.array([[1.0], [0.0], [0.0], [0.0], [1.0], [0.0]], dtype=np.float32)


class RankCrossEntropyLoss(torch.nn.Module):
    def __init__(self, num_neg: int = 1):
        super().__init__()
        self.num_neg = num_neg

    def forward(self, y_pred, y_true):
        step = self.num_neg + 1
        logits, labels = y_pred[::step, :], y_true[::step, :]
        for k in range(1, step):
            logits = torch.cat((logits, y_pred[k::step, :]), dim=-1)
            labels = torch.cat((labels, y_true[k::step, :]), dim=-1)
        return -torch.mean(torch.sum(labels * torch.log(F.softmax(logits, dim=-1)), dim=-1))  # GRIST bug ID_5


def make_target(seed: int = 0, num_neg: int = 2, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)
    loss_fn = RankCrossEntropyLoss(num_neg=num_neg)

    def program(batch):
        return loss_fn(batch["pred"], batch["true"])

    def sample(rng: np.random.Generator):
        return {"pred": rng.random(RELEVANCE.shape, dtype=np.float32), "true": RELEVANCE.copy()}

    return Target(program=program, sample=sample, bounds={"pred": (-bound, bound)}, search=["pred"])
