"""Atomic, pickle-free files: JSON and safetensors, written to a temp name then renamed."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from safetensors.numpy import load_file, save_file


@functools.lru_cache(maxsize=1)
def file_mode() -> int:
    """The mode of a file the user makes (0666 less the umask), read once: ``os.umask`` can only be
    read by setting it, which must not happen while other threads create files."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[tuple[int, str]]:
    """A temp file beside ``path`` (its fd, its name) that replaces ``path`` when the block ends,
    and is removed when it raises. The file gets the mode any file the user makes gets (a temp
    file is 0600: findings and reports must be readable by whoever the user shares them with)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        yield fd, tmp
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with _replacing(path) as (fd, _), os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n").encode())


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return o.as_posix()
    if hasattr(o, "value"):
        return o.value
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def atomic_save_arrays(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Save NumPy arrays as safetensors (never pickle), atomically. Shapes are kept as they are: a 0-d
    array (an optimizer's step, a scalar parameter or buffer) stays 0-d (``np.ascontiguousarray``
    would make it shape (1,), and a replay would restore a tensor of another shape)."""
    with _replacing(path) as (fd, tmp):
        os.close(fd)
        save_file({k: np.asarray(v, order="C") for k, v in arrays.items()}, tmp, metadata=metadata)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    return load_file(str(path))


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
