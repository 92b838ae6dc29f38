"""GRIST subject ID_12, "Skorch": skorch's ``NeuralNetClassifier`` training an MNIST MLP whose
module ends in ``softmax``; skorch takes the ``log`` of those probabilities for ``NLLLoss``.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_12/main.py and skorch's
``NeuralNetClassifier.get_loss`` in scripts/study_case/ID_12/skorch/classifier.py
(github.com/Jacob-yen/GRIST), not copied; skorch itself is not needed. The program's module
is ``Linear(784, 98) -> ReLU -> Dropout(0.5) -> Linear(98, 10) -> softmax(dim=-1)`` with
PyTorch's default initialisation after ``torch.manual_seed(0)``; skorch's defaults train it:
``torch.optim.SGD`` at the given ``lr=0.1``, mini-batches of 128, criterion ``NLLLoss``, which
skorch feeds with ``torch.log(y_proba)`` because the module returns probabilities.

Bug ID_12: ``torch.log(y_proba)`` in :func:`get_loss`: a probability that underflowed to 0
(logit gap above ~103.3) gives ``-inf``; ``NLLLoss`` turns it into an infinite loss when it is
the label's and the backward into NaN.

Data: the original fetches MNIST (70,000 x 784) from OpenML and divides by 255; here the
stand-in digits of ``_data.mnist_like`` (float32 in [0, 1], (N, 784), labels 0..9), split as
the original splits (``train_test_split(test_size=0.25, random_state=42)``) and then as
skorch's default ``CVSplit(5, stratified=True)`` holds out its first fold. Bounds: pixels
[0, 1] (GRIST clipped to the data's min and max).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.grist_suite.torch_programs._data import batch_rows, mnist_like
from fuzz_core import Target


class ClassifierModule(nn.Module):
    def __init__(self, input_dim: int = 784, hidden_dim: int = 98, output_dim: int = 10, dropout: float = 0.5):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.hidden = nn.Linear(input_dim, hidden_dim)
        self.output = nn.Linear(hidden_dim, output_dim)

    def forward(self, X):
        X = F.relu(self.hidden(X))
        X = self.dropout(X)
        return F.softmax(self.output(X), dim=-1)


def get_loss(y_proba, y_true):
    """skorch's classifier loss with its default ``NLLLoss`` criterion."""
    y_log = torch.log(y_proba)  # GRIST bug ID_12
    return F.nll_loss(y_log, y_true)


def training_rows():
    from sklearn.model_selection import StratifiedKFold, train_test_split

    X, y = mnist_like(flat=True)
    X_train, _, y_train, _ = train_test_split(X, y, test_size=0.25, random_state=42)
    train_idx, _ = next(StratifiedKFold(n_splits=5).split(X_train, y_train))
    return X_train[train_idx], y_train[train_idx]


def make_target(seed: int = 0, lr: float = 0.1, batch_size: int = 128) -> Target:
    X_train, y_train = training_rows()
    torch.manual_seed(seed)
    module = ClassifierModule(input_dim=X_train.shape[1], hidden_dim=X_train.shape[1] // 8,
                              output_dim=len(np.unique(y_train)))
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)

    def program(batch):
        return get_loss(module(batch["x"]), batch["y"])

    def sample(rng: np.random.Generator):
        rows = batch_rows(rng, len(X_train), batch_size)
        return {"x": X_train[rows], "y": y_train[rows]}

    return Target(program=program, sample=sample, model=module, optimizer=optimizer,
                  bounds={"x": (0.0, 1.0)}, search=["x"])
