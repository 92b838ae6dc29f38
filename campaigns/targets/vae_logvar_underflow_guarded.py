"""Guarded twin of ``vae_logvar_underflow``: the standard deviation is ``torch.exp(0.5 * logvar)``, no sqrt.

Same sensor readings, VAE, pre-training and Adam training as
``vae_logvar_underflow.py``; only :meth:`SensorVAE.encode` differs. A log-variance below
-104 still makes ``exp(logvar)`` (the KL term) underflow to 0 and ``exp(0.5 * logvar)`` a
tiny or zero standard deviation, but the gradient of ``exp`` is its value: finite.
Clean: no finding expected.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target

N_SENSORS, LATENT, HIGH = 32, 4, 80.0


class SensorVAE(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(N_SENSORS, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.mu = nn.Linear(hidden, LATENT)
        self.logvar = nn.Linear(hidden, LATENT)
        self.dec = nn.Sequential(nn.Linear(LATENT, hidden), nn.ReLU(), nn.Linear(hidden, N_SENSORS))

    def encode(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h).clamp(max=20.0)
        var = torch.exp(logvar)
        std = torch.exp(0.5 * logvar)
        return mu, logvar, var, std

    def forward(self, x):
        mu, logvar, var, std = self.encode(x)
        z = mu + std * torch.randn_like(std)
        return self.dec(z), mu, logvar, var


def elbo_loss(x, x_hat, mu, logvar, var):
    recon = ((x - x_hat) ** 2).sum(1).mean()
    kl = -0.5 * (1.0 + logvar - mu ** 2 - var).sum(1).mean()
    return recon + kl


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    latent = rng.standard_normal((n, 3))
    mix = rng.standard_normal((3, N_SENSORS)) * 0.3
    return np.clip(np.exp(latent @ mix + 0.2 * rng.standard_normal((n, N_SENSORS))), 0, HIGH).astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300, lr: float = 1e-4) -> Target:
    torch.manual_seed(seed)
    x_all = make_data(4096, seed)
    model = SensorVAE()
    fit = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    xt = torch.from_numpy(x_all)
    for _ in range(pretrain_steps):
        x = xt[torch.randint(0, len(xt), (64,), generator=gen)]
        loss = elbo_loss(x, *model(x))
        fit.zero_grad()
        loss.backward()
        fit.step()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def program(b):
        x = b["x"]
        return elbo_loss(x, *model(x))

    def sample(rng: np.random.Generator):
        return {"x": x_all[rng.integers(0, len(x_all), size=batch)]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (0.0, HIGH)}, search=["x"])
