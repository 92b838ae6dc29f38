"""The search for one op site: steps, budget, trace, candidate.

:class:`SiteSearch` owns the budget and the site's state; a strategy decides
where to step next and calls :meth:`SiteSearch.evaluate`, which counts every
forward pass and ends the quantum the moment the site triggers or the budget is
spent. The whole state is plain NumPy and JSON, so it checkpoints anywhere.
"""
from __future__ import annotations

import copy
import hashlib
import math
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, TypeVar

import numpy as np

from fuzz_core.backends.base import WEIGHT_PREFIX, Evaluation, OpRef, Runner
from fuzz_core.catalogue import DEFAULT_CATALOGUE, OpSpec
from fuzz_core.sites import OpSite
from fuzz_core.status import ExitReason, SiteStatus
from fuzz_core.strategies import STRATEGIES, make_strategy

T = TypeVar("T")


@dataclass(frozen=True)
class SearchConfig:
    strategy: str = "adaptive"
    max_steps: int = 500
    seed: int = 0
    search_weights: bool = False
    reach_steps: int = 40        # a site that spends its budget is probed outside its bounds for this many more

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")


@dataclass(frozen=True)
class TracePoint:
    step: int
    suspect_loss: float
    best_loss: float
    grad_norm: float
    event: str          # "step", "retry", "mutation", "refresh", "trigger"
    triggered: bool
    wall_s: float


@dataclass
class Candidate:
    """A site that triggered, before replay confirms it."""

    values: dict[str, np.ndarray]       # the batch (every input, searched or not)
    state: dict[str, np.ndarray] | None  # model/optimizer state when it differs from the factory's
    step: int
    seed: int                           # the step's seed (randomness inside the program)
    first_op: OpRef | None
    training: bool
    weights_searched: bool
    bounds: dict[str, tuple[float, float]]
    phase: str = "forward"              # where the step's first non-finite value arose
    own: bool = True                    # the site's own hazard fired (else another op, or a later phase)


@dataclass
class QuantumResult:
    site_id: str
    steps: int                  # total steps used by the site so far
    steps_quantum: int
    trace: list[TracePoint]
    status: SiteStatus
    best_loss: float
    candidate: Candidate | None = None
    error: str | None = None
    seconds: float = 0.0
    log_space: bool = False     # the trace's suspect losses are log-space (see suspect_loss)
    exit_reason: ExitReason = ExitReason.NONE   # why the site ended, once its status is final
    reach: dict[str, Any] | None = None         # how close it came, and where the nearest trigger lies (not found)

    @property
    def triggered(self) -> bool:
        return self.candidate is not None


_EXIT_REASONS = {SiteStatus.FOUND: ExitReason.TRIGGERED, SiteStatus.EXHAUSTED: ExitReason.BUDGET_SPENT,
                 SiteStatus.UNREACHABLE: ExitReason.UNREACHABLE}


class QuantumOver(Exception):
    """The quantum or the site's budget is spent."""


class Triggered(Exception):
    """The site's own output went non-finite: stop with a candidate."""


def step_seed(seed: int, site_id: str, step: int) -> int:
    """The seed of one step's randomness inside the program: campaign seed, site and step."""
    digest = hashlib.sha256(f"{seed}:{site_id}:{step}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def site_rng(seed: int, site_id: str) -> np.random.Generator:
    """The RNG a site's search draws its batches from: campaign seed and site."""
    return np.random.default_rng([seed, int(site_id, 16) & 0xFFFFFFFF])


def suspect_loss(ev: Evaluation, spec: OpSpec) -> float:
    """The distance to the boundary that traces and the scheduler see: >= 0, 0 at the edge.

    A margin that is NaN (the op's input already NaN) is not "at the edge": it is infinitely
    far from telling anything (``max(0.0, nan)`` is 0.0 in Python, hence the explicit test)."""
    if ev.triggered:
        return 0.0
    if not ev.seen:
        return math.inf
    if spec.log_space and math.isfinite(ev.log_loss):
        return max(0.0, ev.log_loss)
    if math.isnan(ev.hard):
        return math.inf
    return max(0.0, ev.hard)


class SiteSearch:
    """The state and budget of the search for one site, driven by a strategy."""

    def __init__(self, runner: Runner, site: OpSite, config: SearchConfig, strategy: Any = None) -> None:
        self.runner = runner
        self.site = site
        self.config = config
        self.spec = DEFAULT_CATALOGUE[site.op]
        self.strategy = strategy or make_strategy(config.strategy)
        self.rng = site_rng(config.seed, site.id)
        runner.reset()
        self.values: dict[str, np.ndarray] = dict(runner.sample(self.rng))
        if config.search_weights:
            self.values.update(runner.weights())
        self._dtypes = {k: v.dtype for k, v in self.values.items()}   # searched values keep their dtype
        self.bounds = runner.bounds(self.values)
        self.values = self.clip(self.values)
        self.original = {k: v.copy() for k, v in self.values.items()}
        self.step = 0
        self.best = math.inf
        self.trained = False
        self.unreachable = False
        self.seconds = 0.0
        self.strategy_state: dict[str, Any] = {}   # checkpointed (arrays and JSON values)
        self.cache: dict[str, Any] = {}            # a strategy's last evaluations (checkpointed)
        self._trace: list[TracePoint] = []
        self._end = 0
        self._t0 = 0.0
        self.candidate: Candidate | None = None
        self._parked: dict[str, np.ndarray] | None = None   # model state kept aside by park()
        # every step from the site's start state (see freeze()): the program's training step still
        # runs and is watched, its writes are undone before the next step
        self.frozen = False
        # the other ops whose non-finite values this site's search has reported and now steps past
        # (:meth:`step_past`), as (op, location, occurrence); and those of the step that ended the
        # search, when it may step past them (None: it may not)
        self.passed: list[tuple[str, str, int]] = []
        self._passing: list[tuple[str, str, int]] | None = None

    # -- what strategies use ------------------------------------------------------------
    @property
    def searched(self) -> list[str]:
        return [k for k in self.values if k in self.bounds]

    @property
    def last_loss(self) -> float:
        """The suspect loss of the last step of this quantum (inf before its first)."""
        return self._trace[-1].suspect_loss if self._trace else math.inf

    @property
    def batch_size(self) -> int:
        for k, v in self.values.items():
            if not k.startswith(WEIGHT_PREFIX):
                return int(v.shape[0])
        return 1

    def clip(self, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for k, v in values.items():
            if k in self.bounds:
                lo, hi = self.bounds[k]
                v = np.clip(np.nan_to_num(v, nan=lo, posinf=hi, neginf=lo), lo, hi).astype(self._dtypes.get(k, v.dtype))
            out[k] = v
        return out

    def fresh_batch(self) -> dict[str, np.ndarray]:
        return self.clip(self.runner.sample(self.rng))

    def evaluate(self, values: dict[str, np.ndarray], *, event: str = "step", grad: bool = True,
                 seed_step: int | None = None, lookahead: bool = False) -> Evaluation:
        """One step at ``values``. Raises Triggered or QuantumOver; keeps the trace.

        The program's randomness (dropout, noise) is seeded from the campaign seed, the
        site and the step; a strategy may pass ``seed_step`` to evaluate several
        candidates under the same randomness (common random numbers). ``lookahead`` asks the
        runner for ``Evaluation.train_grads`` too (a program that trains).
        """
        if self.step >= self._end:
            raise QuantumOver
        seed = step_seed(self.config.seed, self.site.id, self.step if seed_step is None else seed_step)
        if self.frozen:
            self.runner.reset()
        extra = {"lookahead": True} if lookahead else {}
        ev = self.runner.evaluate(values, self.site, grad=grad, train=True, seed=seed, **extra)
        self.step += ev.passes
        self.trained = self.trained or ev.trained
        loss = suspect_loss(ev, self.spec)
        self.best = min(self.best, loss)
        self._trace.append(TracePoint(self.step, loss, self.best, ev.grad_norm,
                                      "trigger" if ev.triggered else event, ev.triggered,
                                      time.perf_counter() - self._t0 + self.seconds))
        if ev.triggered or ev.event:     # any non-finite value in the step ends the search ...
            origins = self._passable(ev, loss)
            if origins is None or not set(origins) <= set(self.passed):
                self.candidate = self._candidate(values, ev, seed)
                self._passing = origins
                raise Triggered
            # ... but one the search has reported already: it goes on (the step did not train)
        if ev.weights is not None:
            ev.train_shift = _moved_by(ev.grads, values, ev.weights)
            ev.log_train_shift = _moved_by(ev.log_grads, values, ev.weights)
            values.update(ev.weights)
        return ev

    def _passable(self, ev: Evaluation, loss: float) -> list[tuple[str, str, int]] | None:
        """The ops that went non-finite in a step the search could step past, or None: only other ops,
        named, in the forward pass (so the program did not train on the step), and the site's own
        input still finite (its op is not downstream of theirs: it can still go out of its domain
        first)."""
        if (ev.triggered or ev.phase != "forward" or ev.trained or not ev.origins or not math.isfinite(loss)
                or not all(o.located for o in ev.origins)):
            return None
        return [(o.op, o.location, int(o.occurrence)) for o in ev.origins]

    def can_step_past(self) -> bool:
        """The search ended on another op's non-finite value, and may go on past it (:meth:`step_past`)."""
        return self.candidate is not None and not self.candidate.own and self._passing is not None

    def step_past(self) -> bool:
        """Go on after another op's non-finite value, once its finding is reported: a bug that fires
        first (``log(1 - p)`` once a softmax output rounds to 1) no longer hides the site's own
        (``log(p)`` once another output underflows to 0). Later steps whose only non-finite values
        come from those ops are ordinary steps. The step that fired did not train (the backends
        skip the program's training step after a non-finite forward pass), so the program's state
        is the search's. False (nothing changed) when the search did not end that way."""
        if not self.can_step_past():
            return False
        self.passed.extend(k for k in dict.fromkeys(self._passing) if k not in self.passed)
        self.candidate, self._passing = None, None
        return True

    def report_and_step_past(self, report: Callable[[], T]) -> T:
        """``report()`` the other op's finding the search ended on (a confirmation replays it on fresh
        builds, which resets this runner), then :meth:`step_past` it with the search's own model state
        back in the runner. Returns what ``report`` returned."""
        self.park()
        out = report()
        self.step_past()
        self.resume()
        return out

    def freeze(self) -> None:
        """From now on every step starts from the site's start state (the factory's): the program's
        training on the searched batches undid the search's progress (a hazard on the loss itself,
        which the training step lowers on the very batch that raises it), so the state it trained
        into is given up. The training step still runs after each forward pass and is watched (a
        backward or update bug on the batch is still found); only its writes are undone."""
        self.frozen = True
        self.runner.reset()

    def thaw(self) -> None:
        """Undo :meth:`freeze`: the program's training steps accumulate again from the runner's state
        now (a strategy that rides the training after all, where the factory's weights leave it
        nothing to find)."""
        self.frozen = False

    def _changed_state(self) -> dict[str, np.ndarray] | None:
        """The runner's model state when it is no longer the factory's (trained, searched, or
        moved by the program's own forward passes)."""
        changed = getattr(self.runner, "state_changed", None)
        trained = self.trained and not self.frozen      # a frozen site's steps start from the factory's
        if trained or self.config.search_weights or (changed is not None and changed()):
            return self.runner.get_state()
        return None

    def _candidate(self, values: dict[str, np.ndarray], ev: Evaluation, seed: int) -> Candidate:
        """The step that went bad, from the state it started from (a bad training step has
        already moved the weights: the runner kept a copy of where it began)."""
        batch = {k: np.array(v) for k, v in values.items() if not k.startswith(WEIGHT_PREFIX)}
        state = ev.state_before if ev.state_before is not None else self._changed_state()
        return Candidate(batch, state, self.step, seed, ev.first_op, self.trained or ev.trained,
                         self.config.search_weights, dict(self.bounds), phase=ev.phase or "forward",
                         own=bool(ev.triggered))

    # -- running a quantum --------------------------------------------------------------
    def run(self, steps: int, refresh: bool = False) -> QuantumResult:
        """Run up to ``steps`` steps (never past max_steps); stop early when triggered."""
        self._trace = []
        start = self.step
        self._end = min(self.step + max(0, steps), self.config.max_steps)
        self._t0 = time.perf_counter()
        try:
            if refresh:
                self.strategy.refresh(self, fraction=self.strategy.refresh_fraction)
            while self.step < self._end and not self.unreachable:
                self.strategy.iterate(self)
        except (QuantumOver, Triggered):
            pass
        finally:
            self.seconds += time.perf_counter() - self._t0
        status = self.status()
        trace = self._trace
        reach = None
        if status is SiteStatus.EXHAUSTED and self.config.reach_steps > 0:
            from fuzz_core.out_of_reach import probe

            reach = probe(self, self.config.reach_steps)
        return QuantumResult(self.site.id, self.step, self.step - start, trace, status,
                             self.best, self.candidate, seconds=self.seconds, log_space=self.spec.log_space,
                             exit_reason=_EXIT_REASONS.get(status, ExitReason.NONE), reach=reach)

    def status(self) -> SiteStatus:
        if self.candidate is not None:
            return SiteStatus.FOUND
        if self.unreachable:
            return SiteStatus.UNREACHABLE
        if self.step >= self.config.max_steps:
            return SiteStatus.EXHAUSTED
        return SiteStatus.SEARCHING

    # -- sharing a runner between sites ------------------------------------------------
    def park(self) -> None:
        """Keep this site's model state aside: another site may use the runner next."""
        self._parked = self._changed_state()

    def resume(self) -> None:
        """Give the runner back this site's model state (the factory's, if it never changed)."""
        self.runner.reset()
        if self._parked:
            self.runner.set_state(self._parked)
        # the cached evaluation stays valid: the runner is back in the state it was made in

    # -- checkpoints --------------------------------------------------------------------
    def checkpoint(self) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, json-able meta): values, runner state, strategy arrays; step, best, RNG. A copy,
        never a view of the live search: a checkpoint kept in memory (the driver persists it later;
        a local executor hands it over as it is) must not follow the search's later steps (a
        strategy's lists grow in place: a drift's phase losses did, and a resume from such a
        checkpoint went elsewhere than the search it was taken from)."""
        arrays = {"values." + k: np.array(v, copy=True) for k, v in self.values.items()}
        arrays.update({"state." + k: v for k, v in self.runner.get_state().items()})
        strategy_arrays, meta_strategy = _split("strategy.", self.strategy_state)
        arrays.update({k: np.array(v, copy=True) for k, v in strategy_arrays.items()})
        meta_strategy = copy.deepcopy(meta_strategy)
        meta = {"step": self.step, "best": self.best, "trained": self.trained, "seconds": self.seconds,
                "unreachable": self.unreachable, "frozen": self.frozen, "rng": self.rng.bit_generator.state,
                "passed": [list(k) for k in self.passed],
                "strategy": meta_strategy, "bounds": {k: list(v) for k, v in self.bounds.items()},
                "cache": {}}
        for key, ev in self.cache.items():
            if isinstance(ev, Evaluation):
                ev_arrays, meta["cache"][key] = _split(f"cache.{key}.", _evaluation_fields(ev))
                arrays.update(ev_arrays)
        return arrays, meta

    def restore(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Go on from a checkpoint; as a checkpoint is a copy, the search takes a copy of it (it may be
        restored again: a site that moves, a benchmark that replays)."""
        self.values = {k[7:]: np.array(v, copy=True) for k, v in arrays.items() if k.startswith("values.")}
        self.runner.set_state({k[6:]: v for k, v in arrays.items() if k.startswith("state.")})
        self.strategy_state = _join("strategy.", {k: np.array(v, copy=True) for k, v in arrays.items()
                                                  if k.startswith("strategy.")},
                                    copy.deepcopy(meta.get("strategy", {})))
        # a resumed site goes on from its strategy's last evaluation, not a new one
        self.cache = {key: _evaluation(_join(f"cache.{key}.", arrays, scalars))
                      for key, scalars in meta.get("cache", {}).items()}
        self.step, self.best = int(meta["step"]), float(meta["best"])
        self.trained, self.seconds = bool(meta["trained"]), float(meta["seconds"])
        self.unreachable = bool(meta.get("unreachable", False))
        self.frozen = bool(meta.get("frozen", False))
        self.passed = [(str(op), str(loc), int(n)) for op, loc, n in meta.get("passed", [])]
        self.rng.bit_generator.state = meta["rng"]
        self.bounds = {k: (float(v[0]), float(v[1])) for k, v in meta["bounds"].items()}


def _moved_by(grads: dict[str, np.ndarray] | None, before: dict[str, np.ndarray],
              after: dict[str, np.ndarray]) -> float:
    """``sum grads . (after - before)`` over the values both hold: the first-order change of a margin
    when the program's training step moved its searched weights from ``before`` to ``after``."""
    if not grads:
        return 0.0
    total = 0.0
    for k, w in after.items():
        if k in grads and k in before:
            total += float(np.sum(np.asarray(grads[k], np.float64)
                                  * (np.asarray(w, np.float64) - np.asarray(before[k], np.float64))))
    return total if math.isfinite(total) else 0.0


def _split(prefix: str, mapping: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A mapping as checkpoint arrays (an array as ``prefix + key``, a non-empty dict of arrays
    as ``prefix + key/name``) and json-able meta (the rest); :func:`_join` undoes it."""
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {}
    for k, v in mapping.items():
        if isinstance(v, np.ndarray):
            arrays[prefix + k] = v
        elif isinstance(v, dict) and v and all(isinstance(x, np.ndarray) for x in v.values()):
            arrays.update({f"{prefix}{k}/{n}": x for n, x in v.items()})
        else:
            meta[k] = v
    return arrays, meta


def _join(prefix: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> dict[str, Any]:
    out = dict(meta)
    for k, v in arrays.items():
        if k.startswith(prefix):
            outer, _, inner = k[len(prefix):].partition("/")
            if inner:
                out.setdefault(outer, {})[inner] = v
            else:
                out[outer] = v
    return out


def _evaluation_fields(ev: Evaluation) -> dict[str, Any]:
    """An evaluation's fields, each an array, a dict of arrays or a json-able value."""
    out = {f.name: getattr(ev, f.name) for f in fields(ev)}
    out["first_op"] = None if ev.first_op is None else asdict(ev.first_op)
    out["origins"] = None if ev.origins is None else [asdict(o) for o in ev.origins]
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in out.items()}


def _evaluation(values: dict[str, Any]) -> Evaluation:
    op, origins = values.get("first_op"), values.get("origins")
    return Evaluation(**{**values, "first_op": None if op is None else OpRef(**op),
                         "origins": None if origins is None else [OpRef(**o) for o in origins]})
