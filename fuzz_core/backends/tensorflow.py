"""TensorFlow backend: TF2 programs (eager, ``tf.function``, Keras) and TF1-style graph programs.

The only module of fuzz_core (with tf_recorder) that imports TensorFlow; loaded lazily
by :func:`fuzz_core.backends.load_backend`.

* :class:`EagerRunner` runs a :class:`~fuzz_core.Target` whose ``program`` uses TF ops.
  Each pass runs the program eagerly under an op callback (``tf.function`` bodies
  included: ``run_functions_eagerly`` is on for the pass, so ``tf.cond`` branches,
  ``tf.while_loop`` bodies and autograph ``if``/``for`` run op by op and are seen),
  inside a persistent ``GradientTape``; suspect losses are built from the recorded
  inputs and differentiated with the tape (never with the program's own gradients).
  With an ``optimizer`` the program's training step (``tape.gradient`` of the mean
  loss, ``optimizer.apply_gradients``) runs on the same, searched batch.
* :class:`GraphRunner` runs a :class:`~fuzz_core.GraphTarget`: sites are the catalogued
  ops among the forward ancestors of ``loss`` (recursing into ``If``/``While`` branch
  graphs), gradients come from ``tf.gradients`` w.r.t. the fed placeholders, per-op
  non-finite flags are fetched in the same ``session.run``, and training runs the
  program's own ``train_op`` (a pass of its own: it counts as a step, like ``train_step``).
  An op inside a branch graph is measured on a copy of its branch imported into the
  outer graph and fed by the control-flow op's real inputs; a ``While`` body's ops are
  measured at the first iteration only (later iterations still show up as non-finite
  outputs of the ``While`` op). Stateful graph random ops cannot be seeded per step (their
  state lives in the session): feed noise through a placeholder from ``sample``.

Both snapshot and restore every variable (Keras 3 seed-generator states and optimizer
slots included). The semantics of every Runner method mirror the torch backend.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import re
import sys
import zlib
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context as tf_context
from tensorflow.python.framework import op_callbacks

from fuzz_core.backends.base import WEIGHT_PREFIX, CheckResult, Evaluation, RunnerOptions, default_bounds
from fuzz_core.backends.tf_recorder import (
    ALWAYS_OK, CALL_TYPES, IF_TYPES, NOT_SEARCHED, PASS_THROUGH, WHILE_TYPES, XP, Call, EagerRecorder, FlagBook,
    GraphOp, branch_graphs, graph_flag, np_dtype, tiny_of, traceback_location, walk,
)
from fuzz_core.catalogue import DEFAULT_CATALOGUE, Catalogue, log_floor
from fuzz_core.sites import OpSite, make_site, relative_path
from fuzz_core.target import GraphTarget, Target, TargetError

log = logging.getLogger(__name__)
LOG_TAU = 0.5   # soft-minimum temperature of log-space losses (nats), as the torch backend
_SEED_STATE = "seed_generator_state"
_SOURCES = ("Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "Variable")


def _configure_threads() -> None:
    """One intra- and one inter-op thread (a shared 2-core machine); TF_NUM_*_THREADS win."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", 1)))
        tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("TF_NUM_INTEROP_THREADS", 1)))
    except RuntimeError:
        pass    # the context is initialised already (the factory ran ops): the env vars decided


_configure_threads()


def seed_everything(seed: int, kernels: bool = True) -> None:
    """Seed every generator a program may draw from (its iterative external values).

    ``tf.random.set_seed`` also empties the eager kernel cache (stateful random kernels
    keep their state there), which costs every op of the next pass a kernel rebuild: with
    ``kernels=False`` the global seed is set without that, for programs that run no
    stateful random op (the recorder tells; Keras layers draw from stateless ops).
    """
    seed = int(seed) % (2**31)
    random.seed(seed)
    np.random.seed(seed)
    if kernels:
        tf.random.set_seed(seed)
    else:
        ctx = tf_context.context()
        ctx._seed = seed                      # noqa: SLF001 - what set_seed does, less the cache flush
        ctx._rng = random.Random(seed)        # noqa: SLF001
    _seed_keras(seed)


def _seed_keras(seed: int) -> None:
    """keras.utils.set_random_seed less its tf.random.set_seed: the global Keras seed generator."""
    keras = sys.modules.get("keras")
    if keras is None:
        return
    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
        from keras.src.utils import rng_utils

        global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, seed)
        global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    except Exception:  # noqa: BLE001 - another Keras layout: its public function does it all
        keras.utils.set_random_seed(seed)


def _train_seed(program_loss: float) -> int:
    return zlib.crc32(f"train:{program_loss!r}".encode()) & 0x7FFFFFFF


def _var_name(v: Any) -> str:
    name = getattr(v, "path", None) or getattr(v, "name", None) or "variable"
    return str(name).removesuffix(":0")


def _stable(variables: list, prefix: str) -> dict[str, Any]:
    """Keys that every process building the same factory agrees on (a Ray actor, a replay).

    Keras numbers its auto-generated names per process (``dense_6`` when five Dense layers
    were built before): keys are the variable's position, then its name without those
    counters, e.g. ``model.003.sequential.dense.bias``.
    """
    out: dict[str, Any] = {}
    for i, v in enumerate(variables):
        name = re.sub(r"_\d+(?=$|[/_.:])", "", _var_name(v)).replace("/", ".")
        out[f"{prefix}{i:03d}.{name}"] = v
    return out


def _named(variables: list, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variables:
        name = prefix + _var_name(v)
        key, i = name, 1
        while key in out:
            key, i = f"{name}_{i}", i + 1
        out[key] = v
    return out


def _unique(variables) -> list:
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def program_loss(out: Any):
    """The loss of a program's return value: a tensor, the first of a tuple, or out["loss"]."""
    if tf.is_tensor(out):
        return out
    if isinstance(out, dict):
        return out.get("loss") if tf.is_tensor(out.get("loss")) else None
    if isinstance(out, (tuple, list)) and out and tf.is_tensor(out[0]):
        return out[0]
    return None


def _scalar(value) -> float:
    if value is None:
        return float("nan")
    arr = np.asarray(value.numpy() if tf.is_tensor(value) else value, dtype=np.float64)
    return float(arr.mean()) if arr.size else float("nan")


def _batch_size(values: dict[str, np.ndarray]) -> int:
    for name, v in values.items():
        if not name.startswith(WEIGHT_PREFIX):
            return int(np.shape(v)[0])
    return 1


def _to_numpy_grad(g) -> np.ndarray:
    if isinstance(g, tf.IndexedSlices):
        g = tf.convert_to_tensor(g)
    arr = g.numpy() if tf.is_tensor(g) else np.asarray(g)
    if hasattr(arr, "values") and hasattr(arr, "indices"):   # IndexedSlicesValue from a session
        dense = np.zeros(arr.dense_shape, dtype=arr.values.dtype)
        np.add.at(dense, arr.indices, arr.values)
        arr = dense
    return np.nan_to_num(np.asarray(arr, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)


def _collect(names: list[str], targets: list, grads: list) -> tuple[dict[str, np.ndarray], float, bool]:
    out, total, connected = {}, 0.0, False
    for name, target, g in zip(names, targets, grads):
        if g is None:
            out[name] = np.zeros(tuple(target.shape), np.float64)
            continue
        connected = True
        arr = _to_numpy_grad(g)
        out[name] = arr
        total += float((arr * arr).sum())
    return out, math.sqrt(total), connected


def _device_name(device: str) -> str | None:
    if device in ("cpu", "CPU"):
        return "/CPU:0"
    if device.startswith("cuda"):
        index = device.split(":", 1)[1] if ":" in device else "0"
        return f"/GPU:{index}"
    if device == "auto":
        return None
    return device


def _warn_unknown(state: dict, known, prefixes: tuple[str, ...]) -> None:
    unknown = [k for k in state if k.startswith(prefixes) and k not in known]
    if unknown:
        log.warning("state holds %d variable(s) this target does not have (e.g. %s): left as they are",
                    len(unknown), unknown[0])


def _tf_var(v):
    """The tf.Variable behind a Keras 3 variable (what a GradientTape differentiates against)."""
    if isinstance(v, tf.Variable):
        return v
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, tf.Variable) else v


def _shaped(value, var) -> np.ndarray:
    """A saved value in the variable's dtype and shape (files store scalars as 1-element arrays)."""
    dtype = var.dtype.base_dtype if hasattr(var.dtype, "base_dtype") else var.dtype
    arr = np.asarray(value).astype(np_dtype(dtype))
    shape = tuple(var.shape)
    if arr.shape != shape and None not in shape and arr.size == int(np.prod(shape, dtype=np.int64)):
        arr = arr.reshape(shape)
    return arr


def _versions() -> dict[str, str]:
    out = {"tensorflow": tf.__version__}
    try:
        import keras

        out["keras"] = keras.__version__
    except Exception:  # noqa: BLE001
        pass
    return out


# =====================================================================================
# TF2: eager programs, tf.function, Keras
# =====================================================================================

class EagerRunner:
    """One built TF2 target, ready to run steps for any of its sites."""

    framework = "tensorflow"

    def __init__(self, name: str, target: Target, options: RunnerOptions = RunnerOptions(),
                 catalogue: Catalogue = DEFAULT_CATALOGUE) -> None:
        if not isinstance(target, Target):
            raise TargetError(f"the factory returned {type(target).__name__}, not a fuzz_core.Target")
        if not tf.executing_eagerly():
            raise TargetError("a TF2 Target needs eager execution (is TF1 behaviour enabled? use GraphTarget)")
        self.name = name
        self.target = target
        self.options = options
        self.catalogue = catalogue
        self.device = options.device
        self._device = _device_name(options.device)
        self.searched = list(target.search)
        self.trains = target.trains
        self._warm_up(target)
        model_vars = self._model_variables(target.model)
        self._model_vars = _stable(model_vars, "model.")
        self._trainable = [v for v in model_vars if getattr(v, "trainable", True) and _SEED_STATE not in _var_name(v)]
        self._params = {k[len("model."):]: v for k, v in self._model_vars.items()
                        if any(v is t for t in self._trainable)}
        self._seed_vars = [v for v in model_vars if _var_name(v).endswith(_SEED_STATE)]
        self._build_optimizer()
        self._opt_vars = _stable(self._optimizer_variables(), "optim.")
        self._stateful_random = True     # until a pass shows that the program runs no stateful random op
        self._probed = False
        self._initial = self.get_state()

    # -- variables ----------------------------------------------------------------------
    @staticmethod
    def _model_variables(model) -> list:
        if model is None:
            return []
        if isinstance(model, (list, tuple)):
            variables = list(model)
        elif hasattr(model, "variables"):
            variables = list(model.variables)
        else:
            raise TargetError(f"Target.model must be a tf.keras.Model, a tf.Module or a list of tf.Variable, "
                              f"got {type(model).__name__}")
        for v in variables:
            if not hasattr(v, "assign") or not hasattr(v, "numpy"):
                raise TargetError(f"Target.model holds {type(v).__name__}, not a variable")
        return _unique(variables)

    @staticmethod
    def _warm_up(target: Target) -> None:
        """A Keras model built lazily gets its variables from one forward pass on a sample."""
        model = target.model
        if model is None or getattr(model, "built", True):
            return
        batch = target.check_batch(target.sample(np.random.default_rng(0)))
        target.program({k: tf.constant(v) for k, v in batch.items()})

    def _build_optimizer(self) -> None:
        """Create the optimizer's slots now, so that the initial snapshot holds them too."""
        opt = self.target.optimizer
        if opt is None or getattr(opt, "built", True) or not hasattr(opt, "build"):
            return
        try:
            opt.build(self._trainable)
        except Exception:  # noqa: BLE001 - an optimizer that builds lazily its own way
            pass

    def _optimizer_variables(self) -> list:
        opt = self.target.optimizer
        if opt is None:
            return []
        variables = getattr(opt, "variables", None)
        if callable(variables):
            variables = variables()
        return _unique(list(variables or []))

    def weights(self) -> dict[str, np.ndarray]:
        return {WEIGHT_PREFIX + n: np.array(v.numpy()) for n, v in self._params.items()}

    def get_state(self) -> dict[str, np.ndarray]:
        """Every variable of the model (seed generators included) and of the optimizer."""
        if len(self._optimizer_variables()) != len(self._opt_vars):   # an optimizer that built late
            self._opt_vars = _stable(self._optimizer_variables(), "optim.")
        state = {k: np.array(v.numpy()) for k, v in self._model_vars.items()}
        state.update({k: np.array(v.numpy()) for k, v in self._opt_vars.items()})
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        _warn_unknown(state, self._model_vars.keys() | self._opt_vars.keys(), ("model.", "optim."))
        for table in (self._model_vars, self._opt_vars):
            for key, var in table.items():
                if key in state:
                    var.assign(_shaped(state[key], var))

    def reset(self) -> None:
        """Back to the factory's initial state (weights, seed generators, optimizer)."""
        self.set_state(self._initial)

    def versions(self) -> dict[str, str]:
        return _versions()

    # -- batches ------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return self.target.check_batch(self.target.sample(rng))

    def bounds(self, batch: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
        return default_bounds(self, batch)

    def _scope(self):
        return tf.device(self._device) if self._device else contextlib.nullcontext()

    def _tensors(self, values: dict[str, np.ndarray], grad: bool) -> tuple[dict, dict]:
        batch, leaves = {}, {}
        for name, value in values.items():
            if name.startswith(WEIGHT_PREFIX):
                continue
            t = tf.constant(np.ascontiguousarray(value))
            if grad and name in self.searched:
                leaves[name] = t
            batch[name] = t
        for name, value in values.items():
            if name.startswith(WEIGHT_PREFIX):
                var = self._params[name[len(WEIGHT_PREFIX):]]
                var.assign(_shaped(value, var))
                if grad:
                    leaves[name] = var
        return batch, leaves

    # -- running ------------------------------------------------------------------------
    def _seed(self, seed: int) -> None:
        seed_everything(seed, kernels=self._stateful_random)
        for i, var in enumerate(self._seed_vars):   # Keras 3 layers draw from their own generators
            value = np.array([(seed * 1_000_003 + 7919 * (i + 1)) % (2**31 - 1), 0])
            var.assign(value.astype(np_dtype(var.dtype)))

    def _forward(self, batch: dict, seed: int, locate_all: bool, track_constants: bool = False):
        self._seed(seed)
        recorder = EagerRecorder(self.catalogue, locate_all=locate_all)
        recorder.track_constants = track_constants
        eager_before = tf.config.functions_run_eagerly()
        tf.config.run_functions_eagerly(True)
        tape_gradient = tf.GradientTape.gradient
        tf.GradientTape.gradient = _paused(recorder, tape_gradient)   # a backward inside the program
        op_callbacks.add_op_callback(recorder)
        try:
            out = self.target.program(batch)
        finally:
            op_callbacks.remove_op_callback(recorder)
            tf.GradientTape.gradient = tape_gradient
            tf.config.run_functions_eagerly(eager_before)
        # sticky once seen: a kernel that ran once keeps its state in the cache until a flush
        self._stateful_random = recorder.stateful_random or (self._stateful_random and self._probed)
        self._probed = True
        return recorder, out

    def discover(self, batch: dict[str, np.ndarray], seed: int) -> list[OpSite]:
        with self._scope():
            tensors, _ = self._tensors(batch, grad=False)
            with tf.GradientTape() as tape:      # tells constant scalars (x / 2.0, x ** 2) from values
                for t in tensors.values():
                    if t.dtype.is_floating:
                        tape.watch(t)
                recorder, _ = self._forward(tensors, seed, locate_all=False, track_constants=True)
        sites, seen = [], set()
        for call in recorder.calls:
            key = (call.spec.name, call.location, call.occurrence)
            if key in seen:
                continue
            if call.spec.searched and call.spec.margins(call.scalar_inputs(), XP) is None:
                continue          # no hazard in this call (x ** 2, x / 2.0)
            seen.add(key)
            sites.append(make_site(self.name, call.spec.name, call.kind, call.spec.hazard, call.location,
                                   call.occurrence, call.spec.searched))
        return sites

    def _program_location(self) -> str:
        code = getattr(self.target.program, "__code__", None)
        if code is None:
            code = getattr(getattr(self.target.program, "python_function", None), "__code__", None)
        if code is None:
            return "<program>:0"
        return f"{relative_path(code.co_filename)}:{code.co_firstlineno}"

    def check(self, values: dict[str, np.ndarray], seed: int) -> CheckResult:
        """The check-only detector: run the unmodified program once, name the first bad op."""
        with self._scope():
            batch, _ = self._tensors(values, grad=False)
            recorder, out = self._forward(batch, seed, locate_all=True)
            flags = recorder.resolve([_outputs_nonfinite(out)])
        loss = program_loss(out)
        first = recorder.first_event(flags, flags[-1], self._program_location())
        triggered = {(c.spec.name, c.location, c.occurrence): recorder.triggered(flags, c)
                     for c in recorder.calls if c.spec.searched}
        return CheckResult(first is not None, first, triggered, _scalar(loss) if loss is not None else float("nan"))

    def evaluate(self, values: dict[str, np.ndarray], site: OpSite, *, grad: bool = True,
                 train: bool = False, seed: int = 0) -> Evaluation:
        """One step: forward under the recorder; the site's margin, losses and gradients."""
        train = train and self.trains
        own_step = train and self.target.train_step is None and self.target.optimizer is not None
        with self._scope():
            batch, leaves = self._tensors(values, grad=grad)
            tape = tf.GradientTape(persistent=True) if (grad or own_step) else None
            with tape if tape is not None else contextlib.nullcontext():
                if tape is not None:
                    for name, t in leaves.items():
                        if not name.startswith(WEIGHT_PREFIX):
                            tape.watch(t)          # variables are watched as they are read
                recorder, out = self._forward(batch, seed, locate_all=False)
                loss = program_loss(out)
                call = recorder.find(site.key)
                margin = call.spec.margins(call.inputs, XP) if call is not None else None
                flags = recorder.resolve([_outputs_nonfinite(out)])
                first = recorder.first_event(flags, flags[-1], site.location)
                ev = Evaluation(seen=margin is not None, hard=math.inf, log_loss=math.inf,
                                triggered=call is not None and recorder.triggered(flags, call),
                                event=first is not None, first_op=first, program_loss=_scalar(loss))
                scored = self._stats(ev, margin, _batch_size(values)) if margin is not None else None
                mean_loss = tf.reduce_mean(loss) if own_step and not ev.event and loss is not None else None
            if scored is not None and grad and not ev.triggered and tape is not None:
                hard, log_loss = scored
                self._grads(ev, tape, hard, log_loss, call.spec.log_space, leaves)
            if train and not ev.event and loss is not None:
                self._train(batch, tape, mean_loss, ev)
            del tape
        return ev

    def _stats(self, ev: Evaluation, margin, batch_size: int):
        m = tf.convert_to_tensor(margin)
        if m.dtype in (tf.float16, tf.bfloat16):
            m = tf.cast(m, tf.float32)
        flat = tf.reshape(m, [-1])
        hard = tf.reduce_min(flat)
        tiny = tiny_of(m.dtype)
        log_loss = (-LOG_TAU * tf.reduce_logsumexp(-tf.math.log(tf.maximum(flat, tf.constant(tiny, m.dtype)))
                                                   / LOG_TAU) - log_floor(tiny))
        ev.hard, ev.log_loss = float(hard.numpy()), float(log_loss.numpy())
        if m.shape.rank and m.shape.rank >= 1 and m.shape[0] == batch_size and batch_size > 1:
            ev.per_sample = tf.reduce_min(tf.reshape(m, [batch_size, -1]), axis=1).numpy().astype(np.float64)
        return hard, log_loss

    def _grads(self, ev: Evaluation, tape, hard, log_loss, log_space: bool, leaves: dict) -> None:
        if not leaves:
            return
        names = list(leaves)
        targets = [_tf_var(leaves[n]) for n in names]
        grads = tape.gradient(hard, targets)
        if all(g is None for g in grads) and not self._depends_on_params(tape, hard, targets):
            return          # no path from any value that could carry a gradient (torch: not requires_grad)
        ev.grads, ev.grad_norm, ev.connected = _collect(names, targets, grads)
        if log_space and math.isfinite(ev.log_loss):
            ev.log_grads, _, _ = _collect(names, targets, tape.gradient(log_loss, targets))

    def _depends_on_params(self, tape, hard, targets: list) -> bool:
        others = [_tf_var(v) for v in self._trainable]
        others = [v for v in others if not any(v is t for t in targets)]
        return bool(others) and any(g is not None for g in tape.gradient(hard, others))

    def _train(self, batch: dict, tape, mean_loss, ev: Evaluation) -> None:
        """The program's own training step on the searched batch (GRIST keeps training)."""
        target = self.target
        if target.train_step is not None:
            seed_everything(_train_seed(ev.program_loss), kernels=self._stateful_random)
            target.train_step({k: tf.stop_gradient(v) for k, v in batch.items()})
            ev.passes += 1
        elif target.optimizer is not None and tape is not None and mean_loss is not None:
            grads = tape.gradient(mean_loss, [_tf_var(v) for v in self._trainable])
            pairs = [(g, v) for g, v in zip(grads, self._trainable) if g is not None]
            if not pairs:
                return
            target.optimizer.apply_gradients(pairs)
        else:
            return
        ev.trained = True
        if self.options.search_weights:
            ev.weights = self.weights()


def _paused(recorder: EagerRecorder, gradient):
    """``GradientTape.gradient`` that the recorder does not see: ops of a backward pass run
    inside the program are not forward sites (as in the torch backend)."""
    def wrapper(tape, *args, **kwargs):
        recorder.paused += 1
        try:
            return gradient(tape, *args, **kwargs)
        finally:
            recorder.paused -= 1
    return wrapper


def _outputs_nonfinite(out: Any) -> bool:
    for t in tf.nest.flatten(out, expand_composites=True):
        if tf.is_tensor(t) and t.dtype.is_floating:
            if not bool(np.isfinite(np.asarray(t.numpy(), dtype=np.float64)).all()):
                return True
    return False


# =====================================================================================
# TF1-style graph programs
# =====================================================================================

class GraphRunner:
    """One built TF1-style graph target (graph, session, placeholders, loss, train_op)."""

    framework = "tensorflow"

    def __init__(self, name: str, target: GraphTarget, options: RunnerOptions = RunnerOptions(),
                 catalogue: Catalogue = DEFAULT_CATALOGUE) -> None:
        if not isinstance(target, GraphTarget):
            raise TargetError(f"the factory returned {type(target).__name__}, not a fuzz_core.GraphTarget")
        self.name = name
        self.target = target
        self.options = options
        self.catalogue = catalogue
        self.device = options.device
        self.graph = target.graph
        self.session = target.session
        self.loss = self._as_tensor(target.loss, "loss")
        self.feeds = dict(target.feeds)
        self.searched = list(target.search)
        self.trains = target.trains
        with self.graph.as_default():
            v1 = tf.compat.v1
            variables = (self.graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)
                         + self.graph.get_collection(v1.GraphKeys.LOCAL_VARIABLES))
            trainable = self.graph.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES)
        self._vars = _named(_unique(variables), "graph.")
        self._trainable = _unique(trainable)
        self._params = {_var_name(v).removesuffix(":0"): v for v in self._trainable}
        self._assign: dict[str, tuple[Any, Any]] = {}
        self._book: FlagBook | None = None
        self._site_cache: dict[tuple, Any] = {}
        self._copies: dict[tuple, str] = {}
        self._copy_count = 0
        self._initial = self.get_state()

    def _as_tensor(self, value, what: str):
        if isinstance(value, (list, tuple)):
            value = value[0]
        if not tf.is_tensor(value) or getattr(value, "graph", None) is not self.graph:
            raise TargetError(f"GraphTarget.{what} must be a tensor of GraphTarget.graph")
        return value

    # -- variables ----------------------------------------------------------------------
    def _unfinalize(self) -> None:
        if self.graph.finalized:
            self.graph._unsafe_unfinalize()  # noqa: SLF001 - our check ops live beside the program's

    def weights(self) -> dict[str, np.ndarray]:
        if not self._params:
            return {}
        names = list(self._params)
        values = self.session.run([self._params[n] for n in names])
        return {WEIGHT_PREFIX + n: np.array(v) for n, v in zip(names, values)}

    def get_state(self) -> dict[str, np.ndarray]:
        """Every global and local variable of the graph (optimizer slots and counters included)."""
        if not self._vars:
            return {}
        keys = list(self._vars)
        values = self.session.run([self._vars[k] for k in keys])
        return {k: np.array(v) for k, v in zip(keys, values)}

    def _assign_ops(self, items: list[tuple[str, Any]]):
        ops = []
        for key, var in items:
            hit = self._assign.get(key)
            if hit is None:
                self._unfinalize()
                with self.graph.as_default(), tf.name_scope("cdeepfuzz/assign"):
                    ph = tf.compat.v1.placeholder(var.dtype.base_dtype, shape=var.shape)
                    hit = self._assign[key] = (ph, tf.compat.v1.assign(var, ph).op)
            ops.append(hit[1])
        return ops

    def _load(self, items: list[tuple[str, Any, np.ndarray]]) -> None:
        if not items:
            return
        ops = self._assign_ops([(k, v) for k, v, _ in items])
        feed = {self._assign[k][0]: _shaped(val, v) for k, v, val in items}
        self.session.run(ops, feed_dict=feed)

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        _warn_unknown(state, self._vars.keys(), ("graph.",))
        self._load([(k, v, state[k]) for k, v in self._vars.items() if k in state])

    def reset(self) -> None:
        self.set_state(self._initial)

    def versions(self) -> dict[str, str]:
        return _versions()

    # -- batches ------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return self.target.check_batch(self.target.sample(rng))

    def bounds(self, batch: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
        return default_bounds(self, batch)

    def _feed(self, values: dict[str, np.ndarray]) -> dict:
        weights = [("graph." + _var_name(self._params[k[len(WEIGHT_PREFIX):]]), self._params[k[len(WEIGHT_PREFIX):]], v)
                   for k, v in values.items() if k.startswith(WEIGHT_PREFIX)]
        if weights:
            self._load(weights)
        return {self.feeds[k]: v for k, v in values.items() if k in self.feeds}

    # -- instrumentation (built once, in the program's graph) ---------------------------
    def _copy_of(self, gop: GraphOp, anchor=None):
        """(inputs, outputs, seen) of an op inside branch graphs, from copies fed by the real inputs
        (those of ``anchor``, a copy of the outermost control-flow op, when given)."""
        seen = None
        copied = None      # the copy (in the outer graph) of the next op down the path
        for depth, (cf, role) in enumerate(gop.path):
            real = (cf if anchor is None else anchor) if depth == 0 else copied
            inputs = list(real.inputs)
            if cf.type in IF_TYPES:
                pred = tf.cast(inputs[0], tf.bool)
                level_seen = pred if role == "then" else tf.logical_not(pred)
                branch_inputs = inputs[1:]
            elif cf.type in WHILE_TYPES:       # the first iteration of the body
                level_seen = None
                branch_inputs = inputs
            else:
                level_seen = None
                branch_inputs = inputs
            seen = level_seen if seen is None else (seen if level_seen is None else tf.logical_and(seen, level_seen))
            fg = dict(branch_graphs(cf))[role]
            if len(fg.inputs) != len(branch_inputs):
                return None
            prefix = self._import(fg, branch_inputs)
            inner = gop.path[depth + 1][0] if depth + 1 < len(gop.path) else gop.op
            copied = self.graph.get_operation_by_name(f"{prefix}/{inner.name}")
        return list(copied.inputs), list(copied.outputs), seen

    def _import(self, fg, inputs: list) -> str:
        key = (id(fg), tuple(t.name for t in inputs))
        prefix = self._copies.get(key)
        if prefix is None:
            prefix = f"cdeepfuzz/copy{self._copy_count}"
            self._copy_count += 1
            input_map = {ph.name: t for ph, t in zip(fg.inputs, inputs)}
            tf.graph_util.import_graph_def(fg.as_graph_def(), input_map=input_map, name=prefix + "/")
            self._copies[key] = prefix
        return prefix

    def _instrument(self) -> FlagBook:
        if self._book is not None:
            return self._book
        self._unfinalize()
        book = FlagBook()
        counts: dict[tuple[str, str], int] = {}
        with self.graph.as_default(), tf.compat.v1.name_scope("cdeepfuzz/checks/"):
            for gop in walk(self.graph, [self.loss]):
                op = gop.op
                spec = self.catalogue.for_tf(op.type)
                if spec is not None and not any(t.dtype.is_floating for t in op.outputs):
                    spec = None            # integer arithmetic cannot go non-finite
                if spec is None:
                    if gop.path or op.type in PASS_THROUGH:
                        continue
                    flag = graph_flag(op.outputs, nan_only=True)
                    if flag is not None:
                        book.push(flag, (f"{op.type}:{op.name}", traceback_location(op), -1))
                    continue
                location = traceback_location(op)
                occurrence = counts.get((spec.name, location), 0)
                counts[(spec.name, location)] = occurrence + 1
                if gop.path:
                    copied = self._copy_of(gop)
                    if copied is None:
                        continue
                    inputs, outputs, seen = copied
                    name = "/".join([cf.name for cf, _ in gop.path] + [op.name])
                else:
                    inputs, outputs, seen, name = list(op.inputs), list(op.outputs), None, op.name
                kind = f"{op.type}:{name}"
                index = len(book.calls)
                in_ok = NOT_SEARCHED
                if spec.searched:
                    ok = graph_flag(inputs, nan_only=False, negate=True)
                    in_ok = book.push(ok) if ok is not None else ALWAYS_OK
                    bad = graph_flag(outputs, nan_only=False)
                    bad = tf.constant(False) if bad is None else bad
                    flag = book.push(bad if seen is None else tf.logical_and(seen, bad), (kind, location, index))
                else:
                    bad = graph_flag(outputs, nan_only=True)
                    flag = -1 if bad is None else book.push(bad if seen is None else tf.logical_and(seen, bad),
                                                            (kind, location, index))
                book.calls.append(Call(spec, kind, location, occurrence, [_static(t) for t in inputs], flag, in_ok,
                                       True if seen is None else seen, outputs, origin=gop))
            self._flags = tf.stack([tf.reshape(f, []) for f in book.flags]) if book.flags else tf.zeros([0], tf.bool)
            self._outputs_bad = graph_flag([self.loss], nan_only=False)
            if self._outputs_bad is None:
                self._outputs_bad = tf.constant(False)
        self._book = book
        return book

    def _site_fetches(self, site: OpSite) -> dict | None:
        key = site.key
        if key in self._site_cache:
            return self._site_cache[key]
        call = self._instrument().find(key)
        return self._site_fetches_for(call) if call is not None else None

    def _site_fetches_for(self, call: Call) -> dict | None:
        key = (call.spec.name, call.location, call.occurrence)
        if key not in self._site_cache:
            fetches = None
            with self.graph.as_default(), tf.compat.v1.name_scope("cdeepfuzz/site/"):
                inputs, seen = self._differentiable_inputs(call)
                margin = call.spec.margins(inputs, XP) if inputs is not None else None
                if margin is not None:
                    fetches = self._margin_fetches(call, tf.convert_to_tensor(margin), seen)
            self._site_cache[key] = fetches
        return self._site_cache[key]

    def _differentiable_inputs(self, call: Call):
        """The call's inputs, as tensors ``tf.gradients`` can go through.

        A session cannot run a control-flow op (If, While) rewritten after it first ran it,
        and differentiating through one rewrites it (to output its intermediates). When
        the path from the feeds to a site crosses one, the site is measured on a fresh copy
        of the forward graph (reading the same variables, fed by the same placeholders).
        """
        gop = call.origin
        if gop is None:
            return call.inputs, call.seen
        anchor = gop.path[0][0] if gop.path else gop.op
        if not self._crosses_control_flow(anchor):
            return call.inputs, call.seen
        prefix = self._new_view()
        copy = self.graph.get_operation_by_name(f"{prefix}/{anchor.name}")
        if not gop.path:
            return [_static(t) for t in copy.inputs], True
        copied = self._copy_of(gop, anchor=copy)
        if copied is None:
            return None, False
        inputs, _, seen = copied
        return [_static(t) for t in inputs], True if seen is None else seen

    def _crosses_control_flow(self, op) -> bool:
        seen, stack = set(), [t.op for t in op.inputs]
        while stack:
            o = stack.pop()
            if o in seen:
                continue
            seen.add(o)
            if o.type in IF_TYPES + WHILE_TYPES + CALL_TYPES + ("Case", "StatelessCase"):
                return True
            stack.extend(t.op for t in o.inputs)
        return False

    def _new_view(self) -> str:
        """Import a copy of the forward graph (sources mapped to the program's own placeholders
        and variables); returns its name prefix."""
        from tensorflow.core.framework import graph_pb2

        ops = _ancestors([self.loss.op])     # all of them: a While may read gradient accumulators
        keep = {op.name for op in ops}
        full = self.graph.as_graph_def()
        sub = graph_pb2.GraphDef()
        sub.versions.CopyFrom(full.versions)
        sub.library.CopyFrom(full.library)
        sub.node.extend(n for n in full.node if n.name in keep)
        input_map = {t.name: t for op in ops if op.type in _SOURCES for t in op.outputs}
        prefix = f"cdeepfuzz/view{self._copy_count}"
        self._copy_count += 1
        tf.graph_util.import_graph_def(sub, input_map=input_map, name=prefix + "/")
        return prefix

    def _margin_fetches(self, call: Call, m, seen) -> dict:
        if m.dtype in (tf.float16, tf.bfloat16):
            m = tf.cast(m, tf.float32)
        flat = tf.reshape(m, [-1])
        hard = tf.reduce_min(flat)
        tiny = tiny_of(m.dtype)
        log_loss = (-LOG_TAU * tf.reduce_logsumexp(-tf.math.log(tf.maximum(flat, tf.constant(tiny, m.dtype)))
                                                   / LOG_TAU) - log_floor(tiny))
        out = {"hard": tf.cast(hard, tf.float64), "log_loss": tf.cast(log_loss, tf.float64),
               "seen": tf.convert_to_tensor(seen)}
        if m.shape.rank is not None and m.shape.rank >= 1:
            out["rows"] = tf.cast(tf.reduce_min(tf.reshape(m, tf.stack([tf.shape(m)[0], -1])), axis=1), tf.float64)
        names, targets = self._leaf_targets()
        others = [v for v in self._trainable if not any(v is t for t in targets)]
        grads = tf.gradients(hard, targets + others) if targets else []
        out["requires_grad"] = any(g is not None for g in grads)
        out["grads"] = [None if g is None else tf.convert_to_tensor(g) for g in grads[: len(targets)]]
        if call.spec.log_space and targets:
            out["log_grads"] = [None if g is None else tf.convert_to_tensor(g)
                                for g in tf.gradients(log_loss, targets)]
        return out

    def _leaf_targets(self) -> tuple[list[str], list]:
        names = [n for n in self.searched if n in self.feeds]
        targets = [self.feeds[n] for n in names]
        if self.options.search_weights:
            for n, v in self._params.items():
                names.append(WEIGHT_PREFIX + n)
                targets.append(v)
        return names, targets

    # -- running ------------------------------------------------------------------------
    def discover(self, batch: dict[str, np.ndarray], seed: int) -> list[OpSite]:
        book = self._instrument()
        seed_everything(seed)
        self.session.run(self.loss, feed_dict=self._feed(batch))   # the program runs as given
        sites, seen = [], set()
        for call in book.calls:
            key = (call.spec.name, call.location, call.occurrence)
            if key in seen:
                continue
            if call.spec.searched and self._site_fetches_for(call) is None:
                continue          # no hazard in this call (x ** 2, x / 2.0)
            seen.add(key)
            sites.append(make_site(self.name, call.spec.name, call.kind, call.spec.hazard, call.location,
                                   call.occurrence, call.spec.searched))
        return sites

    def check(self, values: dict[str, np.ndarray], seed: int) -> CheckResult:
        book = self._instrument()
        seed_everything(seed)
        loss, flags, out_bad = self.session.run([self.loss, self._flags, self._outputs_bad],
                                                feed_dict=self._feed(values))
        flags = [bool(f) for f in flags] + [bool(out_bad)]
        first = book.first_event(flags, flags[-1], traceback_location(self.loss.op))
        triggered = {(c.spec.name, c.location, c.occurrence): book.triggered(flags, c)
                     for c in book.calls if c.spec.searched}
        return CheckResult(first is not None, first, triggered, _scalar(loss))

    def evaluate(self, values: dict[str, np.ndarray], site: OpSite, *, grad: bool = True,
                 train: bool = False, seed: int = 0) -> Evaluation:
        train = train and self.trains
        book = self._instrument()
        site_fetches = self._site_fetches(site)
        seed_everything(seed)
        feed = self._feed(values)
        fetches: dict[str, Any] = {"loss": self.loss, "flags": self._flags, "out_bad": self._outputs_bad}
        if site_fetches is not None:
            fetches["site"] = {k: v for k, v in site_fetches.items()
                               if k not in ("grads", "log_grads", "requires_grad")}
            names, targets = self._leaf_targets()
            want_grads = grad and site_fetches["requires_grad"] and bool(targets)
            if want_grads:
                fetches["grads"] = [g for g in site_fetches["grads"] if g is not None]
                if "log_grads" in site_fetches:
                    fetches["log_grads"] = [g for g in site_fetches["log_grads"] if g is not None]
        res = self.session.run(fetches, feed_dict=feed)
        flags = [bool(f) for f in res["flags"]] + [bool(res["out_bad"])]
        first = book.first_event(flags, flags[-1], site.location)
        call = book.find(site.key)
        seen = site_fetches is not None and bool(res["site"]["seen"])
        ev = Evaluation(seen=seen, hard=math.inf, log_loss=math.inf,
                        triggered=call is not None and book.triggered(flags, call),
                        event=first is not None, first_op=first, program_loss=_scalar(res["loss"]))
        if seen:
            s = res["site"]
            ev.hard, ev.log_loss = float(s["hard"]), float(s["log_loss"])
            n = _batch_size(values)
            if "rows" in s and len(s["rows"]) == n and n > 1:
                ev.per_sample = np.asarray(s["rows"], dtype=np.float64)
            if "grads" in res and not ev.triggered:
                ev.grads, ev.grad_norm, ev.connected = _collect(names, targets, _fill(site_fetches["grads"],
                                                                                       res["grads"]))
                if "log_grads" in res and math.isfinite(ev.log_loss):
                    ev.log_grads, _, _ = _collect(names, targets, _fill(site_fetches["log_grads"], res["log_grads"]))
        if train and not ev.event:
            self.session.run(self.target.train_op, feed_dict=feed)
            ev.passes += 1
            ev.trained = True
            if self.options.search_weights:
                ev.weights = self.weights()
        return ev


def _ancestors(ops: list) -> list:
    seen: set = set()
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return list(seen)


def _fill(symbolic: list, values: list) -> list:
    """Put fetched values back in the places of the non-None symbolic gradients."""
    it = iter(values)
    return [None if g is None else next(it) for g in symbolic]


def _static(t):
    """A scalar constant input as a Python number (as torch's Scalar overloads): no hazard search on it."""
    if tf.is_tensor(t) and getattr(t, "op", None) is not None and t.op.type == "Const" and t.shape.rank == 0:
        value = tf.get_static_value(t)
        if value is not None and np.issubdtype(np.asarray(value).dtype, np.number):
            return value.item()
    return t


def make_runner(name: str, target: Any, options: RunnerOptions):
    if isinstance(target, GraphTarget):
        return GraphRunner(name, target, options)
    return EagerRunner(name, target, options)


__all__ = ["EagerRunner", "GraphRunner", "XP", "make_runner", "seed_everything"]
