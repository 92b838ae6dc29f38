"""Guarded twin of ``tf_keras_mixed``: the counts are scaled to ``[0, 1]`` in float32 first.

Same detector counts, bounds, model and loss as ``tf_keras_mixed.py``, with one more layer
in front: ``Rescaling(1 / 60,000)`` kept in float32 (``dtype="float32"``), so the float16
hidden layer sees inputs in ``[0, 1]`` and its pre-activations stay below ~20 under
``mixed_float16``. Clean in float32 and in mixed precision: no finding expected.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzz_core import Target

CHANNELS, HIDDEN = 16, 32
FULL_SCALE = 60_000.0


def make_target(seed: int = 0, batch: int = 8) -> Target:
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.Input((CHANNELS,)),
                                 tf.keras.layers.Rescaling(1.0 / FULL_SCALE, dtype="float32"),
                                 tf.keras.layers.Dense(HIDDEN, activation="relu"),
                                 tf.keras.layers.Dense(1, dtype="float32")])
    dose = np.random.default_rng(seed).uniform(0.0, 1e-3, (CHANNELS, 1)).astype(np.float32)

    def program(b):
        pred = model(b["counts"])
        return tf.reduce_mean(tf.square(pred - b["dose"]))

    def sample(r: np.random.Generator):
        counts = r.uniform(0.0, 2_000.0, (batch, CHANNELS)).astype(np.float32)
        return {"counts": counts, "dose": counts @ dose}

    return Target(program=program, sample=sample, model=model,
                  bounds={"counts": (0.0, FULL_SCALE)}, search=["counts"])
