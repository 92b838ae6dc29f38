"""Default ranges that follow the data (issue: counts 1..7 were searched in [-60, 60]).

An input without bounds stays within the range of several batches of ``sample`` grown by
``input_range`` times its spread, never across zero for data of one sign; searched weights stay
around their initial values. The README's sentences are checked against the code.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_core import Target
from fuzz_core.backends.base import DATA_DRAWS, INPUT_RANGE, WEIGHT_RANGE, RunnerOptions, data_box
from fuzz_core.backends.torch import TorchRunner
from fuzz_core.engine import TargetSpec, discover_sites, finding_from
from fuzz_core.search import SearchConfig, SiteSearch

FINITE = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(values=st.lists(FINITE, min_size=1, max_size=20), factor=st.floats(0.0, 10.0))
def test_the_box_contains_the_data_and_keeps_its_sign(values, factor):
    lo, hi = min(values), max(values)
    box_lo, box_hi = data_box(lo, hi, factor)
    assert box_lo <= lo and hi <= box_hi
    if lo >= 0:
        assert box_lo >= 0
    if hi <= 0:
        assert box_hi <= 0


@settings(max_examples=100, deadline=None, derandomize=True)
@given(lo=FINITE, width=st.floats(0.0, 1e3), f1=st.floats(0.0, 5.0), f2=st.floats(0.0, 5.0))
def test_the_box_grows_with_the_factor(lo, width, f1, f2):
    small, large = sorted((f1, f2))
    a, b = data_box(lo, lo + width, small), data_box(lo, lo + width, large)
    assert b[0] <= a[0] and a[1] <= b[1]


def test_data_in_unit_interval_is_not_widened_to_minus_ten_plus_ten():
    assert data_box(0.0, 1.0, INPUT_RANGE) == (0.0, 1.0 + INPUT_RANGE)


def counts(seed: int = 0) -> Target:
    """Features that are counts from 1 to 7, no bounds given."""
    w = torch.tensor([[0.5], [-0.2], [0.1]])

    def program(batch):
        return torch.log(batch["x"] @ w + 1.0).mean()

    return Target(program=program, sample=lambda rng: {"x": rng.integers(1, 8, (4, 3)).astype(np.float32)},
                  search=["x"])


def test_counts_keep_their_sign_and_the_box_covers_every_draw():
    runner = TorchRunner("counts", counts())
    batch = runner.sample(np.random.default_rng(0))
    lo, hi = runner.bounds(batch)["x"]
    assert lo == 0.0, "counts never go negative"
    assert hi == 7.0 + INPUT_RANGE * 6.0, "the largest count grown by input_range spreads"
    draws = [runner.sample(np.random.default_rng(i)) for i in range(DATA_DRAWS)]
    assert all(lo <= d["x"].min() and d["x"].max() <= hi for d in draws)


def test_input_range_sets_the_factor():
    runner = TorchRunner("counts", counts(), RunnerOptions(input_range=3.0))
    lo, hi = runner.bounds(runner.sample(np.random.default_rng(0)))["x"]
    assert (lo, hi) == (0.0, 7.0 + 3.0 * 6.0)


def test_searched_weights_stay_around_their_initial_values_and_zero_biases_borrow_a_scale():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[2.0, 3.0, 4.0], [2.5, 3.5, 3.0]]))
        net.bias.zero_()
    target = Target(program=lambda b: net(b["x"]).sum(), sample=lambda rng: {"x": np.ones((2, 3), np.float32)},
                    model=net, bounds={"x": (0.0, 1.0)}, search=["x"])
    runner = TorchRunner("w", target, RunnerOptions(search_weights=True))
    bounds = runner.bounds(runner.sample(np.random.default_rng(0)))
    assert bounds["weight:weight"] == (2.0 - WEIGHT_RANGE * 4.0, 4.0 + WEIGHT_RANGE * 4.0)
    assert bounds["weight:bias"] == (-WEIGHT_RANGE * 4.0, WEIGHT_RANGE * 4.0)   # zeros: the model's largest |w|


def test_the_readme_states_the_rules_the_code_applies():
    readme = Path("README.md").read_text()
    assert re.search(r"`search\.input_range`[^.]*default[^.]*" + re.escape(f"{INPUT_RANGE:g}"), readme), \
        "the README gives search.input_range and its default"
    sentence = next((s for s in re.split(r"(?<=\.)\s", readme) if "initial" in s and "weight" in s.lower()), "")
    assert f"{WEIGHT_RANGE:g}" in sentence and "zero" in sentence, sentence


def outlier(seed: int = 0) -> Target:
    """log(16 - x) over pixels in [0, 16] (no bounds): triggers only beyond the data, at x >= 16."""
    def program(batch):
        return torch.log(16.0 - batch["x"]).sum()

    return Target(program=program, sample=lambda rng: {"x": rng.integers(0, 16, (4, 2)).astype(np.float32)},
                  search=["x"])


def test_a_finding_on_values_the_data_never_takes_says_so():
    runner = TorchRunner("o", outlier())
    site = discover_sites(runner, 0)[0]
    config = SearchConfig("adaptive", 40, 0)
    res = SiteSearch(runner, site, config).run(40)
    assert res.candidate is not None
    finding = finding_from(runner, TargetSpec("o", "tests/test_default_bounds.py:outlier"), site, config,
                           res.candidate, res.seconds)
    assert finding.notes and re.match(r"x\[\d+, \d+\] = [\d.]+, sampled data lies in \[0, 15\]", finding.notes[0])
    assert finding.report()["notes"] == finding.notes


def test_campaign_input_range_reaches_the_search_and_sites_shows_each_box(tmp_path: Path):
    """``search.input_range`` in the campaign sets the factor; ``cdeepfuzz sites`` shows the box
    each search stays in and the data's range it was derived from."""
    import json

    from typer.testing import CliRunner

    from orchestrator.commands.cli import app

    campaign = tmp_path / "c.yaml"
    campaign.write_text(f"name: counts\ntargets:\n  - {{name: counts, entry: '{Path(__file__).resolve()}:counts'}}\n"
                        "search: {input_range: 0.5}\nresources: {num_actors: 0}\ndevice: cpu\n"
                        "tracking: {enabled: false}\n")
    got = CliRunner().invoke(app, ["sites", str(campaign), "--json"])
    assert got.exit_code == 0, got.output
    rows = [r for r in json.loads(got.stdout) if r["searched"]]
    assert rows and all(r["inputs"]["x"] == {"box": [0.0, 10.0], "source": "default", "data": [1.0, 7.0]}
                        for r in rows)                 # counts 1..7, grown by 0.5 x 6 and kept >= 0
    table = CliRunner().invoke(app, ["sites", str(campaign)])
    assert "counts: x in [0, 10] (default: sampled data lies in [1, 7])" in table.output

    bad = tmp_path / "bad.yaml"
    bad.write_text(campaign.read_text().replace("input_range: 0.5", "input_range: -1"))
    refused = CliRunner().invoke(app, ["sites", str(bad)])
    assert refused.exit_code == 2 and "input_range" in refused.output and "-1" in refused.output
