"""``round-robin``: the baseline. Equal quanta, least recently served site first."""
from __future__ import annotations

import heapq

from orchestrator.scheduling.core import Action, RankedScheduler, SiteBook


class RoundRobinScheduler(RankedScheduler):
    """The baseline: equal quanta, least recently served site first."""

    policy = "round-robin"

    def _rank(self, idle: list[SiteBook], free_slots: int) -> list[tuple[SiteBook, Action, int]]:
        ranked = heapq.nsmallest(free_slots, idle, key=lambda s: (s.served, s.order))
        return [(s, Action.GRANT, self.quantum) for s in ranked]
