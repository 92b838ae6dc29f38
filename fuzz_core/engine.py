"""The single-process engine: build a target, search a site, confirm, minimise.

What the Ray actors call, and what ``cdeepfuzz replay`` uses. No ray, no mlflow.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fuzz_core.backends import detect_framework, load_backend
from fuzz_core.backends.base import NOT_LOCATED, CheckResult, Precision, RunnerOptions
from fuzz_core.findings import Finding, LoadedFinding
from fuzz_core.loader import call_factory, load_factory
from fuzz_core.search import Candidate, QuantumResult, SearchConfig, SiteSearch, site_rng
from fuzz_core.sites import OpSite, relocated, site_id

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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TargetSpec":
        """The spec a finding's ``target`` section (written by :meth:`to_dict`) describes."""
        return cls(d["name"], d["entry"], dict(d.get("args") or {}), d.get("framework"), int(d.get("seed", 0)))


def build_runner(spec: TargetSpec, options: RunnerOptions = RunnerOptions()):
    """Import the factory, build the target, wrap it in its framework's runner."""
    base = Path(spec.base_dir) if spec.base_dir else None
    factory = load_factory(spec.entry, base)
    precision = options.precision
    framework = spec.framework or ("tensorflow" if precision.policy else "torch" if precision.autocast else None)
    prepare = getattr(load_backend(framework), "prepare", None) if framework and precision.mixed else None
    with prepare(options) if prepare is not None else contextlib.nullcontext():   # e.g. a Keras policy
        target = call_factory(factory, spec.seed, dict(spec.args))
    framework = framework or detect_framework(target)
    backend = load_backend(framework)
    runner = backend.make_runner(spec.name, target, options)
    runner.target_spec = spec        # what a float32 twin is rebuilt from (the fp32 re-check)
    return runner


DISCOVERY_SALT = 0x5EED        # the discovery batch's RNG: campaign seed and this salt


def discover_sites(runner, seed: int) -> list[OpSite]:
    """The op sites of one forward pass on the factory's state and the campaign's discovery batch."""
    runner.reset()
    return runner.discover(runner.sample(np.random.default_rng([seed, DISCOVERY_SALT])), seed)


def confirm(runner, site: OpSite, inputs: dict[str, np.ndarray], state: dict | None, seed: int) -> CheckResult:
    """Replay on the factory's state (plus saved weights): does the same op go non-finite again?"""
    runner.reset()
    if state:
        runner.set_state(state)
    return runner.check(inputs, seed)




def same_op(a: Any, b: Any) -> bool:
    """Two first ops (OpRef or its dict) name the same op; a location the search could not name
    (it names only catalogued ops) matches any location of the same kind."""
    if a is None or b is None:
        return a is None and b is None
    a = a if isinstance(a, dict) else a.to_dict()
    b = b if isinstance(b, dict) else b.to_dict()
    if a.get("op") != b.get("op"):
        return False
    la, lb = str(a.get("location", "")), str(b.get("location", ""))
    if la.startswith(NOT_LOCATED) or lb.startswith(NOT_LOCATED):
        return True
    return la == lb and int(a.get("occurrence", 0)) == int(b.get("occurrence", 0))


def confirmed(result: CheckResult, site: OpSite, expected: Any = None) -> bool:
    """Does a replay reproduce what the search saw? The site's own hazard (the default), or, for
    a candidate that another op (or the training step) produced, the same first op in the same
    phase. ``expected``: a :class:`Candidate` or a finding report (``site_triggered``, ``phase``,
    ``first_op``)."""
    own, phase, first = _expectation(expected)
    if own:
        return bool(result.triggered.get(site.key, False))
    return bool(result.event) and (result.phase or "forward") == phase and same_op(result.first_op, first)


def moved(report: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A finding's report with its site's and its first op's locations where their recorded lines of
    code sit now, and a note per move. An edit elsewhere in the file (a line added above) moves a
    bug's line without touching it: judged at the old line numbers, its replay would call the bug
    gone. A location whose line still reads as recorded stays, as does one the finding recorded no
    code for (findings written before the code was) or whose code no line of the file reads any more."""
    report, notes = dict(report), []
    for key in ("site", "first_op"):
        entry = report.get(key)
        if not isinstance(entry, dict) or not entry.get("code"):
            continue
        old = str(entry.get("location", ""))
        new = relocated(old, entry["code"])
        if new is None or new == old:
            continue
        # its column stays: the line reads the same code (a line added above moves it whole; a bug's
        # signature names its column, and the finding at the new line must be the same bug)
        entry = {**entry, "location": new}
        if key == "site":
            entry["id"] = site_id(entry["target"], entry["op"], new, int(entry["occurrence"]))
            entry.pop("label", None)
        report[key] = entry
        notes.append(f"{entry.get('op')} moved from {old} to line {new.rpartition(':')[2]} "
                     f"(its line of code, {entry['code']!r}, is unchanged)")
    return report, list(dict.fromkeys(notes))       # a site's own op moved once, not once per entry


def replay_verdict(result: CheckResult, report: dict[str, Any]) -> tuple[bool, dict[str, Any], list[str]]:
    """Does a replay of a saved finding reproduce it (:func:`confirmed`)? Judged at the lines where
    the finding's code sits now (:func:`moved`): the verdict, the report as judged (its locations
    moved, or ``report`` itself) and the notes that say what moved."""
    if confirmed(result, OpSite.from_dict(report["site"]), report):
        return True, report, []
    now, notes = moved(report)
    if notes and confirmed(result, OpSite.from_dict(now["site"]), now):
        return True, now, notes
    return False, report, []


def _expectation(expected: Any) -> tuple[bool, str, Any]:
    if expected is None:
        return True, "forward", None
    if isinstance(expected, dict):
        return (bool(expected.get("site_triggered", True)), str(expected.get("phase") or "forward"),
                expected.get("first_op"))
    return bool(expected.own), expected.phase, expected.first_op


REPLAYS = 3     # fresh replays of a candidate: all reproduce it (found), some (flaky), none (flaky, 0 of n)


def fresh_runner(spec: TargetSpec, options: RunnerOptions, live: tuple = ()):
    """A new build of the target from its factory. Runners of the same target already built in
    this process are reset first: a module-level tensor of the user's script is shared by every
    build, and a new build must start from its value as the factory left it."""
    for runner in live:
        runner.reset()
    return build_runner(spec, options)


TOWARD_ORIGINAL_STEPS = 12     # bisection steps on a kept row's interpolation factor (1/4096 resolution)
REPLAY_TIMINGS = 3             # replays timed per batch (the best is reported) ...
REPLAY_TIMING_CAP_S = 0.5      # ... unless one replay already takes this long


def minimise(runner, site: OpSite, inputs: dict[str, np.ndarray], state: dict | None, seed: int, *,
             original: dict[str, np.ndarray] | None = None,
             bounds: dict[str, tuple[float, float]] | None = None,
             expected: Any = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Shrink the batch to the fewest rows that still trigger the site (often one), then move the
    searched values of the kept rows back toward ``original`` (the batch the search started from)
    as far as the bug allows. Every try is a replay; the result always replays."""
    n = next(iter(inputs.values())).shape[0]
    replays = _Replays(runner, site, state, seed, expected)
    t0 = time.perf_counter()
    rows = _fewest_rows(replays, inputs, n)
    small = {k: v[rows] for k, v in inputs.items()}
    t_min = time.perf_counter()
    info: dict[str, Any] = {"original_batch_size": int(n), "batch_size": len(rows), "rows": rows}
    keys = _searched_keys(runner, inputs, original, bounds)
    if keys:
        base = {k: _clip(np.asarray(original[k])[rows], (bounds or {}).get(k)) for k in keys}
        before = _distance(small, base, keys)
        small, factors = _toward(replays, small, base, keys, bounds or {})
        info.update(distance_before=before, distance=_distance(small, base, keys), factors=factors,
                    searched=keys)
    else:
        info.update(distance_before=None, distance=None, factors=None, searched=[])
    info.update(checks=replays.count, seconds=round(t_min - t0, 4),
                toward_seconds=round(time.perf_counter() - t_min, 4),
                replay_seconds_original=_time_replay(runner, site, inputs, state, seed),
                replay_seconds_minimised=_time_replay(runner, site, small, state, seed))
    return small, info


class _Replays:
    """Counted replays of one site: does a batch still trigger it?"""

    def __init__(self, runner, site: OpSite, state: dict | None, seed: int, expected: Any = None) -> None:
        self.runner, self.site, self.state, self.seed, self.count = runner, site, state, seed, 0
        self.expected = expected

    def triggers(self, values: dict[str, np.ndarray]) -> bool:
        self.count += 1
        try:
            return confirmed(confirm(self.runner, self.site, values, self.state, self.seed), self.site,
                             self.expected)
        except Exception:  # noqa: BLE001 - a program that needs its full batch: keep it
            return False


def _fewest_rows(replays: _Replays, inputs: dict[str, np.ndarray], n: int) -> list[int]:
    """One row alone (the common case), else drop halves, quarters, ... (ddmin-like)."""
    def triggers(rows: list[int]) -> bool:
        return replays.triggers({k: v[rows] for k, v in inputs.items()})

    rows = list(range(n))
    if n <= 1:
        return rows
    for i in range(n):
        if triggers([i]):
            return [i]
    chunk = len(rows) // 2
    while chunk >= 1 and len(rows) > 1:
        for start in range(0, len(rows), chunk):
            keep = rows[:start] + rows[start + chunk:]
            if keep and triggers(keep):
                rows = keep
                break
        else:
            chunk //= 2
    return rows


def _searched_keys(runner, inputs: dict[str, np.ndarray], original: dict[str, np.ndarray] | None,
                   bounds: dict | None) -> list[str]:
    """Searched, floating-point inputs that have an original of the same shape."""
    if not original:
        return []
    names = set(bounds) if bounds else set(getattr(runner, "searched", ()))
    return [k for k, v in inputs.items() if k in names and k in original
            and np.asarray(original[k]).shape == np.shape(v) and np.issubdtype(np.asarray(v).dtype, np.floating)]


def _toward(replays: _Replays, values: dict[str, np.ndarray], base: dict[str, np.ndarray], keys: list[str],
            bounds: dict) -> tuple[dict[str, np.ndarray], list[float]]:
    """Per kept row, the smallest interpolation factor t (0: the original row, 1: the candidate's)
    that still triggers, by bisection; the row keeps the values at the smallest t that triggered."""
    values = {k: np.array(v) for k, v in values.items()}
    factors = []
    for row in range(next(iter(values.values())).shape[0]):
        start = {k: values[k][row].copy() for k in keys}

        def at(t: float) -> dict[str, np.ndarray]:
            out = dict(values)
            for k in keys:
                v = out[k] = out[k].copy()
                moved = base[k][row].astype(np.float64) + t * (start[k].astype(np.float64) - base[k][row])
                if k in bounds:
                    moved = np.clip(moved, *bounds[k])
                v[row] = moved.astype(v.dtype)
            return out

        lo, hi = 0.0, 1.0
        if replays.triggers(at(0.0)):
            hi = 0.0
        else:
            for _ in range(TOWARD_ORIGINAL_STEPS):
                mid = (lo + hi) / 2
                if replays.triggers(at(mid)):
                    hi = mid
                else:
                    lo = mid
        values = at(hi)
        factors.append(round(hi, 6))
    return values, factors


def _clip(v: np.ndarray, bound: tuple[float, float] | None) -> np.ndarray:
    return v if bound is None else np.clip(v, *bound).astype(v.dtype)


def _distance(values: dict[str, np.ndarray], base: dict[str, np.ndarray], keys: list[str]) -> dict[str, float]:
    diff = np.concatenate([(np.asarray(values[k], np.float64) - np.asarray(base[k], np.float64)).ravel()
                           for k in keys])
    if diff.size == 0:
        return {"l2": 0.0, "linf": 0.0}
    return {"l2": float(np.sqrt((diff * diff).sum())), "linf": float(np.abs(diff).max())}


def _time_replay(runner, site: OpSite, values: dict[str, np.ndarray], state: dict | None, seed: int) -> float:
    """Seconds of one replay (the best of a few, so that one slow run does not count)."""
    best = float("inf")
    for _ in range(REPLAY_TIMINGS):
        t = time.perf_counter()
        confirm(runner, site, values, state, seed)
        best = min(best, time.perf_counter() - t)
        if best > REPLAY_TIMING_CAP_S:
            break
    return round(best, 6)


def baseline_batch(runner, site: OpSite, seed: int) -> dict[str, np.ndarray]:
    """The batch a site's search started from, drawn again from the site's RNG (as SiteSearch does);
    for candidates that do not carry their original batch. Clipping to bounds is left to minimise."""
    return dict(runner.sample(site_rng(seed, site.id)))


def finding_from(runner, spec: TargetSpec, site: OpSite, config: SearchConfig, cand: Candidate,
                 seconds: float, device: str = "cpu", minimise_batch: bool = True,
                 replays: int = REPLAYS) -> Finding:
    """Confirm a candidate by replays in a fresh build of the target (never on the searching
    process's live objects: ``runner`` is only reset, so that module-level state is the
    factory's again), minimise it when every replay reproduced it, and return the finding.

    A candidate never vanishes: one that some or none of the replays reproduce (randomness the
    engine cannot re-seed, as a TF1 graph's dropout) is a *flaky* finding, with its values and
    the count of replays that reproduced it."""
    options = getattr(runner, "options", RunnerOptions(device=device))
    fresh = fresh_runner(spec, options, live=(runner,))
    isolated = not getattr(fresh, "untracked", None)
    results = []
    for i in range(max(1, replays)):
        if i and not isolated:           # writes the engine cannot undo: a new build per replay
            fresh = fresh_runner(spec, options, live=(fresh,))
        result = confirm(fresh, site, cand.values, cand.state, cand.seed)
        isolated = isolated and not getattr(fresh, "untracked", None)
        results.append((confirmed(result, site, cand), result))
    reproduced = sum(ok for ok, _ in results)
    if reproduced < len(results):
        log.warning("candidate for %s reproduced by %d of %d fresh replays: flaky", site.label,
                    reproduced, len(results))
    result = next((r for ok, r in results if ok), results[0][1])
    inputs, info = dict(cand.values), {}
    if minimise_batch and reproduced == len(results) and isolated:
        inputs, info = minimise(fresh, site, cand.values, cand.state, cand.seed,
                                original=baseline_batch(fresh, site, config.seed), bounds=cand.bounds,
                                expected=cand)
        result = confirm(fresh, site, inputs, cand.state, cand.seed)
    first = result.first_op.to_dict() if result.first_op else (cand.first_op.to_dict() if cand.first_op else None)
    notes = outside_data(inputs, fresh.data_ranges()) if hasattr(fresh, "data_ranges") else []
    fresh.reset()
    precision = getattr(options, "precision", None) or Precision()
    mixed: dict[str, Any] = {}
    if precision.mixed:     # the float32 replay (precision-only?) and the overflow's size
        from fuzz_core.precision import precision_facts

        mixed = precision_facts(fresh, spec, site, inputs, cand.state, cand.seed, first)
        if precision.grad_scaler:
            mixed["scaler_skips"] = int(result.scaler_skips)
    return Finding(site=site, target=spec.to_dict(), inputs=inputs, state=cand.state, step=cand.step,
                   step_seed=cand.seed, strategy=config.strategy, first_op=first,
                   trigger="weights" if cand.weights_searched else "inputs", training=cand.training,
                   bounds=cand.bounds, seconds=seconds, minimised=info, versions=fresh.versions(),
                   device=device, phase=cand.phase, replays=(reproduced, len(results)),
                   site_triggered=cand.own, notes=notes, precision=precision.to_dict(), **mixed)


def outside_data(inputs: dict[str, np.ndarray], ranges: dict[str, tuple[float, float]]) -> list[str]:
    """A note per searched input whose triggering values leave the range of the data the target
    samples ("x[3, 1] = 41.7, sampled data lies in [0, 16]"): the value furthest outside."""
    notes = []
    for name, (lo, hi) in ranges.items():
        if name not in inputs:
            continue
        v = np.asarray(inputs[name], dtype=np.float64)
        excess = np.maximum(v - hi, lo - v)
        if not excess.size or not float(excess.max()) > 0:
            continue
        i = int(np.argmax(excess))
        index = ", ".join(str(j) for j in np.unravel_index(i, v.shape))
        notes.append(f"{name}[{index}] = {v.flat[i]:.4g}, sampled data lies in [{lo:.4g}, {hi:.4g}]")
    return notes


def replay(runner, loaded: LoadedFinding) -> CheckResult:
    """Replay a saved finding on a freshly built runner (:func:`confirmed` with the report judges it)."""
    return confirm(runner, loaded.site, loaded.inputs, loaded.state, int(loaded.report["step_seed"]))


def search_site(runner, site: OpSite, config: SearchConfig,
                passed: Callable[[QuantumResult], None] | None = None) -> QuantumResult:
    """Search one site to the end of its budget in this process (no scheduler).

    ``passed``: called with each result that ended on another op's non-finite value which the search
    can step past (:meth:`SiteSearch.step_past`); it confirms and keeps that finding, and the search
    goes on toward the site's own op. The runner it is given is the search's: a confirmation resets
    it, and the search takes its state back after. Without ``passed`` the search ends there."""
    search = SiteSearch(runner, site, config)
    result = search.run(config.max_steps)
    while passed is not None and search.can_step_past():
        search.report_and_step_past(lambda: passed(result))
        result = search.run(config.max_steps - search.step)
    return result
