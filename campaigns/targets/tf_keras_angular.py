"""Keras (TF2) verification model trained with an angular loss: ``tf.acos`` of a cosine that is exactly 1.

A ``tf.keras.Sequential`` embedding network (Dense 64-32 ReLU, 32-16) maps both images of
a pair of 8x8 digits (pixels in ``[0, 1]``: the bounds; the pair is one ``(B, 2, 64)``
input) to 16-d codes. The loss is the angle between the codes, written by hand as
``tf.acos(tf.clip_by_value(cos, -1, 1))``, the cosine taken between codes normalised with
``tf.math.l2_normalize`` (the clip keeps a cosine that rounds above 1 out of ``acos``'s NaN), small for pairs of the same digit,
at least ``margin`` for different digits. The factory trains it for 200 steps with a
Keras Adam (deterministic from ``seed``); the program keeps training with Keras Adam.

Bug: ``tf.acos`` in :func:`angle`, in the backward pass only. When the two codes of a pair
point the same way to within rounding, the cosine is exactly 1 (the clip only catches
values above 1): ``acos(1) == 0`` is finite and so is the loss, but the gradient
``-dy / sqrt(1 - x^2)`` is infinite and the optimizer writes NaN into every weight. This is
what training asks for: pairs of the same digit are pulled together. The usual guard
clips to ``1 - 1e-7`` (or drops ``acos`` for ``1 - cos``).

Why reachable within the bounds: an image paired with itself gives equal codes, whose
cosine rounds to exactly 1 for many images; the sampler pairs different images (the digits
hold no two equal images), and codes of different or random images stay degrees apart.
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
    return tf.acos(tf.clip_by_value(cosine(a, b), -1.0, 1.0))


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


def witness(target: Target) -> dict:
    """Sampled pairs whose first pair is an image with itself, for the first image (of a
    fixed draw) whose code has a cosine with itself of exactly 1."""
    batch = target.sample(np.random.default_rng(0))
    x_all, _ = load_data()
    codes = target.model(x_all)
    first = int(np.flatnonzero(cosine(codes, codes).numpy() == 1.0)[0])
    batch["pairs"][0] = x_all[first]
    return batch
