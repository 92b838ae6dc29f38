"""The PyTorch recorder: a ``TorchDispatchMode`` that sees every aten op of a forward pass.

Catalogued ops are recorded with their inputs (tensors keep their autograd
history, so suspect losses are built from them after the mode is left) and the
user's ``path:line``. Every op output is checked for non-finite values without
a device sync: each check leaves a 0-dim flag on the device and
:meth:`Recorder.resolve` reads them all back at once.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fuzz_core.backends.base import OpRef
from fuzz_core.catalogue import Catalogue, OpSpec
from fuzz_core.sites import CallerLocator

_TORCH_DIR = os.path.dirname(torch.__file__)
LOCATOR = CallerLocator((_TORCH_DIR,))

# Ops whose non-finite output is intended or is a pure copy: never an origin.
_PASS_THROUGH = {"detach", "alias", "clone", "copy_", "_to_copy", "lift_fresh", "empty", "empty_like",
                 "empty_strided", "new_empty", "new_empty_strided"}


NOT_SEARCHED = -1   # Call.in_ok of a recorded-only (stable) op
ALWAYS_OK = -3      # Call.in_ok of an op with no floating-point input


@dataclass
class Call:
    spec: OpSpec
    kind: str
    location: str
    occurrence: int
    inputs: list
    flag: int          # index of this call's flag in Recorder.flags
    in_ok: int = -1    # index of the "inputs finite" flag; NOT_SEARCHED or ALWAYS_OK


@dataclass
class _OpInfo:
    packet: str
    kind: str
    spec: OpSpec | None
    check: bool
    inplace: bool


@dataclass
class Recorder:
    catalogue: Catalogue
    locate_all: bool = False           # name every op (diagnosis and replay), not only catalogued ones
    calls: list[Call] = field(default_factory=list)
    flags: list[torch.Tensor] = field(default_factory=list)
    flag_ops: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, location, call index or -1)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    _info: dict[Any, _OpInfo] = field(default_factory=dict)

    def info(self, func) -> _OpInfo:
        hit = self._info.get(func)
        if hit is None:
            packet = func.overloadpacket.__name__
            overload = func._overloadname
            spec = self.catalogue.for_torch(packet)
            kind = packet if overload in ("default", "Tensor", "Scalar") else f"{packet}.{overload}"
            inplace = packet.endswith("_") or overload == "out" or overload.endswith("_out")
            check = not func.is_view and packet not in _PASS_THROUGH
            hit = self._info[func] = _OpInfo(packet, kind, spec, check, inplace)
        return hit

    def handle(self, func, args: tuple, kwargs: dict):
        info = self.info(func)
        if info.spec is None:
            out = func(*args, **kwargs)
            if info.check:
                loc = LOCATOR.locate(2) if self.locate_all else ""
                self._flag_nan(out, info.kind, loc, -1)
            return out
        spec = info.spec
        location = LOCATOR.locate(2)
        key = (spec.name, location)
        occurrence = self.counts.get(key, 0)
        self.counts[key] = occurrence + 1
        inputs = list(args) + [v for k, v in kwargs.items() if k not in ("out",) and isinstance(v, torch.Tensor)]
        in_ok = NOT_SEARCHED
        if spec.searched:
            if info.inplace:
                inputs = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in inputs]
            ok = _all_finite(inputs)
            in_ok = self._push(ok) if ok is not None else ALWAYS_OK
        out = func(*args, **kwargs)
        index = len(self.calls)
        if spec.searched:
            flag = self._push(_any_nonfinite(out), (info.kind, location, index))
        else:
            flag = self._flag_nan(out, info.kind, location, index)
        self.calls.append(Call(spec, info.kind, location, occurrence, inputs, flag, in_ok))
        return out

    def _push(self, flag: torch.Tensor, op: tuple[str, str, int] | None = None) -> int:
        self.flags.append(flag)
        self.flag_ops.append(op if op is not None else ("", "", -2))
        return len(self.flags) - 1

    def _flag_nan(self, out, kind: str, location: str, index: int) -> int:
        tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not tensors:
            return -1
        flag = torch.isnan(tensors[0]).any()
        for t in tensors[1:]:
            flag = flag | torch.isnan(t).any()
        return self._push(flag, (kind, location, index))

    def resolve(self, extra: list[torch.Tensor] = ()) -> list[bool]:
        """One device sync for every flag of the pass (plus ``extra`` flags at the end)."""
        flags = list(self.flags) + list(extra)
        if not flags:
            return []
        return torch.stack([f.reshape(()).to(torch.bool) for f in flags]).cpu().tolist()

    def find(self, key: tuple[str, str, int]) -> Call | None:
        for call in self.calls:
            if (call.spec.name, call.location, call.occurrence) == key:
                return call
        return None

    def first_event(self, values: list[bool], outputs_bad: bool, program_location: str) -> OpRef | None:
        """The first op whose output went non-finite by its own doing (DESIGN: what counts)."""
        for i, bad in enumerate(values[: len(self.flags)]):
            kind, location, index = self.flag_ops[i]
            if not bad or index == -2:
                continue
            if index >= 0:
                call = self.calls[index]
                if call.in_ok >= 0 and not values[call.in_ok]:
                    continue     # its inputs were already non-finite: not the origin
                return OpRef(call.spec.name, call.kind, call.location, call.occurrence)
            return OpRef(kind, kind, location or "<not located: replay names it>", 0)
        if outputs_bad:
            return OpRef("output", "output", program_location, 0, nan=False)
        return None

    def triggered(self, values: list[bool], call: Call) -> bool:
        if call.in_ok == NOT_SEARCHED or call.flag < 0:
            return False
        inputs_ok = call.in_ok == ALWAYS_OK or bool(values[call.in_ok])
        return bool(values[call.flag]) and inputs_ok


class RecordingMode(TorchDispatchMode):
    """Forwards every op to a :class:`Recorder`; holds no state of its own."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.recorder.handle(func, args, kwargs or {})


def _all_finite(inputs: list) -> torch.Tensor | None:
    flag = None
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            ok = torch.isfinite(t).all()
            flag = ok if flag is None else flag & ok
    return flag


def _any_nonfinite(out) -> torch.Tensor:
    flag = None
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            bad = ~torch.isfinite(t).all()
            flag = bad if flag is None else flag | bad
    return flag if flag is not None else torch.zeros((), dtype=torch.bool)
