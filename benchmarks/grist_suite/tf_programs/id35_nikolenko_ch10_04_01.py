"""GRIST subject ID_35 (deep_learning_Nikolenko_and_Co.ch10_04_01): a variational autoencoder (VAE) of MNIST.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_35/ch10_04_01.py (``variant="log"``,
entry ch10_04_01_grist.py) and ch10_04_01_sqrt.py (``variant="sqrt"``, entry
ch10_04_01_sqrt_grist.py), from the book by Nikolenko, Kadurin and Arkhangelskaya. Facts carried
over: encoder 784 -> 500 -> 500 (softplus) -> ``z_mean`` and ``z_log_sigma_sq`` of ``n_z = 20``;
decoder n_z -> 500 -> 500 (softplus) -> 784 sigmoid; Xavier-uniform weights, zero biases; ``z =
z_mean + sqrt(exp(z_log_sigma_sq)) * eps`` with ``eps ~ N(0, 1)`` drawn by NumPy and fed; cost
``mean(reconstruction + KL)``; Adam at 0.001; batches of 100; float32.
- ``"log"``: ``z_log_sigma_sq`` clipped to ``[-87, 87]`` once (the sample and the KL use the clipped
  value; GRIST's entry clips it only inside its two ``exp`` calls, which differs only beyond 87); reconstruction ``-sum(x log(1e-10 + p) + (1 - x) log(1e-10 + 1 - p))``.
- ``"sqrt"``: ``exp(clip(z_log_sigma_sq, -100, 87))`` in the sample and in the KL; reconstruction on
  ``clip(p, 1e-6, 1)`` and ``clip(1 - p, 1e-6, 1)``. GRIST's entry trains 50 epochs
  (27,500 Adam steps on MNIST's 55,000 images) before its search; ``pretrain_steps`` runs the
  program's own training first (0 by default): the suite searches the sqrt bug after the entry's
  27,500 (``subjects_tf.VAE_SQRT``), trained once and kept (:mod:`benchmarks.grist_suite.pretrained`).
  GRIST's entry of the sqrt file sets ``n_z = 2``; the original has 20 (the default here).

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds;
``eps`` is drawn by ``sample`` (not searched). GRIST searched the images ``x``.

Bugs (ids in the order of GRIST's entry files):
- ID_35a (variant "log"): the reconstruction's ``log``: in float32 ``1e-10 + 1`` is 1, so
  ``log(1e-10 + 1 - p)`` is ``log(0)`` once the sigmoid rounds to 1 (``0 * -inf`` is NaN where the
  pixel is 1); GRIST aimed at ``p -> 0`` (the other log). Both log lines carry the mark.
- ID_35b (variant "sqrt"): ``sqrt(exp(z_log_sigma_sq))`` at ``z_log_sigma_sq -> -100``: ``exp``
  underflows to 0 on a CPU that flushes denormals, ``sqrt(0)`` is finite but its gradient is
  infinite, so the training step writes NaN into the weights (GRIST drove ``min z_log_sigma_sq``
  down).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import (
    Pool, affine, mnist_pool, softplus_mlp, start_session, v1,
)
from benchmarks.grist_suite.pretrained import pretrain
from fuzz_core import GraphTarget

VARIANTS = ("log", "sqrt")


def make_target(seed: int = 0, variant: str = "log", n_z: int = 20, batch: int = 100, lr: float = 0.001,
                pretrain_steps: int = 0) -> GraphTarget:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    mnist = mnist_pool(seed)
    pool = Pool(x=mnist.arrays["x"])
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        eps = v1.placeholder(tf.float32, [None, n_z], name="eps")
        hidden = softplus_mlp(x, [500, 500])
        z_mean, z_log_sigma_sq = affine(hidden, n_z), affine(hidden, n_z)
        if variant == "log":
            z_log_sigma_sq = tf.clip_by_value(z_log_sigma_sq, -87, 87)
            z = tf.add(z_mean, tf.multiply(tf.sqrt(tf.exp(z_log_sigma_sq)), eps))
            sigma_sq = tf.exp(z_log_sigma_sq)
        else:
            std = tf.sqrt(tf.exp(tf.clip_by_value(z_log_sigma_sq, -100, 87)))  # GRIST bug ID_35b
            z = tf.add(z_mean, tf.multiply(std, eps))
            sigma_sq = tf.exp(tf.clip_by_value(z_log_sigma_sq, -100, 87))
        p = tf.nn.sigmoid(affine(softplus_mlp(z, [500, 500]), 784))
        if variant == "log":
            on = x * tf.math.log(p + 1e-10)  # GRIST bug ID_35a
            off = (1 - x) * tf.math.log(1e-10 + 1 - p)  # GRIST bug ID_35a
        else:
            on = x * tf.math.log(tf.clip_by_value(p, 1e-6, 1))
            off = (1 - x) * tf.math.log(tf.clip_by_value(1 - p, 1e-6, 1))
        reconstr_loss = -tf.reduce_sum(on + off, 1)
        latent_loss = -0.5 * tf.reduce_sum(1 + z_log_sigma_sq - tf.square(z_mean) - sigma_sq, 1)
        cost = tf.reduce_mean(reconstr_loss + latent_loss)
        train = v1.train.AdamOptimizer(learning_rate=lr).minimize(cost)

    def sample(r: np.random.Generator):
        return {**pool.draw(r, batch), "eps": r.normal(0.0, 1.0, (batch, n_z)).astype(np.float32)}

    target = GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "eps": eps}, loss=cost,
                         train_op=train, sample=sample, bounds={"x": (0.0, 1.0)}, search=["x"])
    pretrain(target, pretrain_steps, seed)
    return target
