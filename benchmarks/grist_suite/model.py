"""The records of the GRIST benchmark suite: one :class:`Subject` per program, its :class:`Bug` s.

The suite re-expresses the 63 programs (79 bugs) of the GRIST paper's benchmark (Yan et al.,
"Exposing numerical bugs in deep learning via gradient back-propagation", FSE 2021; programs
in github.com/Jacob-yen/GRIST, ``scripts/study_case/ID_<n>``) as CDeepFuzz targets. Each
factory file marks the line of every bug's op with a comment ``# GRIST bug <bug id>``, so the
runner can tell whether a finding sits at GRIST's op without a line number kept here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"#\s*GRIST bug\s+([A-Za-z0-9_,\s]+)")


SETTINGS = ("grist", "free")   # GRIST's setting (inputs, and GRIST's gain in [0, 16]); weights free (RANUM's kind)


@dataclass(frozen=True)
class Published:
    """GRIST's own figures for one bug, as its paper reports them (None where it gives none)."""

    iterations: int | None = None      # GRIST's iterations to trigger
    seconds: float | None = None       # GRIST's seconds to trigger
    found: bool | None = None          # did GRIST trigger it


@dataclass(frozen=True)
class Bug:
    id: str                            # "ID_9a": the subject's id and a letter when it has several
    op: str                            # the catalogue op at fault: log, div, sqrt, exp, ...
    entry: str                         # the factory that exposes it (a subject may need one per bug)
    args: dict = field(default_factory=dict)
    grist: Published = Published()
    note: str = ""
    search_weights: bool = False       # GRIST searched a variable, not an input: run with search.search_weights
    # GRIST's setting, where it differs from the above (weights free, the kind of search RANUM makes): the
    # factory's arguments and weight search that search only what GRIST's entry searched, as GRIST bounded it
    grist_setting: dict | None = None

    def setting(self, name: str) -> tuple[dict, bool]:
        """(factory arguments, search_weights) of the bug in a setting: ``"free"`` (the suite's default:
        weights searched freely where GRIST searched a variable) or ``"grist"`` (GRIST's own)."""
        if name == "grist" and self.grist_setting is not None:
            return dict(self.grist_setting["args"]), bool(self.grist_setting["search_weights"])
        if name not in SETTINGS:
            raise ValueError(f"setting must be one of {SETTINGS}, got {name!r}")
        return dict(self.args), bool(self.search_weights)


@dataclass(frozen=True)
class Subject:
    id: int                            # GRIST's subject id (1..63)
    name: str                          # its name in GRIST's dataset_info.md
    framework: str                     # torch | tensorflow
    bugs: tuple[Bug, ...] = ()
    data: str = ""                     # what data it trains on here (synthesised, or shipped with a package)
    runnable: bool = True
    reason: str = ""                   # why not, when it cannot run here
    max_steps: int | None = None       # a budget of its own, below the suite's (a step that costs seconds)

    def budget(self, suite: int) -> int:
        """Steps per op site for this subject in a run of the suite at ``suite`` steps."""
        return min(suite, self.max_steps) if self.max_steps else suite


def marked_lines(entry: str) -> dict[str, list[int]]:
    """Bug id -> line numbers marked ``# GRIST bug <id>`` in the entry's file (repo-relative)."""
    path = ROOT / entry.split(":", 1)[0]
    out: dict[str, list[int]] = {}
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        m = MARK.search(line)
        if m:
            for bug in re.split(r"[,\s]+", m.group(1).strip()):
                if bug:
                    out.setdefault(bug, []).append(n)
    return out
