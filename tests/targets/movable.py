"""A softmax regression whose log underflows (line 13): the tests copy it into a project folder and
add lines above it, to check that a finding and a known bug follow their line of code."""
import numpy as np, torch
from fuzz_core import Target


def make_target(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 3)

    def program(b):
        p = torch.softmax(net(b["x"]), 1)
        return -torch.log(p).mean()

    return Target(program=program, sample=lambda rng: {"x": rng.uniform(-1, 1, (4, 4)).astype(np.float32)},
                  model=net, bounds={"x": (-100.0, 100.0)}, search=["x"])
