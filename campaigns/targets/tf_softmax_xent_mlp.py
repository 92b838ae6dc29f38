"""TF2/Keras digits MLP with a hand-written softmax cross-entropy: ``tf.math.log`` of a probability that underflows.

An ordinary Keras classifier on scikit-learn's 8x8 digits (pixels scaled to [0, 1]): a
64-128-128-10 ReLU MLP ends in a ``Softmax`` layer and the loss is written by hand as
``-reduce_mean(reduce_sum(y * tf.math.log(p), 1))``. The factory pre-trains it for 400
Adam steps (deterministic from ``seed``), and the program keeps training with SGD.

Bug: ``tf.math.log(p)`` in :func:`cross_entropy`. ``softmax`` computes ``exp(z_k - max z)``;
TensorFlow's CPU kernels flush subnormals to zero, so once the gap between the largest
and the smallest logit of a sample exceeds ~87.3 the smallest probability is exactly 0 in
float32, ``log`` returns ``-inf`` and ``0 * -inf`` makes the loss NaN (for any label).

Why reachable within the bounds: with ``x`` in ``[0, 1]^64`` the trained network reaches
logit gaps of ~160 at some corners of the pixel box (bright pixels where a digit never
has ink), while real digits give gaps below ~65 and uniformly random pixels below ~65:
sampled and random batches do not trigger it, gradient search does.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from fuzz_core import Target


def build_model(hidden: int = 128):
    keras = tf.keras
    return keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(10),
        keras.layers.Softmax(),
    ])


def cross_entropy(p, y):
    return -tf.reduce_mean(tf.reduce_sum(y * tf.math.log(p), axis=1))


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[digits.target]
    return x, y


def pretrain(model, x, y, steps: int, seed: int, lr: float = 1e-2, batch: int = 64) -> None:
    opt = tf.keras.optimizers.Adam(lr)
    rng = np.random.default_rng(seed)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = cross_entropy(model(xb), yb)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    for _ in range(steps):
        idx = rng.integers(0, len(x), size=batch)
        step(x[idx], y[idx])


def make_target(seed: int = 0, batch: int = 8, hidden: int = 128, pretrain_steps: int = 400,
                lr: float = 0.05) -> Target:
    tf.keras.utils.set_random_seed(seed)
    x_all, y_all = load_data()
    model = build_model(hidden)
    pretrain(model, x_all, y_all, pretrain_steps, seed)
    optimizer = tf.keras.optimizers.SGD(lr)

    def program(b):
        p = model(b["x"])
        return cross_entropy(p, b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (0.0, 1.0)}, search=["x"])
