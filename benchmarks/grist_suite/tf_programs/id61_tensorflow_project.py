"""GRIST subject ID_61, tensorflow_project: a one-hidden-layer MLP on MNIST trained with Adagrad.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_61/multi_layer_perceptron.py (entry
multi_layer_perceptron_grist.py). Facts carried over: 784 -> 300 ReLU -> dropout -> 10 softmax;
``W1`` from a truncated normal of stddev 0.1, ``b1``, ``W2`` and ``b2`` zeros; loss ``-sum(y *
log(softmax))`` over the batch; Adagrad at 0.01; batches of 100; float32. The program feeds a keep
probability of 1 to every pass: the dropout op stays, as a no-op by default.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bug ID_61: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import dropout, mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 100, lr: float = 0.01, keep_prob: float = 1.0) -> GraphTarget:
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        w1 = tf.Variable(tf.random.truncated_normal([784, 300], stddev=0.1))
        b1 = tf.Variable(tf.zeros([300]))
        w2 = tf.Variable(tf.zeros([300, 10]))
        b2 = tf.Variable(tf.zeros([10]))
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        hidden = dropout(tf.nn.relu(tf.matmul(x, w1) + b1), keep_prob)
        y = tf.nn.softmax(tf.matmul(hidden, w2) + b2)
        y_ = v1.placeholder(tf.float32, [None, 10], name="y_")
        cross_entropy = -tf.reduce_sum(y_ * tf.math.log(y))  # GRIST bug ID_61
        train = v1.train.AdagradOptimizer(lr).minimize(cross_entropy)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y_}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
