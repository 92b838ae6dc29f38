"""GRIST subject ID_59, tensorflow_book: an MNIST softmax regression trained by a hand-written gradient step.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_59/code_06.py (entry code_06_grist.py),
``get_loss1``, the loss its ``main`` trains. Facts carried over: a 784 -> 10 softmax layer, weights
uniform in ``[-1, 1]``, biases zero; loss ``mean over the batch of -sum(y * log(softmax))`` (the
program computes ``clip(pred, 1e-15, 1)`` and throws the result away); the update written by hand
and applied by two assign ops, ``w <- w - 0.01 * w_grad`` and ``b <- b - 0.01 * b_grad`` with
``w_grad = -x^T (y - pred)`` (summed over the batch) and ``b_grad = -mean(x^T (y - pred), axis=0)``
(a mean over the 784 input rows, as the program has it); batches of 100; float32.

Data: the original loads MNIST through ``tf.keras.datasets`` and divides by 255; the stand-in here
is scikit-learn's digits (see :mod:`._common`), pixels in ``[0, 1]``: the bounds. GRIST searched the
images ``x``.

Bug ID_59: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 100, lr: float = 0.01) -> GraphTarget:
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        y = v1.placeholder(tf.float32, [None, 10], name="y")
        w = tf.Variable(tf.random.uniform([784, 10], -1, 1), name="weights")
        b = tf.Variable(tf.zeros([10]), name="bias")
        pred = tf.nn.softmax(tf.add(tf.matmul(x, w), b), name="y_pred")
        tf.clip_by_value(pred, 1e-15, 1.0)
        cross_entropy = tf.reduce_mean(-tf.reduce_sum(y * tf.math.log(pred), axis=1))  # GRIST bug ID_59
        residual = tf.matmul(tf.transpose(x), y - pred)
        w_grad = -residual
        b_grad = -tf.reduce_mean(residual, axis=0)
        train = tf.group(w.assign(w - lr * w_grad), b.assign(b - lr * b_grad))
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
