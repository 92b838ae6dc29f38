"""Guarded twin of ``tf_graph_scale_div``: the learned scale gets a floor, ``softplus(s) + 1e-6``.

The same TF1-style heteroscedastic regression on 32 vibration sensors (rated range
``[0, 100]``), the same hand-written likelihood and ``tf.cond``, pre-training and
``train_op``; only the scale is ``softplus(s) + 1e-6``, the usual fix.

Expected: no finding. ``r / scale`` and ``log(scale)`` are still op sites (a division and
a log whose argument depends on the inputs), but the scale never falls below ``1e-6``,
so their margins stay positive everywhere in the box: the search exhausts its budget.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzz_core import GraphTarget

v1 = tf.compat.v1
N_SENSORS, HIGH, EPS = 32, 100.0, 1e-6


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
        scale = tf.nn.softplus(out[:, 1]) + EPS
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
