"""How far an adaptive optimizer moves a weight per unit of this step's gradient.

Adam, RMSprop and Adagrad divide a weight's gradient ``g`` by ``sqrt(s) + eps``, where the second moment
``s = b + k * g**2`` is fed by ``g`` itself (``b`` from the optimizer's state: Adam's ``beta2 * v``,
RMSprop's ``rho * ms``, Adagrad's sum of squares with ``k = 1``); Adam's numerator is the first moment
``c + a * g`` (``beta1 * m + (1 - beta1) * g``). The update ``-lr (c + a g) / (sqrt(s) + eps)`` changes
with ``g`` at the rate

    a / (r + eps) - (c + a g) * k * g / (r * (r + eps)**2),        r = sqrt(s),

the derivative the lookahead needs (times ``-lr``, a constant the drift's sign steps ignore): about
``a / (r + eps)`` where the state's moment dominates this step's gradient. A weight the optimizer holds
no moment for yet (``b = 0``: before its first step, or never reached by a gradient) would have a tangent
of about 0 (a first step moves it by the learning rate whatever its gradient), or ``a / eps`` where its
gradient is below ``eps``; neither holds over the drift's steps, and such a weight is measured as if its
gradient were its tensor's typical one. Plain gradient descent and momentum have a constant rate.
Written once for tensors of any framework (``xp`` holds the framework's ``sqrt``, ``sign`` and
``mean``), so that every backend steers the training by the same model.
"""
from __future__ import annotations

from typing import Any

# the lookahead weighs each weight's pull by this gain (False: by 1, as for plain gradient descent; for
# benchmarks/grist_suite/ablation.py)
PRECONDITION = True


def adaptive_gain(g: Any, m: Any, v: Any, beta1: Any, decay: Any, eps: Any, xp: Any) -> Any:
    """The derivative of an adaptive update with respect to this step's gradient ``g`` (up to ``-lr``).

    ``m``, ``v``: the first and second moments the optimizer holds before the step (0 where it holds
    none yet, or no first moment); ``beta1``: the first moment's decay (0: the gradient itself);
    ``decay``: the second moment's (None: a sum, as Adagrad's); ``eps`` added to its root; ``xp``: the
    framework's ``sqrt``, ``sign`` and ``mean`` (NumPy, torch, or a namespace of TensorFlow's)."""
    a = 1.0 - beta1
    c = beta1 * m
    if decay is None:
        b, k = v, 1.0
    else:
        b, k = decay * v, 1.0 - decay
    # a weight with no moment yet (b = 0) and no gradient on this batch has a tangent of a / eps (1e7 for
    # Adam), true only while its gradient stays below eps; a drift's steps move it far past that, to an
    # update of the learning rate's size. Such a weight is measured as if its gradient were the tensor's
    # typical one; every other weight exactly.
    unseen = 1.0 - xp.sign(b)
    r = xp.sqrt(b + k * g * g + unseen * k * xp.mean(g * g)) + 1e-30
    return a / (r + eps) - (c + a * g) * k * g / (r * (r + eps) ** 2)


class _TensorFlowOps:
    """``adaptive_gain``'s ``xp`` for TensorFlow tensors (imported when first used)."""

    @staticmethod
    def sqrt(t):
        import tensorflow as tf

        return tf.sqrt(t)

    @staticmethod
    def sign(t):
        import tensorflow as tf

        return tf.sign(t)

    @staticmethod
    def mean(t):
        import tensorflow as tf

        return tf.reduce_mean(t)


TF_OPS = _TensorFlowOps()
