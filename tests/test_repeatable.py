"""Repeatable campaigns: with one actor the scheduler hears back from quanta in the order it granted
them, so a Ray run makes the same decisions as a run in this process, and both the same steps, losses
and findings (README, "Repeatable runs"). With more actors the order in which quanta finish is the
machine's, and so are the decisions that follow it; a search itself depends only on the decisions
(test_catch_up.py, test_resume.py)."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from orchestrator.config import load_campaign
from orchestrator.run.campaign import RunOptions, run_campaign
from records import check_run

TARGETS = {
    "sig": "campaigns/targets/log_one_minus_sigmoid.py:make_target",
    "divexp": "campaigns/targets/div_sum_exp.py:make_target",
    "masked": "tests/targets/masked.py:make_target",
}


def _run(tmp_path: Path, name: str, actors: int) -> tuple[list, dict]:
    targets = "\n".join(f"  - {{name: {n}, entry: '{e}'}}" for n, e in TARGETS.items())
    path = tmp_path / f"{name}.yaml"
    path.write_text("name: repeat\ntargets:\n" + targets + "\n" + textwrap.dedent(f"""\
        search: {{strategy: adaptive, max_steps: 60, seed: 3}}
        scheduler: {{policy: loss-slope, quantum: 10}}
        resources: {{num_actors: {actors}, num_cpus: 1, num_gpus: 0}}
        device: cpu
        tracking: {{enabled: false}}
        output: {tmp_path / name}
        """))
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False))
    summary = check_run(outcome.run_dir)
    assert summary["run"]["executor"] == ("ray" if actors else "local")
    sites = {}
    for s in summary["sites"]:
        signature = None
        if s["finding"]:
            signature = json.loads((outcome.run_dir / s["finding"] / "finding.json").read_text())["signature"]
        sites[s["id"]] = (s["status"], s["exit_reason"], s["steps"], s["best_loss"], signature, s["passed"])
    return json.loads((outcome.run_dir / "allocation.json").read_text()), sites


@pytest.mark.ray
def test_one_ray_actor_makes_the_decisions_a_local_run_makes(tmp_path: Path, ray_session):
    local = _run(tmp_path, "local", 0)
    ray = _run(tmp_path, "ray", 1)
    allocation, sites = local
    assert len({grant["steps"] for grant in allocation}) > 1, "the scheduler's grants vary"
    assert any(s[4] for s in sites.values()) and any(s[0] != "found" for s in sites.values())
    assert ray == local
