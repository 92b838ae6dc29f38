"""``cdeepfuzz replay``: rebuild a finding's target and replay it under the check-only detector."""
from __future__ import annotations

from pathlib import Path

from fuzz_core.backends.base import RunnerOptions
from fuzz_core.engine import TargetSpec, build_runner, confirmed, replay
from fuzz_core.findings import FindingError, load_finding
from fuzz_core.loader import EntryError, entry_file


class ReplayError(ValueError):
    """A finding that cannot be replayed as asked (exit 2)."""


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


def replay_folder(folder: Path, trust: bool = False, device: str = "cpu") -> tuple[bool, str]:
    try:
        loaded = load_finding(folder)
    except FindingError as exc:
        raise ReplayError(str(exc)) from None
    t = loaded.report["target"]
    entry = t.get("entry")
    if not isinstance(entry, str):
        raise ReplayError(f"{folder}/finding.json: target.entry is missing")
    check_trusted(entry, trust)
    spec = TargetSpec.from_dict(t)
    try:
        runner = build_runner(spec, RunnerOptions(device=device))
    except (EntryError, ImportError, OSError) as exc:
        raise ReplayError(f"cannot build target {spec.name!r}: {exc} (replay from the folder the campaign ran "
                          f"in: the entry is relative to it)") from None
    site = loaded.site
    result = replay(runner, loaded)
    first = result.first_op
    where = f"{first.kind} at {first.location}" if first else "none"
    if confirmed(result, site):
        return True, f"reproduced: {site.label} ({site.hazard}); first non-finite op: {where}"
    return False, f"NOT reproduced: {site.label} stayed finite; first non-finite op: {where}"
