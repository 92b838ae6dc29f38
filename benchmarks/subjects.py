"""The benchmark subjects: every program in campaigns/targets/, buggy or guarded.

A guarded twin's file name says so (``*_guarded.py``, ``*_clamped.py``); TensorFlow
subjects start with ``tf_``. Mixed-precision subjects (``mp_*``, ``*_mixed*``) are bugs only under
a campaign's ``precision:``: they are not here but in ``benchmarks/precision.py``. Entries are
relative to the repository root.
"""
from __future__ import annotations

from pathlib import Path

TARGETS = Path(__file__).resolve().parent.parent / "campaigns" / "targets"
GUARD_MARKS = ("guarded", "clamped")


def mixed_precision(name: str) -> bool:
    """A subject whose bug needs lower precision (searched by benchmarks/precision.py)."""
    return name.startswith("mp_") or "_mixed" in name


def subject_entry(name: str) -> str:
    """The campaign entry of the subject ``name``."""
    return f"campaigns/targets/{name}.py:make_target"


def _entries(tf: bool) -> tuple[dict[str, str], dict[str, str]]:
    buggy, guarded = {}, {}
    for path in sorted(TARGETS.glob("*.py")):
        name = path.stem
        if name.startswith("_") or name.startswith("tf_") != tf or mixed_precision(name):
            continue
        (guarded if any(m in name for m in GUARD_MARKS) else buggy)[name] = subject_entry(name)
    return buggy, guarded


# the buggy subjects whose bug the default strategy misses, and why (their campaign files say so: campaigns/)
KNOWN_MISS = {"arcface_acos": "a narrow 1 - cos valley: without the removed curvature tactic no search triggers it"}

BUGGY, GUARDED = _entries(tf=False)
BUGGY_TF, GUARDED_TF = _entries(tf=True)
