"""Search strategies: ``adaptive`` (CDeepFuzz's own), ``grist`` and ``random`` (baselines)."""
from __future__ import annotations

from fuzz_core.strategies.adaptive import Adaptive
from fuzz_core.strategies.base import Strategy
from fuzz_core.strategies.grist import Grist
from fuzz_core.strategies.random import RandomInputs

_REGISTRY: dict[str, type[Strategy]] = {"adaptive": Adaptive, "grist": Grist, "random": RandomInputs}
STRATEGIES = tuple(_REGISTRY)   # the names a campaign may ask for


def make_strategy(name: str) -> Strategy:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; expected one of {sorted(_REGISTRY)}") from None


__all__ = ["STRATEGIES", "Adaptive", "Grist", "RandomInputs", "Strategy", "make_strategy"]
