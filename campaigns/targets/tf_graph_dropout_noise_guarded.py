"""Guarded twin of ``tf_graph_dropout_noise``: the standard deviation is ``tf.exp(0.5 * logvar)``, no sqrt.

Same sensor readings, denoising VAE with input noise, dropout and latent noise drawn
inside the graph, pre-training and Adam ``train_op`` as ``tf_graph_dropout_noise.py``;
only :func:`encoder` differs. A log-variance below -104 still makes ``exp(logvar)`` (the
KL term) underflow to 0, but the gradient of ``exp`` is its value: finite, whatever the
noise and the dropout mask. Clean: no finding expected.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzz_core import GraphTarget

v1 = tf.compat.v1
N_SENSORS, LATENT, HIGH = 32, 4, 80.0


def dense(x, n_out: int, name: str, seed: int, relu: bool = False):
    w = v1.get_variable(f"{name}_w", [int(x.shape[1]), n_out], initializer=v1.glorot_uniform_initializer(seed=seed))
    b = v1.get_variable(f"{name}_b", [n_out], initializer=v1.zeros_initializer())
    out = tf.matmul(x, w) + b
    return tf.nn.relu(out) if relu else out


def encoder(x, seed: int, noise: float = 1.0, rate: float = 0.5):
    noisy = x + tf.random.normal(tf.shape(x), stddev=noise, seed=seed)
    h = tf.nn.dropout(dense(noisy, 32, "enc1", seed, relu=True), rate=rate, seed=seed + 1)
    h = dense(h, 32, "enc2", seed + 2, relu=True)
    mu, logvar = dense(h, LATENT, "mu", seed + 3), dense(h, LATENT, "logvar", seed + 4)
    var = tf.exp(tf.minimum(logvar, 10.0))
    std = tf.exp(0.5 * tf.minimum(logvar, 10.0))
    return mu, logvar, var, std


def decoder(z, seed: int):
    return dense(dense(z, 32, "dec1", seed + 5, relu=True), N_SENSORS, "dec2", seed + 6)


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    latent = rng.standard_normal((n, 3))
    mix = rng.standard_normal((3, N_SENSORS)) * 0.3
    return np.clip(np.exp(latent @ mix + 0.2 * rng.standard_normal((n, N_SENSORS))), 0, HIGH).astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300, lr: float = 1e-4) -> GraphTarget:
    x_all = make_data(4096, seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, N_SENSORS], name="x")
        mu, logvar, var, std = encoder(x, seed)
        z = mu + std * tf.random.normal(tf.shape(std), seed=seed + 7)
        x_hat = decoder(z, seed)
        recon = tf.reduce_mean(tf.reduce_sum(tf.square(x - x_hat), axis=1))
        kl = -0.5 * tf.reduce_mean(tf.reduce_sum(1.0 + logvar - tf.square(mu) - var, axis=1))
        loss = recon + kl
        fit = v1.train.AdamOptimizer(3e-3).minimize(loss)
        train_op = v1.train.AdamOptimizer(lr).minimize(loss)
        init = v1.global_variables_initializer()
    session = v1.Session(graph=graph)
    session.run(init)
    rng = np.random.default_rng(seed)
    for _ in range(pretrain_steps):
        session.run(fit, {x: x_all[rng.integers(0, len(x_all), size=64)]})

    def sample(r: np.random.Generator):
        return {"x": x_all[r.integers(0, len(x_all), size=batch)]}

    return GraphTarget(graph=graph, session=session, feeds={"x": x}, loss=loss, train_op=train_op,
                       sample=sample, bounds={"x": (0.0, HIGH)}, search=["x"])
