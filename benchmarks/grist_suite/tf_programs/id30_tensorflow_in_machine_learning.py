"""GRIST subject ID_30, Tensorflow_In_MachineLearning: an MNIST softmax regression with a hand-written cross-entropy.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_30/softmax.py (entry softmax_grist.py).
Facts carried over: a 784 -> 10 softmax layer with zero-initialised weights and biases; loss
``-sum(y * log(softmax))`` summed over the batch; plain gradient descent at 0.01; batches of 100;
float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bug ID_30: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 100, lr: float = 0.01) -> GraphTarget:
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        y_ = v1.placeholder(tf.float32, [None, 10], name="y_")
        weights = tf.Variable(tf.zeros([784, 10]), name="W")
        bias = tf.Variable(tf.zeros([10]), name="b")
        y = tf.nn.softmax(tf.matmul(x, weights) + bias)
        cross_entropy = -tf.reduce_sum(y_ * tf.math.log(y))  # GRIST bug ID_30
        train = v1.train.GradientDescentOptimizer(lr).minimize(cross_entropy)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y_}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
