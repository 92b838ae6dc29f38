"""Keras (TF2) Poisson regression of event counts with an ``exponential`` output, under ``mixed_float16``.

A ``tf.keras.Sequential`` model (``Dense(64, relu)``, ``Dense(1, activation="exponential")``)
predicts the rate of a count (claims per policy, calls per hour) from 64 standardised
features (z-scores clipped to ``[-5, 5]``: the bounds); the program is the Poisson
negative log-likelihood (``tf.keras.losses.poisson`` on the prediction cast to float32).
Built under the campaign's ``precision: {policy: mixed_float16}`` both layers compute in
float16, the output layer included (the Keras mixed-precision guide asks for a float32 last
layer; this author did not); built without it (the same file), in float32.

Bug (mixed precision only): the output layer's ``exponential`` activation in float16. A
float16 ``exp`` overflows once the log-rate passes ``log(65504) = 11.09``: the rate is
``inf`` and so is the loss. In float32 ``exp`` overflows only past 88.7; the witness's
log-rate (~18) gives a large but finite rate and loss.

Why reachable within the bounds: the Glorot-initialised network reaches log-rates of ~18 at
the corner of the box its weights point to (the witness, found by sign-gradient ascent);
sampled rows (Gaussian z-scores) stay below ~1 and uniformly random rows in the box below
~5.5 (2,000 draws; the numbers for seed 0).
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
                                 tf.keras.layers.Dense(1, activation="exponential")])
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
    """A sampled batch whose first row climbs (sign-gradient ascent on the float32 log-rate,
    clipped to the box) to the corner with the largest log-rate."""
    batch = target.sample(np.random.default_rng(0))
    x = tf.Variable(batch["x"][:1])
    for _ in range(30):
        with tf.GradientTape() as tape:
            z = tf.reduce_sum(log_rate(target.model, x))
        x.assign(tf.clip_by_value(x + 0.5 * tf.sign(tape.gradient(z, x)), -BOUND, BOUND))
    batch["x"][0] = x.numpy()[0]
    return batch
