"""TF1-style graph program: a credit-default scorer with a hand-written binary cross-entropy.

Raw ``tf.compat.v1`` graph code (placeholders, ``get_variable``, a ``Session``): a 24-32-1
ReLU network scores standardised tabular features and the loss is written out as
``-(y * log(sigmoid(z)) + (1 - y) * log(1 - sigmoid(z)))``. The factory fits it for 300
Adam steps on synthetic data (a noisy linear rule, 10% of the labels flipped, so the
fitted logits stay moderate); the program's own ``train_op`` keeps training it with
gradient descent.

Bug: ``tf.math.log(1.0 - p)`` in :func:`bce`. In float32 ``sigmoid(z)`` rounds to exactly 1
once ``z > ~16.6``; ``1 - 1 = 0`` and ``log`` returns ``-inf``, so the loss is ``inf`` for a
label 0 and NaN (``0 * -inf``) for a label 1.

Why reachable within the bounds: features are standardised and clipped to ``[-3, 3]``;
the fitted network reaches logits of 30 and more at corners of that box, while real
(Gaussian) rows give logits within about +-10 and uniformly random rows within about
+-13: only a searched input crosses 16.6.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from fuzz_core import GraphTarget

v1 = tf.compat.v1
N_FEATURES = 24
BOUND = 3.0


def make_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = np.clip(rng.standard_normal((n, N_FEATURES)), -BOUND, BOUND).astype(np.float32)
    w = rng.standard_normal(N_FEATURES) / np.sqrt(N_FEATURES)
    y = (x @ w + 0.3 * rng.standard_normal(n) > 0).astype(np.float32)
    flip = rng.random(n) < 0.1
    y[flip] = 1 - y[flip]
    return x, y


def scorer(x, seed: int, hidden: int = 32):
    init = v1.glorot_uniform_initializer(seed=seed)
    w1 = v1.get_variable("w1", [N_FEATURES, hidden], initializer=init)
    b1 = v1.get_variable("b1", [hidden], initializer=v1.zeros_initializer())
    w2 = v1.get_variable("w2", [hidden, 1], initializer=v1.glorot_uniform_initializer(seed=seed + 1))
    b2 = v1.get_variable("b2", [1], initializer=v1.zeros_initializer())
    h = tf.nn.relu(tf.matmul(x, w1) + b1)
    return tf.squeeze(tf.matmul(h, w2) + b2, axis=1)


def bce(z, y):
    p = tf.sigmoid(z)
    return -tf.reduce_mean(y * tf.math.log(p) + (1.0 - y) * tf.math.log(1.0 - p))


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300, lr: float = 1e-3) -> GraphTarget:
    x_all, y_all = make_data(4096, seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, N_FEATURES], name="x")
        y = v1.placeholder(tf.float32, [None], name="y")
        loss = bce(scorer(x, seed), y)
        fit = v1.train.AdamOptimizer(1e-2).minimize(loss)
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
                       sample=sample, bounds={"x": (-BOUND, BOUND)}, search=["x"])
