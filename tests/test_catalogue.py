"""Property tests of the op catalogue against what PyTorch really computes.

(a) The hard-minimum margin of every searched row is ``<= 0`` exactly where the op's
    real output is non-finite, with strict and closed ends respected. Every op is run
    on the inputs as given and tiled (67 copies), so that both the scalar tail loop and
    the SIMD loop of the CPU kernel are held to the same boundary.
(b) A small step of an input against the gradient of its margin reduces the margin.
(c) In-place and ``out=`` overloads are keyed in the catalogue.
(d) ``register_op`` adds user ops and refuses duplicates.
(e) The declared domains agree with PyTorch's own OpInfo database.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from fuzz_core import catalogue as catalogue_module
from fuzz_core.backends.torch import XP, dtype_limit
from fuzz_core.catalogue import DEFAULT_CATALOGUE, Catalogue, OpSpec, register_op, searched_specs
from fuzz_core.domains import POSITIVE

F32, F64 = torch.float32, torch.float64
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)
FEW = settings(max_examples=20, deadline=None, derandomize=True)


def nextafter(v: float, toward: float, dtype: torch.dtype = F32) -> float:
    return float(torch.nextafter(torch.tensor(v, dtype=dtype), torch.tensor(toward, dtype=dtype)))


def up(v: float, dtype: torch.dtype = F32) -> float:
    return nextafter(v, math.inf, dtype)


def down(v: float, dtype: torch.dtype = F32) -> float:
    return nextafter(v, -math.inf, dtype)


def last_below(bound: float, dtype: torch.dtype) -> float:
    """The largest float of dtype that is <= bound (a float64), found without the catalogue."""
    x = float(torch.tensor(bound, dtype=dtype))
    while x > bound:
        x = down(x, dtype)
    return x


TINY = up(0.0)                                   # smallest positive subnormal of float32
NORMAL = float(torch.finfo(F32).tiny)            # smallest positive normal
MAX = float(torch.finfo(F32).max)
TINY64, MAX64 = up(0.0, F64), float(torch.finfo(F64).max)
# The last float whose exp / expm1 is finite: the largest float <= ln(max) (computed in float64).
EXP_LAST = last_below(math.log(MAX), F32)                          # 88.72283172607422
EXP_LAST64 = last_below(math.log(MAX64), F64)
while math.isinf(float(torch.exp(torch.tensor(EXP_LAST64, dtype=F64)))):   # ln(max) rounded up
    EXP_LAST64 = down(EXP_LAST64, F64)
DIGAMMA_RADIUS = dtype_limit("digamma_radius", F32)


def edges(*values, key: str = "xs"):
    """@example for each value (as a one-element list of the argument ``key``)."""
    def deco(fn):
        for v in values:
            fn = example(**{key: v if isinstance(v, (list, tuple)) else [v]})(fn)
        return fn
    return deco


def f32(v: float) -> float:
    return float(torch.tensor(v, dtype=F32))


def f32s(lo: float | None = None, hi: float | None = None, **kw):
    lo = None if lo is None else f32(lo)
    hi = None if hi is None else f32(hi)
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False, width=32, **kw)


def f64s(lo: float | None = None, hi: float | None = None, **kw):
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False, **kw)


def vec(elems, size: int = 6):
    return st.lists(elems, min_size=1, max_size=size)


def pairs(a, b, size: int = 6):
    """Two equally long lists (the two tensor inputs of a binary op)."""
    return st.lists(st.tuples(a, b), min_size=1, max_size=size).map(lambda ps: ([p[0] for p in ps],
                                                                              [p[1] for p in ps]))


# ---- (a) the margin is <= 0 exactly where the output is non-finite ---------------------------

EXACT, NONFINITE_ONLY, MARGIN_ONLY = "exact", "non-finite => margin <= 0", "margin <= 0 => non-finite"


def check(name: str, fn, args: list, dtype: torch.dtype = F32, mode: str = EXACT) -> None:
    """Hold ``DEFAULT_CATALOGUE[name].margins`` against ``fn`` on ``args`` (lists become tensors)."""
    spec = DEFAULT_CATALOGUE[name]
    inputs = [torch.tensor(a, dtype=dtype) if isinstance(a, list) else a for a in args]
    margin = spec.margins(inputs, XP)
    n = max(t.numel() for t in inputs if isinstance(t, torch.Tensor))
    m = torch.full((n,), math.inf, dtype=F64) if margin is None else margin.detach().to(F64).expand(n)
    for reps in (1, 67):   # the scalar loop, then the vectorised loop (with a scalar tail)
        tiled = [a.repeat(reps) if isinstance(a, torch.Tensor) else a for a in inputs]
        with torch.no_grad():
            out = fn(*tiled)
        bad = ~torch.isfinite(out)
        mm = m.repeat(reps)
        invalid = mm <= 0
        if mode == EXACT:
            wrong = invalid != bad
        elif mode == NONFINITE_ONLY:
            wrong = bad & ~invalid
        else:
            wrong = invalid & ~bad
        if bool(wrong.any()):
            i = int(wrong.nonzero()[0, 0]) % n
            shown = [a[i].item() if isinstance(a, torch.Tensor) else a for a in inputs]
            pytest.fail(f"{name}{tuple(shown)} ({dtype}, x{reps}): margin {m[i].item()!r} but output "
                        f"{out.reshape(-1)[i].item()!r} [{mode}]")
        if mode == EXACT:   # the hard minimum (what tests and reports use) says the same
            assert (float(mm.min()) <= 0) == bool(bad.any())


@SETTINGS
@given(xs=vec(f32s()))
@edges(0.0, -0.0, TINY, -TINY, NORMAL, 1.0, -1.0, MAX, -MAX)
def test_log_family_exact(xs):
    check("log", torch.log, [xs])
    check("log2", torch.log2, [xs])
    check("log10", torch.log10, [xs])


@SETTINGS
@given(xs=vec(f32s()))
@edges(-1.0, up(-1.0), down(-1.0), 0.0, -0.0, TINY, MAX, -MAX)
def test_log1p_exact(xs):
    check("log1p", torch.log1p, [xs])


@SETTINGS
@given(xs=vec(f32s()))
@edges(0.0, -0.0, TINY, -TINY, 1.0, -1.0, MAX, -MAX)
def test_sqrt_rsqrt_exact(xs):
    # sqrt is defined at 0 (and at -0.0), rsqrt is not.
    check("sqrt", torch.sqrt, [xs])
    check("rsqrt", torch.rsqrt, [xs])


@SETTINGS
@given(xs=vec(f32s()))
@edges(EXP_LAST, up(EXP_LAST), down(EXP_LAST), 0.0, -104.0, -MAX, MAX)
def test_exp_expm1_exact(xs):
    check("exp", torch.exp, [xs])
    check("expm1", torch.expm1, [xs])


def test_exp_limit_is_the_last_finite_float():
    assert dtype_limit("exp_max", F32) == EXP_LAST
    assert math.isfinite(float(torch.exp(torch.tensor(EXP_LAST))))
    assert math.isinf(float(torch.exp(torch.tensor(up(EXP_LAST)))))


@SETTINGS
@given(xs=vec(f32s()))
@edges(1.0, -1.0, up(1.0), down(1.0), up(-1.0), down(-1.0), 0.0, -0.0, MAX)
def test_acos_asin_closed_ends(xs):
    check("acos", torch.acos, [xs])
    check("asin", torch.asin, [xs])


@SETTINGS
@given(xs=vec(f32s()))
@edges(1.0, -1.0, up(1.0), down(1.0), up(-1.0), down(-1.0), 0.0, -0.0)
def test_atanh_erfinv_open_ends(xs):
    check("atanh", torch.atanh, [xs])
    check("erfinv", torch.erfinv, [xs])


@SETTINGS
@given(xs=vec(f32s()))
@edges(1.0, down(1.0), up(1.0), 0.0, -0.0, -1.0, MAX, -MAX)
def test_acosh_exact(xs):
    check("acosh", torch.acosh, [xs])


@SETTINGS
@given(xs=vec(f32s()))
@edges(0.0, -0.0, TINY, -TINY, 1.0, down(1.0), up(1.0), 0.5, MAX, -MAX)
def test_logit_ndtri_open_unit_interval(xs):
    check("logit", torch.logit, [xs])
    check("ndtri", torch.special.ndtri, [xs])


@FEW
@given(xs=vec(f32s()), eps=st.sampled_from([1e-6, 0.1, 0.5]))
@example(xs=[0.0, 1.0, -0.0, MAX, -MAX], eps=1e-6)
def test_logit_with_eps_has_no_hazard(xs, eps):
    # logit(x, eps) clamps x into [eps, 1 - eps] first: finite for every finite x.
    assert DEFAULT_CATALOGUE["logit"].margins([torch.tensor(xs), eps], XP) is None
    check("logit", lambda x, e: torch.logit(x, e), [xs, eps])


@SETTINGS
@given(xs=vec(f32s(hi=1e30)))
@edges(0.0, -0.0, TINY, -TINY, -1.0, up(-1.0), down(-1.0), -2.5, -1e7, -MAX, 1.0, 2.0, f32(1e30))
def test_lgamma_exact_below_overflow(xs):
    # Exact up to 1e30: lgamma(x) ~ x log x overflows float32 above about 4e36, a hazard the
    # catalogue does not name (its row is the poles); see the one-directional test below.
    check("lgamma", torch.lgamma, [xs])


@FEW
@given(xs=vec(f32s()))
@edges(MAX, 1e37, 0.0, -3.0)
def test_lgamma_poles_are_always_non_finite(xs):
    # Over the whole range only one direction holds: every pole is non-finite, but huge x
    # overflows too (the output, not the margin, judges a trigger).
    check("lgamma", torch.lgamma, [xs], mode=MARGIN_ONLY)


@SETTINGS
@given(xs=vec(f32s()))
@edges(0.0, -0.0, TINY, -TINY, DIGAMMA_RADIUS, up(DIGAMMA_RADIUS), -DIGAMMA_RADIUS, -up(DIGAMMA_RADIUS),
       NORMAL, -1.0, up(-1.0), down(-1.0), -2.5, -MAX, MAX)
def test_digamma_exact(xs):
    # The poles, and -1/x overflowing within digamma_radius of 0, are both in the margin.
    check("digamma", torch.digamma, [xs])


# ---- division-like rows ------------------------------------------------------------------------

def _no_subnormal_divisor(b: float) -> bool:
    return b == 0 or abs(b) >= NORMAL


@SETTINGS
@given(ab=pairs(f32s(-1.0, 1.0), f32s().filter(_no_subnormal_divisor)),
       mode=st.sampled_from([None, "floor", "trunc"]))
@example(ab=([1.0], [0.0]), mode=None)
@example(ab=([0.0], [0.0]), mode=None)
@example(ab=([-1.0], [-0.0]), mode="floor")
@example(ab=([1.0], [NORMAL]), mode=None)
@example(ab=([-1.0], [-NORMAL]), mode="trunc")
@example(ab=([0.0], [-0.0]), mode="trunc")
def test_div_exact_without_overflow(ab, mode):
    # The catalogue names division by zero. a / b also overflows when |b| < |a| / max (a
    # subnormal b for |a| <= 1): there it is exact only with |a| <= 1 and b zero or normal.
    a, b = ab
    check("div", lambda x, y: torch.div(x, y, rounding_mode=mode), [a, b])


@FEW
@given(ab=pairs(f32s(), f32s()))
@example(ab=([1.0], [TINY]))
@example(ab=([MAX], [0.5]))
@example(ab=([0.0], [-0.0]))
def test_div_by_zero_is_always_non_finite(ab):
    # Over the whole range: a zero divisor always gives inf or NaN; overflow by a tiny or
    # small divisor (MAX / 0.5) is non-finite with a positive margin, judged from the output.
    a, b = ab
    check("div", torch.div, [a, b], mode=MARGIN_ONLY)
    check("div", torch.floor_divide, [a, b], mode=MARGIN_ONLY)


@SETTINGS
@given(xs=vec(f32s(allow_subnormal=False)))
@edges(0.0, -0.0, NORMAL, -NORMAL, 1.0, MAX, -MAX)
def test_reciprocal_exact_on_normal_floats(xs):
    # 1 / x overflows for subnormal x: exact on the normal floats and zero.
    check("reciprocal", torch.reciprocal, [xs])


@FEW
@given(xs=vec(f32s()))
@edges(TINY, -TINY, 0.0, -0.0)
def test_reciprocal_of_zero_is_always_non_finite(xs):
    check("reciprocal", torch.reciprocal, [xs], mode=MARGIN_ONLY)


@SETTINGS
@given(ab=pairs(f32s(-1.0, 1.0), f32s().filter(_no_subnormal_divisor)), op=st.sampled_from(["remainder", "fmod"]))
@example(ab=([1.0], [0.0]), op="remainder")
@example(ab=([1.0], [-0.0]), op="fmod")
@example(ab=([0.0], [0.0]), op="fmod")
@example(ab=([-1.0], [NORMAL]), op="remainder")
@example(ab=([1.0], [-NORMAL]), op="fmod")
def test_remainder_fmod_exact_without_overflow(ab, op):
    # As for div: exact with |a| <= 1 and b zero or normal. See the next test for why.
    a, b = ab
    check("remainder", getattr(torch, op), [a, b])


@FEW
@given(ab=pairs(f32s(), f32s()), op=st.sampled_from(["remainder", "fmod"]))
@example(ab=([1.0], [TINY]), op="remainder")
@example(ab=([MAX], [0.5]), op="fmod")
@example(ab=([0.0], [-0.0]), op="remainder")
def test_remainder_by_zero_is_always_nan(ab, op):
    # A zero divisor always gives NaN. The vectorised CPU kernels compute a - b * trunc(a / b)
    # and also return NaN when a / b overflows (remainder(1, 1e-45) on 64 elements; the scalar
    # loop returns 0): non-finite with a positive margin, judged from the output.
    a, b = ab
    check("remainder", getattr(torch, op), [a, b], mode=MARGIN_ONLY)


def test_remainder_by_a_constant_has_no_margin():
    assert DEFAULT_CATALOGUE["remainder"].margins([torch.ones(2), 2.0], XP) is None


@SETTINGS
@given(xy=pairs(st.one_of(st.just(0.0), f32s(-1e30, 1e30)), f32s()))
@example(xy=([0.0], [0.0]))
@example(xy=([0.0], [-1.0]))
@example(xy=([1.0], [0.0]))
@example(xy=([1.0], [-0.0]))
@example(xy=([-1.0], [TINY]))
@example(xy=([1.0], [-TINY]))
@example(xy=([f32(1e30)], [TINY]))
@example(xy=([-0.0], [-MAX]))
def test_xlogy_exact(xy):
    # |x| <= 1e30: x * log(y) cannot overflow (|log y| < 104 in float32).
    x, y = xy
    check("xlogy", torch.xlogy, [x, y])
    check("xlogy", lambda a, b: torch.special.xlogy(a, b), [x, y])


@FEW
@given(ys=vec(f32s()), x=st.sampled_from([0.0, 1.0, -2.5]))
@example(ys=[0.0, -0.0, -1.0, TINY], x=0.0)
def test_xlogy_with_a_scalar_x(ys, x):
    check("xlogy", lambda a, b: torch.xlogy(a, b), [x, ys])


# ---- pow -----------------------------------------------------------------------------------

# |base| in [1e-3, 1e3] or zero and |exponent| <= 3: pow cannot overflow or underflow to a
# hazard the catalogue does not name (0 ** -e and (-b) ** fractional are what it names).
BASES = st.one_of(st.sampled_from([0.0, -0.0, 1.0, -1.0]), f32s(1e-3, 1e3), f32s(-1e3, -1e-3))


@SETTINGS
@pytest.mark.parametrize("e", [2, 3, -1, -2, 0, 1, 2.0, -2.0, 0.5, 1.5, -0.5, -1.5, 1 / 3, -2.75])
@given(xs=vec(BASES))
@edges(0.0, -0.0, 1.0, -1.0, -8.0, 1e-3, -1e-3)
def test_pow_tensor_scalar(e, xs):
    check("pow", lambda b, ee: torch.pow(b, ee), [xs, e])


@SETTINGS
@given(be=pairs(BASES, st.one_of(st.integers(-3, 3).map(float), f32s(-3.0, 3.0))))
@example(be=([0.0], [-1.0]))
@example(be=([-0.0], [-1.0]))
@example(be=([0.0], [-0.5]))
@example(be=([-0.0], [-0.5]))
@example(be=([-0.0], [0.5]))
@example(be=([0.0], [0.0]))
@example(be=([0.0], [-0.0]))
@example(be=([-2.0], [0.5]))
@example(be=([-2.0], [-3.0]))
@example(be=([-2.0], [2.0]))
def test_pow_tensor_tensor(be):
    b, e = be
    check("pow", torch.pow, [b, e])


@SETTINGS
@pytest.mark.parametrize("base", [2.0, 0.5, 0.0, -2.0, -0.5, 1.0, -1.0])
@given(es=vec(st.one_of(st.integers(-8, 8).map(float), f32s(-8.0, 8.0))))
@edges(0.0, -0.0, -1.0, 1.0, 0.5, -0.5, 3.0, -2.5, key="es")
def test_pow_scalar_base(base, es):
    check("pow", lambda b, e: torch.pow(b, e), [base, es])


# ---- mvlgamma: a declared domain wider than the hazard ---------------------------------------

@FEW
@pytest.mark.parametrize("p", [1, 2, 3, 5])
@given(xs=vec(f32s(0.0, 1e30)))
@edges(0.0, 0.5, 1.0, 1.5, 2.0, up(2.0), f32(1e30))
def test_mvlgamma_exact_above_its_declared_end(p, xs):
    # The catalogue declares x > (p - 1) / 2 (as PyTorch's OpInfo and torch's own old check
    # did), but torch 2.x is non-finite only at the poles, the points where some x - i / 2
    # (i < p) is a non-positive integer; the largest pole is (p - 1) / 2 itself. So the row is
    # exact only from (p - 1) / 2 up (and below 1e30, where lgamma overflows).
    xs = [x for x in xs if x >= (p - 1) / 2] or [(p - 1) / 2]
    check("mvlgamma", lambda x, q: torch.mvlgamma(x, q), [xs, p])


@FEW
@pytest.mark.parametrize("p", [1, 2, 3, 5])
@given(xs=vec(f32s(-1e4, 1e30)))
@edges(0.25, -0.5, 0.0, 1.0, -1e4)
def test_mvlgamma_is_conservative(p, xs):
    # Below (p - 1) / 2 the margin is <= 0 but the output is finite off the poles: only
    # "non-finite => margin <= 0" holds there.
    check("mvlgamma", lambda x, q: torch.mvlgamma(x, q), [xs, p], mode=NONFINITE_ONLY)


# ---- float64 -------------------------------------------------------------------------------

UNARY64 = {"log": torch.log, "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
           "exp": torch.exp, "expm1": torch.expm1, "acos": torch.acos, "asin": torch.asin,
           "atanh": torch.atanh, "acosh": torch.acosh, "erfinv": torch.erfinv, "logit": torch.logit,
           "ndtri": torch.special.ndtri}


@FEW
@pytest.mark.parametrize("name", sorted(UNARY64))
@given(xs=vec(f64s()))
@edges(0.0, -0.0, TINY64, -TINY64, 1.0, -1.0, up(1.0, F64), down(1.0, F64), up(-1.0, F64),
       down(-1.0, F64), -1.0, EXP_LAST64, up(EXP_LAST64, F64), MAX64, -MAX64)
def test_float64_exact(name, xs):
    check(name, UNARY64[name], [xs], dtype=F64)


@FEW
@given(ab=pairs(f64s(-1.0, 1.0), f64s().filter(lambda b: b == 0 or abs(b) >= 2.3e-308)))
@example(ab=([1.0], [0.0]))
@example(ab=([0.0], [-0.0]))
@example(ab=([1.0], [2.3e-308]))
def test_float64_div_exact(ab):
    check("div", torch.div, list(ab), dtype=F64)


@FEW
@given(be=pairs(BASES, st.one_of(st.integers(-3, 3).map(float), f64s(-3.0, 3.0))))
@example(be=([0.0], [-1.0]))
@example(be=([-0.0], [0.5]))
@example(be=([-2.0], [0.5]))
def test_float64_pow(be):
    check("pow", torch.pow, list(be), dtype=F64)


def test_float64_limits():
    assert math.isfinite(float(torch.exp(torch.tensor(EXP_LAST64, dtype=F64))))
    assert math.isinf(float(torch.exp(torch.tensor(up(EXP_LAST64, F64), dtype=F64))))
    assert dtype_limit("exp_max", F64) == EXP_LAST64


# ---- (b) a step against the margin's gradient reduces it --------------------------------------

def _vec64(lo, hi):
    return vec(f64s(lo, hi), 4)


GRAD_CASES = {
    # name: (catalogue row, strategy of the argument list)
    "log": ("log", _vec64(-10, 10).map(lambda x: [x])),
    "log2": ("log2", _vec64(-10, 10).map(lambda x: [x])),
    "log10": ("log10", _vec64(-10, 10).map(lambda x: [x])),
    "log1p": ("log1p", _vec64(-10, 10).map(lambda x: [x])),
    "xlogy": ("xlogy", pairs(f64s(-5, 5), f64s(-10, 10), 4).map(list)),
    "div": ("div", pairs(f64s(-5, 5), f64s(-10, 10), 4).map(list)),
    "reciprocal": ("reciprocal", _vec64(-10, 10).map(lambda x: [x])),
    "remainder": ("remainder", pairs(f64s(-5, 5), f64s(-10, 10), 4).map(list)),
    "sqrt": ("sqrt", _vec64(-10, 10).map(lambda x: [x])),
    "rsqrt": ("rsqrt", _vec64(-10, 10).map(lambda x: [x])),
    "exp": ("exp", _vec64(-1000, 1000).map(lambda x: [x])),
    "expm1": ("expm1", _vec64(-1000, 1000).map(lambda x: [x])),
    "pow.Tensor_Scalar": ("pow", st.tuples(_vec64(-10, 10), st.sampled_from([-2, -1.5, -0.5, 0.5, 2.5]))
                          .map(list)),
    "pow.Tensor_Tensor": ("pow", pairs(f64s(-10, 10), st.sampled_from([-2.0, -0.5, 0.5, 1.5, 3.0]), 4)
                          .map(list)),
    "pow.Scalar": ("pow", st.tuples(st.sampled_from([0.0, -2.0]), _vec64(-5, 5)).map(list)),
    "acos": ("acos", _vec64(-3, 3).map(lambda x: [x])),
    "asin": ("asin", _vec64(-3, 3).map(lambda x: [x])),
    "atanh": ("atanh", _vec64(-3, 3).map(lambda x: [x])),
    "acosh": ("acosh", _vec64(-3, 3).map(lambda x: [x])),
    "lgamma": ("lgamma", _vec64(-10, 10).map(lambda x: [x])),
    "digamma": ("digamma", _vec64(-10, 10).map(lambda x: [x])),
    "erfinv": ("erfinv", _vec64(-3, 3).map(lambda x: [x])),
    "logit": ("logit", _vec64(-3, 3).map(lambda x: [x])),
    "ndtri": ("ndtri", _vec64(-3, 3).map(lambda x: [x])),
    "mvlgamma": ("mvlgamma", st.tuples(_vec64(-5, 10), st.sampled_from([1, 2, 3, 5])).map(list)),
}


def _margin_min(name, args):
    m = DEFAULT_CATALOGUE[name].margins(args, XP)
    return None if m is None else m.min()


@settings(max_examples=15, deadline=None, derandomize=True)
@pytest.mark.parametrize("case", sorted(GRAD_CASES))
@given(data=st.data())
def test_step_against_the_gradient_reduces_the_margin(case, data):
    name, strategy = GRAD_CASES[case]
    raw = data.draw(strategy)
    args = [torch.tensor(a, dtype=F64, requires_grad=True) if isinstance(a, list) else a for a in raw]
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    hard = _margin_min(name, args)
    assume(hard is not None and hard.requires_grad)
    grads = torch.autograd.grad(hard, leaves, allow_unused=True)
    g2 = sum(float((g * g).sum()) for g in grads if g is not None)
    assume(g2 > 0)
    before = float(hard.detach())
    if case == "pow.Scalar":
        # A negative base: the margin -|e - round(e)| is at its minimum on the half-integers.
        assume(before > -0.5 + 1e-9)
    eta = 0.25 * (abs(before) or 1e-6) / g2

    def step(a, g, k):
        if k == 5:   # the smallest step there is: one float toward -grad
            moved = torch.nextafter(a.detach(), torch.where(g > 0, -math.inf, math.inf).to(a.dtype))
            return torch.where(g == 0, a.detach(), moved)
        return a.detach() - eta * 1e-3 ** k * g

    for k in range(6):   # shrink the step if a kink of the margin is within reach
        it = iter(grads)
        stepped = []
        for a in args:
            g = next(it) if isinstance(a, torch.Tensor) else None
            stepped.append(a if g is None else step(a, g, k) if bool((g != 0).any()) else a.detach())
        after = float(_margin_min(name, stepped))
        if after < before:
            return
    pytest.fail(f"{case}{raw}: margin {before} did not fall along -grad (last {after})")


EXACTNESS_TESTED = {"log", "log2", "log10", "log1p", "xlogy", "div", "reciprocal", "remainder", "sqrt", "rsqrt",
                    "exp", "expm1", "pow", "acos", "asin", "atanh", "acosh", "lgamma", "digamma", "erfinv",
                    "logit", "ndtri", "mvlgamma"}


def test_every_searched_row_has_property_tests():
    # output rows (half_overflow) are judged on an op's half output: tests/test_precision.py
    searched = {s.name for s in DEFAULT_CATALOGUE if s.searched and s.phase == "forward" and not s.on_output}
    assert searched <= EXACTNESS_TESTED, f"rows without an exactness test: {searched - EXACTNESS_TESTED}"
    assert searched <= {row for row, _ in GRAD_CASES.values()}


# ---- (c) in-place and out= overloads are keyed -----------------------------------------------

class _Packets(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.packets: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.packets.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _p():
    return torch.rand(4) * 0.5 + 0.25   # in (0.25, 0.75): inside every domain


def _o():
    return torch.empty(4)


KEYED_CALLS = {
    "log_": ("log", lambda: torch.log_(_p())),
    "x.log_": ("log", lambda: _p().log_()),
    "log.out": ("log", lambda: torch.log(_p(), out=_o())),
    "log2_": ("log2", lambda: _p().log2_()),
    "log2.out": ("log2", lambda: torch.log2(_p(), out=_o())),
    "log10_": ("log10", lambda: _p().log10_()),
    "log10.out": ("log10", lambda: torch.log10(_p(), out=_o())),
    "log1p_": ("log1p", lambda: _p().log1p_()),
    "log1p.out": ("log1p", lambda: torch.log1p(_p(), out=_o())),
    "xlogy_": ("xlogy", lambda: _p().xlogy_(_p())),
    "xlogy.out": ("xlogy", lambda: torch.xlogy(_p(), _p(), out=_o())),
    "special.xlogy.out": ("xlogy", lambda: torch.special.xlogy(_p(), _p(), out=_o())),
    "x.div_": ("div", lambda: _p().div_(_p())),
    "x /= y": ("div", lambda: _p().__itruediv__(_p())),
    "div.out": ("div", lambda: torch.div(_p(), _p(), out=_o())),
    "div_ rounding": ("div", lambda: _p().div_(_p(), rounding_mode="floor")),
    "x //= y": ("div", lambda: _p().__ifloordiv__(_p())),
    "floor_divide.out": ("div", lambda: torch.floor_divide(_p(), _p(), out=_o())),
    "true_divide_": ("div", lambda: _p().true_divide_(_p())),
    "reciprocal_": ("reciprocal", lambda: _p().reciprocal_()),
    "reciprocal.out": ("reciprocal", lambda: torch.reciprocal(_p(), out=_o())),
    "remainder_": ("remainder", lambda: _p().remainder_(_p())),
    "x %= y": ("remainder", lambda: _p().__imod__(_p())),
    "remainder.out": ("remainder", lambda: torch.remainder(_p(), _p(), out=_o())),
    "fmod_": ("remainder", lambda: _p().fmod_(_p())),
    "fmod.out": ("remainder", lambda: torch.fmod(_p(), _p(), out=_o())),
    "sqrt_": ("sqrt", lambda: torch.sqrt_(_p())),
    "sqrt.out": ("sqrt", lambda: torch.sqrt(_p(), out=_o())),
    "rsqrt_": ("rsqrt", lambda: _p().rsqrt_()),
    "rsqrt.out": ("rsqrt", lambda: torch.rsqrt(_p(), out=_o())),
    "exp_": ("exp", lambda: torch.exp_(_p())),
    "exp.out": ("exp", lambda: torch.exp(_p(), out=_o())),
    "expm1_": ("expm1", lambda: _p().expm1_()),
    "expm1.out": ("expm1", lambda: torch.expm1(_p(), out=_o())),
    "pow_": ("pow", lambda: _p().pow_(0.5)),
    "x **= t": ("pow", lambda: _p().__ipow__(_p())),
    "pow.out": ("pow", lambda: torch.pow(_p(), 2.5, out=_o())),
    "pow.Scalar_out": ("pow", lambda: torch.pow(2.0, _p(), out=_o())),
    "float_power_": ("pow", lambda: _p().double().float_power_(0.5)),
    "acos_": ("acos", lambda: _p().acos_()),
    "acos.out": ("acos", lambda: torch.acos(_p(), out=_o())),
    "arccos_": ("acos", lambda: _p().arccos_()),
    "asin_": ("asin", lambda: _p().asin_()),
    "asin.out": ("asin", lambda: torch.asin(_p(), out=_o())),
    "atanh_": ("atanh", lambda: _p().atanh_()),
    "atanh.out": ("atanh", lambda: torch.atanh(_p(), out=_o())),
    "acosh_": ("acosh", lambda: (_p() + 1).acosh_()),
    "acosh.out": ("acosh", lambda: torch.acosh(_p() + 1, out=_o())),
    "lgamma_": ("lgamma", lambda: _p().lgamma_()),
    "lgamma.out": ("lgamma", lambda: torch.lgamma(_p(), out=_o())),
    "digamma_": ("digamma", lambda: _p().digamma_()),
    "digamma.out": ("digamma", lambda: torch.digamma(_p(), out=_o())),
    "erfinv_": ("erfinv", lambda: _p().erfinv_()),
    "erfinv.out": ("erfinv", lambda: torch.erfinv(_p(), out=_o())),
    "logit_": ("logit", lambda: _p().logit_()),
    "logit.out": ("logit", lambda: torch.logit(_p(), out=_o())),
    "ndtri.out": ("ndtri", lambda: torch.special.ndtri(_p(), out=_o())),
    "mvlgamma_": ("mvlgamma", lambda: (_p() + 3).mvlgamma_(2)),
    "mvlgamma.out": ("mvlgamma", lambda: torch.mvlgamma(_p() + 3, 2, out=_o())),
}


@pytest.mark.parametrize("call", sorted(KEYED_CALLS))
def test_inplace_and_out_overloads_are_keyed(call):
    expected, fn = KEYED_CALLS[call]
    mode = _Packets()
    with mode:
        fn()
    names = {DEFAULT_CATALOGUE.for_torch(p).name for p in mode.packets if DEFAULT_CATALOGUE.for_torch(p)}
    assert expected in names, f"{call}: dispatched {mode.packets}, none keyed to {expected!r}"


def test_every_inplace_variant_of_a_catalogued_op_is_keyed():
    missing = []
    backward = DEFAULT_CATALOGUE.torch_backward_specs()
    for spec in DEFAULT_CATALOGUE:
        for name in spec.torch:
            if "::" in name or name.endswith("_"):
                continue
            assert hasattr(torch.ops.aten, name), f"{spec.name}: no aten op {name!r}"
            keyed = (backward.get(name + "_") if spec.phase == "backward" else DEFAULT_CATALOGUE.for_torch_output(
                name + "_") if spec.on_output else DEFAULT_CATALOGUE.for_torch(name + "_"))
            if hasattr(torch.ops.aten, name + "_") and keyed is not spec:
                missing.append(name + "_")
    assert not missing


# ---- (d) register_op ---------------------------------------------------------------------------

@pytest.fixture
def private_catalogue(monkeypatch):
    """register_op writes to a copy of the default catalogue for the length of a test."""
    copy = DEFAULT_CATALOGUE.copy()
    monkeypatch.setattr(catalogue_module, "DEFAULT_CATALOGUE", copy)
    return copy


def _user_spec(**kw):
    base = dict(name="my_log", hazard="my_log of x <= 0", torch=("cdftest::my_log",), domain=POSITIVE)
    base.update(kw)
    return OpSpec(**base)


def test_register_op_adds_a_user_op(private_catalogue):
    spec = register_op(_user_spec())
    assert private_catalogue["my_log"] is spec
    assert private_catalogue.for_torch("cdftest::my_log") is spec
    assert spec in searched_specs()
    assert "my_log" not in [s.name for s in DEFAULT_CATALOGUE]   # the real default is untouched here
    m = spec.margins([torch.tensor([2.0, 0.0, -1.0])], XP)
    assert m.tolist() == [2.0, 0.0, -1.0]


def test_register_op_refuses_duplicates(private_catalogue):
    register_op(_user_spec())
    before = len(private_catalogue)
    with pytest.raises(ValueError, match="already registered"):
        register_op(_user_spec())                                      # the same name
    with pytest.raises(ValueError, match="already registered"):
        register_op(_user_spec(name="other", torch=("cdftest::my_log",)))   # the same torch op
    with pytest.raises(ValueError, match="already registered"):
        register_op(_user_spec(name="my_log2", torch=("log",)))          # a built-in torch op
    with pytest.raises(ValueError, match="already registered"):
        register_op(_user_spec(name="my_log3", torch=(), tf=("Log",)))   # a built-in TF op
    assert len(private_catalogue) == before
    assert private_catalogue.for_torch("log").name == "log"               # a refusal changes nothing
    replaced = register_op(_user_spec(hazard="replaced"), replace=True)
    assert private_catalogue["my_log"] is replaced


def test_register_op_twice_within_one_spec_is_refused():
    with pytest.raises(ValueError):
        Catalogue([_user_spec(torch=("cdftest::a", "cdftest::a"))])


def test_catalogue_keys_accept_the_aten_namespace():
    assert DEFAULT_CATALOGUE.for_torch("aten::log") is DEFAULT_CATALOGUE["log"]
    assert DEFAULT_CATALOGUE.for_torch("aten.log") is DEFAULT_CATALOGUE["log"]


# ---- (e) PyTorch's OpInfo database -------------------------------------------------------------

def _op_db():
    try:
        from torch.testing._internal.common_methods_invocations import op_db
        from torch.testing._internal.opinfo.core import UnaryUfuncInfo
    except Exception as exc:   # expecttest missing, or a torch without the internal test suite
        pytest.skip(f"torch's OpInfo database cannot be imported: {type(exc).__name__}: {exc}")
    return [o for o in op_db if isinstance(o, UnaryUfuncInfo) and tuple(o.domain) != (None, None)]


def _margin_at(spec: OpSpec, x: float, extra: tuple) -> float:
    m = spec.margins([torch.tensor([x], dtype=F64), *extra], XP)
    assert m is not None, f"{spec.name}: no margin at {x}"
    return float(m.min())


def _assert_end(spec: OpSpec, end: float, side: str, extra: tuple) -> None:
    """Our declared domain ends at ``end`` (strict or closed): invalid beyond, valid inside."""
    inside, outside = (up(end, F64), down(end, F64)) if side == "lo" else (down(end, F64), up(end, F64))
    at = _margin_at(spec, end, extra)
    assert abs(at) <= TINY64 * 2 or abs(at) <= abs(end - inside) * 2, f"{spec.name}: margin {at} at its {side} end {end}"
    assert _margin_at(spec, inside, extra) > 0, f"{spec.name}: {inside} is outside our domain"
    assert _margin_at(spec, outside, extra) <= 0, f"{spec.name}: {outside} is inside our domain"
    far = end - 1.0 if side == "lo" else end + 1.0
    assert _margin_at(spec, far, extra) <= 0, f"{spec.name}: {far} is inside our domain"


def test_declared_domains_match_opinfo():
    infos = _op_db()
    assert infos, "no OpInfo declares a domain"
    seen = set()
    for info in infos:
        packet = info.aten_name or info.name.replace(".", "_")
        spec = DEFAULT_CATALOGUE.for_torch(packet)
        assert spec is not None and spec.searched, f"OpInfo {info.name} (aten {packet}) is not catalogued"
        lo, hi = info.domain
        extra: tuple = ()
        if spec.name == "mvlgamma":
            # OpInfo writes one mvlgamma entry per p (its sample_kwargs) and declares its domain
            # one above the accepted lower bound (p - 1) / 2 (which its sample_inputs_mvlgamma
            # computes and samples from): compare with (p - 1) / 2.
            p = info.sample_kwargs("cpu", F64, None)[0]["p"]
            assert lo == (p + 1) / 2, f"OpInfo changed how it writes mvlgamma's domain: {info.domain}"
            lo, extra = (p - 1) / 2, (p,)
        # OpInfo writes a domain as (low, high) with None for an unbounded end and does not mark
        # ends closed or strict (it samples inside, domain_eps away from both): compare the ends.
        if lo is not None:
            _assert_end(spec, float(lo), "lo", extra)
        else:
            assert _margin_at(spec, -1e6, extra) > 0, f"{spec.name}: OpInfo says unbounded below"
        if hi is not None:
            _assert_end(spec, float(hi), "hi", extra)
        else:
            assert _margin_at(spec, 1e6, extra) > 0, f"{spec.name}: OpInfo says unbounded above"
        seen.add(spec.name)
    assert {"acos", "acosh", "asin", "atanh", "log", "log1p", "log2", "log10", "mvlgamma", "rsqrt", "sqrt",
            "erfinv", "logit", "ndtri"} <= seen


def test_opinfo_samples_are_inside_our_domains():
    # Every sample input OpInfo draws for these ops (its valid inputs) has a positive margin.
    infos = _op_db()
    for info in infos:
        spec = DEFAULT_CATALOGUE.for_torch(info.aten_name or info.name.replace(".", "_"))
        for sample in info.sample_inputs("cpu", F64):
            x = sample.input
            if not isinstance(x, torch.Tensor) or x.numel() == 0:
                continue
            m = spec.margins([x, *sample.args], XP)
            if m is not None:
                assert float(m.min()) > 0, f"{info.name}{sample.args}: OpInfo sample {x.min()} outside our domain"


def test_opinfo_aliases_are_keyed():
    for info in _op_db():
        spec = DEFAULT_CATALOGUE.for_torch(info.aten_name or info.name.replace(".", "_"))
        for alias in getattr(info, "aliases", ()):
            name = alias.name.replace(".", "_")
            if hasattr(torch.ops.aten, name):
                assert DEFAULT_CATALOGUE.for_torch(name) is spec, f"alias {alias.name} of {info.name}"
