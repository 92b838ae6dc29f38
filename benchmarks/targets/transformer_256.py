"""A compute-heavy, guarded subject for the scaling and overhead benchmarks.

A 2-layer causal Transformer encoder (d_model 256, 4 heads, PyTorch's own
``nn.TransformerEncoderLayer`` with the causal ``-inf`` mask) over searched float
token embeddings, followed by a hand-written RMS norm with an eps and a hand-written
cross-entropy with ``log(p + 1e-6)``. Every suspect op is guarded, so no finding ends
a site early: each site spends its whole budget, which is what a throughput
measurement needs.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target


class TinyLM(nn.Module):
    def __init__(self, d_model: int = 256, heads: int = 4, layers: int = 2, vocab: int = 64, seq: int = 32):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, emb):
        h = self.encoder(emb, mask=self.mask, is_causal=True)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)     # RMS norm, with its eps
        return self.head(h)


def make_target(seed: int = 0, batch: int = 8, seq: int = 32, d_model: int = 256, **_) -> Target:
    torch.manual_seed(seed)
    model = TinyLM(d_model=d_model, seq=seq)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def program(b):
        logits = model(b["emb"])
        p = torch.softmax(logits, -1)
        return -(b["y"] * torch.log(p + 1e-6)).sum(-1).mean()

    def sample(rng: np.random.Generator):
        y = np.eye(64, dtype=np.float32)[rng.integers(0, 64, size=(batch, seq))]
        return {"emb": rng.normal(0, 1, size=(batch, seq, d_model)).astype(np.float32), "y": y}

    return Target(program=program, sample=sample, model=model, optimizer=opt,
                  bounds={"emb": (-3.0, 3.0)}, search=["emb"])
