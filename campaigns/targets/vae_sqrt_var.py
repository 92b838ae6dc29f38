"""VAE on digits whose encoder predicts the variance with a plain linear layer: ``sqrt`` of a negative.

The encoder (64-128 ReLU) has two linear heads, the mean and the *variance* of the
8-dimensional posterior; the variance head's bias starts at 1 (the prior's variance) and
nothing keeps its output positive. The sample is ``mu + torch.sqrt(var) * eps``
(``eps = torch.randn_like``, drawn inside the program). The decoder (8-128-64, logits) is
scored with ``F.binary_cross_entropy_with_logits``; the KL term uses ``2 * log(std)``.
The factory pre-trains the VAE for 120 Adam steps on the digits (pixels in [0, 1];
deterministic from ``seed``) and the program keeps training with Adam at ``lr=1e-4``.

Bug: ``torch.sqrt(var)`` in :meth:`VAE.encode`: NaN as soon as a component of ``var``
goes below 0 (the KL term's ``log(std)`` then sees the NaN, it does not cause it).

Why reachable within the bounds (seed 0): the trained variance head stays above ~0.7 on
digits and ~0.2 on uniformly random pixels, but goes below -0.3 over the box ``[0, 1]^64``.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

from fuzz_core import Target

N_IN, HIDDEN, LATENT = 64, 128, 8


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(N_IN, HIDDEN), nn.ReLU())
        self.fc_mu = nn.Linear(HIDDEN, LATENT)
        self.fc_var = nn.Linear(HIDDEN, LATENT)
        nn.init.constant_(self.fc_var.bias, 1.0)
        self.dec = nn.Sequential(nn.Linear(LATENT, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, N_IN))

    def encode(self, x):
        h = self.enc(x)
        mu, var = self.fc_mu(h), self.fc_var(h)
        std = torch.sqrt(var)
        return mu, var, std

    def forward(self, x):
        mu, var, std = self.encode(x)
        z = mu + std * torch.randn_like(std)
        return self.dec(z), mu, var, std          # decoder logits


def vae_loss(x, logits, mu, var, std):
    rec = F.binary_cross_entropy_with_logits(logits, x, reduction="sum") / x.shape[0]
    kl = -0.5 * (1 + 2 * torch.log(std) - mu ** 2 - var).sum(1).mean()
    return rec + kl


def load_data():
    return (load_digits().data / 16.0).astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 120, lr: float = 1e-4) -> Target:
    torch.manual_seed(seed)
    x_all = load_data()
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    xt = torch.from_numpy(x_all)
    for _ in range(pretrain_steps):
        x = xt[torch.randint(0, len(xt), (64,), generator=gen)]
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
                  bounds={"x": (0.0, 1.0)}, search=["x"])


def witness(target: Target, steps: int = 300) -> dict:
    """Gradient descent on the smallest predicted variance, within the pixel box."""
    model = target.model
    x = torch.rand(8, N_IN, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    opt = torch.optim.Adam([x], lr=0.05)
    for _ in range(steps):
        var = model.fc_var(model.enc(x))
        opt.zero_grad()
        var.min(1).values.sum().backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(0.0, 1.0)
    return {"x": x.detach().numpy().copy()}
