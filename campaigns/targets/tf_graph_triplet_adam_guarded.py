"""Guarded twin of ``tf_graph_triplet_adam``: the distance takes a small value inside the sqrt, ``tf.sqrt(sum + 1e-12)``.

Same digits, triplets, embedding network, triplet loss and Adam ``train_op`` as
``tf_graph_triplet_adam.py``; only :func:`distance` differs. Equal images still give a
sum of squares of exactly 0, but ``sqrt`` then sees ``1e-12``: its gradient is finite.
Clean: no finding expected.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from fuzz_core import GraphTarget

v1 = tf.compat.v1
N_PIX, CODE = 64, 16


def dense(x, n_out: int, name: str, seed: int, relu: bool = False):
    w = v1.get_variable(f"{name}_w", [int(x.shape[-1]), n_out], initializer=v1.glorot_uniform_initializer(seed=seed))
    b = v1.get_variable(f"{name}_b", [n_out], initializer=v1.zeros_initializer())
    out = tf.matmul(x, w) + b
    return tf.nn.relu(out) if relu else out


def embed(x, seed: int):
    with v1.variable_scope("embed", reuse=v1.AUTO_REUSE):
        return dense(dense(x, 32, "h1", seed, relu=True), CODE, "code", seed + 1)


def distance(a, b):
    return tf.sqrt(tf.reduce_sum(tf.square(a - b), 1) + 1e-12)


def load_data():
    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target


def sample_triplets(x_all, labels, n: int, rng: np.random.Generator):
    """(anchor, positive of the same digit, negative of another digit): three different images."""
    anchor = rng.integers(0, len(x_all), size=n)
    pos, neg = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    for k in range(n):
        same = np.flatnonzero(labels == labels[anchor[k]])
        same = same[same != anchor[k]]
        other = np.flatnonzero(labels != labels[anchor[k]])
        pos[k], neg[k] = same[rng.integers(0, len(same))], other[rng.integers(0, len(other))]
    return np.stack([x_all[anchor], x_all[pos], x_all[neg]], 1)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 200, lr: float = 1e-3) -> GraphTarget:
    x_all, labels = load_data()
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        triplets = v1.placeholder(tf.float32, [None, 3, N_PIX], name="triplets")
        anchor, pos, neg = (embed(triplets[:, k], seed) for k in range(3))
        loss = tf.reduce_mean(tf.nn.relu(distance(anchor, pos) - distance(anchor, neg) + 0.5))
        train_op = v1.train.AdamOptimizer(lr).minimize(loss)
        init = v1.global_variables_initializer()
    session = v1.Session(graph=graph)
    session.run(init)
    rng = np.random.default_rng(seed)
    for _ in range(pretrain_steps):
        session.run(train_op, {triplets: sample_triplets(x_all, labels, 64, rng)})

    def sample(r: np.random.Generator):
        return {"triplets": sample_triplets(x_all, labels, batch, r)}

    return GraphTarget(graph=graph, session=session, feeds={"triplets": triplets}, loss=loss,
                       train_op=train_op, sample=sample, bounds={"triplets": (0.0, 1.0)}, search=["triplets"])
