"""Faults injected into real campaigns (real Ray, real MLflow), and what survived them.

Runs the fault-injection tests and turns their outcomes into the table of
benchmarks/RESULTS.md. Each test injects its faults into a running campaign and
fails if any finding is lost or duplicated, so "survived" means "and lost nothing".

    python benchmarks/faults.py
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import table, write_section  # noqa: E402

# test id -> (fault, how many injected)
FAULTS = {
    "tests/test_reliability.py::test_killed_actor_resumes_site_from_checkpoint_and_finds_it[ray.kill]":
        ("actor killed mid-quantum (ray.kill, restarted)", 1),
    "tests/test_reliability.py::test_killed_actor_resumes_site_from_checkpoint_and_finds_it[os.kill]":
        ("actor process SIGKILLed mid-quantum (as a segfault or the OOM killer)", 1),
    "tests/test_reliability.py::test_killed_driver_resumes_with_the_same_findings":
        ("driver SIGKILLed mid-campaign, then --resume", 1),
    "tests/test_reliability.py::test_hanging_quantum_is_killed_and_the_site_retired_as_timeout[2]":
        ("user program hangs on Ray (quantum over its time limit, twice)", 2),
    "tests/test_reliability.py::test_hanging_quantum_is_killed_and_the_site_retired_as_timeout[0]":
        ("user program hangs with --local (quantum interrupted, twice)", 2),
    "tests/test_reliability.py::test_ctrl_c_stops_cleanly_closes_runs_as_killed_and_keeps_findings":
        ("Ctrl-C (SIGINT) mid-campaign", 1),
    "tests/test_tracking_outage.py::test_tracking_outage_loses_no_metric_and_no_finding":
        ("MLflow server stopped and restarted mid-campaign", 1),
    "tests/test_reliability.py::test_factory_breaking_the_contract_is_a_target_error_exit_3":
        ("factory returns the wrong thing / bounds low > high", 2),
    "tests/test_broken_targets.py": ("broken targets on Ray and --local (7 ways), an internal error", 17),
    "tests/test_stopping.py": ("SIGTERM, SIGINT, time limit mid-campaign (--local and Ray)", 6),
    "tests/test_resume.py": ("driver SIGKILLed at 3 commits and inside a quantum, then exact --resume", 4),
    "tests/test_config_errors.py": ("bad campaign files (not YAML, unknown or ill-typed fields, ...)", 30),
}


def main() -> int:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *sorted({k.split("::")[0] for k in FAULTS})]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    outcomes: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"(PASSED|FAILED|ERROR|SKIPPED)\s+(\S+)", line)
        if m:
            outcomes[m.group(2)] = m.group(1)
    rows, injected, survived = [], 0, 0
    for test, (fault, n) in FAULTS.items():
        results = [v for k, v in outcomes.items() if k == test or (test.endswith(".py") and k.startswith(test + "::"))]
        ok = bool(results) and all(r == "PASSED" for r in results)
        injected += n
        survived += n if ok else 0
        rows.append([fault, n, n if ok else 0, 0 if ok else "see test", test.split("::")[-1]])
    body = ("## Faults (issue 6)\n\nEach row is a test that injects the fault into a real campaign (local Ray, "
            "SQLite or served MLflow) and fails if a finding is lost or duplicated.\n\n"
            + table(["fault", "injected", "survived", "findings lost", "test"], rows)
            + f"\n\nTotal: {injected} faults injected, {survived} survived, findings lost: "
              f"{0 if survived == injected else 'see failing tests'}.\n")
    print(body)
    write_section("faults", body)
    return 0 if survived == injected else 1


if __name__ == "__main__":
    sys.exit(main())
