"""GRIST subject ID_14, MNIST: a LeNet-5 on zero-padded 32 x 32 MNIST with a hand-written cross-entropy.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_14/v3/model.py and v3/train.py (entry
v3/train_grist.py). Facts carried over: VALID convolutions 5x5x6 -> 2x2 max-pool -> 5x5x16 -> 2x2
max-pool -> 5x5x120, all ReLU, then dense 120 -> 84 (ReLU) -> 10 and a softmax; weights from a
truncated normal of stddev 0.1, biases zero; loss ``-sum(label * log(softmax))`` over the batch;
plain gradient descent at 0.001; batches of 64; float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), 28 x 28 pixels in ``[0, 1]``
padded with 2 zero pixels on every side as the original pads MNIST: the bounds are ``[0, 1]``. GRIST
searched the images ``x``.

Bug ID_14: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import Pool, mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def _conv_relu(h, shape):
    kernel = tf.Variable(tf.random.truncated_normal(shape, mean=0.0, stddev=0.1))
    out = tf.nn.conv2d(h, kernel, strides=[1, 1, 1, 1], padding="VALID")
    return tf.nn.relu(out + tf.Variable(tf.zeros(shape[-1])))


def _pool(h):
    return tf.nn.max_pool2d(h, ksize=2, strides=2, padding="VALID")


def make_target(seed: int = 0, batch: int = 64, lr: float = 0.001) -> GraphTarget:
    mnist = mnist_pool(seed, flat=False, channel=True)
    padded = np.pad(mnist.arrays["x"], ((0, 0), (2, 2), (2, 2), (0, 0)))
    pool = Pool(x=padded, label=mnist.arrays["y"])
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 32, 32, 1], name="input_x")
        label = v1.placeholder(tf.float32, [None, 10], name="label")
        h = _pool(_conv_relu(x, [5, 5, 1, 6]))
        h = _pool(_conv_relu(h, [5, 5, 6, 16]))
        h = tf.reshape(_conv_relu(h, [5, 5, 16, 120]), [-1, 120])
        h = tf.nn.relu(tf.matmul(h, tf.Variable(tf.random.truncated_normal([120, 84], stddev=0.1)))
                       + tf.Variable(tf.zeros(84)))
        logits = tf.matmul(h, tf.Variable(tf.random.truncated_normal([84, 10], stddev=0.1))) + tf.Variable(tf.zeros(10))
        probs = tf.nn.softmax(logits)
        loss = -tf.reduce_sum(label * tf.math.log(probs))  # GRIST bug ID_14
        train = v1.train.GradientDescentOptimizer(lr).minimize(loss)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "label": label}, loss=loss,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
