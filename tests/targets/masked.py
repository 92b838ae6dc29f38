"""Two bugs on two lines, where the second hides the first: a softmax scored by a binary cross-entropy
over its outputs (GRIST's ID_2, re-expressed small). ``log(1 - p)`` goes to -inf once an output
rounds to 1 (a logit 17 above the rest); ``log(p)`` only once an output underflows to 0 (103 below
the largest), which a search on it passes the first on its way to."""
import numpy as np, torch
from fuzz_core import Target


def make_target(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 3)

    def program(b):
        p = torch.softmax(net(b["x"]), 1)
        hit = b["y"] * torch.log(p)
        miss = (1 - b["y"]) * torch.log(1 - p)
        return -(hit + miss).mean()

    def sample(rng):
        return {"x": rng.uniform(-1, 1, (4, 4)).astype(np.float32),
                "y": np.eye(3, dtype=np.float32)[rng.integers(0, 3, 4)]}

    return Target(program=program, sample=sample, model=net, bounds={"x": (-100.0, 100.0)}, search=["x"])
