"""Framework backends. Each is the only module that imports its framework.

``load_backend(name)`` imports one lazily; ``detect_framework(obj)`` infers the
framework of a Target without importing any framework that is not loaded yet.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from fuzz_core.backends.base import Evaluation, OpRef, Runner, RunnerOptions

FRAMEWORKS = ("torch", "tensorflow")

# TensorFlow sizes its thread pools when its context starts, which a factory does before the
# backend loads: one thread each unless the user says otherwise (small programs, shared CPUs).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")


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
        keras = sys.modules.get("keras")
        tf_types: tuple = (tf.Module, tf.Variable)
        if keras is not None:   # Keras 3 models are not tf.Modules, nor its variables tf.Variables
            tf_types += tuple(t for t in (getattr(keras, "Model", None), getattr(keras, "Variable", None),
                                          getattr(getattr(keras, "optimizers", None), "Optimizer", None))
                              if isinstance(t, type))
        if isinstance(model, tf_types) or (
            isinstance(model, (list, tuple)) and model and isinstance(model[0], tf_types)
        ) or (model is None and isinstance(getattr(target, "optimizer", None), tf_types)):
            return "tensorflow"
        if model is None and torch is None:
            return "tensorflow"
    return "torch"


__all__ = ["Evaluation", "OpRef", "Runner", "RunnerOptions", "detect_framework", "load_backend"]
