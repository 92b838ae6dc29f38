"""GRIST subject ID_3, GitHub-IPS-9: softmax regression on MNIST with a hand-written cross-entropy.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_3/ghips9.py (entry ghips9_grist.py), an
Aymeric Damien TensorFlow-Examples logistic regression. Facts carried over: a 784 -> 10 softmax
layer, weights and biases initialised to zeros, loss ``-sum(y * log(softmax))`` summed over the
batch, Adam at 0.005, batches of 100, float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bug ID_3: ``log`` of a softmax output that underflows to 0 (-inf, then NaN through ``0 * -inf``).
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 100, lr: float = 0.005) -> GraphTarget:
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        y = v1.placeholder(tf.float32, [None, 10], name="y")
        weights = tf.Variable(tf.zeros([784, 10]), name="W")
        bias = tf.Variable(tf.zeros([10]), name="b")
        probs = tf.nn.softmax(tf.matmul(x, weights) + bias)
        cost = -tf.reduce_sum(y * tf.math.log(probs))  # GRIST bug ID_3
        train = v1.train.AdamOptimizer(lr).minimize(cost)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y}, loss=cost,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
