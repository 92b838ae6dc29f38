"""A guard, and the guard written into the user's source as a patch ``git apply`` takes.

A :class:`Guard` changes one op at one user call: the call of ``op`` at ``location`` (``path:line``)
whose expression starts at ``column`` (every call of the op on the line when the column is unknown).
:mod:`fuzz_core.fixes` applies it at run time, above autograd, to verify it; :func:`patch` writes the
same change into the file, with the names the line itself holds: the op's own input expression is
clamped (``torch.log(p)`` -> ``torch.log(p.clamp_min(1.1920929e-07))``, ``a / (b - c)`` ->
``a / torch.copysign((b - c).abs().clamp_min(1.1920929e-07), (b - c))``), and a stable rewrite is
written only where the softmax or sigmoid is inside the log's call on that line
(``torch.log(torch.softmax(z, 1))`` -> ``torch.log_softmax(z, 1)``). No name is ever made up: where
the right change needs one the line does not hold, :func:`patch` says so instead of a patch.

The patch is a unified diff of the file as it is (``a/<path>``, ``b/<path>``, paths relative to the
folder ``cdeepfuzz fix`` runs in), so ``git apply`` or ``patch -p1`` applies it there.
"""
from __future__ import annotations

import ast
import difflib
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

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
    "mvlgamma": "mvlgamma mvlgamma_ special_multigammaln",
}.items():
    FUNCTIONS.update({n: _op for n in _names.split()})
DIVISOR_SECOND = {"div", "remainder", "xlogy"}     # the guarded input is args[1]; else args[0]
# What a dotted prefix of a call names: a module (``torch.log(x)``: x is the argument), else a tensor
# (``x.log()``: x is the input).
MODULES = {"torch", "torch.special", "torch.nn.functional", "F", "nn.functional", "special", "th",
           "torch.Tensor", "Tensor"}


@dataclass(frozen=True)
class Guard:
    """One change at one op, at one user call."""

    name: str                    # clamp_min | clamp_max | clamp | abs_min | stable_log
    op: str
    location: str                # repo-relative path:line
    params: dict[str, float] = field(default_factory=dict)
    description: str = ""
    code: str = ""               # the guarded line as the patch writes it ("" until a patch is written)
    column: int | None = None    # 1-based column where the call's expression starts (None: every call on the line)
    source: str = ""             # stable_log: what the log's input was (softmax | sigmoid | one_minus_sigmoid)
    origin: str = ""             # stable_log: where that softmax / sigmoid was computed (path:line:col)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Guard":
        return cls(d["name"], d["op"], d["location"], dict(d.get("params") or {}), d.get("description", ""),
                   d.get("code", ""), d.get("column"), d.get("source", ""), d.get("origin", ""))

    @property
    def position(self) -> str:
        return f"{self.location}:{self.column}" if self.column else self.location


def split_location(location: str) -> tuple[str, int, int | None]:
    """``path:line`` (or ``path:line:col``) as (path, line, col); line 0 when there is none."""
    parts = str(location).rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], int(parts[1]), int(parts[2])
    path, _, line = str(location).rpartition(":")
    return (path, int(line), None) if line.isdigit() else (str(location), 0, None)


def source_patch(guard: Guard, roots: tuple[Path | str, ...] = (".",)) -> dict[str, Any] | None:
    """:func:`patch` without its reason: the patch, or None."""
    return patch(guard, roots)[0]


def patch(guard: Guard, roots: tuple[Path | str, ...] = (".",)) -> tuple[dict[str, Any] | None, str]:
    """The guard written into the user's file, found from ``roots``: ``({path, line, before, after,
    diff}, "")``, the diff a ``git apply``-able patch of the file as it is; or ``(None, why)``, ``why``
    one sentence that says why there is no patch (the file is not here, the op is not called on the
    line in a form the guard can rewrite, the stable rewrite needs a name the line does not hold)."""
    path, line, _ = split_location(guard.location)
    if not line:
        return None, f"its location {guard.location!r} names no line"
    file = next((Path(r) / path for r in roots if (Path(r) / path).is_file()), None)
    if file is None:
        return None, f"{path} is not found here (run `cdeepfuzz fix` in the folder the campaign ran in)"
    try:
        text = file.read_bytes().decode("utf-8")          # line ends as they are (a CRLF file stays one)
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        return None, f"{path} cannot be read as Python ({type(exc).__name__}: {exc})"
    lines = _LINE.findall(text)
    if line > len(lines):
        return None, f"{path} has no line {line}"
    calls = [n for n in ast.walk(tree) if getattr(n, "lineno", None) == line and _op_of(n) == guard.op
             and (guard.column is None or _column(lines, n) == guard.column)]
    if not calls:
        at = f" at column {guard.column}" if guard.column else ""
        return None, (f"no call of {guard.op} starts{at} on line {line} of {path} (`{lines[line - 1].strip()}`) "
                      f"in a form the guard can rewrite (torch.{guard.op}(...), .{guard.op}(), an operator)")
    names = _torch_names(tree)
    found = [(n, _match(guard, n, names, f"line {line} of {path}")) for n in calls]
    rewrites = [(n, m) for n, m in found if callable(m)]
    if not rewrites:
        return None, next(m for _, m in found if isinstance(m, str))
    end = max(n.end_lineno for n, _ in rewrites)
    before, after = _rewritten(lines[line - 1:end], line, rewrites)
    if after == before:
        return None, f"the guard leaves line {line} of {path} as it is"
    block = "".join(lines[line - 1:end])
    new_lines = lines[:line - 1] + _LINE.findall(block.replace(before, after, 1)) + lines[end:]
    diff = "".join(difflib.unified_diff(lines, new_lines, f"a/{path}", f"b/{path}", n=1))
    if not diff.endswith("\n"):
        diff += "\n\\ No newline at end of file\n"
    return {"path": path, "line": line, "before": before.strip(), "after": after.strip(), "diff": diff}, ""


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\n|\r)|[^\r\n]+$")      # a line and its end, as Python counts lines


def _rewritten(block: list[str], first: int, rewrites: list) -> tuple[str, str]:
    """The text of the lines ``block`` (the first is line ``first``) without their last line end, before
    and after each node of ``rewrites`` is replaced by its rewrite (nested ones inside it too)."""
    body = "".join(block).rstrip("\r\n").encode("utf-8")       # ast's offsets are UTF-8 bytes
    starts = [0]
    for raw in block:
        starts.append(starts[-1] + len(raw.encode("utf-8")))

    def offset(lineno: int, col: int) -> int:
        return starts[lineno - first] + col

    spans = [(offset(n.lineno, n.col_offset), offset(n.end_lineno, n.end_col_offset), m) for n, m in rewrites]

    def render(lo: int, hi: int) -> str:
        out, pos = [], lo
        for start, stop, m in sorted(spans, key=lambda t: (t[0], -t[1])):
            if start >= pos and stop <= hi and (start, stop) != (lo, hi):
                out += [body[pos:start].decode("utf-8"), m(render, offset)]
                pos = stop
        out.append(body[pos:hi].decode("utf-8"))
        return "".join(out)

    return body.decode("utf-8"), render(0, len(body))


def _column(lines: list[str], node) -> int:
    """1-based column in characters of where ``node`` starts (ast's offsets are UTF-8 bytes)."""
    raw = lines[node.lineno - 1].encode("utf-8")[:node.col_offset]
    return len(raw.decode("utf-8", "replace")) + 1


def _torch_names(tree) -> dict[str, str]:
    """The names the file binds to ``torch`` and ``torch.nn.functional`` (``import torch as th``,
    ``import torch.nn.functional as F``, ``from torch.nn import functional as F``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or (a.name.startswith("torch.") and a.asname is None):
                    out.setdefault("torch", "torch")
                if a.name == "torch" and a.asname:
                    out["torch"] = a.asname
                if a.name == "torch.nn.functional" and a.asname:
                    out["F"] = a.asname
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.nn":
            for a in node.names:
                if a.name == "functional":
                    out["F"] = a.asname or "functional"
    if "F" not in out and "torch" in out:
        out["F"] = f"{out['torch']}.nn.functional"
    return out


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _call_name(node) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_method(node) -> bool:
    return isinstance(node.func, ast.Attribute) and _dotted(node.func.value) not in MODULES


def _op_of(node) -> str | None:
    """The guarded op a node calls: a call by name (``torch.log``, ``x.log_``, ``torch.special.ndtri``),
    or an operator (``a / b``, ``1 / x``, ``a % b``, ``x ** e``, ``a /= b``)."""
    if isinstance(node, ast.Call):
        name = _call_name(node)
        return FUNCTIONS.get(name, FUNCTIONS.get(f"special_{name}"))
    if isinstance(node, (ast.BinOp, ast.AugAssign)):
        left = node.left if isinstance(node, ast.BinOp) else node.target
        number = isinstance(left, ast.Constant) and isinstance(left.value, (int, float))
        return {ast.Div: "reciprocal" if number else "div", ast.FloorDiv: "div", ast.Mod: "remainder",
                ast.Pow: "pow"}.get(type(node.op))
    return None


Rewrite = Callable[[Callable[[int, int], str], Callable[[int, int], int]], str]


def _match(guard: Guard, node, names: dict[str, str], where: str) -> Rewrite | str:
    """How ``node`` (a call of ``guard.op`` on ``where``, "line N of path") is rewritten: a function
    ``(render, offset) -> text``, or the reason it cannot be."""
    op, p = guard.op, guard.params
    if guard.name == "stable_log":
        return _match_stable(guard, node, names, where)
    if isinstance(node, ast.Call):
        method = _is_method(node)
        inplace = method and _call_name(node).endswith("_") and not _call_name(node).endswith("__")
        if method and op not in DIVISOR_SECOND:
            arg = node.func.value
        else:
            i = 0 if method else (1 if op in DIVISOR_SECOND else 0)
            arg = node.args[i] if len(node.args) > i else None
            if arg is None:
                arg = next((k.value for k in node.keywords if k.arg in (("other",) if i else ("input", "self"))),
                           None)
            inplace = False
    else:
        left = node.left if isinstance(node, ast.BinOp) else node.target
        right = node.value if isinstance(node, ast.AugAssign) else node.right
        arg, inplace = (left if op == "pow" else right), False
        if isinstance(node, ast.AugAssign) and op == "pow":
            return "its base is the target of `**=`, which the guard cannot clamp in place"
    if arg is None or isinstance(arg, ast.Starred):
        return f"the input of {op} is not written on the line (passed by *args or **kwargs)"
    if isinstance(arg, ast.Constant) and isinstance(arg.value, (int, float)):
        return f"the guarded input of {op} is the Python number {arg.value!r}"
    simple = isinstance(arg, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
    if inplace and not simple:
        return f"the in-place {_call_name(node)} writes into an expression, which the guard cannot clamp in place"
    if guard.name == "abs_min" and (inplace or "torch" not in names):
        return ("the guard of a divisor needs torch.copysign, and the file does not import torch"
                if not inplace else f"the in-place {_call_name(node)} cannot keep its divisor's sign in place")

    def rewrite(render, offset) -> str:
        a0, a1 = offset(arg.lineno, arg.col_offset), offset(arg.end_lineno, arg.end_col_offset)
        n0, n1 = offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)
        a = render(a0, a1)
        x = a if simple else f"({a})"
        call_paren = isinstance(node, ast.Call) and arg is not node.func.value \
            and offset(node.func.end_lineno, node.func.end_col_offset) == a0 - 1
        if not simple and not call_paren and n0 < a0 and a1 < n1 and render(a0 - 1, a0) == "(" \
                and render(a1, a1 + 1) == ")":
            a0, a1 = a0 - 1, a1 + 1           # already in parentheses of its own: the guard goes on them
        us = "_" if inplace else ""
        if guard.name == "clamp_min":
            g = f"{x}.clamp_min{us}({p['lo']:.8g})"
        elif guard.name == "clamp_max":
            g = f"{x}.clamp_max{us}({p['hi']:.8g})"
        elif guard.name == "clamp":
            g = f"{x}.clamp{us}({p['lo']:.8g}, {p['hi']:.8g})"
        else:                               # abs_min: |x| >= eps, with x's sign (copysign(eps, 0.0) = eps)
            g = f"{names['torch']}.copysign({x}.abs().clamp_min({p['eps']:.8g}), {a})"
        return render(n0, a0) + g + render(a1, n1)

    return rewrite


_STABLE_NAMES = {"softmax": "softmax", "sigmoid": "sigmoid", "one_minus_sigmoid": "sigmoid"}


def _match_stable(guard: Guard, node, names: dict[str, str], where: str) -> Rewrite | str:
    """``log(softmax(z, d))`` -> ``log_softmax(z, d)``, ``log(sigmoid(z))`` -> ``logsigmoid(z)``,
    ``log(1 - sigmoid(z))`` -> ``logsigmoid(-z)``, when the softmax / sigmoid is inside the log's call;
    else the reason: the rewrite needs the softmax's (sigmoid's) input, a name the line does not hold."""
    if not isinstance(node, ast.Call):
        return "the log is not a call"
    arg = node.func.value if _is_method(node) else (node.args[0] if node.args else None)
    scale = "" if guard.op == "log" else f" / {math.log(2 if guard.op == 'log2' else 10)!r}"

    def called(n, wanted: str):
        return n if isinstance(n, ast.Call) and _call_name(n) == wanted else None

    negate = False
    inner = called(arg, "softmax") or called(arg, "sigmoid")
    if inner is None and isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Sub) \
            and isinstance(arg.left, ast.Constant) and arg.left.value == 1:
        inner, negate = called(arg.right, "sigmoid"), True
    if inner is None:
        what = _STABLE_NAMES.get(guard.source, "softmax or sigmoid")
        stable = "log_softmax" if what == "softmax" else "logsigmoid"
        ran = f" (the {what} runs at {guard.origin})" if guard.origin else ""
        shown = f"`{ast.unparse(arg)}`" if arg is not None else "its input"
        return (f"{stable} needs the input of the {what} that computed {shown}, and {where} does not hold "
                f"it{ran}")
    if _call_name(inner) == "sigmoid" and "F" not in names:
        return "the rewrite needs torch.nn.functional.logsigmoid, and the file does not import torch"
    call, m = inner, _is_method(inner)

    def rewrite(render, offset) -> str:
        n0, n1 = offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)
        if _call_name(call) == "softmax":
            f1 = offset(call.func.end_lineno, call.func.end_col_offset)
            g = (render(offset(call.lineno, call.col_offset), f1 - len("softmax")) + "log_softmax"
                 + render(f1, offset(call.end_lineno, call.end_col_offset)))
        else:
            z = call.func.value if m else call.args[0]
            zt = render(offset(z.lineno, z.col_offset), offset(z.end_lineno, z.end_col_offset))
            if negate:
                zt = f"-{zt}" if isinstance(z, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) else f"-({zt})"
            g = f"{names['F']}.logsigmoid({zt})"
        return g + scale

    if _call_name(call) == "sigmoid" and not m and not call.args:
        return "the sigmoid's input is not written on the line"
    return rewrite
