"""GRIST subject ID_2, GitHub-IPS-6: the "LogisticRegression" model of a TensorFlow deep-learning toolbox.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_2/models/logistic_regression.py with its
cost from scripts/study_case/ID_2/model.py (entries command_line/run_logistic_regression_grist.py
and run_logistic_regression_log2_grist.py, both running the same program). Facts carried over: a 784
-> 10 softmax layer with zero-initialised weights and biases, the "cross_entropy" cost written as a
binary cross-entropy over the ten softmax outputs, ``-mean(y log p + (1 - y) log(1 - p))``, Adam at
0.01, batches of 10 (the command line's defaults), float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bugs (one program, two log ops):
- ID_2a: ``log(p)`` once a softmax output underflows to 0 (GRIST drove ``min |p|`` to 0);
- ID_2b: ``log(1 - p)`` once a softmax output rounds to 1 (GRIST drove ``min |1 - p|`` to 0).
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 10, lr: float = 0.01) -> GraphTarget:
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x-input")
        y = v1.placeholder(tf.float32, [None, 10], name="y-input")
        weights = tf.Variable(tf.zeros([784, 10]), name="weights")
        biases = tf.Variable(tf.zeros([10]), name="biases")
        p = tf.nn.softmax(tf.matmul(x, weights) + biases)
        hit = y * tf.math.log(p)  # GRIST bug ID_2a
        miss = (1 - y) * tf.math.log(1 - p)  # GRIST bug ID_2b
        cost = -tf.reduce_mean(hit + miss)
        train = v1.train.AdamOptimizer(lr).minimize(cost)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y}, loss=cost,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
