"""GRIST subject ID_17, TF_Unet: tf_unet's U-Net on its toy problem, trained with the dice-coefficient cost.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_17/test_toy.py with tf_unet/unet.py,
tf_unet/layers.py and tf_unet/image_gen.py (entry test_toy_grist.py). Facts carried over: a U-Net of
3 levels and 16 root features on ``[batch, nx, ny, 1]`` images: per level two VALID 3x3
convolutions, each followed by dropout and then ReLU(+bias), 2x2 max-pooling down, 2x2 stride-2
transposed convolutions (ReLU) up, cropped skip connections, a 1x1 convolution to 2 classes and a
ReLU; weights from a truncated normal of stddev ``sqrt(2 / (9 * features))``, biases 0.1; the
pixel-wise softmax ``exp(o) / sum(exp(o))``; cost ``-(2 * sum(p * y) / (1e-5 + sum(p) + sum(y)))``;
momentum 0.2 on a learning rate of 0.2 decayed by 0.95 every 32 steps (staircase); dropout keep
probability 0.75 (the trainer's default, fed to the monitored and the training passes alike); one
572 x 572 image per batch; float32.

Data: the original draws its toy images at random; the same generator is re-expressed here and
seeded by ``sample``'s generator: a 572 x 572 field of ones with 20 discs (centres at least 92
pixels from the border, radius 5..49, grey level 1..254), Gaussian noise of stddev 20, then the
image shifted and scaled to ``[0, 1]`` (the bounds); labels are one-hot (background, disc), cropped
to the network's 532 x 532 output. GRIST searched the images ``x``.

Bug ID_17: ``exp`` in the pixel-wise softmax overflows once an output activation passes 88.7 (GRIST
drove ``max(logits)`` up); the division then gives ``inf / inf``.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks.grist_suite.tf_programs._common import dropout, start_session, v1
from fuzz_core import GraphTarget


def toy_image(rng: np.random.Generator, nx: int, ny: int, cnt: int = 20, r_min: int = 5, r_max: int = 50,
              border: int = 92, sigma: float = 20.0) -> tuple[np.ndarray, np.ndarray]:
    image = np.ones((nx, ny), np.float64)
    mask = np.zeros((nx, ny), bool)
    rows, cols = np.ogrid[:nx, :ny]
    for _ in range(cnt):
        a, b = rng.integers(border, nx - border), rng.integers(border, ny - border)
        r, grey = rng.integers(r_min, r_max), rng.integers(1, 255)
        disc = (rows - a) ** 2 + (cols - b) ** 2 <= r * r
        mask |= disc
        image[disc] = grey
    image += rng.normal(scale=sigma, size=image.shape)
    image -= image.min()
    image /= image.max()
    return image.astype(np.float32), np.stack([~mask, mask], axis=-1).astype(np.float32)


def _unet(x, keep_prob: float, layers: int, root: int):
    def weight(shape, stddev):
        return tf.Variable(tf.random.truncated_normal(shape, stddev=stddev))

    def bias(n):
        return tf.Variable(tf.constant(0.1, shape=[n]))

    def conv_drop(h, w, keep):
        return dropout(tf.nn.conv2d(h, w, strides=[1, 1, 1, 1], padding="VALID"), keep)

    def crop_concat(skip, up):
        s, u = tf.shape(skip), tf.shape(up)
        start = [0, (s[1] - u[1]) // 2, (s[2] - u[2]) // 2, 0]
        return tf.concat([tf.slice(skip, start, [-1, u[1], u[2], -1]), up], 3)

    skips, h, channels = {}, x, 1
    for level in range(layers):
        features = 2 ** level * root
        stddev = np.sqrt(2 / (9 * features))
        h = tf.nn.relu(conv_drop(h, weight([3, 3, channels, features], stddev), keep_prob) + bias(features))
        h = tf.nn.relu(conv_drop(h, weight([3, 3, features, features], stddev), keep_prob) + bias(features))
        skips[level], channels = h, features
        if level < layers - 1:
            h = tf.nn.max_pool2d(h, ksize=2, strides=2, padding="VALID")
    for level in range(layers - 2, -1, -1):
        features = 2 ** (level + 1) * root
        stddev = np.sqrt(2 / (9 * features))
        shape = tf.shape(h)
        out_shape = tf.stack([shape[0], shape[1] * 2, shape[2] * 2, shape[3] // 2])
        up = tf.nn.conv2d_transpose(h, weight([2, 2, features // 2, features], stddev), out_shape,
                                    strides=[1, 2, 2, 1], padding="VALID")
        h = crop_concat(skips[level], tf.nn.relu(up + bias(features // 2)))
        h = tf.nn.relu(conv_drop(h, weight([3, 3, features, features // 2], stddev), keep_prob) + bias(features // 2))
        h = tf.nn.relu(conv_drop(h, weight([3, 3, features // 2, features // 2], stddev), keep_prob)
                       + bias(features // 2))
    head = conv_drop(h, weight([1, 1, root, 2], stddev), 1.0)
    return tf.nn.relu(head + bias(2))


def output_size(nx: int, layers: int = 3) -> int:
    size = nx
    for level in range(layers):
        size -= 4
        if level < layers - 1:
            size //= 2
    for _ in range(layers - 1):
        size = size * 2 - 4
    return size


def make_target(seed: int = 0, nx: int = 572, batch: int = 1, keep_prob: float = 0.75, layers: int = 3,
                features_root: int = 16, lr: float = 0.2, decay_rate: float = 0.95, decay_steps: int = 32,
                momentum: float = 0.2) -> GraphTarget:
    out = output_size(nx, layers)
    offset = (nx - out) // 2
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, None, None, 1], name="x")
        y = v1.placeholder(tf.float32, [None, None, None, 2], name="y")
        logits = _unet(x, keep_prob, layers, features_root)
        exps = tf.exp(logits)  # GRIST bug ID_17
        prediction = exps / tf.tile(tf.reduce_sum(exps, 3, keepdims=True), tf.stack([1, 1, 1, tf.shape(logits)[3]]))
        intersection = tf.reduce_sum(prediction * y)
        union = 1e-5 + tf.reduce_sum(prediction) + tf.reduce_sum(y)
        cost = -(2 * intersection / union)
        step = tf.Variable(0, trainable=False)
        rate = v1.train.exponential_decay(lr, step, decay_steps, decay_rate, staircase=True)
        train = v1.train.MomentumOptimizer(rate, momentum).minimize(cost, global_step=step)

    def sample(r: np.random.Generator):
        pairs = [toy_image(r, nx, nx) for _ in range(batch)]
        images = np.stack([p[0] for p in pairs])[..., None]
        labels = np.stack([p[1] for p in pairs])[:, offset:offset + out, offset:offset + out]
        return {"x": images, "y": labels}

    return GraphTarget(graph=graph, session=start_session(graph), feeds={"x": x, "y": y}, loss=cost,
                       train_op=train, sample=sample, bounds={"x": (0.0, 1.0)}, search=["x"])
