"""Guarded twin of ``gan_minibatch_std``: the minibatch-stddev feature as ProGAN writes it, ``torch.sqrt(x.var(0, unbiased=False) + 1e-8)``.

Same ring of Gaussians, generator, discriminator, two Adam optimizers in ``train_step``
and pre-training as ``gan_minibatch_std.py``; only :func:`minibatch_std` differs. A batch
of equal noise vectors still gives a coordinate of variance 0, but ``sqrt`` then sees
``1e-8``: its value and its gradient are finite. Clean: no finding expected.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

N_Z, BOUND = 8, 3.0


def minibatch_std(x):
    """(B, F) -> (B, F + 1): the batch's mean standard deviation appended to every sample."""
    std = torch.sqrt(x.var(0, unbiased=False) + 1e-8).mean()
    return torch.cat([x, std.expand(x.shape[0], 1)], 1)


class Generator(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_Z, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 2))

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden),
                                 nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(minibatch_std(x)).squeeze(1)       # logits


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = Generator()
        self.D = Discriminator()


def d_loss(real_logit, fake_logit):
    return (F.binary_cross_entropy_with_logits(real_logit, torch.ones_like(real_logit))
            + F.binary_cross_entropy_with_logits(fake_logit, torch.zeros_like(fake_logit)))


def g_loss(fake_logit):
    return F.binary_cross_entropy_with_logits(fake_logit, torch.ones_like(fake_logit))


def ring(n: int, rng: np.random.Generator):
    angle = 2 * np.pi * rng.integers(0, 8, size=n) / 8
    x = 2.0 * np.stack([np.cos(angle), np.sin(angle)], 1) + 0.05 * rng.standard_normal((n, 2))
    return x.astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300, lr: float = 2e-4) -> Target:
    torch.manual_seed(seed)
    gan = GAN()
    opt_d = torch.optim.Adam(gan.D.parameters(), lr=lr, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(gan.G.parameters(), lr=lr, betas=(0.5, 0.999))

    def train_step(b):
        fake = gan.G(b["z"])
        loss = d_loss(gan.D(b["x"]), gan.D(fake.detach()))
        opt_d.zero_grad()
        loss.backward()
        opt_d.step()
        loss = g_loss(gan.D(fake))
        opt_g.zero_grad()
        loss.backward()
        opt_g.step()

    rng = np.random.default_rng(seed)
    for _ in range(pretrain_steps):
        z = np.clip(rng.standard_normal((64, N_Z)), -BOUND, BOUND).astype(np.float32)
        train_step({"x": torch.from_numpy(ring(64, rng)), "z": torch.from_numpy(z)})

    def program(b):                       # both losses from one forward pass, for monitoring
        real_logit, fake_logit = gan.D(b["x"]), gan.D(gan.G(b["z"]))
        return d_loss(real_logit, fake_logit), g_loss(fake_logit)

    def sample(r: np.random.Generator):
        z = np.clip(r.standard_normal((batch, N_Z)), -BOUND, BOUND).astype(np.float32)
        return {"x": ring(batch, r), "z": z}

    return Target(program=program, sample=sample, model=gan, train_step=train_step,
                  bounds={"z": (-BOUND, BOUND)}, search=["z"])
