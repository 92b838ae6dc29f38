"""Findings: confirmed bugs, their folders, and their signatures.

A finding folder holds two files with fixed names:

* ``finding.json``: the report (site, hazard, first op that went non-finite and
  where, step, seeds, strategy, trigger, training, bounds, minimisation, versions,
  replay command). Written last: its presence means the folder is complete.
* ``values.safetensors``: the external values: ``input.<name>`` for every input
  of the batch and, when the weights differ from the factory's (searched or
  trained), ``state.<key>`` for the model and optimizer state.
* ``test_reproducer.py``: the finding as a pytest regression test (see
  :mod:`fuzz_core.reproducer`): it fails while the bug is there and passes once
  the program is fixed.
"""
from __future__ import annotations

import hashlib
import platform
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from fuzz_core.io import atomic_save_arrays, atomic_write_json, load_arrays, read_json
from fuzz_core.sites import OpSite, position, source_line

SCHEMA_VERSION = 1
REPORT = "finding.json"
VALUES = "values.safetensors"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Bug:
    """What a finding shows to be wrong, whichever search found it: the op that went non-finite
    first (its catalogue row: ``log``, ``log_grad`` for a backward hazard, ``div``, ...), the user's
    call that ran it (``path:line`` and column), the hazard, and the direction (phase) in which it
    went non-finite. Its :attr:`signature` is the key of one bug across sites, runs, seeds and
    campaigns: two searches that drive the same call out of its domain in the same direction found
    one bug. Not the target (two targets built from one program file share its bugs), nor the
    call's occurrence in a pass (a loop runs one call many times: one line of code to fix), which
    is kept to name the site it is at."""

    op: str
    kind: str
    location: str              # repo-relative "path:line"
    column: int | None
    hazard: str
    phase: str = "forward"     # forward | backward | update: the direction in which it went non-finite
    occurrence: int = 0

    @property
    def signature(self) -> str:
        return signature(self.op, self.location, self.hazard, self.phase, self.column)

    @property
    def position(self) -> str:
        """``path:line:col`` (``path:line`` when the column is unknown)."""
        return position(self.location, self.column)

    def to_dict(self) -> dict[str, Any]:
        return {"signature": self.signature, "op": self.op, "kind": self.kind, "location": self.location,
                "column": self.column, "position": self.position, "hazard": self.hazard, "phase": self.phase,
                "occurrence": self.occurrence}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Bug":
        column = d.get("column")
        return cls(str(d.get("op", "")), str(d.get("kind", "")), str(d.get("location", "")),
                   int(column) if isinstance(column, int) and column > 0 else None, str(d.get("hazard", "")),
                   str(d.get("phase") or "forward"), int(d.get("occurrence", 0) or 0))


def signature(op: str, location: str, hazard: str, phase: str = "forward", column: int | None = None) -> str:
    """Dedupe key of a bug (:class:`Bug`): the same bug found twice has the same signature."""
    key = f"{op}\x00{position(location, column)}\x00{hazard}\x00{phase}"
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def bug_of(site: dict[str, Any], site_triggered: bool, first_op: dict[str, Any] | None, phase: str) -> Bug:
    """The bug a finding shows: its site's hazard when the site's own op fired, else the op that went
    non-finite first (or the training step's), in its phase, named by the catalogue's row for that
    phase when it has one (so the bug has the signature its own site's search gives it), else by the
    op's kind in its phase."""
    phase = str(phase or "forward")
    if site_triggered or not first_op:
        return Bug(str(site.get("op", "")), str(site.get("kind", "")), str(site.get("location", "")),
                   _column(site), str(site.get("hazard", "")), phase, int(site.get("occurrence", 0) or 0))
    from fuzz_core.catalogue import DEFAULT_CATALOGUE

    op, kind = str(first_op.get("op", "")), str(first_op.get("kind", ""))
    name = f"{op}_grad" if phase == "backward" else op
    try:
        spec = DEFAULT_CATALOGUE[name]
        name, hazard = spec.name, spec.hazard
    except KeyError:
        name, hazard = op, f"{phase}: {kind}"
    return Bug(name, kind, str(first_op.get("location", "")), _column(first_op), hazard, phase,
               int(first_op.get("occurrence", 0) or 0))


def report_bug(report: dict[str, Any]) -> Bug:
    """:func:`bug_of` of a finding report's site and first op as they stand (a report whose locations
    were moved to where their code sits now gets the bug it is there)."""
    return bug_of(report["site"], bool(report.get("site_triggered", True)), report.get("first_op"),
                  str(report.get("phase") or "forward"))


def report_signature(report: dict[str, Any]) -> str:
    """The signature of :func:`report_bug` (not the report's recorded ``signature``)."""
    return report_bug(report).signature


def _column(entry: dict[str, Any]) -> int | None:
    column = entry.get("column")
    return column if isinstance(column, int) and column > 0 else None


@dataclass
class Finding:
    """A confirmed bug, with everything needed to replay it."""

    site: OpSite
    target: dict[str, Any]               # name, entry, args, framework, seed
    inputs: dict[str, np.ndarray]
    state: dict[str, np.ndarray] | None  # model/optimizer state when it is not the factory's
    step: int                            # the site's step at which it triggered
    step_seed: int
    strategy: str
    first_op: dict[str, Any] | None
    trigger: str                         # "inputs" | "weights"
    training: bool
    bounds: dict[str, tuple[float, float]]
    seconds: float = 0.0
    minimised: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"
    phase: str = "forward"               # where the first non-finite value arose: forward | backward | update
    replays: tuple[int, int] = (1, 1)    # (reproduced, of): fresh replays that went non-finite at the same op
    notes: list[str] = field(default_factory=list)   # for people: values outside the sampled data, ...
    site_triggered: bool = True          # the searched site's own hazard fired (else first_op is another op)
    precision: dict[str, Any] = field(default_factory=lambda: {"autocast": None, "grad_scaler": False, "policy": None})
    precision_only: bool | None = None   # mixed precision: the float32 program stays finite on the same values
    overflow: dict[str, Any] | None = None   # mixed precision: dtype, and value/limit/excess of a half_overflow
    scaler_skips: int | None = None      # precision.grad_scaler: consecutive steps the GradScaler skipped on it
    known_as: str | None = None          # the signature of the known bug it is, found before its line of code moved

    @property
    def flaky(self) -> bool:
        """Some fresh replays reproduced it, not all (randomness the engine cannot re-seed)."""
        return self.replays[0] < self.replays[1]

    @property
    def bug(self) -> Bug:
        """The bug it shows: the searched site's hazard, or, when another op (or the training step)
        went non-finite first, that op in its phase."""
        return bug_of(self.site.to_dict(), self.site_triggered, self.first_op, self.phase)

    @property
    def signature(self) -> str:
        return self.known_as or self.bug.signature

    @property
    def folder_name(self) -> str:
        """``<target>-<bug's op>-<searched site's id>-s<step>``: one per finding of a run (a site's
        search finds at most one candidate per step); :func:`finding_folder` makes it unique in a
        folder that other runs of the same target name share."""
        return _SAFE.sub("_", f"{self.site.target}-{self.bug.op}-{self.site.id}-s{self.step}")

    def report(self, folder: Path | None = None) -> dict[str, Any]:
        batch = next(iter(self.inputs.values())).shape[0] if self.inputs else 0
        replay = f"cdeepfuzz replay {folder.as_posix()}" if folder is not None else "cdeepfuzz replay <this folder>"
        return {
            "schema_version": SCHEMA_VERSION,
            "site": with_code(self.site.to_dict()),
            "hazard": self.site.hazard,
            "signature": self.signature,
            "bug": {**self.bug.to_dict(), "signature": self.signature},
            "first_op": with_code(dict(self.first_op)) if self.first_op else self.first_op,
            "phase": self.phase,
            "site_triggered": self.site_triggered,
            "replays": {"reproduced": int(self.replays[0]), "of": int(self.replays[1])},
            "flaky": self.flaky,
            "notes": list(self.notes),
            "step": self.step,
            "step_seed": self.step_seed,
            "seconds": round(self.seconds, 4),
            "strategy": self.strategy,
            "trigger": self.trigger,
            "training": self.training,
            "target": self.target,
            "bounds": {k: list(v) for k, v in self.bounds.items()},
            "batch_size": int(batch),
            "minimised": self.minimised,
            "device": self.device,
            "precision": dict(self.precision),
            "precision_only": self.precision_only,
            "overflow": self.overflow,
            "scaler_skips": self.scaler_skips,
            "versions": {"cdeepfuzz": _version(), "python": platform.python_version(),
                         "numpy": np.__version__, **self.versions},
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "replay": replay,
        }

    def arrays(self) -> dict[str, np.ndarray]:
        return value_arrays(self.inputs, self.state)


def with_code(entry: dict[str, Any]) -> dict[str, Any]:
    """A site's or first op's dict with ``code``, the line of code its location names: a replay after
    an edit elsewhere in the file (a line added above) finds the op where that line sits now."""
    code = source_line(str(entry.get("location", "")))
    if code is not None:
        entry["code"] = code
    return entry


def value_arrays(inputs: dict[str, Any], state: dict[str, Any] | None) -> dict[str, np.ndarray]:
    """The safetensors layout of external values: ``input.<name>``, then ``state.<key>``."""
    arrays = {"input." + k: np.asarray(v) for k, v in inputs.items()}
    arrays.update({"state." + k: np.asarray(v) for k, v in (state or {}).items()})
    return arrays


def write_finding(finding: Finding, folder: Path, display: Path | None = None, root: Path | None = None) -> Path:
    """Write the folder atomically: values and the pytest reproducer first, then the report that
    marks it complete. ``root``: the folder the target's entry is relative to (default: the current
    directory, where a campaign resolves its entries)."""
    from fuzz_core.reproducer import write_reproducer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    report = finding.report(display or folder)
    atomic_save_arrays(folder / VALUES, finding.arrays(), metadata={"signature": finding.signature})
    write_reproducer(folder, report, root)
    atomic_write_json(folder / REPORT, report)
    return folder


def finding_folder(findings_dir: Path, finding: Finding) -> tuple[Path, bool]:
    """Where ``finding`` goes under ``findings_dir``, and whether it is there already. Its
    :attr:`Finding.folder_name`, unless that folder holds another finding (the same target name with
    other arguments, as a benchmark that builds variants of one program under one name): then the
    first free ``<name>-2``, ``<name>-3`` ... A folder that holds this very finding (the same target,
    arguments, site and step: a driver killed after writing it and resumed finds it again) is kept."""
    base = findings_dir / finding.folder_name
    for n in range(1, 10_000):
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        report = folder / REPORT
        if not folder.exists():
            return folder, False
        if report.is_file():
            try:
                old = read_json(report)
            except (OSError, ValueError):
                continue
            if _same_finding(old, finding):
                return folder, True
    raise FindingError(f"{findings_dir}: no free folder name for {finding.folder_name}")


def _same_finding(report: dict[str, Any], finding: Finding) -> bool:
    target = report.get("target") or {}
    return ((report.get("site") or {}).get("id") == finding.site.id and int(report.get("step", -1)) == finding.step
            and all(target.get(k) == finding.target.get(k) for k in ("name", "entry", "args", "seed")))


@dataclass
class LoadedFinding:
    folder: Path
    report: dict[str, Any]
    inputs: dict[str, np.ndarray]
    state: dict[str, np.ndarray] | None

    @property
    def site(self) -> OpSite:
        return OpSite.from_dict(self.report["site"])


class FindingError(ValueError):
    """A finding folder that is incomplete, malformed or unsafe."""


def load_finding(folder: Path) -> LoadedFinding:
    folder = Path(folder)
    report_path, values_path = folder / REPORT, folder / VALUES
    for p in (report_path, values_path):
        if p.is_symlink():
            raise FindingError(f"{p}: refusing a symbolic link in a finding folder")
        if not p.is_file():
            raise FindingError(f"{folder}: not a finding folder (no {p.name})")
    try:
        report = read_json(report_path)
        arrays = load_arrays(values_path)
    except Exception as exc:  # noqa: BLE001 - any decoding problem is the folder's
        raise FindingError(f"{folder}: cannot read the finding: {exc}") from None
    if not isinstance(report, dict) or "site" not in report or "target" not in report:
        raise FindingError(f"{report_path}: missing 'site' or 'target'")
    inputs = {k[6:]: v for k, v in arrays.items() if k.startswith("input.")}
    state = {k[6:]: v for k, v in arrays.items() if k.startswith("state.")} or None
    return LoadedFinding(folder, report, inputs, state)


def _version() -> str:
    from fuzz_core import __version__

    return __version__
