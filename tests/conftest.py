"""Shared test setup: run from the repo root, one thread per torch process, one Ray per session."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.chdir(REPO)   # op-site locations and campaign entries are relative to the current directory
# what CDeepFuzz keeps once per machine (the empty MLflow store) is this session's own, for its subprocesses too
os.environ.setdefault("CDEEPFUZZ_CACHE", tempfile.mkdtemp(prefix="cdeepfuzz-cache-"))

try:
    import torch

    torch.set_num_threads(1)   # a 2-core shared machine: OpenMP spin-waits cost 10x on tiny programs
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def ray_session():
    """One real local Ray for the whole test session (starting one costs seconds)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, _node_ip_address="127.0.0.1")   # loopback only
    yield ray
    ray.shutdown()


@pytest.fixture
def short_pretraining(tmp_path, monkeypatch):
    """A GRIST suite bug's factory arguments with the program's own training before the search cut
    to 2 steps (the VAE sqrt entries train 27,500 first: minutes, where a test checks structure),
    its trained weights kept in a temporary folder instead of the suite's cache."""
    monkeypatch.setenv("GRIST_SUITE_PRETRAINED", str(tmp_path / "pretrained"))

    def short(args: dict) -> dict:
        args = dict(args)
        if "pretrain_steps" in args:
            args["pretrain_steps"] = min(2, int(args["pretrain_steps"]))
        return args

    return short
