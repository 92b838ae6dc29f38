"""The catalogue's backward-hazard rows against what autograd really computes.

For every backward row, on inputs where the op's forward output is finite, the row's margin
is ``<= 0`` exactly where the gradient of the output (an upstream gradient of ones) with
respect to the input is non-finite. Each op is run as given and tiled (67 copies), so the
scalar and the vectorised loops of the CPU kernels are both held to the boundary.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fuzz_core.backends.torch import XP
from fuzz_core.catalogue import DEFAULT_CATALOGUE

F32 = torch.float32
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)
TINY = float(torch.nextafter(torch.tensor(0.0), torch.tensor(1.0)))
MAX = float(torch.finfo(F32).max)


def up(v: float) -> float:
    return float(torch.nextafter(torch.tensor(v, dtype=F32), torch.tensor(math.inf)))


def down(v: float) -> float:
    return float(torch.nextafter(torch.tensor(v, dtype=F32), torch.tensor(-math.inf)))


def f32(v: float) -> float:
    return float(torch.tensor(v, dtype=F32))


def f32s(lo=None, hi=None):
    lo = None if lo is None else f32(lo)
    hi = None if hi is None else f32(hi)
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False, width=32)


def vec(elems):
    return st.lists(elems, min_size=1, max_size=6)


def edges(*values):
    def deco(fn):
        for v in values:
            fn = example(xs=[v])(fn)
        return fn
    return deco


def check_backward(name: str, fn, xs: list[float], *extra) -> None:
    spec = DEFAULT_CATALOGUE[name]
    assert spec.phase == "backward"
    x0 = torch.tensor(xs, dtype=F32)
    margin = spec.margins([x0, *extra], XP)
    assert margin is not None
    for reps in (1, 67):
        x = x0.repeat(reps).requires_grad_(True)
        out = fn(x, *extra)
        (grad,) = torch.autograd.grad(out.sum(), x)
        forward_ok = torch.isfinite(out.detach())
        bad = ~torch.isfinite(grad) & forward_ok
        invalid = (margin.detach().repeat(reps) <= 0) & forward_ok
        wrong = bad != invalid
        if bool(wrong.any()):
            i = int(wrong.nonzero()[0, 0]) % len(xs)
            pytest.fail(f"{name}({xs[i]!r}, x{reps}): margin {margin[i].item()!r}, gradient {grad[i].item()!r}")


def test_backward_rows_are_keyed_beside_their_forward_rows():
    backward = DEFAULT_CATALOGUE.torch_backward_specs()
    for packet, spec in backward.items():
        assert spec.phase == "backward" and spec.searched and spec.log_space
        assert DEFAULT_CATALOGUE.for_torch(packet) is not None, f"{packet}: a backward row without a forward row"
        assert DEFAULT_CATALOGUE.for_torch(packet) is not spec
    assert {"sqrt", "rsqrt", "log", "pow", "acos", "asin", "acosh", "reciprocal"} <= set(backward)


@SETTINGS
@given(xs=vec(f32s(0.0, 10.0)))
@edges(0.0, -0.0, TINY, 1.0, MAX)
def test_sqrt_gradient_is_infinite_exactly_at_zero(xs):
    check_backward("sqrt_grad", torch.sqrt, xs)


@SETTINGS
@given(xs=vec(st.one_of(f32s(0.0, 1e-20), f32s(0.0, 10.0))))
@edges(0.0, TINY, 1e-26, 2e-26, 3e-26, 1.0)
def test_rsqrt_gradient_overflows_below_its_limit(xs):
    lim = XP.limit("rsqrt_grad_min", torch.zeros(1))
    for x in (lim, up(lim)):
        check_backward("rsqrt_grad", torch.rsqrt, [x])
    check_backward("rsqrt_grad", torch.rsqrt, xs)


@SETTINGS
@given(xs=vec(st.one_of(f32s(0.0, 1e-37), f32s(0.0, 10.0))))
@edges(0.0, TINY, 2.9e-39, 3e-39, 1.0, MAX)
def test_log_gradient_overflows_on_subnormal_inputs(xs):
    lim = XP.limit("log_grad_min", torch.zeros(1))
    for x in (lim, up(lim)):
        check_backward("log_grad", torch.log, [x])
    check_backward("log_grad", torch.log, xs)


@SETTINGS
@given(xs=vec(f32s(-2.0, 2.0)))
@edges(1.0, -1.0, down(1.0), up(-1.0), 0.0)
def test_acos_asin_gradients_are_infinite_at_plus_minus_one(xs):
    check_backward("acos_grad", torch.acos, xs)
    check_backward("asin_grad", torch.asin, xs)


@SETTINGS
@given(xs=vec(f32s(0.5, 5.0)))
@edges(1.0, up(1.0), 2.0)
def test_acosh_gradient_is_infinite_at_one(xs):
    check_backward("acosh_grad", torch.acosh, xs)


@SETTINGS
@given(xs=vec(st.one_of(f32s(-1e-18, 1e-18), f32s(-10.0, 10.0))))
@edges(0.0, TINY, 5e-20, 6e-20, -5e-20, 1.0)
def test_reciprocal_gradient_overflows_below_its_limit(xs):
    lim = XP.limit("reciprocal_grad_max", torch.zeros(1))
    for x in (lim, up(lim), -lim, -up(lim)):
        check_backward("reciprocal_grad", torch.reciprocal, [x])
    check_backward("reciprocal_grad", torch.reciprocal, xs)


@SETTINGS
@given(xs=vec(st.one_of(f32s(0.0, 1e-30), f32s(0.0, 10.0))), p=st.sampled_from([0.25, 0.5, 0.75]))
@example(xs=[0.0, TINY, 1.0], p=0.5)
def test_pow_gradient_below_one_is_infinite_at_zero(xs, p):
    check_backward("pow_grad", lambda x, e: torch.pow(x, e), xs, p)


def test_pow_gradient_has_no_hazard_for_other_exponents():
    x = torch.ones(3)
    for p in (0.0, 1.0, 1.5, 2, -0.5, 3):
        assert DEFAULT_CATALOGUE["pow_grad"].margins([x, p], XP) is None
