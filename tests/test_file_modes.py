"""Files the tool writes (findings, reports, summaries) are readable as any file the user makes:
mode 0666 less the umask, not the 0600 of the temp file they are written through."""
from __future__ import annotations

import os
import stat

import numpy as np

from fuzz_core.io import atomic_save_arrays, atomic_write_json, file_mode


def test_atomic_files_get_the_users_file_mode(tmp_path):
    old = os.umask(0o022)
    try:
        file_mode.cache_clear()
        atomic_write_json(tmp_path / "finding.json", {"a": 1})
        atomic_save_arrays(tmp_path / "values.safetensors", {"x": np.zeros(3, dtype=np.float32)})
        for name in ("finding.json", "values.safetensors"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    finally:
        os.umask(old)
        file_mode.cache_clear()
