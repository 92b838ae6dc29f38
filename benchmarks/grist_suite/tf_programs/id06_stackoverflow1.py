"""GRIST subject ID_6, StackOverFlow-1: the "Deep MNIST for experts" CNN with a hand-written cross-entropy.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_6/soips1.py (entry soips1_grist.py).
Facts carried over: the tutorial's network (see :func:`._common.tutorial_cnn_softmax`: two conv/pool
stages, a 1024-unit layer, dropout, softmax); loss ``-sum(y * log(softmax))`` over the batch; Adam
at 1e-4; batches of 50; float32.

Dropout as GRIST's entry ran it: the pass it watches (its ``update_batch_data`` feed) has
``keep_prob: 1.0``, its ``train_step`` 0.5. A ``GraphTarget`` feeds one batch to its ``loss`` and its
``train_op``: the loss is the network without dropout, the train op minimises the same cross-entropy
of the same variables with dropout at ``train_keep_prob`` (two passes of one network, as the entry's).

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bug ID_6: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, tutorial_cnn_softmax, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 50, lr: float = 1e-4, train_keep_prob: float = 0.5) -> GraphTarget:
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        y = v1.placeholder(tf.float32, [None, 10], name="y_")
        watched, trained = tutorial_cnn_softmax(tf.reshape(x, [-1, 28, 28, 1]), None, train_keep_prob)
        cross_entropy = -tf.reduce_sum(y * tf.math.log(watched))  # GRIST bug ID_6
        # the training pass's log, and the update a NaN there leaves: the engine's diagnosis of a bad training
        # step walks the watched loss's gradient, not this one's, and names the update on this line
        train = v1.train.AdamOptimizer(lr).minimize(-tf.reduce_sum(y * tf.math.log(trained)))  # GRIST bug ID_6
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
