"""A program's own training before GRIST's search, trained once and kept on disk.

Some of GRIST's entry files train the program first and only then search it (the VAE chapters'
sqrt entries: 50 epochs, 27,500 Adam steps). Every build of such a target, the search's and each
fresh replay's, must start from the same weights; training them anew takes minutes per build.
:func:`pretrain` trains once (:func:`benchmarks.grist_suite.tf_programs._common.pretrain`) and keeps
the trained variables, the optimizer's slots among them, in :data:`FOLDER` (or the folder that
``$GRIST_SUITE_PRETRAINED`` names), under a key of the graph's definition (its initialisers' seeds
included), the steps, the seed and TensorFlow's version. A missing or unreadable file is trained
anew and written whole (a build running beside it reads the old file or the new one, never half).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

FOLDER = Path(__file__).resolve().parent / ".cache" / "pretrained"    # git-ignored


def key(graph, steps: int, seed: int) -> str:
    import tensorflow as tf

    digest = hashlib.sha256(graph.as_graph_def().SerializeToString(deterministic=True))
    digest.update(f"{steps}:{seed}:{tf.__version__}".encode())
    return digest.hexdigest()[:20]


def folder() -> Path:
    return Path(os.environ.get("GRIST_SUITE_PRETRAINED") or FOLDER)


def pretrain(target, steps: int, seed: int) -> bool:
    """Train ``target`` (a graph target) for ``steps`` steps of its own train op, or load the variables
    such a training left. True when they were loaded from disk."""
    from benchmarks.grist_suite.tf_programs._common import pretrain as train, v1

    if steps <= 0:
        return False
    session = target.session
    variables = sorted(session.graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES), key=lambda v: v.name)
    path = folder() / f"{key(session.graph, steps, seed)}.npz"
    try:
        with np.load(path) as saved:
            values = [saved[f"v{i}"] for i in range(len(variables))]
        if len(saved.files) == len(variables) and all(v.shape == tuple(var.shape) for v, var in zip(values, variables)):
            with session.graph.as_default():
                for var, value in zip(variables, values):
                    var.load(value, session)
            return True
    except (OSError, KeyError, ValueError):
        pass
    train(target, steps, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **{f"v{i}": value for i, value in enumerate(session.run(variables))})
    os.replace(tmp, path)
    return False
