"""The op catalogue: which ops are suspect, how they fail, and their margins.

Each :class:`OpSpec` names one family of ops for every framework (aten overload
packets for PyTorch, op types for TensorFlow), the hazard, the valid domain of
the input it applies to and, where a domain alone cannot say it (``pow``,
``xlogy``, poles of ``lgamma``), a margin function of all the op's inputs.

Users extend the catalogue with :func:`register_op`::

    from fuzz_core.catalogue import OpSpec, register_op
    from fuzz_core.domains import Domain, Interval

    register_op(OpSpec(name="my_log", hazard="log of x <= 0",
                       torch=("mylib::my_log",), domain=Domain.of(Interval(0.0))))

Registering a name or a framework op twice is an error (``replace=True`` to override).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from fuzz_core.domains import (
    INF, NON_NEGATIVE, NON_ZERO, POSITIVE, PROBABILITY_OPEN, UNIT_CLOSED, UNIT_OPEN,
    ArrayNamespace, Domain, Interval,
)

MarginFn = Callable[[Sequence[Any], ArrayNamespace], Any]


@dataclass(frozen=True)
class OpSpec:
    """One catalogue row.

    name:      framework-neutral kind ("log", "div", ...).
    hazard:    how the op fails, in words.
    torch:     aten overload packet names (``log`` covers ``torch.log`` and
               ``Tensor.log``; in-place ``log_`` and ``out=`` overloads are listed too).
    tf:        TensorFlow op types.
    domain:    valid domain of input ``arg``; the default margin uses it.
    margin:    ``margin(inputs, xp)`` for domains that depend on several inputs;
               returns an elementwise margin or ``None`` (no hazard in this call).
    log_space: measure the margin in log space (quantities that approach their
               boundary multiplicatively: probabilities, variances, sums of exps).
    searched:  False for fused, stable-by-construction ops: recorded so a
               finding can name them, never searched.
    point:     invalid only at isolated points (a zero divisor, a pole): crossing
               the boundary does not trigger, the search must land on it.
    phase:     ``forward`` (the op's output goes non-finite) or ``backward`` (its output is
               finite, its gradient is not: ``sqrt`` at 0, ``acos`` at 1); a backward row
               shares its framework ops with a forward row and is searched only in programs
               that train, triggered when the program's own backward first goes non-finite
               at the node this op created.
    on_output: the margin is of the op's OUTPUT (``inputs`` of the margin is ``[output]``), and the
               row is recorded only where that output is float16 or bfloat16: the half-precision
               range (``half_overflow``). Such a row shares its framework ops with other rows
               (``exp`` is also the ``exp`` row), like a backward row; an op that autocast keeps in
               float32 is judged by the float32 rows alone.
    """

    name: str
    hazard: str
    torch: tuple[str, ...] = ()
    tf: tuple[str, ...] = ()
    domain: Domain | None = None
    arg: int = 0
    margin: MarginFn | None = None
    log_space: bool = False
    searched: bool = True
    point: bool = False
    phase: str = "forward"
    on_output: bool = False
    notes: str = field(default="", compare=False)

    def margins(self, inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
        """Elementwise margin of this call, or None when it has no hazard."""
        if self.margin is not None:
            return self.margin(inputs, xp)
        if self.domain is None or self.arg >= len(inputs):
            return None
        x = inputs[self.arg]
        if not xp.is_tensor(x):
            return None
        return self.domain.margin(xp.as_float(x, x), xp)


class Catalogue:
    """A registry of op specs, indexed by name and by framework op."""

    def __init__(self, specs: Iterable[OpSpec] = ()) -> None:
        self._by_name: dict[str, OpSpec] = {}
        self._torch: dict[str, OpSpec] = {}
        self._tf: dict[str, OpSpec] = {}
        self._torch_backward: dict[str, OpSpec] = {}
        self._tf_backward: dict[str, OpSpec] = {}
        self._torch_output: dict[str, OpSpec] = {}    # packet -> its output-range row (half_overflow)
        self._tf_output: dict[str, OpSpec] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: OpSpec, *, replace: bool = False) -> OpSpec:
        """Add ``spec``; a name or framework op that is already registered is an error.

        With ``replace=True`` the spec takes over its name and ops; the ops of a spec it
        replaces by name that the new one does not list are dropped with it.
        """
        torch_keys = [torch_key(k) for k in spec.torch]
        for keys, kind in ((torch_keys, "torch"), (list(spec.tf), "tf")):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            if dup:
                raise ValueError(f"{spec.name!r} lists the {kind} op {dup[0]!r} twice")
        if spec.phase not in ("forward", "backward"):
            raise ValueError(f"{spec.name!r}: phase must be 'forward' or 'backward', got {spec.phase!r}")
        if spec.phase == "backward":
            return self._register_backward(spec, torch_keys, replace)
        if spec.on_output:
            return self._register_side(spec, torch_keys, replace, self._torch_output, self._tf_output, "output")
        if not replace:
            if spec.name in self._by_name:
                raise ValueError(f"op {spec.name!r} is already registered")
            for key in torch_keys:
                if key in self._torch:
                    raise ValueError(f"torch op {key!r} is already registered by {self._torch[key].name!r}")
            for key in spec.tf:
                if key in self._tf:
                    raise ValueError(f"tf op {key!r} is already registered by {self._tf[key].name!r}")
        old = self._by_name.get(spec.name)
        if old is not None:
            for key in old.torch:
                if self._torch.get(torch_key(key)) is old:
                    del self._torch[torch_key(key)]
            for key in old.tf:
                if self._tf.get(key) is old:
                    del self._tf[key]
        self._by_name[spec.name] = spec
        self._torch.update({key: spec for key in torch_keys})
        self._tf.update({key: spec for key in spec.tf})
        return spec

    def _register_backward(self, spec: OpSpec, torch_keys: list[str], replace: bool) -> OpSpec:
        return self._register_side(spec, torch_keys, replace, self._torch_backward, self._tf_backward, "backward")

    def _register_side(self, spec: OpSpec, torch_keys: list[str], replace: bool, torch_table: dict,
                       tf_table: dict, what: str) -> OpSpec:
        """A row that shares its framework ops with the forward rows: a table of its own."""
        if not replace:
            if spec.name in self._by_name:
                raise ValueError(f"op {spec.name!r} is already registered")
            for keys, table, kind in ((torch_keys, torch_table, "torch"), (spec.tf, tf_table, "tf")):
                for key in keys:
                    if key in table:
                        raise ValueError(f"the {what} hazard of {kind} op {key!r} is already registered "
                                         f"by {table[key].name!r}")
        old = self._by_name.get(spec.name)
        if old is not None:
            for key in old.torch:
                if torch_table.get(torch_key(key)) is old:
                    del torch_table[torch_key(key)]
            for key in old.tf:
                if tf_table.get(key) is old:
                    del tf_table[key]
        self._by_name[spec.name] = spec
        torch_table.update({key: spec for key in torch_keys})
        tf_table.update({key: spec for key in spec.tf})
        return spec

    def torch_output_specs(self) -> dict[str, OpSpec]:
        """Packet -> the output-range row of that torch op (``addmm`` -> ``half_overflow``)."""
        return dict(self._torch_output)

    def for_torch_output(self, packet: str) -> OpSpec | None:
        return self._torch_output.get(torch_key(packet))

    def for_tf_output(self, op_type: str) -> OpSpec | None:
        """The output-range row of a TensorFlow op type (``MatMul`` -> ``half_overflow``)."""
        return self._tf_output.get(op_type)

    def torch_backward_specs(self) -> dict[str, OpSpec]:
        """Packet -> the backward-hazard row of that torch op (``sqrt`` -> ``sqrt_grad``)."""
        return dict(self._torch_backward)

    def for_tf_backward(self, op_type: str) -> OpSpec | None:
        """The backward-hazard row of a TensorFlow op type (``Sqrt`` -> ``sqrt_grad``)."""
        return self._tf_backward.get(op_type)

    def __iter__(self):
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def __getitem__(self, name: str) -> OpSpec:
        return self._by_name[name]

    def for_torch(self, packet: str) -> OpSpec | None:
        """The spec of an aten overload packet (``"log"``, ``"aten::log"``) or a custom op
        (``"mylib::my_log"``)."""
        return self._torch.get(torch_key(packet))

    def torch_names(self) -> list[str]:
        """Every torch op keyed (aten ops by their bare packet name)."""
        return list(self._torch)

    def for_tf(self, op_type: str) -> OpSpec | None:
        return self._tf.get(op_type)

    def copy(self) -> "Catalogue":
        return Catalogue(self._by_name.values())


def torch_key(name: str) -> str:
    """How the catalogue keys a torch op: aten packets bare (``log``), others ``ns::name``."""
    for prefix in ("aten::", "aten."):
        if name.startswith(prefix):
            return name[len(prefix):]
    if "::" not in name and "." in name:
        ns, _, rest = name.partition(".")
        return f"{ns}::{rest}"
    return name


# ---- margins that need more than one input -----------------------------------

def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def pow_margin(inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
    """pow(base, e): NaN for base < 0 with a fractional e; inf for base = 0 with e < 0."""
    base, e = inputs[0], inputs[1]
    if _is_num(base):                       # pow.Scalar: a constant base, a tensor exponent
        e = xp.as_float(e, e)
        if base > 0:
            return None
        if base == 0:
            return e - xp.next_down(0.0, e)   # e >= 0 is valid
        frac = xp.abs(e - xp.round(e))
        return xp.where(frac == 0, xp.full_like(e, 1.0), -frac)
    base = xp.as_float(base, base)
    if _is_num(e):
        if float(e) == int(e):
            return xp.abs(base) if e < 0 else None
        return base if e < 0 else base - xp.next_down(0.0, base)
    e = xp.as_float(e, base)
    integer = e == xp.round(e)
    negative = e < 0
    fractional = xp.where(negative, base, base - xp.next_down(0.0, base))
    whole = xp.where(negative, xp.abs(base), xp.full_like(base, xp.big(base)))
    return xp.where(integer, whole, fractional)


def xlogy_margin(inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
    """xlogy(x, y) = x * log(y), defined as 0 where x == 0."""
    x, y = inputs[0], inputs[1]
    if _is_num(y) or not xp.is_tensor(y):
        return None
    y = xp.as_float(y, y)
    if _is_num(x):
        return None if x == 0 else y
    return xp.where(x == 0, xp.full_like(y, xp.big(y)), y)


def _distance_to_pole(x: Any, xp: ArrayNamespace) -> Any:
    return xp.where(x > 0, x, xp.abs(x - xp.round(x)))


def lgamma_margin(inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
    """lgamma: poles at the non-positive integers (every float32 below -2**23 is one).

    lgamma(x) ~ x log x also overflows for huge x (above about 4e36 in float32): not named
    here, judged from the output.
    """
    x = xp.as_float(inputs[0], inputs[0])
    return _distance_to_pole(x, xp)


def digamma_margin(inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
    """digamma: poles at the non-positive integers; ``-1/x`` overflows within 1/max of 0."""
    x = xp.as_float(inputs[0], inputs[0])
    return _distance_to_pole(x, xp) - xp.limit("digamma_radius", x)


def mvlgamma_margin(inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
    """mvlgamma(x, p): declared domain x > (p - 1) / 2 (as PyTorch's OpInfo samples it).

    Conservative: torch 2.x no longer raises below (p - 1) / 2 and is non-finite only at
    the poles (some x - i / 2, i < p, a non-positive integer), the largest of which is
    (p - 1) / 2 itself. A search that crosses the end lands where the op may be finite;
    the real output judges the trigger.
    """
    x = xp.as_float(inputs[0], inputs[0])
    p = inputs[1] if len(inputs) > 1 and _is_num(inputs[1]) else 1
    return x - (p - 1) / 2.0


def remainder_margin(inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
    divisor = inputs[1] if len(inputs) > 1 else None
    if divisor is None or not xp.is_tensor(divisor):
        return None
    return xp.abs(xp.as_float(divisor, divisor))


def _spec_rows() -> list[OpSpec]:
    log_domain = POSITIVE
    return [
        OpSpec("log", "log of x <= 0 (-inf at 0, NaN below)", torch=("log", "log_"), tf=("Log",),
               domain=log_domain, log_space=True),
        OpSpec("log2", "log2 of x <= 0", torch=("log2", "log2_"), domain=log_domain, log_space=True),
        OpSpec("log10", "log10 of x <= 0", torch=("log10", "log10_"), domain=log_domain, log_space=True),
        OpSpec("log1p", "log1p of x <= -1", torch=("log1p", "log1p_", "special_log1p"), tf=("Log1p",),
               domain=Domain.of(Interval(-1.0, INF)), log_space=True),
        OpSpec("xlogy", "xlogy(x, y) with y <= 0 and x != 0", torch=("xlogy", "xlogy_", "special_xlogy"),
               tf=("Xlogy",), margin=xlogy_margin, log_space=True),
        # div, reciprocal, remainder: the margin names a zero divisor, where the op always goes
        # non-finite; a / b also overflows for 0 < |b| < |a| / max (and the vectorised CPU
        # remainder/fmod kernels then return NaN): a trigger the real output judges.
        OpSpec("div", "division by zero", torch=("div", "div_", "floor_divide", "floor_divide_",
                                                 "true_divide", "true_divide_"),
               tf=("RealDiv", "Div", "FloorDiv", "TruncateDiv"), domain=NON_ZERO, arg=1,
               log_space=True, point=True),
        OpSpec("reciprocal", "reciprocal of 0", torch=("reciprocal", "reciprocal_"), tf=("Reciprocal", "Inv"),
               domain=NON_ZERO, log_space=True, point=True),
        OpSpec("remainder", "remainder/fmod by zero (NaN)", torch=("remainder", "remainder_", "fmod", "fmod_"),
               tf=("FloorMod", "TruncateMod", "Mod"), margin=remainder_margin, log_space=True, point=True),
        OpSpec("sqrt", "sqrt of x < 0 (NaN)", torch=("sqrt", "sqrt_"), tf=("Sqrt",), domain=NON_NEGATIVE),
        OpSpec("rsqrt", "rsqrt of x <= 0 (inf at 0, NaN below)", torch=("rsqrt", "rsqrt_"), tf=("Rsqrt",),
               domain=POSITIVE, log_space=True),
        OpSpec("exp", "exp overflow (x > ln(max finite))", torch=("exp", "exp_"), tf=("Exp",),
               domain=Domain.of(Interval(-INF, "exp_max", hi_closed=True))),
        OpSpec("expm1", "expm1 overflow", torch=("expm1", "expm1_", "special_expm1"), tf=("Expm1",),
               domain=Domain.of(Interval(-INF, "expm1_max", hi_closed=True))),
        OpSpec("pow", "pow of a negative base with a fractional exponent, or of 0 with a negative one",
               torch=("pow", "pow_", "float_power", "float_power_"), tf=("Pow",), margin=pow_margin,
               log_space=True),
        OpSpec("acos", "acos of |x| > 1 (NaN)", torch=("acos", "acos_", "arccos", "arccos_"), tf=("Acos",),
               domain=UNIT_CLOSED),
        OpSpec("asin", "asin of |x| > 1 (NaN)", torch=("asin", "asin_", "arcsin", "arcsin_"), tf=("Asin",),
               domain=UNIT_CLOSED),
        OpSpec("atanh", "atanh of |x| >= 1", torch=("atanh", "atanh_", "arctanh", "arctanh_"), tf=("Atanh",),
               domain=UNIT_OPEN),
        OpSpec("acosh", "acosh of x < 1 (NaN)", torch=("acosh", "acosh_", "arccosh", "arccosh_"), tf=("Acosh",),
               domain=Domain.of(Interval(1.0, INF, lo_closed=True))),
        OpSpec("lgamma", "lgamma at a pole (non-positive integer)", torch=("lgamma", "lgamma_"), tf=("Lgamma",),
               margin=lgamma_margin, point=True),
        OpSpec("digamma", "digamma at a pole (non-positive integer)", torch=("digamma", "digamma_",
                                                                             "special_digamma", "special_psi"),
               tf=("Digamma",), margin=digamma_margin, point=True),
        OpSpec("erfinv", "erfinv of |x| >= 1", torch=("erfinv", "erfinv_", "special_erfinv"), tf=("Erfinv",),
               domain=UNIT_OPEN),
        OpSpec("logit", "logit of x <= 0 or x >= 1", torch=("logit", "logit_", "special_logit"),
               margin=_logit_margin, log_space=True),
        OpSpec("ndtri", "ndtri of x <= 0 or x >= 1", torch=("special_ndtri",), tf=("Ndtri",),
               domain=PROBABILITY_OPEN, log_space=True),
        OpSpec("mvlgamma", "mvlgamma(x, p) with x <= (p - 1) / 2", torch=("mvlgamma", "mvlgamma_",
                                                                         "special_multigammaln"),
               margin=mvlgamma_margin),
        # Fused, stable by construction: recorded so a finding can name them, not searched.
        OpSpec("log_softmax", "stable (non-finite only from non-finite inputs)",
               torch=("_log_softmax",), tf=("LogSoftmax",), searched=False),
        OpSpec("softmax", "stable", torch=("_softmax",), tf=("Softmax",), searched=False),
        OpSpec("nll_loss", "stable", torch=("nll_loss_forward", "nll_loss2d_forward"), searched=False),
        OpSpec("cross_entropy", "stable", tf=("SoftmaxCrossEntropyWithLogits",
                                              "SparseSoftmaxCrossEntropyWithLogits"), searched=False),
        OpSpec("binary_cross_entropy", "stable (log clamped at -100)",
               torch=("binary_cross_entropy", "binary_cross_entropy_with_logits"), searched=False),
        OpSpec("layer_norm", "stable (eps)", torch=("native_layer_norm",), searched=False),
        OpSpec("softplus", "stable", torch=("softplus", "log_sigmoid_forward"), tf=("Softplus",), searched=False),
        OpSpec("logsumexp", "stable", torch=("logsumexp",), searched=False),
        OpSpec("attention", "scaled dot-product attention (the CPU kernels guard fully masked rows)",
               torch=("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
                      "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                      "_scaled_dot_product_cudnn_attention"), searched=False),
    ]


def pow_grad_margin(inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
    """pow(x, p) with a constant 0 < p < 1: the gradient p * x**(p - 1) is infinite at x = 0, and
    overflows wherever x**(p - 1) does (below ``max ** (1 / (p - 1))``: subnormal x for small p)."""
    base, e = inputs[0], inputs[1] if len(inputs) > 1 else None
    if not _is_num(e) or not 0 < float(e) < 1 or not xp.is_tensor(base):
        return None
    base = xp.as_float(base, base)
    largest = 4.0 * xp.big(base)
    return xp.abs(base) - largest ** (1.0 / (float(e) - 1.0))


def reciprocal_grad_margin(inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
    """1/x: its gradient -1/x**2 overflows for |x| at most a dtype limit (about 5.4e-20 in float32)."""
    x = inputs[0]
    if not xp.is_tensor(x):
        return None
    return xp.abs(xp.as_float(x, x)) - xp.limit("reciprocal_grad_max", x)


def _backward_rows() -> list[OpSpec]:
    """Ops whose output stays finite where their gradient does not: a program that trains
    meets them in its own backward pass (an infinite gradient, then NaN weights). PyTorch
    itself guards the norm, ``cdist``, ``pdist``, ``dist`` and ``atan2`` at 0 (their gradient
    there is 0): no rows for them."""
    return [
        OpSpec("sqrt_grad", "backward: sqrt at 0 has an infinite gradient", torch=("sqrt", "sqrt_"), tf=("Sqrt",),
               domain=POSITIVE, log_space=True, phase="backward"),
        OpSpec("rsqrt_grad", "backward: rsqrt of a tiny x has an overflowing gradient", torch=("rsqrt", "rsqrt_"),
               tf=("Rsqrt",), domain=Domain.of(Interval("rsqrt_grad_min", INF)), log_space=True, phase="backward"),
        OpSpec("log_grad", "backward: log of a subnormal x has an overflowing gradient (1/x)",
               torch=("log", "log_"), domain=Domain.of(Interval("log_grad_min", INF)), log_space=True,
               phase="backward"),
        OpSpec("pow_grad", "backward: pow(x, p) with 0 < p < 1 has an infinite gradient at x = 0",
               torch=("pow", "pow_"), tf=("Pow",), margin=pow_grad_margin, log_space=True, phase="backward"),
        OpSpec("acos_grad", "backward: acos at |x| = 1 has an infinite gradient", torch=("acos", "acos_"),
               tf=("Acos",), domain=UNIT_OPEN, log_space=True, phase="backward"),
        OpSpec("asin_grad", "backward: asin at |x| = 1 has an infinite gradient", torch=("asin", "asin_"),
               tf=("Asin",), domain=UNIT_OPEN, log_space=True, phase="backward"),
        OpSpec("acosh_grad", "backward: acosh at x = 1 has an infinite gradient", torch=("acosh", "acosh_"),
               tf=("Acosh",), domain=Domain.of(Interval(1.0, INF)), log_space=True, phase="backward"),
        OpSpec("reciprocal_grad", "backward: 1/x of a tiny x has an overflowing gradient (1/x**2)",
               torch=("reciprocal", "reciprocal_"), tf=("Reciprocal", "Inv"), margin=reciprocal_grad_margin,
               log_space=True, phase="backward"),
    ]


HALF_TINY = 1e-30    # added to |out| before its log: a zero output is far from overflowing, not -inf


def half_overflow_margin(inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
    """An op's output in float16/bfloat16 against the dtype's largest finite value (65504 in
    float16, about 3.39e38 in bfloat16): ``log(max) - log(|out|)``, elementwise, computed in
    float32. Log space: activations grow multiplicatively (a product, a sum of many terms, an
    exp), so the margin is about linear in the log of the input that scales them. <= 0 (or -inf)
    once the output overflowed. Needs ``xp.log`` and ``xp.widen`` (to float32)."""
    out = inputs[0] if inputs else None
    log, widen = getattr(xp, "log", None), getattr(xp, "widen", None)
    if out is None or not xp.is_tensor(out) or log is None or widen is None:
        return None
    limit = 4.0 * xp.big(out)          # big() is a quarter of the dtype's max
    return math.log(limit) - log(xp.abs(widen(out)) + HALF_TINY)


def _output_rows() -> list[OpSpec]:
    """Rows judged on an op's output, recorded only where it is float16 or bfloat16."""
    return [
        OpSpec("half_overflow", "half-precision overflow: |output| beyond the dtype's largest finite value "
                                "(65504 in float16, ~3.39e38 in bfloat16)",
               torch=("mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_", "matmul", "linear", "_addmm_activation",
                      "sum", "mean", "exp", "exp_", "pow", "pow_", "mul", "mul_", "add", "add_", "_softmax",
                      "convolution", "var", "var_mean"),
               tf=("MatMul", "BatchMatMulV2", "Einsum", "Sum", "Mean", "Exp", "Pow", "Square", "Mul", "AddV2",
                   "AddN", "BiasAdd", "Softmax", "Conv2D", "DepthwiseConv2dNative"),
               margin=half_overflow_margin, on_output=True),
    ]


def _logit_margin(inputs: Sequence[Any], xp: ArrayNamespace) -> Any:
    # logit(x, eps) clamps into [eps, 1 - eps]: with an eps the op has no hazard.
    if len(inputs) > 1 and inputs[1] is not None and _is_num(inputs[1]) and inputs[1] > 0:
        return None
    return PROBABILITY_OPEN.margin(xp.as_float(inputs[0], inputs[0]), xp)


DEFAULT_CATALOGUE = Catalogue(_spec_rows() + _backward_rows() + _output_rows())


def register_op(spec: OpSpec, *, replace: bool = False) -> OpSpec:
    """Add a user op to the default catalogue (see the module docstring)."""
    return DEFAULT_CATALOGUE.register(spec, replace=replace)


def searched_specs() -> list[OpSpec]:
    return [s for s in DEFAULT_CATALOGUE if s.searched and s.phase == "forward" and not s.on_output]


def log_floor(tiny: float) -> float:
    """Target of a log-space margin: a little below the log of the smallest positive float."""
    return math.log(tiny) - 3.0
