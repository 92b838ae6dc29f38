"""The TensorFlow recorders: an eager op callback (TF2) and a graph walk (TF1-style graphs).

TF2: :class:`EagerRecorder` is registered with ``op_callbacks.add_op_callback`` (the
mechanism behind ``tf.debugging.enable_check_numerics``) while the program runs eagerly
(``tf.function`` bodies too: the runner turns on ``run_functions_eagerly``, so the ops of a
``tf.cond`` branch, a ``tf.while_loop`` body or an autograph ``if`` execute, and are seen,
one by one). The input tensors it records stay differentiable under the runner's
``GradientTape``, so suspect losses are built from them after the program returns, as the
torch backend does. The user's ``path:line`` comes from the Python stack.

TF1: :class:`GraphWalk` keeps the forward ancestors of ``loss`` (never ``gradients/…`` or
optimizer ops), recursing into the branch graphs of ``If`` and the body of ``While`` ops;
ops found there are evaluated through a copy of their branch imported into the outer graph
and fed from the control-flow op's real inputs (a ``While`` body: its first iteration).
Locations come from each op's creation traceback.

Every op output is checked for non-finite values with the same rules as the torch
recorder: NaN anywhere, any non-finite output of a catalogued hazard op whose inputs were
finite, and non-finite program outputs. On the CPU the checks read the tensors' buffers
directly (no device sync to avoid); elsewhere they stay on the device until one resolve.
"""
from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context as tf_context
from tensorflow.python.eager import record

from fuzz_core.backends.base import bisect_last
from fuzz_core.backends.flags import ALWAYS_OK, NOT_SEARCHED, FlagBook
from fuzz_core.backends.flags import Call as BaseCall
from fuzz_core.catalogue import Catalogue
from fuzz_core.sites import CallerLocator, relative_path


def _skip_dirs() -> tuple[str, ...]:
    dirs = [os.path.dirname(tf.__file__)]
    for name in ("keras", "tf_keras", "tensorflow_probability", "optree", "wrapt"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(str(loc))
    return tuple(os.path.realpath(d) for d in dirs) + tuple(dirs)


SKIP_DIRS = _skip_dirs()
LOCATOR = CallerLocator(SKIP_DIRS)

# Ops whose non-finite output is a pure copy (or that read/write state): never an origin.
PASS_THROUGH = {"Identity", "IdentityN", "ReadVariableOp", "Const", "Placeholder", "PlaceholderWithDefault",
                "VarHandleOp", "VariableV2", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                "Assign", "NoOp", "Snapshot", "StopGradient", "Enter", "Exit", "Merge", "Switch",
                "NextIteration", "_Recv", "_Send", "OptionalFromValue", "OptionalGetValue", "OptionalNone",
                "TensorListPushBack", "TensorListPopBack", "TensorListFromTensor", "TensorListStack",
                "TensorListReserve", "TensorListSetItem", "TensorListGetItem"}
# Random ops whose kernels keep their state between eager calls (the global seed resets them).
STATEFUL_RANDOM = {"RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal", "RandomShuffle",
                   "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "ParameterizedTruncatedNormal",
                   "RandomGammaGrad", "RandomCrop"}
IF_TYPES = ("If", "StatelessIf")
WHILE_TYPES = ("While", "StatelessWhile")
CALL_TYPES = ("PartitionedCall", "StatefulPartitionedCall")



# ---- numbers of a dtype ------------------------------------------------------------

def np_dtype(dtype: Any) -> np.dtype:
    return np.dtype(tf.as_dtype(dtype).as_numpy_dtype)


@lru_cache(maxsize=None)
def _nextafter(value: float, toward: float, dtype_name: str) -> float:
    dt = np_dtype(dtype_name)
    v = np.asarray(value, dtype=dt)
    if dt.itemsize == 2 and dt != np.float16:          # bfloat16: step the bit pattern
        if value == toward or math.isnan(value):
            return float(v)
        bits = int(v.view(np.uint16))
        if float(v) == 0.0:
            out = np.uint16(1 if toward > 0 else 0x8001)
        elif (float(v) < toward) == (float(v) > 0):
            out = np.uint16(bits + 1)
        else:
            out = np.uint16(bits - 1)
        return float(np.asarray(out).view(dt))
    return float(np.nextafter(v, np.asarray(toward, dtype=dt)))


def nextafter(value: float, toward: float, dtype: Any) -> float:
    return _nextafter(float(value), float(toward), tf.as_dtype(dtype).name)


def _eager_value(fn, value: float, dtype_name: str) -> float:
    with tf_context.eager_mode(), tf.device("/CPU:0"):
        return float(fn(tf.constant(value, dtype=tf.as_dtype(dtype_name))).numpy())


def _bisect(pred, lo: float, hi: float, dtype_name: str) -> float:
    dt = np_dtype(dtype_name)
    return bisect_last(pred, lo, hi, lambda v: float(np.asarray(v, dtype=dt)),
                       lambda a, b: nextafter(a, b, dtype_name))


@lru_cache(maxsize=None)
def _dtype_limit(name: str, dtype_name: str) -> float:
    if name == "exp_max":
        return _bisect(lambda v: math.isfinite(_eager_value(tf.exp, v, dtype_name)), 0.0, 1000.0, dtype_name)
    if name == "expm1_max":
        return _bisect(lambda v: math.isfinite(_eager_value(tf.math.expm1, v, dtype_name)), 0.0, 1000.0,
                       dtype_name)
    if name == "rsqrt_grad_min":   # largest x > 0 where rsqrt's gradient -x**-1.5 / 2 overflows
        return _bisect(lambda v: not math.isfinite(_eager_value(lambda t: 0.5 * tf.math.rsqrt(t) ** 3, v,
                                                                dtype_name)), tiny_of(dtype_name), 1.0, dtype_name)
    if name == "reciprocal_grad_max":   # largest x > 0 where reciprocal's gradient -(1/x)**2 overflows
        return _bisect(lambda v: not math.isfinite(_eager_value(lambda t: tf.math.reciprocal(t) * tf.math.reciprocal(t),
                                                                v, dtype_name)), tiny_of(dtype_name), 1.0, dtype_name)
    if name == "digamma_radius":   # largest x > 0 where digamma(x) = -inf (-1/x overflows)
        lo = tiny_of(dtype_name)
        if math.isfinite(_eager_value(tf.math.digamma, lo, dtype_name)):
            return 0.0
        return _bisect(lambda v: not math.isfinite(_eager_value(tf.math.digamma, v, dtype_name)), lo, 1.0,
                       dtype_name)
    raise KeyError(f"unknown limit {name!r}")


def dtype_limit(name: str, dtype: Any) -> float:
    """Dtype-dependent domain ends, found by bisection on TF's own ops."""
    return _dtype_limit(name, tf.as_dtype(dtype).name)


@lru_cache(maxsize=None)
def _tiny_of(dtype_name: str) -> float:
    sub = nextafter(0.0, 1.0, dtype_name)
    kept = _eager_value(lambda t: tf.maximum(t, tf.zeros_like(t)), sub, dtype_name)
    if kept > 0:
        return sub
    try:                                       # TF's CPU kernels flush subnormals: the smallest normal
        return float(np.finfo(np_dtype(dtype_name)).tiny)
    except ValueError:
        import ml_dtypes

        return float(ml_dtypes.finfo(np_dtype(dtype_name)).tiny)


def kept_nextafter(value: float, toward: float, dtype: Any) -> float:
    """``nextafter`` in the dtype, skipping the subnormals TF's kernels flush to zero (the
    first float beyond a closed end that TF can hold: ``sqrt(0)`` keeps a margin > 0)."""
    out = nextafter(value, toward, dtype)
    tiny = tiny_of(dtype)
    if out != 0.0 and abs(out) < tiny:
        return math.copysign(tiny, out)
    return out


def tiny_of(dtype: Any) -> float:
    """The smallest positive value TF's CPU kernels keep (they flush subnormals to zero)."""
    return _tiny_of(tf.as_dtype(dtype).name)


class TFXP:
    """The array namespace that catalogue margins use, for TF tensors (eager or graph)."""

    is_tensor = staticmethod(lambda x: tf.is_tensor(x))
    abs = staticmethod(tf.abs)
    minimum = staticmethod(tf.minimum)
    maximum = staticmethod(tf.maximum)
    where = staticmethod(tf.where)
    round = staticmethod(tf.round)
    log = staticmethod(tf.math.log)

    @staticmethod
    def widen(x: Any) -> Any:
        """float16/bfloat16 to float32 (differentiably); wider tensors as they are."""
        return tf.cast(x, tf.float32) if x.dtype in (tf.float16, tf.bfloat16) else x

    @staticmethod
    def full_like(x: Any, value: float) -> Any:
        return tf.fill(tf.shape(x), tf.constant(value, dtype=x.dtype))

    @staticmethod
    def as_float(x: Any, like: Any) -> Any:
        if tf.is_tensor(x):
            if x.dtype.is_floating:
                return x
            dtype = like.dtype if tf.is_tensor(like) and like.dtype.is_floating else tf.float32
            return tf.cast(x, dtype)
        return tf.constant(float(x), dtype=like.dtype)

    @staticmethod
    def next_down(value: float, like: Any) -> float:
        return kept_nextafter(float(value), -math.inf, like.dtype)

    @staticmethod
    def next_up(value: float, like: Any) -> float:
        return kept_nextafter(float(value), math.inf, like.dtype)

    @staticmethod
    def limit(name: str, like: Any) -> float:
        return dtype_limit(name, like.dtype)

    @staticmethod
    def big(like: Any) -> float:
        return float(tf.as_dtype(like.dtype).max) / 4


XP = TFXP()


# ---- non-finite flags ------------------------------------------------------------------

def _floats(tensors) -> list:
    out = []
    for t in tensors:
        if tf.is_tensor(t) and t.dtype.is_floating:
            out.append(t)
    return out


def _on_cpu(t) -> bool:
    try:
        return "CPU" in t.device
    except Exception:  # noqa: BLE001 - a tensor with no device yet
        return True


def eager_flag(tensors, *, nan_only: bool, negate: bool = False):
    """``any(isnan)`` (nan_only) or ``any(!isfinite)`` over eager tensors, or ``all(isfinite)``
    with ``negate``. A Python bool for CPU tensors; a device tensor (resolved later) elsewhere.
    None when there is no floating-point tensor."""
    ts = _floats(tensors)
    if not ts:
        return None
    if all(_on_cpu(t) for t in ts):
        bad = False
        for t in ts:
            a = t.numpy()
            if nan_only:
                bad = bad or bool(np.isnan(a).any())
            else:
                bad = bad or not bool(np.isfinite(a).all())
            if bad:
                break
        return (not bad) if negate else bad
    flags = [tf.reduce_any(tf.math.is_nan(t) if nan_only else tf.logical_not(tf.math.is_finite(t))) for t in ts]
    flag = tf.reduce_any(tf.stack(flags))
    return tf.logical_not(flag) if negate else flag


def graph_flag(tensors, *, nan_only: bool, negate: bool = False):
    """The same, as a graph op (a scalar bool tensor), or None."""
    ts = _floats(tensors)
    if not ts:
        return None
    parts = []
    for t in ts:
        x = tf.cast(t, tf.float32) if t.dtype in (tf.float16, tf.bfloat16) else t
        parts.append(tf.reduce_any(tf.math.is_nan(x)) if nan_only
                     else tf.logical_not(tf.reduce_all(tf.math.is_finite(x))))
    flag = parts[0] if len(parts) == 1 else tf.reduce_any(tf.stack(parts))
    return tf.logical_not(flag) if negate else flag


# ---- the eager recorder --------------------------------------------------------------

@dataclass
class Call(BaseCall):
    """A recorded call, with what the TensorFlow runners add (branch, outputs, constant scalars)."""

    seen: Any = True   # graph sites in a branch: a bool tensor (the branch ran)
    outputs: list = field(default_factory=list)
    constants: dict = field(default_factory=dict)   # input position -> Python number (a constant scalar)
    origin: Any = None   # graph programs: the GraphOp the call was found at

    def scalar_inputs(self) -> list:
        """The inputs with constant scalars as Python numbers, as torch's Scalar overloads see them."""
        return [self.constants.get(i, t) for i, t in enumerate(self.inputs)]


# ---- half-precision outputs (a Keras mixed-precision policy, or half code by hand) -----

HALF_DTYPES = (tf.float16, tf.bfloat16)


def half_output(outputs) -> bool:
    """The op's (first) output is float16 or bfloat16. Ops that a policy keeps in float32
    (softmax or loss layers built with ``dtype="float32"``) are judged by their float32 rows."""
    return bool(outputs) and tf.is_tensor(outputs[0]) and outputs[0].dtype in HALF_DTYPES


def call_margins(call, scalars: bool = False):
    """The elementwise margin of a recorded call, or None when it has no hazard: of its output
    for an output-range row (``half_overflow``), else the row's margin of its inputs
    (``scalars``: constant scalar inputs as Python numbers, as torch's Scalar overloads see them)."""
    if getattr(call.spec, "on_output", False):
        return call.spec.margins(call.outputs[:1], XP) if call.outputs else None
    return call.spec.margins(call.scalar_inputs() if scalars else call.inputs, XP)


def constant_scalars(inputs) -> dict:
    """Scalar inputs that no watched value (batch input, trainable variable) reaches."""
    out = {}
    for i, t in enumerate(inputs):
        if tf.is_tensor(t) and t.shape.num_elements() == 1 and not record.should_record_backprop([t]):
            try:
                out[i] = np.asarray(t.numpy()).reshape(()).item()
            except Exception:  # noqa: BLE001
                pass
    return out


class EagerRecorder(FlagBook):
    """Records every eagerly executed op of one forward pass (an op callback)."""

    def __init__(self, catalogue: Catalogue, locate_all: bool = False, backward: bool = False,
                 measure: bool = False) -> None:
        super().__init__()
        self.catalogue = catalogue
        self.locate_all = locate_all
        self.backward = backward   # the program trains: record the backward-hazard row of each op too
        self.counts: dict[tuple[str, str], int] = {}
        self.stateful_random = False
        self.track_constants = False   # note which scalar inputs no watched value reaches (discover)
        self.paused = 0          # > 0 inside a GradientTape.gradient call of the program
        self._busy = False
        # op type -> its output-range row (half_overflow); a catalogue without such rows: none
        self._output_row = getattr(catalogue, "for_tf_output", None) or (lambda op_type: None)
        self.measure = measure   # record output rows whatever the output's dtype (a float32 twin's value)

    def __call__(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if self._busy or self.paused or graph is not None:   # our checks; a backward; graph construction
            return None
        self._busy = True
        try:
            self._handle(op_type.decode() if isinstance(op_type, bytes) else str(op_type), inputs, outputs)
        finally:
            self._busy = False
        return None

    def _handle(self, op_type: str, inputs, outputs) -> None:
        if op_type in STATEFUL_RANDOM:
            self.stateful_random = True
        spec = self.catalogue.for_tf(op_type)
        outputs = list(outputs) if outputs is not None else []
        half = self._output_row(op_type)     # recorded only where the op's output is float16/bfloat16
        if half is not None and not (half_output(outputs) or (self.measure and _floats(outputs[:1]))):
            half = None
        if spec is not None and not _floats(outputs):
            spec = None            # integer arithmetic (seed counters, indices) cannot go non-finite
        if spec is None:
            if half is not None:
                self._record_half(half, op_type, LOCATOR.locate(3), list(inputs), outputs, None)
                return
            if op_type in PASS_THROUGH:
                return
            flag = eager_flag(outputs, nan_only=True)
            if flag is not None:
                loc = LOCATOR.locate(3) if self.locate_all else ""
                self.push(flag, (op_type, loc, -1))
            return
        location = LOCATOR.locate(3)
        key = (spec.name, location)
        occurrence = self.counts.get(key, 0)
        self.counts[key] = occurrence + 1
        inputs = list(inputs)
        in_ok = NOT_SEARCHED
        index = len(self.calls)
        if spec.searched:
            ok = eager_flag(inputs, nan_only=False, negate=True)
            in_ok = self.push(ok) if ok is not None else ALWAYS_OK
            bad = eager_flag(outputs, nan_only=False)
            flag = self.push(bad if bad is not None else False, (op_type, location, index))
        else:
            bad = eager_flag(outputs, nan_only=True)
            flag = self.push(bad, (op_type, location, index)) if bad is not None else -1
        call = Call(spec, op_type, location, occurrence, inputs, flag, in_ok, outputs=outputs)
        if self.track_constants and spec.searched:
            call.constants = constant_scalars(inputs)
        self.calls.append(call)
        grad_spec = self.catalogue.for_tf_backward(op_type) if self.backward else None
        if grad_spec is not None:     # the same call's backward hazard, searched on the same inputs
            gkey = (grad_spec.name, location)
            gocc = self.counts.get(gkey, 0)
            self.counts[gkey] = gocc + 1
            grad_call = Call(grad_spec, op_type, location, gocc, inputs, -1, in_ok, outputs=outputs)
            grad_call.constants = call.constants
            self.calls.append(grad_call)
        if half is not None:
            self._record_half(half, op_type, location, inputs, outputs, call)

    def _record_half(self, spec, op_type: str, location: str, inputs: list, outputs: list, main) -> None:
        """A call of an output-range row (``half_overflow``): a searched site whose margin is of
        the op's half-precision output. It shares the flags of the op's own searched row; else it
        checks the inputs' finiteness and the output for any non-finite value (an overflow is
        an inf, which the NaN-only check of an uncatalogued op would not see)."""
        key = (spec.name, location)
        occurrence = self.counts.get(key, 0)
        self.counts[key] = occurrence + 1
        index = len(self.calls)
        if main is not None and main.spec.searched:
            flag, in_ok = main.flag, main.in_ok
        else:
            ok = eager_flag(inputs, nan_only=False, negate=True)
            in_ok = self.push(ok) if ok is not None else ALWAYS_OK
            bad = eager_flag(outputs, nan_only=False)
            flag = self.push(bad if bad is not None else False, (op_type, location, index))
        self.calls.append(Call(spec, op_type, location, occurrence, inputs, flag, in_ok, outputs=outputs))

    def resolve(self, extra: list = ()) -> list[bool]:
        """Every flag of the pass as Python bools (one device read for device-side flags)."""
        flags = list(self.flags) + list(extra)
        device = [i for i, f in enumerate(flags) if tf.is_tensor(f)]
        if device:
            values = tf.stack([tf.reshape(tf.cast(flags[i], tf.bool), []) for i in device]).numpy().tolist()
            for i, v in zip(device, values):
                flags[i] = v
        return [bool(f) for f in flags]


# ---- graph walking (TF1-style programs) ------------------------------------------------

def traceback_location(op) -> str:
    """The user's repo-relative ``path:line`` from an op's creation traceback."""
    try:
        frames = list(op.traceback)
    except Exception:  # noqa: BLE001
        frames = []
    for frame in reversed(frames):
        if LOCATOR.skips(frame.filename):      # the same rule as for eager ops
            continue
        return f"{relative_path(frame.filename)}:{frame.lineno}"
    return "<unknown>:0"


def is_internal_name(name: str) -> bool:
    head = name.split("/", 1)[0]
    return head.startswith("gradients") or head == "cdeepfuzz"


def forward_ops(graph, loss_tensors: list) -> list:
    """Forward ancestors of the loss in creation order (no gradient or optimizer ops)."""
    seen: set = set()
    stack = [t.op for t in loss_tensors]
    while stack:
        op = stack.pop()
        if op in seen or is_internal_name(op.name):
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return [op for op in graph.get_operations() if op in seen]


def branch_graphs(op) -> list[tuple[str, Any]]:
    """The function graphs a control-flow op runs: (role, FuncGraph)."""
    if op.type in IF_TYPES:
        return [(role, g) for role, g in (("then", getattr(op, "_true_graph", None)),
                                          ("else", getattr(op, "_false_graph", None))) if g is not None]
    if op.type in WHILE_TYPES:
        g = getattr(op, "_body_graph", None)
        return [("body", g)] if g is not None else []
    if op.type in CALL_TYPES:
        try:
            fname = op.get_attr("f").name
            fn = op.graph._get_function(fname)  # noqa: SLF001
            g = getattr(fn, "graph", None)
        except Exception:  # noqa: BLE001
            g = None
        return [("call", g)] if g is not None else []
    return []


@dataclass
class GraphOp:
    """One forward op: in the outer graph, or inside a branch (path of control-flow ops)."""

    op: Any
    path: tuple = ()    # ((control-flow op, role), ...) from the outer graph inwards


def walk(graph, loss_tensors: list) -> list[GraphOp]:
    """Every forward op, with ops of branch graphs listed before their control-flow op."""
    out: list[GraphOp] = []

    def visit_inner(fg, path):
        for op in fg.get_operations():
            for role, sub in branch_graphs(op):
                visit_inner(sub, path + ((op, role),))
            out.append(GraphOp(op, path))

    for op in forward_ops(graph, loss_tensors):
        for role, sub in branch_graphs(op):
            visit_inner(sub, ((op, role),))
        out.append(GraphOp(op, ()))
    return out
