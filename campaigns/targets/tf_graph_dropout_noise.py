"""TF1-style denoising VAE of sensor readings, with input noise, dropout and the latent noise drawn inside the graph.

Raw ``tf.compat.v1`` graph code. A denoising VAE of the readings (mm/s) of 32 vibration
sensors, log-normal around 1 with a rated range ``[0, 80]`` (the bounds): the readings
are corrupted inside the graph (``x + tf.random.normal(..., stddev=0.5)``), encoded by a
32-32 ReLU layer with ``tf.nn.dropout(rate=0.2)`` and a second 32-32 ReLU layer into a
mean and a log-variance of 4 latents; the variance is guarded against overflow
(``tf.exp(tf.minimum(logvar, 10))``), the standard deviation is ``tf.sqrt(var)`` and the
latent sample ``mu + std * tf.random.normal(...)``; a 4-32-32 decoder reconstructs the
clean readings. ``train_op`` is ``tf.train.AdamOptimizer(1e-4)``. The factory fits the
VAE for 300 steps (deterministic from ``seed``). The three random draws are ops of the
graph, whose state a TF1 session advances at every run: the engine draws their values itself
from each step's seed and feeds them in place of the ops' outputs, so a replay in a fresh build
sees the noise and the dropout mask the search saw.

Bug: ``tf.sqrt(var)`` in :func:`encoder`, in the backward pass only. Once a log-variance
falls below -103.97, ``exp`` underflows to exactly 0; ``sqrt(0) == 0`` is finite and so is
the loss (the KL term uses ``logvar``), but the gradient ``0.5 * dy / sqrt(0)`` is infinite
(``dy`` is the latent noise times the decoder's gradient), and Adam writes NaN into the
encoder. Near that edge, whether a given input crosses it depends on the dropout mask and
the input noise of the run; with them drawn from the step's seed the finding replays (before the
engine fed them, it was *flaky*: reproduced by some fresh replays, not all).

Why reachable within the bounds: the encoder is piecewise linear in the readings; with
some sensors near the top of their range and others near 0 a log-variance goes far below
-104; real readings keep it above about -13, and uniformly random ones above about -50.
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
    std = tf.sqrt(var)
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
