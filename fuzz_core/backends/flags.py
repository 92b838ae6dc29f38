"""Per-op non-finite flags of one forward pass and the rules of what counts as an event.

Framework-neutral: each recorder pushes one flag per checked op output (a device
tensor, read back in one sync) and these rules name the first op that went
non-finite by its own doing (DESIGN.md: a NaN anywhere, an infinity from a catalogued
hazard, or a non-finite program output; an intended -inf mask is not an event).
"""
from __future__ import annotations

from typing import Any

from fuzz_core.backends.base import OpRef

NOT_SEARCHED = -1   # Call.in_ok of a recorded-only (stable) op
ALWAYS_OK = -3      # Call.in_ok of an op with no floating-point input
IN_OK = -2          # flag_ops index of an "inputs finite" flag


class FlagBook:
    """The flags of one pass, in execution order. Recorders fill ``calls``, ``flags`` and ``flag_ops``.

    A call (of a catalogued op) has ``spec``, ``kind``, ``location``, ``occurrence``, ``flag``
    (index of its output flag) and ``in_ok`` (index of its inputs-finite flag, or
    NOT_SEARCHED / ALWAYS_OK).
    """

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.flags: list[Any] = []
        self.flag_ops: list[tuple[str, str, int]] = []   # (kind, location, call index or -1); IN_OK

    def push(self, flag, op: tuple[str, str, int] | None = None) -> int:
        self.flags.append(flag)
        self.flag_ops.append(op if op is not None else ("", "", IN_OK))
        return len(self.flags) - 1

    def find(self, key: tuple[str, str, int]):
        for call in self.calls:
            if (call.spec.name, call.location, call.occurrence) == key:
                return call
        return None

    def first_event(self, values: list[bool], outputs_bad: bool, program_location: str) -> OpRef | None:
        """The first op whose output went non-finite by its own doing."""
        for i, bad in enumerate(values[: len(self.flags)]):
            kind, location, index = self.flag_ops[i]
            if not bad or index == IN_OK:
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

    def triggered(self, values: list[bool], call) -> bool:
        """The site's own output went non-finite while its inputs were finite."""
        if call.in_ok == NOT_SEARCHED or call.flag < 0:
            return False
        inputs_ok = call.in_ok == ALWAYS_OK or bool(values[call.in_ok])
        return bool(values[call.flag]) and inputs_ok
