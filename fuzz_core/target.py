"""The target contract: what a user factory returns.

A factory ``make_target(seed=..., **args)`` builds the program under test and
returns a :class:`Target` (PyTorch or TensorFlow 2) or a :class:`GraphTarget`
(TF1-style graph code). See the README for the contract in full.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

Bounds = Mapping[str, "tuple[float, float]"]


class TargetError(ValueError):
    """A factory returned something that breaks the target contract."""


@dataclass
class Target:
    """One DL program under test.

    program:   called with a dict of external inputs (tensors); returns the loss,
               or a tuple/list whose first element is it, or a dict with "loss".
    sample:    ``sample(rng: numpy.random.Generator) -> dict`` of numpy arrays, a
               fresh batch; every value has the batch on dimension 0.
    model:     a ``torch.nn.Module`` / ``tf.keras.Model`` / list of ``tf.Variable``;
               its parameters are external values (searched with ``search_weights``).
    optimizer: optional (one, or a list); the program then keeps training on the searched
               batch. Its state is saved, restored and reset with the weights.
    train_step: optional ``train_step(batch)`` for programs that train another way; the
               torch optimizers it holds in its closure (or its object's attributes, for a
               bound method) are found and saved with the weights too.
    bounds:    valid domain ``(low, high)`` of each searched input.
    search:    names of the searched inputs (floating point only).
    """

    program: Callable[[dict], Any]
    sample: Callable[[np.random.Generator], dict]
    model: Any = None
    optimizer: Any = None
    train_step: Callable[[dict], Any] | None = None
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    search: Sequence[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not callable(self.program):
            raise TargetError(f"Target.program must be callable, got {type(self.program).__name__}")
        if not callable(self.sample):
            raise TargetError(f"Target.sample must be callable, got {type(self.sample).__name__}")
        if self.train_step is not None and not callable(self.train_step):
            raise TargetError("Target.train_step must be callable")
        if isinstance(self.search, str):
            self.search = [self.search]
        self.search = list(self.search)
        self.bounds = {k: _check_bound(k, v) for k, v in dict(self.bounds or {}).items()}

    @property
    def trains(self) -> bool:
        return self.optimizer is not None or self.train_step is not None

    def check_batch(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Validate a batch returned by ``sample`` and return it as numpy arrays."""
        return check_batch(batch, self.search)


@dataclass
class GraphTarget:
    """A TF1-style graph program: placeholders fed by name, a loss, a train op."""

    graph: Any
    session: Any
    feeds: dict[str, Any]
    loss: Any
    sample: Callable[[np.random.Generator], dict]
    train_op: Any = None
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    search: Sequence[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not callable(self.sample):
            raise TargetError("GraphTarget.sample must be callable")
        self.search = [self.search] if isinstance(self.search, str) else list(self.search)
        missing = [s for s in self.search if s not in self.feeds]
        if missing:
            raise TargetError(f"GraphTarget.search names {missing} that are not in feeds {sorted(self.feeds)}")
        self.bounds = {k: _check_bound(k, v) for k, v in dict(self.bounds or {}).items()}

    @property
    def trains(self) -> bool:
        return self.train_op is not None

    def check_batch(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return check_batch(batch, self.search)


def _check_bound(name: str, value: Any) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except Exception:
        raise TargetError(f"bounds[{name!r}] must be a pair (low, high), got {value!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise TargetError(f"bounds[{name!r}] must be finite, got {value!r}")
    if lo > hi:
        raise TargetError(f"bounds[{name!r}] has low > high: {value!r}")
    return (lo, hi)


def check_batch(batch: Mapping[str, Any], search: Sequence[str]) -> dict[str, np.ndarray]:
    if not isinstance(batch, Mapping):
        raise TargetError(f"sample(rng) must return a dict of arrays, got {type(batch).__name__}")
    out: dict[str, np.ndarray] = {}
    sizes = set()
    for key, value in batch.items():
        arr = np.asarray(value)
        if arr.ndim == 0:
            raise TargetError(f"sample(rng)[{key!r}] has no batch dimension (shape {arr.shape})")
        sizes.add(arr.shape[0])
        out[str(key)] = arr
    for name in search:
        if name not in out:
            raise TargetError(f"search names {name!r}, which sample(rng) does not return (keys {sorted(out)})")
        if not np.issubdtype(out[name].dtype, np.floating):
            raise TargetError(f"searched input {name!r} must be floating point, got {out[name].dtype}")
    if len(sizes) > 1:
        raise TargetError(f"sample(rng) values disagree on the batch size (dimension 0): {sorted(sizes)}")
    return out
