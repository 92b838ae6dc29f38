"""campaigns/tools/probe.py (a development aid) measures the input its SUSPECT table names."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _probe():
    spec = importlib.util.spec_from_file_location("probe_tool", ROOT / "campaigns" / "tools" / "probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_each_call_is_measured_on_the_input_its_table_row_names():
    probe = _probe()
    a, b = torch.tensor([3.0, -4.0]), torch.tensor([0.5, -2.0])
    with probe.Probe() as p:
        torch.div(a, b)
        torch.reciprocal(b)
        torch.xlogy(a, b.abs())
    div, rec, xlogy = p.calls
    assert torch.equal(probe.margin(div.name, div.args, div.arg), b.abs())    # the divisor
    assert torch.equal(probe.margin(rec.name, rec.args, rec.arg), b.abs())    # reciprocal's only input
    assert torch.equal(probe.margin(xlogy.name, xlogy.args, xlogy.arg), b.abs())  # xlogy's y
