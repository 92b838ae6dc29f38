"""GAN on a ring of Gaussians whose discriminator's minibatch-stddev feature takes ``sqrt`` of a zero variance.

A generator (``z`` in ``[-3, 3]^8``, 8-64-64-2, ReLU) and a discriminator (2 (+1)-64-64-1,
LeakyReLU) trained on the classic 2-D ring of 8 Gaussians, with two Adam optimizers in
``train_step`` (the discriminator's step, then the generator's) and the non-saturating
losses from ``F.binary_cross_entropy_with_logits``. Against mode collapse the
discriminator sees a minibatch-stddev feature (ProGAN): the standard deviation of its
input over the batch, averaged over the coordinates and appended to every sample, written
by hand as ``torch.sqrt(((x - x.mean(0)) ** 2).mean(0)).mean()`` (ProGAN adds 1e-8 inside
the sqrt). The factory trains the GAN for 300 steps (deterministic from ``seed``); the
program keeps training.

Bug: ``torch.sqrt`` in :func:`minibatch_std`, in the backward pass only. When every
generated sample of a batch has the same value in one coordinate (the generator
collapsed onto one point, or a batch of equal noise vectors), that coordinate's variance
is exactly 0: ``sqrt(0) == 0`` is finite and so are both losses, but the gradient of
``sqrt`` at 0 is infinite, ``x - mean == 0`` makes it NaN, and the generator's own Adam step
writes NaN into its weights. Real batches never have a constant coordinate.

Why reachable within the bounds: a batch of equal noise vectors is valid; sampled and
uniformly random noise never is.
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
    std = torch.sqrt(((x - x.mean(0)) ** 2).mean(0)).mean()
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


def witness(target: Target) -> dict:
    """A batch whose noise vectors are all equal (a collapsed generator's batch), chosen so that
    one generated coordinate has an exactly zero variance on this machine.

    Equal rows do not always give equal outputs: a BLAS kernel may compute the rows of one
    matmul with different blockings (seen with AVX-512: the rows of a batch of 8 equal noise
    vectors differ in their last bit), which leaves a variance of ~1e-16 and a finite gradient.
    So the witness tries equal vectors (each sampled row, then constants across the box) until
    the generator's batch has a coordinate whose variance is exactly 0.
    """
    batch = target.sample(np.random.default_rng(0))
    rows = [batch["z"][i].copy() for i in range(len(batch["z"]))]
    rows += [np.full(N_Z, c, np.float32) for c in np.linspace(-BOUND, BOUND, 25)]
    with torch.no_grad():
        for row in rows:
            batch["z"][:] = row
            x = target.model.G(torch.from_numpy(batch["z"]))
            if bool((((x - x.mean(0)) ** 2).mean(0) == 0).any()):
                return batch
    batch["z"][:] = rows[0]
    return batch
