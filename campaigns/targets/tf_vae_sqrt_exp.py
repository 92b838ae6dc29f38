"""TF2/Keras VAE for vibration-sensor anomaly detection: ``std = tf.sqrt(tf.exp(logvar))`` overflows.

A small Keras VAE (a 32-32-32 ReLU encoder with a mean and a log-variance head of 4
latents, a reparameterisation drawing from a layer's own Keras ``SeedGenerator``, a
4-32-32 decoder) models the readings (mm/s) of 32 vibration sensors. Readings are
positive and heavy-tailed (log-normal around 1; 99% of them below 5) while the sensors'
rated range is ``[0, 400]``: those are the bounds, and an anomaly detector must accept
any reading in them. The loss is a Gaussian reconstruction error plus the
KL term, written by hand. The factory fits it for 300 Adam steps (deterministic from
``seed``); the program under test scores a batch of readings with it (the negative ELBO
is the anomaly score), without training.

Bug: ``var = tf.exp(logvar)`` in :meth:`VAE.encode`. ``exp`` overflows to ``inf`` once a
log-variance exceeds 88.72; then ``std = tf.sqrt(var) = inf``, the sample
``mu + std * eps`` is ``+-inf`` and the decoder turns it into NaN (``inf - inf``); the
KL term is infinite too.

Why reachable within the bounds: the encoder is piecewise linear in the readings; with
some sensors near the top of their range and others near zero (an out-of-distribution
pattern the model never saw) its log-variance head reaches ~160, while real readings give
log-variances below ~1 and uniformly random readings in the range below ~30 (their
contributions largely cancel). Only a searched input crosses 88.7.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzz_core import Target

N_SENSORS, LATENT, HIGH = 32, 4, 400.0


class VAE(tf.keras.Model):
    """Encoder, reparameterisation and decoder (the model under test)."""

    def __init__(self, hidden: int = 32, seed: int = 0):
        super().__init__()
        layers = tf.keras.layers
        self.enc = tf.keras.Sequential([layers.Dense(hidden, activation="relu"),
                                        layers.Dense(hidden, activation="relu")])
        self.mu = layers.Dense(LATENT)
        self.logvar = layers.Dense(LATENT)
        self.dec = tf.keras.Sequential([layers.Dense(hidden, activation="relu"), layers.Dense(N_SENSORS)])
        self.noise = tf.keras.random.SeedGenerator(seed)

    def encode(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        var = tf.exp(logvar)
        return mu, logvar, var

    def call(self, x):
        mu, logvar, var = self.encode(x)
        std = tf.sqrt(var)
        eps = tf.keras.random.normal(tf.shape(mu), seed=self.noise)
        z = mu + std * eps
        return self.dec(z), mu, logvar, var


def vae_loss(model, x):
    x_hat, mu, logvar, var = model(x)
    recon = tf.reduce_mean(tf.reduce_sum(tf.square(x - x_hat), axis=1))
    kl = -0.5 * tf.reduce_mean(tf.reduce_sum(1.0 + logvar - tf.square(mu) - var, axis=1))
    return recon + kl


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    latent = rng.standard_normal((n, 3))
    mix = rng.standard_normal((3, N_SENSORS)) * 0.3
    return np.clip(np.exp(latent @ mix + 0.2 * rng.standard_normal((n, N_SENSORS))), 0, HIGH).astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300) -> Target:
    tf.keras.utils.set_random_seed(seed)
    x_all = make_data(4096, seed)
    model = VAE(seed=seed)
    model(x_all[:2])
    fit = tf.keras.optimizers.Adam(3e-3)

    @tf.function
    def fit_step(xb):
        with tf.GradientTape() as tape:
            loss = vae_loss(model, xb)
        fit.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    rng = np.random.default_rng(seed)
    for _ in range(pretrain_steps):
        fit_step(x_all[rng.integers(0, len(x_all), size=64)])

    def program(b):
        return vae_loss(model, b["x"])

    def sample(r: np.random.Generator):
        return {"x": x_all[r.integers(0, len(x_all), size=batch)]}

    return Target(program=program, sample=sample, model=model, bounds={"x": (0.0, HIGH)}, search=["x"])
