"""GRIST subject ID_63, "gongdols.main": an RBM on MNIST trained with Adam, its free energy's
softplus written ``log(exp(x) + 1)``.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_63/main.py
(github.com/Jacob-yen/GRIST), not copied. ``RBM(k=1)``: 784 visible and 500 hidden units,
``W = randn(500, 784) * 1e-2``, zero biases; hidden and visible samples drawn as
``relu(sign(p - rand))``; loss ``free_energy(v) - free_energy(v1)`` with
``free_energy(v) = mean(-sum(log(exp(v W^T + h_bias) + 1)) - v . v_bias)``, optimised by
``torch.optim.Adam(lr=0.005)`` over batches of 64 flattened images (not binarised).

Bug ID_63: ``torch.exp(wx_b)`` in :meth:`RBM.free_energy` overflows to ``inf`` once a hidden
pre-activation passes ~88.72; the loss becomes ``inf - inf = NaN``. (The original spreads
the ``log(exp(...) + 1)`` over three lines; here it is one.)

Data: MNIST replaced by ``_data.mnist_like`` (float32 in [0, 1], (N, 784)). Bounds: pixels
[0, 1] (GRIST clipped to the data's min and max).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.grist_suite.torch_programs._data import batch_rows, mnist_like
from fuzz_core import Target

N_VIS, N_HID = 784, 500


class RBM(nn.Module):
    def __init__(self, n_vis: int = N_VIS, n_hin: int = N_HID, k: int = 5):
        super().__init__()
        self.W = nn.Parameter(torch.randn(n_hin, n_vis) * 1e-2)
        self.v_bias = nn.Parameter(torch.zeros(n_vis))
        self.h_bias = nn.Parameter(torch.zeros(n_hin))
        self.k = k

    def sample_from_p(self, p):
        return F.relu(torch.sign(p - torch.rand(p.size())))

    def v_to_h(self, v):
        p_h = torch.sigmoid(F.linear(v, self.W, self.h_bias))
        return p_h, self.sample_from_p(p_h)

    def h_to_v(self, h):
        p_v = torch.sigmoid(F.linear(h, self.W.t(), self.v_bias))
        return p_v, self.sample_from_p(p_v)

    def forward(self, v):
        _, h1 = self.v_to_h(v)
        h_, v_ = h1, v
        for _ in range(self.k):
            _, v_ = self.h_to_v(h_)
            _, h_ = self.v_to_h(v_)
        return v, v_

    def free_energy(self, v):
        vbias_term = v.mv(self.v_bias)
        wx_b = F.linear(v, self.W, self.h_bias)
        temp = torch.log(torch.exp(wx_b) + 1)  # GRIST bug ID_63
        return (-torch.sum(temp, dim=1) - vbias_term).mean()


def make_target(seed: int = 0, lr: float = 0.005, batch_size: int = 64, k: int = 1) -> Target:
    images, labels = mnist_like(flat=True)
    torch.manual_seed(seed)
    rbm = RBM(k=k)
    train_op = torch.optim.Adam(rbm.parameters(), lr)

    def program(batch):
        v, v1 = rbm(batch["x"].view(-1, N_VIS))
        return rbm.free_energy(v) - rbm.free_energy(v1)

    def sample(rng: np.random.Generator):
        rows = batch_rows(rng, len(images), batch_size)
        return {"x": images[rows], "y": labels[rows]}

    return Target(program=program, sample=sample, model=rbm, optimizer=train_op,
                  bounds={"x": (0.0, 1.0)}, search=["x"])
