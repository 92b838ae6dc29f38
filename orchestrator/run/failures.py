"""Whose fault: the user's target, or CDeepFuzz itself. One message for every command.

A target's failure arrives as a :class:`~orchestrator.worker.TargetFailure` (message and
traceback text, from this process or a Ray actor on another machine) or as the error text of a
quantum. :func:`classify` reads the traceback:

- the target contract broken (a ``TargetError`` / ``EntryError`` the engine raised on purpose:
  the factory returned the wrong thing, bounds low > high, an unknown searched input, an
  argument the factory does not take) is the user's: ``target_error``;
- an exception raised by CDeepFuzz's own code (the innermost frame is in ``fuzz_core/`` or
  ``orchestrator/``), or raised below CDeepFuzz without any of the user's code on the stack,
  is the tool's: ``internal_error``, reported as such with a request for a bug report;
- anything else went through the user's code (their factory, their program, or a library
  they called, even when CDeepFuzz's recorder sat in between): ``target_error``.

``sites``, ``run``, ``replay`` and ``fix`` all print :func:`describe`'s line, so the same broken
factory reads the same everywhere and exits 3.
"""
from __future__ import annotations

import re
import traceback as tb_module
from dataclasses import dataclass
from pathlib import Path

from fuzz_core.loader import EntryError
from fuzz_core.status import ExitReason
from fuzz_core.target import TargetError
from orchestrator.worker import TargetFailure

BUG_REPORT = ("this is a bug in CDeepFuzz, not in your program: please report it to the CDeepFuzz "
              "maintainers with the traceback")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+, in (?P<func>.+)$')
_OURS = {"fuzz_core", "orchestrator"}
_USER_SYNTAX = ("SyntaxError", "IndentationError", "TabError")


@dataclass(frozen=True)
class Failure:
    """A classified failure: the one-line message, its traceback, and whose it is."""

    message: str
    traceback: str | None
    reason: ExitReason        # TARGET_ERROR or INTERNAL_ERROR
    contract: bool = False    # the target contract was broken (a configuration mistake in the factory)

    @property
    def internal(self) -> bool:
        return self.reason is ExitReason.INTERNAL_ERROR


def _is_ours(path: str) -> bool:
    """A frame of CDeepFuzz itself: a file under a ``fuzz_core/`` or ``orchestrator/`` folder (wherever the
    package lies: this checkout, site-packages, or an actor's copy of the working dir)."""
    return any(part in _OURS for part in Path(path).parts[:-1])


def _is_library(path: str) -> bool:
    """Python itself or an installed package (torch, numpy, tensorflow, ...), not CDeepFuzz."""
    if path.startswith("<"):             # <frozen importlib._bootstrap>, <string>
        return True
    parts = Path(path).parts
    if "site-packages" in parts or "dist-packages" in parts:
        return not _is_ours(path)
    return any(re.fullmatch(r"python3(\.\d+)?", p) for p in parts) and "lib" in parts


def _frames(text: str) -> list[str]:
    return [m.group("path") for line in text.splitlines() if (m := _FRAME.match(line))]


def _exception_type(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line and not line.startswith(" ")]
    last = lines[-1] if lines else ""
    return last.split(":", 1)[0].rsplit(".", 1)[-1].strip()


def classify(message: str, traceback: str | None, contract: bool = False) -> Failure:
    """Whose failure ``message``/``traceback`` is: the user's target, or CDeepFuzz's."""
    if contract:
        return Failure(message, traceback, ExitReason.TARGET_ERROR, contract=True)
    text = traceback or ""
    frames = _frames(text)
    if not frames or _exception_type(text) in _USER_SYNTAX:
        return Failure(message, traceback, ExitReason.TARGET_ERROR)
    user = [p for p in frames if not _is_ours(p) and not _is_library(p)]
    innermost = frames[-1]
    if _is_ours(innermost) or not user:
        return Failure(message, traceback, ExitReason.INTERNAL_ERROR)
    return Failure(message, traceback, ExitReason.TARGET_ERROR)


def from_target_failure(exc: TargetFailure) -> Failure:
    return classify(str(exc), getattr(exc, "tb", None), bool(getattr(exc, "contract", False)))


def from_exception(exc: BaseException) -> Failure:
    """Classify an exception caught in this process (building a target for replay or fix)."""
    if isinstance(exc, TargetFailure):
        return from_target_failure(exc)
    text = "".join(tb_module.format_exception(type(exc), exc, exc.__traceback__))
    contract = isinstance(exc, (TargetError, EntryError))
    message = str(exc) if contract else f"{type(exc).__name__}: {exc}"
    return classify(message, text, contract)


def from_quantum_error(error: str | None) -> Failure:
    """A quantum's error text (``"Type: message\\n<traceback>"``), as the worker returns it."""
    text = error or "unknown error"
    head, _, rest = text.partition("\n")
    return classify(head.strip(), rest or None)


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def where(failure: Failure) -> str:
    """The innermost frame of the user's code, as ``file:line in func`` (empty when none)."""
    last = ""
    for line in (failure.traceback or "").splitlines():
        m = _FRAME.match(line)
        if m and not _is_ours(m.group("path")) and not _is_library(m.group("path")):
            last = line.strip().replace('File "', "").replace('", line ', ":").replace(", in ", " in ")
    return last


def describe(what: str, failure: Failure) -> str:
    """The one line every command prints for a failed target (or site)."""
    if failure.internal:
        return f"cdeepfuzz: {what}: INTERNAL ERROR: {first_line(failure.message)} ({BUG_REPORT})"
    at = where(failure)
    return f"cdeepfuzz: {what}: could not be built or run: {first_line(failure.message)}" + (f" [{at}]" if at else "")
