"""Loading a target factory named by ``path/to/file.py:make_target`` or ``pkg.module:make_target``."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable


class EntryError(ValueError):
    """An entry that names no loadable factory (a user mistake, reported without traceback)."""


def split_entry(entry: str) -> tuple[str, str]:
    if not isinstance(entry, str) or ":" not in entry:
        raise EntryError(f"entry must look like 'path/to/file.py:make_target' or 'pkg.module:make_target', got {entry!r}")
    module, _, attr = entry.rpartition(":")
    if not module or not attr.isidentifier():
        raise EntryError(f"entry {entry!r}: {attr!r} is not a function name")
    return module, attr


def entry_file(entry: str, base: Path | None = None) -> Path | None:
    """The file an entry names, when it names a file."""
    module, _ = split_entry(entry)
    if _names_file(module):
        path = Path(module)
        if not path.is_absolute():
            path = (base or Path.cwd()) / path
        return path.resolve()
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).resolve() if spec and spec.origin else None


def _names_file(module: str) -> bool:
    """Whether the module part of an entry is a file path rather than a dotted module name."""
    return module.endswith(".py") or os.sep in module or "/" in module


def load_factory(entry: str, base: Path | None = None) -> Callable[..., Any]:
    """Import the factory; relative file paths are taken from ``base`` (the current directory)."""
    module_name, attr = split_entry(entry)
    base = base or Path.cwd()
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    if _names_file(module_name):
        path = entry_file(entry, base)
        if path is None or not path.is_file():
            raise EntryError(f"entry {entry!r}: no such file {module_name!r}")
        name = "cdeepfuzz_target_" + re.sub(r"\W", "_", str(path.with_suffix("")))[-80:]
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise EntryError(f"entry {entry!r}: cannot import {path.name}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise EntryError(f"entry {entry!r}: no module {exc.name!r}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise EntryError(f"entry {entry!r}: {module_name} has no attribute {attr!r}")
    if not callable(factory):
        raise EntryError(f"entry {entry!r}: {attr!r} is not callable")
    return factory


def call_factory(factory: Callable[..., Any], seed: int, args: dict[str, Any]) -> Any:
    """``factory(seed=seed, **args)``, with a clear error for arguments it does not take."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        params = sig.parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        unknown = [k for k in list(args) + ["seed"] if k not in params and not takes_kwargs]
        if unknown:
            raise EntryError(f"factory {getattr(factory, '__name__', factory)!r} takes no argument(s) {unknown}")
    return factory(seed=seed, **args)
