"""What the search needs from a framework backend (the ``Runner`` protocol).

A runner holds one built target. The search hands it the external values as
NumPy arrays (inputs by name, weights as ``weight:<name>``) and gets plain data
back, so ``fuzz_core`` stays framework-neutral and testable with a fake runner.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from fuzz_core.sites import OpSite
from fuzz_core.target import TargetError

WEIGHT_PREFIX = "weight:"
LOG_TAU = 0.5   # soft-minimum temperature of log-space losses (nats)


@dataclass(frozen=True)
class OpRef:
    """An executed op, named for people: the first one that went non-finite."""

    op: str
    kind: str
    location: str
    occurrence: int = 0
    nan: bool = True

    def to_dict(self) -> dict:
        return {"op": self.op, "kind": self.kind, "location": self.location,
                "occurrence": self.occurrence, "nan": self.nan}


@dataclass
class Evaluation:
    """The result of one step (one forward pass, and a backward when asked)."""

    seen: bool                          # the site ran in this pass
    hard: float                         # hard-minimum margin (linear space); <= 0 outside the domain
    log_loss: float                     # soft-minimum of log(margin), less the log-space target (>= 0 above it)
    triggered: bool                     # the site's own output went non-finite from finite inputs
    event: bool                         # some qualifying non-finite value appeared in this pass
    first_op: OpRef | None = None
    per_sample: np.ndarray | None = None  # hard margin per sample (batch on dim 0), when defined
    grads: dict[str, np.ndarray] | None = None       # of the hard minimum (linear space)
    log_grads: dict[str, np.ndarray] | None = None   # of log_loss (ops measured in log space)
    grad_norm: float = 0.0
    connected: bool = False             # some searched value has a gradient path to the margin
    movable: bool = True                # something the search or the program's training changes reaches
                                        # the margin (False: constant, a divisor fixed at 1 - rate, ...)
    program_loss: float = float("nan")
    trained: bool = False
    weights: dict[str, np.ndarray] | None = None  # searched weights after the program's training step
    passes: int = 1                     # forward passes this evaluation cost
    phase: str | None = None            # where the step's first non-finite value arose (with ``event``)
    state_before: dict[str, np.ndarray] | None = None  # a bad step's starting state, when not the factory's


@dataclass
class CheckResult:
    """What the check-only detector saw in one unmodified run of the program."""

    event: bool
    first_op: OpRef | None
    triggered: dict[tuple[str, str, int], bool] = field(default_factory=dict)  # site key -> own hazard fired
    program_loss: float = float("nan")
    phase: str | None = None            # forward | backward | update, with ``event``


@dataclass(frozen=True)
class RunnerOptions:
    device: str = "cpu"
    search_weights: bool = False
    weight_range: float = 4.0      # searched weights stay within +-weight_range * max|initial|
    input_range: float = 10.0      # unbounded inputs stay within +-input_range * max(1, max|sample|)


def default_bounds(runner: "Runner", batch: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Bounds of every searched value: the target's, else the documented defaults.

    An input without bounds stays within ``±input_range * max(1, max|x|)`` of its first
    batch; a searched weight within ``±weight_range * max|w|`` of its initial values.
    """
    out = {}
    for name in runner.searched:
        if name in runner.target.bounds:
            out[name] = runner.target.bounds[name]
        else:
            scale = runner.options.input_range * max(1.0, float(np.abs(batch[name]).max()))
            out[name] = (-scale, scale)
    if runner.options.search_weights:
        for name, w in runner.weights().items():
            scale = runner.options.weight_range * (float(np.abs(w).max()) or 1.0)
            out[name] = (-scale, scale)
    return out


def bisect_last(pred: Callable[[float], bool], lo: float, hi: float, to_dtype: Callable[[float], float],
                next_after: Callable[[float, float], float]) -> float:
    """Largest float of a dtype in [lo, hi) where pred holds, given pred(lo) and not pred(hi).

    ``to_dtype`` rounds a float to the dtype; ``next_after(a, b)`` is the next float of the dtype
    after ``a`` toward ``b``. Finds the dtype-dependent domain ends of the catalogue's limits.
    """
    for _ in range(200):
        mid = to_dtype((lo + hi) / 2)
        if mid in (lo, hi):
            mid = next_after(lo, hi)
            if mid == hi:
                break
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return lo


def batch_size(values: dict[str, np.ndarray]) -> int:
    """The batch dimension (dim 0) of the first input among ``values``; 1 when there is none."""
    for name, v in values.items():
        if not name.startswith(WEIGHT_PREFIX):
            return int(np.shape(v)[0])
    return 1


def collect_grads(names: list[str], shapes: list[tuple[int, ...]], grads: list,
                  to_numpy: Callable[[Any], np.ndarray]) -> tuple[dict[str, np.ndarray], float, bool]:
    """Gradients by name (zeros of the value's shape where there is no path), their global norm,
    and whether any searched value has a path to the loss. Non-finite entries become 0.

    ``shapes`` are the shapes of the values fed (a TF1 placeholder's static shape may be
    ``(None, 784)``: only the fed value knows its batch size)."""
    out, total, connected = {}, 0.0, False
    for name, shape, g in zip(names, shapes, grads):
        if g is None:
            out[name] = np.zeros(tuple(int(d) for d in shape), np.float64)
            continue
        connected = True
        arr = np.nan_to_num(to_numpy(g), nan=0.0, posinf=0.0, neginf=0.0)
        out[name] = arr
        total += float((arr * arr).sum())
    return out, math.sqrt(total), connected


class TargetBatches:
    """What every backend's runner does alike: the target checked and bound with its name,
    options and catalogue; batches from the target's sampler, checked against the contract;
    bounds by :func:`default_bounds`; reset to the initial state."""

    _initial: dict[str, np.ndarray]

    def __init__(self, name: str, target: Any, options: RunnerOptions, catalogue: Any, expected: type) -> None:
        if not isinstance(target, expected):
            raise TargetError(f"the factory returned {type(target).__name__}, not a fuzz_core.{expected.__name__}")
        self.name = name
        self.target = target
        self.options = options
        self.catalogue = catalogue
        self.searched = list(target.search)
        self.trains = target.trains

    def reset(self) -> None:
        """Back to the factory's initial state."""
        self.set_state(self._initial)  # type: ignore[attr-defined]  # each runner's own

    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return self.target.check_batch(self.target.sample(rng))

    def bounds(self, batch: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
        return default_bounds(self, batch)  # type: ignore[arg-type]


class Runner(Protocol):
    name: str
    framework: str
    searched: list[str]
    trains: bool

    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]: ...
    def bounds(self, batch: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]: ...
    def discover(self, batch: dict[str, np.ndarray], seed: int) -> list[OpSite]: ...
    def evaluate(self, values: dict[str, np.ndarray], site: OpSite, *, space: str, grad: bool,
                 train: bool, seed: int) -> Evaluation: ...
    def check(self, values: dict[str, np.ndarray], seed: int) -> CheckResult: ...
    def weights(self) -> dict[str, np.ndarray]: ...
    def reset(self) -> None: ...
    def get_state(self) -> dict[str, np.ndarray]: ...
    def set_state(self, state: dict[str, np.ndarray]) -> None: ...
    def versions(self) -> dict[str, str]: ...
