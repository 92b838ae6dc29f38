"""GRIST subject ID_62, "gongdols.denoising_RBM": an RBM on FashionMNIST trained with Adam, the
softplus of its free energy written ``log(exp(x) + 1)``.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_62/denoising_RBM.py
(github.com/Jacob-yen/GRIST), not copied. ``RBM(k=1)`` with 784 visible and 500 hidden
units, ``W = randn(500, 784) * 1e-2`` and zero biases; Gibbs sampling by
``relu(sign(p - rand))``; loss ``free_energy(v) - free_energy(v1)`` with
``free_energy(v) = mean(-sum(log(exp(v W^T + h_bias) + 1)) - v . v_bias)``;
``torch.optim.Adam(lr=0.005)``; shuffled batches of 64 flattened images fed as they are
(an ``add_noise`` helper is defined by the original but never called).

Bug ID_62: ``torch.exp(wx_b)`` in :meth:`RBM.free_energy` overflows past ~88.72; ``log(inf)``
is ``inf`` and the loss ``inf - inf`` NaN.

Data: FashionMNIST (downloaded by the original) is replaced by ``_data.mnist_like``: the
same shape (N, 784), dtype float32 and range [0, 1] as ``ToTensor()`` gives, digits instead
of garments. Bounds: pixels [0, 1] (GRIST clipped to the data's min and max).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.grist_suite.torch_programs._data import batch_rows, mnist_like
from fuzz_core import Target


class RBM(nn.Module):
    def __init__(self, n_vis: int = 784, n_hin: int = 500, k: int = 5):
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
        _, h_ = self.v_to_h(v)
        v_ = v
        for _ in range(self.k):
            _, v_ = self.h_to_v(h_)
            _, h_ = self.v_to_h(v_)
        return v, v_

    def free_energy(self, v):
        vbias_term = v.mv(self.v_bias)
        wx_b = F.linear(v, self.W, self.h_bias)
        temp = torch.log(torch.exp(wx_b) + 1)  # GRIST bug ID_62
        hidden_term = torch.sum(temp, dim=1)
        return (-hidden_term - vbias_term).mean()


def make_target(seed: int = 0, lr: float = 0.005, batch_size: int = 64, k: int = 1) -> Target:
    images, labels = mnist_like(flat=True)
    torch.manual_seed(seed)
    rbm = RBM(k=k)
    train_op = torch.optim.Adam(rbm.parameters(), lr)

    def program(batch):
        data = batch["x"].view(-1, 784)
        v, v1 = rbm(data)
        return rbm.free_energy(v) - rbm.free_energy(v1)

    def sample(rng: np.random.Generator):
        rows = batch_rows(rng, len(images), batch_size)
        return {"x": images[rows], "y": labels[rows]}

    return Target(program=program, sample=sample, model=rbm, optimizer=train_op,
                  bounds={"x": (0.0, 1.0)}, search=["x"])
