"""The recorder's dispatch modes without ``torch._dynamo``, until something compiles.

``TorchDispatchMode`` wraps the ``__torch_dispatch__`` of each of its subclasses in
``torch._disable_dynamo``: the wrapper's first call imports ``torch._dynamo`` (about 830 modules,
sympy among them: 1.5-3 s, and a slower exit) only to switch Dynamo off while the mode handles an op,
and keeps the switched-off function in the wrapped function's ``__dynamo_disable`` attribute. Nothing
can be compiling in a process that has not imported ``torch._dynamo`` (``torch.compile`` imports it),
so :func:`defer_dynamo` puts a stand-in in that attribute: it calls the function as it is until
``torch._dynamo`` is imported; from then on it makes PyTorch's own switched-off function, leaves it in
the attribute for the wrapper's later calls, and calls it. Dynamo, tracing a compiled frame that
calls the wrapper, sees the stand-in as the disabled function it stands for (``_torchdynamo_disable``)
and runs it outside the graph, as it does the one it replaces.

A program still imports ``torch._dynamo`` itself when it steps an optimizer: PyTorch 2.x's
``Optimizer.step`` imports it at every call (``_use_grad_for_differentiable``), as it does outside
CDeepFuzz.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Callable

import torch

_DYNAMO = "torch._dynamo"


def _wrapper_code() -> types.CodeType | None:
    """The code object of ``torch._disable_dynamo``'s wrapper (None where this torch has none)."""
    make = getattr(torch, "_disable_dynamo", None)
    if make is None:
        return None
    code = getattr(make(lambda: None), "__code__", None)
    return code if code is not None and code.co_freevars == ("fn", "recursive") else None


def _stand_in(fn: Callable, recursive: bool) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        if _DYNAMO not in sys.modules:        # nothing compiles: there is nothing to switch off
            return fn(*args, **kwargs)
        from torch._dynamo import disable

        switched_off = disable(fn, recursive, wrapping=False)
        fn.__dynamo_disable = switched_off   # type: ignore[attr-defined]  # the wrapper calls it from now on
        return switched_off(*args, **kwargs)

    call._torchdynamo_disable = True          # type: ignore[attr-defined]  # what Dynamo checks: not traced
    call._torchdynamo_orig_callable = fn      # type: ignore[attr-defined]
    call.__wrapped__ = fn                     # type: ignore[attr-defined]
    return call


def defer_dynamo(cls: type, name: str = "__torch_dispatch__") -> bool:
    """Give ``cls.<name>``, a ``torch._disable_dynamo`` wrapper, a stand-in until ``torch._dynamo`` is
    imported. False when there was nothing to do: ``torch._dynamo`` is imported already, the attribute is
    not such a wrapper (another torch), or its function has its switched-off twin already."""
    code = _wrapper_code()
    wrapper = vars(cls).get(name)
    if code is None or _DYNAMO in sys.modules or not isinstance(wrapper, types.FunctionType) \
            or wrapper.__code__ is not code:
        return False
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in wrapper.__closure__ or ())))
    fn = cells.get("fn")
    if fn is None or getattr(fn, "__dynamo_disable", None) is not None:
        return False
    fn.__dynamo_disable = _stand_in(fn, bool(cells.get("recursive", True)))
    return True
