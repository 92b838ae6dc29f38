"""beta-VAE on a 256-channel sensor array: ``log(var)`` of a ReLU'd variance that reaches 0.

The encoder (256-64 ReLU) gives the posterior mean and variance of an 8-dimensional
latent; the variance head is a linear layer followed by ``F.relu`` ("a variance cannot be
negative"), initialised near the prior (bias 1, weights N(0, 0.02)). The sample is
``mu + var.sqrt() * eps`` with ``eps = torch.randn_like(var)`` drawn inside the program;
the loss is a squared reconstruction error plus ``beta = 20`` times the KL term, written
as ``0.5 * (var + mu**2 - 1 - torch.log(var))``. Readings are standardised and clipped to
``[-3, 3]``. The factory fits the VAE for 100 Adam steps on synthetic low-rank readings
(deterministic from ``seed``); the program keeps training with Adam at ``lr=1e-4``.

Bug: ``torch.log(var)`` in :func:`kl_divergence`. The ReLU keeps ``var >= 0`` but not
``> 0``: once the head's pre-activation is negative ``var`` is exactly 0 and
``log(0) = -inf`` (the loss is ``inf``). ``var.sqrt()`` is fine at 0 (its site is a true
negative whose search ends at the log).

Why reachable within the bounds: the head reads 64 hidden units fed by 256 inputs, so
over the box ``[-3, 3]^256`` its pre-activation spans far more than on data: it stays
above ~0.6 on real readings and ~0.4 on uniformly random ones, and goes below -1.5 where
the search takes it.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

N_IN, HIDDEN, LATENT, BOUND = 256, 64, 8, 3.0
BETA = 20.0


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(N_IN, HIDDEN), nn.ReLU())
        self.mu = nn.Linear(HIDDEN, LATENT)
        self.var = nn.Linear(HIDDEN, LATENT)
        nn.init.normal_(self.var.weight, std=0.02)
        nn.init.constant_(self.var.bias, 1.0)

    def forward(self, x):
        h = self.body(x)
        var = F.relu(self.var(h))                 # a variance cannot be negative
        return self.mu(h), var


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.decoder = nn.Sequential(nn.Linear(LATENT, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, N_IN))

    def forward(self, x):
        mu, var = self.encoder(x)
        z = mu + var.sqrt() * torch.randn_like(var)
        return self.decoder(z), mu, var


def kl_divergence(mu, var):
    return 0.5 * (var + mu ** 2 - 1 - torch.log(var)).sum(1).mean()


def vae_loss(x, recon, mu, var, beta: float = BETA):
    return ((recon - x) ** 2).sum(1).mean() + beta * kl_divergence(mu, var)


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    factors = rng.standard_normal((n, 8))
    loading = rng.standard_normal((8, N_IN)) / np.sqrt(8)
    x = factors @ loading * 0.9 + 0.45 * rng.standard_normal((n, N_IN))
    return np.clip(x, -BOUND, BOUND).astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 100, lr: float = 1e-4) -> Target:
    torch.manual_seed(seed)
    x_all = make_data(4096, seed)
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    xt = torch.from_numpy(x_all)
    for _ in range(pretrain_steps):
        x = xt[torch.randint(0, len(xt), (128,), generator=gen)]
        loss = vae_loss(x, *model(x))
        opt.zero_grad()
        loss.backward()
        opt.step()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def program(b):
        x = b["x"]
        return vae_loss(x, *model(x))

    def sample(rng: np.random.Generator):
        return {"x": x_all[rng.integers(0, len(x_all), size=batch)]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])


def witness(target: Target, steps: int = 200) -> dict:
    """Descent on the variance head's smallest pre-activation, within the box."""
    enc = target.model.encoder
    x = torch.zeros(8, N_IN, requires_grad=True)
    opt = torch.optim.Adam([x], lr=0.1)
    for _ in range(steps):
        a = enc.var(enc.body(x))
        opt.zero_grad()
        a.min(1).values.sum().backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(-BOUND, BOUND)
    return {"x": x.detach().numpy().copy()}
