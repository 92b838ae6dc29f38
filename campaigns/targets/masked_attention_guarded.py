"""Small causal Transformer with an intended ``-inf`` attention mask: clean, no finding expected.

A next-token model over sequences of 12 tokens: learned positional embeddings, a
2-layer ``nn.TransformerEncoder`` (``d_model=32``, 2 heads, ``batch_first=True``,
dropout 0.1) run with the causal mask of
``nn.Transformer.generate_square_subsequent_mask(T)`` (a float mask, ``-inf`` above the
diagonal, built at every forward pass) passed as ``mask=`` with ``is_causal=True``, and a
linear head scored with ``F.cross_entropy``. The searched input is the float token
embeddings (the tokens of a 16-symbol Markov chain looked up in a fixed random table),
bounded to ``[-3, 3]``; the targets are the next token ids. The program trains with AdamW.

Why clean: the ``-inf`` entries are intended; every row of the mask keeps its diagonal,
so the attention softmax always has a finite entry and absorbs the infinities (no NaN).
Every other op is finite for inputs within the bounds (``LayerNorm`` has its ``eps``).
A tool that reports the mask's infinities, or anything else here, has a false positive.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fuzz_core import Target

VOCAB, T, D_MODEL, BOUND = 16, 12, 32, 3.0


class CausalLM(nn.Module):
    def __init__(self, d_model: int = D_MODEL, nhead: int = 2, num_layers: int = 2):
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(T, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=64, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=num_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, emb):                                  # emb: (B, T, d_model)
        t = emb.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        h = self.encoder(emb + self.pos[:t], mask=mask, is_causal=True)
        return self.head(h)


def make_corpus(seed: int):
    rng = np.random.default_rng(seed)
    transition = rng.dirichlet(np.full(VOCAB, 0.3), size=VOCAB)
    table = np.clip(rng.standard_normal((VOCAB, D_MODEL)), -BOUND, BOUND).astype(np.float32)
    return transition, table


def make_target(seed: int = 0, batch: int = 8, lr: float = 1e-3) -> Target:
    torch.manual_seed(seed)
    transition, table = make_corpus(seed)
    model = CausalLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def program(b):
        logits = model(b["emb"])
        return F.cross_entropy(logits.reshape(-1, VOCAB), b["next"].reshape(-1))

    def sample(rng: np.random.Generator):
        tokens = np.empty((batch, T + 1), dtype=np.int64)
        tokens[:, 0] = rng.integers(0, VOCAB, size=batch)
        for t in range(T):
            u = rng.random(batch)[:, None]
            tokens[:, t + 1] = (transition[tokens[:, t]].cumsum(1) < u).sum(1).clip(max=VOCAB - 1)
        return {"emb": table[tokens[:, :T]], "next": tokens[:, 1:]}

    return Target(program=program, sample=sample, model=model, optimizer=optimizer,
                  bounds={"emb": (-BOUND, BOUND)}, search=["emb"])
