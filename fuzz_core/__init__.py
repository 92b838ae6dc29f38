"""CDeepFuzz core: the framework-neutral search for numerical bugs.

Nothing here imports ray or mlflow; the framework backends (torch, TensorFlow)
are loaded lazily, so ``from fuzz_core import Target`` costs no framework import.
"""
from fuzz_core.status import SiteStatus
from fuzz_core.target import GraphTarget, Target, TargetError

__all__ = ["GraphTarget", "SiteStatus", "Target", "TargetError"]
__version__ = "0.1.0"
