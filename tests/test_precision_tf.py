"""Mixed precision in TensorFlow: a Keras model built under the campaign's ``mixed_float16`` policy.

* The policy is the global Keras policy only while the factory builds the target (the
  ``prepare`` hook of the backend, entered by ``engine.build_runner``), and what it was
  before afterwards: one process builds float32 and mixed targets alike.
* ``tf_keras_mixed``: the hidden ``Dense``'s float16 ``MatMul`` overflows for raw counts near
  the detector's full scale (in bounds): a ``half_overflow`` site, found by ``adaptive`` in
  the forward phase, confirmed by fresh builds under the same policy, and float32-finite on
  the same input (``fp32_finite``: precision-only).
* The same file built without the policy has no half-precision site and gives no finding;
  the guarded twin (counts scaled to ``[0, 1]`` in float32) gives none under the policy.
"""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from fuzz_core.backends.base import Precision, RunnerOptions  # noqa: E402
from fuzz_core.backends.tensorflow import EagerRunner, keras_policy  # noqa: E402
from fuzz_core.catalogue import DEFAULT_CATALOGUE, Catalogue  # noqa: E402
from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from  # noqa: E402
from fuzz_core.search import SearchConfig, SiteSearch  # noqa: E402
from fuzz_core.status import SiteStatus  # noqa: E402

pytestmark = pytest.mark.tf

SUBJECT = "campaigns/targets/tf_keras_mixed.py"
GUARDED = "campaigns/targets/tf_keras_mixed_guarded.py"
MIXED = RunnerOptions(precision=Precision(policy="mixed_float16"))
CONFIG = SearchConfig(strategy="adaptive", max_steps=50, seed=0, reach_steps=0)
HALF = "half_overflow"

needs_row = pytest.mark.skipif(not any(s.name == HALF for s in DEFAULT_CATALOGUE),
                               reason="the catalogue has no half_overflow row yet")


def spec(path: str = SUBJECT, name: str = "keras_mixed") -> TargetSpec:
    return TargetSpec(name, f"{path}:make_target", framework="tensorflow")


def line_of(path: str, text: str) -> int:
    with open(path) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def policy_name() -> str:
    return keras.mixed_precision.global_policy().name


def search_all(runner) -> list:
    """Every searched site of one discovery, searched to its budget: the results."""
    return [(site, SiteSearch(runner, site, CONFIG).run(CONFIG.max_steps))
            for site in discover_sites(runner, 0) if site.searched]


@pytest.fixture(scope="module")
def mixed():
    runner = build_runner(spec(), MIXED)
    site = next(s for s in discover_sites(runner, 0) if s.op == HALF)
    result = SiteSearch(runner, site, CONFIG).run(CONFIG.max_steps)
    return runner, site, result


def test_the_policy_holds_while_the_factory_builds_and_is_restored_after():
    before = policy_name()
    runner = build_runner(spec(), MIXED)
    assert policy_name() == before == "float32"
    hidden, head = runner.target.model.layers
    assert (hidden.compute_dtype, hidden.variable_dtype) == ("float16", "float32")
    assert head.compute_dtype == "float32"            # the head asked for float32: judged in float32
    plain = build_runner(spec(), RunnerOptions())      # the same file, the same process: float32
    assert plain.target.model.layers[0].compute_dtype == "float32"
    with keras_policy("mixed_bfloat16"):               # a policy the process had set itself comes back
        again = build_runner(spec(), MIXED)
        assert policy_name() == "mixed_bfloat16"
    assert again.target.model.layers[0].compute_dtype == "float16"
    assert policy_name() == "float32"


@needs_row
def test_the_float16_matmul_overflow_is_found_in_the_forward_phase_and_named(mixed):
    runner, site, result = mixed
    assert (site.kind, site.location) == ("MatMul", f"{SUBJECT}:{line_of(SUBJECT, 'pred = model(')}")
    assert result.status is SiteStatus.FOUND and result.steps <= 20
    cand = result.candidate
    assert cand.phase == "forward"
    assert (cand.first_op.op, cand.first_op.kind, cand.first_op.location) == (HALF, "MatMul", site.location)
    lo, hi = runner.target.bounds["counts"]
    assert lo <= cand.values["counts"].min() and cand.values["counts"].max() <= hi     # large, in bounds
    finding = finding_from(runner, spec(), site, CONFIG, cand, result.seconds, minimise_batch=False)
    assert tuple(finding.replays) == (3, 3)           # fresh builds, under the policy
    assert finding.phase == "forward" and finding.first_op["op"] == HALF
    assert finding.precision == MIXED.precision.to_dict() and finding.precision_only is True
    overflow = finding.overflow               # measured: the float32 twin's value of the overflowed MatMul
    assert (overflow["dtype"], overflow["limit"]) == ("float16", 65504.0)
    assert overflow["value"] > 65504.0 and overflow["excess"] == pytest.approx(overflow["value"] / 65504.0)


@needs_row
def test_the_float32_program_stays_finite_on_the_found_input(mixed):
    runner, _, result = mixed
    cand = result.candidate
    assert runner.fp32_finite(cand.values, cand.seed) is True
    twin = runner._fp32_twin()
    assert twin is not runner and twin.options.precision == Precision()
    assert twin.target.model.layers[0].compute_dtype == "float32"
    assert runner._fp32_twin() is twin                 # built once per runner
    assert not runner.fp32_check(cand.values, cand.seed).event
    assert runner.check(cand.values, cand.seed).event  # the mixed runner still fails on it
    assert policy_name() == "float32"


@needs_row
def test_the_same_file_without_the_policy_is_clean(mixed):
    _, _, result = mixed
    plain = build_runner(spec(), RunnerOptions())
    assert not [s for s in discover_sites(plain, 0) if s.op == HALF]   # no half-precision output at all
    assert all(r.candidate is None for _, r in search_all(plain))
    assert not plain.check(result.candidate.values, result.candidate.seed).event


@needs_row
def test_the_guarded_twin_is_clean_under_the_policy():
    runner = build_runner(spec(GUARDED, "keras_mixed_guarded"), MIXED)
    results = search_all(runner)
    assert any(site.op == HALF for site, _ in results)      # its float16 MatMul is searched ...
    assert all(r.candidate is None for _, r in results)    # ... and cannot overflow


def test_a_catalogue_without_output_rows_records_no_half_site():
    catalogue = Catalogue([s for s in DEFAULT_CATALOGUE if not getattr(s, "on_output", False)])
    with keras_policy("mixed_float16"):
        target = build_runner(spec(), RunnerOptions()).target   # the factory, under the policy
    runner = EagerRunner("no_rows", target, MIXED, catalogue)
    assert all(s.op != HALF for s in discover_sites(runner, 0))
