"""GRIST subject ID_22, "git1_rbm": a Bernoulli RBM on MNIST trained by contrastive divergence,
its free energy written with a hand-made softplus ``exp().add(1).log()``.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_22/My_pytorch1.py
(github.com/Jacob-yen/GRIST), not copied. ``RBM(n_vis=784, n_hid=500, k=1)``: ``W`` is
``randn(500, 784) * 1e-2``, both biases zero; ``vis_hid`` / ``hid_vis`` take sigmoids of the
linear maps and sample with ``relu(sign(p - rand))``; ``forward`` runs one Gibbs round trip
and returns the data and the model's sample. The loss is ``free_energy(v) - free_energy(v1)``
with ``free_energy(v) = mean(-sum(softplus(v W^T + h_bias)) - v . v_bias)``, optimised by
``torch.optim.SGD(lr=0.1)`` on mini-batches of 64 flattened images; each batch is first
binarised with ``.bernoulli()``.

Bug ID_22: ``wx_b.exp()`` in :meth:`RBM.free_energy` overflows to ``inf`` once a hidden
pre-activation passes ~88.72 (then ``log(inf) = inf`` and ``inf - inf`` is NaN in the loss).
``exp`` and ``log`` share the marked line, as in the original.

Data: MNIST (downloaded by the original) is replaced by ``_data.mnist_like`` (float32 pixels
in [0, 1], (N, 784)). Bounds: pixels [0, 1] (GRIST clipped to the data's min and max).
``binarize``: the original draws ``.bernoulli()`` of every batch; GRIST's instrumented entry
removed that draw (a draw has no gradient) and fed the pixels to the RBM directly; the suite
registers the bug with ``binarize=False``, as GRIST ran it.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.grist_suite.torch_programs._data import batch_rows, mnist_like
from fuzz_core import Target


class RBM(nn.Module):
    def __init__(self, n_vis: int, n_hid: int, k: int):
        super().__init__()
        self.W = nn.Parameter(torch.randn(n_hid, n_vis) * 1e-2)
        self.v_bias = nn.Parameter(torch.zeros(n_vis))
        self.h_bias = nn.Parameter(torch.zeros(n_hid))
        self.k = k

    def vis_hid(self, v):
        p_h = torch.sigmoid(F.linear(v, self.W, self.h_bias))
        return p_h, F.relu(torch.sign(p_h - torch.rand(p_h.size())))

    def hid_vis(self, h):
        p_v = torch.sigmoid(F.linear(h, self.W.t(), self.v_bias))
        return p_v, F.relu(torch.sign(p_v - torch.rand(p_v.size())))

    def forward(self, v):
        _, h_ = self.vis_hid(v)
        v_ = v
        for _ in range(self.k):
            _, v_ = self.hid_vis(h_)
            _, h_ = self.vis_hid(v_)
        return v, v_

    def free_energy(self, v):
        wx_b = F.linear(v, self.W, self.h_bias)
        vbias_term = v.mv(self.v_bias)
        hidden_term = wx_b.exp().add(1).log().sum(1)  # GRIST bug ID_22
        return (-hidden_term - vbias_term).mean()


def make_target(seed: int = 0, lr: float = 0.1, batch_size: int = 64, n_hid: int = 500, k: int = 1,
                binarize: bool = True) -> Target:
    images, labels = mnist_like(flat=True)
    torch.manual_seed(seed)
    rbm = RBM(n_vis=images.shape[1], n_hid=n_hid, k=k)
    train_op = torch.optim.SGD(rbm.parameters(), lr)

    def program(batch):
        data = batch["x"].view(-1, images.shape[1])
        sample_data = data.bernoulli() if binarize else data
        v, v1 = rbm(sample_data)
        return rbm.free_energy(v) - rbm.free_energy(v1)

    def sample(rng: np.random.Generator):
        rows = batch_rows(rng, len(images), batch_size)
        return {"x": images[rows], "y": labels[rows]}

    return Target(program=program, sample=sample, model=rbm, optimizer=train_op,
                  bounds={"x": (0.0, 1.0)}, search=["x"])
