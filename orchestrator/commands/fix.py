"""``cdeepfuzz fix FINDING``: suggest a guard at the op and verify it by searching the guarded program.

Exit codes as ``replay``: 0 verified, 1 not, 2 usage, 3 the target could not be built or its program
raised (the same line as ``cdeepfuzz run``), 5 an internal error of CDeepFuzz."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def fix(folder: Path, budget: int, trust: bool = False, device: str = "cpu") -> dict[str, Any]:
    """The ``fix`` section written into the finding (FindingError/ReplayError for usage, TargetBroken)."""
    from fuzz_core.backends.base import RunnerOptions
    from fuzz_core.engine import TargetSpec
    from fuzz_core.findings import load_finding
    from fuzz_core.fixes import suggest_and_verify
    from orchestrator.commands.replay import TargetBroken, build_target, check_entry_exists, check_trusted
    from orchestrator.run.failures import from_exception

    report = load_finding(folder).report
    entry = str(report["target"].get("entry", ""))
    check_trusted(entry, trust)
    check_entry_exists(entry, folder)
    runner = None
    if (report["target"].get("framework") or "torch") == "torch":
        runner = build_target(TargetSpec.from_dict(report["target"]),
                              RunnerOptions(device=device, search_weights=report.get("trigger") == "weights"))
    try:
        return suggest_and_verify(folder, budget, device=device, runner=runner)
    except Exception as exc:  # noqa: BLE001 - the program raised under the guard, or CDeepFuzz did
        raise TargetBroken(str(report["target"].get("name", "")), from_exception(exc)) from None
