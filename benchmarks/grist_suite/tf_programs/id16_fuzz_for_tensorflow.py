"""GRIST subject ID_16, FuzzForTensorflow: a fork of TensorFuzz's "nan model" on images in [-1, 1].

Re-expressed from GRIST's benchmark, scripts/study_case/ID_16/nan_model.py, nan_model_log.py and
nan_model_truediv.py (entries nan_model{,_log,_truediv}_grist.py). Facts carried over: images
``[batch, 28, 28, 1]`` flattened into dense layers 200 -> ReLU -> 100 -> ReLU -> 10, kernels uniform
in ``[-0.25, 0.25]``, biases zero; a softmax written as ``exp / sum(exp)``; cross-entropy averaged
over the batch; plain gradient descent at 0.01; batches of 100; float32.

``variant`` picks the original file:
- ``"exp"`` (nan_model.py): numerator ``exp(clip(logits, -87, 87))``, denominator
  ``sum(exp(logits))`` unclipped, cross-entropy on ``clip(|p|, 1e-6, 1)``;
- ``"log"``: logits first clipped to ``[min(logits), 87]``, then ``exp / sum(exp)`` and
  ``log(|p|)``;
- ``"truediv"``: the same clipped softmax, cross-entropy on ``|p| + 1e-6``.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`) decoded as this fork does, ``2 *
pixel - 1`` in ``[-1, 1]``: the bounds. GRIST searched the images ``x``.

Bugs:
- ID_16a (variant "exp"): ``exp(logits)`` in the denominator overflows (logit > 88.7);
- ID_16b (variant "log"): ``log(|p|)`` of a probability that underflows to 0;
- ID_16c (variant "truediv"): the division once every ``exp(logit)`` of a row underflows to 0.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, v1
from fuzz_core import GraphTarget

VARIANTS = ("exp", "log", "truediv")


def _dense(h, units: int, init_scale: float):
    kernel = tf.Variable(tf.random.uniform([int(h.shape[1]), units], -init_scale, init_scale))
    return tf.matmul(h, kernel) + tf.Variable(tf.zeros([units]))


def _softmax_and_xent(logits, y, variant: str):
    if variant == "exp":
        total = tf.reduce_sum(tf.exp(logits), axis=1, keepdims=True)  # GRIST bug ID_16a
        p = tf.exp(tf.clip_by_value(logits, -87.0, 87.0)) / total
        return -tf.reduce_sum(y * tf.math.log(tf.clip_by_value(tf.abs(p), 1e-6, 1.0)), axis=1)
    logits = tf.clip_by_value(logits, tf.reduce_min(logits), 87.0)
    if variant == "log":
        p = tf.exp(logits) / tf.reduce_sum(tf.exp(logits), axis=1, keepdims=True)
        return -tf.reduce_sum(y * tf.math.log(tf.abs(p)), axis=1)  # GRIST bug ID_16b
    exps, total = tf.exp(logits), tf.reduce_sum(tf.exp(logits), axis=1, keepdims=True)
    p = exps / total  # GRIST bug ID_16c
    return -tf.reduce_sum(y * tf.math.log(tf.abs(p) + 1e-6), axis=1)


def make_target(seed: int = 0, variant: str = "exp", batch: int = 100, lr: float = 0.01,
                init_scale: float = 0.25) -> GraphTarget:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    pool = mnist_pool(seed, flat=False, channel=True, pixels="signed")
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 28, 28, 1], name="x")
        y = v1.placeholder(tf.float32, [None, 10], name="y_")
        h = tf.nn.relu(_dense(tf.reshape(x, [-1, 784]), 200, init_scale))
        h = tf.nn.relu(_dense(h, 100, init_scale))
        logits = _dense(h, 10, init_scale)
        loss = tf.reduce_mean(_softmax_and_xent(logits, y, variant))
        train = v1.train.GradientDescentOptimizer(lr).minimize(loss)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y}, loss=loss,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (-1.0, 1.0)}, search=["x"])
