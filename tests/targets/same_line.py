"""Two calls of one op on one line, told apart only by their columns (``file:line:col``).

``make_target()``: ``log(x) + log(1 - x)`` on one line; each log is its own site (``#0`` and
``#1``), and the search drives either out of its domain (x to 0, or x to 1).
"""
from __future__ import annotations

import numpy as np
import torch

from fuzz_core import Target


def make_target(seed: int = 0):
    torch.manual_seed(seed)

    def program(batch):
        x = batch["x"]
        return (torch.log(x) + torch.log(1 - x)).mean()   # TWO-LOGS

    def sample(rng: np.random.Generator):
        return {"x": rng.uniform(0.25, 0.75, (4, 3)).astype(np.float32)}

    return Target(program=program, sample=sample, bounds={"x": (-0.5, 1.5)}, search=["x"])
