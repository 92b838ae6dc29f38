"""GRIST, as published (Yan et al., FSE 2021): the faithful baseline.

Each step: ``x <- clip(x - 0.15 * sign(grad))`` on the op's input-space loss; every
100 steps the 5% least important samples are replaced by fresh ones; the program
keeps training at its own learning rate. Unlike GRIST's code, the importance
score really is updated (how far each sample's suspect loss moved).
"""
from __future__ import annotations

from fuzz_core.strategies.base import Strategy, importance, note_reachability, refresh_samples, sign_step

STEP = 0.15
REFRESH_EVERY = 100
REFRESH_FRACTION = 0.05


class Grist(Strategy):
    name = "grist"
    # a scheduler's refresh replaces what GRIST's own does: a quarter of a small batch changes the
    # data the program trains on enough to lose a bug its training drift was about to reveal
    refresh_fraction = REFRESH_FRACTION

    def iterate(self, s) -> None:
        ev = s.evaluate(s.values)
        note_reachability(s, ev)
        if ev.per_sample is not None:
            s.strategy_state["last_per_sample"] = ev.per_sample
            importance(s, ev.per_sample)   # sets the reference at the first step after a refresh
        if ev.grads is not None:
            s.values = sign_step(s.values, ev.grads, STEP, s.bounds)
        if s.step // REFRESH_EVERY > s.strategy_state.get("refreshes", 0):
            s.strategy_state["refreshes"] = s.step // REFRESH_EVERY
            refresh_samples(s, REFRESH_FRACTION)
