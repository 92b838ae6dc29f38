"""A start in seconds: recording ops imports no ``torch._dynamo`` (until something compiles).

Each check runs in a fresh interpreter: this one may have imported ``torch._dynamo`` already."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A program with a model and a suspect op, searched a few steps: the recorder, its backward (the
# suspect loss's gradient) and the engine's confirmation all run; no optimizer (PyTorch's own
# Optimizer.step imports torch._dynamo).
PROGRAM = textwrap.dedent("""\
    import sys

    import numpy as np
    import torch

    from fuzz_core import Target
    from fuzz_core.backends.torch import TorchRunner
    from fuzz_core.engine import discover_sites, search_site
    from fuzz_core.search import SearchConfig

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)

    def program(batch):
        return -torch.log(torch.softmax(lin(batch["x"]) * 30, 1)).sum()

    def sample(rng):
        return {"x": rng.uniform(-1, 1, size=(2, 4)).astype(np.float32)}

    runner = TorchRunner("t", Target(program=program, sample=sample, model=lin, bounds={"x": (-1.0, 1.0)},
                                     search=["x"]))
    sites = [s for s in discover_sites(runner, 0) if s.searched]
    result = search_site(runner, sites[0], SearchConfig("adaptive", 30, 0, False))
    print("sites", len(sites), "steps", result.steps)
    print("dynamo before", "torch._dynamo" in sys.modules)
    {after}
    """)


def _python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_recording_and_searching_a_program_imports_no_dynamo():
    out = _python(PROGRAM.replace("{after}", ""))
    assert out.returncode == 0, out.stderr
    assert "sites " in out.stdout and "sites 0" not in out.stdout, out.stdout
    assert "dynamo before False" in out.stdout, out.stdout


def test_once_dynamo_is_imported_the_recorder_runs_with_dynamo_switched_off_and_records_the_same():
    after = textwrap.dedent("""\
        import torch._dynamo
        from fuzz_core.backends.torch_recorder import RecordingMode

        again = [s for s in discover_sites(runner, 0) if s.searched]
        print("same sites", [s.id for s in again] == [s.id for s in sites])
        compiled = torch.compile(program, backend="eager")        # under the recorder: run as written
        runner.target.program = compiled
        print("same sites compiled", [s.id for s in discover_sites(runner, 0) if s.searched] == [s.id for s in sites])
        switched_off = RecordingMode.__torch_dispatch__.__wrapped__.__dynamo_disable
        print("dynamo's own", getattr(switched_off, "_torchdynamo_disable", False)
              and switched_off.__module__.startswith("torch._dynamo"))
        """)
    out = _python(PROGRAM.replace("{after}", after))
    assert out.returncode == 0, out.stderr
    for line in ("same sites True", "same sites compiled True", "dynamo's own True"):
        assert line in out.stdout, out.stdout + out.stderr
