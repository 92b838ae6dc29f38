"""The PyTorch benchmark subjects of ``campaigns/targets`` keep their contract and their bugs.

Fast, and independent of the engine. For every subject: the factory builds a
``fuzz_core.Target``, ``sample`` returns a valid batch (float32, batch on dimension 0,
default size 8, ``batch=`` honoured, searched values within ``bounds``), the program
returns a finite loss on sampled batches, and the same seed gives the same initial loss.

For every buggy subject a witness batch within the bounds (the subject's own
``witness(target)``, or N training steps for the train-only subject) makes the planted op
go non-finite: the *first* op whose output is non-finite from finite inputs is the
planted one. For the clean twins, the buggy twin's witness (which drives the same
hazard: a huge logit gap, a silenced layer, a negative variance) leaves every op finite.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fuzz_core import Target
from fuzz_core.target import check_batch

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "campaigns" / "targets"

# subject -> the op (aten packet family) that must go non-finite first
BUGGY = {
    "softmax_xent_mlp": "log",
    "log_one_minus_sigmoid": "log",
    "div_sum_exp": "div",
    "exp_overflow_softmax": "exp",
    "rbm_free_energy": "exp",
    "vae_sqrt_var": "sqrt",
    "rsqrt_norm": "rsqrt",
    "pow_fractional": "pow",
    "acos_cosine": "acos",
    "arcface_acos": "acos",
    "vae_kl_log": "log",
    "gan_log_d": "log",
    "train_only_bug": ("exp", "log"),
    "nan_not_in_loss": "log",
}
# clean subject -> the buggy twin whose witness drives the same hazard (None: none)
CLEAN = {
    "softmax_xent_mlp_guarded": "softmax_xent_mlp",
    "softmax_xent_clamped": "softmax_xent_mlp",
    "log_sigmoid_guarded": "log_one_minus_sigmoid",
    "rsqrt_norm_guarded": "rsqrt_norm",
    "sqrt_var_guarded": "vae_sqrt_var",
    "masked_attention_guarded": None,
}
SUBJECTS = sorted(BUGGY) + sorted(CLEAN)
TRAIN_ONLY_STEPS = 20

# suspect ops (aten packets, in-place variants included) whose infinities count
SUSPECT = {"log", "log2", "log10", "log1p", "xlogy", "div", "reciprocal", "remainder", "fmod", "sqrt",
           "rsqrt", "exp", "expm1", "pow", "acos", "asin", "atanh", "acosh", "logit"}
UNINITIALISED = ("empty", "new_empty", "resize", "set_")   # outputs hold garbage, maybe NaN bits
FAMILY = {"log2": "log", "log10": "log", "xlogy": "log", "reciprocal": "div", "expm1": "exp"}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The subjects are tiny: one thread is faster than several fighting over a loaded machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_modules: dict[str, object] = {}
_targets: dict[str, Target] = {}


def module(name: str):
    if name not in _modules:
        spec = importlib.util.spec_from_file_location(f"subject_{name}", TARGETS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        _modules[name] = mod
    return _modules[name]


def built(name: str) -> Target:
    """One target per subject, built with seed 0 and never trained by these tests."""
    if name not in _targets:
        _targets[name] = module(name).make_target(seed=0)
    return _targets[name]


def to_torch(batch: dict) -> dict:
    return {k: torch.as_tensor(np.asarray(v)) for k, v in batch.items()}


def outputs(result) -> list[torch.Tensor]:
    """The program's loss first, then any other tensor it returned."""
    if isinstance(result, dict):
        first = result["loss"]
        rest = [v for k, v in result.items() if k != "loss"]
    elif isinstance(result, (tuple, list)):
        first, rest = result[0], list(result[1:])
    else:
        first, rest = result, []
    return [first] + [t for t in tree_leaves(rest) if isinstance(t, torch.Tensor)]


def run(target: Target, batch: dict, seed: int = 0) -> list[torch.Tensor]:
    torch.manual_seed(seed)          # randomness inside the program (dropout, reparameterisation)
    return outputs(target.program(to_torch(batch)))


class FirstNonFinite(TorchDispatchMode):
    """Names the first op that made a non-finite value by its own doing: a suspect op whose
    output is non-finite while its inputs are finite, or any op whose output has a NaN that
    its inputs did not have (an intended ``-inf`` mask made by ``full``/``triu`` is neither)."""

    def __init__(self):
        super().__init__()
        self.first: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        packet = func.overloadpacket.__name__
        if self.first is None and not func.is_view and not packet.startswith(UNINITIALISED):
            base = packet.rstrip("_")
            ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if base in SUSPECT and all(bool(torch.isfinite(t).all()) for t in ins) \
                    and not all(bool(torch.isfinite(t).all()) for t in outs):
                self.first = FAMILY.get(base, base)
            elif any(bool(torch.isnan(t).any()) for t in outs) and not any(bool(torch.isnan(t).any()) for t in ins):
                self.first = FAMILY.get(base, base)
        return out


def first_nonfinite(target: Target, batch: dict, seed: int = 0) -> tuple[str | None, list[torch.Tensor]]:
    mode = FirstNonFinite()
    with torch.no_grad(), mode:
        outs = run(target, batch, seed)
    return mode.first, outs


def finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def within_bounds(target: Target, batch: dict) -> None:
    for name in target.search:
        lo, hi = target.bounds[name]
        arr = np.asarray(batch[name])
        assert arr.dtype == np.float32, (name, arr.dtype)
        assert arr.min() >= lo and arr.max() <= hi, f"{name} outside [{lo}, {hi}]: [{arr.min()}, {arr.max()}]"


# ---- every subject -----------------------------------------------------------------------

def test_every_torch_subject_is_covered():
    files = {p.stem for p in TARGETS.glob("*.py") if not p.stem.startswith(("tf_", "_"))}
    assert files == set(SUBJECTS), f"untested: {sorted(files - set(SUBJECTS))}, missing: {sorted(set(SUBJECTS) - files)}"
    assert len(BUGGY) >= 13 and len(CLEAN) >= 5


@pytest.mark.parametrize("name", SUBJECTS)
def test_contract(name):
    target = built(name)
    assert isinstance(target, Target)
    assert target.search, "no searched input"
    assert set(target.search) <= set(target.bounds), "a searched input without bounds"
    mod = module(name)
    assert (mod.__doc__ or "").strip(), "the module docstring explains the bug"
    rng = np.random.default_rng(0)
    for _ in range(3):
        batch = target.sample(rng)
        arrays = check_batch(batch, target.search)
        assert {a.shape[0] for a in arrays.values()} == {8}, "default batch size 8"
        for key, arr in arrays.items():
            if np.issubdtype(arr.dtype, np.floating):
                assert arr.dtype == np.float32, (key, arr.dtype)
        within_bounds(target, arrays)
        outs = run(target, arrays)
        assert outs[0].ndim == 0 and outs[0].dtype == torch.float32
        assert all(finite(t) for t in outs), f"non-finite output on a sampled batch: {outs}"
    small = mod.make_target(seed=0, batch=3, pretrain_steps=0).sample(np.random.default_rng(1))
    assert {np.asarray(v).shape[0] for v in small.values()} == {3}, "batch= is honoured"


@pytest.mark.parametrize("name", SUBJECTS)
def test_same_seed_same_initial_loss(name):
    batch = built(name).sample(np.random.default_rng(7))
    again = module(name).make_target(seed=0).sample(np.random.default_rng(7))
    assert batch.keys() == again.keys()
    for key in batch:
        np.testing.assert_array_equal(batch[key], again[key])
    first = run(built(name), batch, seed=3)[0].item()
    second = run(module(name).make_target(seed=0), batch, seed=3)[0].item()
    assert first == second


# ---- buggy subjects: the planted op is reachable within the bounds ---------------------

@pytest.mark.parametrize("name", sorted(set(BUGGY) - {"train_only_bug"}))
def test_witness_triggers_the_planted_op(name):
    target = built(name)
    batch = module(name).witness(target)
    check_batch(batch, target.search)
    within_bounds(target, batch)
    op, outs = first_nonfinite(target, batch)
    assert op == BUGGY[name], f"first non-finite op {op!r}, expected {BUGGY[name]!r}"
    if name == "nan_not_in_loss":
        assert finite(outs[0]), "the NaN must not reach the loss"
        assert not finite(outs[1]), "the logged entropy is NaN"
    else:
        assert not all(finite(t) for t in outs)


def test_train_only_bug_needs_training():
    mod = module("train_only_bug")
    target = mod.make_target(seed=0)                 # trained below: not the shared one
    fc2 = target.model.fc2
    # frozen weights: tanh bounds the log rate for every input, far from exp's and log's edges
    reach = (fc2.bias.abs().sum() + fc2.weight.abs().sum()).item()
    assert reach < 10.0
    batch = target.sample(np.random.default_rng(0))
    corners = {"x": np.sign(np.random.default_rng(1).standard_normal((64, 10))).astype(np.float32),
               "y": np.ones(64, dtype=np.float32)}
    for b in (batch, corners):
        op, outs = first_nonfinite(target, b)
        assert op is None and finite(outs[0])
    # the program's own SGD steps on the sampled batch take it there
    tb = to_torch(batch)
    for step in range(TRAIN_ONLY_STEPS):
        op, outs = first_nonfinite(target, batch)
        if op is not None:
            break
        target.optimizer.zero_grad()
        target.program(tb).backward()
        target.optimizer.step()
    else:
        pytest.fail(f"no non-finite op after {TRAIN_ONLY_STEPS} training steps")
    assert op in BUGGY["train_only_bug"] and step >= 1


def test_gan_trains_with_two_optimizers():
    target = module("gan_log_d").make_target(seed=0, pretrain_steps=0)
    assert target.train_step is not None and target.optimizer is None
    before = [p.detach().clone() for p in target.model.parameters()]
    target.train_step(to_torch(target.sample(np.random.default_rng(0))))
    changed = [not torch.equal(a, p) for a, p in zip(before, target.model.parameters())]
    assert all(changed), "train_step updates both the generator and the discriminator"


# ---- clean twins: the same hazard, driven as hard, stays finite ------------------------

@pytest.mark.parametrize("name", sorted(n for n, twin in CLEAN.items() if twin))
def test_guard_holds_where_the_twin_breaks(name):
    target = built(name)
    witness = module(CLEAN[name]).witness(target)    # the buggy twin's recipe, on the guarded model
    batch = target.sample(np.random.default_rng(0))  # labels in the guarded program's own format
    batch.update({k: witness[k] for k in target.search})
    within_bounds(target, batch)
    op, outs = first_nonfinite(target, batch)
    assert op is None and all(finite(t) for t in outs), f"{op} went non-finite"


def test_guarded_witnesses_do_push_the_hazard():
    """The clean twins are not clean by luck: the witness reaches the hazard's input."""
    def witness_x(name):
        return torch.from_numpy(module(CLEAN[name]).witness(built(name))["x"])

    x = {name: witness_x(name) for name in ("softmax_xent_mlp_guarded", "log_sigmoid_guarded",
                                            "rsqrt_norm_guarded", "sqrt_var_guarded")}
    with torch.no_grad():
        z = built("softmax_xent_mlp_guarded").model(x["softmax_xent_mlp_guarded"])
        assert (z.max(1).values - z.min(1).values).max() > 104      # softmax would give p == 0
        z = built("log_sigmoid_guarded").model(x["log_sigmoid_guarded"])
        assert z.max() > 16.7                                         # sigmoid would round to 1
        model = built("rsqrt_norm_guarded").model
        assert (torch.relu(model.fc1(x["rsqrt_norm_guarded"])) == 0).all()   # var == 0 exactly
        model = built("sqrt_var_guarded").model
        assert model.fc_var(model.enc(x["sqrt_var_guarded"])).min() < 0     # a negative variance


def test_masked_attention_stays_clean_at_the_corners():
    target = built("masked_attention_guarded")
    rng = np.random.default_rng(0)
    base = target.sample(rng)
    lo, hi = target.bounds["emb"]
    shape = base["emb"].shape
    extremes = [
        np.where(rng.random(shape) < 0.5, lo, hi),                 # random corners of the box
        np.full(shape, hi), np.full(shape, lo),                    # every token the same
        np.zeros(shape),                                           # LayerNorm of a constant row
    ]
    for emb in extremes:
        batch = dict(base, emb=emb.astype(np.float32))
        op, outs = first_nonfinite(target, batch)
        assert op is None and all(finite(t) for t in outs), op
    mask = torch.nn.Transformer.generate_square_subsequent_mask(4)
    assert torch.isinf(mask).any(), "the intended -inf mask is there"
