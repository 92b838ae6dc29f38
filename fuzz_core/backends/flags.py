"""Per-op non-finite flags of one forward pass and the rules of what counts as an event.

Framework-neutral: each recorder pushes one flag per checked op output (a device
tensor, read back in one sync) and these rules name the first op that went
non-finite by its own doing (DESIGN.md: a NaN anywhere, an infinity from a catalogued
hazard, or a non-finite program output; an intended -inf mask is not an event).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from fuzz_core.backends.base import NOT_LOCATED, OpRef
from fuzz_core.sites import OpSite, make_site

if TYPE_CHECKING:
    from fuzz_core.catalogue import OpSpec

NOT_SEARCHED = -1   # Call.in_ok of a recorded-only (stable) op
ALWAYS_OK = -3      # Call.in_ok of an op with no floating-point input
IN_OK = -2          # flag_ops index of an "inputs finite" flag


@dataclass
class Call:
    """One call of a catalogued op in a pass (the TensorFlow recorders add fields of their own)."""

    spec: OpSpec
    kind: str
    location: str
    occurrence: int
    inputs: list
    flag: int          # index of this call's output flag in FlagBook.flags
    in_ok: int = NOT_SEARCHED   # index of the "inputs finite" flag; NOT_SEARCHED or ALWAYS_OK

    @property
    def key(self) -> tuple[str, str, int]:
        """What identifies the call's site inside one pass (``OpSite.key``)."""
        return (self.spec.name, self.location, self.occurrence)


class FlagBook:
    """The flags of one pass, in execution order. Recorders fill ``calls``, ``flags`` and ``flag_ops``.

    Each call is a :class:`Call`.
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
            if call.key == key:
                return call
        return None

    def sites(self, target: str, hazardous: Callable[[Any], bool]) -> list[OpSite]:
        """The pass's sites in execution order, one per key: every call of a recorded-only op,
        and each call of a searched op for which ``hazardous(call)`` holds."""
        sites, seen = [], set()
        for call in self.calls:
            if call.key in seen:
                continue
            if call.spec.searched and not hazardous(call):
                continue          # no hazard in this call (x ** 2, x / 2.0)
            seen.add(call.key)
            sites.append(make_site(target, call.spec.name, call.kind, call.spec.hazard, call.location,
                                   call.occurrence, call.spec.searched))
        return sites

    def first_event(self, values: list[bool], outputs_bad: bool, program_location: str) -> OpRef | None:
        """The first op whose output went non-finite by its own doing."""
        return self.first_event_at(values, outputs_bad, program_location)[1]

    def first_event_at(self, values: list[bool], outputs_bad: bool,
                       program_location: str) -> tuple[int, OpRef | None]:
        """:meth:`first_event` and the index of its flag (``len(flags)`` for the outputs, -1 for none)."""
        for i, op, _ in self._fired(values):
            return i, op
        if outputs_bad:
            return len(self.flags), OpRef("output", "output", program_location, 0, nan=False)
        return -1, None

    def origins(self, values: list[bool], outputs_bad: bool, program_location: str) -> list[OpRef]:
        """Every op that went non-finite by its own doing, in execution order (the first is
        :meth:`first_event`'s): each catalogued call whose output went non-finite from finite inputs.
        A flag of an uncatalogued op (or the program's output) counts only when nothing went
        non-finite before it: it records no inputs, so after an earlier origin it may only carry
        that origin's value on (``0 * -inf`` after a ``log`` of 0)."""
        out: list[OpRef] = []
        for _, op, catalogued in self._fired(values):
            if catalogued or not out:
                out.append(op)
        if not out:
            first = self.first_event_at(values, outputs_bad, program_location)[1]
            out = [first] if first is not None else []
        return out

    def _fired(self, values: list[bool]):
        """(flag index, op, catalogued) of each flag that went non-finite, in order, less the calls
        whose inputs were already non-finite (not the origin)."""
        for i, bad in enumerate(values[: len(self.flags)]):
            kind, location, index = self.flag_ops[i]
            if not bad or index == IN_OK:
                continue
            if index >= 0:
                call = self.calls[index]
                if call.in_ok >= 0 and not values[call.in_ok]:
                    continue     # its inputs were already non-finite: not the origin
                yield i, OpRef(call.spec.name, call.kind, call.location, call.occurrence), True
            else:
                yield i, OpRef(kind, kind, location or f"{NOT_LOCATED}: replay names it>", 0), False

    def triggered(self, values: list[bool], call) -> bool:
        """The site's own output went non-finite while its inputs were finite."""
        if call.in_ok == NOT_SEARCHED or call.flag < 0:
            return False
        inputs_ok = call.in_ok == ALWAYS_OK or bool(values[call.in_ok])
        return bool(values[call.flag]) and inputs_ok

    def triggered_sites(self, values: list[bool]) -> dict[tuple[str, str, int], bool]:
        """Each searched call's key -> whether its own hazard fired (the check-only detector)."""
        return {call.key: self.triggered(values, call) for call in self.calls if call.spec.searched}
