"""VAE of vibration-sensor readings whose ``std = sqrt(exp(logvar))`` underflows to ``sqrt(0)``.

A VAE (32-32-32 ReLU encoder with a mean and a log-variance head of 4 latents, a
4-32-32 decoder) of the readings (mm/s) of 32 vibration sensors, log-normal around 1
(99% below 5) with a rated range ``[0, 80]``: the bounds. The author guarded the
variance against overflow (``logvar.clamp(max=20)``) and takes the standard deviation
as ``torch.sqrt(var)``; the reparameterisation noise is drawn inside the program
(``torch.randn_like``). The loss is a Gaussian reconstruction error plus the KL term,
written by hand. The factory fits the VAE for 300 Adam steps (deterministic from
``seed``); the program keeps training with Adam.

Bug: ``torch.sqrt(var)`` in :meth:`SensorVAE.encode`, in the backward pass only. Once a
log-variance falls below -103.97, ``exp`` underflows to exactly 0 and ``sqrt(0) == 0`` is
finite (so is the KL term, which uses ``logvar`` itself), but the gradient of ``sqrt`` at
0 is infinite: the program's own backward writes NaN into the encoder, then Adam into
every weight.

Why reachable within the bounds: the encoder is piecewise linear in the readings; with
some sensors near the top of their rated range and others near 0 a log-variance goes
below -130, while real readings give log-variances above -11 and uniformly random
readings stayed above -98 in 100,000 draws (their contributions largely cancel).
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
        std = torch.sqrt(var)
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


def witness(target: Target, steps: int = 200) -> dict:
    """Descent on the smallest log-variance over the readings' box."""
    model = target.model
    x = torch.rand(8, N_SENSORS, generator=torch.Generator().manual_seed(0)).mul(HIGH).requires_grad_(True)
    opt = torch.optim.Adam([x], lr=5.0)
    for _ in range(steps):
        logvar = model.logvar(model.enc(x))
        opt.zero_grad()
        logvar.min(1).values.sum().backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(0.0, HIGH)
    return {"x": x.detach().numpy().copy()}
