"""GRIST subject ID_40, ml_plactice.bmi: a softmax regression classifying body-mass index from weight and height.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_40/src/ch5/bmi.py (entry bmi_grist.py).
Facts carried over: inputs ``[weight / 100, height / 200]``, a 2 -> 3 softmax layer (thin, normal,
fat) with zero-initialised weights and biases; loss ``-sum(y * log(softmax))`` over the batch; plain
gradient descent at 0.01; batches of 100; float32.

Data: the original reads bmi.csv; a stand-in of the same form is synthesised (see
:func:`._common.bmi_pool`): scaled features in ``[0.35, 0.8]`` (weight) and ``[0.6, 1.0]`` (height);
bounds ``[0.35, 1.0]`` cover both columns, as GRIST's clip to the batch's min and max did. GRIST
searched the features ``x``.

Bug ID_40: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import bmi_pool, start_session, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 100, lr: float = 0.01) -> GraphTarget:
    pool = bmi_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        y_ = v1.placeholder(tf.float32, [None, 3], name="y_")
        weights = tf.Variable(tf.zeros([2, 3]))
        bias = tf.Variable(tf.zeros([3]))
        y = tf.nn.softmax(tf.matmul(x, weights) + bias)
        cross_entropy = -tf.reduce_sum(y_ * tf.math.log(y))  # GRIST bug ID_40
        train = v1.train.GradientDescentOptimizer(lr).minimize(cross_entropy)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y_}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.35, 1.0)}, search=["x"])
