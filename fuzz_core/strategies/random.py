"""Random inputs: the "run the program on random inputs" baseline.

Every step draws a fresh batch from the target's sampler and replaces the
searched inputs with values drawn uniformly within their bounds.
"""
from __future__ import annotations


from fuzz_core.backends.base import WEIGHT_PREFIX
from fuzz_core.strategies.base import Strategy


class RandomInputs(Strategy):
    name = "random"

    def iterate(self, s) -> None:
        batch = s.fresh_batch()
        for key in s.searched:
            if key.startswith(WEIGHT_PREFIX):
                continue
            lo, hi = s.bounds[key]
            batch[key] = s.rng.uniform(lo, hi, size=batch[key].shape).astype(batch[key].dtype)
        for key, value in s.values.items():
            if key.startswith(WEIGHT_PREFIX):
                batch[key] = value
        s.values = batch
        s.evaluate(s.values, grad=False)

    def refresh(self, s, fraction: float) -> None:  # every step is already fresh
        return None
