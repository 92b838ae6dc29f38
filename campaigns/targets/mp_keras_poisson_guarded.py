"""Guarded twin of ``mp_keras_poisson``: the output layer computes in float32, as the Keras guide asks.

The same model, data, bounds and loss as ``mp_keras_poisson.py``, except that the output
layer is built with ``dtype="float32"``: under ``mixed_float16`` the hidden ``Dense`` still
computes in float16 (its activations stay below ~100 within the bounds), while the
``exponential`` runs in float32, where a log-rate of ~18 (the largest within the bounds) is
far from ``exp``'s overflow at 88.7. Clean in float32 and under the policy: no finding expected.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzz_core import Target

FEATURES, HIDDEN, BOUND = 64, 64, 5.0


def make_target(seed: int = 0, batch: int = 8) -> Target:
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                 tf.keras.layers.Dense(HIDDEN, activation="relu"),
                                 tf.keras.layers.Dense(1, activation="exponential", dtype="float32")])
    coef = np.random.default_rng(seed).normal(0, 0.1, (FEATURES,))

    def program(b):
        rate = tf.cast(model(b["x"]), tf.float32)
        return tf.reduce_mean(tf.keras.losses.poisson(b["y"], rate))

    def sample(r: np.random.Generator):
        x = np.clip(r.standard_normal((batch, FEATURES)), -BOUND, BOUND).astype(np.float32)
        y = r.poisson(np.exp(x @ coef))[:, None].astype(np.float32)
        return {"x": x, "y": y}

    return Target(program=program, sample=sample, model=model,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])


def log_rate(model, x):
    """The output layer's pre-activation (the log-rate), computed in float32 from the weights."""
    hidden, out = model.layers
    h = tf.nn.relu(tf.matmul(x, tf.cast(hidden.kernel, tf.float32)) + tf.cast(hidden.bias, tf.float32))
    return tf.matmul(h, tf.cast(out.kernel, tf.float32)) + tf.cast(out.bias, tf.float32)


def witness(target: Target) -> dict:
    """The buggy subject's witness: the corner of the box with the largest log-rate."""
    batch = target.sample(np.random.default_rng(0))
    x = tf.Variable(batch["x"][:1])
    for _ in range(30):
        with tf.GradientTape() as tape:
            z = tf.reduce_sum(log_rate(target.model, x))
        x.assign(tf.clip_by_value(x + 0.5 * tf.sign(tape.gradient(z, x)), -BOUND, BOUND))
    batch["x"][0] = x.numpy()[0]
    return batch
