"""The PyTorch recorder: a ``TorchDispatchMode`` that sees every aten op of a forward pass.

Catalogued ops are recorded with their inputs (tensors keep their autograd
history, so suspect losses are built from them after the mode is left) and the
user's ``path:line``. Every op output is checked for non-finite values without
a device sync: each check leaves a 0-dim flag on the device and
:meth:`Recorder.resolve` reads them all back at once.

In-place ops overwrite their inputs, and a dispatch mode sits below autograd: a
copy made there has no gradient path. So :class:`RecordingMode` also enters a
``TorchFunctionMode`` (above autograd) that, before an in-place call of a
catalogued op (``x.log_()``, ``x /= y``, ``torch.exp_(x)``), saves a differentiable
``clone()`` of the inputs it overwrites; the dispatch-level record uses it. The
same mode protects the inputs recorded by earlier calls from a later in-place
write (``y = x.sqrt(); x.mul_(2)``): they are replaced by differentiable clones
first. Writes it cannot see (those inside a Python ``torch.nn.functional``
function, or inside C++ kernels) fall back to a plain snapshot at dispatch:
right values, no gradient path. Ops of a backward pass run inside the program
are not recorded.

Two more duties, both off by default: a :class:`~fuzz_core.backends.torch_state.WriteWatch`
(``watch``) sees every in-place write and every created tensor of the pass, and in a
diagnosis (``diagnose``) every op's output node in the autograd graph gets a hook, so that
the first backward node that turns finite incoming gradients into non-finite ones is named
by the forward op and user ``file:line`` that created it (autograd's own graph, not a re-run
under ``detect_anomaly``); ops of the program's own optimizer step, which run after its
backward, are flagged for any non-finite output (an update that wrote inf or NaN).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fuzz_core.backends.flags import ALWAYS_OK, NOT_SEARCHED, Call, FlagBook
from fuzz_core.backends.torch_dynamo import defer_dynamo
from fuzz_core.backends.torch_state import storage_of
from fuzz_core.catalogue import Catalogue, OpSpec
from fuzz_core.sites import CallerLocator

_TORCH_DIR = os.path.dirname(torch.__file__)
LOCATOR = CallerLocator((_TORCH_DIR,))

# Ops whose non-finite output is intended or is a pure copy: never an origin.
_PASS_THROUGH = {"detach", "alias", "clone", "copy_", "_to_copy", "lift_fresh", "empty", "empty_like",
                 "empty_strided", "new_empty", "new_empty_strided"}
# Ops that cannot make a NaN out of values that hold none (they copy, select or reorder values,
# or are NaN-free on +-inf): a NaN in their output is already in an input, whose own op was
# checked. Not checking them saves a reduction over each output (relu and reshapes are a sixth
# of a Transformer block's checked ops); the op named first is the same.
_NO_NEW_NAN = {"relu", "neg", "abs", "_unsafe_view", "cat", "stack", "index_select", "gather", "embedding",
               "constant_pad_nd", "repeat", "flip", "roll"}


@dataclass
class _OpInfo:
    packet: str
    kind: str
    spec: OpSpec | None
    check: bool
    new_nan: bool                  # its output is checked for NaN (it can make one)
    plain_view: bool               # a view that writes nothing: no new values, no new memory
    out_spec: OpSpec | None        # its output-range row (half_overflow), judged where the output is half
    writes: tuple[int, ...]        # positional arguments the op writes (self of an in-place op)
    write_kwargs: tuple[str, ...]  # keyword arguments it writes (out=)


def _schema_writes(func) -> tuple[tuple[int, ...], tuple[str, ...]]:
    positional, keyword = [], []
    for i, arg in enumerate(func._schema.arguments):
        alias = arg.alias_info
        if alias is not None and alias.is_write:
            (keyword.append(arg.name) if arg.kwarg_only else positional.append(i))
    return tuple(positional), tuple(keyword)


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def inplace_names(catalogue: Catalogue) -> frozenset[str]:
    """Python names of the in-place variants of catalogued ops (``log_``, ``div_``, ...).

    ``x /= y``, ``x **= y``, ``x //= y`` and ``x %= y`` reach a function mode as
    ``div_``, ``pow_``, ``floor_divide_`` and ``remainder_``.
    """
    return frozenset(n for n in catalogue.torch_names() if n.endswith("_") and "::" not in n)


@dataclass
class Recorder(FlagBook):
    catalogue: Catalogue
    locate_all: bool = False           # name every op (diagnosis and replay), not only catalogued ones
    calls: list[Call] = field(default_factory=list)
    flags: list[torch.Tensor] = field(default_factory=list)
    flag_ops: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, location, call index or -1)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    # What each aten overload is to the catalogue; a runner passes one dict to all its steps'
    # recorders (reading an op's schema costs more than the check of its output).
    info_cache: dict[Any, _OpInfo] = field(default_factory=dict)
    # Differentiable copies of the inputs an in-place call is about to overwrite, made by the
    # function mode above autograd (id of the argument -> its clone).
    _pending: dict[int, torch.Tensor] = field(default_factory=dict)
    # Memory of the tensors that searched calls hold as inputs -> (call index, input position),
    # so that a later write can save them first.
    _watch: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    watch: Any = None                  # a WriteWatch: in-place writes outside the tracked state
    diagnose: bool = False             # hook every output's autograd node; flag the update's ops
    extra_specs: dict[str, OpSpec] = field(default_factory=dict)   # packet -> a backward-hazard spec
    backward_nodes: list[tuple] = field(default_factory=list)   # (op, kind, location, occ, backward-hazard name)
    backward_flags: list[tuple[int, int, Any, Any]] = field(default_factory=list)   # (seq, node, bad in, bad out)
    update_ops: list[tuple[int, str, str, Any]] = field(default_factory=list)   # (seq, kind, location, bad)
    measure: bool = False              # record output-range rows whatever the output's dtype (a report's fp32 value)
    is_state: Any = None               # diagnosis: does an in-place write hit the program's state (an update)?
    flag_seq: list[int] = field(default_factory=list)   # the event order of each flag
    _fresh: list[tuple[Any, int]] = field(default_factory=list)
    _hooked: set = field(default_factory=set)
    _seq: int = 0

    def info(self, func) -> _OpInfo:
        hit = self.info_cache.get(func)
        if hit is None:
            packet = func.overloadpacket.__name__
            overload = func._overloadname
            namespace = getattr(func, "namespace", "aten")
            spec = self.catalogue.for_torch(packet if namespace == "aten" else f"{namespace}::{packet}")
            kind = packet if overload in ("default", "Tensor", "Scalar") else f"{packet}.{overload}"
            writes, write_kwargs = _schema_writes(func)
            check = not func.is_view and packet not in _PASS_THROUGH
            out_spec = self.catalogue.for_torch_output(packet if namespace == "aten" else f"{namespace}::{packet}")
            plain_view = bool(func.is_view and spec is None and not writes and not write_kwargs)
            hit = self.info_cache[func] = _OpInfo(packet, kind, spec, check, check and packet not in _NO_NEW_NAN,
                                                  plain_view, out_spec if check else None, writes, write_kwargs)
        return hit

    def push(self, flag, op: tuple[str, str, int] | None = None) -> int:
        self.flag_seq.append(self._next())
        return super().push(flag, op)

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def handle(self, func, args: tuple, kwargs: dict):
        if _in_backward():   # a backward run inside the program: its ops are not forward sites
            return func(*args, **kwargs)
        info = self.info_cache.get(func) or self.info(func)
        if info.plain_view:
            # Half a Transformer's ops. Its memory is its base's: the base was allowed to be written
            # (made in this pass, or tracked state) or it was not, and a view must not change that.
            return func(*args, **kwargs)
        written = self._written(info, args, kwargs) if (info.writes or info.write_kwargs) else ()
        if written:
            if self._watch:
                self._protect(written, differentiable=False)
            if self.watch is not None:
                self.watch.wrote(written, info.kind, lambda: LOCATOR.locate(4))
        half_in = info.out_spec is not None and (self.measure or _any_half(args))
        if info.spec is None:
            in_ok = self._inputs_ok(args) if half_in else None
            out = func(*args, **kwargs)
            if written and self.is_state is not None and any(self.is_state(t) for t in written):
                # an in-place write into the program's state: an optimizer's update (diagnosis)
                self.update_ops.append((self._next(), info.kind, LOCATOR.locate(2), any_nonfinite(written)))
                return out
            if self.watch is not None:
                self.watch.created(out)
            if info.check:
                half = _half_output(out, self.measure) if half_in else None
                loc = LOCATOR.locate(2) if (self.locate_all or half is not None) else ""
                if half is not None:   # a catalogued hazard where its output is half: inf counts too
                    self._record_output(info.out_spec, info.kind, loc, half, None, in_ok)
                elif info.new_nan:
                    self._flag_nan(out, info.kind, loc, -1)
                if self.diagnose:
                    self._fresh.append((out, self._node_meta(info.packet, info.kind, loc, 0, None)))
            return out
        spec = info.spec
        location = LOCATOR.locate(2)
        key = (spec.name, location)
        occurrence = self.counts.get(key, 0)
        self.counts[key] = occurrence + 1
        inputs = list(args) + [v for k, v in kwargs.items()
                               if k not in info.write_kwargs and k != "out" and isinstance(v, torch.Tensor)]
        watch: list[int] = []
        in_ok = NOT_SEARCHED
        if spec.searched:
            inputs, watch = self._snapshot(inputs, written)
            ok = _all_finite(inputs)
            in_ok = self.push(ok) if ok is not None else ALWAYS_OK
        out = func(*args, **kwargs)
        if self.watch is not None:
            self.watch.created(out)
        grad_spec = self.extra_specs.get(info.packet)
        if self.diagnose:
            grad_name = grad_spec.name if grad_spec is not None else None
            self._fresh.append((out, self._node_meta(spec.name, info.kind, location, occurrence, grad_name)))
        index = len(self.calls)
        if spec.searched:
            flag = self.push(any_nonfinite(out), (info.kind, location, index))
        else:
            flag = self._flag_nan(out, info.kind, location, index)
        self.calls.append(Call(spec, info.kind, location, occurrence, inputs, flag, in_ok))
        if grad_spec is not None:   # a backward hazard of the same call: searched on the same inputs
            gkey = (grad_spec.name, location)
            gocc = self.counts.get(gkey, 0)
            self.counts[gkey] = gocc + 1
            self.calls.append(Call(grad_spec, info.kind, location, gocc, inputs, -1, in_ok))
        if half_in:
            half = _half_output(out, self.measure)
            if half is not None:
                searched = spec.searched
                self._record_output(info.out_spec, info.kind, location, half, flag if searched else None,
                                    in_ok if searched and in_ok >= 0 else self._inputs_ok(inputs))
        for pos in watch:
            ptr = storage_of(inputs[pos])
            if ptr:
                self._watch.setdefault(ptr, []).append((index, pos))
        return out

    # -- output-range rows (half_overflow) -----------------------------------------------------
    def _inputs_ok(self, args) -> int:
        ok = _all_finite([t for t in tree_leaves(list(args)) if isinstance(t, torch.Tensor)])
        return self.push(ok) if ok is not None else ALWAYS_OK

    def _record_output(self, spec: OpSpec, kind: str, location: str, out: torch.Tensor, flag: int | None,
                       in_ok: int) -> None:
        """A call of an output-range row: its margin input is the op's output (kept safe from later
        in-place writes like a recorded input); its trigger is that output going non-finite from
        finite inputs."""
        key = (spec.name, location)
        occurrence = self.counts.get(key, 0)
        self.counts[key] = occurrence + 1
        index = len(self.calls)
        if flag is None:
            flag = self.push(any_nonfinite(out), (kind, location, index))
        self.calls.append(Call(spec, kind, location, occurrence, [out], flag, in_ok))
        ptr = storage_of(out)
        if ptr:
            self._watch.setdefault(ptr, []).append((index, 0))

    # -- in-place writes ------------------------------------------------------------------
    @staticmethod
    def _written(info: _OpInfo, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        out = [args[i] for i in info.writes if i < len(args)]
        out += [kwargs[k] for k in info.write_kwargs if k in kwargs]
        return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]

    def _snapshot(self, inputs: list, written: list) -> tuple[list, list[int]]:
        """Replace the inputs this call overwrites by copies made before it runs.

        The function mode's differentiable clone when there is one, else a plain copy.
        Returns the inputs and the positions of those kept as they are (to watch).
        """
        if not written:
            return inputs, [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.is_floating_point()]
        ptrs = {storage_of(t) for t in written} - {0}
        ids = {id(t) for t in written}
        out, keep = [], []
        for pos, a in enumerate(inputs):
            if isinstance(a, torch.Tensor) and (id(a) in ids or storage_of(a) in ptrs):
                saved = self._pending.pop(id(a), None)
                out.append(saved if saved is not None else a.detach().clone())
            else:
                out.append(a)
                if isinstance(a, torch.Tensor) and a.is_floating_point():
                    keep.append(pos)
        return out, keep

    def _protect(self, tensors, differentiable: bool) -> None:
        """Before ``tensors`` are overwritten, copy the recorded inputs that live in them."""
        for t in tensors:
            entries = self._watch.pop(storage_of(t), None) if isinstance(t, torch.Tensor) else None
            for index, pos in entries or ():
                inputs = self.calls[index].inputs
                x = inputs[pos]
                inputs[pos] = x.clone() if differentiable else x.detach().clone()

    def before_inplace(self, args: tuple, kwargs: dict) -> None:
        """Called above autograd before an in-place call of a catalogued op (or any write)."""
        target = args[0] if args else None
        if not isinstance(target, torch.Tensor):
            return
        if self._watch:
            self._protect([target], differentiable=True)
        ptr = storage_of(target)
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor) and a.is_floating_point() and (a is target or (ptr and storage_of(a) == ptr)):
                self._pending[id(a)] = a.clone()

    def _flag_nan(self, out, kind: str, location: str, index: int) -> int:
        if type(out) is torch.Tensor:      # most ops: one plain tensor, no pytree walk
            if not (out.is_floating_point() and out.numel()):
                return -1
            return self.push(_has_nan(out), (kind, location, index))
        tensors = [t for t in tree_leaves(out)
                   if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
        if not tensors:
            return -1
        flag = _has_nan(tensors[0])
        for t in tensors[1:]:
            flag = flag | _has_nan(t)
        return self.push(flag, (kind, location, index))

    # -- backward diagnosis --------------------------------------------------------------------
    def _node_meta(self, op: str, kind: str, location: str, occurrence: int, grad_name: str | None) -> int:
        self.backward_nodes.append((op, kind, location, occurrence, grad_name))
        return len(self.backward_nodes) - 1

    def attach_hooks(self) -> None:
        """Hook the autograd nodes of the outputs recorded since the last call (their ``grad_fn``
        is set once the op has returned through autograd: called after each torch function)."""
        fresh, self._fresh = self._fresh, []
        for out, meta in fresh:
            for t in tree_leaves(out):
                node = t.grad_fn if isinstance(t, torch.Tensor) else None
                if node is None or node in self._hooked:
                    continue
                self._hooked.add(node)
                node.register_hook(self._backward_hook(meta))

    def _backward_hook(self, meta: int):
        def hook(grad_inputs, grad_outputs):
            self.backward_flags.append((self._next(), meta, any_nonfinite(grad_inputs), any_nonfinite(grad_outputs)))
        return hook

    def first_problem(self, outputs_bad: torch.Tensor, program_location: str) -> tuple[str, Any] | None:
        """The earliest non-finite value of a diagnosed step, whatever its phase: ``("forward",
        OpRef)``, ``("backward", (op, kind, location, occurrence, backward-hazard name))`` for the
        first backward node that made non-finite gradients from finite incoming ones (named by the
        forward op that created it), or ``("update", (kind, location))`` for the first in-place
        write into the program's state that left it non-finite. A train_step that trains two nets
        (a GAN) runs forward, backward and update twice: the order of events decides."""
        n_flags, n_backward = len(self.flags), len(self.backward_flags)
        extra = [outputs_bad] + [t for _, _, b, o in self.backward_flags for t in (b, o)]
        extra += [f for *_, f in self.update_ops]
        values = self.resolve(extra)
        found: list[tuple[int, str, Any]] = []
        i, op = self.first_event_at(values[:n_flags + 1], values[n_flags], program_location)
        if op is not None:
            found.append((self.flag_seq[i] if i < n_flags else self._seq + 1, "forward", op))
        backward = values[n_flags + 1:n_flags + 1 + 2 * n_backward]
        for k, (seq, meta, _, _) in enumerate(self.backward_flags):
            if backward[2 * k] and not backward[2 * k + 1]:
                found.append((seq, "backward", self.backward_nodes[meta]))
                break
        for (seq, kind, location, _), bad in zip(self.update_ops, values[n_flags + 1 + 2 * n_backward:]):
            if bad:
                found.append((seq, "update", (kind, location)))
                break
        return min(found, key=lambda f: f[0])[1:] if found else None

    def resolve(self, extra: list[torch.Tensor] = ()) -> list[bool]:
        """One device sync for every flag of the pass (plus ``extra`` flags at the end)."""
        flags = list(self.flags) + list(extra)
        if not flags:
            return []
        return torch.stack([f if f.dtype is torch.bool and not f.dim() else f.reshape(()).to(torch.bool)
                            for f in flags]).cpu().tolist()


class InplaceFunctionMode(TorchFunctionMode):
    """Above autograd: saves differentiable copies of what an in-place call overwrites.

    For in-place calls of catalogued ops (``names``) the copies become the recorded
    inputs of the call; for any other write (a method ending in ``_``, ``__setitem__``,
    ``out=``) it saves the inputs that earlier calls recorded from the written tensor.
    """

    def __init__(self, recorder: Recorder, names: frozenset[str]) -> None:
        super().__init__()
        self.recorder = recorder
        self.names = names

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.recorder
        name = getattr(func, "__name__", "")
        if name in self.names and not _in_backward():
            rec.before_inplace(args, kwargs)
            try:
                return func(*args, **kwargs)
            finally:
                rec._pending.clear()
                if rec.diagnose:
                    rec.attach_hooks()
        if rec._watch and not _in_backward():
            if args and (name == "__setitem__" or (name.endswith("_") and not name.endswith("__"))):
                rec._protect(args[:1], differentiable=True)
            out = kwargs.get("out")
            if out is not None:
                rec._protect([t for t in tree_leaves(out) if isinstance(t, torch.Tensor)], differentiable=True)
        if not rec.diagnose:
            return func(*args, **kwargs)
        try:
            return func(*args, **kwargs)
        finally:
            rec.attach_hooks()


class WatchMode(TorchDispatchMode):
    """Only the write watch, for code that runs outside the recorded forward pass (a
    ``train_step``): in-place writes are checked, created tensors allowed."""

    def __init__(self, watch) -> None:
        super().__init__()
        self.watch = watch
        self._writes: dict[Any, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        writes = self._writes.get(func)
        if writes is None:
            writes = self._writes[func] = _schema_writes(func)
        if (writes[0] or writes[1]) and not _in_backward():
            written = [args[i] for i in writes[0] if i < len(args)] + [kwargs[k] for k in writes[1] if k in kwargs]
            self.watch.wrote([t for t in tree_leaves(written) if isinstance(t, torch.Tensor)],
                             func.overloadpacket.__name__, lambda: LOCATOR.locate(4))
        out = func(*args, **kwargs)
        self.watch.created(out)
        return out


class RecordingMode(TorchDispatchMode):
    """Forwards every op to a :class:`Recorder`; holds no state of its own.

    Entering it also enters an :class:`InplaceFunctionMode` (outside the dispatch mode),
    so ``with RecordingMode(recorder):`` is all a caller needs.
    """

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder
        self._function_modes: list[InplaceFunctionMode] = []

    def __enter__(self):
        function_mode = InplaceFunctionMode(self.recorder, inplace_names(self.recorder.catalogue))
        function_mode.__enter__()
        try:
            entered = super().__enter__()
        except BaseException:
            function_mode.__exit__(None, None, None)
            raise
        self._function_modes.append(function_mode)
        return entered

    def __exit__(self, exc_type, exc_val, exc_tb):
        try:
            return super().__exit__(exc_type, exc_val, exc_tb)
        finally:
            self._function_modes.pop().__exit__(exc_type, exc_val, exc_tb)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.recorder.handle(func, args, kwargs or {})


# TorchDispatchMode wraps each subclass's __torch_dispatch__ in torch._disable_dynamo, whose first call
# would import torch._dynamo: not before something compiles (torch_dynamo.py)
defer_dynamo(WatchMode)
defer_dynamo(RecordingMode)

_HALF = (torch.float16, torch.bfloat16)


def _any_half(args: tuple) -> bool:
    """Some tensor argument (top level, or in a list) is float16 or bfloat16: the only calls whose
    output can be half. Costs an attribute read per argument in a float32 pass."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.dtype in _HALF:
                return True
        elif isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.dtype in _HALF for t in a):
            return True
    return False


def _half_output(out, any_float: bool = False) -> torch.Tensor | None:
    """The op's first floating-point output when it is half (or any float, ``any_float``)."""
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            return t if (t.dtype in _HALF or any_float) else None
    return None


def _has_nan(t: torch.Tensor) -> torch.Tensor:
    """NaN anywhere in ``t``, in one pass and no temporary: ``amax`` propagates NaN, and unlike
    a sum it never turns a mix of +inf and -inf (an intended mask) into one. 15x cheaper than
    ``isnan(t).any()`` on a Transformer's activations."""
    return torch.isnan(t.detach().amax())


def nonfinite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A 0-dim bool on the device: some tensor holds inf or NaN, from each one's two ends in one
    pass (``aminmax`` propagates NaN): ~40x cheaper on CPU than ``isfinite(t).all()``, which
    builds a mask the size of ``t``."""
    return nonfinite_of([e for t in tensors if t.numel() for e in torch.aminmax(t.detach())])


def nonfinite_of(values: list[torch.Tensor]) -> torch.Tensor:
    """Some of these 0-dim tensors is not finite. Of mixed dtypes or devices they are joined in the
    widest dtype the first one's device has, so that a float64 value past float32's range is not
    read as an inf."""
    if not values:
        return torch.zeros((), dtype=torch.bool)
    first = values[0]
    if any(v.dtype != first.dtype or v.device != first.device for v in values):
        wide = torch.float32 if first.device.type == "mps" else torch.float64
        values = [v.to(first.device, wide) for v in values]
    return ~torch.isfinite(torch.stack(values)).all()


def _all_finite(inputs: list) -> torch.Tensor | None:
    floats = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return ~nonfinite(floats) if floats else None


def any_nonfinite(out) -> torch.Tensor:
    """A 0-dim bool tensor: some floating-point tensor in ``out`` (any pytree) is not finite."""
    return nonfinite([t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()])
