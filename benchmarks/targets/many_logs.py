"""A synthetic program with 100 suspect ops on 100 distinct lines, for scale measurements.

``acc += log(x[:, i] + c[i])``: with ``c[i] = 0`` (every ``bug_every``-th ``i``) the log reaches 0 at the
edge of the bounds (a bug found in a step or two); with ``c[i] = 1`` it never does (its budget is spent).
Each op reads its own input column. Ten targets of this file
make a 1,000-site campaign (``benchmarks/driver_scale.py``, ``tests/test_scale.py``).

Generated once (the 100 lines are spelled out so that each op has its own line; ``ops`` of them run).
"""
from __future__ import annotations

import numpy as np
import torch

from fuzz_core import Target

OPS = 100


def program_of(c: torch.Tensor, n: int):
    def program(batch):
        x = batch["x"]
        acc = torch.zeros(x.shape[0])
        if n > 0: acc = acc + torch.log(x[:, 0] + c[0])
        if n > 1: acc = acc + torch.log(x[:, 1] + c[1])
        if n > 2: acc = acc + torch.log(x[:, 2] + c[2])
        if n > 3: acc = acc + torch.log(x[:, 3] + c[3])
        if n > 4: acc = acc + torch.log(x[:, 4] + c[4])
        if n > 5: acc = acc + torch.log(x[:, 5] + c[5])
        if n > 6: acc = acc + torch.log(x[:, 6] + c[6])
        if n > 7: acc = acc + torch.log(x[:, 7] + c[7])
        if n > 8: acc = acc + torch.log(x[:, 8] + c[8])
        if n > 9: acc = acc + torch.log(x[:, 9] + c[9])
        if n > 10: acc = acc + torch.log(x[:, 10] + c[10])
        if n > 11: acc = acc + torch.log(x[:, 11] + c[11])
        if n > 12: acc = acc + torch.log(x[:, 12] + c[12])
        if n > 13: acc = acc + torch.log(x[:, 13] + c[13])
        if n > 14: acc = acc + torch.log(x[:, 14] + c[14])
        if n > 15: acc = acc + torch.log(x[:, 15] + c[15])
        if n > 16: acc = acc + torch.log(x[:, 16] + c[16])
        if n > 17: acc = acc + torch.log(x[:, 17] + c[17])
        if n > 18: acc = acc + torch.log(x[:, 18] + c[18])
        if n > 19: acc = acc + torch.log(x[:, 19] + c[19])
        if n > 20: acc = acc + torch.log(x[:, 20] + c[20])
        if n > 21: acc = acc + torch.log(x[:, 21] + c[21])
        if n > 22: acc = acc + torch.log(x[:, 22] + c[22])
        if n > 23: acc = acc + torch.log(x[:, 23] + c[23])
        if n > 24: acc = acc + torch.log(x[:, 24] + c[24])
        if n > 25: acc = acc + torch.log(x[:, 25] + c[25])
        if n > 26: acc = acc + torch.log(x[:, 26] + c[26])
        if n > 27: acc = acc + torch.log(x[:, 27] + c[27])
        if n > 28: acc = acc + torch.log(x[:, 28] + c[28])
        if n > 29: acc = acc + torch.log(x[:, 29] + c[29])
        if n > 30: acc = acc + torch.log(x[:, 30] + c[30])
        if n > 31: acc = acc + torch.log(x[:, 31] + c[31])
        if n > 32: acc = acc + torch.log(x[:, 32] + c[32])
        if n > 33: acc = acc + torch.log(x[:, 33] + c[33])
        if n > 34: acc = acc + torch.log(x[:, 34] + c[34])
        if n > 35: acc = acc + torch.log(x[:, 35] + c[35])
        if n > 36: acc = acc + torch.log(x[:, 36] + c[36])
        if n > 37: acc = acc + torch.log(x[:, 37] + c[37])
        if n > 38: acc = acc + torch.log(x[:, 38] + c[38])
        if n > 39: acc = acc + torch.log(x[:, 39] + c[39])
        if n > 40: acc = acc + torch.log(x[:, 40] + c[40])
        if n > 41: acc = acc + torch.log(x[:, 41] + c[41])
        if n > 42: acc = acc + torch.log(x[:, 42] + c[42])
        if n > 43: acc = acc + torch.log(x[:, 43] + c[43])
        if n > 44: acc = acc + torch.log(x[:, 44] + c[44])
        if n > 45: acc = acc + torch.log(x[:, 45] + c[45])
        if n > 46: acc = acc + torch.log(x[:, 46] + c[46])
        if n > 47: acc = acc + torch.log(x[:, 47] + c[47])
        if n > 48: acc = acc + torch.log(x[:, 48] + c[48])
        if n > 49: acc = acc + torch.log(x[:, 49] + c[49])
        if n > 50: acc = acc + torch.log(x[:, 50] + c[50])
        if n > 51: acc = acc + torch.log(x[:, 51] + c[51])
        if n > 52: acc = acc + torch.log(x[:, 52] + c[52])
        if n > 53: acc = acc + torch.log(x[:, 53] + c[53])
        if n > 54: acc = acc + torch.log(x[:, 54] + c[54])
        if n > 55: acc = acc + torch.log(x[:, 55] + c[55])
        if n > 56: acc = acc + torch.log(x[:, 56] + c[56])
        if n > 57: acc = acc + torch.log(x[:, 57] + c[57])
        if n > 58: acc = acc + torch.log(x[:, 58] + c[58])
        if n > 59: acc = acc + torch.log(x[:, 59] + c[59])
        if n > 60: acc = acc + torch.log(x[:, 60] + c[60])
        if n > 61: acc = acc + torch.log(x[:, 61] + c[61])
        if n > 62: acc = acc + torch.log(x[:, 62] + c[62])
        if n > 63: acc = acc + torch.log(x[:, 63] + c[63])
        if n > 64: acc = acc + torch.log(x[:, 64] + c[64])
        if n > 65: acc = acc + torch.log(x[:, 65] + c[65])
        if n > 66: acc = acc + torch.log(x[:, 66] + c[66])
        if n > 67: acc = acc + torch.log(x[:, 67] + c[67])
        if n > 68: acc = acc + torch.log(x[:, 68] + c[68])
        if n > 69: acc = acc + torch.log(x[:, 69] + c[69])
        if n > 70: acc = acc + torch.log(x[:, 70] + c[70])
        if n > 71: acc = acc + torch.log(x[:, 71] + c[71])
        if n > 72: acc = acc + torch.log(x[:, 72] + c[72])
        if n > 73: acc = acc + torch.log(x[:, 73] + c[73])
        if n > 74: acc = acc + torch.log(x[:, 74] + c[74])
        if n > 75: acc = acc + torch.log(x[:, 75] + c[75])
        if n > 76: acc = acc + torch.log(x[:, 76] + c[76])
        if n > 77: acc = acc + torch.log(x[:, 77] + c[77])
        if n > 78: acc = acc + torch.log(x[:, 78] + c[78])
        if n > 79: acc = acc + torch.log(x[:, 79] + c[79])
        if n > 80: acc = acc + torch.log(x[:, 80] + c[80])
        if n > 81: acc = acc + torch.log(x[:, 81] + c[81])
        if n > 82: acc = acc + torch.log(x[:, 82] + c[82])
        if n > 83: acc = acc + torch.log(x[:, 83] + c[83])
        if n > 84: acc = acc + torch.log(x[:, 84] + c[84])
        if n > 85: acc = acc + torch.log(x[:, 85] + c[85])
        if n > 86: acc = acc + torch.log(x[:, 86] + c[86])
        if n > 87: acc = acc + torch.log(x[:, 87] + c[87])
        if n > 88: acc = acc + torch.log(x[:, 88] + c[88])
        if n > 89: acc = acc + torch.log(x[:, 89] + c[89])
        if n > 90: acc = acc + torch.log(x[:, 90] + c[90])
        if n > 91: acc = acc + torch.log(x[:, 91] + c[91])
        if n > 92: acc = acc + torch.log(x[:, 92] + c[92])
        if n > 93: acc = acc + torch.log(x[:, 93] + c[93])
        if n > 94: acc = acc + torch.log(x[:, 94] + c[94])
        if n > 95: acc = acc + torch.log(x[:, 95] + c[95])
        if n > 96: acc = acc + torch.log(x[:, 96] + c[96])
        if n > 97: acc = acc + torch.log(x[:, 97] + c[97])
        if n > 98: acc = acc + torch.log(x[:, 98] + c[98])
        if n > 99: acc = acc + torch.log(x[:, 99] + c[99])
        return -acc.mean()

    return program


def make_target(seed: int = 0, batch: int = 2, bug_every: int = 2, ops: int = OPS) -> Target:
    """``ops`` suspect ops (the first ones of the 100 lines); every ``bug_every``-th of them is a bug."""
    c = torch.tensor([0.0 if i % bug_every == 0 else 1.0 for i in range(OPS)])

    def sample(rng: np.random.Generator):
        return {"x": rng.uniform(0.2, 1.0, (batch, OPS)).astype(np.float32)}

    return Target(program=program_of(c, ops), sample=sample, bounds={"x": (0.0, 1.0)}, search=["x"])
