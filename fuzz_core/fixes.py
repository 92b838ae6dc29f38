"""Fixes: a guard at the op of a finding, verified by searching the guarded program, and written as a
patch of the user's line.

``cdeepfuzz fix`` guards the op that went non-finite first in the finding (what a replay checks:
the site's own op, or the other op its search met first), at its call (``path:line:col``), forward
or backward hazard alike (a backward row, ``log_grad``, is guarded at its forward op: the clamp that
keeps ``log``'s input off 0 keeps its gradient ``1/x`` finite too). :func:`suggest` proposes guards
in the order a reviewer would try them: a stable rewrite where the log's input shows where it came
from (``log`` of a ``softmax`` becomes ``log_softmax``, of ``sigmoid`` / ``1 - sigmoid``
``logsigmoid``), then the smallest clamp that keeps the op in its domain, then one with a margin:
``log``, ``rsqrt``, ``xlogy`` clamp their input to >= tiny (then >= eps), ``div`` / ``reciprocal``
/ ``remainder`` keep ``|divisor| >= eps`` with the divisor's sign, ``sqrt`` clamps to >= 0 (then
eps), ``exp`` to <= ln(max) (then ln(max) - ln(2**20), then half that: Adam squares its gradient), ``acos`` / ``asin`` into [-1, 1],
``atanh`` / ``erfinv`` into (-1, 1), ``acosh`` to >= 1 (then 1 + eps), ``pow`` its base to >= 0
(>= tiny for a negative exponent), ``logit`` / ``ndtri`` into (0, 1), ``mvlgamma`` above its
domain's end. Poles inside a domain (``lgamma``, ``digamma``) and half-precision overflows get none
(:data:`NO_GUARD` says why).

Each guard is first written into the user's source (:mod:`fuzz_core.fix_source`): with the names
its line holds, or not at all (a stable rewrite whose softmax runs on another line is skipped, and
says so). Only a guard with a patch is verified: it is applied above autograd by a
``torch.overrides.TorchFunctionMode`` that intercepts the same op at the same call, exactly as the
patch changes it, so the gradient goes through the guard too. :func:`verify` replays the
reproducer under the guard, then searches every suspect op of the guarded program (the guarded site
first) with the finding's strategy and seed, up to a budget per site, stopping at the first
qualifying non-finite value anywhere in a pass (not only at the searched op: a clamp at 1e-45
leaves a log of -103 that a later op may turn into an overflow). In every pass the guarded call's
own gradient is checked as well, even in a program that never calls backward:
``rsqrt(x.clamp_min(tiny))`` is finite at x = 2e-38 but its gradient is -inf there, so it is not a
fix. :func:`suggest_and_verify` tries the guards in order and writes a ``fix`` section into
``finding.json``: ``verified`` (the reproducer finite forward and backward under the guard, and no
other trigger in the N steps searched) with the guard and its patch (``diff``, also ``fix.diff``),
or ``not sufficient`` with what each guard still let through (a residual finding, its values saved
next to the report as ``fix-residual-<i>.safetensors``), or ``no suggestion``; the two last with a
message that starts "no fix for the <op> at <path:line:col>:" and says why in one sentence.

Only the PyTorch backend has guards (:data:`TF_WHY` says why); torch is imported lazily, as the rest
of fuzz_core does.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from fuzz_core.backends.base import NOT_LOCATED
from fuzz_core.catalogue import DEFAULT_CATALOGUE
from fuzz_core.findings import REPORT, load_finding, value_arrays
from fuzz_core.fix_source import DIVISOR_SECOND, FUNCTIONS, Guard, patch, source_patch, split_location
from fuzz_core.io import atomic_save_arrays, atomic_write_json
from fuzz_core.sites import OpSite, position, position_of, source_line

__all__ = ["Guard", "guard_mode", "suggest", "suggest_and_verify", "verify", "source_patch", "split_location",
           "guarded_op", "framework_of", "DIFF_FILE", "TF_WHY", "NO_GUARD"]

log = logging.getLogger(__name__)

DEFAULT_BUDGET = 200            # steps per searched site
EXP_HEADROOM = 20 * math.log(2)  # the second exp guard leaves room for sums of 2**20 terms
SRC_ATTR = "_cdeepfuzz_src"      # provenance tag left on softmax / sigmoid outputs while a mode runs
DIFF_FILE = "fix.diff"           # the verified guard as a patch, in the finding folder
TF_WHY = ("CDeepFuzz verifies guards in PyTorch programs only (it applies one above autograd at the op's source "
          "line with PyTorch's TorchFunctionMode, and TensorFlow has no such hook), so guard this op by hand and "
          "check the edited program with `cdeepfuzz replay`")
# Catalogue rows with no guard, and why (one clause each, after "no fix for the <op> at <where>: ").
NO_GUARD = {
    "lgamma": "lgamma's poles (0 and the negative integers) lie inside its domain, so no clamp keeps an input off "
              "them without changing the function; keep the input positive where it is computed",
    "digamma": "digamma's poles (0 and the negative integers) lie inside its domain, so no clamp keeps an input off "
               "them without changing the function; keep the input positive where it is computed",
    "half_overflow": "a half-precision overflow is fixed by the precision the op runs in, not by a clamp at one "
                     "call; run the op in float32 or scale its inputs down",
}


@dataclass
class Attempt:
    guard: Guard
    status: str                  # verified | not sufficient | error (the guarded program raised) | no patch
    steps: int
    sites: list[str]
    seconds: float
    residual: dict[str, Any] | None = None
    why: str = ""                # no patch: why the guard cannot be written on the line
    patch: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"guard": self.guard.to_dict(), "status": self.status, "steps": self.steps, "sites": self.sites,
                "seconds": round(self.seconds, 3), "residual": self.residual, "why": self.why or None,
                "diff": self.patch["diff"] if self.patch else None}


# -- what to guard ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Guarded:
    """The call a fix guards: the catalogue row's forward op at a location (and column), or why none."""

    op: str | None
    location: str
    column: int | None
    what: str                    # for people: "log at path:line:col", "sqrt (backward) at ..."
    why: str = ""                # op None: why there is no guard; else a note (the site guarded instead)


def guarded_op(report: dict[str, Any], original: dict[str, Any] | None = None) -> Guarded:
    """What a fix of the finding ``report`` guards: the first op that went non-finite (what a replay
    checks), else the site's own op; a backward row at its forward op (``log_grad`` -> ``log``). A
    first op outside the catalogue (a ``mul`` whose gradient overflowed on an ``exp``'s huge output)
    has no guard: the site's own op is guarded then, if it has one, and verification judges it.
    ``original``: the report before :func:`fuzz_core.engine.moved` relocated its lines; a moved
    line keeps its code, hence its column."""
    site = report["site"]
    first = report.get("first_op") or {}
    located = bool(first) and not str(first.get("location", "")).startswith(NOT_LOCATED)
    backward = report.get("phase") == "backward"

    def at(key: str, entry: dict[str, Any], phase: bool) -> tuple[str, str, int | None, str]:
        before = (original or report).get(key) or {}
        column = entry.get("column") or before.get("column")
        location, name = str(entry.get("location", "")), str(entry.get("op", ""))
        shown = f"{name}{' (backward)' if phase and not name.endswith('_grad') else ''}"
        row = _row(name)
        if row is None and entry.get("kind"):
            shown = str(entry["kind"])                                        # Adam: addcmul_, mul (backward)
        if row is not None and row.on_output:
            shown = f"{row.name.replace('_', ' ')} of {entry.get('kind', name)}"     # half overflow of mul
        return name, location, column, f"{shown} at {position(location, column)}"

    name, location, column, what = at("first_op", first, backward) if located else at("site", site, False)
    note = ""
    if located and _row(name) is None and _guardable(str(site.get("op", ""))):
        note = (f"the first non-finite value came from {what}, an op with no guard, downstream of the "
                f"site's own {_forward(str(site.get('op')))}, which is guarded instead")
        name, location, column, what = at("site", site, False)
    row = _row(name)
    if row is None:
        return Guarded(None, location, column, what, "it is not an op of the catalogue, so CDeepFuzz has no guard "
                                                     "for it")
    if row.on_output or row.name in NO_GUARD:
        return Guarded(None, location, column, what, NO_GUARD.get(row.name, f"there is no guard for {row.name}"))
    if not _guardable(name):
        return Guarded(None, location, column, what, f"there is no guard for {_forward(name)}")
    return Guarded(_forward(name), location, column, what, note)


def _row(name: str):
    return next((s for s in DEFAULT_CATALOGUE if s.name == name), None)


def _guardable(name: str) -> bool:
    row = _row(name)
    return row is not None and not row.on_output and row.name not in NO_GUARD and _forward(name) in FUNCTIONS.values()


def _forward(name: str) -> str:
    """The forward row of a backward catalogue row (``log_grad`` -> ``log``); any other name as it is."""
    spec = _row(name)
    if spec is None or spec.phase != "backward":
        return name
    return next((f.name for f in map(DEFAULT_CATALOGUE.for_torch, spec.torch) if f is not None), name)


# -- suggestions ---------------------------------------------------------------------------------------
def suggest(op: str, location: str, probe: dict[str, Any], column: int | None = None) -> list[Guard]:
    """Guards for ``op`` at ``location`` (the call at ``column``), most specific first; ``probe`` is
    what :func:`probe_calls` saw there (dtype of the guarded input, its provenance, the exponent of a
    pow, the ``p`` of an mvlgamma). Their ``code`` is empty: the patch writes it."""
    finfo = _finfo(probe.get("dtype", "float32"))
    tiny, eps, big = finfo["tiny"], finfo["eps"], finfo["max"]

    def clamp(name: str, why: str, **params: float) -> Guard:
        return Guard(name, op, location, params, why, column=column)

    guards: list[Guard] = []
    sources = probe.get("provenance") or []
    if op in ("log", "log2", "log10") and len(sources) == 1:
        source, origin = sources[0]
        stable = "log_softmax" if source == "softmax" else "logsigmoid"
        of = {"softmax": "a softmax", "sigmoid": "a sigmoid", "one_minus_sigmoid": "1 - sigmoid"}[source]
        guards.append(Guard("stable_log", op, location, {}, f"compute in log space: {stable} instead of the "
                                                             f"{op} of {of}", column=column, source=source,
                            origin=origin))
    if op in ("log", "log2", "log10", "rsqrt", "xlogy"):
        guards += [clamp("clamp_min", f"clamp the input to >= tiny ({tiny:.3g})", lo=tiny),
                   clamp("clamp_min", f"clamp the input to >= eps ({eps:.3g})", lo=eps)]
    elif op == "log1p":
        guards.append(clamp("clamp_min", "clamp the input to >= -1 + eps", lo=-1 + eps))
    elif op in ("div", "reciprocal", "remainder"):
        guards += [clamp("abs_min", f"keep |divisor| >= tiny ({tiny:.3g}), with its sign", eps=tiny),
                   clamp("abs_min", f"keep |divisor| >= eps ({eps:.3g}), with its sign", eps=eps)]
    elif op == "sqrt":
        guards += [clamp("clamp_min", "clamp the input to >= 0", lo=0.0),
                   clamp("clamp_min", f"clamp the input to >= eps ({eps:.3g})", lo=eps)]
    elif op in ("exp", "expm1"):
        top = math.log(big)
        half = top / 2 - EXP_HEADROOM         # Adam squares the gradient exp(x) * upstream
        guards += [clamp("clamp_max", f"clamp the input to <= ln(max) ({top:.6g})", hi=top * (1 - eps)),
                   clamp("clamp_max", f"clamp the input to <= ln(max) - ln(2**20) ({top - EXP_HEADROOM:.6g})",
                         hi=top - EXP_HEADROOM),
                   clamp("clamp_max", f"clamp the input to <= ln(max) / 2 - ln(2**20) ({half:.6g}), so that the "
                                      f"square of its gradient stays finite too", hi=half)]
    elif op == "pow":
        negative = probe.get("exponent") is not None and probe["exponent"] < 0
        floor = ("tiny", tiny) if negative else ("0", 0.0)     # 0 ** negative is inf
        guards += [clamp("clamp_min", f"clamp the base to >= {floor[0]}", lo=floor[1]),
                   clamp("clamp_min", f"clamp the base to >= eps ({eps:.3g})", lo=eps)]
    elif op in ("acos", "asin"):
        guards += [clamp("clamp", "clamp the input into [-1, 1]", lo=-1.0, hi=1.0),
                   clamp("clamp", "clamp the input into [-1 + eps, 1 - eps]", lo=-1 + eps, hi=1 - eps)]
    elif op in ("atanh", "erfinv"):
        guards.append(clamp("clamp", "clamp the input into [-1 + eps, 1 - eps]", lo=-1 + eps, hi=1 - eps))
    elif op == "acosh":
        guards += [clamp("clamp_min", "clamp the input to >= 1", lo=1.0),           # d acosh/dx is inf at 1
                   clamp("clamp_min", "clamp the input to >= 1 + eps", lo=1 + eps)]
    elif op in ("logit", "ndtri"):
        guards += [clamp("clamp", "clamp the input into [tiny, 1 - eps]", lo=tiny, hi=1 - eps),
                   clamp("clamp", "clamp the input into [eps, 1 - eps]", lo=eps, hi=1 - eps)]
    elif op == "mvlgamma":
        end = (float(probe.get("p") or 1) - 1) / 2
        guards.append(clamp("clamp_min", f"clamp the input to >= (p - 1) / 2 + eps ({end:g} + eps)",
                            lo=end + max(eps, abs(end) * eps * 4)))
    return guards


def _finfo(dtype: str) -> dict[str, float]:
    import torch

    dt = getattr(torch, str(dtype).replace("torch.", ""), torch.float32)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        dt = torch.get_default_dtype()
    fi = torch.finfo(dt)
    return {"tiny": float(fi.tiny), "eps": float(fi.eps), "max": float(fi.max)}


# -- the mode -------------------------------------------------------------------------------------------
_MODE_CLASS = None


def guard_mode(guards: list[Guard] = (), probe: tuple[str, str, int | None] | None = None,
               sink: list | None = None):
    """A fresh ``TorchFunctionMode`` that applies ``guards`` (and records the calls of ``probe``: (op,
    path:line, column or None)), each at its call (the column where its expression starts, or every
    call on its line when the column is None), exactly as :func:`fuzz_core.fix_source.patch` writes it; with
    ``sink``, each guarded call's own gradient is checked too (:func:`_backward_check`) and what
    went non-finite is appended there."""
    return _mode_class()(list(guards), probe, sink)


def _mode_class():
    global _MODE_CLASS
    if _MODE_CLASS is not None:
        return _MODE_CLASS
    from torch.overrides import TorchFunctionMode

    from fuzz_core.backends.torch_recorder import LOCATOR
    from fuzz_core.sites import column_of

    def _where() -> str:
        location = LOCATOR.locate(1)
        return position(location, column_of(location))

    class GuardMode(TorchFunctionMode):
        """Applies guards at (op, path:line, column); tags softmax/sigmoid outputs with their inputs."""

        def __init__(self, guards: list[Guard], probe: tuple[str, str, int | None] | None,
                     sink: list | None) -> None:
            super().__init__()
            self.guards = {(g.op, g.location): g for g in guards}
            self.ops = {g.op for g in guards} | ({probe[0]} if probe else set())
            self.probe = probe
            self.calls: list[dict[str, Any]] = []
            self.sink = sink

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            op = FUNCTIONS.get(name)
            if op in self.ops:
                location = LOCATOR.locate(1)
                column = column_of(location)
                if self.probe is not None and self.probe[:2] == (op, location) \
                        and self.probe[2] in (None, column):
                    self.calls.append(_describe_call(op, name, args, kwargs))
                g = self.guards.get((op, location))
                if g is not None and g.column in (None, column):
                    if self.sink is not None:
                        bad = _backward_check(g, func, args, kwargs)
                        if bad is not None:
                            self.sink.append(bad)
                    return _apply(g, func, args, kwargs)
            out = func(*args, **kwargs)
            if name in ("softmax", "sigmoid", "__rsub__"):
                _tag(name, args, kwargs, out, _where)
            return out

    _MODE_CLASS = GuardMode
    return GuardMode


def _apply(g: Guard, func, args, kwargs):
    """The op with its guard: a stable rewrite, or the guarded input changed (in place ops included)."""
    if g.name == "stable_log":
        return _stable_log(g, func, args, kwargs)
    i = 1 if g.op in DIVISOR_SECOND else 0
    if len(args) <= i:
        return func(*args, **kwargs)
    name = func.__name__
    inplace = i == 0 and (name.startswith("__i") or (name.endswith("_") and not name.endswith("__")))
    new = list(args)
    new[i] = _transform(g, args[i])
    if inplace and new[0] is not args[0]:
        func(*new, **kwargs)                 # in place on the guarded copy
        return args[0].copy_(new[0])
    return func(*new, **kwargs)


def _transform(g: Guard, x):
    import torch

    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return x
    p = g.params
    if g.name == "clamp_min":
        return x.clamp_min(p["lo"])
    if g.name == "clamp_max":
        return x.clamp_max(p["hi"])
    if g.name == "clamp":
        return x.clamp(p["lo"], p["hi"])
    if g.name == "abs_min":                  # |x| >= eps with x's sign, as the patch writes it
        return torch.copysign(x.abs().clamp_min(p["eps"]), x)
    return x


def _backward_check(g: Guard, func, args, kwargs) -> dict[str, Any] | None:
    """The guarded call's own gradient, on copies of its inputs, with every mode off (the
    recorder sees none of it): ``d(guarded op)/d(input)`` for each floating-point tensor input,
    upstream gradient one, at the call's own inputs and then with the guarded input at each bound
    of the guard (where the guarded op's derivative is largest: a clamp lets values through up to
    its bound, and the search cannot reach them when the reproducer sits in the clamped region,
    whose gradient is zero). What went non-finite from finite inputs and a finite output (the
    input value where it did, the gradient there), else None. A guard that keeps the forward
    finite can still leave an infinite derivative (``rsqrt`` of an input clamped at tiny:
    ``-0.5 * x ** -1.5`` overflows for every x below 2e-26), which training through the op turns
    into NaN weights. A stable rewrite (``log_softmax``, ``logsigmoid``) is not checked here: it
    has a finite gradient everywhere by construction."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    if g.name == "stable_log":
        return None
    try:
        with torch._C.DisableTorchFunction(), _disable_current_modes(), torch.inference_mode(False), \
                torch.enable_grad():
            bad = _gradient(g, func, args, kwargs, None)
            i = 1 if g.op in DIVISOR_SECOND else 0
            x = args[i] if len(args) > i else None
            if bad is None and isinstance(x, torch.Tensor) and x.is_floating_point():
                for bound in _bounds(g, x):
                    bad = _gradient(g, func, args, kwargs, (i, bound))
                    if bad is not None:
                        break
    except Exception:  # noqa: BLE001 - a call the copy cannot redo (a view written in place, ...): unchecked
        return None
    return bad


def _bounds(g: Guard, x) -> list:
    """The values the guard lets through that are nearest the op's pole: each bound, and the next
    value inside it (a clamp's gradient mask may or may not include the bound itself)."""
    import torch

    p, inf = g.params, float("inf")
    edges = {"clamp_min": [(p.get("lo"), inf)], "clamp_max": [(p.get("hi"), -inf)],
             "clamp": [(p.get("lo"), inf), (p.get("hi"), -inf)],
             "abs_min": [(p.get("eps"), inf), (-p.get("eps", 0.0), -inf)]}.get(g.name, [])
    out = []
    for value, inward in edges:
        if value is None:
            continue
        v = torch.full_like(x.detach(), value)
        out += [v, torch.nextafter(v, torch.full_like(v, inward))]
    return out


def _gradient(g: Guard, func, args, kwargs, at: tuple[int, Any] | None) -> dict[str, Any] | None:
    """One check of :func:`_backward_check` (modes already off): at the call's inputs, or with input
    ``at[0]`` replaced by the tensor ``at[1]``."""
    import torch

    args = list(args)
    if at is not None:
        args[at[0]] = at[1]
    idx = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if not idx:
        return None
    leaves = [args[i].detach().clone().requires_grad_(True) for i in idx]
    if not all(bool(torch.isfinite(x).all()) for x in leaves):
        return None                          # a non-finite input: an earlier op's event, not the guard's
    work = list(args)
    for i, x in zip(idx, leaves):
        work[i] = x.clone()                  # an in-place op writes a copy, never the leaf
    out = _apply(g, func, tuple(work), {k: v for k, v in kwargs.items() if k != "out"})
    if not (isinstance(out, torch.Tensor) and out.requires_grad and bool(torch.isfinite(out).all())):
        return None                          # a non-finite output is the forward check's to report
    grads = torch.autograd.grad(out, leaves, grad_outputs=torch.ones_like(out), allow_unused=True)
    for i, x, gr in zip(idx, leaves, grads):
        if gr is None or bool(torch.isfinite(gr).all()):
            continue
        bad = ~torch.isfinite(gr.reshape(-1))      # a gradient has its input's shape
        k = int(bad.nonzero()[0])
        xv, gv = float(x.detach().reshape(-1)[k]), float(gr.reshape(-1)[k])
        where = (f"at the guard's bound, input {at[0]} = {xv:.8g}" if at is not None and i == at[0]
                 else f"at input {xv:.8g}")
        return {"op": g.op, "function": getattr(func, "__name__", g.op), "location": g.location,
                "column": g.column, "argument": i,
                "input": xv, "gradient": gv, "count": int(bad.sum()), "at_bound": at is not None,
                "explanation": f"non-finite gradient through the guard: d {g.op}/d input {i} = {gv:g} {where} "
                               f"({g.op} at {g.location}; its forward value is finite)"}
    return None


def _stable_log(g: Guard, func, args, kwargs):
    """log of softmax(z) -> log_softmax(z); of sigmoid(z) -> logsigmoid(z); of 1 - sigmoid(z) -> logsigmoid(-z)."""
    import torch
    import torch.nn.functional as F

    src = getattr(args[0], SRC_ATTR, None) if args else None
    if src is None or func.__name__.endswith("_") or "out" in kwargs:
        return func(*args, **kwargs)
    if src[0] == "softmax":
        y = torch.log_softmax(src[1], src[2], dtype=src[3])
    else:
        y = F.logsigmoid(src[1] if src[0] == "sigmoid" else -src[1])
    return y if g.op == "log" else y / math.log(2 if g.op == "log2" else 10)


def _tag(name: str, args, kwargs, out, where) -> None:
    """Leave on softmax / sigmoid / 1 - sigmoid outputs what they were computed from, and where
    (``where()``: the user's ``path:line:col`` of the softmax or sigmoid; last item of the tag)."""
    if not args:
        return
    src = None
    if name == "softmax":
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        src = ("softmax", args[0], dim, kwargs.get("dtype"), where()) if isinstance(dim, int) else None
    elif name == "sigmoid":
        src = ("sigmoid", args[0], where())
    elif len(args) > 1 and isinstance(args[1], (int, float)) and args[1] == 1:
        before = getattr(args[0], SRC_ATTR, None)
        src = (("one_minus_sigmoid", before[1], before[-1]) if before is not None and before[0] == "sigmoid"
               else None)
    if src is not None:
        try:
            setattr(out, SRC_ATTR, src)
        except (AttributeError, TypeError):   # a tensor subclass without a __dict__: no rewrite there
            pass


def _describe_call(op: str, name: str, args, kwargs) -> dict[str, Any]:
    import torch

    i = 1 if op in DIVISOR_SECOND else 0
    x = args[i] if len(args) > i else None
    out: dict[str, Any] = {"function": name, "tensor": isinstance(x, torch.Tensor)}
    if isinstance(x, torch.Tensor):
        out["dtype"] = str(x.dtype).replace("torch.", "")
        src = getattr(x, SRC_ATTR, None)
        out["provenance"] = [src[0], src[-1]] if src else None        # (softmax | ..., where it ran)
    if op == "mvlgamma":
        p = args[1] if len(args) > 1 else kwargs.get("p")
        out["p"] = int(p) if isinstance(p, int) else None
    if op == "pow" and len(args) > 1:
        e = args[1]
        if isinstance(e, torch.Tensor):
            out["exponent"] = float(e.min())
        elif isinstance(e, (int, float)):
            out["exponent"] = float(e)
    return out


def install(runner, make_mode) -> None:
    """Run the runner's program, and its own ``train_step`` (whose forward pass calls the program as the
    closure it is, not ``target.program``), inside ``make_mode()`` (a fresh mode per pass); None removes it."""
    target = runner.target
    for name in ("program", "train_step"):
        original = getattr(target, f"_unguarded_{name}", None) or getattr(target, name)
        setattr(target, f"_unguarded_{name}", original)
        setattr(target, name, original if make_mode is None or original is None else _inside(make_mode, original))


def _inside(make_mode, fn):
    def guarded(batch):
        with make_mode():
            return fn(batch)

    return guarded


# -- probing, verifying ----------------------------------------------------------------------------------
def probe_calls(runner, site: OpSite, inputs: dict[str, np.ndarray], state: dict | None, seed: int,
                probe: tuple[str, str, int | None]) -> list[dict]:
    """The Python-level calls of ``probe`` (op, path:line, column) in one replay of the reproducer."""
    from fuzz_core.engine import confirm

    modes = []

    def make():
        modes.append(guard_mode((), probe=probe))
        return modes[-1]

    install(runner, make)
    try:
        confirm(runner, site, inputs, state, seed)
    finally:
        install(runner, None)
    return [c for m in modes for c in m.calls]


class _Watching:
    """A runner whose evaluations end the search at any qualifying non-finite value of the pass,
    forward or backward: the program's own, or the guarded op's gradient (``sink``)."""

    def __init__(self, runner, sink: list) -> None:
        self._runner = runner
        self._sink = sink

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def evaluate(self, values, site, **kwargs):
        seen = len(self._sink)
        ev = self._runner.evaluate(values, site, **kwargs)
        if len(self._sink) > seen:
            ev.event = True
        if ev.event and not ev.triggered:
            ev.triggered = True
        return ev


def verify(runner, site: OpSite, loaded, guard: Guard, budget: int, strategy: str = "adaptive",
           seed: int = 0, search_weights: bool = False) -> Attempt:
    """Replay the reproducer under ``guard``, then search every suspect op of the guarded program;
    in every pass the guarded op's own gradient is checked as well as the program's values."""
    t0 = time.perf_counter()
    progress: dict[str, Any] = {"steps": 0, "sites": []}
    sink: list[dict[str, Any]] = []
    install(runner, lambda: guard_mode([guard], sink=sink))
    try:
        status, residual = _verify(runner, site, loaded, budget, strategy, seed, search_weights, progress, sink)
    except Exception as exc:  # noqa: BLE001 - the guard broke the program: not a fix
        status = "error"
        residual = {"searched": progress["sites"][-1] if progress["sites"] else "the reproducer itself",
                    "first_op": None, "step": progress["steps"],
                    "explanation": f"the guarded program raised {type(exc).__name__}: {exc}"}
    finally:
        install(runner, None)
        runner.reset()
    return Attempt(guard, status, progress["steps"], progress["sites"], time.perf_counter() - t0, residual)


def _checked(runner, site: OpSite, values, state, seed: int, sink: list) -> tuple[Any, dict[str, Any] | None]:
    """A replay under the guard: its check, and the guarded op's first non-finite gradient in it."""
    from fuzz_core.engine import confirm

    seen = len(sink)
    check = confirm(runner, site, values, state, seed)
    return check, (sink[seen] if len(sink) > seen else None)


def _verify(runner, site: OpSite, loaded, budget: int, strategy: str, seed: int, search_weights: bool,
            progress: dict[str, Any], sink: list) -> tuple[str, dict[str, Any] | None]:
    from fuzz_core.engine import discover_sites, search_site
    from fuzz_core.search import SearchConfig

    check, grad = _checked(runner, site, loaded.inputs, loaded.state, int(loaded.report.get("step_seed", 0)), sink)
    if check.event or grad:
        return "not sufficient", _residual("the reproducer itself", check, 0, loaded.inputs, loaded.state, grad)
    sites = [s for s in discover_sites(runner, seed) if s.searched]
    sites.sort(key=lambda s: (s.op, s.location) != (site.op, site.location))    # the guarded op first
    config = SearchConfig(strategy, max(1, int(budget)), seed, search_weights)
    for s in sites:
        progress["sites"].append(s.label)
        result = search_site(_Watching(runner, sink), s, config)
        progress["steps"] += result.steps
        cand = result.candidate
        if cand is None:
            continue
        check, grad = _checked(runner, s, cand.values, cand.state, cand.seed, sink)
        if check.event or grad:
            return "not sufficient", _residual(s.label, check, cand.step, cand.values, cand.state, grad)
    return "verified", None


def _residual(searched: str, check, step: int, values: dict, state: dict | None,
              grad: dict[str, Any] | None = None) -> dict[str, Any]:
    if grad is not None and not check.event:     # the program stayed finite; the guard's own gradient did not
        first = {"op": grad["op"], "kind": f"{grad['function']} (backward)", "location": grad["location"],
                 "occurrence": 0, "nan": False, "column": grad.get("column")}
        return {"searched": searched, "first_op": first, "step": step, "phase": "backward",
                "weights_nonfinite": False,
                "gradient": {k: grad[k] for k in ("argument", "input", "gradient", "count")},
                "explanation": grad["explanation"], "_values": values, "_state": state}
    first = check.first_op.to_dict() if check.first_op else None
    weights_bad = bool(state) and any(
        k.startswith("model.") and np.issubdtype(np.asarray(v).dtype, np.floating) and not np.isfinite(v).all()
        for k, v in state.items())
    where = f"{first['kind']} at {position_of(first)}" if first else "the program's output"
    why = f"non-finite value at {where}"
    if weights_bad:
        why += (" (the weights went non-finite in the program's training step: the gradient through the guard"
                " is not finite)")
    return {"searched": searched, "first_op": first, "step": step, "phase": check.phase or "forward",
            "weights_nonfinite": weights_bad, "explanation": why, "_values": values, "_state": state}




def suggest_and_verify(finding_folder: Path | str, budget: int = DEFAULT_BUDGET, *, device: str = "cpu",
                       runner=None, roots: tuple[Path | str, ...] = (".",)) -> dict[str, Any]:
    """Suggest guards for a finding, write each as a patch of the user's source (found from
    ``roots``), verify those that have one in order (forward and backward, reproducer and search),
    write the ``fix`` section (and ``fix.diff``: the verified guard's patch); return it."""
    from fuzz_core.backends.base import Precision, RunnerOptions
    from fuzz_core.engine import TargetSpec, build_runner, moved

    folder = Path(finding_folder)
    loaded = load_finding(folder)
    report = loaded.report
    now, moves = moved(report)              # the op is guarded where its line of code sits now
    site = OpSite.from_dict(now["site"])
    target = guarded_op(now, report)
    t = report["target"]
    weights = report.get("trigger") == "weights"
    fix: dict[str, Any] = {"budget": int(budget), "site": site.label, "guarded": target.what,
                           **({"note": target.why} if target.op and target.why else {}),
                           "location": target.location, "source": source_line(target.location) or "",
                           "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if moves:
        fix["moved"] = moves

    def none(why: str, attempts: list[Attempt] = ()) -> dict[str, Any]:
        _clear_diff(folder)
        return _write(folder, report, {**fix, "status": "no suggestion", "attempts": [a.to_dict() for a in attempts],
                                       "recommended": None, "diff": None,
                                       "message": f"no fix for the {target.what}: {why}."})

    if framework_of(report) != "torch":
        return none(TF_WHY)
    if target.op is None:
        return none(target.why)
    if runner is None:
        runner = build_runner(TargetSpec.from_dict(t), RunnerOptions(device=device, search_weights=weights,
                                                                     precision=Precision.from_dict(report.get("precision"))))
    calls = probe_calls(runner, site, loaded.inputs, loaded.state, int(report.get("step_seed", 0)),
                        (target.op, target.location, target.column))
    if not calls:
        return none("it is not called from Python code (it runs inside a fused or C++ function called there), "
                    "so no guard at that call reaches it")
    attempts = _attempts(suggest(target.op, target.location, _merge(calls), target.column), roots,
                         lambda guard: verify(runner, site, loaded, guard, budget, report.get("strategy", "adaptive"),
                                              int(t.get("seed", 0)), weights))
    tried = [a for a in attempts if a.status != "no patch"]
    if not tried:
        return none(f"no guard can be written as a patch of its line, as {attempts[-1].why}" if attempts else
                    f"there is no guard for {target.op}", attempts)
    return _write(folder, report, {**fix, **_verdict(folder, target, attempts, budget), "probe": calls[:8]})


def _verdict(folder: Path, target: Guarded, attempts: list[Attempt], budget: int) -> dict[str, Any]:
    """The ``fix`` section's verdict when guards were tried: the first verified one, with its patch
    (written to ``fix.diff``), or none and what the last one tried still let through."""
    tried = [a for a in attempts if a.status != "no patch"]
    good = next((a for a in tried if a.status == "verified"), None)
    saved = [_saved(folder, i, a) for i, a in enumerate(attempts)]
    if good is None:
        last = tried[-1]
        res = last.residual or {}
        what = res.get("explanation") if last.status == "error" else (
            f"a {res.get('explanation')} remains (found in {res.get('searched')}, step {res.get('step')})")
        _clear_diff(folder)
        return {"status": "not sufficient", "recommended": None, "diff": None, "diff_file": None,
                "message": (f"no fix for the {target.what}: {len(tried)} guard(s) tried and none keeps the program "
                            f"finite; with {last.guard.description}: {what}."),
                "checked": {"replay": "forward and backward", "steps": None, "sites": None}, "attempts": saved}
    replayed = ("replayed the finding's input under the guard: finite forward and backward (the guarded op's "
                "gradient also at the guard's bounds)")
    if good.guard.name == "stable_log":
        replayed = ("replayed the finding's input under the rewrite: finite forward (log_softmax and logsigmoid "
                    "have a finite gradient everywhere)")
    searched = (f"searched {good.steps} steps over {len(good.sites)} suspect op(s) of the guarded program (at most "
                f"{budget} each) for another trigger, forward and backward: none" if good.sites else
                "the guarded program has no suspect op left to search (0 steps searched)")
    note = f" ({target.why})" if target.why else ""
    (folder / DIFF_FILE).write_text(good.patch["diff"], encoding="utf-8")
    return {"status": "verified", "message": f"verified ({good.guard.description}): {replayed}; {searched}{note}",
            "recommended": good.guard.to_dict(), "diff": good.patch["diff"], "diff_file": DIFF_FILE,
            "checked": {"replay": "forward and backward", "steps": good.steps, "sites": len(good.sites)},
            "attempts": saved}


def _attempts(guards: list[Guard], roots: tuple[Path | str, ...], check) -> list[Attempt]:
    """Each guard written as a patch (one that cannot be is not tried: its attempt says why) and
    ``check``-ed in order, up to the first verified; when what a guard still lets through is another
    call of its op on its line, the guards from there on are at every call on the line."""
    attempts: list[Attempt] = []
    queue, line_wide = list(guards), False
    while queue:
        guard = queue.pop(0)
        if line_wide and guard.column is not None:
            guard = replace(guard, column=None, description=f"{guard.description}, at every {guard.op} on its line")
        written, why = patch(guard, roots)
        if written is None:
            attempts.append(Attempt(guard, "no patch", 0, [], 0.0, why=why))
            continue
        attempt = check(replace(guard, code=written["after"]))
        attempt.patch = written
        attempts.append(attempt)
        log.info("fix %s at %s: %s in %d steps", guard.description, guard.position, attempt.status, attempt.steps)
        if attempt.status == "verified":
            break
        if not line_wide and guard.column is not None and _same_line(attempt, guard):
            line_wide = True
            queue.insert(0, guard)
    return attempts


def _same_line(attempt: Attempt, guard: Guard) -> bool:
    """What still went non-finite under ``guard`` is another call of its op on its line."""
    first = (attempt.residual or {}).get("first_op") or {}
    return (first.get("location") == guard.location and first.get("column") not in (None, guard.column)
            and _forward(str(first.get("op", ""))) == guard.op)



def framework_of(report: dict[str, Any]) -> str:
    """The framework of a finding: its target's, else the one its versions name (a campaign may leave
    ``framework`` out: it is then inferred from the Target the factory returned)."""
    named = (report.get("target") or {}).get("framework")
    if named:
        return str(named)
    versions = report.get("versions") or {}
    return "tensorflow" if "tensorflow" in versions and "torch" not in versions else "torch"


def _clear_diff(folder: Path) -> None:
    """No verified guard: a ``fix.diff`` of an earlier verdict goes."""
    (folder / DIFF_FILE).unlink(missing_ok=True)


def _merge(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """One description of the calls at a location: the first dtype, their provenance when every call
    has the same (a stable rewrite then covers them all), the lowest exponent of a pow, an mvlgamma's p."""
    tensors = [c for c in calls if c.get("tensor")]
    provenance = [tuple(c["provenance"]) if c.get("provenance") else None for c in tensors]
    exponents = [c["exponent"] for c in calls if c.get("exponent") is not None]
    ps = [c["p"] for c in calls if c.get("p") is not None]
    return {"dtype": tensors[0]["dtype"] if tensors else "float32",
            "provenance": sorted(set(provenance)) if provenance and None not in provenance else [],
            "exponent": min(exponents) if exponents else None, "p": max(ps) if ps else None}


def _saved(folder: Path, i: int, attempt: Attempt) -> dict[str, Any]:
    d = attempt.to_dict()
    res = d.get("residual")
    if res and "_values" in res:
        name = f"fix-residual-{i}.safetensors"
        atomic_save_arrays(folder / name, value_arrays(res.pop("_values"), res.pop("_state")))
        res["values"] = name
    return d


def _write(folder: Path, report: dict[str, Any], section: dict[str, Any]) -> dict[str, Any]:
    report = dict(report)
    report["fix"] = section
    atomic_write_json(folder / REPORT, report)
    return section
