"""Adaptive rides the program's own training where no input in the box reaches the edge (issue 17).

Judged on programs nobody here wrote for the purpose: two of GRIST's benchmark programs, as
re-expressed in ``benchmarks/grist_suite`` (their bugs are GRIST's, not planted here). In both the
softmax cannot underflow at the factory's weights for any input within the pixels' box; only the
program's training, on the batches the search feeds it, gets the weights there:

- TF ID_3, a softmax regression from zero weights trained by Adam (GRIST's loop triggers it at
  iteration 507, 1013 steps of the ``grist`` strategy: a TF1 training step is a pass of its own);
- PyTorch ID_12, skorch's MLP with dropout trained by SGD at 0.1 (``grist``: 806 steps).

``adaptive`` must find each well inside a budget that sign steps do not reach, by drifting (its
trace says so), and a drifting search must resume exactly from its checkpoint.
"""
from __future__ import annotations

import os

import pytest

from fuzz_core.backends.base import RunnerOptions
from fuzz_core.engine import TargetSpec, build_runner, discover_sites
from fuzz_core.search import SearchConfig, SiteSearch
from fuzz_core.status import SiteStatus

ID_3 = "benchmarks/grist_suite/tf_programs/id03_github_ips9.py:make_target"
ID_12 = "benchmarks/grist_suite/torch_programs/id12_skorch_mnist.py:make_target"


def _site(entry: str, framework: str, op: str = "log"):
    runner = build_runner(TargetSpec("drift", entry, {}, framework=framework, seed=0, base_dir=os.getcwd()),
                          RunnerOptions())
    site = next(s for s in discover_sites(runner, 0) if s.searched and s.op == op)
    return runner, site


def _search(runner, site, strategy: str, budget: int):
    s = SiteSearch(runner, site, SearchConfig(strategy=strategy, max_steps=budget, seed=0, reach_steps=0))
    return s, s.run(budget)


def _rides_where_sign_steps_do_not(entry: str, framework: str, budget: int) -> None:
    runner, site = _site(entry, framework)
    search, found = _search(runner, site, "adaptive", budget)
    assert found.status is SiteStatus.FOUND, f"adaptive missed it in {budget} steps (best {found.best_loss:.1f})"
    assert any(p.event == "drift" for p in found.trace), "found by riding the training"
    assert found.candidate is not None and found.candidate.training
    _, sign = _search(runner, site, "grist", budget)
    assert sign.status is SiteStatus.EXHAUSTED, "the budget is one that sign steps do not reach"


@pytest.mark.tf
def test_adaptive_rides_a_softmax_regressions_training_where_sign_steps_do_not():
    pytest.importorskip("tensorflow")
    _rides_where_sign_steps_do_not(ID_3, "tensorflow", 400)


def test_adaptive_rides_an_mlps_training_where_sign_steps_do_not():
    _rides_where_sign_steps_do_not(ID_12, "torch", 500)


def test_a_drifting_search_resumes_exactly_from_its_checkpoint():
    runner, site = _site(ID_12, "torch")
    whole, result = _search(runner, site, "adaptive", 160)
    assert any(p.event == "drift" for p in result.trace), "it drifts by then"
    trace = [(p.step, p.event, p.suspect_loss) for p in result.trace]

    config = SearchConfig(strategy="adaptive", max_steps=160, seed=0, reach_steps=0)
    first = SiteSearch(runner, site, config)
    head = first.run(90)
    assert any(p.event == "drift" for p in head.trace), "the checkpoint is taken while it drifts"
    arrays, meta = first.checkpoint()
    again = SiteSearch(runner, site, config)      # the runner back at the factory's state, then the checkpoint's
    again.restore(arrays, meta)
    tail = again.run(70)
    assert [(p.step, p.event, p.suspect_loss) for p in head.trace + tail.trace] == trace
