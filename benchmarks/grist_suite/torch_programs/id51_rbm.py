"""GRIST subject ID_51, "RBM": a Bernoulli RBM trained on MNIST by one-step contrastive divergence,
its free energy using ``exp().add(1).log()`` for the softplus.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_51/rbm.py
(github.com/Jacob-yen/GRIST), not copied. ``RBM(n_vis=784, n_hin=500)`` built with ``k=1``:
``W = randn(500, 784) * 1e-2``, zero biases; ``v_to_h`` / ``h_to_v`` are sigmoids of the linear
maps, ``sample_from_p(p) = relu(sign(p - rand))``; ``forward`` returns the data and one Gibbs
round trip's visible sample. Loss ``free_energy(v) - free_energy(v1)``, where
``free_energy(v) = mean(-sum(log(1 + exp(v W^T + h_bias))) - v . v_bias)``, stepped by
``torch.optim.SGD(lr=0.1)`` over batches of 64 flattened images, each binarised by
``.bernoulli()`` first.

Bug ID_51: ``wx_b.exp()`` in :meth:`RBM.free_energy`: a hidden pre-activation above ~88.72
overflows to ``inf``; ``log(inf)`` stays ``inf`` and the loss becomes ``inf - inf = NaN``.

Data: MNIST replaced by ``_data.mnist_like`` (float32 in [0, 1], (N, 784)). Bounds: pixels
[0, 1] (GRIST clipped to the data's range). ``binarize`` keeps the original's ``.bernoulli()``
draw; GRIST's instrumented entry dropped it and searched the pixels directly, and the suite
registers the bug with ``binarize=False`` accordingly.
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
        _, h1 = self.v_to_h(v)
        h_, v_ = h1, v
        for _ in range(self.k):
            _, v_ = self.h_to_v(h_)
            _, h_ = self.v_to_h(v_)
        return v, v_

    def free_energy(self, v):
        vbias_term = v.mv(self.v_bias)
        wx_b = F.linear(v, self.W, self.h_bias)
        hidden_term = wx_b.exp().add(1).log().sum(1)  # GRIST bug ID_51
        return (-hidden_term - vbias_term).mean()


def make_target(seed: int = 0, lr: float = 0.1, batch_size: int = 64, k: int = 1,
                binarize: bool = True) -> Target:
    images, labels = mnist_like(flat=True)
    torch.manual_seed(seed)
    rbm = RBM(n_vis=images.shape[1], k=k)
    train_op = torch.optim.SGD(rbm.parameters(), lr)

    def program(batch):
        data = batch["x"].view(-1, 784)
        sample_data = data.bernoulli() if binarize else data
        v, v1 = rbm(sample_data)
        return rbm.free_energy(v) - rbm.free_energy(v1)

    def sample(rng: np.random.Generator):
        rows = batch_rows(rng, len(images), batch_size)
        return {"x": images[rows], "y": labels[rows]}

    return Target(program=program, sample=sample, model=rbm, optimizer=train_op,
                  bounds={"x": (0.0, 1.0)}, search=["x"])
