"""What a program can mutate: the objects reachable from its functions, found without running it.

A target's state is not only ``model.state_dict()``: plain tensors handed to an optimizer,
tensors captured in ``program``'s closure, module-level tensors of the user's script, a
GAN's second model held by ``train_step``'s object. :func:`reachable` walks, in a fixed
order (so that every process building the same factory names things alike), from the
target's functions through closure cells, referenced globals, default arguments, bound
methods' objects, ``functools.partial`` parts, containers and user objects, and yields
``(path, value)`` for every value a framework backend may want to snapshot.

Framework-neutral: the caller says which values are leaves (tensors, variables, modules,
optimizers: yielded, not entered) through ``is_leaf``.
"""
from __future__ import annotations

import functools
import os
import sys
import sysconfig
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

MAX_DEPTH = 6           # closure -> object -> attribute -> ... hops from a target function
MAX_ITEMS = 4096        # elements of one container looked at
_FUZZ_CORE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _library_dirs() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {sys.prefix, sys.base_prefix}
    return tuple(sorted(os.path.abspath(p) + os.sep for p in paths if p))


_LIBRARIES = _library_dirs()


def is_user_code(filename: str) -> bool:
    """A file of the user's (not the standard library, an installed package, or fuzz_core)."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return not path.startswith(_LIBRARIES) and not path.startswith(_FUZZ_CORE)


def _code_names(code: types.CodeType) -> Iterator[str]:
    """Global names a code object (and the code nested in it) may read, in order."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


@dataclass(frozen=True, eq=False)
class Slot:
    """Where a value was found: a closure cell, a dict or list item (a script's globals are a
    dict), an object's attribute. A program that rebinds it instead of writing into the value
    (``nonlocal W; W = W - lr * W.grad``, ``state["w"] = ...``, ``self.w = ...``) is seen by
    comparing :meth:`get` with the value found, and undone by :meth:`set`."""

    container: Any
    key: Any
    kind: str        # cell | item | attr

    def get(self) -> Any:
        try:
            if self.kind == "cell":
                return self.container.cell_contents
            if self.kind == "item":
                return self.container[self.key]
            return getattr(self.container, self.key)
        except (ValueError, KeyError, IndexError, AttributeError):
            return None

    def set(self, value: Any) -> None:
        if self.kind == "cell":
            self.container.cell_contents = value
        elif self.kind == "item":
            self.container[self.key] = value
        else:
            setattr(self.container, self.key, value)


Found = tuple[str, Any, "Slot | None"]


def reachable(roots: list[tuple[str, Any]], is_leaf: Callable[[Any], bool]) -> Iterator[Found]:
    """``(path, leaf, slot)`` for every leaf reachable from ``roots`` (``(name, object)`` pairs),
    each once; ``slot`` is where it was found when that place can be rebound (else None)."""
    seen: set[int] = set()
    stack: list[tuple[str, Any, Slot | None, int]] = [(name, obj, None, 0) for name, obj in reversed(roots)]
    while stack:
        path, obj, slot, depth = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if is_leaf(obj):
            yield path, obj, slot
            continue
        if depth >= MAX_DEPTH:
            continue
        children = list(_children(path, obj))
        stack.extend((p, c, sl, depth + 1) for p, c, sl in reversed(children))


def _children(path: str, obj: Any) -> Iterator[Found]:
    if isinstance(obj, (str, bytes, int, float, complex, bool, type, types.ModuleType, range)):
        return
    if isinstance(obj, functools.partial):
        yield f"{path}.func", obj.func, None
        yield from ((f"{path}.args{i}", a, None) for i, a in enumerate(obj.args))
        yield from ((f"{path}.{k}", v, Slot(obj.keywords, k, "item")) for k, v in obj.keywords.items())
        return
    if isinstance(obj, types.MethodType):
        yield path, obj.__self__, None
        yield f"{path}.__func__", obj.__func__, None
        return
    if isinstance(obj, types.FunctionType):
        yield from _function_children(path, obj)
        return
    if isinstance(obj, dict):
        for i, (k, v) in enumerate(obj.items()):
            if i >= MAX_ITEMS:
                break
            yield f"{path}.{k}" if isinstance(k, (str, int)) else f"{path}.{i}", v, Slot(obj, k, "item")
        return
    if isinstance(obj, (list, tuple)):
        mutable = isinstance(obj, list)
        yield from ((f"{path}.{i}", v, Slot(obj, i, "item") if mutable else None)
                    for i, v in enumerate(obj[:MAX_ITEMS]))
        return
    cls = type(obj)
    module = sys.modules.get(getattr(cls, "__module__", "") or "")
    if module is None or not is_user_code(getattr(module, "__file__", "") or ""):
        return                                  # a library's object: its state is the library's
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        yield from ((f"{path}.{k}", v, Slot(obj, k, "attr")) for k, v in list(attrs.items())[:MAX_ITEMS])


def _function_children(path: str, fn: types.FunctionType) -> Iterator[Found]:
    code = fn.__code__
    if not is_user_code(code.co_filename):
        return
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            yield f"{path}.{name}", cell.cell_contents, Slot(cell, name, "cell")
        except ValueError:      # a cell not filled yet
            continue
    for i, value in enumerate(fn.__defaults__ or ()):
        yield f"{path}.default{i}", value, None
    for name, value in (fn.__kwdefaults__ or {}).items():
        yield f"{path}.{name}", value, None
    glob = fn.__globals__
    done: set[str] = set()
    for name in _code_names(code):
        if name in done or name not in glob:
            continue
        done.add(name)
        yield f"global.{name}", glob[name], Slot(glob, name, "item")
