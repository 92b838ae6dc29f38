"""The single-process engine: build a target, search a site, confirm, minimise.

What the Ray actors call, and what ``cdeepfuzz replay`` uses. No ray, no mlflow.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fuzz_core.backends import detect_framework, load_backend
from fuzz_core.backends.base import CheckResult, RunnerOptions
from fuzz_core.findings import Finding, LoadedFinding
from fuzz_core.loader import call_factory, load_factory
from fuzz_core.search import Candidate, QuantumResult, SearchConfig, SiteSearch
from fuzz_core.sites import OpSite

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetSpec:
    """How to build one target: the campaign's ``targets:`` entry, resolved."""

    name: str
    entry: str
    args: dict[str, Any] = field(default_factory=dict)
    framework: str | None = None
    seed: int = 0
    base_dir: str | None = None      # where relative entries are resolved (the campaign's cwd)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "entry": self.entry, "args": dict(self.args),
                "framework": self.framework, "seed": self.seed}


def build_runner(spec: TargetSpec, options: RunnerOptions = RunnerOptions()):
    """Import the factory, build the target, wrap it in its framework's runner."""
    base = Path(spec.base_dir) if spec.base_dir else None
    factory = load_factory(spec.entry, base)
    target = call_factory(factory, spec.seed, dict(spec.args))
    framework = spec.framework or detect_framework(target)
    backend = load_backend(framework)
    return backend.make_runner(spec.name, target, options)


def confirm(runner, site: OpSite, inputs: dict[str, np.ndarray], state: dict | None, seed: int) -> CheckResult:
    """Replay on the factory's state (plus saved weights): does the same op go non-finite again?"""
    runner.reset()
    if state:
        runner.set_state(state)
    return runner.check(inputs, seed)


def confirmed(result: CheckResult, site: OpSite) -> bool:
    return bool(result.triggered.get(site.key, False))


def minimise(runner, site: OpSite, inputs: dict[str, np.ndarray], state: dict | None,
             seed: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Shrink the batch to the fewest rows that still trigger the site (often one)."""
    n = next(iter(inputs.values())).shape[0]
    checks = 0

    def triggers(rows: list[int]) -> bool:
        nonlocal checks
        checks += 1
        subset = {k: v[rows] for k, v in inputs.items()}
        try:
            return confirmed(confirm(runner, site, subset, state, seed), site)
        except Exception:  # noqa: BLE001 - a program that needs its full batch: keep it
            return False

    t0 = time.perf_counter()
    rows = list(range(n))
    for i in range(n):                          # one row alone, the common case
        if n > 1 and triggers([i]):
            rows = [i]
            break
    else:
        chunk = len(rows) // 2                  # otherwise drop halves, quarters, ... (ddmin-like)
        while chunk >= 1 and len(rows) > 1:
            changed = False
            for start in range(0, len(rows), chunk):
                keep = rows[:start] + rows[start + chunk:]
                if keep and triggers(keep):
                    rows, changed = keep, True
                    break
            if not changed:
                chunk //= 2
    t_min = time.perf_counter()
    small = {k: v[rows] for k, v in inputs.items()}
    t_replay = time.perf_counter()
    confirm(runner, site, small, state, seed)
    replay_small = time.perf_counter() - t_replay
    t_replay = time.perf_counter()
    confirm(runner, site, inputs, state, seed)
    replay_full = time.perf_counter() - t_replay
    info = {"original_batch_size": int(n), "batch_size": len(rows), "rows": rows, "checks": checks,
            "seconds": round(t_min - t0, 4), "replay_seconds_original": round(replay_full, 5),
            "replay_seconds_minimised": round(replay_small, 5)}
    return small, info


def finding_from(runner, spec: TargetSpec, site: OpSite, config: SearchConfig, cand: Candidate,
                 seconds: float, device: str = "cpu", minimise_batch: bool = True) -> Finding | None:
    """Confirm a candidate by replay; minimise it; return the finding, or None if it does not replay."""
    result = confirm(runner, site, cand.values, cand.state, cand.seed)
    if not confirmed(result, site):
        log.info("candidate for %s did not replay: discarded", site.label)
        return None
    inputs, info = dict(cand.values), {}
    if minimise_batch:
        inputs, info = minimise(runner, site, cand.values, cand.state, cand.seed)
        result = confirm(runner, site, inputs, cand.state, cand.seed)
    first = result.first_op.to_dict() if result.first_op else None
    return Finding(site=site, target=spec.to_dict(), inputs=inputs, state=cand.state, step=cand.step,
                   step_seed=cand.seed, strategy=config.strategy, first_op=first,
                   trigger="weights" if cand.weights_searched else "inputs", training=cand.training,
                   bounds=cand.bounds, seconds=seconds, minimised=info, versions=runner.versions(),
                   device=device)


def replay(runner, loaded: LoadedFinding) -> CheckResult:
    """Replay a saved finding on a freshly built runner."""
    return confirm(runner, loaded.site, loaded.inputs, loaded.state, int(loaded.report["step_seed"]))


def search_site(runner, site: OpSite, config: SearchConfig) -> QuantumResult:
    """Search one site to the end of its budget in this process (no scheduler)."""
    search = SiteSearch(runner, site, config)
    return search.run(config.max_steps)
