"""TF1-style graph program: heteroscedastic regression dividing by a learned scale that underflows.

Raw ``tf.compat.v1`` graph code. A 32-32 ReLU network reads 32 vibration sensors (mm/s;
log-normal around 1, 99% of readings below 5, rated range ``[0, 100]``: the bounds) and
predicts a bearing temperature together with the scale of its error, made positive with
``softplus``. The negative log-likelihood is written by hand, ``0.5 * (r / scale)^2 +
log(scale)``; the author skips the standardised residual of batches with a non-finite
residual with ``tf.cond`` (so the division lives in the branch graph of an ``If`` op).
The factory fits the model for 400 Adam steps; the program's own ``train_op`` keeps
training it with gradient descent.

Bug: ``r / scale`` in :func:`nll` (and ``tf.math.log(scale)`` next to it). ``softplus(s)`` is
``exp(s)`` for very negative ``s`` and TensorFlow's CPU kernels flush subnormals to zero,
so once the scale head's output ``s`` falls below ~-87.3 the scale is exactly 0: the
division gives ``inf`` (``0 / 0 = NaN`` for a zero residual) and ``log`` gives ``-inf``.

Why reachable within the bounds: the scale head is piecewise linear in the readings;
with some sensors near the top of their rated range and others near zero (a pattern
never seen in training) it reaches ``s`` of several hundred below zero, while real
readings keep ``s`` above about -5 and uniformly random readings above about -60 (their
contributions partly cancel).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzz_core import GraphTarget

v1 = tf.compat.v1
N_SENSORS, HIGH = 32, 100.0


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    latent = rng.standard_normal((n, 3))
    x = np.clip(np.exp(latent @ (0.3 * rng.standard_normal((3, N_SENSORS)))
                       + 0.2 * rng.standard_normal((n, N_SENSORS))), 0, HIGH).astype(np.float32)
    log_noise = 0.8 * latent[:, 1] - 0.5
    y = (40.0 + 3.0 * latent[:, 0] + np.exp(log_noise) * rng.standard_normal(n)).astype(np.float32)
    return x, y


def dense(x, n_out: int, name: str, seed: int):
    w = v1.get_variable(f"{name}_w", [int(x.shape[1]), n_out], initializer=v1.glorot_uniform_initializer(seed=seed))
    b = v1.get_variable(f"{name}_b", [n_out], initializer=v1.zeros_initializer())
    return tf.matmul(x, w) + b


def nll(y, mu, scale):
    r = y - mu
    z = tf.cond(tf.reduce_all(tf.math.is_finite(r)), lambda: r / scale, lambda: tf.zeros_like(r))
    return tf.reduce_mean(0.5 * tf.square(z) + tf.math.log(scale))


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 400, lr: float = 1e-4) -> GraphTarget:
    x_all, y_all = make_data(4096, seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, N_SENSORS], name="x")
        y = v1.placeholder(tf.float32, [None], name="y")
        h = tf.nn.relu(dense(x, 32, "hidden", seed))
        out = dense(h, 2, "head", seed + 1)
        mu = 40.0 + out[:, 0]
        scale = tf.nn.softplus(out[:, 1])
        loss = nll(y, mu, scale)
        fit = v1.train.AdamOptimizer(3e-3).minimize(loss)
        train_op = v1.train.GradientDescentOptimizer(lr).minimize(loss)
        init = v1.global_variables_initializer()
    session = v1.Session(graph=graph)
    session.run(init)
    rng = np.random.default_rng(seed)
    for _ in range(pretrain_steps):
        idx = rng.integers(0, len(x_all), size=128)
        session.run(fit, {x: x_all[idx], y: y_all[idx]})

    def sample(r: np.random.Generator):
        idx = r.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return GraphTarget(graph=graph, session=session, feeds={"x": x, "y": y}, loss=loss, train_op=train_op,
                       sample=sample, bounds={"x": (0.0, HIGH)}, search=["x"])
