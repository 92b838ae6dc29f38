"""Whose fault: the user's target, or CDeepFuzz itself. One message for every command.

The engine classifies an exception where it is raised (:func:`fuzz_core.errors.classify`, with
the real frames): a :class:`~orchestrator.worker.TargetFailure` carries its ``reason`` and a
quantum's result its ``exit_reason`` (``target_error`` or ``internal_error``), also across Ray.
An exception that escapes the worker itself (a Ray task error that is not a TargetFailure) never
went through the user's program's handlers: it is CDeepFuzz's, an internal error.

``sites``, ``run``, ``replay`` and ``fix`` all print :func:`describe`'s line, so the same broken
factory reads the same everywhere (and exits 3; 5 for an internal error).
"""
from __future__ import annotations

import re
import traceback as tb_module
from dataclasses import dataclass

from fuzz_core.errors import INTERNAL_HINT, classify
from fuzz_core.loader import EntryError
from fuzz_core.reach import is_user_code
from fuzz_core.status import ExitReason
from fuzz_core.target import TargetError
from orchestrator.worker import TargetFailure

BUG_REPORT = INTERNAL_HINT
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_INTERNAL_PREFIX = "internal error: "


@dataclass(frozen=True)
class Failure:
    """A classified failure: the one-line message, its traceback, and whose it is."""

    message: str
    traceback: str | None
    reason: ExitReason        # TARGET_ERROR or INTERNAL_ERROR
    contract: bool = False    # the target contract was broken (the factory returned the wrong thing, ...)

    @property
    def internal(self) -> bool:
        return self.reason is ExitReason.INTERNAL_ERROR


def _reason(value, default: ExitReason = ExitReason.TARGET_ERROR) -> ExitReason:
    try:
        reason = ExitReason(getattr(value, "value", value))
    except ValueError:
        return default
    return reason if reason in (ExitReason.TARGET_ERROR, ExitReason.INTERNAL_ERROR) else default


def from_target_failure(exc: TargetFailure) -> Failure:
    return Failure(str(exc), getattr(exc, "tb", None) or None, _reason(getattr(exc, "reason", None)),
                   bool(getattr(exc, "contract", False)))


def from_exception(exc: BaseException) -> Failure:
    """Classify an exception caught in this process (building a target for replay or fix)."""
    if isinstance(exc, TargetFailure):
        return from_target_failure(exc)
    text = "".join(tb_module.format_exception(type(exc), exc, exc.__traceback__))
    contract = isinstance(exc, (TargetError, EntryError))
    message = str(exc) if contract else f"{type(exc).__name__}: {exc}"
    reason = ExitReason.TARGET_ERROR if contract else classify(exc)
    return Failure(message, text, reason, contract)


def from_escaped(exc: BaseException) -> Failure:
    """An exception that escaped the worker (a Ray task error that is no TargetFailure): the tool's."""
    cause = getattr(exc, "cause", None)
    for candidate in (exc, cause):
        if isinstance(candidate, TargetFailure):
            return from_target_failure(candidate)
    shown = cause if isinstance(cause, BaseException) else exc
    text = str(exc) if cause is not None else "".join(tb_module.format_exception(type(exc), exc, exc.__traceback__))
    return Failure(f"{type(shown).__name__}: {first_line(str(shown))}", text, ExitReason.INTERNAL_ERROR)


def from_quantum(error: str | None, reason) -> Failure:
    """A quantum's error text (``"Type: message\\n<traceback>"``) and the exit reason the engine gave it."""
    head, _, rest = (error or "unknown error").partition("\n")
    return Failure(head.strip(), rest or None, _reason(reason))


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def where(failure: Failure) -> str:
    """The innermost frame of the user's code in the traceback, as ``file:line in func`` (empty if none)."""
    last = ""
    for line in (failure.traceback or "").splitlines():
        m = _FRAME.match(line)
        if m and is_user_code(m.group("path")) and not _tool_file(m.group("path")):
            last = f"{m.group('path')}:{m.group('line')} in {m.group('func')}"
    return last


def _tool_file(path: str) -> bool:
    return "orchestrator" in path.replace("\\", "/").split("/")[:-1]


def describe(what: str, failure: Failure, happened: str = "could not be built or run") -> str:
    """The one line every command prints for a failed target (``happened``: what went wrong, e.g. for a
    site "its program raised")."""
    message = first_line(failure.message)
    if failure.internal:
        core = message.removeprefix(_INTERNAL_PREFIX).replace(f" ({INTERNAL_HINT})", "")
        return f"cdeepfuzz: {what}: INTERNAL ERROR of CDeepFuzz: {core} ({BUG_REPORT})"
    at = where(failure)
    return f"cdeepfuzz: {what}: {happened}: {message}" + (f" [{at}]" if at else "")
