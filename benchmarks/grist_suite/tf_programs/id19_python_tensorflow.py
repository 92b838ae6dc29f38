"""GRIST subject ID_19, Python-Tensorflow: an MNIST softmax layer followed by a ReLU, then a log loss.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_19/mnist.py (entry mnist_grist.py). Facts
carried over: one 784 -> 10 layer whose softmax output goes through ``relu`` (the program's
``add_layer`` applies the activation after the softmax), weights and biases initialised to zeros;
loss ``mean over the batch of -sum(y * log(prediction))``; plain gradient descent at 0.2; batches of
50; float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bug ID_19: ``log`` of a prediction that underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def _add_layer(inputs, in_size: int, out_size: int, activation=None):
    weights = tf.Variable(tf.zeros([in_size, out_size]))
    biases = tf.Variable(tf.zeros([out_size]))
    out = tf.nn.softmax(tf.matmul(inputs, weights) + biases)
    return out if activation is None else activation(out)


def make_target(seed: int = 0, batch: int = 50, lr: float = 0.2) -> GraphTarget:
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x_input = v1.placeholder(tf.float32, [None, 784], name="x_input")
        y = v1.placeholder(tf.float32, [None, 10], name="y")
        prediction = _add_layer(x_input, 784, 10, activation=tf.nn.relu)
        cross_entropy = tf.reduce_mean(-tf.reduce_sum(y * tf.math.log(prediction), axis=[1]))  # GRIST bug ID_19
        train = v1.train.GradientDescentOptimizer(lr).minimize(cross_entropy)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x_input, "y": y}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
