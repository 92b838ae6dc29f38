"""Stand-in data and the input-range policy shared by the PyTorch programs of the GRIST suite.

Nothing may be downloaded at run time, so the programs that read MNIST or FashionMNIST get
scikit-learn's bundled 8x8 digits (1,797 images, values 0..16) brought to MNIST's layout:
each image is scaled to [0, 1] (values / 16), enlarged to 20x20 by bilinear interpolation
and centred in a 28x28 frame with a 4-pixel margin, as MNIST centres its 20x20 digit boxes.
Result: float32 pixels in [0, 1], shape (N, 784) or (N, 1, 28, 28), integer labels 0..9,
the shapes, dtypes and value range ``torchvision``'s ``ToTensor()`` gives the originals.

Input ranges (``bounds``): pixels keep their natural range [0, 1]. The feature tables,
logits and scores that the small programs take as plain real numbers have no natural
range, and GRIST searched them unclipped (``clip=False`` in its instrumented entries);
``Target.bounds`` must be finite, so they get ``(-FREE_BOUND, FREE_BOUND)``. In float32,
``sigmoid`` rounds to exactly 1 from an argument of ~16.6 and to 0 below ~-103.3, ``softmax``
underflows to 0 at a logit gap of ~103.3 and ``exp`` overflows above ~88.72: a box of +-100
puts each of these within reach without opening the whole float range. Every factory that
uses it takes the bound as a named argument.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

FREE_BOUND = 100.0
MNIST_SIDE, DIGIT_BOX = 28, 20


@lru_cache(maxsize=1)
def _digits_28() -> tuple[np.ndarray, np.ndarray]:
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = torch.from_numpy((digits.images / 16.0).astype(np.float32)).unsqueeze(1)  # (N, 1, 8, 8)
    big = F.interpolate(small, size=(DIGIT_BOX, DIGIT_BOX), mode="bilinear", align_corners=False)
    margin = (MNIST_SIDE - DIGIT_BOX) // 2
    frame = torch.zeros(len(small), 1, MNIST_SIDE, MNIST_SIDE)
    frame[:, :, margin:margin + DIGIT_BOX, margin:margin + DIGIT_BOX] = big.clamp(0.0, 1.0)
    images = frame.numpy().astype(np.float32)
    images.setflags(write=False)
    labels = digits.target.astype(np.int64)
    labels.setflags(write=False)
    return images, labels


def mnist_like(flat: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels): digits in MNIST's layout, float32 in [0, 1]; (N, 784) when ``flat``."""
    images, labels = _digits_28()
    return (images.reshape(len(images), -1) if flat else images), labels


def batch_rows(rng: np.random.Generator, n_rows: int, batch: int) -> np.ndarray:
    """Row indices of one shuffled mini-batch (a data loader's draw)."""
    return rng.choice(n_rows, size=batch, replace=n_rows < batch)
