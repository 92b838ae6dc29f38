"""Near-miss twin of ``vae_sqrt_var``: ``torch.sqrt(var.clamp_min(0) + 1e-6)``.

Same VAE, data, pre-training and Adam training as ``vae_sqrt_var.py``; the variance head
is still a plain linear layer that the search can drive below 0 within ``[0, 1]^64``,
but the standard deviation is taken as ``sqrt(var.clamp_min(0) + 1e-6)``: ``sqrt`` sees
at least ``1e-6`` (very close to the edge of its domain, never past it) and the KL
term's ``log(std)`` at least ``log(1e-3)``. Clean: no finding expected.
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
        std = torch.sqrt(var.clamp_min(0) + 1e-6)
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

