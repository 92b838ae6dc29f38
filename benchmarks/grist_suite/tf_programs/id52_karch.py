"""GRIST subject ID_52, karch: an MNIST softmax regression whose loss sums over the whole batch.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_52/5_mnist_full_connection.py (entry
5_mnist_full_connection_grist.py). Facts carried over: a 784 -> 10 softmax layer with
zero-initialised weights and biases; loss ``mean(-sum(y * log(softmax)))`` where the sum runs over
every element of the batch (the mean is then of a scalar); plain gradient descent at 0.005; batches
of 100; float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bug ID_52: ``log`` of a softmax output that underflows to 0.
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
        y_ = v1.placeholder(tf.float32, [None, 10], name="y_")
        y = tf.nn.softmax(tf.matmul(x, tf.Variable(tf.zeros([784, 10]))) + tf.Variable(tf.zeros([10])))
        cross_entropy = tf.reduce_mean(-tf.reduce_sum(y_ * tf.math.log(y)))  # GRIST bug ID_52
        train = v1.train.GradientDescentOptimizer(lr).minimize(cross_entropy)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y_}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
