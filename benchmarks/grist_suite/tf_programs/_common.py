"""Data stand-ins and small TF1-style pieces shared by the TensorFlow programs of the GRIST suite.

No GRIST program lives here: each program (its layers, its loss, its bug) is written out in its own
module, so that the op sites and the ``# GRIST bug`` marks sit in the subject's file.

Data: nothing is downloaded. Most GRIST TensorFlow programs train on MNIST as
``input_data.read_data_sets`` hands it out: float32 pixels in ``[0, 1]``, 28 x 28, one-hot labels.
:func:`digits` stands in for it with the 1,797 handwritten digits scikit-learn ships
(``sklearn.datasets.load_digits``: 8 x 8, 17 grey levels): each is scaled to ``[0, 1]``, enlarged 3x
to 24 x 24, smoothed by one pass of a [1, 2, 1] / 4 filter, renormalised to a maximum of 1 and
placed in a 28 x 28 frame at a random offset of up to +-2 pixels from the centre (MNIST centres a
20 x 20 digit box in 28 x 28). Labels are the real ones. Images are drawn with replacement, so a
pool of any size comes from the 1,797 digits.
"""
from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


@functools.lru_cache(maxsize=1)
def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float32) / 16.0, d.target.astype(np.int64)


def _smooth(img: np.ndarray) -> np.ndarray:
    """One pass of a separable [1, 2, 1] / 4 filter over the last two axes (zero outside)."""
    p = np.pad(img, [(0, 0)] * (img.ndim - 2) + [(1, 1), (1, 1)])
    rows = (p[..., :-2, :] + 2 * p[..., 1:-1, :] + p[..., 2:, :]) / 4
    return (rows[..., :, :-2] + 2 * rows[..., :, 1:-1] + rows[..., :, 2:]) / 4


def digits(n: int, seed: int, side: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """``n`` MNIST-like images, float32 in ``[0, 1]`` of shape ``[n, side, side]`` (``side >= 28``), and labels 0..9."""
    images, labels = _sklearn_digits()
    rng = np.random.default_rng([seed, 0xD161])
    pick = rng.integers(0, len(images), size=n)
    big = _smooth(np.kron(images[pick], np.ones((3, 3), np.float32)))          # [n, 24, 24]
    big /= np.maximum(big.max(axis=(1, 2), keepdims=True), 1e-6)
    out = np.zeros((n, side, side), np.float32)
    corner = (side - 24) // 2
    shift = rng.integers(-2, 3, size=(n, 2))
    for i in range(n):
        r, c = corner + shift[i]
        out[i, r:r + 24, c:c + 24] = big[i]
    return out, labels[pick]


def one_hot(labels: np.ndarray, classes: int = 10) -> np.ndarray:
    return np.eye(classes, dtype=np.float32)[labels]


class Pool:
    """A fixed pool of examples; ``draw`` returns a batch (rows drawn with replacement) by feed name."""

    def __init__(self, **arrays: np.ndarray) -> None:
        sizes = {len(a) for a in arrays.values()}
        if len(sizes) != 1:
            raise ValueError(f"pool arrays disagree on their length: {sizes}")
        self.arrays = arrays
        self.size = sizes.pop()

    def draw(self, rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
        idx = rng.integers(0, self.size, size=batch)
        return {k: v[idx] for k, v in self.arrays.items()}


def mnist_pool(seed: int, n: int = 2048, flat: bool = True, channel: bool = False, pixels: str = "unit",
               x: str = "x", y: str = "y") -> Pool:
    """MNIST stand-in as a :class:`Pool`: images flat ``[n, 784]`` (or ``[n, 28, 28]``, ``[n, 28, 28, 1]``
    with ``channel``) and one-hot labels; ``pixels="signed"`` maps them to ``[-1, 1]`` (``2 p - 1``)."""
    images, labels = digits(n, seed)
    if pixels == "signed":
        images = images * 2.0 - 1.0
    elif pixels != "unit":
        raise ValueError(f"pixels must be 'unit' or 'signed', got {pixels!r}")
    if flat:
        images = images.reshape(n, 784)
    elif channel:
        images = images[..., None]
    return Pool(**{x: images.astype(np.float32), y: one_hot(labels)})


def dropout(h, keep_prob: float):
    """TF1's ``tf.nn.dropout(h, keep_prob)`` in TF2 terms (a drop rate), drawn inside the graph."""
    return tf.nn.dropout(h, rate=1.0 - keep_prob)


def start_session(graph: tf.Graph) -> v1.Session:
    """A session of its own for ``graph``, with every variable initialised."""
    with graph.as_default():
        init = v1.global_variables_initializer()
    session = v1.Session(graph=graph)
    session.run(init)
    return session


def tutorial_cnn_softmax(image, keep_prob: float | None, train_keep_prob: float | None = None):
    """The convolutional network of TensorFlow's "Deep MNIST for experts" tutorial, which several GRIST
    subjects copy: on ``[batch, 28, 28, 1]`` images, two 5x5 SAME convolutions (32 and 64 maps, ReLU,
    2x2 max-pooling), a 1024-unit ReLU layer, dropout at ``keep_prob`` (none when ``None``) and a
    10-way softmax; weights from a truncated normal of stddev 0.1, biases 0.1. Returns the softmax.

    ``train_keep_prob``: the program watches one pass and trains on another (GRIST's entries of ID_6,
    ID_7, ID_8 and ID_29 feed ``keep_prob: 1.0`` to the pass they watch and 0.5 to ``train_step``):
    returns ``(watched, trained)``, two softmaxes of the same variables on the same images, the first
    with dropout at ``keep_prob``, the second at ``train_keep_prob``."""
    def weight(shape):
        return tf.Variable(tf.random.truncated_normal(shape, stddev=0.1))

    def bias(shape):
        return tf.Variable(tf.constant(0.1, shape=shape))

    def conv_pool(h, w, b):
        conv = tf.nn.relu(tf.nn.conv2d(h, w, strides=[1, 1, 1, 1], padding="SAME") + b)
        return tf.nn.max_pool2d(conv, ksize=2, strides=2, padding="SAME")

    made: list = []

    def param(i: int, make, shape):
        """The ``i``-th variable, created at its first use (the order of the single-pass network, whose
        initial values the graph's seed ties to the order the ops are made in), reused after."""
        if i == len(made):
            made.append(make(shape))
        return made[i]

    def forward(keep: float | None):
        h = conv_pool(image, param(0, weight, [5, 5, 1, 32]), param(1, bias, [32]))
        h = conv_pool(h, param(2, weight, [5, 5, 32, 64]), param(3, bias, [64]))
        h = tf.nn.relu(tf.matmul(tf.reshape(h, [-1, 7 * 7 * 64]), param(4, weight, [7 * 7 * 64, 1024]))
                       + param(5, bias, [1024]))
        if keep is not None:
            h = dropout(h, keep)
        return tf.nn.softmax(tf.matmul(h, param(6, weight, [1024, 10])) + param(7, bias, [10]))

    watched = forward(keep_prob)
    return watched if train_keep_prob is None else (watched, forward(train_keep_prob))


def bmi_pool(seed: int, n: int = 20000) -> Pool:
    """Stand-in for the bmi.csv of GRIST subjects ID_40..42 (20,000 people): heights uniform in 120..200 cm
    and weights in 35..80 kg (whole numbers, the file's ranges), labelled thin / normal / fat at a body-mass
    index of 18.5 and 25; features ``[weight / 100, height / 200]`` as the programs scale them."""
    rng = np.random.default_rng([seed, 0xB31])
    height = rng.integers(120, 201, n).astype(np.float32)
    weight = rng.integers(35, 81, n).astype(np.float32)
    bmi = weight / (height / 100) ** 2
    label = np.where(bmi < 18.5, 0, np.where(bmi < 25, 1, 2))
    return Pool(x=np.stack([weight / 100, height / 200], axis=1).astype(np.float32), y=one_hot(label, 3))


def xavier_uniform(fan_in: int, fan_out: int):
    """``U(-sqrt(6 / (fan_in + fan_out)), +...)``, the ``xavier_init`` of the VAE chapters (ID_35, 36, 39, 43, 49)."""
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return tf.random.uniform((fan_in, fan_out), minval=-limit, maxval=limit, dtype=tf.float32)


def softplus_mlp(h, sizes: list[int]):
    """Dense softplus layers of ``sizes`` (Xavier-uniform weights, zero biases), as the VAE chapters build
    their encoder and decoder."""
    for size in sizes:
        weight = tf.Variable(xavier_uniform(int(h.shape[1]), size))
        h = tf.nn.softplus(tf.add(tf.matmul(h, weight), tf.Variable(tf.zeros([size], dtype=tf.float32))))
    return h


def affine(h, size: int):
    """One dense layer without activation, Xavier-uniform weights and zero biases."""
    weight = tf.Variable(xavier_uniform(int(h.shape[1]), size))
    return tf.add(tf.matmul(h, weight), tf.Variable(tf.zeros([size], dtype=tf.float32)))


def pretrain(target, steps: int, seed: int) -> None:
    """Run a graph target's own train op on ``steps`` sampled batches (what a program does before GRIST's
    search starts, when its instrumented copy trains first)."""
    rng = np.random.default_rng([seed, 0x7A1])
    for _ in range(steps):
        batch = target.sample(rng)
        target.session.run(target.train_op, {target.feeds[k]: v for k, v in batch.items()})
