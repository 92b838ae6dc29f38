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

from fuzz_core.sites import OpSite, column_of, position
from fuzz_core.target import TargetError

WEIGHT_PREFIX = "weight:"
LOG_TAU = 0.5   # soft-minimum temperature of log-space losses (nats)


NOT_LOCATED = "<not located"   # how a location starts that the search could not name (a replay names it)


@dataclass(frozen=True)
class OpRef:
    """An executed op, named for people: the first one that went non-finite."""

    op: str
    kind: str
    location: str
    occurrence: int = 0
    nan: bool = True
    # 1-based column of the call in its line when known: by default the one its location carries
    # (a recorder's :class:`fuzz_core.sites.Location`); shown, never compared
    column: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.column is None:
            object.__setattr__(self, "column", column_of(self.location))
        object.__setattr__(self, "location", str(self.location))

    @property
    def located(self) -> bool:
        """The search named where the op is (it names only catalogued ops' calls)."""
        return not self.location.startswith(NOT_LOCATED)

    @property
    def position(self) -> str:
        """``path:line:col`` (``path:line`` when the column is unknown)."""
        return position(self.location, self.column)

    def to_dict(self) -> dict:
        return {"op": self.op, "kind": self.kind, "location": self.location,
                "occurrence": self.occurrence, "nan": self.nan, "column": self.column}


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
    # with ``lookahead``: how the searched inputs steer the program's own training step toward the
    # edge (the gradient of -<dL/dtheta, dm/dtheta>: the margin's first-order change under one
    # gradient step of the program's loss L on this batch, m the loss the search follows)
    train_grads: dict[str, np.ndarray] | None = None
    grad_norm: float = 0.0
    connected: bool = False             # some searched value has a gradient path to the margin
    movable: bool = True                # something the search or the program's training changes reaches
                                        # the margin (False: constant, a divisor fixed at 1 - rate, ...)
    program_loss: float = float("nan")
    trained: bool = False
    weights: dict[str, np.ndarray] | None = None  # searched weights after the program's training step
    # with ``weights``: the first-order change of ``hard`` (and of ``log_loss``) that the training step
    # made by moving the searched weights (grads . (weights - as evaluated)); the search goes on from the
    # trained weights, where the margin is about ``hard + train_shift``, not ``hard``
    train_shift: float = 0.0
    log_train_shift: float = 0.0
    passes: int = 1                     # forward passes this evaluation cost
    phase: str | None = None            # where the step's first non-finite value arose (with ``event``)
    # with a forward ``event``: every op that went non-finite by its own doing, the first op first
    # (:meth:`FlagBook.origins`); a search steps past a step whose origins it knows already
    origins: list[OpRef] | None = None
    state_before: dict[str, np.ndarray] | None = None  # a bad step's starting state, when not the factory's
    scaler_skips: int = 0               # precision.grad_scaler: consecutive steps the GradScaler skipped on this input


@dataclass
class CheckResult:
    """What the check-only detector saw in one unmodified run of the program."""

    event: bool
    first_op: OpRef | None
    triggered: dict[tuple[str, str, int], bool] = field(default_factory=dict)  # site key -> own hazard fired
    program_loss: float = float("nan")
    phase: str | None = None            # forward | backward | update, with ``event``
    scaler_skips: int = 0               # consecutive steps a GradScaler (the engine's, or the program's own) skipped on this input


INPUT_RANGE = 1.0      # the README's default of ``search.input_range``
WEIGHT_RANGE = 4.0
DATA_DRAWS = 8         # batches drawn from ``sample`` to see the data's range (fixed seeds: every process agrees)
DATA_SALT = 0xDA7A


AUTOCAST_DTYPES = ("fp16", "bf16")
KERAS_POLICIES = ("mixed_float16", "mixed_bfloat16")


@dataclass(frozen=True)
class Precision:
    """How the program runs its arithmetic: as written (fp32, the default), or in mixed precision
    as it would train (the campaign's ``precision:``). The same target file serves both.

    ``autocast``: PyTorch ``torch.autocast`` with this dtype around the program's forward pass;
    ``grad_scaler``: a ``torch.amp.GradScaler`` around the engine's backward and optimizer step;
    ``policy``: TensorFlow, the Keras mixed-precision policy set before the factory builds the model.
    """

    autocast: str | None = None
    grad_scaler: bool = False
    policy: str | None = None

    def __post_init__(self) -> None:
        if self.autocast is not None and self.autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"precision.autocast must be one of {AUTOCAST_DTYPES}, got {self.autocast!r}")
        if self.policy is not None and self.policy not in KERAS_POLICIES:
            raise ValueError(f"precision.policy must be one of {KERAS_POLICIES}, got {self.policy!r}")
        if self.grad_scaler and self.autocast is None:
            raise ValueError("precision.grad_scaler needs precision.autocast (a scaler without autocast scales fp32)")

    @property
    def mixed(self) -> bool:
        return self.autocast is not None or self.policy is not None

    def to_dict(self) -> dict:
        return {"autocast": self.autocast, "grad_scaler": self.grad_scaler, "policy": self.policy}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Precision":
        d = d or {}
        return cls(d.get("autocast"), bool(d.get("grad_scaler", False)), d.get("policy"))


@dataclass(frozen=True)
class RunnerOptions:
    device: str = "cpu"
    search_weights: bool = False
    weight_range: float = WEIGHT_RANGE   # searched weights: their initial range, grown by this many spreads
    input_range: float = INPUT_RANGE     # inputs without bounds: the sampled data's range, grown likewise
    precision: Precision = Precision()   # fp32, or mixed precision as the program would train


def data_box(lo: float, hi: float, factor: float) -> tuple[float, float]:
    """The range ``[lo, hi]`` grown by ``factor`` times its spread on each side, never across zero
    when it does not already straddle it: non-negative data (pixels, counts, probabilities) keeps
    its sign, and so does non-positive data. A single value's spread is its own size (or 1 at 0)."""
    spread = hi - lo
    if not spread > 0:
        spread = max(abs(lo), abs(hi)) or 1.0
    box_lo, box_hi = lo - factor * spread, hi + factor * spread
    if lo >= 0:
        box_lo = max(box_lo, 0.0)
    if hi <= 0:
        box_hi = min(box_hi, 0.0)
    return float(box_lo), float(box_hi)


def sampled_ranges(sample: Callable[[np.random.Generator], dict[str, np.ndarray]],
                   names: list[str]) -> dict[str, tuple[float, float]]:
    """The finite range of each named input over :data:`DATA_DRAWS` batches of ``sample``."""
    lo = {n: math.inf for n in names}
    hi = {n: -math.inf for n in names}
    for i in range(DATA_DRAWS):
        batch = sample(np.random.default_rng([DATA_SALT, i]))
        for n in names:
            v = np.asarray(batch[n], dtype=np.float64)
            v = v[np.isfinite(v)]
            if v.size:
                lo[n], hi[n] = min(lo[n], float(v.min())), max(hi[n], float(v.max()))
    return {n: (lo[n], hi[n]) for n in names if lo[n] <= hi[n]}


def default_bounds(runner: "Runner", batch: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Bounds of every searched value: the target's, else the documented defaults.

    An input without bounds stays within the range of the data ``sample`` gives (over
    :data:`DATA_DRAWS` batches, and the batch at hand), grown by ``input_range`` times that
    range's spread on each side, never across zero (:func:`data_box`). A searched weight
    stays within its initial range grown by ``weight_range`` times its largest magnitude on
    each side; a tensor that starts at zero (a bias) takes the largest magnitude among the
    model's other weights (1 if every weight is zero).
    """
    out = {}
    ranges = runner.data_ranges()
    for name in runner.searched:
        if name in runner.target.bounds:
            out[name] = runner.target.bounds[name]
            continue
        v = np.asarray(batch[name], dtype=np.float64)
        v = v[np.isfinite(v)]
        lo, hi = ranges.get(name, (math.inf, -math.inf))
        if v.size:
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
        out[name] = data_box(lo, hi, runner.options.input_range) if lo <= hi else (-1.0, 1.0)
    if runner.options.search_weights:
        weights = runner.weights()
        sizes = {n: float(np.abs(w).max()) if np.size(w) else 0.0 for n, w in weights.items()}
        fallback = max(sizes.values(), default=0.0) or 1.0
        for name, w in weights.items():
            size = sizes[name] or fallback
            lo, hi = (float(np.min(w)), float(np.max(w))) if np.size(w) else (0.0, 0.0)
            out[name] = (lo - runner.options.weight_range * size, hi + runner.options.weight_range * size)
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

    def data_ranges(self) -> dict[str, tuple[float, float]]:
        """The range of each searched input in the data ``sample`` gives (computed once)."""
        ranges = getattr(self, "_data_ranges", None)
        if ranges is None:
            ranges = self._data_ranges = sampled_ranges(self.sample, [n for n in self.searched])
        return ranges


class Runner(Protocol):
    name: str
    framework: str
    searched: list[str]
    trains: bool

    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]: ...
    def bounds(self, batch: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]: ...
    def discover(self, batch: dict[str, np.ndarray], seed: int) -> list[OpSite]: ...
    def evaluate(self, values: dict[str, np.ndarray], site: OpSite, *, grad: bool,
                 train: bool, seed: int, lookahead: bool = False) -> Evaluation: ...
    def check(self, values: dict[str, np.ndarray], seed: int) -> CheckResult: ...
    def weights(self) -> dict[str, np.ndarray]: ...
    def reset(self) -> None: ...
    def get_state(self) -> dict[str, np.ndarray]: ...
    def set_state(self, state: dict[str, np.ndarray]) -> None: ...
    def versions(self) -> dict[str, str]: ...
