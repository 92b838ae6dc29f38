"""A program's own training before GRIST's search, trained once and kept on disk.

Some of GRIST's entry files train the program first and only then search it (the VAE chapters'
sqrt entries: 50 epochs, 27,500 Adam steps). Every build of such a target, the search's and each
fresh replay's, must start from the same weights; training them anew takes minutes per build.
:func:`pretrain` trains once (:func:`benchmarks.grist_suite.tf_programs._common.pretrain`) and keeps
the trained variables, the optimizer's slots among them, as a safetensors file in :data:`FOLDER` (or
the folder that ``$GRIST_SUITE_PRETRAINED`` names), under a key of the graph's definition (its initialisers' seeds
included), the steps, the seed and TensorFlow's version. A missing or unreadable file is trained
anew and written whole (a build running beside it reads the old file or the new one, never half).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from safetensors import SafetensorError

from fuzz_core.io import atomic_save_arrays, load_arrays

FOLDER = Path(__file__).resolve().parent / ".cache" / "pretrained"    # git-ignored


def key(graph, steps: int, seed: int) -> str:
    import tensorflow as tf

    digest = hashlib.sha256(graph.as_graph_def().SerializeToString(deterministic=True))
    digest.update(f"{steps}:{seed}:{tf.__version__}".encode())
    return digest.hexdigest()[:20]


def folder() -> Path:
    return Path(os.environ.get("GRIST_SUITE_PRETRAINED") or FOLDER)


def path(graph, steps: int, seed: int) -> Path:
    return folder() / f"{key(graph, steps, seed)}.safetensors"


def pretrain(target, steps: int, seed: int) -> None:
    """Train ``target`` (a graph target) for ``steps`` steps of its own train op, or load the variables
    such a training left (a safetensors file, one tensor per variable, named as the variable is)."""
    from benchmarks.grist_suite.tf_programs._common import pretrain as train, v1

    if steps <= 0:
        return
    session = target.session
    variables = session.graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)
    file = path(session.graph, steps, seed)
    try:
        saved = load_arrays(file)
    except (OSError, SafetensorError):      # missing, truncated, not safetensors at all
        saved = {}
    if sorted(saved) == sorted(v.name for v in variables) and all(
            saved[v.name].shape == tuple(v.shape) for v in variables):
        with session.graph.as_default():
            for var in variables:
                var.load(saved[var.name], session)
        return
    train(target, steps, seed)
    atomic_save_arrays(file, dict(zip((v.name for v in variables), session.run(variables))))
