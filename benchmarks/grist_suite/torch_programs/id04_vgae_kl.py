"""GRIST subject ID_4, "Pytorch_Geometric_Fork": the variational graph auto-encoder of a fork of
PyTorch Geometric, whose ``exp(logvar)`` lost its clamp.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_4/test/nn/models/test_autoencoder.py
and the fork's ``VGAE`` in scripts/study_case/ID_4/torch_geometric/nn/models/autoencoder.py
(github.com/Jacob-yen/GRIST), not copied. The test builds ``VGAE(encoder=lambda x: (x, x))``
(so ``mu = logvar = x``, no parameters) and loops forever over: a 3x2 node-feature matrix,
``model.encode(x)`` and ``model.kl_loss()``. ``encode`` runs the encoder and, the module being
in training mode, reparametrises ``z = mu + randn_like(logvar) * exp(logvar)``; upstream clamps
``logvar`` to at most 10 first (``MAX_LOGVAR``), the fork has that clamp commented out. The
fork's KL term is ``-0.5 * mean(sum(1 + logvar - mu**2 - log(logvar), dim=1))`` (a ``log``
where upstream has ``exp``), kept as the fork computes it.

Bug ID_4: ``torch.exp(logvar)`` in :meth:`VGAE.reparametrize` overflows to ``inf`` once a
``logvar`` passes ~88.72 (GRIST's search maximised ``logvar``). The fork's ``log(logvar)`` in
the KL term is a second suspect op (NaN for ``logvar < 0``); a finding there is reported
beside the bug, not as it.

Data: the test draws every feature from ``randint(2, 3)`` (all 2.0); the sampler returns that
matrix. Node features have no natural range and GRIST searched them unclipped: bounds
``+-bound`` (``_data.FREE_BOUND``).
"""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target


class VGAE(torch.nn.Module):
    """The fork's VGAE, reduced to what the test exercises (encode, reparametrise, KL)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder
        self.mu = self.logvar = None

    def reparametrize(self, mu, logvar):
        if self.training:
            return mu + torch.randn_like(logvar) * torch.exp(logvar)  # GRIST bug ID_4
        return mu

    def encode(self, x):
        self.mu, self.logvar = self.encoder(x)
        return self.reparametrize(self.mu, self.logvar)

    def kl_loss(self):
        mu, logvar = self.mu, self.logvar
        return -0.5 * torch.mean(torch.sum(1 + logvar - mu ** 2 - logvar.log(), dim=1))


def make_target(seed: int = 0, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)
    model = VGAE(encoder=lambda x: (x, x))

    def program(batch):
        model.encode(batch["x"])
        return model.kl_loss()

    def sample(rng: np.random.Generator):
        return {"x": rng.integers(2, 3, size=(3, 2)).astype(np.float32)}

    return Target(program=program, sample=sample, bounds={"x": (-bound, bound)}, search=["x"])
