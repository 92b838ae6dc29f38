"""What both TensorFlow runners share: seeding, variable names and values, gradients, versions.

:func:`seed_everything` seeds every generator a program may draw from (Python, NumPy,
TensorFlow, Keras); the helpers name and deduplicate variables, reshape saved values for
them, turn fetched gradients into NumPy arrays and score a margin tensor (its hard
minimum and log-space soft minimum). Importing this module sizes TensorFlow's thread
pools. Loaded only by the TensorFlow backend modules (:mod:`fuzz_core.backends.tensorflow`,
:mod:`fuzz_core.backends.tf_graph`), never by the driver.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import sys
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context as tf_context

from fuzz_core.backends.base import LOG_TAU, CheckResult, Precision, collect_grads
from fuzz_core.backends.tf_recorder import np_dtype, tiny_of
from fuzz_core.catalogue import log_floor

log = logging.getLogger(__name__)


def _configure_threads() -> None:
    """One intra- and one inter-op thread (a shared 2-core machine); TF_NUM_*_THREADS win."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", 1)))
        tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("TF_NUM_INTEROP_THREADS", 1)))
    except RuntimeError:
        pass    # the context is initialised already (the factory ran ops): the env vars decided


_configure_threads()


def seed_everything(seed: int, kernels: bool = True) -> None:
    """Seed every generator a program may draw from (its iterative external values).

    ``tf.random.set_seed`` also empties the eager kernel cache (stateful random kernels
    keep their state there), which costs every op of the next pass a kernel rebuild: with
    ``kernels=False`` the global seed is set without that, for programs that run no
    stateful random op (the recorder tells; Keras layers draw from stateless ops).
    """
    seed = int(seed) % (2**31)
    random.seed(seed)
    np.random.seed(seed)
    if kernels:
        tf.random.set_seed(seed)
    else:
        ctx = tf_context.context()
        ctx._seed = seed                      # noqa: SLF001 - what set_seed does, less the cache flush
        ctx._rng = random.Random(seed)        # noqa: SLF001
    _seed_keras(seed)


def _seed_keras(seed: int) -> None:
    """keras.utils.set_random_seed less its tf.random.set_seed: the global Keras seed generator."""
    keras = sys.modules.get("keras")
    if keras is None:
        return
    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
        from keras.src.utils import rng_utils

        global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, seed)
        global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    except Exception:  # noqa: BLE001 - another Keras layout: its public function does it all
        keras.utils.set_random_seed(seed)


def _var_name(v: Any) -> str:
    name = getattr(v, "path", None) or getattr(v, "name", None) or "variable"
    return str(name).removesuffix(":0")


def _unique(variables) -> list:
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _scalar(value) -> float:
    if value is None:
        return float("nan")
    arr = np.asarray(value.numpy() if tf.is_tensor(value) else value, dtype=np.float64)
    return float(arr.mean()) if arr.size else float("nan")


def _to_numpy_grad(g) -> np.ndarray:
    if isinstance(g, tf.IndexedSlices):
        g = tf.convert_to_tensor(g)
    arr = g.numpy() if tf.is_tensor(g) else np.asarray(g)
    if hasattr(arr, "values") and hasattr(arr, "indices"):   # IndexedSlicesValue from a session
        dense = np.zeros(arr.dense_shape, dtype=arr.values.dtype)
        np.add.at(dense, arr.indices, arr.values)
        arr = dense
    return np.nan_to_num(np.asarray(arr, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)


def _collect(names: list[str], shapes: list, grads: list) -> tuple[dict[str, np.ndarray], float, bool]:
    """:func:`collect_grads` for TensorFlow gradients (dense, IndexedSlices, or session values)."""
    return collect_grads(names, shapes, grads, _to_numpy_grad)


def _warn_unknown(state: dict, known, prefixes: tuple[str, ...]) -> None:
    unknown = [k for k in state if k.startswith(prefixes) and k not in known]
    if unknown:
        log.warning("state holds %d variable(s) this target does not have (e.g. %s): left as they are",
                    len(unknown), unknown[0])


def _shaped(value, var) -> np.ndarray:
    """A saved value in the variable's dtype and shape (files store scalars as 1-element arrays)."""
    dtype = var.dtype.base_dtype if hasattr(var.dtype, "base_dtype") else var.dtype
    arr = np.asarray(value).astype(np_dtype(dtype))
    shape = tuple(var.shape)
    if arr.shape != shape and None not in shape and arr.size == int(np.prod(shape, dtype=np.int64)):
        arr = arr.reshape(shape)
    return arr


def _versions() -> dict[str, str]:
    out = {"tensorflow": tf.__version__}
    try:
        import keras

        out["keras"] = keras.__version__
    except Exception:  # noqa: BLE001
        pass
    return out


def _soft_min(m):
    """``(m, hard, log_loss)`` of a margin tensor: its minimum and its log-space soft minimum.

    Half-precision margins are cast to float32 first (the returned ``m`` is the cast one).
    """
    if m.dtype in (tf.float16, tf.bfloat16):
        m = tf.cast(m, tf.float32)
    flat = tf.reshape(m, [-1])
    hard = tf.reduce_min(flat)
    tiny = tiny_of(m.dtype)
    log_loss = (-LOG_TAU * tf.reduce_logsumexp(-tf.math.log(tf.maximum(flat, tf.constant(tiny, m.dtype)))
                                               / LOG_TAU) - log_floor(tiny))
    return m, hard, log_loss


def followed_margin(hard, log_space: bool):
    """The margin the lookahead steers the training toward: the hard minimum, in log space for an op
    judged there (as the torch backend), clamped at the dtype's tiniest normal value."""
    if not log_space:
        return hard
    return tf.math.log(tf.maximum(hard, tf.constant(tiny_of(hard.dtype), hard.dtype)))


def alignment(loss_grads: list, toward: list):
    """``<dL/dtheta, dm/dtheta>`` in float64 over the variables that have both gradients (``toward``
    held fixed by the caller), or None when none has."""
    terms = [tf.reduce_sum(tf.cast(g, tf.float64) * tf.cast(t, tf.float64))
             for g, t in zip(loss_grads, toward) if g is not None]
    return tf.add_n(terms) if terms else None


# ---- mixed precision: the Keras global policy, and the float32 twin of a mixed target ------

def _keras_precision_modules() -> list:
    """The ``mixed_precision`` modules of the Keras packages a factory may build with: Keras
    (``tf.keras`` is Keras 3 in TF >= 2.16) and, when the program imported it, ``tf_keras``."""
    out = []
    try:
        import keras

        out.append(keras.mixed_precision)
    except Exception:  # noqa: BLE001 - no Keras: nothing to set
        pass
    legacy = sys.modules.get("tf_keras")
    if legacy is not None and hasattr(legacy, "mixed_precision"):
        out.append(legacy.mixed_precision)
    return out


@contextlib.contextmanager
def keras_policy(name: str | None):
    """Keras's global dtype policy is ``name`` ("mixed_float16", "mixed_bfloat16", "float32")
    while the block runs, and what it was before afterwards (None: left as it is). Layers take
    the global policy when they are constructed and keep it: a model built inside the block
    runs in mixed precision after it, and a later build in the same process is float32 again."""
    if name is None:
        yield
        return
    saved = []
    for mp in _keras_precision_modules():
        saved.append((mp, mp.global_policy()))
        mp.set_global_policy(name)
    try:
        yield
    finally:
        for mp, policy in reversed(saved):
            mp.set_global_policy(policy)


class Fp32Twin:
    """The fp32 re-check of a mixed-precision finding, for both TensorFlow runners: the same
    values replayed on a float32 build of the target (the factory rebuilt from the runner's
    ``target_spec`` with the Keras policy "float32"), built once per runner, on first use."""

    options: Any
    target_spec: Any = None          # set by fuzz_core.engine.build_runner

    def fp32_check(self, values: dict[str, np.ndarray], seed: int,
                   state: dict[str, np.ndarray] | None = None) -> CheckResult:
        """The check-only detector on the float32 twin, from the factory's state (plus ``state``,
        a finding's saved weights), on the same values and seed."""
        twin = self._fp32_twin()
        twin.reset()
        if state:
            twin.set_state(state)
        return twin.check(values, seed)

    def fp32_finite(self, values: dict[str, np.ndarray], seed: int,
                    state: dict[str, np.ndarray] | None = None) -> bool:
        """Does the float32 program stay finite on a finding's input? True: the finding is
        precision-only (it exists only in mixed precision); False: float32 fails too."""
        return not self.fp32_check(values, seed, state).event

    def _fp32_twin(self):
        twin = getattr(self, "_fp32", None)
        if twin is not None:
            return twin
        if not self.options.precision.mixed:
            self._fp32 = self            # already float32: the re-check is a replay here
            return self
        if self.target_spec is None:
            raise RuntimeError("the fp32 re-check rebuilds the target from its TargetSpec: build the runner "
                               "with fuzz_core.engine.build_runner")
        from fuzz_core.engine import build_runner

        with keras_policy("float32"):
            twin = build_runner(self.target_spec, dataclasses.replace(self.options, precision=Precision()))
        self._fp32 = twin
        return twin
