"""A small program with one planted bug and one guarded twin, and every way to break it, for fault tests.

``make_target(mode=...)``:

- ``ok``: ``log(1 - sigmoid(8 sum x))``, found in a few steps;
- ``factory_raises``: the factory raises the user's own error;
- ``program_raises``: the program raises at its first call (discovery);
- ``raises_later``: the program raises from its ``after``-th call on (a search step);
- ``wrong_return``: the factory returns something that is not a Target;
- ``inverted_bounds``: bounds with low > high;
- ``unknown_search``: ``search`` names an input that ``sample`` does not return;
- ``hidden`` < 1 makes the factory raise from torch (a bad factory argument);
- ``broken_if``: the factory raises while that file exists (the same factory, broken later);
- ``fixed_if``: while that file exists the program clamps before the log (the bug fixed; removing the
  file is a regression).

Fault injection without sleeps: from the ``after``-th call of the program on, while the file
``hold`` exists, each call creates ``mark`` and waits; ``hang_after`` makes a call hang for good
(a program that never returns, for the quantum time limit).
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from fuzz_core import Target

ERROR = "the factory could not open its weights file (planted by the test)"
PROGRAM_ERROR = "the program's shapes disagree (planted by the test)"


def make_target(seed: int = 0, mode: str = "ok", hidden: int = 4, hold: str | None = None, mark: str | None = None,
                after: int = 0, hang_after: int = 0, broken_if: str | None = None, fixed_if: str | None = None,
                width: int = 4):
    if mode == "factory_raises" or (broken_if and os.path.exists(broken_if)):
        raise FileNotFoundError(ERROR)
    torch.manual_seed(seed)
    weight = torch.nn.Linear(width, hidden)        # hidden < 1: torch raises (a bad factory argument)
    scale = torch.full((width,), 8.0)
    calls = [0]

    def program(batch):
        calls[0] += 1
        if mode == "program_raises" or (mode == "raises_later" and calls[0] >= after):
            raise ValueError(PROGRAM_ERROR)
        if hold and calls[0] >= after:
            while os.path.exists(hold):
                if mark:
                    open(mark, "w").close()
                time.sleep(0.01)
        if hang_after and calls[0] >= hang_after:
            while True:
                time.sleep(0.05)
        x = batch["x"]
        z = (x * scale).sum(1) + 0 * weight(x).sum(1)
        if fixed_if and os.path.exists(fixed_if):
            z = torch.clamp(z, max=10.0)                  # the fix: sigmoid(10) < 1
        return -torch.log(1 - torch.sigmoid(z)).mean()   # sigmoid rounds to 1 for z > ~17: log(0)

    def sample(rng: np.random.Generator):
        return {"x": rng.uniform(-1.0, 1.0, (4, width)).astype(np.float32)}

    if mode == "wrong_return":
        return {"program": program}
    bounds = {"x": (1.0, -1.0)} if mode == "inverted_bounds" else {"x": (-1.0, 1.0)}
    search = ["y"] if mode == "unknown_search" else ["x"]
    return Target(program=program, sample=sample, bounds=bounds, search=search)
