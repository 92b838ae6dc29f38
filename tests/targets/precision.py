"""Small mixed-precision subjects for tests/test_precision.py (the campaign subjects are campaigns/targets/mp_*.py).

``make_linear``: a Linear layer whose output overflows float16's 65504 for inputs within the bounds,
but never float32's range; ``scale`` < 1 is its guarded twin. ``make_scaled``: a one-weight model
trained through the engine's GradScaler; its gradient overflows float16 whatever the loss scale once
``|x|`` passes ~32752 (a loss-scale collapse), and makes the scaler skip a few steps for small ``x``.
``make_underflow``: a float16 square that underflows to 0 before a log.
"""
from __future__ import annotations

import numpy as np
import torch

from fuzz_core import Target


def make_linear(seed: int = 0, scale: float = 1.0) -> Target:
    torch.manual_seed(seed)
    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.fill_(300.0 * scale)
        lin.bias.zero_()

    def program(batch):
        h = lin(batch["x"])
        return (h.float() ** 2).mean() * 1e-6

    return Target(program=program, sample=lambda rng: {"x": rng.uniform(0, 1, (4, 4)).astype(np.float32)},
                  model=lin, bounds={"x": (-100.0, 100.0)}, search=["x"])


def make_scaled(seed: int = 0) -> Target:
    torch.manual_seed(seed)
    lin = torch.nn.Linear(1, 1)
    with torch.no_grad():
        lin.weight.fill_(1.0)
        lin.bias.zero_()
    opt = torch.optim.SGD(lin.parameters(), lr=1e-12)

    def program(batch):
        h = lin(batch["x"])
        return (h.float() ** 2).sum()

    return Target(program=program, sample=lambda rng: {"x": rng.uniform(0, 1, (1, 1)).astype(np.float32)},
                  model=lin, optimizer=opt, bounds={"x": (-60000.0, 60000.0)}, search=["x"])


def make_underflow(seed: int = 0) -> Target:
    torch.manual_seed(seed)
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2))
        lin.bias.zero_()

    def program(batch):
        h = lin(batch["x"])
        return torch.log(h * h).mean()

    return Target(program=program, sample=lambda rng: {"x": rng.uniform(0.5, 1, (2, 2)).astype(np.float32)},
                  model=lin, bounds={"x": (-10.0, 10.0)}, search=["x"])
