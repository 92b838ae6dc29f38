"""The PyTorch recorder: which ops become sites, where they are, and what counts as an event."""
from __future__ import annotations

import importlib.util
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import fuzz_core.backends.torch as torch_backend
from fuzz_core import Target
from fuzz_core.backends.torch import XP, TorchRunner
from fuzz_core.backends.torch_recorder import Recorder, RecordingMode, inplace_names
from fuzz_core.catalogue import DEFAULT_CATALOGUE, OpSpec
from fuzz_core.domains import POSITIVE

HERE = Path(__file__).resolve()


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch, repo_root):
    monkeypatch.chdir(repo_root)   # locations are relative to the current directory


def loc(marker: str) -> str:
    """The repo-relative ``path:line`` of the line of this file that carries ``# <marker>``."""
    for i, text in enumerate(HERE.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {marker}"):
            return f"tests/test_recorder.py:{i}"
    raise AssertionError(f"no line marked {marker!r}")


def record(fn, *args, locate_all: bool = False):
    rec = Recorder(DEFAULT_CATALOGUE, locate_all=locate_all)
    with RecordingMode(rec):
        out = fn(*args)
    return rec, out


def keys(rec: Recorder) -> list[tuple[str, str, str, int]]:
    return [(c.spec.name, c.kind, c.location, c.occurrence) for c in rec.calls]


def runner_for(program, n_features: int = 3, model=None, optimizer=None, bounds=None,
               search=("x",), batch: int = 2) -> TorchRunner:
    def sample(rng):
        return {"x": rng.uniform(0.5, 1.5, size=(batch, n_features)).astype(np.float32)}

    target = Target(program=program, sample=sample, model=model, optimizer=optimizer,
                    bounds=bounds or {}, search=list(search))
    return TorchRunner("t", target)


def site_of(runner: TorchRunner, values, kind: str):
    sites = [s for s in runner.discover(values, seed=0) if s.kind == kind]
    assert sites, f"no {kind} site among {[s.kind for s in runner.discover(values, seed=0)]}"
    return sites[0]


# ---- which ops are sites ------------------------------------------------------------------

def test_function_and_method_are_the_same_op_kind():
    x = torch.tensor([1.0, 2.0])

    def program(x):
        a = torch.log(x)  # log-function
        b = x.log()  # log-method
        return a + b

    rec, _ = record(program, x)
    assert keys(rec) == [("log", "log", loc("log-function"), 0), ("log", "log", loc("log-method"), 0)]


def test_inplace_and_out_calls_are_sites_with_inputs_saved_before_the_write():
    def program(x, y, z, a, o):
        x.log_()  # log_
        y.div_(z)  # div_
        torch.log(a, out=o)  # log.out
        torch.sqrt(a, out=a)  # sqrt-aliased-out
        torch.exp_(z)  # exp_

    x, y, z = torch.tensor([2.0, 0.5]), torch.tensor([3.0, 4.0]), torch.tensor([2.0, 0.25])
    a, o = torch.tensor([4.0, 9.0]), torch.empty(2)
    rec, _ = record(program, x, y, z, a, o)
    by_kind = {c.kind: c for c in rec.calls}
    assert [c.kind for c in rec.calls] == ["log_", "div_", "log.out", "sqrt.out", "exp_"]
    assert by_kind["log_"].location == loc("log_")
    assert by_kind["log_"].inputs[0].tolist() == [2.0, 0.5]              # not the log written over it
    assert by_kind["div_"].inputs[0].tolist() == [3.0, 4.0]
    assert by_kind["div_"].inputs[1].tolist() == [2.0, 0.25]             # the divisor, as it was
    assert by_kind["log.out"].location == loc("log.out")
    assert by_kind["log.out"].inputs[0] is a or by_kind["log.out"].inputs[0].tolist() == [4.0, 9.0]
    assert by_kind["sqrt.out"].inputs[0].tolist() == [4.0, 9.0]           # out=a overwrote a
    assert by_kind["exp_"].inputs[0].tolist() == [2.0, 0.25]
    assert x.tolist() == pytest.approx([math.log(2.0), math.log(0.5)])   # the program still ran


def test_inplace_names_come_from_the_catalogue():
    names = inplace_names(DEFAULT_CATALOGUE)
    assert {"log_", "div_", "sqrt_", "exp_", "pow_", "floor_divide_", "remainder_", "acos_"} <= names
    assert all(n.endswith("_") for n in names)


def test_location_is_repo_relative_and_occurrence_counts_a_loop():
    def program(x):
        total = x.sum()
        for i in range(3):
            total = total + torch.log(x + i).sum()  # loop
        return total

    rec, _ = record(program, torch.ones(2))
    assert keys(rec) == [("log", "log", loc("loop"), i) for i in range(3)]
    assert not any(c.location.startswith("/") for c in rec.calls)


def test_ops_inside_torch_nn_modules_are_attributed_to_the_calling_line():
    loss_fn = nn.GaussianNLLLoss()

    def program(mu, target, var):
        return loss_fn(mu, target, var)  # module-call

    rec, _ = record(program, torch.zeros(4), torch.ones(4), torch.full((4,), 0.5))
    assert "log" in [c.spec.name for c in rec.calls]
    assert {c.location for c in rec.calls} == {loc("module-call")}


def test_custom_ops_are_keyed_by_namespace():
    lib = torch.library.Library("cdftest_rec", "DEF")
    lib.define("my_log(Tensor x) -> Tensor")
    lib.impl("my_log", lambda x: torch.log(x), "CompositeExplicitAutograd")
    catalogue = DEFAULT_CATALOGUE.copy()
    catalogue.register(OpSpec("my_log", "my_log of x <= 0", torch=("cdftest_rec::my_log",), domain=POSITIVE))
    rec = Recorder(catalogue)
    with RecordingMode(rec):
        torch.ops.cdftest_rec.my_log(torch.tensor([1.0, -1.0]))  # custom-op
    assert [(c.spec.name, c.location) for c in rec.calls][0] == ("my_log", loc("custom-op"))
    assert rec.resolve()[rec.calls[0].flag]   # its NaN is seen


# ---- backward ops are not sites -------------------------------------------------------------

def test_backward_ops_are_not_recorded():
    def program(x):
        y = torch.log(x) / x
        return y.sum()

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    rec, loss = record(program, x)
    before = keys(rec)
    loss.backward()                      # outside the mode
    assert keys(rec) == before

    def trains_inside(x):                # a program that runs its own backward
        loss = program(x)
        loss.backward()
        return loss.detach()

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    rec2, _ = record(trains_inside, x)
    assert [k[:2] for k in keys(rec2)] == [k[:2] for k in before]
    assert x.grad is not None


def test_evaluate_twice_records_the_same_sites(monkeypatch):
    recorders: list[Recorder] = []

    class Keeping(Recorder):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            recorders.append(self)

    monkeypatch.setattr(torch_backend, "Recorder", Keeping)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def program(batch):
        h = model(batch["x"])
        return (torch.log(h.abs() + 1) / (batch["x"].sum(1, keepdim=True) + 3)).mean()

    runner = runner_for(program, model=model, optimizer=opt)
    values = runner.sample(np.random.default_rng(0))
    sites = runner.discover(values, seed=0)
    site = next(s for s in sites if s.op == "div")
    for _ in range(2):
        ev = runner.evaluate(values, site, grad=True, train=True, seed=0)
        assert ev.seen and ev.trained and ev.connected
    assert runner.discover(values, seed=0) == sites
    lists = [keys(r) for r in recorders]
    assert len(lists) == 4 and all(k == lists[0] for k in lists)
    # the program trains: log's backward hazard (1/x of a subnormal) is a site of its own
    assert sorted(k[0] for k in lists[0]) == ["div", "log", "log_grad"]


# ---- what counts as an event ------------------------------------------------------------------

def test_the_first_non_finite_op_is_named_even_off_the_loss_path():
    def program(batch):
        x = batch["x"]
        side = torch.sqrt(x - 10)  # side-nan
        _ = torch.log(side)   # NaN from NaN: not the origin
        return (x * 2).sum()

    runner = runner_for(program)
    values = runner.sample(np.random.default_rng(0))
    res = runner.check(values, seed=0)
    assert res.event and math.isfinite(res.program_loss)
    assert (res.first_op.op, res.first_op.location) == ("sqrt", loc("side-nan"))
    assert res.triggered[("sqrt", loc("side-nan"), 0)]
    assert not any(v for (op, _, _), v in res.triggered.items() if op == "log")


def _attention(x, mask):
    scores = x @ x.transpose(-1, -2)
    scores = scores.masked_fill(mask, float("-inf"))  # masked-fill
    return torch.softmax(scores, dim=-1) @ x  # softmax


def test_an_intended_minus_inf_mask_is_not_an_event():
    T = 4

    def program(batch):
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        return _attention(batch["x"], mask).pow(2).mean()

    runner = runner_for(program, n_features=T * 3, batch=1)
    values = {"x": np.random.default_rng(0).normal(size=(1, T, 3)).astype(np.float32)}
    res = runner.check(values, seed=0)
    assert not res.event and res.first_op is None and math.isfinite(res.program_loss)
    rec, _ = record(program, {"x": torch.as_tensor(values["x"])}, locate_all=True)
    ran = {kind for kind, _, _ in rec.flag_ops}
    assert "masked_fill" in ran and "_softmax" in ran
    assert rec.first_event(rec.resolve(), False, "p") is None


def test_transformer_encoder_causal_mask_is_not_an_event():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True)

    def program(batch):
        x = batch["x"]
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return layer(x, src_mask=mask, is_causal=True).pow(2).mean()

    runner = runner_for(program, model=layer, batch=2)
    values = {"x": np.random.default_rng(0).normal(size=(2, 5, 8)).astype(np.float32)}
    res = runner.check(values, seed=0)
    assert not res.event and res.first_op is None and math.isfinite(res.program_loss)
    site = runner.discover(values, seed=0)[0]
    assert not runner.evaluate(values, site, grad=True, seed=0).event
    rec, _ = record(program, {"x": torch.as_tensor(values["x"])}, locate_all=True)
    ran = {kind for kind, _, _ in rec.flag_ops}
    assert {"full", "triu"} & ran, ran   # the -inf mask was built (and checked) at every step
    assert rec.first_event(rec.resolve(), False, "p") is None


def test_a_row_with_every_key_masked_is_an_event():
    T = 3

    def program(batch):
        mask = torch.zeros(T, T, dtype=torch.bool)
        mask[1] = True                   # row 1 sees no key: softmax of all -inf is NaN
        return _attention(batch["x"], mask).sum()

    runner = runner_for(program, batch=1)
    values = {"x": np.random.default_rng(0).normal(size=(1, T, 3)).astype(np.float32)}
    res = runner.check(values, seed=0)
    assert res.event and res.first_op is not None and res.first_op.nan
    assert (res.first_op.op, res.first_op.location) == ("softmax", loc("softmax"))


# ---- site ids -----------------------------------------------------------------------------

PROGRAM_FILE = textwrap.dedent('''
    import numpy as np
    import torch
    from fuzz_core import Target


    def make_target(seed=0):
        def program(batch):
            x = batch["x"]
            return torch.log(x).sum() + (1 / x).sum()

        return Target(program=program, search=["x"],
                      sample=lambda rng: {"x": rng.uniform(1, 2, size=(2, 3)).astype(np.float32)})
''')


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_ids_are_stable_across_runners_and_checkouts(tmp_path, monkeypatch):
    ids = []
    for i, checkout in enumerate(("one/place", "another/deeper/place")):
        root = tmp_path / checkout
        (root / "targets").mkdir(parents=True)
        (root / "targets" / "prog.py").write_text(PROGRAM_FILE)
        monkeypatch.chdir(root)
        module = _load(root / "targets" / "prog.py", f"cdf_prog_{i}")
        for _ in range(2):                              # two runners from one checkout
            runner = TorchRunner("prog", module.make_target(seed=0))
            values = runner.sample(np.random.default_rng(0))
            sites = runner.discover(values, seed=0)
            assert [s.location for s in sites] == ["targets/prog.py:10", "targets/prog.py:10"]
            ids.append([s.id for s in sites])
    assert all(i == ids[0] for i in ids) and len(set(ids[0])) == 2


def test_site_ids_of_this_file_are_repo_relative():
    def program(batch):
        return torch.log(batch["x"]).sum()  # repo-relative

    ids = []
    for _ in range(2):
        runner = runner_for(program)
        values = runner.sample(np.random.default_rng(0))
        sites = runner.discover(values, seed=0)
        assert [s.location for s in sites] == [loc("repo-relative")]
        ids.append([s.id for s in sites])
    assert ids[0] == ids[1]


# ---- in-place ops keep their gradient path --------------------------------------------------

def _linear(n: int) -> nn.Linear:
    layer = nn.Linear(n, n)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(n) + 0.1)
        layer.bias.zero_()
    return layer


INPLACE_PROGRAMS = {
    "log_": lambda h: h.log_(),
    "sqrt_": lambda h: torch.sqrt_(h),
    "exp_": lambda h: torch.exp_(h * 100),
    "div_": lambda h: h.clone().__itruediv__(h),
    "pow_": lambda h: h.__ipow__(-0.5),
}


@pytest.mark.parametrize("kind", sorted(INPLACE_PROGRAMS))
def test_an_inplace_site_has_a_gradient_path_and_still_triggers(kind):
    W = _linear(3)

    def program(batch):
        h = W(batch["x"])
        return INPLACE_PROGRAMS[kind](h).sum()

    runner = runner_for(program, model=W)
    good = {"x": np.full((2, 3), 0.5, np.float32)}
    site = site_of(runner, good, kind)
    ev = runner.evaluate(good, site, grad=True, seed=0)
    assert ev.seen and not ev.triggered and ev.hard > 0
    assert ev.connected and ev.grad_norm > 0 and np.abs(ev.grads["x"]).sum() > 0
    bad = {"x": np.full((2, 3), {"exp_": 2.0, "div_": 0.0}.get(kind, -1.0), np.float32)}
    ev_bad = runner.evaluate(bad, site, grad=True, seed=0)
    assert ev_bad.triggered and ev_bad.hard <= 0
    res = runner.check(bad, seed=0)
    assert res.triggered[site.key] and res.first_op.kind == kind


def test_inputs_recorded_earlier_are_saved_before_a_later_write():
    W = _linear(2)
    x = torch.full((1, 2), 0.5, requires_grad=True)

    def program(x):
        h = W(x)
        y = torch.sqrt(h)  # sqrt-before-write
        h.mul_(-1)
        h[0, 0] = 5.0
        return y

    rec, _ = record(program, x)
    (call,) = rec.calls
    assert call.location == loc("sqrt-before-write")
    assert (call.inputs[0] > 0).all()                     # h as sqrt saw it, not -h
    margin = call.spec.margins(call.inputs, XP).min()
    (g,) = torch.autograd.grad(margin, x)
    assert g.abs().sum() > 0


def test_recorder_outside_any_mode_leaves_torch_alone():
    rec, _ = record(lambda x: torch.log(x), torch.ones(1))
    assert len(rec.calls) == 1
    torch.log(torch.ones(1))              # after the mode: nothing more is recorded
    torch.ones(2).log_()
    assert len(rec.calls) == 1
