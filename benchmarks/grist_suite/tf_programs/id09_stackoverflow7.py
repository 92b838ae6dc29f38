"""GRIST subject ID_9, StackOverFlow-7: a sigmoid MLP on MNIST trained with a hand-written binary cross-entropy.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_9/soips7.py (entries soips7_grist.py and
soips7_log2_grist.py, both running the same program). Facts carried over: 784 -> 512 sigmoid -> 10
sigmoid, no biases, both weight matrices initialised to zeros; loss ``mean over the batch of sum_k
(-y log(q) - (1 - y) log(1 - q))``; plain gradient descent at 0.5; batches of 100; float32.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.
GRIST searched the images ``x``.

Bugs (one program, two log ops; ids in the order of GRIST's entry files):
- ID_9a: ``log(1 - q)`` once a sigmoid output rounds to 1 (soips7_grist.py drove ``min |1 - q|``);
- ID_9b: ``log(q)`` once a sigmoid output underflows to 0 (soips7_log2_grist.py drove ``min |q|``).
"""
from __future__ import annotations

import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def make_target(seed: int = 0, batch: int = 100, lr: float = 0.5) -> GraphTarget:
    pool = mnist_pool(seed)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        y = v1.placeholder(tf.float32, [None, 10], name="y")
        hidden = tf.nn.sigmoid(tf.matmul(x, tf.Variable(tf.zeros([784, 512]))))
        q = tf.nn.sigmoid(tf.matmul(hidden, tf.Variable(tf.zeros([512, 10]))))
        wrong = -y * tf.math.log(q)  # GRIST bug ID_9b
        right = (1 - y) * tf.math.log(1 - q)  # GRIST bug ID_9a
        loss = tf.reduce_mean(tf.reduce_sum(wrong - right, 1))
        train = v1.train.GradientDescentOptimizer(lr).minimize(loss)
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y}, loss=loss,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
