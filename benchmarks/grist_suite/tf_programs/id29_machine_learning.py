"""GRIST subject ID_29, MachineLearning: the "Deep MNIST" CNN fed 28 x 28 x 1 images directly.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_29/temp.py (entry temp_grist.py). Facts
carried over: the tutorial's network (see :func:`._common.tutorial_cnn_softmax`) on ``[batch, 28,
28, 1]`` placeholders; loss ``-sum(y * log(softmax))`` over the batch; Adam at 0.0005; batches of
100; float32. Dropout as GRIST's entry ran it: the pass it watches has ``keep_prob: 1.0``, its
``train_step`` 0.5 (the original program fed 0.5 to both): the target's loss is the network without
dropout, its train op minimises the same cross-entropy of the same variables with dropout at
``train_keep_prob`` (two passes of one network, as the entry's).

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bug ID_29: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, tutorial_cnn_softmax, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 100, lr: float = 0.0005, train_keep_prob: float = 0.5) -> GraphTarget:
    pool = mnist_pool(seed, flat=False, channel=True)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 28, 28, 1], name="x")
        y_ = v1.placeholder(tf.float32, [None, 10], name="y_")
        watched, trained = tutorial_cnn_softmax(x, None, train_keep_prob)
        cross_entropy = -tf.reduce_sum(y_ * tf.math.log(watched))  # GRIST bug ID_29
        # the training pass's log, and the update a NaN there leaves: the engine's diagnosis of a bad training
        # step walks the watched loss's gradient, not this one's, and names the update on this line
        train = v1.train.AdamOptimizer(lr).minimize(-tf.reduce_sum(y_ * tf.math.log(trained)))  # GRIST bug ID_29
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y_}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
