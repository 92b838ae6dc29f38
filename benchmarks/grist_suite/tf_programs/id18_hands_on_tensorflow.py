"""GRIST subject ID_18, Hands-On TensorFlow: an MNIST softmax regression with truncated-normal weights.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_18/code_10_image.py (entry
code_10_image_grist.py). Facts carried over: a 784 -> 10 softmax layer, weights from a truncated
normal of stddev 0.1 and biases 0.1; loss ``mean over the batch of -sum(y * log(softmax))``; plain
gradient descent at 0.5; batches of 100; float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bug ID_18: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 100, lr: float = 0.5) -> GraphTarget:
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        labels = v1.placeholder(tf.float32, [None, 10], name="labels")
        weight = tf.Variable(tf.random.truncated_normal([784, 10], stddev=0.1), name="weight")
        bias = tf.Variable(tf.constant(0.1, shape=[10]), name="bias")
        y = tf.nn.softmax(tf.matmul(x, weight) + bias, name="y")
        per_image = -tf.reduce_sum(labels * tf.math.log(y), axis=[1])  # GRIST bug ID_18
        cross_entropy = tf.reduce_mean(per_image, name="cross_entropy")
        train = v1.train.GradientDescentOptimizer(lr).minimize(cross_entropy)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": labels}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
