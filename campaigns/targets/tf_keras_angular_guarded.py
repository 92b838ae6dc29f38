"""Guarded twin of ``tf_keras_angular``: the cosine is clipped to ``1 - 1e-7`` before ``tf.acos``.

Same digits, pairs, Keras embedding network, angular loss, pre-training and Keras Adam
training as ``tf_keras_angular.py``; only :func:`angle` differs. Equal codes still give a
cosine of exactly 1, but the clip lowers it to ``1 - 1e-7``, where ``acos`` has a finite
gradient, and passes no gradient beyond it. Clean: no finding expected.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from fuzz_core import Target

N_PIX, CODE = 64, 16


def cosine(a, b):
    return tf.reduce_sum(tf.math.l2_normalize(a, -1) * tf.math.l2_normalize(b, -1), -1)


def angle(a, b):
    return tf.acos(tf.clip_by_value(cosine(a, b), -1.0 + 1e-7, 1.0 - 1e-7))


def angular_loss(model, pairs, same, margin: float = 1.0):
    theta = angle(model(pairs[:, 0]), model(pairs[:, 1]))
    return tf.reduce_mean(same * theta + (1.0 - same) * tf.nn.relu(margin - theta))


def load_data():
    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target


def sample_pairs(x_all, labels, n: int, rng: np.random.Generator):
    """Half pairs of the same digit, half of different digits; never an image with itself."""
    i = rng.integers(0, len(x_all), size=n)
    same = np.arange(n) % 2 == 0
    j = np.empty(n, dtype=np.int64)
    for k in range(n):
        pool = np.flatnonzero((labels == labels[i[k]]) == same[k])
        pool = pool[pool != i[k]]
        j[k] = pool[rng.integers(0, len(pool))]
    return np.stack([x_all[i], x_all[j]], 1), same.astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 200, lr: float = 1e-3) -> Target:
    tf.keras.utils.set_random_seed(seed)
    x_all, labels = load_data()
    model = tf.keras.Sequential([tf.keras.Input((N_PIX,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(CODE)])
    fit = tf.keras.optimizers.Adam(3e-3)

    @tf.function
    def fit_step(pairs, same):
        with tf.GradientTape() as tape:
            loss = angular_loss(model, pairs, same)
        fit.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    rng = np.random.default_rng(seed)
    for _ in range(pretrain_steps):
        fit_step(*sample_pairs(x_all, labels, 64, rng))
    optimizer = tf.keras.optimizers.Adam(lr)

    def program(b):
        return angular_loss(model, b["pairs"], b["same"])

    def sample(r: np.random.Generator):
        pairs, same = sample_pairs(x_all, labels, batch, r)
        return {"pairs": pairs, "same": same}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"pairs": (0.0, 1.0)}, search=["pairs"])
