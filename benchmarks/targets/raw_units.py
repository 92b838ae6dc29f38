"""Any subject of ``campaigns/targets/``, fed its searched inputs in raw units.

The subjects take standardised features (about unit spread, clipped to a box such as
``[-3, 3]``). Real programs often take raw readings and scale them inside the model
(pixels in 0-255, amounts in currency, sensor units). This factory builds the subject
``subject`` and puts such a scaling in front of it: the searched inputs, their samples
and their bounds are ``scale`` times the subject's, and the program multiplies them by
``1 / scale`` before it calls the subject's own program (and ``train_step``). The
program, its op sites and its bugs are the subject's own.

Why it exists: GRIST steps a fixed 0.15 per step in the input's own units, so in raw
units it needs ``scale`` times as many steps to cross the same distance. The scheduler
benchmark uses it to build a campaign whose bugs take grist hundreds of steps.

    targets:
      - {name: gan, entry: benchmarks/targets/raw_units.py:make_target,
         args: {subject: gan_log_d, scale: 10}}
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fuzz_core import Target, TargetError
from fuzz_core.loader import call_factory, load_factory

ROOT = Path(__file__).resolve().parents[2]


def make_target(subject: str, scale: float = 10.0, seed: int = 0, **args) -> Target:
    if not scale > 0:
        raise TargetError(f"raw_units: scale must be > 0, got {scale!r}")
    inner = call_factory(load_factory(f"campaigns/targets/{subject}.py:make_target", ROOT), seed, args)
    if not isinstance(inner, Target):
        raise TargetError(f"raw_units: {subject!r} is not a PyTorch Target (got {type(inner).__name__})")
    names, inv = list(inner.search), 1.0 / scale

    def standardised(b: dict) -> dict:
        return {k: (v * inv if k in names else v) for k, v in b.items()}

    def program(b: dict):
        return inner.program(standardised(b))

    def raw(v) -> np.ndarray:
        a = np.asarray(v)
        return a * a.dtype.type(scale)        # keeps the sample's dtype (float32 stays float32)

    def sample(rng: np.random.Generator) -> dict:
        return {k: (raw(v) if k in names else v) for k, v in inner.sample(rng).items()}

    step = inner.train_step   # a local, so that the runner finds its optimizers in the closure
    train_step = None if step is None else (lambda b: step(standardised(b)))
    bounds = {k: (lo * scale, hi * scale) if k in names else (lo, hi) for k, (lo, hi) in inner.bounds.items()}
    return Target(program=program, sample=sample, model=inner.model, optimizer=inner.optimizer,
                  train_step=train_step, bounds=bounds, search=names)
