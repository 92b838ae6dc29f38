"""TF2 ``tf.function`` fine-tuning a tabular classifier with a softmax written by hand: ``tf.exp`` overflows.

A Keras 32-32-32-5 ReLU MLP classifies standardised sensor features (clipped to
``[-3, 3]``). The factory fits it with the fused cross-entropy (400 Adam steps on
synthetic data, deterministic from ``seed``). The program under test is a ``tf.function``
that fine-tunes it for calibration: on a labelled batch (an autograph ``if`` on a
tensor, so in a graph its body lives in the branch graph of an ``If`` op) it takes a
Brier score of probabilities computed as ``tf.exp(z) / reduce_sum(tf.exp(z))``, without
subtracting the maximum; unlabelled batches get a plain logsumexp penalty.

Bug: ``e = tf.exp(z)`` in :func:`softmax`. In float32 ``exp`` overflows to ``inf`` for
``z > 88.72``; the division is then ``inf / inf = NaN``.

Why reachable within the bounds: with ``x`` in ``[-3, 3]^32`` the fitted network reaches
logits of ~150 at corners of the box, while real rows (Gaussian) give logits below ~45
and uniformly random rows below ~75.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzz_core import Target

N_FEATURES, N_CLASSES, BOUND = 32, 5, 3.0


def build_model(hidden: int = 32):
    keras = tf.keras
    return keras.Sequential([
        keras.Input((N_FEATURES,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(N_CLASSES),
    ])


def softmax(z):
    e = tf.exp(z)
    return e / tf.reduce_sum(e, axis=1, keepdims=True)


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = np.clip(rng.standard_normal((n, N_FEATURES)), -BOUND, BOUND).astype(np.float32)
    w = rng.standard_normal((N_FEATURES, N_CLASSES))
    labels = np.argmax(x @ w + 0.5 * rng.standard_normal((n, N_CLASSES)), axis=1)
    return x, np.eye(N_CLASSES, dtype=np.float32)[labels]


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 400, lr: float = 1e-3) -> Target:
    tf.keras.utils.set_random_seed(seed)
    x_all, y_all = make_data(4096, seed)
    model = build_model()
    fit = tf.keras.optimizers.Adam(1e-2)

    @tf.function
    def fit_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=yb, logits=model(xb)))
        fit.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    rng = np.random.default_rng(seed)
    for _ in range(pretrain_steps):
        idx = rng.integers(0, len(x_all), size=128)
        fit_step(x_all[idx], y_all[idx])
    optimizer = tf.keras.optimizers.SGD(lr)

    @tf.function
    def program(b):
        z = model(b["x"])
        if tf.reduce_sum(b["y"]) > 0:                     # a labelled batch: Brier score
            p = softmax(z)
            loss = tf.reduce_mean(tf.reduce_sum(tf.square(p - b["y"]), axis=1))
        else:                                             # unlabelled: keep the logits small
            loss = 1e-3 * tf.reduce_mean(tf.reduce_logsumexp(z, axis=1))
        return loss

    def sample(r: np.random.Generator):
        idx = r.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (-BOUND, BOUND)}, search=["x"])
