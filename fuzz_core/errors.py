"""Whose fault is an exception: the user's program (a target error) or CDeepFuzz (an internal error)?

A program that raises is the user's to fix and is reported with the user's own message; an
exception raised by the tool's own code is a bug of the tool and must never be reported as the
user's. The traceback decides: its innermost frame that belongs either to the user's code or
to the tool's. Frames of libraries (torch, TensorFlow, NumPy, the standard library) are
passed over, and so are the tool's own pass-through layers (the recorders that forward every
op of the user's program to the framework: an exception raised inside them by the framework is
the program's).
"""
from __future__ import annotations

import os
import types

from fuzz_core.reach import is_user_code
from fuzz_core.status import ExitReason
from fuzz_core.target import TargetError

_FUZZ_CORE = os.path.dirname(os.path.abspath(__file__))
_TOOL_DIRS = (_FUZZ_CORE + os.sep, os.path.join(os.path.dirname(_FUZZ_CORE), "orchestrator") + os.sep)
_PASS_THROUGH = ("torch_recorder.py", "tf_recorder.py", "torch_state.py", "fixes.py")


def _owner(filename: str) -> str | None:
    """``user``, ``tool`` or None (a library, or a pass-through layer of the tool)."""
    path = os.path.abspath(filename)
    if path.startswith(_TOOL_DIRS):
        return None if os.path.basename(path) in _PASS_THROUGH else "tool"
    return "user" if is_user_code(filename) else None


def classify(exc: BaseException) -> ExitReason:
    """TARGET_ERROR for the user's mistakes and programs, INTERNAL_ERROR for the tool's own."""
    if isinstance(exc, TargetError):
        return ExitReason.TARGET_ERROR
    tb: types.TracebackType | None = exc.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    for filename in reversed(frames):          # innermost first
        owner = _owner(filename)
        if owner == "user":
            return ExitReason.TARGET_ERROR
        if owner == "tool":
            return ExitReason.INTERNAL_ERROR
    return ExitReason.TARGET_ERROR if not frames else ExitReason.INTERNAL_ERROR


INTERNAL_HINT = "this is a bug in CDeepFuzz, not in your program: please report it with this traceback"
