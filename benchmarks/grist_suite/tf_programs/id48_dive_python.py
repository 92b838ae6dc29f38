"""GRIST subject ID_48, Dive_python: a day-one MNIST exercise with a softmax regression and a noisy MLP.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_48/day01.py and day01_2.py (entries day01_grist.py
and day01_2_grist.py; the second instruments ``easy_NN``, but its ``__main__`` runs ``deep_NN``, the first's
code to the line, so GRIST searched ``deep_NN`` twice; the suite's ID_48b is ``easy_NN``, as day01_2.py runs
it). Facts carried over, both: loss ``mean over the batch of -sum(y * log(softmax))``, batches of 100, float32.
- ``variant="deep"`` (``deep_NN``): 784 -> 300 ReLU -> dropout -> 10 softmax, ``w1`` from a truncated normal
  of stddev 0.1, ``b1``, ``w2``, ``b2`` zeros; the input gets ``0.01 * N(0, 1)`` noise of shape ``[784]``
  drawn inside the graph at every pass; dropout at the training keep probability 0.75 inside the graph;
  Adagrad at 0.3.
- ``variant="easy"`` (``easy_NN``): a 784 -> 10 softmax layer with zero-initialised weights and biases; plain
  gradient descent at 0.5.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bugs (ids in the order of GRIST's entry files):
- ID_48a (variant "deep"): ``log`` of a softmax output that underflows to 0;
- ID_48b (variant "easy"): the same hazard in the softmax regression.
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import dropout, mnist_pool, start_session, v1
from fuzz_core import GraphTarget

VARIANTS = ("deep", "easy")


def _deep(x, y_true, keep_prob: float):
    w1 = tf.Variable(tf.random.truncated_normal([784, 300], stddev=0.1))
    b1 = tf.Variable(tf.zeros([300]))
    w2 = tf.Variable(tf.zeros([300, 10]))
    b2 = tf.Variable(tf.zeros([10]))
    hidden = tf.nn.relu(tf.matmul(x + 0.01 * tf.random.normal((784,)), w1) + b1)
    y = tf.nn.softmax(tf.matmul(dropout(hidden, keep_prob), w2) + b2)
    return tf.reduce_mean(-tf.reduce_sum(y_true * tf.math.log(y), axis=[1]))  # GRIST bug ID_48a


def _easy(x, y_true):
    y = tf.nn.softmax(tf.matmul(x, tf.Variable(tf.zeros([784, 10]))) + tf.Variable(tf.zeros([10])))
    return tf.reduce_mean(-tf.reduce_sum(y_true * tf.math.log(y), axis=[1]))  # GRIST bug ID_48b


def make_target(seed: int = 0, variant: str = "deep", batch: int = 100, lr: float | None = None,
                keep_prob: float = 0.75) -> GraphTarget:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        y_true = v1.placeholder(tf.float32, [None, 10], name="y_true")
        if variant == "deep":
            cross_entropy = _deep(x, y_true, keep_prob)
            train = v1.train.AdagradOptimizer(0.3 if lr is None else lr).minimize(cross_entropy)
        else:
            cross_entropy = _easy(x, y_true)
            train = v1.train.GradientDescentOptimizer(0.5 if lr is None else lr).minimize(cross_entropy)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y_true}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
