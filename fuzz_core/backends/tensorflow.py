"""TensorFlow backend: TF2 programs (eager, ``tf.function``, Keras) and TF1-style graph programs.

The backend module: :func:`make_runner` builds the runner of a Target. With ``tf_common``
(what both runners share), ``tf_graph`` and ``tf_recorder``, the only modules of fuzz_core
that import TensorFlow; loaded lazily by :func:`fuzz_core.backends.load_backend`.

* :class:`EagerRunner` runs a :class:`~fuzz_core.Target` whose ``program`` uses TF ops.
  Each pass runs the program eagerly under an op callback (``tf.function`` bodies
  included: ``run_functions_eagerly`` is on for the pass, so ``tf.cond`` branches,
  ``tf.while_loop`` bodies and autograph ``if``/``for`` run op by op and are seen),
  inside a persistent ``GradientTape``; suspect losses are built from the recorded
  inputs and differentiated with the tape (never with the program's own gradients).
  With an ``optimizer`` the program's training step (``tape.gradient`` of the mean
  loss, ``optimizer.apply_gradients``) runs on the same, searched batch.
* :class:`~fuzz_core.backends.tf_graph.GraphRunner` (module ``tf_graph``) runs a
  :class:`~fuzz_core.GraphTarget` (TF1-style graph and session).

Both snapshot and restore every variable (Keras 3 seed-generator states and optimizer
slots included). The semantics of every Runner method mirror the torch backend.
"""
from __future__ import annotations

import contextlib
import math
import re
import zlib
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_callbacks

from fuzz_core.backends.base import (
    WEIGHT_PREFIX, CheckResult, Evaluation, OpRef, RunnerOptions, TargetBatches, batch_size,
)
from fuzz_core.backends.tf_common import (
    Fp32Twin, _collect, _scalar, _shaped, _soft_min, _unique, _var_name, _versions, _warn_unknown, alignment,
    followed_margin, keras_policy, seed_everything,
)
from fuzz_core.backends.tf_graph import GraphRunner
from fuzz_core.backends.tf_recorder import XP, EagerRecorder, call_margins, np_dtype
from fuzz_core.catalogue import DEFAULT_CATALOGUE, Catalogue
from fuzz_core.sites import OpSite, relative_path
from fuzz_core.target import GraphTarget, Target, TargetError

_SEED_STATE = "seed_generator_state"


def _train_seed(program_loss: float) -> int:
    return zlib.crc32(f"train:{program_loss!r}".encode()) & 0x7FFFFFFF


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


def program_loss(out: Any):
    """The loss of a program's return value: a tensor, the first of a tuple, or out["loss"]."""
    if tf.is_tensor(out):
        return out
    if isinstance(out, dict):
        return out.get("loss") if tf.is_tensor(out.get("loss")) else None
    if isinstance(out, (tuple, list)) and out and tf.is_tensor(out[0]):
        return out[0]
    return None


def _device_name(device: str) -> str | None:
    if device in ("cpu", "CPU"):
        return "/CPU:0"
    if device.startswith("cuda"):
        index = device.split(":", 1)[1] if ":" in device else "0"
        return f"/GPU:{index}"
    if device == "auto":
        return None
    return device


def _tf_var(v):
    """The tf.Variable behind a Keras 3 variable (what a GradientTape differentiates against)."""
    if isinstance(v, tf.Variable):
        return v
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, tf.Variable) else v


# ---- mixed precision: the Keras global policy around the factory ------------------------

def prepare(options: RunnerOptions):
    """The context :func:`fuzz_core.engine.build_runner` runs the factory in: the campaign's
    Keras mixed-precision policy (``precision.policy``) while the factory builds the target,
    restored after it."""
    return keras_policy(options.precision.policy)


class EagerRunner(Fp32Twin, TargetBatches):
    """One built TF2 target, ready to run steps for any of its sites."""

    framework = "tensorflow"

    def __init__(self, name: str, target: Target, options: RunnerOptions = RunnerOptions(),
                 catalogue: Catalogue = DEFAULT_CATALOGUE) -> None:
        super().__init__(name, target, options, catalogue, Target)
        if not tf.executing_eagerly():
            raise TargetError("a TF2 Target needs eager execution (is TF1 behaviour enabled? use GraphTarget)")
        self.device = options.device
        self._device = _device_name(options.device)
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

    def versions(self) -> dict[str, str]:
        return _versions()

    # -- batches ------------------------------------------------------------------------
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

    def _forward(self, batch: dict, seed: int, locate_all: bool, track_constants: bool = False,
                 measure: bool = False):
        self._seed(seed)
        recorder = EagerRecorder(self.catalogue, locate_all=locate_all, backward=self.trains, measure=measure)
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
        return recorder.sites(self.name, lambda call: call_margins(call, scalars=True) is not None)

    def measure(self, values: dict[str, np.ndarray], seed: int, key: tuple[str, str, int],
                any_dtype: bool = False) -> dict | None:
        """The output of the op of an output-range site (``half_overflow``) on these values: its
        dtype, largest magnitude and the dtype's largest finite value, as built (its layers' own
        dtypes). ``any_dtype``: record the row's ops whatever their output dtype (the float32
        value, on the float32 twin, of an op that overflowed in half)."""
        with self._scope():
            batch, _ = self._tensors(values, grad=False)
            recorder, _ = self._forward(batch, seed, locate_all=True, measure=any_dtype)
        call = recorder.find(key)
        if call is None or not call.outputs or not tf.is_tensor(call.outputs[0]):
            return None
        out = call.outputs[0]
        a = np.abs(np.asarray(out.numpy(), dtype=np.float64))
        return {"dtype": out.dtype.name, "value": float(a.max()) if a.size else 0.0, "limit": float(out.dtype.max)}

    def _program_location(self) -> str:
        code = getattr(self.target.program, "__code__", None)
        if code is None:
            code = getattr(getattr(self.target.program, "python_function", None), "__code__", None)
        if code is None:
            return "<program>:0"
        return f"{relative_path(code.co_filename)}:{code.co_firstlineno}"

    def check(self, values: dict[str, np.ndarray], seed: int) -> CheckResult:
        """The check-only detector: run the unmodified program's whole step once (its training step
        too, when it trains), name the first bad op."""
        ev, recorder, flags = self._step(values, None, grad=False, train=self.trains, seed=seed, locate_all=True)
        triggered = recorder.triggered_sites(flags)
        triggered.update(getattr(recorder, "extra_triggered", {}))
        return CheckResult(ev.event, ev.first_op, triggered, ev.program_loss, ev.phase)

    def evaluate(self, values: dict[str, np.ndarray], site: OpSite, *, grad: bool = True,
                 train: bool = False, seed: int = 0, lookahead: bool = False) -> Evaluation:
        """One step: forward under the recorder; the site's margin, losses and gradients; then the
        program's own training step, watched. Any non-finite value sets ``event`` and ``phase``.
        ``lookahead``: also ``Evaluation.train_grads`` (a program trained by its optimizer on its loss)."""
        return self._step(values, site, grad=grad, train=train and self.trains, seed=seed, locate_all=False,
                          lookahead=lookahead)[0]

    def _step(self, values: dict[str, np.ndarray], site: OpSite | None, *, grad: bool, train: bool, seed: int,
              locate_all: bool, lookahead: bool = False) -> tuple[Evaluation, EagerRecorder, list]:
        own_step = train and self.target.train_step is None and self.target.optimizer is not None
        # the lookahead differentiates the training gradient itself: an outer tape records the forward
        # pass and the inner tape's gradient of the loss (see :meth:`_alignment`)
        outer = tf.GradientTape(persistent=True) if (lookahead and grad and own_step) else None
        aligned = None
        with self._scope():
            batch, leaves = self._tensors(values, grad=grad)
            inputs = {n: t for n, t in leaves.items() if not n.startswith(WEIGHT_PREFIX)}
            tape = tf.GradientTape(persistent=True) if (grad or own_step) else None
            with outer if outer is not None else contextlib.nullcontext():
                if outer is not None:
                    for t in inputs.values():
                        outer.watch(t)
                with tape if tape is not None else contextlib.nullcontext():
                    if tape is not None:
                        for t in inputs.values():
                            tape.watch(t)          # variables are watched as they are read
                    recorder, out = self._forward(batch, seed, locate_all=locate_all)
                    loss = program_loss(out)
                    call = recorder.find(site.key) if site is not None else None
                    margin = call_margins(call) if call is not None else None
                    flags = recorder.resolve([_outputs_nonfinite(out)])
                    first = recorder.first_event(flags, flags[-1], self._program_location())
                    ev = Evaluation(seen=margin is not None, hard=math.inf, log_loss=math.inf,
                                    triggered=call is not None and recorder.triggered(flags, call),
                                    event=first is not None, first_op=first, program_loss=_scalar(loss))
                    if first is not None:
                        ev.origins = recorder.origins(flags, flags[-1], self._program_location())
                    scored = self._stats(ev, margin, batch_size(values)) if margin is not None else None
                    mean_loss = tf.reduce_mean(loss) if own_step and not ev.event and loss is not None else None
                    followed = None
                    if outer is not None and scored is not None and mean_loss is not None:
                        followed = followed_margin(scored[0], call.spec.log_space)
                if followed is not None:
                    aligned = self._alignment(tape, followed, mean_loss)
            if scored is not None and grad and not ev.triggered and tape is not None:   # see the torch backend
                hard, log_loss = scored
                self._grads(ev, tape, hard, log_loss, call.spec.log_space, leaves)
            if aligned is not None and inputs and ev.grads is not None:
                names = list(inputs)
                # of the alignment as recorded (a negation out here would be an op the tape never saw)
                grads = [None if g is None else -tf.convert_to_tensor(g)
                         for g in outer.gradient(aligned, [inputs[n] for n in names])]
                ev.train_grads, _, connected = _collect(names, [tuple(inputs[n].shape) for n in names], grads)
                if not connected:
                    ev.train_grads = None
            if ev.event:
                ev.phase = "forward"
            elif train and loss is not None:
                pre = self.get_state()
                ev.phase = self._train(batch, tape, mean_loss, ev)
                if ev.phase is not None:
                    ev.event, ev.state_before = True, pre
                    ev.first_op, grad_key = self._diagnose(pre, values, seed, ev.phase)
                    if site is not None:
                        ev.triggered = grad_key == site.key
                    elif grad_key is not None:               # a replay: the check's triggered sites
                        recorder.extra_triggered = {grad_key: True}
            del tape
        return ev, recorder, flags

    def _diagnose(self, pre: dict[str, np.ndarray], values: dict[str, np.ndarray], seed: int,
                  phase: str) -> tuple[OpRef, tuple | None]:
        """A bad training step, re-run from the state it started from under one persistent tape:
        the gradient of the loss with respect to every catalogued call's output and input, in one
        backward pass. The last call in execution order (the first the backward reaches) whose
        output gradient is finite and input gradient is not is where the backward went non-finite."""
        what = "train_step" if self.target.train_step is not None else type(self.target.optimizer).__name__
        fallback = OpRef(phase, "gradient of the loss" if phase == "backward" else f"{what} update",
                         self._program_location(), 0)
        if phase != "backward":
            return fallback, None
        self.set_state(pre)
        with self._scope():
            batch, _ = self._tensors(values, grad=False)
            with tf.GradientTape(persistent=True) as tape:
                recorder, out = self._forward(batch, seed, locate_all=True)
                loss = program_loss(out)
                mean = tf.reduce_mean(loss) if loss is not None else None
            calls = [c for c in recorder.calls if c.outputs and c.inputs and tf.is_tensor(c.inputs[c.spec.arg
                     if c.spec.arg < len(c.inputs) else 0]) and c.spec.phase == "forward"]
            if mean is None or not calls:
                return fallback, None
            targets = []
            for c in calls:
                targets += [c.outputs[0], c.inputs[c.spec.arg if c.spec.arg < len(c.inputs) else 0]]
            grads = tape.gradient(mean, targets, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            del tape
        for i in reversed(range(len(calls))):
            g_out, g_in = grads[2 * i], grads[2 * i + 1]
            if g_out is None or g_in is None:
                continue
            if np.isfinite(_to_numpy_grad_raw(g_out)).all() and not np.isfinite(_to_numpy_grad_raw(g_in)).all():
                c = calls[i]
                grad = next((g for g in recorder.calls if g.spec.phase == "backward" and g.location == c.location
                             and g.kind == c.kind and g.occurrence == c.occurrence), None)
                return (OpRef(c.spec.name, f"{c.kind} (backward)", c.location, c.occurrence),
                        grad.key if grad is not None else None)
        return fallback, None

    def _state_nonfinite(self) -> bool:
        """Some floating-point variable of the model or the optimizer is not finite."""
        for table in (self._model_vars, self._opt_vars):
            for v in table.values():
                if tf.as_dtype(v.dtype).is_floating and not bool(np.isfinite(np.asarray(v.numpy(), np.float64)).all()):
                    return True
        return False

    def _stats(self, ev: Evaluation, margin, batch_size: int):
        m, hard, log_loss = _soft_min(tf.convert_to_tensor(margin))
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
            ev.movable = False   # no path from any value that could carry a gradient (torch: not requires_grad)
            return
        shapes = [tuple(t.shape) for t in targets]
        ev.grads, ev.grad_norm, ev.connected = _collect(names, shapes, grads)
        if log_space and math.isfinite(ev.log_loss):
            ev.log_grads, _, _ = _collect(names, shapes, tape.gradient(log_loss, targets))

    def _alignment(self, tape, margin, mean_loss):
        """``<dL/dtheta, dm/dtheta>`` over the trainable variables, ``dm/dtheta`` held fixed (see
        :meth:`fuzz_core.backends.torch.TorchRunner._lookahead`); called where an outer tape records it,
        so that its gradient with respect to the inputs is the lookahead. None when no variable reaches
        both."""
        params = [_tf_var(v) for v in self._trainable]
        toward = tape.gradient(margin, params)
        pairs = [(p, tf.stop_gradient(g)) for p, g in zip(params, toward) if g is not None]
        if not pairs:
            return None
        return alignment(tape.gradient(mean_loss, [p for p, _ in pairs]), [v for _, v in pairs])

    def _depends_on_params(self, tape, hard, targets: list) -> bool:
        others = [_tf_var(v) for v in self._trainable]
        others = [v for v in others if not any(v is t for t in targets)]
        return bool(others) and any(g is not None for g in tape.gradient(hard, others))

    def _train(self, batch: dict, tape, mean_loss, ev: Evaluation) -> str | None:
        """The program's own training step on the searched batch (GRIST keeps training), watched:
        None, or the phase that went non-finite (backward: a gradient; update: a variable)."""
        target = self.target
        if target.train_step is not None:
            seed_everything(_train_seed(ev.program_loss), kernels=self._stateful_random)
            target.train_step({k: tf.stop_gradient(v) for k, v in batch.items()})
            ev.passes += 1
        elif target.optimizer is not None and tape is not None and mean_loss is not None:
            grads = tape.gradient(mean_loss, [_tf_var(v) for v in self._trainable])
            pairs = [(g, v) for g, v in zip(grads, self._trainable) if g is not None]
            if not pairs:
                return None
            if not all(bool(np.isfinite(_to_numpy_grad_raw(g)).all()) for g, _ in pairs):
                ev.trained = True
                return "backward"
            target.optimizer.apply_gradients(pairs)
        else:
            return None
        ev.trained = True
        if self._state_nonfinite():
            return "update"
        if self.options.search_weights:
            ev.weights = self.weights()
        return None


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


def _to_numpy_grad_raw(g) -> np.ndarray:
    """A gradient as NumPy, non-finite entries kept (``_to_numpy_grad`` zeroes them)."""
    if isinstance(g, tf.IndexedSlices):
        g = tf.convert_to_tensor(g)
    return np.asarray(g.numpy() if tf.is_tensor(g) else g, dtype=np.float64)


def _outputs_nonfinite(out: Any) -> bool:
    for t in tf.nest.flatten(out, expand_composites=True):
        if tf.is_tensor(t) and t.dtype.is_floating:
            if not bool(np.isfinite(np.asarray(t.numpy(), dtype=np.float64)).all()):
                return True
    return False


def make_runner(name: str, target: Any, options: RunnerOptions):
    if isinstance(target, GraphTarget):
        return GraphRunner(name, target, options)
    return EagerRunner(name, target, options)


__all__ = ["EagerRunner", "GraphRunner", "XP", "keras_policy", "make_runner", "prepare", "seed_everything"]
