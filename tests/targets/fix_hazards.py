"""One small program per hazard of the catalogue, for the tests of ``cdeepfuzz fix``
(tests/test_fix_hazards.py): each calls its op once, on a line of its own, on a searched input whose
bounds reach the op's invalid region, scaled by a weight that the program trains (so the backward rows
are searched too). ``make_target(hazard=...)`` picks the program; the tests copy this file into a
project folder, fix the finding, apply the patch to a copy and replay there."""
import numpy as np
import torch
import torch.nn.functional as F  # noqa: F401 - a patch may use it
from fuzz_core import Target


def log(h, c):
    return torch.log(h).sum()


def log2(h, c):
    return torch.log2(h).sum()


def log10(h, c):
    return torch.log10(h).sum()


def log1p(h, c):
    return torch.log1p(h).sum()


def xlogy(h, c):
    return torch.xlogy(c, h).sum()


def div(h, c):
    return (c / h).sum()


def reciprocal(h, c):
    return torch.reciprocal(h).sum()


def remainder(h, c):
    return torch.remainder(c, h).sum()


def sqrt(h, c):
    return torch.sqrt(h).sum()


def rsqrt(h, c):
    return torch.rsqrt(h).sum()


def exp(h, c):
    return torch.exp(h).sum()


def expm1(h, c):
    return torch.expm1(h).sum()


def pow(h, c):
    return (h ** 0.5).sum()


def acos(h, c):
    return torch.acos(h).sum()


def asin(h, c):
    return torch.asin(h).sum()


def atanh(h, c):
    return torch.atanh(h).sum()


def acosh(h, c):
    return torch.acosh(h).sum()


def lgamma(h, c):
    return torch.lgamma(h).sum()


def digamma(h, c):
    return torch.digamma(h).sum()


def erfinv(h, c):
    return torch.erfinv(h).sum()


def logit(h, c):
    return torch.logit(h).sum()


def ndtri(h, c):
    return torch.special.ndtri(h).sum()


def mvlgamma(h, c):
    return torch.mvlgamma(h, p=2).sum()


def half_overflow(h, c):
    return (h.half() * h.half()).float().sum()


# hazard -> (sample range, bounds) of the searched input
RANGES = {
    "log1p": ((0.0, 1.0), (-2.0, 1.0)), "exp": ((0.0, 1.0), (-100.0, 100.0)), "expm1": ((0.0, 1.0), (-100.0, 100.0)),
    "acos": ((-0.5, 0.5), (-2.0, 2.0)), "asin": ((-0.5, 0.5), (-2.0, 2.0)), "atanh": ((-0.5, 0.5), (-2.0, 2.0)),
    "erfinv": ((-0.5, 0.5), (-2.0, 2.0)), "acosh": ((2.0, 3.0), (0.0, 3.0)), "logit": ((0.2, 0.8), (-1.0, 2.0)),
    "ndtri": ((0.2, 0.8), (-1.0, 2.0)), "mvlgamma": ((0.6, 1.0), (-1.0, 2.0)),
    "half_overflow": ((0.5, 1.0), (-1000.0, 1000.0)),
}


class Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.w


def make_target(seed: int = 0, hazard: str = "log") -> Target:
    torch.manual_seed(seed)
    model = Scale()
    op = globals()[hazard]
    (lo, hi), bounds = RANGES.get(hazard, ((0.5, 1.0), (-1.0, 1.0)))

    def program(b):
        return op(model(b["x"]), b["c"])

    return Target(program=program, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-4),
                  sample=lambda rng: {"x": rng.uniform(lo, hi, (4, 3)).astype(np.float32),
                                      "c": np.ones((4, 3), np.float32)},
                  bounds={"x": bounds}, search=["x"])
