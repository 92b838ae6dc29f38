"""``cdeepfuzz replay``: rebuild a finding's target and replay it under the check-only detector.

Exit codes: 0 reproduced, 1 not reproduced, 2 usage (not a finding folder, an untrusted factory),
3 the target could not be built or its program raised (the same line ``cdeepfuzz run`` prints),
5 an internal error of CDeepFuzz.
"""
from __future__ import annotations

from pathlib import Path

from fuzz_core.backends.base import Precision, RunnerOptions
from fuzz_core.engine import TargetSpec, build_runner, replay, replay_verdict
from fuzz_core.findings import FindingError, load_finding
from fuzz_core.loader import EntryError, entry_file


class ReplayError(ValueError):
    """A finding that cannot be replayed as asked (exit 2)."""


class TargetBroken(Exception):
    """The finding's target could not be built, or its program raised (exit 3; 5 when it is CDeepFuzz's)."""

    def __init__(self, name: str, failure) -> None:
        super().__init__(failure.message)
        self.name = name
        self.failure = failure


def build_target(spec: TargetSpec, options: RunnerOptions):
    """The target's runner; its failure classified as :mod:`orchestrator.run.failures` does for ``run``."""
    from orchestrator.run.failures import from_exception

    try:
        return build_runner(spec, options)
    except Exception as exc:  # noqa: BLE001 - the user's factory, or CDeepFuzz: classified
        raise TargetBroken(spec.name, from_exception(exc)) from None


def check_trusted(entry: str, trust: bool) -> None:
    """Only factories inside the current directory tree run, unless the user trusts the finding."""
    if trust:
        return
    try:
        path = entry_file(entry)
    except EntryError as exc:
        raise ReplayError(str(exc)) from None
    cwd = Path.cwd().resolve()
    if path is None or not (path == cwd or cwd in path.parents):
        raise ReplayError(f"the finding's factory {entry!r} is outside the current directory tree "
                          f"({cwd}); run from the project that owns it, or pass --trust")


def check_entry_exists(entry: str, folder: Path) -> None:
    """A finding's factory file is found from here (entries are relative to where the campaign ran)."""
    try:
        path = entry_file(entry)
    except EntryError as exc:
        raise ReplayError(f"{folder}/finding.json: target.entry: {exc}") from None
    if path is not None and not path.is_file():
        raise ReplayError(f"{folder}/finding.json: target.entry: no such file {path} (replay from the folder the "
                          f"campaign ran in: the entry is relative to it)")


def finding_folder(path: Path | str) -> Path:
    """The finding folder a path names: the folder itself, or one of its files (``finding.json``,
    ``values.safetensors``, ``test_reproducer.py``) meaning the folder that holds it."""
    from fuzz_core.findings import REPORT, VALUES
    from fuzz_core.reproducer import TEST_FILE

    path = Path(path)
    if not path.exists():
        raise ReplayError(f"{path}: no such path (give a finding folder: <run>/findings/<name>)")
    if path.is_file():
        if path.name in (REPORT, VALUES, TEST_FILE):
            return path.parent
        raise ReplayError(f"{path}: not a finding folder nor its {REPORT}")
    return path


def replay_folder(folder: Path, trust: bool = False, device: str = "cpu") -> tuple[bool, str]:
    folder = finding_folder(folder)
    try:
        loaded = load_finding(folder)
    except FindingError as exc:
        raise ReplayError(str(exc)) from None
    t = loaded.report["target"]
    entry = t.get("entry")
    if not isinstance(entry, str):
        raise ReplayError(f"{folder}/finding.json: target.entry is missing")
    check_trusted(entry, trust)
    check_entry_exists(entry, folder)
    spec = TargetSpec.from_dict(t)
    # under the precision it was found in (autocast, GradScaler, Keras policy): fp32 when the report has none
    precision = Precision.from_dict(loaded.report.get("precision"))
    runner = build_target(spec, RunnerOptions(device=device, precision=precision))
    site = loaded.site
    try:
        result = replay(runner, loaded)
    except Exception as exc:  # noqa: BLE001 - the program raised (or CDeepFuzz did): classified
        from orchestrator.run.failures import from_exception

        raise TargetBroken(spec.name, from_exception(exc)) from None
    first = result.first_op
    where = f"{first.kind} at {first.position}" if first else "none"
    phase = (f" ({result.phase})" if result.phase and result.phase != "forward" and first is not None
             and result.phase not in first.kind else "")
    ok, _, moves = replay_verdict(result, loaded.report)
    moved = "".join(f"; {m}" for m in moves)
    if ok:
        if loaded.report.get("site_triggered", True):
            return True, f"reproduced: {site.label} ({site.hazard}); first non-finite op: {where}{phase}{moved}"
        return True, f"reproduced: first non-finite op: {where}{phase} (found while searching {site.label}){moved}"
    return False, f"NOT reproduced: {site.label}; first non-finite op: {where}{phase}"
