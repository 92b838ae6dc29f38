"""The mixed-precision subjects (campaigns/targets/mp_*.py) checked without the engine.

For every pair, on the subject's own ``witness`` batch (in bounds): under
``torch.autocast("cpu", dtype=torch.float16)`` (Keras: the ``mixed_float16`` policy while the
factory builds) some op's output is non-finite; in float32 the same batch is finite
(precision-only); 20 sampled batches are finite under autocast (the bug needs search); the
guarded twin is finite on the witness under autocast. For the GradScaler subject the
non-finite value is the fp16 weight gradient: the scaler skips step after step on the
witness until the scale is below 1 (a loss-scale collapse), never on sampled batches, and
never collapses in the twin.
"""
from __future__ import annotations

import copy
import functools
import importlib
import math

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

FORWARD = ["mp_t5_ff", "mp_attn_softmax", "mp_sum_loss", "mp_layernorm"]
SAMPLED = 20


def module(name: str):
    return importlib.import_module(f"campaigns.targets.{name}")


@functools.lru_cache(maxsize=None)
def built(name: str, **args):
    """The factory's target and a snapshot of its state (every test starts from it)."""
    target = module(name).make_target(seed=0, **args)
    return target, _state(target)


def _stateful(target) -> list:
    objs = [target.model]
    owner = getattr(target.train_step, "__self__", None)
    objs += [target.optimizer] if target.optimizer is not None else []
    objs += [owner.opt, owner.scaler] if owner is not None else []
    return objs


def _state(target) -> list:
    return [copy.deepcopy(o.state_dict()) for o in _stateful(target)]


def fresh(name: str, **args):
    target, state = built(name, **args)
    for obj, s in zip(_stateful(target), state):
        obj.load_state_dict(copy.deepcopy(s))
    return target


def tensors(batch: dict) -> dict:
    return {k: torch.as_tensor(v) for k, v in batch.items()}


class NonFinite(TorchFunctionMode):
    """Notes every torch call whose floating-point output holds inf or NaN."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() \
                    and not bool(torch.isfinite(t.detach()).all()):
                self.ops.append(getattr(func, "__name__", str(func)))
        return out


def run(target, batch: dict, fp16: bool, train: bool = True) -> list[str]:
    """The program's forward (under fp16 autocast when asked), then its backward and optimizer
    step when it trains: the ops with a non-finite output, plus ``grad``/``weights`` when a
    gradient or an updated weight is non-finite."""
    mode = NonFinite()
    with mode, torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
        loss = target.program(tensors(batch))
    bad = list(mode.ops)
    if not math.isfinite(float(loss.detach())):
        bad.append("loss")
    if train and target.optimizer is not None:
        target.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = list(target.model.parameters())
        if any(p.grad is not None and not bool(torch.isfinite(p.grad).all()) for p in params):
            bad.append("grad")
        target.optimizer.step()
        if any(not bool(torch.isfinite(p).all()) for p in params):
            bad.append("weights")
    return bad


def in_bounds(target, batch: dict) -> bool:
    return all(lo <= float(np.min(batch[k])) and float(np.max(batch[k])) <= hi
               for k, (lo, hi) in target.bounds.items())


# ---- the forward subjects -------------------------------------------------------------------

@pytest.mark.parametrize("name", FORWARD)
def test_witness_overflows_fp16_only(name):
    target = fresh(name)
    batch = module(name).witness(target)
    assert in_bounds(target, batch)
    assert run(target, batch, fp16=True), f"{name}: the witness stays finite under fp16 autocast"
    target = fresh(name)
    assert run(target, batch, fp16=False) == [], f"{name}: the witness is not finite in fp32"


@pytest.mark.parametrize("name", FORWARD)
def test_sampled_batches_stay_finite_under_fp16(name):
    target = fresh(name)
    for i in range(SAMPLED):
        batch = target.sample(np.random.default_rng([7, i]))
        assert run(target, batch, fp16=True, train=False) == [], f"{name}: sampled batch {i}"


@pytest.mark.parametrize("name", FORWARD)
def test_guarded_twin_is_finite_on_the_witness_under_fp16(name):
    batch = module(name).witness(fresh(name))
    twin = fresh(f"{name}_guarded")
    assert run(twin, batch, fp16=True) == []


def test_the_fp16_overflow_is_where_the_docstrings_say():
    """The first non-finite op of each witness under autocast: the op the docstring names."""
    first = {}
    for name in FORWARD:
        target = fresh(name)
        first[name] = run(target, module(name).witness(target), fp16=True, train=False)[0]
    assert first == {"mp_t5_ff": "linear", "mp_attn_softmax": "exp", "mp_sum_loss": "sum",
                     "mp_layernorm": "pow"}


# ---- the GradScaler subject -----------------------------------------------------------------

def scales(target, batch: dict, steps: int) -> list[float]:
    """The scale after each of ``steps`` training steps on the same batch."""
    scaler = target.train_step.__self__.scaler
    out = []
    for _ in range(steps):
        target.train_step(tensors(batch))
        out.append(scaler.get_scale())
    return out


def weights_finite(target) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in target.model.parameters())


def test_scaler_collapses_on_the_witness_in_fp16_only():
    target = fresh("mp_cnn_scaler")
    start = target.train_step.__self__.scaler.get_scale()
    batch = module("mp_cnn_scaler").witness(target)
    assert in_bounds(target, batch) and start >= 8
    target.train_step(tensors(batch))               # the first step: its fp16 gradient overflows
    assert any(not bool(torch.isfinite(p.grad).all()) for p in target.model.parameters())
    after = [target.train_step.__self__.scaler.get_scale()] + scales(target, batch, 11)
    skips = next(i for i, (a, b) in enumerate(zip([start] + after, after)) if not b < a)
    assert skips >= 5 and min(after) < 1.0, (start, after)       # skip after skip, below 1
    assert weights_finite(target)                    # skipped steps leave the weights alone
    fp32 = fresh("mp_cnn_scaler", amp=False)
    fp32.train_step(tensors(batch))
    assert all(bool(torch.isfinite(p.grad).all()) for p in fp32.model.parameters())
    assert weights_finite(fp32)


def test_scaler_never_skips_on_sampled_batches():
    target = fresh("mp_cnn_scaler")
    scaler = target.train_step.__self__.scaler
    start = scaler.get_scale()
    for i in range(SAMPLED):
        fresh("mp_cnn_scaler")
        target.train_step(tensors(target.sample(np.random.default_rng([7, i]))))
        assert scaler.get_scale() == start, f"sampled batch {i} made the scaler skip"
        assert all(bool(torch.isfinite(p.grad).all()) for p in target.model.parameters())


def test_scaler_twin_never_collapses_on_the_witness():
    batch = module("mp_cnn_scaler").witness(fresh("mp_cnn_scaler"))
    twin = fresh("mp_cnn_scaler_guarded")
    after = scales(twin, batch, 12)
    assert min(after) >= 16 and weights_finite(twin), after


# ---- Keras under mixed_float16 ----------------------------------------------------------------

@pytest.mark.tf
def test_keras_poisson_overflows_under_mixed_float16_only():
    tf = pytest.importorskip("tensorflow")
    mod, twin_mod = module("mp_keras_poisson"), module("mp_keras_poisson_guarded")

    def build(m, policy):
        before = tf.keras.mixed_precision.global_policy().name
        tf.keras.mixed_precision.set_global_policy(policy)
        try:
            return m.make_target(seed=0)
        finally:
            tf.keras.mixed_precision.set_global_policy(before)

    mixed, plain, twin = build(mod, "mixed_float16"), build(mod, "float32"), build(twin_mod, "mixed_float16")
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    assert [layer.compute_dtype for layer in mixed.model.layers] == ["float16", "float16"]
    assert [layer.compute_dtype for layer in twin.model.layers] == ["float16", "float32"]
    batch = mod.witness(plain)
    assert in_bounds(plain, batch)
    assert not np.isfinite(mixed.program(batch).numpy())
    assert not np.isfinite(mixed.model(batch["x"]).numpy()).all()    # the float16 rate itself
    assert np.isfinite(plain.program(batch).numpy())
    assert np.isfinite(twin.program(batch).numpy())
    hidden = twin.model.layers[0](batch["x"]).numpy()
    assert np.abs(hidden).max() < 1000                                  # the float16 layer is far from 65504
    for i in range(SAMPLED):
        assert np.isfinite(mixed.program(mixed.sample(np.random.default_rng([7, i]))).numpy()), i
