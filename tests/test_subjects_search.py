"""Every buggy subject's bug is found by the default strategy within its budget and replays;
every guarded twin stays clean (no false positive)."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.subjects import BUGGY, GUARDED, KNOWN_MISS
from fuzz_core.engine import TargetSpec, build_runner, confirm, confirmed, discover_sites, finding_from
from fuzz_core.search import SearchConfig, SiteSearch

BUDGET = 200          # most subjects' campaign files use max_steps 200
BUDGETS = {"rsqrt_norm": 1000}   # a slow descent: its campaign file's budget (the six tactics: 407-667 at seeds 0-4)
GUARD_BUDGET = 60     # a guarded twin: every site, a shorter budget (no bug to find)


def _sites(entry: str, seed: int = 0):
    spec = TargetSpec("subject", entry, seed=seed)
    runner = build_runner(spec)
    return spec, runner, [s for s in discover_sites(runner, seed) if s.searched]


# a known miss is a strict xfail: a search that finds it fails this test
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISS[n]))
                                  if n in KNOWN_MISS else n for n in sorted(BUGGY)])
def test_buggy_subject_is_found_and_replays(name: str):
    spec, runner, sites = _sites(BUGGY[name])
    assert sites, f"{name}: no suspect op site discovered"
    budget = BUDGETS.get(name, BUDGET)
    config = SearchConfig("adaptive", budget)
    for site in sites:
        result = SiteSearch(runner, site, config).run(budget)
        if result.candidate is None:
            continue
        finding = finding_from(runner, spec, site, config, result.candidate, result.seconds)
        assert finding.replays == (3, 3), f"{name}: candidate at {site.label} replayed {finding.replays}"
        check = confirm(runner, site, finding.inputs, finding.state, finding.step_seed)
        assert confirmed(check, site, result.candidate)
        assert finding.minimised["batch_size"] <= finding.minimised["original_batch_size"]
        return
    pytest.fail(f"{name}: no site triggered within {budget} steps: {[s.label for s in sites]}")


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_guarded_twin_stays_clean(name: str):
    spec, runner, sites = _sites(GUARDED[name])
    config = SearchConfig("adaptive", GUARD_BUDGET)
    for site in sites:
        result = SiteSearch(runner, site, config).run(GUARD_BUDGET)
        cand = result.candidate
        assert cand is None, f"{name}: false positive while searching {site.label}: {cand.first_op} ({cand.phase})"


def test_masked_attention_twin_records_the_mask_and_reports_nothing():
    entry = GUARDED.get("masked_attention_guarded")
    if entry is None:
        pytest.skip("no masked-attention subject")
    spec, runner, _ = _sites(entry)
    from fuzz_core.backends.torch_recorder import Recorder, RecordingMode
    import torch

    batch = runner.sample(np.random.default_rng(0))
    seen: list[str] = []
    rec = Recorder(runner.catalogue, locate_all=True)
    original = rec.handle

    def spy(func, args, kwargs):
        out = original(func, args, kwargs)
        if isinstance(out, torch.Tensor) and out.is_floating_point() and torch.isinf(out).any():
            seen.append(func.overloadpacket.__name__)
        return out

    rec.handle = spy
    with RecordingMode(rec):
        runner.target.program({k: torch.as_tensor(v) for k, v in batch.items()})
    assert seen, "the causal -inf mask was not recorded"
    assert not runner.check(batch, 0).event      # intended infinities are not events
