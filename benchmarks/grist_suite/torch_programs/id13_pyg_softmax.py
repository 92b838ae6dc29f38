"""GRIST subject ID_13, "Pytorch_Geometric": the edge softmax of a PyTorch Geometric version whose
``softmax(src, index)`` normalises logs by their group sums.

Re-expressed from GRIST's benchmark, scripts/study_case/ID_13/test/utils/test_softmax.py and
scripts/study_case/ID_13/torch_geometric/utils/softmax.py (github.com/Jacob-yen/GRIST), not
copied. The test loops forever over six edge attributes drawn with ``randint(0, 3)`` (values
0, 1, 2), grouped by their source node ``row = [0, 0, 0, 1, 1, 1]``, and calls
``softmax(edge_attr, row)``, which in this version computes ``out = src.log()`` and divides it
by the ``scatter_add`` of ``out`` over each group (the number of groups is ``row.max() + 1``).
``torch_scatter.scatter_add`` is re-expressed with ``Tensor.scatter_add_``.

Bug ID_13: ``src.log()``: an attribute <= 0 gives ``-inf`` or NaN (and ``-inf / -inf`` is NaN
after the division). The division by a group's sum of logs (0 when the logs cancel) is a
second suspect op, reported beside the bug if found.

Data: attributes drawn as the test draws them (float32 integers in {0, 1, 2}), the index
fixed; batch on dimension 0 is the edge. Edge attributes have no natural range and GRIST
searched them unclipped: bounds ``+-bound`` (``_data.FREE_BOUND``).
"""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.grist_suite.torch_programs._data import FREE_BOUND
from fuzz_core import Target

ROW = np.array([0, 0, 0, 1, 1, 1], dtype=np.int64)


def scatter_add(src, index, dim_size):
    return torch.zeros(dim_size, dtype=src.dtype).scatter_add_(0, index, src)


def softmax(src, index, num_nodes=None):
    num_nodes = int(index.max()) + 1 if num_nodes is None else num_nodes
    out = src.log()  # GRIST bug ID_13
    out = out / scatter_add(out, index, num_nodes)[index]
    return out


def make_target(seed: int = 0, bound: float = FREE_BOUND) -> Target:
    torch.manual_seed(seed)

    def program(batch):
        return softmax(batch["edge_attr"], batch["row"])

    def sample(rng: np.random.Generator):
        return {"edge_attr": rng.integers(0, 3, size=len(ROW)).astype(np.float32), "row": ROW.copy()}

    return Target(program=program, sample=sample, bounds={"edge_attr": (-bound, bound)}, search=["edge_attr"])
