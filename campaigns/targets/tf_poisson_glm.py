"""TF2 Poisson regression (a GLM on ``tf.Variable``\\ s) whose own training diverges: ``tf.exp`` overflows.

A count model for bike rentals: ``rate = exp(x @ w + b)`` on 32 standardised weather and
calendar features (clipped to ``[-1, 1]``), the Poisson negative log-likelihood written
by hand as ``mean(rate - y * eta)``. The model is a plain list of ``tf.Variable`` (no
Keras layer); the factory fits it for 300 Adam steps, and the program keeps training
with a Keras SGD optimizer at a learning rate that is stable on real data.

Bug: ``rate = tf.exp(eta)`` in :func:`poisson_nll`, reached only through training. At the
fitted weights ``eta`` stays below ~10 everywhere in the box (``sum |w| + b``), so no
input triggers it at once. But the curvature of the loss is ``mean(rate * x x^T)``: on
real rows (small features, rates of a few units) ``lr * curvature`` is far below 2 and
SGD is stable, while on a batch pushed to a corner of the box (``||x||^2 = 32`` and a rate
in the thousands) one SGD step overshoots by orders of magnitude, the weights explode and
the next forward pass overflows ``exp`` (``inf``; the loss is ``inf`` or NaN). Sampled and
uniformly random batches keep training stable; a searched batch that raises the rate
makes the program's own training step diverge.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzz_core import Target

N_FEATURES = 32


def poisson_nll(w, b, x, y):
    eta = tf.matmul(x, w)[:, 0] + b
    rate = tf.exp(eta)
    return tf.reduce_mean(rate - y * eta)


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = np.clip(0.25 * rng.standard_normal((n, N_FEATURES)), -1, 1).astype(np.float32)
    w = 0.3 * rng.standard_normal(N_FEATURES)
    y = rng.poisson(np.exp(x @ w + 1.0)).astype(np.float32)
    return x, y


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300, lr: float = 0.02) -> Target:
    x_all, y_all = make_data(4096, seed)
    rng = np.random.default_rng(seed)
    w = tf.Variable(0.01 * rng.standard_normal((N_FEATURES, 1)).astype(np.float32), name="w")
    b = tf.Variable(0.0, name="b")
    fit = tf.keras.optimizers.Adam(0.05)

    @tf.function
    def fit_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = poisson_nll(w, b, xb, yb)
        fit.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))

    for _ in range(pretrain_steps):
        idx = rng.integers(0, len(x_all), size=256)
        fit_step(x_all[idx], y_all[idx])
    optimizer = tf.keras.optimizers.SGD(lr)

    def program(batch_):
        return poisson_nll(w, b, batch_["x"], batch_["y"])

    def sample(r: np.random.Generator):
        idx = r.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=[w, b], optimizer=optimizer,
                  bounds={"x": (-1.0, 1.0)}, search=["x"])
