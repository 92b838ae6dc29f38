"""Keras (TF2) regressor of raw detector counts, trained under the ``mixed_float16`` policy.

A ``tf.keras.Sequential`` model (Dense 32 ReLU, then a float32 Dense 1 head, as the Keras
mixed-precision guide asks for the last layer) predicts a dose from 16 channels of photon
counts. The counts go in raw: each channel reads 0 to 60,000 (the detector saturates
there: the bounds); typical readings are below 2,000 (the sampler). Built under the
campaign's ``precision: {policy: mixed_float16}``, the hidden layer computes in float16;
built without it (the same file), in float32. The program is the mean squared error.

Bug (mixed precision only): the hidden ``Dense``'s ``MatMul`` in float16. With several
channels near saturation a hidden unit's pre-activation is ~1e5, beyond float16's 65,504:
the product is inf, and the float32 head turns it into NaN. In float32 the same input
gives ~1e5, far from float32's limit: finite. The usual guard scales the counts to
``[0, 1]`` in float32 before the float16 layers (``tf_keras_mixed_guarded``).

Why reachable within the bounds: the Glorot-initialised 16x32 kernel has, for most units,
positive weights summing to more than 1.1; 60,000 on those channels overflows float16.
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
