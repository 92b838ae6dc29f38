"""TensorFlow targets in a Ray campaign beside torch ones; TF is imported in the actors only."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.ray, pytest.mark.slow]

DRIVER = """
import sys
from pathlib import Path
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
         _node_ip_address="127.0.0.1")
from orchestrator.run.campaign import RunOptions, run_campaign
from orchestrator.config import load_campaign
path = Path(sys.argv[1])
outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False))
assert "tensorflow" not in sys.modules, "the driver imported TensorFlow"
print(outcome.summary)
ray.shutdown()
"""


def test_tf_and_torch_targets_in_one_ray_campaign(tmp_path: Path):
    pytest.importorskip("tensorflow")
    path = tmp_path / "mixed.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: mixed
        targets:
          - {{name: tf-bce, entry: campaigns/targets/tf_graph_bce.py:make_target, framework: tensorflow}}
          - {{name: tf-softmax, entry: campaigns/targets/tf_softmax_xent_mlp.py:make_target}}
          - {{name: torch-mlp, entry: campaigns/targets/softmax_xent_mlp.py:make_target}}
        search: {{max_steps: 60}}
        resources: {{num_actors: 2, num_cpus: 1}}
        device: cpu
        tracking: {{enabled: false}}
        output: {tmp_path / 'out'}
        """))
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(Path(proc.stdout.strip().splitlines()[-1]).read_text())
    found = {s["target"] for s in summary["sites"] if s["status"] == "found"}
    assert {"tf-bce", "tf-softmax", "torch-mlp"} <= found, summary["sites"]
    assert summary["run"]["executor"] == "ray"
