"""GRIST subject ID_44, CNNRelationExtraction: a scikit-learn-style CNN classifier, run on MNIST.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_44/CNN.py (entry CNN_grist.py, driven by
examples/cnn-mnist/mnist_example_grist.py: 28 x 28 x 1 inputs, 10 classes, 5 x 5 filters). Facts
carried over: a 5x5 SAME convolution to 16 maps (ReLU), 2x2 max-pooling, a 128-unit ReLU layer,
dropout at the class's keep probability 0.5 (fed to every pass, so it stays inside the graph), a
10-way softmax; weights from a truncated normal of stddev 0.1, biases 0.1; loss ``-sum(y *
log(softmax))`` over the batch; Adagrad at 1e-3; batches of 50; float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the inputs ``x``.

Bug ID_44: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import dropout, mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def _weight(shape):
    return tf.Variable(tf.random.truncated_normal(shape, stddev=0.1))


def _bias(shape):
    return tf.Variable(tf.constant(0.1, shape=shape))


def make_target(seed: int = 0, batch: int = 50, lr: float = 1e-3, keep_prob: float = 0.5,
                conv_shape: tuple[int, int] = (5, 5), classes: int = 10) -> GraphTarget:
    pool = mnist_pool(seed, flat=False, channel=True)
    m, n = 28, 28
    flat = -(-m // 2) * -(-n // 2) * 16
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, m, n, 1], name="x")
        y_ = v1.placeholder(tf.float32, [None, classes], name="y_")
        conv = tf.nn.conv2d(x, _weight([conv_shape[0], conv_shape[1], 1, 16]), strides=[1, 1, 1, 1], padding="SAME")
        pooled = tf.nn.max_pool2d(tf.nn.relu(conv + _bias([16])), ksize=2, strides=2, padding="SAME")
        hidden = tf.nn.relu(tf.matmul(tf.reshape(pooled, [-1, flat]), _weight([flat, 128])) + _bias([128]))
        y_conv = tf.nn.softmax(tf.matmul(dropout(hidden, keep_prob), _weight([128, classes])) + _bias([classes]))
        cross_entropy = -tf.reduce_sum(y_ * tf.math.log(y_conv))  # GRIST bug ID_44
        train = v1.train.AdagradOptimizer(lr).minimize(cross_entropy)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y_}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
