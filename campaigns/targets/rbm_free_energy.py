"""Gaussian-Bernoulli RBM used as an anomaly score: ``exp`` in a hand-written softplus overflows.

An RBM with 128 real-valued (standardised) visible units and 64 binary hidden units
scores a batch of sensor readings by its mean free energy
``F(v) = 0.5 * ||v - b||^2 - sum_j log(1 + exp(v @ W + c)_j)``, the softplus written out
by hand. Its weights are initialised as in the deeplearning.net RBM tutorial,
``U(+-4 * sqrt(6 / (n_vis + n_hid)))``; the program only evaluates (no optimizer).

Bug: ``torch.exp(v @ W + c)`` in :meth:`RBM.free_energy`. It overflows to ``inf`` once a
hidden pre-activation exceeds 88.72 (``log(1 + inf) = inf``, and the free energy is
``-inf``).

Why reachable within the bounds: readings are standardised and clipped to ``[-4, 4]``;
a pre-activation reaches ``4 * sum|W_j| ~ 200`` where ``v`` takes the sign of a hidden
unit's weights, while real readings (Gaussian) give pre-activations below ~25 and
uniformly random ones below ~55.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target

N_VIS, N_HID, BOUND = 128, 64, 4.0


class RBM(nn.Module):
    def __init__(self, n_vis: int = N_VIS, n_hid: int = N_HID):
        super().__init__()
        a = 4 * math.sqrt(6.0 / (n_vis + n_hid))
        self.W = nn.Parameter(torch.empty(n_vis, n_hid).uniform_(-a, a))
        self.vbias = nn.Parameter(torch.zeros(n_vis))
        self.hbias = nn.Parameter(torch.zeros(n_hid))

    def free_energy(self, v):
        quadratic = 0.5 * ((v - self.vbias) ** 2).sum(1)
        return quadratic - torch.log(1 + torch.exp(v @ self.W + self.hbias)).sum(1)

    def forward(self, v):
        return self.free_energy(v)


def make_target(seed: int = 0, batch: int = 8) -> Target:
    torch.manual_seed(seed)
    model = RBM()

    def program(b):
        return model(b["v"]).mean()

    def sample(rng: np.random.Generator):
        v = np.clip(rng.standard_normal((batch, N_VIS)), -BOUND, BOUND).astype(np.float32)
        return {"v": v}

    return Target(program=program, sample=sample, model=model,
                  bounds={"v": (-BOUND, BOUND)}, search=["v"])


def witness(target: Target) -> dict:
    """Each reading takes the sign pattern of one hidden unit's weights, at the bound."""
    W = target.model.W.detach()
    v = BOUND * torch.sign(W[:, :8]).t()
    return {"v": v.numpy().astype(np.float32)}
