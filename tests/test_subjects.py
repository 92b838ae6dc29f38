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

The subjects whose bug arises only in the training step (issue 15) are checked the same
way one phase later: on the witness the forward pass stays finite, while the gradient of
the program's loss (backward subjects) and the program's own training step (all of them)
go non-finite; on their guarded twins the same witness reaches the same edge (a zero
variance, a certain prediction, a pair of equal points) and the whole step stays finite.
"""
from __future__ import annotations

import importlib.util
import inspect
import math
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
# subject whose bug arises only in the training step -> its phase: "backward" (the gradient of
# the program's loss goes non-finite) or "update" (the gradient is finite, the update is not)
STEP_BUGGY = {
    "attn_empty_sequence": "backward",
    "instnorm_flatline": "backward",
    "logreg_focal_plain": "backward",
    "gan_minibatch_std": "backward",
    "vae_logvar_underflow": "backward",
    "poincare_hierarchy": "backward",
    "poisson_adam_overflow": "update",
}
# clean subject -> the buggy twin whose witness drives the same hazard (None: none)
CLEAN = {
    "softmax_xent_mlp_guarded": "softmax_xent_mlp",
    "softmax_xent_clamped": "softmax_xent_mlp",
    "log_sigmoid_guarded": "log_one_minus_sigmoid",
    "rsqrt_norm_guarded": "rsqrt_norm",
    "sqrt_var_guarded": "vae_sqrt_var",
    "masked_attention_guarded": None,
    **{f"{name}_guarded": name for name in STEP_BUGGY},
}
SUBJECTS = sorted(BUGGY) + sorted(STEP_BUGGY) + sorted(CLEAN)
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
    # mp_*: the mixed-precision subjects (bugs only under fp16), tested in test_precision_subjects.py
    files = {p.stem for p in TARGETS.glob("*.py") if not p.stem.startswith(("tf_", "_", "mp_"))}
    assert files == set(SUBJECTS), f"untested: {sorted(files - set(SUBJECTS))}, missing: {sorted(set(SUBJECTS) - files)}"
    assert len(BUGGY) >= 13 and len(CLEAN) >= 5 and len(STEP_BUGGY) >= 7


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
    quick = {"pretrain_steps": 0} if "pretrain_steps" in inspect.signature(mod.make_target).parameters else {}
    small = mod.make_target(seed=0, batch=3, **quick).sample(np.random.default_rng(1))   # factories name their args
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


# ---- subjects whose bug arises only in the training step -------------------------------

def trainable(target: Target) -> list[torch.Tensor]:
    """The tensors the program trains: its model's parameters, or the tensors that require a
    gradient in ``program``'s closure (a plain-tensor program)."""
    if target.model is not None:
        return [p for p in target.model.parameters() if p.requires_grad]
    cells = [c.cell_contents for c in (target.program.__closure__ or ())]
    return [t for t in cells if isinstance(t, torch.Tensor) and t.requires_grad]


def optimizer_state(target: Target) -> list[torch.Tensor]:
    opts = target.optimizer if isinstance(target.optimizer, (list, tuple)) else [target.optimizer]
    if target.train_step is not None:      # the optimizers a train_step holds in its closure
        opts = [c.cell_contents for c in (target.train_step.__closure__ or ())
                if isinstance(c.cell_contents, torch.optim.Optimizer)]
    return [v for opt in opts if opt is not None for st in opt.state.values() for v in st.values()
            if isinstance(v, torch.Tensor) and v.is_floating_point()]


def training_step(target: Target, batch: dict, seed: int = 0) -> None:
    """The program's own step, as the engine takes it: its train_step, or zero_grad, backward, step."""
    tb = to_torch(batch)
    torch.manual_seed(seed)
    if target.train_step is not None:
        target.train_step(tb)
        return
    target.optimizer.zero_grad()
    outputs(target.program(tb))[0].backward()
    target.optimizer.step()


def loss_grads(target: Target, batch: dict, seed: int = 0) -> list[torch.Tensor]:
    params = trainable(target)
    loss = run(target, batch, seed)[0]
    return [g for g in torch.autograd.grad(loss, params, allow_unused=True) if g is not None]


@pytest.mark.parametrize("name", sorted(STEP_BUGGY))
def test_witness_breaks_only_the_training_step(name):
    target = module(name).make_target(seed=0)          # trained below: not the shared one
    batch = module(name).witness(target)
    check_batch(batch, target.search)
    within_bounds(target, batch)
    op, outs = first_nonfinite(target, batch)
    assert op is None and all(finite(t) for t in outs), f"the forward pass went non-finite at {op}"
    grads = loss_grads(target, batch)
    if STEP_BUGGY[name] == "backward":
        assert not all(finite(g) for g in grads), "the gradient of the program's loss stayed finite"
    else:
        assert all(finite(g) for g in grads), "an update-phase bug has a finite gradient"
    before = [t.detach().clone() for t in trainable(target) + optimizer_state(target)]
    assert all(finite(t) for t in before)
    training_step(target, batch)
    after = trainable(target) + optimizer_state(target)
    assert not all(finite(t) for t in after), "the program's own training step stayed finite"


@pytest.mark.parametrize("name", sorted(STEP_BUGGY))
def test_sampled_batches_train_finitely(name):
    """Not a bug that every batch shows: three training steps on sampled batches stay finite."""
    target = module(name).make_target(seed=0)
    rng = np.random.default_rng(3)
    for step in range(3):
        batch = target.sample(rng)
        assert all(finite(g) for g in loss_grads(target, batch, step))
        training_step(target, batch, step)
    assert all(finite(t) for t in trainable(target) + optimizer_state(target))


class InputRange(TorchDispatchMode):
    """Smallest and largest value of the first input of the given aten ops."""

    def __init__(self, ops: set[str]):
        super().__init__()
        self.ops, self.low, self.high = ops, math.inf, -math.inf

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.ops and isinstance(args[0], torch.Tensor):
            self.low = min(self.low, float(args[0].min()))
            self.high = max(self.high, float(args[0].max()))
        return func(*args, **(kwargs or {}))


# guarded twin -> (the guarded op, the edge its input reaches on the buggy twin's witness)
GUARD_EDGE = {
    "attn_empty_sequence_guarded": ({"rsqrt"}, lambda lo, hi: lo == np.float32(1e-6)),        # mean(x^2) == 0
    "instnorm_flatline_guarded": ({"sqrt"}, lambda lo, hi: lo == np.float32(1e-5)),          # var == 0
    "logreg_focal_plain_guarded": ({"pow"}, lambda lo, hi: lo == np.float32(1e-6)),          # p_t == 1
    "gan_minibatch_std_guarded": ({"sqrt"}, lambda lo, hi: lo == np.float32(1e-8)),          # var == 0
    "vae_logvar_underflow_guarded": ({"exp"}, lambda lo, hi: lo < -104.0),                   # exp underflows
    "poisson_adam_overflow_guarded": ({"exp"}, lambda lo, hi: hi == 20.0),                   # at the clamp
    "poincare_hierarchy_guarded": ({"acosh"}, lambda lo, hi: lo == np.float32(1 + 1e-7)),    # equal points
}


@pytest.mark.parametrize("name", sorted(GUARD_EDGE))
def test_guarded_twin_trains_finitely_at_the_edge_where_its_twin_breaks(name):
    target = module(name).make_target(seed=0)
    batch = module(CLEAN[name]).witness(target)        # the buggy twin's recipe, on the guarded program
    within_bounds(target, batch)
    ops, reached = GUARD_EDGE[name]
    mode = InputRange(ops)
    with torch.no_grad(), mode:
        run(target, batch)
    assert reached(mode.low, mode.high), f"the witness did not reach the edge: {ops} saw [{mode.low}, {mode.high}]"
    op, outs = first_nonfinite(target, batch)
    assert op is None and all(finite(t) for t in outs)
    assert all(finite(g) for g in loss_grads(target, batch))
    training_step(target, batch)
    assert all(finite(t) for t in trainable(target) + optimizer_state(target))
