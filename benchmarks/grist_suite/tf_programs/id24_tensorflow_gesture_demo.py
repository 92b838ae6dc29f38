"""GRIST subject ID_24, Tensorflow_Gesture_Demo: the "Deep MNIST" CNN without dropout.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_24/Mnist.py (entry Mnist_grist.py). Facts
carried over: the tutorial's network (see :func:`._common.tutorial_cnn_softmax`) with no dropout
layer (the program defines a keep probability but never applies it); loss ``-sum(y * log(softmax))``
over the batch; Adam at 1e-4; batches of 100; float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bug ID_24: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, tutorial_cnn_softmax, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 100, lr: float = 1e-4) -> GraphTarget:
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x-input")
        y_label = v1.placeholder(tf.float32, [None, 10], name="y-input")
        y = tutorial_cnn_softmax(tf.reshape(x, [-1, 28, 28, 1]), None)
        cross_entropy = -tf.reduce_sum(y_label * tf.math.log(y))  # GRIST bug ID_24
        train = v1.train.AdamOptimizer(lr).minimize(cross_entropy)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y_label}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
