"""GRIST subject ID_1, GitHub-IPS-1: a spatial transformer network on cluttered MNIST.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_1/ghips1.py with its
spatial_transformer.py and tf_utils.py (entry ghips1_grist.py), TensorFlow's spatial-transformer
example. Facts carried over: 40 x 40 inputs (flat 1600); a localisation network 1600 -> 20 (tanh) ->
dropout -> 6 (tanh) whose last bias starts at the identity transform; a bilinear sampler on an
affine grid (``x_s = (x + 1) * W / 2``, corners clipped to the image, weights from the clipped
corners), 40 x 40 output; two 3x3 SAME convolutions of stride 2 to 16 maps (ReLU), a 1024-unit ReLU
layer, dropout, a 10-way softmax; every weight matrix initialised to **zeros** and every bias from
``N(0, 0.01)`` (the project's ``weight_variable`` / ``bias_variable``); loss ``-sum(y *
log(softmax))`` over the batch; Adam at its default 0.001; batches of 100; float32. Dropout as GRIST's
entry ran it: the pass it watches has ``keep_prob: 1.0``, its train op 0.8: the target's loss is the
network without dropout, its train op minimises the same cross-entropy of the same variables with both
dropouts at ``train_keep_prob`` (two passes of one network, as the entry's).

Data: the original loads mnist_sequence1_sample_5distortions5x5.npz (cluttered MNIST); the stand-in
places a 28 x 28 digit of the MNIST stand-in (scikit-learn's digits, see :mod:`._common`) at a
random offset in a 40 x 40 frame and adds 5 clutter patches of 5 x 5 cut from other digits, pixels
in ``[0, 1]``: the bounds. GRIST searched the images ``x``.

Bug ID_1: ``log`` of a softmax output that underflows to 0.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import Pool, digits, dropout, one_hot, start_session, v1
from fuzz_core import GraphTarget

SIDE = 40


def cluttered(n: int, seed: int, patches: int = 5, patch: int = 5) -> tuple[np.ndarray, np.ndarray]:
    images, labels = digits(n, seed)
    others, _ = digits(n, seed + 1)
    rng = np.random.default_rng([seed, 0xC1])
    out = np.zeros((n, SIDE, SIDE), np.float32)
    for i in range(n):
        for _ in range(patches):
            src = others[rng.integers(n)]
            r, c = rng.integers(0, 28 - patch + 1, 2)
            tr, tc = rng.integers(0, SIDE - patch + 1, 2)
            out[i, tr:tr + patch, tc:tc + patch] = np.maximum(out[i, tr:tr + patch, tc:tc + patch],
                                                              src[r:r + patch, c:c + patch])
        r, c = rng.integers(0, SIDE - 28 + 1, 2)
        out[i, r:r + 28, c:c + 28] = np.maximum(out[i, r:r + 28, c:c + 28], images[i])
    return out.reshape(n, SIDE * SIDE), labels


def _weight(shape):
    return tf.Variable(tf.zeros(shape))


def _bias(shape):
    return tf.Variable(tf.random.normal(shape, mean=0.0, stddev=0.01))


def spatial_transformer(images, theta, out_h: int, out_w: int):
    """Bilinear sampling of ``images`` ``[n, H, W, C]`` on the affine grid ``theta`` ``[n, 6]`` maps."""
    n = tf.shape(images)[0]
    height, width, channels = (int(d) for d in images.shape[1:])
    xs, ys = tf.meshgrid(tf.linspace(-1.0, 1.0, out_w), tf.linspace(-1.0, 1.0, out_h))
    grid = tf.stack([tf.reshape(xs, [-1]), tf.reshape(ys, [-1]), tf.ones([out_h * out_w])])
    mapped = tf.matmul(tf.reshape(theta, [-1, 2, 3]), tf.tile(grid[None], tf.stack([n, 1, 1])))
    x = (tf.reshape(mapped[:, 0], [-1]) + 1.0) * width / 2.0
    y = (tf.reshape(mapped[:, 1], [-1]) + 1.0) * height / 2.0
    x0 = tf.cast(tf.floor(x), tf.int32)
    y0 = tf.cast(tf.floor(y), tf.int32)
    x0, x1 = tf.clip_by_value(x0, 0, width - 1), tf.clip_by_value(x0 + 1, 0, width - 1)
    y0, y1 = tf.clip_by_value(y0, 0, height - 1), tf.clip_by_value(y0 + 1, 0, height - 1)
    base = tf.repeat(tf.range(n) * height * width, out_h * out_w)
    flat = tf.reshape(images, [-1, channels])

    def at(yy, xx):
        return tf.gather(flat, base + yy * width + xx)

    x0f, x1f, y0f, y1f = (tf.cast(v, tf.float32) for v in (x0, x1, y0, y1))
    out = tf.add_n([((x1f - x) * (y1f - y))[:, None] * at(y0, x0), ((x1f - x) * (y - y0f))[:, None] * at(y1, x0),
                    ((x - x0f) * (y1f - y))[:, None] * at(y0, x1), ((x - x0f) * (y - y0f))[:, None] * at(y1, x1)])
    return tf.reshape(out, tf.stack([n, out_h, out_w, channels]))


def make_target(seed: int = 0, batch: int = 100, lr: float = 0.001, train_keep_prob: float = 0.8) -> GraphTarget:
    images, labels = cluttered(2048, seed)
    pool = Pool(x=images, y=one_hot(labels))
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, SIDE * SIDE], name="x")
        y = v1.placeholder(tf.float32, [None, 10], name="y")
        made: list = []

        def var(i: int, make, shape):
            """The ``i``-th variable, made at its first use (the graph's seed ties initial values to the order
            ops are made in), shared by the watched pass and the trained one."""
            if i == len(made):
                made.append(make(shape))
            return made[i]

        def forward(keep: float | None):
            drop = (lambda h: h) if keep is None else (lambda h: dropout(h, keep))
            loc = drop(tf.nn.tanh(tf.matmul(x, var(0, _weight, [SIDE * SIDE, 20])) + var(1, _bias, [20])))
            if len(made) == 2:
                made.append(tf.Variable(np.array([1.0, 0, 0, 0, 1.0, 0], np.float32), name="b_fc_loc2"))
            theta = tf.nn.tanh(tf.matmul(loc, var(3, _weight, [20, 6])) + made[2])
            h = spatial_transformer(tf.reshape(x, [-1, SIDE, SIDE, 1]), theta, SIDE, SIDE)
            h = tf.nn.relu(tf.nn.conv2d(h, var(4, _weight, [3, 3, 1, 16]), strides=[1, 2, 2, 1], padding="SAME")
                           + var(5, _bias, [16]))
            h = tf.nn.relu(tf.nn.conv2d(h, var(6, _weight, [3, 3, 16, 16]), strides=[1, 2, 2, 1], padding="SAME")
                           + var(7, _bias, [16]))
            h = tf.nn.relu(tf.matmul(tf.reshape(h, [-1, 10 * 10 * 16]), var(8, _weight, [10 * 10 * 16, 1024]))
                           + var(9, _bias, [1024]))
            return tf.nn.softmax(tf.matmul(drop(h), var(10, _weight, [1024, 10])) + var(11, _bias, [10]))

        watched, trained = forward(None), forward(train_keep_prob)
        cross_entropy = -tf.reduce_sum(y * tf.math.log(watched))  # GRIST bug ID_1
        # the training pass's log, and the update a NaN there leaves: the engine's diagnosis of a bad training
        # step walks the watched loss's gradient, not this one's, and names the update on this line
        train = v1.train.AdamOptimizer(lr).minimize(-tf.reduce_sum(y * tf.math.log(trained)))  # GRIST bug ID_1
    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y}, loss=cross_entropy,
                       train_op=train, sample=lambda r: pool.draw(r, batch), bounds={"x": (0.0, 1.0)}, search=["x"])
