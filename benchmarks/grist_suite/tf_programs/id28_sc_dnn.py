"""GRIST subject ID_28, SC_DNN: an MNIST MLP simulated in stochastic-computing arithmetic (scaled, clipped layers).

Re-expressed from GRIST's benchmark, scripts/study_case/ID_28/sc_train_creg.py, sc_train_creg_div2.py,
sc_train_l2reg.py and sc_train_l2reg_div2.py (entries ``*_grist.py``). Facts carried over: a 784 -> 128 -> 10
network whose layers keep every activation in ``[-1, 1]`` and carry per-unit scale factors beside it:
``sc_matmul`` rescales the input by ``s_in / max(s_in)``, divides ``x w`` by the column sums ``S = sum |w|``,
multiplies by a trained gain and divides the scale by it, then clips; ``sc_add`` adds ``b / s_in`` and halves
(then doubles back, both layers "upscale"); the logits are the last activations times their scales; loss:
softmax cross-entropy (fused) plus a weight penalty; Adam at 0.1; batches of 500 (the originals draw a new batch
at every step; three of GRIST's four entries draw one batch before their loop and keep it); float32. Variables
are created with ``tf.compat.v1.get_variable`` from the original's initial values. The first layer's gain is
trainable, as in the originals; GRIST's two ``creg`` entries made it ``trainable=False``, so that only their
search moved it, and clipped it to ``[0, 16]`` after each of their steps.

``variant`` picks the original file:
- ``"creg"``: ``w1`` zeros, ``wout``, ``b1``, ``bout`` from ``N(0, 1)``, gains ``U(0, 16)`` per unit (128 and
  10); the three scale divisions guarded by ``+1e-7`` (``max(s_in)``, ``S``, the gain); penalty ``0.25 * sum 2
  (|a| - clip(|a|, -1, 1))`` over the four weight tensors;
- ``"creg_div2"``: the same with ``w1`` from ``N(0, 1)`` and no ``+1e-7`` guards;
- ``"l2reg"`` / ``"l2reg_div2"`` (one program, two GRIST entries): every weight from ``N(0, 1)``, one scalar
  gain per layer ``U(0, 16)``, no guards, penalty ``0.0012 * sum w^2 / 2`` (``l2_regularizer``).

GRIST searched a variable, not the images: the first layer's gain (``creg``, ``l2reg``: ``g - min|g| / grad``,
clipped to ``[0, 16]``) or the column sums ``S`` (the ``div2`` entries, through a copy that never reached the
graph, so only training moved them). Two settings:

- weights free (the suite's default, RANUM's kind of search): ``search_weights``, every trainable variable
  searched in the engine's box for weights (its initial range grown by 4 times its largest magnitude on each
  side: the gain in about ``[-64, 80]``), and the images ``X``;
- GRIST's (``gain_input=True`` for ``creg`` and ``l2reg``; the ``div2`` variants as they are, without
  ``search_weights``): the images ``X`` and the first layer's gain, no other weight. The engine searches
  inputs and the variables of ``search_weights`` only, in its own box, so the gain becomes an input ``G`` the
  search may move within ``[0, 16]``, GRIST's clip: one row of gains per example (every row the factory's
  draw, ``U(0, 16)``), each row's activations scaled by its own row, the scale carried on from row 0's, as
  the original carries it on from its one gain. It does not train (``creg``: ``trainable=False``, as GRIST's
  entry made it; ``l2reg``: GRIST's step sets it at every iteration). In ``creg`` its division is guarded
  (``G + 1e-7``), so within ``[0, 16]`` the divisor never reaches 0.

Data: MNIST stand-in (scikit-learn's digits, see :mod:`._common`), pixels in ``[0, 1]``: the bounds.

Bugs (ids in the order of GRIST's entry files), each a division in ``sc_matmul``:
- ID_28a (``"creg"``): the division by the gain (GRIST drove the gain to 0; here ``gain + 1e-7``);
- ID_28b (``"creg_div2"``): the division by ``S`` (a column of ``w`` at 0);
- ID_28c (``"l2reg"``): the division by the gain;
- ID_28d (``"l2reg_div2"``): the division by ``S``.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import mnist_pool, start_session, v1
from fuzz_core import GraphTarget

VARIANTS = ("creg", "creg_div2", "l2reg", "l2reg_div2")


def _guarded(t, guard: float):
    """``t + guard`` where the original file adds one (``"creg"``), else ``t`` itself."""
    return t + guard if guard else t


def _sc_matmul(x, w, s_in, gain, guard: float):
    max_scale = tf.reduce_max(s_in)
    x_rescaled = tf.multiply(x, tf.math.divide(s_in, _guarded(max_scale, guard)))
    s = tf.reduce_sum(tf.abs(w), axis=0)
    rows = tf.shape(x)[0]
    big_s = tf.reshape(tf.tile(_guarded(s, guard), [rows]), shape=[rows, tf.shape(w)[1]])
    z = tf.math.divide(tf.matmul(x_rescaled, w), big_s)  # GRIST bug ID_28b, ID_28d
    curr_scale = tf.multiply(max_scale, big_s)
    z_up = tf.multiply(z, gain)
    new_scale = tf.math.divide(curr_scale, _guarded(gain, guard))  # GRIST bug ID_28a, ID_28c
    return tf.clip_by_value(z_up, -1, +1), new_scale[0, :]


def _sc_add(x, b, s_in):
    y = tf.math.divide(tf.add(x, tf.math.divide(b, s_in)), 2)
    out_scale = tf.math.divide(tf.multiply(s_in, 2), 2)
    return tf.clip_by_value(tf.multiply(y, 2), -1, +1), out_scale


def _clip_penalty(a):
    magnitude = tf.abs(a)
    return 2 * (magnitude - tf.clip_by_value(magnitude, -1, +1))


def make_target(seed: int = 0, variant: str = "creg", batch: int = 500, lr: float = 0.1,
                gain_input: bool = False) -> GraphTarget:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if gain_input and variant.endswith("div2"):
        raise ValueError(f"gain_input: GRIST's {variant} entry searched the column sums, not the gain")
    creg = variant.startswith("creg")
    guard = 1e-7 if variant == "creg" else 0.0
    pool = mnist_pool(seed, x="X", y="Y")
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 784], name="features")
        y = v1.placeholder(tf.float32, [None, 10], name="labels")
        l2 = None if creg else (lambda w: 0.0012 * tf.nn.l2_loss(w))
        w1_init = tf.zeros([784, 128]) if variant == "creg" else tf.random.normal([784, 128])
        w1 = v1.get_variable("w1", initializer=w1_init, regularizer=l2)
        wout = v1.get_variable("wout", initializer=tf.random.normal([128, 10]), regularizer=l2)
        b1 = v1.get_variable("b1", initializer=tf.random.normal([128]), regularizer=l2)
        bout = v1.get_variable("bout", initializer=tf.random.normal([10]), regularizer=l2)
        units = 128 if creg else 1
        if gain_input:
            gain1 = v1.placeholder(tf.float32, [None, units], name="gain")
        else:
            gain1 = v1.get_variable("G_matmul_1", initializer=tf.random.uniform([units], 0, 16))
        gain2 = v1.get_variable("G_matmul_2", initializer=tf.random.uniform([10 if creg else 1], 0, 16))
        h, s = _sc_matmul(x, w1, tf.constant(1.0, shape=[1, 784]), gain1, guard)
        h, s = _sc_add(h, b1, s)
        h, s = _sc_matmul(h, wout, s, gain2, guard)
        h, s = _sc_add(h, bout, s)
        logits = tf.multiply(h, tf.reshape(tf.tile(s, [tf.shape(x)[0]]), shape=[tf.shape(x)[0], tf.shape(h)[1]]))
        objective = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(logits=logits, labels=y))
        if creg:
            penalty = tf.reduce_sum(sum(tf.reduce_sum(_clip_penalty(v)) for v in (w1, wout, b1, bout)))
            loss = objective + tf.constant(0.25) * penalty
        else:
            loss = objective + tf.reduce_sum(v1.get_collection(v1.GraphKeys.REGULARIZATION_LOSSES))
        train = v1.train.AdamOptimizer(learning_rate=lr).minimize(loss)
    if not gain_input:
        return GraphTarget(graph=graph, session=start_session(graph), feeds={"X": x, "Y": y}, loss=loss,
                           train_op=train, sample=lambda r: pool.draw(r, batch),
                           bounds={"X": (0.0, 1.0)}, search=["X"])
    gain0 = np.random.default_rng([seed, 0x28]).uniform(0, 16, units).astype(np.float32)

    def sample(r: np.random.Generator) -> dict[str, np.ndarray]:
        return {**pool.draw(r, batch), "G": np.tile(gain0, (batch, 1))}

    return GraphTarget(graph=graph, session=start_session(graph), feeds={"X": x, "Y": y, "G": gain1}, loss=loss,
                       train_op=train, sample=sample, bounds={"X": (0.0, 1.0), "G": (0.0, 16.0)}, search=["X", "G"])
