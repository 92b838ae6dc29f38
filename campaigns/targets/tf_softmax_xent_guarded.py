"""Guarded twin of ``tf_softmax_xent_mlp``: the same Keras digits MLP, fused cross-entropy.

The classifier, data, pre-training and training are those of ``tf_softmax_xent_mlp``, but
the model ends in logits and the loss is ``tf.nn.softmax_cross_entropy_with_logits``: the
fused kernel computes ``logsumexp(z) - z_y`` and never takes the log of an underflowed
probability.

Expected: no finding. The only catalogued op is ``SoftmaxCrossEntropyWithLogits``, stable
by construction (recorded so that a finding could name it, never searched), so within
the same bounds ``x`` in ``[0, 1]^64`` nothing can go non-finite.
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
    ])


def cross_entropy(z, y):
    return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=y, logits=z))


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
        return cross_entropy(model(b["x"]), b["y"])

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(x_all), size=batch)
        return {"x": x_all[idx], "y": y_all[idx]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"x": (0.0, 1.0)}, search=["x"])
