"""TF1-style graph VAE for vibration-sensor anomaly scores: ``tf.sqrt(tf.exp(logvar))`` overflows.

Raw ``tf.compat.v1`` graph code: a VAE (32-32-32 ReLU encoder with a mean and a
log-variance head of 4 latents, a 4-32-32 decoder) of the readings (mm/s) of 32
vibration sensors, log-normal around 1 (99% below 5) with a rated range ``[0, 250]``: the
bounds. The reparameterisation noise is an external value, fed through a placeholder
``eps`` that ``sample`` draws (not searched). The loss, written by hand, is a Gaussian
reconstruction error plus the KL term; the factory fits the VAE for 300 Adam steps and
the program under test scores batches with it (the negative ELBO is the anomaly score;
no training op).

Bug: ``var = tf.exp(logvar)`` in :func:`encoder`, then ``std = tf.sqrt(var)``. ``exp``
overflows to ``inf`` once a log-variance exceeds 88.72: ``std`` is ``inf``, the latent
sample ``mu + std * eps`` is ``+-inf`` and the decoder's first matmul makes NaN; the KL
term is infinite.

Why reachable within the bounds: the encoder is piecewise linear in the readings; with
some sensors near the top of their rated range and others near zero it reaches
log-variances above 150, while real readings stay below ~2 and uniformly random
readings below ~60 (their contributions largely cancel).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzz_core import GraphTarget

v1 = tf.compat.v1
N_SENSORS, LATENT, HIGH = 32, 4, 250.0


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    latent = rng.standard_normal((n, 3))
    mix = rng.standard_normal((3, N_SENSORS)) * 0.3
    return np.clip(np.exp(latent @ mix + 0.2 * rng.standard_normal((n, N_SENSORS))), 0, HIGH).astype(np.float32)


def dense(x, n_out: int, name: str, seed: int, relu: bool = False):
    w = v1.get_variable(f"{name}_w", [int(x.shape[1]), n_out], initializer=v1.glorot_uniform_initializer(seed=seed))
    b = v1.get_variable(f"{name}_b", [n_out], initializer=v1.zeros_initializer())
    out = tf.matmul(x, w) + b
    return tf.nn.relu(out) if relu else out


def encoder(x, seed: int):
    h = dense(dense(x, 32, "enc1", seed, relu=True), 32, "enc2", seed + 1, relu=True)
    mu = dense(h, LATENT, "mu", seed + 2)
    logvar = dense(h, LATENT, "logvar", seed + 3)
    var = tf.exp(logvar)
    return mu, logvar, var


def decoder(z, seed: int):
    return dense(dense(z, 32, "dec1", seed + 4, relu=True), N_SENSORS, "dec2", seed + 5)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300) -> GraphTarget:
    x_all = make_data(4096, seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, N_SENSORS], name="x")
        eps = v1.placeholder(tf.float32, [None, LATENT], name="eps")
        mu, logvar, var = encoder(x, seed)
        std = tf.sqrt(var)
        x_hat = decoder(mu + std * eps, seed)
        recon = tf.reduce_mean(tf.reduce_sum(tf.square(x - x_hat), axis=1))
        kl = -0.5 * tf.reduce_mean(tf.reduce_sum(1.0 + logvar - tf.square(mu) - var, axis=1))
        loss = recon + kl
        fit = v1.train.AdamOptimizer(3e-3).minimize(loss)
        init = v1.global_variables_initializer()
    session = v1.Session(graph=graph)
    session.run(init)
    rng = np.random.default_rng(seed)
    for _ in range(pretrain_steps):
        xb = x_all[rng.integers(0, len(x_all), size=64)]
        session.run(fit, {x: xb, eps: rng.standard_normal((64, LATENT)).astype(np.float32)})

    def sample(r: np.random.Generator):
        return {"x": x_all[r.integers(0, len(x_all), size=batch)],
                "eps": r.standard_normal((batch, LATENT)).astype(np.float32)}

    return GraphTarget(graph=graph, session=session, feeds={"x": x, "eps": eps}, loss=loss, sample=sample,
                       bounds={"x": (0.0, HIGH)}, search=["x"])
