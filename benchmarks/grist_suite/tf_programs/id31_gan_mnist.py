"""GRIST subject ID_31, GAN_MNIST: a fully connected GAN on MNIST whose discriminator loss takes ``log(D(x))`` bare.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_31/GAN_MNIST.py (entry
GAN_MNIST_grist.py). Facts carried over: generator 100 -> 256 -> 512 -> 1024 (ReLU) -> 784 (tanh);
discriminator 784 -> 1024 -> 512 -> 256 (ReLU, each followed by dropout) -> 1 (sigmoid), shared
between real and generated images; weights from a truncated normal of stddev 0.02, biases zero;
``D_loss = -mean(log(D(x)) + log(1 - D(G(z)) + 1e-8))``, ``G_loss = -mean(log(D(G(z)) + 1e-8))``
(the program's other, guarded pair of losses sits in a string and never runs); two Adam optimizers
at 0.0002 over the discriminator's and the generator's variables; batches of 100; float32. The
program feeds 0.3 as dropout's keep probability (TF1's second argument) to every pass: dropout stays
inside the graph at that probability.

Training: the original runs the discriminator's step, then the generator's, in two ``session.run``
calls; here the train op groups both Adam steps in one run (their variable sets are disjoint; the
generator's gradient uses that run's forward pass).

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`) scaled as the program scales
MNIST, ``(pixel - 0.5) / 0.5`` in ``[-1, 1]``: the bounds; the noise ``z ~ N(0, 1)`` of shape
``[batch, 100]`` is drawn by ``sample`` (NumPy in the original) and not searched. GRIST searched the
real images ``x``.

Bug ID_31: ``log(D(x))`` once the discriminator's sigmoid underflows to 0 (GRIST drove ``min
|D(x)|``).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import Pool, dropout, mnist_pool, start_session, v1
from fuzz_core import GraphTarget


def _layer(h, name: str, units: int):
    init = v1.truncated_normal_initializer(mean=0, stddev=0.02)
    w = v1.get_variable(f"{name[0]}_w{name[1:]}", [int(h.shape[1]), units], initializer=init)
    b = v1.get_variable(f"{name[0]}_b{name[1:]}", [units], initializer=v1.constant_initializer(0.0))
    return tf.matmul(h, w) + b


def generator(z):
    with v1.variable_scope("generator"):
        h = tf.nn.relu(_layer(z, "G0", 256))
        h = tf.nn.relu(_layer(h, "G1", 512))
        h = tf.nn.relu(_layer(h, "G2", 1024))
        return tf.nn.tanh(_layer(h, "G3", 784))


def discriminator(image, keep_prob: float, reuse: bool = False):
    with v1.variable_scope("discriminator", reuse=reuse):
        h = dropout(tf.nn.relu(_layer(image, "D0", 1024)), keep_prob)
        h = dropout(tf.nn.relu(_layer(h, "D1", 512)), keep_prob)
        h = dropout(tf.nn.relu(_layer(h, "D2", 256)), keep_prob)
        return tf.sigmoid(_layer(h, "D3", 1))


def make_target(seed: int = 0, batch: int = 100, lr: float = 0.0002, keep_prob: float = 0.3) -> GraphTarget:
    pool = Pool(x=mnist_pool(seed, pixels="signed").arrays["x"])
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, shape=(None, 784), name="x")
        z = v1.placeholder(tf.float32, shape=(None, 100), name="z")
        d_real = discriminator(x, keep_prob)
        d_fake = discriminator(generator(z), keep_prob, reuse=True)
        eps = 1e-8
        d_loss = -tf.reduce_mean(tf.math.log(d_real)  # GRIST bug ID_31
                                 + tf.math.log(1. - d_fake + eps))
        g_loss = -tf.reduce_mean(tf.math.log(d_fake + eps))
        trainable = v1.trainable_variables()
        d_vars = [v for v in trainable if "D_" in v.name]
        g_vars = [v for v in trainable if "G_" in v.name]
        d_train = v1.train.AdamOptimizer(lr).minimize(d_loss, var_list=d_vars)
        g_train = v1.train.AdamOptimizer(lr).minimize(g_loss, var_list=g_vars)
        train = tf.group(d_train, g_train)

    def sample(r: np.random.Generator):
        return {**pool.draw(r, batch), "z": r.normal(0, 1, (batch, 100)).astype(np.float32)}

    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "z": z}, loss=d_loss,
                       train_op=train, sample=sample, bounds={"x": (-1.0, 1.0)}, search=["x"])
