"""The out-of-box probe a ``share`` scheduler asks for (issue 16): on real programs, a guarded op
does not fire even with its inputs 100x outside their bounds, and a bug's op does; the probe
leaves the search exactly where it stood (the same trace after it as without it, and the same
checkpoint), so a campaign that probes resumes and replays as one that does not."""
from __future__ import annotations

import os

import pytest

from fuzz_core.engine import TargetSpec
from fuzz_core.search import SearchConfig
from orchestrator.worker import ASK, Resume, Worker, WorkerOptions


def _site(worker: Worker, spec: TargetSpec, op: str, n: int = 0):
    return [s for s in worker.discover(spec) if s.searched and s.op == op][n]


def _spec(name: str, **args) -> TargetSpec:
    return TargetSpec(name, f"campaigns/targets/{name}.py:make_target", args, seed=5, base_dir=os.getcwd())


@pytest.mark.parametrize("name, op, n, fires", [
    ("sqrt_var_guarded", "sqrt", 0, False),     # sqrt(var.clamp_min(0) + 1e-6)
    ("sqrt_var_guarded", "log", 0, False),      # log of that std, >= log(1e-3)
    ("softmax_xent_clamped", "log", 0, False),  # log(p.clamp_min(1e-12))
    ("rbm_free_energy", "log", 0, False),       # log(1 + exp(x)): its exp overflows first, never the log
    ("gan_log_d", "log", 1, True),              # log(D(G(z))): a sigmoid that saturates
    ("rbm_free_energy", "exp", 0, True),        # exp(x) overflows
    # exp(z) / exp(z).sum(): both exps of the line overflow in one step and the first is named first;
    # the second's own hazard fired all the same (it was judged "did not fire", and starved)
    ("exp_overflow_softmax", "exp", 1, True),
    # a backward row: log(softmax) reaches p = 0 in the probe's wide box in one stride, so the same
    # call's forward hazard fires first; its input passed the subnormal p whose gradient overflows
    ("softmax_xent_mlp", "log_grad", 0, True),
    ("softmax_xent_clamped", "log_grad", 0, False),   # the gradient of log(p.clamp_min(1e-12)) stays finite
])
def test_the_probe_tells_guarded_ops_from_ops_that_can_fire(name, op, n, fires):
    worker, spec = Worker(WorkerOptions()), _spec(name)
    site = _site(worker, spec, op, n)
    out = worker.run(spec, site, SearchConfig("adaptive", 400, 0, reach_steps=0), 0, probe_steps=16)
    assert out.outside is fires, (site.label, out.outside)
    assert 0 < out.probe_steps <= 16 and out.result.steps == 0


@pytest.mark.parametrize("name, op, before", [
    ("gan_log_d", "log", 6),              # the probe fires at once
    # it runs all its steps: mutations and escapes that draw from the site's RNG (a probe that did
    # not put the RNG back sent the search elsewhere from here: the scheduler benchmark's cache saw it)
    ("rsqrt_norm_guarded", "rsqrt", 10),
    ("rsqrt_norm_guarded", "rsqrt", 20),
])
def test_the_probe_leaves_the_search_where_it_stood(name, op, before):
    spec, config = _spec(name, batch=8), SearchConfig("adaptive", 400, 5, reach_steps=0)
    plain, probed = Worker(WorkerOptions()), Worker(WorkerOptions())
    site = _site(plain, spec, op, 0)
    a1 = plain.run(spec, site, config, before)
    b1 = probed.run(spec, site, config, before, probe_steps=16)
    assert b1.probe_steps > 0 and b1.outside is not None
    assert a1.checkpoint is not None and b1.checkpoint is not None
    meta = lambda out: {k: v for k, v in out.checkpoint[1].items() if k != "seconds"}  # noqa: E731
    assert meta(a1) == meta(b1)
    assert all((a1.checkpoint[0][k] == b1.checkpoint[0][k]).all() for k in a1.checkpoint[0])
    a2 = plain.run(spec, site, config, 30, resume=Resume(ASK, (), before))
    b2 = probed.run(spec, site, config, 30, resume=Resume(ASK, (), before))
    trace = lambda out: [(p.step, p.suspect_loss, p.best_loss, p.event) for p in out.result.trace]  # noqa: E731
    assert trace(a2) == trace(b2) and a2.result.steps == b2.result.steps == before + 30
