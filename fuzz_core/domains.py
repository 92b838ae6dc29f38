"""Valid domains of suspect ops and the margins the search minimises.

A domain is a union of intervals, each end strict or closed. The *margin* of an
element is its signed distance to the nearest edge of the domain: positive
inside, ``<= 0`` exactly where the op is out of its domain. Closed ends are
measured from the first invalid float beyond them (``x - nextafter(l, -inf)``),
so ``sqrt(0)`` has a margin of one subnormal, not zero.

Margins are computed on framework tensors through a tiny array namespace
(``xp``) so that the same catalogue serves PyTorch and TensorFlow; ``limits``
resolves dtype-dependent ends such as the largest ``x`` whose ``exp`` is finite.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Union

INF = math.inf
Number = Union[float, str]  # a float, or the name of a dtype-dependent limit


class ArrayNamespace(Protocol):
    """The operations margins need; each backend provides one."""

    def is_tensor(self, x: Any) -> bool: ...
    def abs(self, x: Any) -> Any: ...
    def minimum(self, a: Any, b: Any) -> Any: ...
    def maximum(self, a: Any, b: Any) -> Any: ...
    def where(self, cond: Any, a: Any, b: Any) -> Any: ...
    def round(self, x: Any) -> Any: ...
    def full_like(self, x: Any, value: float) -> Any: ...
    def as_float(self, x: Any, like: Any) -> Any: ...
    def next_down(self, value: float, like: Any) -> float: ...
    def next_up(self, value: float, like: Any) -> float: ...
    def limit(self, name: str, like: Any) -> float: ...
    def big(self, like: Any) -> float: ...


@dataclass(frozen=True)
class Interval:
    lo: Number = -INF
    hi: Number = INF
    lo_closed: bool = False
    hi_closed: bool = False

    def __str__(self) -> str:
        left = "[" if self.lo_closed else "("
        right = "]" if self.hi_closed else ")"
        return f"{left}{self.lo}, {self.hi}{right}"


@dataclass(frozen=True)
class Domain:
    """A union of intervals. ``Domain.of(Interval(0, INF))`` is ``(0, inf)``."""

    intervals: tuple[Interval, ...]

    @classmethod
    def of(cls, *intervals: Interval) -> "Domain":
        if not intervals:
            raise ValueError("a domain needs at least one interval")
        return cls(tuple(intervals))

    def __str__(self) -> str:
        return " ∪ ".join(str(i) for i in self.intervals)

    def contains(self, x: float, limits: dict[str, float] | None = None) -> bool:
        """Membership of a Python float (for tests and documentation)."""
        for iv in self.intervals:
            lo, hi = _resolve(iv.lo, limits), _resolve(iv.hi, limits)
            above = x >= lo if iv.lo_closed else x > lo
            below = x <= hi if iv.hi_closed else x < hi
            if above and below:
                return True
        return False

    def margin(self, x: Any, xp: ArrayNamespace) -> Any:
        """Elementwise signed distance to the nearest edge; ``<= 0`` outside."""
        best = None
        for iv in self.intervals:
            m = _interval_margin(iv, x, xp)
            best = m if best is None else xp.maximum(best, m)
        return best


def _resolve(v: Number, limits: dict[str, float] | None) -> float:
    if isinstance(v, str):
        if not limits or v not in limits:
            raise KeyError(f"limit {v!r} needs a value")
        return limits[v]
    return float(v)


def _interval_margin(iv: Interval, x: Any, xp: ArrayNamespace) -> Any:
    lo = xp.limit(iv.lo, x) if isinstance(iv.lo, str) else iv.lo
    hi = xp.limit(iv.hi, x) if isinstance(iv.hi, str) else iv.hi
    parts = []
    if lo != -INF:
        edge = xp.next_down(lo, x) if iv.lo_closed else lo
        parts.append(x - edge)
    if hi != INF:
        edge = xp.next_up(hi, x) if iv.hi_closed else hi
        parts.append(edge - x)
    if not parts:
        return xp.full_like(x, xp.big(x))
    return parts[0] if len(parts) == 1 else xp.minimum(parts[0], parts[1])


# Domains shared by several catalogue rows.
POSITIVE = Domain.of(Interval(0.0, INF))                              # (0, inf)
NON_NEGATIVE = Domain.of(Interval(0.0, INF, lo_closed=True))          # [0, inf)
NON_ZERO = Domain.of(Interval(-INF, 0.0), Interval(0.0, INF))         # x != 0
UNIT_CLOSED = Domain.of(Interval(-1.0, 1.0, True, True))              # [-1, 1]
UNIT_OPEN = Domain.of(Interval(-1.0, 1.0))                            # (-1, 1)
PROBABILITY_OPEN = Domain.of(Interval(0.0, 1.0))                      # (0, 1)
