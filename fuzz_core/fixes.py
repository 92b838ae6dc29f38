"""Fix suggestions: a guard at the op of a finding, verified by searching the guarded program again.

For a finding, :func:`suggest` proposes guards at its op, in the order a reviewer would try
them (a stable rewrite where the op's input shows where it came from, then the smallest clamp
that keeps the op in its domain, then one with a margin): ``log`` of a ``softmax`` becomes
``log_softmax``, ``log`` of ``sigmoid`` / ``1 - sigmoid`` becomes ``logsigmoid``, ``log``,
``rsqrt``, ``xlogy`` clamp their input to >= tiny (then >= eps), ``div`` / ``reciprocal`` /
``remainder`` keep ``|divisor| >= eps`` with the divisor's sign, ``sqrt`` clamps to >= 0 (then
eps), ``exp`` to <= ln(max) (then ln(max) - ln(2**20)), ``acos`` / ``asin`` into [-1, 1],
``atanh`` / ``erfinv`` into (-1, 1), ``acosh`` to >= 1 (then 1 + eps), ``pow`` its base to >= 0 (>= tiny for
a negative exponent), ``logit`` / ``ndtri`` into (0, 1). Poles (``lgamma``, ``digamma``) get none.

A guard is applied above autograd by a ``torch.overrides.TorchFunctionMode`` that intercepts
the same op at the same user location (``path:line``, found on the stack as the recorder
finds it), so the gradient goes through the guard too, and the program's source is not
edited. :func:`verify` replays the reproducer under the guard, then searches every suspect
op of the guarded program (the guarded site first) with the finding's strategy and seed, up
to a budget per site, stopping at the first qualifying non-finite value anywhere in a pass
(not only at the searched op: a clamp at 1e-45 leaves a log of -103 that a later op may turn
into an overflow). In every pass the guarded call's own gradient is checked as well, even in a
program that never calls backward: ``rsqrt(x.clamp_min(tiny))`` is finite at x = 2e-38 but its
gradient is -inf there, so it is not a fix. :func:`suggest_and_verify` tries the guards in
order and writes a ``fix`` section into ``finding.json``: ``verified`` (the reproducer finite
forward and backward under the guard, and no other trigger in the N steps searched) with the
guard to use and its patch of the user's source line (``diff``, also ``fix.diff``), or ``not
sufficient`` with what each guard still let through (a residual finding, its values saved next
to the report as ``fix-residual-<i>.safetensors``), or ``no suggestion``.

Only the PyTorch backend has guards (:data:`TF_WHY` says why; a TensorFlow finding gets a guard
to write by hand, not verified); torch is imported lazily, as the rest of fuzz_core does.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from fuzz_core.findings import REPORT, load_finding, value_arrays
from fuzz_core.io import atomic_save_arrays, atomic_write_json
from fuzz_core.sites import OpSite, source_line

log = logging.getLogger(__name__)

DEFAULT_BUDGET = 200            # steps per searched site
EXP_HEADROOM = 20 * math.log(2)  # the second exp guard leaves room for sums of 2**20 terms
SRC_ATTR = "_cdeepfuzz_src"      # provenance tag left on softmax / sigmoid outputs while a mode runs

# Python-level function names (torch.*, Tensor.*, dunders, F.*) of each guarded op.
FUNCTIONS: dict[str, str] = {}
for _op, _names in {
    "log": "log log_", "log2": "log2 log2_", "log10": "log10 log10_", "log1p": "log1p log1p_",
    "xlogy": "xlogy xlogy_ special_xlogy",
    "div": "div div_ divide divide_ true_divide true_divide_ floor_divide floor_divide_ __truediv__ "
           "__itruediv__ __floordiv__ __ifloordiv__ __div__ __idiv__",
    "reciprocal": "reciprocal reciprocal_ __rdiv__ __rtruediv__",
    "remainder": "remainder remainder_ fmod fmod_ __mod__ __imod__",
    "sqrt": "sqrt sqrt_", "rsqrt": "rsqrt rsqrt_", "exp": "exp exp_", "expm1": "expm1 expm1_",
    "pow": "pow pow_ __pow__ __ipow__ float_power float_power_",
    "acos": "acos acos_ arccos arccos_", "asin": "asin asin_ arcsin arcsin_",
    "atanh": "atanh atanh_ arctanh arctanh_", "acosh": "acosh acosh_ arccosh arccosh_",
    "erfinv": "erfinv erfinv_ special_erfinv", "logit": "logit logit_ special_logit", "ndtri": "special_ndtri",
}.items():
    FUNCTIONS.update({n: _op for n in _names.split()})
_DIVISOR_SECOND = {"div", "remainder", "xlogy"}     # the guarded input is args[1]; else args[0]


@dataclass(frozen=True)
class Guard:
    """One change at one op, at one user location."""

    name: str                    # clamp_min | clamp_max | clamp | abs_min | stable_log
    op: str
    location: str                # repo-relative path:line
    params: dict[str, float] = field(default_factory=dict)
    description: str = ""
    code: str = ""               # what to write in the source instead

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Guard":
        return cls(d["name"], d["op"], d["location"], dict(d.get("params") or {}), d.get("description", ""),
                   d.get("code", ""))


@dataclass
class Attempt:
    guard: Guard
    status: str                  # verified | not sufficient | error (the guarded program raised)
    steps: int
    sites: list[str]
    seconds: float
    residual: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"guard": self.guard.to_dict(), "status": self.status, "steps": self.steps, "sites": self.sites,
                "seconds": round(self.seconds, 3), "residual": self.residual}


# -- suggestions ---------------------------------------------------------------------------------------
def suggest(op: str, location: str, probe: dict[str, Any]) -> list[Guard]:
    """Guards for ``op`` at ``location``, most specific first; ``probe`` is what :func:`probe_calls`
    saw there (dtype of the guarded input, its provenance, the exponent of a pow)."""
    finfo = _finfo(probe.get("dtype", "float32"))
    tiny, eps, big = finfo["tiny"], finfo["eps"], finfo["max"]
    fn = {"div": "a / b", "remainder": "torch.remainder(a, b)", "xlogy": "torch.xlogy(x, y)"}.get(op, f"torch.{op}(x)")
    arg = "b" if op in ("div", "remainder") else "y" if op == "xlogy" else "x"

    def clamp(name: str, why: str, **params: float) -> Guard:
        call = {"clamp_min": f"{arg}.clamp_min({params.get('lo', 0):.8g})",
                "clamp_max": f"{arg}.clamp_max({params.get('hi', 0):.8g})",
                "clamp": f"{arg}.clamp({params.get('lo', 0):.8g}, {params.get('hi', 0):.8g})",
                "abs_min": f"torch.where({arg}.abs() < {params.get('eps', 0):.8g}, "
                           f"torch.copysign(torch.full_like({arg}, {params.get('eps', 0):.8g}), {arg}), {arg})"}[name]
        return Guard(name, op, location, params, why, fn.replace(arg, call, 1) if arg in fn else call)

    guards: list[Guard] = []
    sources = probe.get("provenance") or []
    if op in ("log", "log2", "log10") and sources:
        scale = "" if op == "log" else f" / math.log({2 if op == 'log2' else 10})"
        what = " and ".join(f"{_STABLE[s][0]} ({_STABLE[s][1]}{scale})" for s in sources)
        guards.append(Guard("stable_log", op, location, {}, f"compute in log space: {what}",
                            "; ".join(_STABLE[s][1] + scale for s in sources)))
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
        guards += [clamp("clamp_max", f"clamp the input to <= ln(max) ({top:.6g})", hi=top * (1 - eps)),
                   clamp("clamp_max", f"clamp the input to <= ln(max) - ln(2**20) ({top - EXP_HEADROOM:.6g})",
                         hi=top - EXP_HEADROOM)]
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
    return guards


_STABLE = {"softmax": ("log of a softmax", "torch.log_softmax(z, dim)"),
           "sigmoid": ("log of a sigmoid", "F.logsigmoid(z)"),
           "one_minus_sigmoid": ("log of 1 - sigmoid", "F.logsigmoid(-z)")}


def _finfo(dtype: str) -> dict[str, float]:
    import torch

    dt = getattr(torch, str(dtype).replace("torch.", ""), torch.float32)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        dt = torch.get_default_dtype()
    fi = torch.finfo(dt)
    return {"tiny": float(fi.tiny), "eps": float(fi.eps), "max": float(fi.max)}


# -- the mode -------------------------------------------------------------------------------------------
_MODE_CLASS = None


def guard_mode(guards: list[Guard] = (), probe: tuple[str, str] | None = None, sink: list | None = None):
    """A fresh ``TorchFunctionMode`` that applies ``guards`` (and records calls at ``probe``); with
    ``sink``, each guarded call's own gradient is checked too (:func:`_backward_check`) and what
    went non-finite is appended there."""
    return _mode_class()(list(guards), probe, sink)


def _mode_class():
    global _MODE_CLASS
    if _MODE_CLASS is not None:
        return _MODE_CLASS
    from torch.overrides import TorchFunctionMode

    from fuzz_core.backends.torch_recorder import LOCATOR

    class GuardMode(TorchFunctionMode):
        """Applies guards at (op, path:line); tags softmax/sigmoid outputs with their inputs."""

        def __init__(self, guards: list[Guard], probe: tuple[str, str] | None, sink: list | None) -> None:
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
                if self.probe == (op, location):
                    self.calls.append(_describe_call(op, name, args))
                g = self.guards.get((op, location))
                if g is not None:
                    if self.sink is not None:
                        bad = _backward_check(g, func, args, kwargs)
                        if bad is not None:
                            self.sink.append(bad)
                    return _apply(g, func, args, kwargs)
            out = func(*args, **kwargs)
            _tag(name, args, kwargs, out)
            return out

    _MODE_CLASS = GuardMode
    return GuardMode


def _apply(g: Guard, func, args, kwargs):
    """The op with its guard: a stable rewrite, or the guarded input changed (in place ops included)."""
    if g.name == "stable_log":
        return _stable_log(g, func, args, kwargs)
    i = 1 if g.op in _DIVISOR_SECOND else 0
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
    if g.name == "abs_min":
        return torch.where(x.abs() < p["eps"], torch.copysign(torch.full_like(x, p["eps"]), x), x)
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
            i = 1 if g.op in _DIVISOR_SECOND else 0
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
        return {"op": g.op, "function": getattr(func, "__name__", g.op), "location": g.location, "argument": i,
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


def _tag(name: str, args, kwargs, out) -> None:
    """Leave on softmax / sigmoid / 1 - sigmoid outputs what they were computed from."""
    if name not in ("softmax", "sigmoid", "__rsub__") or not args:
        return
    src = None
    if name == "softmax":
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        src = ("softmax", args[0], dim, kwargs.get("dtype")) if isinstance(dim, int) else None
    elif name == "sigmoid":
        src = ("sigmoid", args[0])
    elif len(args) > 1 and isinstance(args[1], (int, float)) and args[1] == 1:
        before = getattr(args[0], SRC_ATTR, None)
        src = ("one_minus_sigmoid", before[1]) if before is not None and before[0] == "sigmoid" else None
    if src is not None:
        try:
            setattr(out, SRC_ATTR, src)
        except (AttributeError, TypeError):   # a tensor subclass without a __dict__: no rewrite there
            pass


def _describe_call(op: str, name: str, args) -> dict[str, Any]:
    import torch

    i = 1 if op in _DIVISOR_SECOND else 0
    x = args[i] if len(args) > i else None
    out: dict[str, Any] = {"function": name, "tensor": isinstance(x, torch.Tensor)}
    if isinstance(x, torch.Tensor):
        out["dtype"] = str(x.dtype).replace("torch.", "")
        src = getattr(x, SRC_ATTR, None)
        out["provenance"] = src[0] if src else None
    if op == "pow" and len(args) > 1:
        e = args[1]
        if isinstance(e, torch.Tensor):
            out["exponent"] = float(e.min())
        elif isinstance(e, (int, float)):
            out["exponent"] = float(e)
    return out


def install(runner, make_mode) -> None:
    """Run the runner's program inside ``make_mode()`` (a fresh mode per pass); None removes it."""
    target = runner.target
    program = getattr(target, "_unguarded_program", None) or target.program
    target._unguarded_program = program
    if make_mode is None:
        target.program = program
        return

    def guarded(batch):
        with make_mode():
            return program(batch)

    target.program = guarded


# -- probing, verifying ----------------------------------------------------------------------------------
def probe_calls(runner, site: OpSite, inputs: dict[str, np.ndarray], state: dict | None, seed: int) -> list[dict]:
    """The Python-level calls of the site's op at its location, in one replay of the reproducer."""
    from fuzz_core.engine import confirm

    modes = []

    def make():
        modes.append(guard_mode((), probe=(site.op, site.location)))
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
                 "occurrence": 0, "nan": False}
        return {"searched": searched, "first_op": first, "step": step, "phase": "backward",
                "weights_nonfinite": False,
                "gradient": {k: grad[k] for k in ("argument", "input", "gradient", "count")},
                "explanation": grad["explanation"], "_values": values, "_state": state}
    first = check.first_op.to_dict() if check.first_op else None
    weights_bad = bool(state) and any(
        k.startswith("model.") and np.issubdtype(np.asarray(v).dtype, np.floating) and not np.isfinite(v).all()
        for k, v in state.items())
    where = f"{first['kind']} at {first['location']}" if first else "the program's output"
    why = f"non-finite value at {where}"
    if weights_bad:
        why += (" (the weights went non-finite in the program's training step: the gradient through the guard"
                " is not finite)")
    return {"searched": searched, "first_op": first, "step": step, "phase": check.phase or "forward",
            "weights_nonfinite": weights_bad, "explanation": why, "_values": values, "_state": state}


# -- the guard as a patch of the user's source line --------------------------------------------------------
_MODULES = {"torch", "torch.special", "torch.nn.functional", "F", "nn.functional", "special", "th"}


def split_location(location: str) -> tuple[str, int, int | None]:
    """``path:line`` (or ``path:line:col``) as (path, line, col); line 0 when there is none."""
    parts = str(location).rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], int(parts[1]), int(parts[2])
    path, _, line = str(location).rpartition(":")
    return (path, int(line), None) if line.isdigit() else (str(location), 0, None)


def source_patch(guard: Guard, roots: tuple[Path | str, ...] = (".",)) -> dict[str, Any] | None:
    """The guard written into the user's source: every call of ``guard.op`` on its line rewritten as
    the mode applies it (the mode guards every call of the op at ``path:line``), as a unified diff
    of the file (``a/<path>`` ``b/<path>``, for ``git apply``). None when the file is not found from
    ``roots`` or no call on the line can be rewritten (a call through a variable, a stable rewrite
    whose softmax is on another line, a statement over several lines): then the guard's ``code``
    shows what to write."""
    import ast
    import difflib

    path, line, col = split_location(guard.location)
    if not line:
        return None
    file = next((Path(r) / path for r in roots if (Path(r) / path).is_file()), None)
    if file is None:
        return None
    try:
        text = file.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    lines = text.splitlines(keepends=True)
    if line > len(lines):
        return None
    raw = lines[line - 1]
    body = raw.rstrip("\r\n").encode("utf-8")
    matches = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) == line and getattr(node, "end_lineno", None) == line:
            m = _match(guard, node)
            if m is not None:
                matches.append((node.col_offset, node.end_col_offset, m))
    if not matches:
        return None

    def render(lo: int, hi: int) -> str:
        out, pos = [], lo
        for start, end, m in sorted(matches, key=lambda t: (t[0], -t[1])):
            if start >= pos and end <= hi and (start, end) != (lo, hi):
                out += [body[pos:start].decode("utf-8"), m(render, body)]
                pos = end
        out.append(body[pos:hi].decode("utf-8"))
        return "".join(out)

    after = render(0, len(body))
    if after == body.decode("utf-8"):
        return None
    new = raw.replace(body.decode("utf-8"), after, 1)
    diff = "".join(difflib.unified_diff(lines, lines[:line - 1] + [new] + lines[line:], f"a/{path}", f"b/{path}", n=1))
    if not diff.endswith("\n"):
        diff += "\n\\ No newline at end of file\n"
    return {"path": path, "line": line, "before": raw.strip(), "after": new.strip(), "diff": diff}


def _dotted(node) -> str:
    import ast

    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _match(guard: Guard, node):
    """For a node that is a call of ``guard.op``: a function ``(render, body) -> rewritten text``."""
    import ast

    op, p = guard.op, guard.params
    seg = lambda n: (n.col_offset, n.end_col_offset)  # noqa: E731
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if FUNCTIONS.get(name, FUNCTIONS.get(f"special_{name}")) != op and name != op:
            return None
        method = isinstance(func, ast.Attribute) and _dotted(func.value) not in _MODULES
        inplace = method and name.endswith("_") and not name.endswith("__")
        if guard.name == "stable_log":
            return _match_stable(guard, node)
        if method and op not in _DIVISOR_SECOND:
            arg = func.value
        else:
            i = 0 if method else (1 if op in _DIVISOR_SECOND else 0)
            arg = node.args[i] if len(node.args) > i else None
            if arg is None:
                arg = next((k.value for k in node.keywords if k.arg in (("other",) if i else ("input", "self"))),
                           None)
            inplace = False
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and guard.name != "stable_log":
        left = node.left if isinstance(node, ast.BinOp) else node.target
        right = node.value if isinstance(node, ast.AugAssign) else node.right
        number = isinstance(left, ast.Constant) and isinstance(left.value, (int, float))
        kind = {ast.Div: "reciprocal" if number else "div", ast.FloorDiv: "div", ast.Mod: "remainder",
                ast.Pow: "pow"}.get(type(node.op))
        if kind != op:
            return None
        arg, inplace = (left if op == "pow" else right), False
        if isinstance(node, ast.AugAssign) and op == "pow":
            return None                      # x **= e: the base is the target itself
    else:
        return None
    if arg is None or (isinstance(arg, ast.Constant) and isinstance(arg.value, (int, float))):
        return None                          # a Python number: the guard leaves it as it is
    simple = isinstance(arg, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
    if inplace and not simple:
        return None
    a0, a1 = seg(arg)
    n0, n1 = seg(node)

    def rewrite(render, body) -> str:
        a = render(a0, a1)
        x = a if simple else f"({a})"
        if guard.name == "clamp_min":
            g = f"{x}.clamp_min{'_' if inplace else ''}({p['lo']:.8g})"
        elif guard.name == "clamp_max":
            g = f"{x}.clamp_max{'_' if inplace else ''}({p['hi']:.8g})"
        elif guard.name == "clamp":
            g = f"{x}.clamp{'_' if inplace else ''}({p['lo']:.8g}, {p['hi']:.8g})"
        elif guard.name == "abs_min" and not inplace:
            e = f"{p['eps']:.8g}"
            g = f"torch.where({x}.abs() < {e}, torch.copysign(torch.full_like({x}, {e}), {x}), {x})"
        else:
            g = a
        return render(n0, a0) + g + render(a1, n1)

    return rewrite


def _match_stable(guard: Guard, node):
    """``log(softmax(z, d))`` -> ``log_softmax(z, d)``, ``log(sigmoid(z))`` -> ``logsigmoid(z)``,
    ``log(1 - sigmoid(z))`` -> ``logsigmoid(-z)``, when the softmax / sigmoid is in the same call."""
    import ast

    func = node.func
    method = isinstance(func, ast.Attribute) and _dotted(func.value) not in _MODULES
    arg = func.value if method else (node.args[0] if node.args else None)
    scale = "" if guard.op == "log" else f" / {math.log(2 if guard.op == 'log2' else 10)!r}"

    def called(n, names):
        if isinstance(n, ast.Call):
            f = n.func
            nm = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if nm in names:
                m = isinstance(f, ast.Attribute) and _dotted(f.value) not in _MODULES
                return n, m
        return None

    negate = False
    inner = called(arg, ("softmax",))
    if inner is None:
        inner = called(arg, ("sigmoid",))
        if inner is None and isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Sub) \
                and isinstance(arg.left, ast.Constant) and arg.left.value == 1:
            inner, negate = called(arg.right, ("sigmoid",)), True
        if inner is None:
            return None
    call, m = inner
    n0, n1 = node.col_offset, node.end_col_offset

    def rewrite(render, body) -> str:
        name = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id
        if name == "softmax":
            f0 = call.func.end_col_offset - len("softmax")
            g = render(call.col_offset, f0) + "log_softmax" + render(call.func.end_col_offset, call.end_col_offset)
        else:
            z = call.func.value if m else (call.args[0] if call.args else None)
            if z is None:
                return render(n0, n1)
            zt = render(z.col_offset, z.end_col_offset)
            if negate:
                zt = f"-{zt}" if isinstance(z, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) else f"-({zt})"
            g = f"torch.nn.functional.logsigmoid({zt})"
        return g + scale

    return rewrite


DIFF_FILE = "fix.diff"            # the recommended guard as a patch, in the finding folder
TF_WHY = ("guards are implemented for PyTorch programs only: CDeepFuzz applies a guard without editing the "
          "program, by intercepting the op's call at its source line above autograd (PyTorch's "
          "TorchFunctionMode); TensorFlow has no such hook for eager and tf.function code alike, so a guard "
          "there has to be written into the source by hand, then `cdeepfuzz replay FINDING` checks it")
# What to write by hand in a TensorFlow program (not verified by CDeepFuzz): eps, not tiny, keeps the
# gradient finite too (d rsqrt/dx at tiny overflows).
TF_HINTS = {
    "log": "tf.math.log(tf.maximum(x, eps))", "log2": "tf.math.log(tf.maximum(x, eps)) / math.log(2.0)",
    "log10": "tf.math.log(tf.maximum(x, eps)) / math.log(10.0)", "log1p": "tf.math.log1p(tf.maximum(x, -1 + eps))",
    "sqrt": "tf.sqrt(tf.maximum(x, eps))", "rsqrt": "tf.math.rsqrt(tf.maximum(x, eps))",
    "xlogy": "tf.math.xlogy(x, tf.maximum(y, eps))",
    "div": "a / tf.where(tf.abs(b) < eps, tf.where(b < 0, -eps, eps), b)",
    "reciprocal": "1 / tf.where(tf.abs(x) < eps, tf.where(x < 0, -eps, eps), x)",
    "exp": "tf.exp(tf.minimum(x, math.log(dtype_max) - 20 * math.log(2.0)))",
    "acos": "tf.acos(tf.clip_by_value(x, -1 + eps, 1 - eps))",
    "asin": "tf.asin(tf.clip_by_value(x, -1 + eps, 1 - eps))",
    "atanh": "tf.atanh(tf.clip_by_value(x, -1 + eps, 1 - eps))", "acosh": "tf.acosh(tf.maximum(x, 1 + eps))",
    "pow": "tf.pow(tf.maximum(x, eps), e)",
}


def suggest_and_verify(finding_folder: Path | str, budget: int = DEFAULT_BUDGET, *, device: str = "cpu",
                       runner=None, roots: tuple[Path | str, ...] = (".",)) -> dict[str, Any]:
    """Suggest guards for a finding, verify them in order (forward and backward, reproducer and
    search), write the ``fix`` section (and ``fix.diff``: the recommended guard as a patch of the
    user's source, found from ``roots``); return it."""
    from fuzz_core.backends.base import Precision, RunnerOptions
    from fuzz_core.engine import TargetSpec, build_runner, moved

    folder = Path(finding_folder)
    loaded = load_finding(folder)
    report = loaded.report
    now, moves = moved(report)              # the op is guarded where its line of code sits now
    site = OpSite.from_dict(now["site"])
    t = report["target"]
    weights = report.get("trigger") == "weights"
    fix: dict[str, Any] = {"budget": int(budget), "site": site.label, "location": site.location,
                           "source": source_line(site.location) or "",
                           "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if moves:
        fix["moved"] = moves
    if (t.get("framework") or "torch") != "torch":
        hint = TF_HINTS.get(site.op)
        return _write(folder, report, {**fix, "status": "no suggestion", "attempts": [], "recommended": None,
                                       "diff": None, "hint": hint,
                                       "message": f"no suggestion: {TF_WHY}"
                                                  + (f"; for example (not verified): {hint}" if hint else "")})
    if runner is None:
        runner = build_runner(TargetSpec.from_dict(t), RunnerOptions(device=device, search_weights=weights,
                                                                     precision=Precision.from_dict(report.get("precision"))))
    calls = probe_calls(runner, site, loaded.inputs, loaded.state, int(report.get("step_seed", 0)))
    guards = suggest(site.op, site.location, _merge(calls)) if calls else []
    if not guards:
        why = (f"the {site.op} at {site.location} is not called from Python (it runs inside a fused or C++ "
               f"function), so no function-level guard reaches it" if not calls else f"no guard for {site.op}")
        return _write(folder, report, {**fix, "status": "no suggestion", "attempts": [], "recommended": None,
                                       "diff": None, "message": f"no suggestion: {why}"})
    attempts = []
    for guard in guards:
        attempt = verify(runner, site, loaded, guard, budget, report.get("strategy", "adaptive"),
                         int(t.get("seed", 0)), weights)
        attempts.append(attempt)
        log.info("fix %s for %s: %s in %d steps", guard.description, site.label, attempt.status, attempt.steps)
        if attempt.status == "verified":
            break
    good = next((a for a in attempts if a.status == "verified"), None)
    replayed = ("replayed the finding's input under the guard: finite forward and backward (the guarded op's "
                "gradient also at the guard's bounds)")
    if good is not None and good.guard.name == "stable_log":
        replayed = ("replayed the finding's input under the rewrite: finite forward (log_softmax and logsigmoid "
                    "have a finite gradient everywhere)")
    if good is not None and not good.sites:
        message = (f"verified ({good.guard.description}): {replayed}; the guarded program has no suspect op "
                   f"left to search (0 steps searched)")
    elif good is not None:
        message = (f"verified ({good.guard.description}): {replayed}; searched {good.steps} steps over "
                   f"{len(good.sites)} suspect op(s) of the guarded program (at most {budget} each) for another "
                   f"trigger, forward and backward: none")
    else:
        last = attempts[-1]
        res = last.residual or {}
        what = res.get("explanation") if last.status == "error" else (
            f"a {res.get('explanation')} remains (found in {res.get('searched')}, step {res.get('step')})")
        message = f"not sufficient: {len(attempts)} guard(s) tried; with {last.guard.description}: {what}"
    patches = [source_patch(a.guard, roots) for a in attempts]
    saved = [_saved(folder, i, a) for i, a in enumerate(attempts)]
    for d, patch in zip(saved, patches):
        d["diff"] = patch["diff"] if patch else None
    diff = patches[attempts.index(good)] if good is not None else None
    diff_file = folder / DIFF_FILE
    if diff:
        diff_file.write_text(diff["diff"], encoding="utf-8")
    elif diff_file.exists():
        diff_file.unlink()                   # a stale patch of an earlier verdict
    section = {**fix, "status": "verified" if good else "not sufficient", "message": message,
               "recommended": good.guard.to_dict() if good else None, "probe": calls[:8],
               "checked": {"replay": "forward and backward", "steps": good.steps if good else None,
                           "sites": len(good.sites) if good else None},
               "diff": diff["diff"] if diff else None, "diff_file": DIFF_FILE if diff else None,
               "attempts": saved}
    return _write(folder, report, section)


def _merge(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """One description of the calls at a location: the first dtype, their provenances when every
    call has one (a stable rewrite then covers them all), the lowest exponent of a pow."""
    tensors = [c for c in calls if c.get("tensor")]
    provenance = [c.get("provenance") for c in tensors]
    exponents = [c["exponent"] for c in calls if c.get("exponent") is not None]
    return {"dtype": tensors[0]["dtype"] if tensors else "float32",
            "provenance": sorted(set(provenance)) if provenance and None not in provenance else [],
            "exponent": min(exponents) if exponents else None}


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
