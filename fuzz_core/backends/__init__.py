"""Framework backends. Each is the only module that imports its framework.

``load_backend(name)`` imports one lazily; ``detect_framework(obj)`` infers the
framework of a Target without importing any framework that is not loaded yet.
"""
from __future__ import annotations

import sys
from typing import Any

from fuzz_core.backends.base import Evaluation, OpRef, Runner, RunnerOptions

FRAMEWORKS = ("torch", "tensorflow")


def load_backend(framework: str):
    if framework == "torch":
        from fuzz_core.backends import torch as backend
    elif framework == "tensorflow":
        from fuzz_core.backends import tensorflow as backend  # type: ignore[no-redef]
    else:
        raise ValueError(f"unknown framework {framework!r}; expected one of {FRAMEWORKS}")
    return backend


def detect_framework(target: Any) -> str:
    """torch or tensorflow, from the Target's model/program (no new imports)."""
    from fuzz_core.target import GraphTarget

    if isinstance(target, GraphTarget):
        return "tensorflow"
    torch = sys.modules.get("torch")
    model = getattr(target, "model", None)
    if torch is not None and isinstance(model, torch.nn.Module):
        return "torch"
    if "tensorflow" in sys.modules:
        tf = sys.modules["tensorflow"]
        if isinstance(model, (tf.Module, tf.Variable)) or (
            isinstance(model, (list, tuple)) and model and isinstance(model[0], tf.Variable)
        ):
            return "tensorflow"
        if model is None and torch is None:
            return "tensorflow"
    return "torch"


__all__ = ["Evaluation", "OpRef", "Runner", "RunnerOptions", "detect_framework", "load_backend"]
