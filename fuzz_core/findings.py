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
from fuzz_core.sites import OpSite, source_line

SCHEMA_VERSION = 1
REPORT = "finding.json"
VALUES = "values.safetensors"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def signature(target: str, op: str, location: str, hazard: str) -> str:
    """Dedupe key of a bug: the same bug found twice has the same signature."""
    return hashlib.sha1(f"{target}\x00{op}\x00{location}\x00{hazard}".encode()).hexdigest()[:16]


def bug_signature(site: dict[str, Any], site_triggered: bool, first_op: dict[str, Any] | None, phase: str) -> str:
    """The signature of the bug a finding shows: its site's hazard, or, when another op (or the
    training step) went non-finite first, that op in its phase."""
    if site_triggered or not first_op:
        return signature(site["target"], site["op"], site["location"], site["hazard"])
    return signature(site["target"], *bug_of(first_op, phase))


def report_signature(report: dict[str, Any]) -> str:
    """:func:`bug_signature` of a finding report's site and first op as they stand (not its recorded
    ``signature``: a report whose locations were moved to where their code sits now gets the
    signature the bug has there)."""
    return bug_signature(report["site"], bool(report.get("site_triggered", True)), report.get("first_op"),
                         str(report.get("phase") or "forward"))


def bug_of(first_op: dict[str, Any], phase: str) -> tuple[str, str, str]:
    """(op, location, hazard) of the bug a first non-finite op names: the catalogue's row when
    the op has one for that phase (so the bug has the signature its own site's search gives it),
    else the op's kind in its phase."""
    from fuzz_core.catalogue import DEFAULT_CATALOGUE

    op, kind, location = str(first_op.get("op", "")), str(first_op.get("kind", "")), str(first_op.get("location", ""))
    name = f"{op}_grad" if phase == "backward" else op
    try:
        spec = DEFAULT_CATALOGUE[name]
    except KeyError:
        return op, location, f"{phase}: {kind}"
    return spec.name, location, spec.hazard


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
    def signature(self) -> str:
        """The bug: the searched site's hazard, or, when another op (or the training step) went
        non-finite first, that op in its phase."""
        if self.known_as:
            return self.known_as
        return bug_signature(self.site.to_dict(), self.site_triggered, self.first_op, self.phase)

    @property
    def folder_name(self) -> str:
        return _SAFE.sub("_", f"{self.site.target}-{self.site.op}-{self.site.id}")

    @property
    def passed_folder_name(self) -> str:
        """The folder of another op's finding that the site's search stepped past (:meth:`SiteSearch.step_past`):
        beside the site's own, which a later finding of the same search takes."""
        return f"{self.folder_name}-passed-{self.step}"

    def report(self, folder: Path | None = None) -> dict[str, Any]:
        batch = next(iter(self.inputs.values())).shape[0] if self.inputs else 0
        replay = f"cdeepfuzz replay {folder.as_posix()}" if folder is not None else "cdeepfuzz replay <this folder>"
        return {
            "schema_version": SCHEMA_VERSION,
            "site": with_code(self.site.to_dict()),
            "hazard": self.site.hazard,
            "signature": self.signature,
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
