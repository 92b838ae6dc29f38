"""GRIST subject ID_45, DataStructure: two MNIST classifiers of one repository, a softmax regression and a CNN.

Re-expressed from GRIST's benchmark,
scripts/study_case/ID_45/MNIST_Digit_classification_using_CNN.py (``variant="softmax"``, entry
MNIST_Digit_classification_using_CNN_grist.py) and MNIST_Digit_classification_using_CNN2.py
(``variant="cnn"``, entry ..._CNN2_grist.py). Facts carried over, ``"softmax"``: a 784 -> 10 softmax
layer with zero-initialised weights and biases, plain gradient descent at 0.5; ``"cnn"``: the "Deep
MNIST for experts" network (see :func:`._common.tutorial_cnn_softmax`) with dropout kept at the
training probability 0.5 inside the graph, Adam at 1e-4. Both: loss ``mean over the batch of -sum(y
* log(p))``, batches of 50, float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bugs (ids in the order of GRIST's entry files):
- ID_45a (variant "softmax"): ``log`` of a softmax output that underflows to 0;
- ID_45b (variant "cnn"): the same hazard at the CNN's softmax.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, tutorial_cnn_softmax, v1
from fuzz_core import GraphTarget

VARIANTS = ("softmax", "cnn")


def make_target(seed: int = 0, variant: str = "softmax", batch: int = 50, lr: float | None = None,
                keep_prob: float = 0.5) -> GraphTarget:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        y_ = v1.placeholder(tf.float32, [None, 10], name="y_")
        if variant == "softmax":
            weights = tf.Variable(tf.zeros([784, 10], tf.float32))
            bias = tf.Variable(tf.zeros([10], tf.float32))
            y = tf.nn.softmax(tf.matmul(x, weights) + bias)
            cross_entropy = tf.reduce_mean(-tf.reduce_sum(y_ * tf.math.log(y), axis=[1]))  # GRIST bug ID_45a
            train = v1.train.GradientDescentOptimizer(0.5 if lr is None else lr).minimize(cross_entropy)
        else:
            y_cnn = tutorial_cnn_softmax(tf.reshape(x, [-1, 28, 28, 1]), keep_prob)
            cross_entropy = tf.reduce_mean(-tf.reduce_sum(y_ * tf.math.log(y_cnn), axis=[1]))  # GRIST bug ID_45b
            train = v1.train.AdamOptimizer(1e-4 if lr is None else lr).minimize(cross_entropy)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y_}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
