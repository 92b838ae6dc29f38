"""Tabular GAN with the textbook discriminator loss written by hand: ``log(1 - D(G(z)))``.

A GAN for synthetic tabular records (32 standardised features, clipped to [-3, 3]):
generator 16-64-32 (linear output), discriminator 32-256-256-1 (LeakyReLU, sigmoid
output). The losses are the minimax ones written out:
``d_loss = -(log D(x) + log(1 - D(G(z)))).mean()`` and the non-saturating
``g_loss = -log D(G(z)).mean()``; the program computes both from one forward pass (for
monitoring) and returns ``(d_loss, g_loss)``. The factory trains the GAN for 300
alternating Adam steps (discriminator at 2e-3, generator at 2e-4; deterministic from
``seed``), then sets the fine-tuning rates (1e-5 and 1e-4): ``train_step`` keeps
alternating the two optimizers on the searched batch. Searched: the real records ``x``
and the generator's noise ``z``.

Bug: ``torch.log(1 - d_fake)`` in :func:`d_loss`, ``d_fake = D(G(z))``. In float32
``sigmoid(l)`` rounds to exactly 1 once the discriminator's logit ``l > ~16.6``:
``1 - 1 = 0``, ``log(0) = -inf`` and the loss is ``inf``. The generator's output is
unbounded and the discriminator extrapolates: some noise vectors give records it finds
"more real than real". (``log(D(x))`` and ``log(D(G(z)))`` would need a logit below
-88.7: out of reach, true negatives.)

Why reachable within the bounds: with ``z`` in ``[-3, 3]^16`` the discriminator's logit
on ``G(z)`` reaches 20-30, while sampled (Gaussian) noise gives fakes with logits below
~6 and uniformly random noise below ~11.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target

N_FEAT, N_Z, BOUND = 32, 16, 3.0


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_Z, 64), nn.ReLU(), nn.Linear(64, N_FEAT))

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_FEAT, hidden), nn.LeakyReLU(0.2),
                                 nn.Linear(hidden, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, x):
        return torch.sigmoid(self.net(x)).squeeze(1)


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = Generator()
        self.D = Discriminator()


def d_loss(d_real, d_fake):
    return -(torch.log(d_real) + torch.log(1 - d_fake)).mean()


def g_loss(d_fake):
    return -torch.log(d_fake).mean()


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    factors = rng.standard_normal((n, 4))
    loading = rng.standard_normal((4, N_FEAT)) / 2
    x = np.tanh(factors @ loading) * 1.5 + 0.3 * rng.standard_normal((n, N_FEAT))
    x = (x - x.mean(0)) / x.std(0)
    return np.clip(x, -BOUND, BOUND).astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300, lr_g: float = 2e-4,
                lr_d: float = 2e-3, finetune_lr_g: float = 1e-4, finetune_lr_d: float = 1e-5) -> Target:
    torch.manual_seed(seed)
    x_all = make_data(4096, seed)
    gan = GAN()
    opt_d = torch.optim.Adam(gan.D.parameters(), lr=lr_d, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(gan.G.parameters(), lr=lr_g, betas=(0.5, 0.999))

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

    gen = torch.Generator().manual_seed(seed)
    xt = torch.from_numpy(x_all)
    for _ in range(pretrain_steps):
        x = xt[torch.randint(0, len(xt), (64,), generator=gen)]
        z = torch.randn(64, N_Z, generator=gen).clamp(-BOUND, BOUND)
        train_step({"x": x, "z": z})
    for opt, lr in ((opt_d, finetune_lr_d), (opt_g, finetune_lr_g)):
        for group in opt.param_groups:
            group["lr"] = lr

    def program(b):                       # both losses from one forward pass, for monitoring
        d_real, d_fake = gan.D(b["x"]), gan.D(gan.G(b["z"]))
        return d_loss(d_real, d_fake), g_loss(d_fake)

    def sample(rng: np.random.Generator):
        x = x_all[rng.integers(0, len(x_all), size=batch)]
        z = np.clip(rng.standard_normal((batch, N_Z)), -BOUND, BOUND).astype(np.float32)
        return {"x": x, "z": z}

    return Target(program=program, sample=sample, model=gan, train_step=train_step,
                  bounds={"x": (-BOUND, BOUND), "z": (-BOUND, BOUND)}, search=["x", "z"])


def witness(target: Target, steps: int = 300) -> dict:
    """Ascent on the discriminator's logit of generated records, over the noise box."""
    gan = target.model
    z = torch.zeros(8, N_Z)
    z.uniform_(-BOUND, BOUND, generator=torch.Generator().manual_seed(0))
    z.requires_grad_(True)
    opt = torch.optim.Adam([z], lr=0.1)
    for _ in range(steps):
        logit = gan.D.net(gan.G(z))
        opt.zero_grad()
        (-logit.sum()).backward()
        opt.step()
        with torch.no_grad():
            z.clamp_(-BOUND, BOUND)
    x = make_data(8, 0)
    return {"x": x, "z": z.detach().numpy().copy()}
