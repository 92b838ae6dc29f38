"""Guarded twin of ``mp_sum_loss``: the distillation loss is averaged, not summed.

The same student, teacher, data, bounds and training step as ``mp_sum_loss.py``, with the
squared error averaged over the batch and the outputs (``.mean()``, as ``nn.MSELoss`` does;
the learning rate scaled up by the 16,384 terms): the float16 result is at most the largest
term (below ~25 within the bounds), and the gradient that flows back into the float16
networks is 16,384 times smaller than the sum's, so the backward pass stays in range too
(summing in float32 instead would fix the loss but not the backward: on the witness the
float16 weight gradients of the summed loss overflow). Not guarded: its training, which can
diverge under fp16 autocast on a batch the search drives (campaigns/mixed_precision.yaml).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target

FEATURES, OUTPUTS, BOUND = 16, 16, 5.0


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def distillation_loss(student_out, teacher_out):
    return ((student_out - teacher_out) ** 2).mean()


def make_target(seed: int = 0, batch: int = 1024, lr: float = 0.16) -> Target:
    torch.manual_seed(seed)
    teacher = mlp(FEATURES, 64, 64, OUTPUTS).requires_grad_(False)
    student = mlp(FEATURES, 32, OUTPUTS)
    model = nn.ModuleDict({"student": student, "teacher": teacher})
    optimizer = torch.optim.SGD(student.parameters(), lr=lr)

    def program(b):
        return distillation_loss(student(b["x"]), teacher(b["x"]))

    def sample(r: np.random.Generator):
        x = np.clip(r.standard_normal((batch, FEATURES)), -BOUND, BOUND)
        return {"x": x.astype(np.float32)}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])


def witness(target: Target) -> dict:
    """The buggy subject's witness: every row at the corner where the networks disagree most."""
    batch = target.sample(np.random.default_rng(0))
    student, teacher = target.model["student"], target.model["teacher"]
    x = torch.tensor(batch["x"][:1], requires_grad=True)
    for _ in range(30):
        (g,) = torch.autograd.grad(((student(x) - teacher(x)) ** 2).sum(), x)
        with torch.no_grad():
            x += 0.5 * g.sign()
            x.clamp_(-BOUND, BOUND)
    batch["x"][:] = x.detach().numpy()[0]
    return batch
