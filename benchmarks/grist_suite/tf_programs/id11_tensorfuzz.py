"""GRIST subject ID_11, TensorFuzz: the "nan model" of TensorFuzz, a classifier with a hand-made softmax.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_11/nan_model_exp.py, nan_model_log.py and
nan_model_truediv.py (entries nan_model_{exp,log,truediv}_grist.py): TensorFuzz's program with each
of its three numerical bugs left open in turn. Facts carried over: images ``[batch, 28, 28, 1]``
flattened into dense layers 200 (ReLU) -> 100 (ReLU) -> 10, kernels uniform in ``[-0.25, 0.25]``,
biases zero (``tf.layers.dense`` defaults); softmax written as ``exp / sum(exp)``; cross-entropy
``-sum(y * log(p))`` averaged over the batch; plain gradient descent at 0.01; batches of 100;
float32.

``variant`` picks the original file:
- ``"exp"``: numerator ``exp(clip(logits, -87, 87))``, denominator ``sum(exp(logits))`` unclipped,
  cross-entropy on ``clip(p, 1e-6, 1)``;
- ``"log"``: ``exp(logits) / sum(exp(logits))`` and ``log(p)`` with no clipping at all;
- ``"truediv"``: the ``"exp"`` softmax with a cross-entropy on ``p + 1e-7``.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`) decoded as GRIST's copy of the
dataset module does (scripts/study_case/ID_11/utils/dataset.py: ``pixel / 255 * 2 - 1``, where
TensorFuzz's own module stops at ``[0, 1]``), ``2 * pixel - 1`` in ``[-1, 1]``: the bounds. GRIST
searched the images ``x``.

Bugs:
- ID_11a (variant "exp"): ``exp(logits)`` in the denominator overflows once a logit passes 88.7
  (GRIST drove ``max(logits)`` up);
- ID_11b (variant "log"): ``log(p)`` of a probability that underflows to 0;
- ID_11c (variant "truediv"): the division once every ``exp(logit)`` of a row underflows to 0 (GRIST
  drove ``max(logits)`` down).
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, v1
from fuzz_core import GraphTarget

VARIANTS = ("exp", "log", "truediv")


def _dense(h, units: int, relu: bool, init_scale: float):
    kernel = tf.Variable(tf.random.uniform([int(h.shape[1]), units], -init_scale, init_scale))
    out = tf.matmul(h, kernel) + tf.Variable(tf.zeros([units]))
    return tf.nn.relu(out) if relu else out


def _softmax_and_xent(logits, y, variant: str):
    if variant == "log":
        p = tf.exp(logits) / tf.reduce_sum(tf.exp(logits), axis=1, keepdims=True)
        return -tf.reduce_sum(y * tf.math.log(p), axis=1)  # GRIST bug ID_11b
    total = tf.reduce_sum(tf.exp(logits), axis=1, keepdims=True)  # GRIST bug ID_11a
    clipped = tf.exp(tf.clip_by_value(logits, -87.0, 87.0))
    p = clipped / total  # GRIST bug ID_11c
    if variant == "exp":
        return -tf.reduce_sum(y * tf.math.log(tf.clip_by_value(p, 1e-6, 1.0)), axis=1)
    return -tf.reduce_sum(y * tf.math.log(p + 1e-7), axis=1)


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
        h = _dense(tf.reshape(x, [-1, 784]), 200, True, init_scale)
        h = _dense(h, 100, True, init_scale)
        logits = _dense(h, 10, False, init_scale)
        loss = tf.reduce_mean(_softmax_and_xent(logits, y, variant))
        train = v1.train.GradientDescentOptimizer(lr).minimize(loss)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y}, loss=loss,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (-1.0, 1.0)}, search=["x"])
