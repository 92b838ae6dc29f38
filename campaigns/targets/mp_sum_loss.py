"""Knowledge distillation on tabular data with the loss summed over a large batch, under fp16 autocast.

A student MLP (16-32-16, ReLU) learns to match a frozen teacher MLP (16-64-64-16, ReLU)
on standardised features (z-scores clipped to ``[-5, 5]``: the bounds), a batch of 1,024
rows at a time, with the squared error written as in the paper, summed over the batch and
the outputs: ``((student(x) - teacher(x)) ** 2).sum()`` (SGD step per batch: the program
keeps training). Under ``torch.autocast(fp16)`` both networks' outputs are float16, and so
are the difference, its square and the ``sum``.

Bug (fp16 only): the ``.sum()`` in :func:`distillation_loss`. The sum of 16,384 squared
errors is float16: once the mean squared error passes 4 (65,504 / 16,384) the sum is
``inf``; every single term is still far below the limit (a term overflows only past an
error of 256). In fp32 the same batch (the witness) gives a loss of ~1.1e5: finite. (CUDA autocast runs
``sum`` in float32; on CPU it stays in its input's float16, as here.)

Why reachable within the bounds: the student and the teacher disagree by ~0.3 per output
on real rows (a summed loss below ~1,600 over 20 sampled batches); a batch whose rows all
sit at the corner of the box where they disagree most gives errors of up to ~5 per output
(the witness: a sum of ~1.1e5). Batches of uniformly random rows in the box stay below
~11,000.
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
    return ((student_out - teacher_out) ** 2).sum()


def make_target(seed: int = 0, batch: int = 1024, lr: float = 1e-5) -> Target:
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
    """Every row at the corner of the box where student and teacher disagree most (a few steps
    of sign-gradient ascent on the float32 squared error, from a sampled row)."""
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
