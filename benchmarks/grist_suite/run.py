"""Run GRIST's benchmark suite with every strategy and write its section of benchmarks/RESULTS.md.

    python benchmarks/grist_suite/run.py [--frameworks torch tensorflow] [--strategies adaptive grist random]
                                         [--max-steps N] [--subjects ID ...] [--jobs 2]

For each runnable subject of the registries (``subjects_torch.py``, ``subjects_tf.py`` when
it exists) and each strategy, one child process builds the target, discovers its op sites
and searches every searched site from the factory's state with a budget of ``--max-steps``
(the engine's own ``build_runner``, ``discover_sites``, ``search_site``); each candidate is
confirmed by the engine (``finding_from``), written as a finding folder and replayed in a
fresh rebuild of the target (``replay``). One process per (subject, strategy) keeps TF1
graphs and imports apart and makes "end to end" start at a process start; ``--jobs`` of them
run at once. Results are cached per (subject, strategy, budget, seed, code version) under
``benchmarks/grist_suite/.cache/``, so a rerun only runs what changed.

A bug is found at GRIST's op when a finding that replays in a fresh rebuild has its site or
its first non-finite op on a line of the subject's entry file marked ``# GRIST bug <id>``.
A miss counts as the budget.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grist_suite.model import SETTINGS, Bug, Subject, marked_lines  # noqa: E402

SUITE = Path(__file__).resolve().parent
CACHE = SUITE / ".cache"
# committed: the per-(subject, strategy) results RESULTS.md's section was last written from, so that a
# clean checkout rebuilds the section (--report-only) and reruns only what it changes
RECORD = SUITE / "record"
RUNNER_VERSION = "3"            # bump when what a worker measures changes
REGISTRIES = {"torch": "benchmarks.grist_suite.subjects_torch",
              "tensorflow": "benchmarks.grist_suite.subjects_tf"}
STRATEGIES = ("adaptive", "grist", "random")
DEFAULT_MAX_STEPS = 300
RANDOM_HARD_STEPS = 100         # random does not trigger the bug within this many steps
TASK_TIMEOUT_S = 1800
SOFT_ASSERTION_S, RANUM_S = 0.646, 2.209   # published seconds per bug, on their authors' machines


# ----------------------------------------------------------------------------- registry
def load_subjects(frameworks: list[str]) -> tuple[list[Subject], list[str]]:
    """Subjects of the named frameworks' registries; and a note per registry that is missing."""
    subjects, missing = [], []
    for fw in frameworks:
        try:
            module = importlib.import_module(REGISTRIES[fw])
        except ModuleNotFoundError as exc:
            if exc.name != REGISTRIES[fw]:
                raise
            missing.append(f"{fw}: no registry ({REGISTRIES[fw].replace('.', '/')}.py) yet")
            continue
        subjects.extend(module.SUBJECTS)
    return sorted(subjects, key=lambda s: (s.framework, s.id)), missing


def find_bug(bug_id: str) -> tuple[Subject, Bug] | None:
    """(subject, bug) of the suite's registries with this id, or None."""
    subjects, _ = load_subjects(list(REGISTRIES))
    for subject in subjects:
        for bug in subject.bugs:
            if bug.id == bug_id:
                return subject, bug
    return None


def require_bugs(ap: argparse.ArgumentParser, bugs: list[str]) -> None:
    """Exit 2 (``ap.error``) naming every id in ``bugs`` that is no bug of the suite's registries."""
    unknown = [bug for bug in bugs if find_bug(bug) is None]
    if unknown:
        ap.error(f"--bugs: no bug {', '.join(map(repr, unknown))} in the suite's registries (ids such as ID_48a)")


def subject_key(subject: Subject) -> str:
    return f"{subject.framework}-id{subject.id:02d}"


def pick(subjects: list[Subject], wanted: list[str] | None) -> list[Subject]:
    if not wanted:
        return subjects
    ids = {int(w.upper().removeprefix("ID_").removeprefix("ID").rstrip("ABCDEFGH")) for w in wanted}
    return [s for s in subjects if s.id in ids]


def groups(subject: Subject) -> list[dict[str, Any]]:
    """The distinct (entry, args, weight search) of a subject's bugs in every setting
    (:data:`~benchmarks.grist_suite.model.SETTINGS`): one target build each."""
    out: list[dict[str, Any]] = []
    for bug in subject.bugs:
        for setting in SETTINGS:
            args, weights = bug.setting(setting)
            g = {"entry": bug.entry, "args": args, "search_weights": weights}
            if g not in out:
                out.append(g)
    return out


def _of_group(bug: Bug, group: dict, setting: str = "free") -> bool:
    args, weights = bug.setting(setting)
    return (group["entry"] == bug.entry and group["args"] == args
            and bool(group.get("search_weights", False)) == weights)


def bug_group(bug: Bug, res: dict | None, setting: str = "free") -> dict | None:
    """The group of a worker's result that built the bug's program in ``setting`` (its entry, arguments and
    weight search), or None: no result, a crashed worker, or no such build."""
    if not res or "crash" in res:
        return None
    return next((g for g in res["groups"] if _of_group(bug, g, setting)), None)


def engine_revision() -> str:
    """The commit the engine was at, and whether fuzz_core had uncommitted changes."""
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "fuzz_core")
    return head + ("+uncommitted fuzz_core changes" if dirty else "")


def suite_imports(program: Path) -> list[Path]:
    """The suite's modules a program imports from outside its folder (``benchmarks.grist_suite.pretrained``)."""
    found = []
    for name in re.findall(r"^from (benchmarks\.grist_suite\.[\w.]+) import", program.read_text(), re.M):
        path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
        if path.parent != program.parent and path.is_file():
            found.append(path)
    return found


def code_version(subject: Subject) -> str:
    """A hash of what a result depends on: the engine's sources, the subject's files and record."""
    h = hashlib.sha1(RUNNER_VERSION.encode())
    files = sorted((ROOT / "fuzz_core").rglob("*.py"))
    for g in groups(subject):
        path = ROOT / g["entry"].split(":", 1)[0]
        files.append(path)
        files.extend(sorted(p for p in path.parent.glob("_*.py")))   # the programs' shared helpers
        files.extend(q for q in suite_imports(path) if q not in files)
    for path in files:
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    h.update(json.dumps([asdict(b) for b in subject.bugs], sort_keys=True, default=str).encode())
    return h.hexdigest()[:12]


# ----------------------------------------------------------------------------- worker (child process)
class _Watched:
    """The runner, with every step's evaluation watched for non-finite values the site did not own.

    Each event keeps the number of steps (forward passes) before it, so that the events of the
    budgeted search can be told from those of the engine's out-of-bounds probe, which runs on
    past an exhausted site's budget in a widened box (not a finding by design)."""

    def __init__(self, runner) -> None:
        self._runner = runner
        self.passes = 0
        self.events: list[tuple[int, dict | None]] = []

    def __getattr__(self, name: str):
        return getattr(self._runner, name)

    def evaluate(self, *args, **kwargs):
        ev = self._runner.evaluate(*args, **kwargs)
        if getattr(ev, "event", False) and not getattr(ev, "triggered", False):
            op = ev.first_op.to_dict() if getattr(ev, "first_op", None) is not None else None
            self.events.append((self.passes, op))
        self.passes += int(getattr(ev, "passes", 1) or 1)
        return ev

    def split(self, steps: int) -> tuple[list[dict | None], int, int]:
        """(distinct first ops of the events within the first ``steps`` steps, their count, the rest's count)."""
        inside = [op for n, op in self.events if n < steps]
        distinct: list[dict | None] = []
        for op in inside:
            if op not in distinct and len(distinct) < 5:
                distinct.append(op)
        return distinct, len(inside), len(self.events) - len(inside)


def _tail(exc: BaseException, lines: int = 6) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).strip().splitlines()
    return "\n".join(text[-lines:])


def _replays(result, site, report: dict) -> bool:
    """The engine's own judgement of a replay: the site's hazard, or (a candidate that another op
    produced) the same first op in the same phase, as the finding's report records it."""
    import inspect

    from fuzz_core import engine

    if len(inspect.signature(engine.confirmed).parameters) >= 3:
        return bool(engine.confirmed(result, site, report))
    return bool(engine.confirmed(result, site))


def _op_dict(op) -> dict | None:
    if op is None:
        return None
    return op.to_dict() if hasattr(op, "to_dict") else dict(op)


def search_group(framework: str, sid: int, strategy: str, max_steps: int, seed: int, group: dict,
                 t_launch: float, findings_dir: Path, only: tuple[str, set[int]] | None = None) -> dict[str, Any]:
    """Build one target, discover its sites, search each, confirm and fresh-replay each candidate.

    ``only``: (file, lines): search only the sites on those lines (a bug's own, :func:`bug_lines`)."""
    from fuzz_core.backends.base import RunnerOptions
    from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, replay, search_site
    from fuzz_core.findings import finding_folder, load_finding, write_finding
    from fuzz_core.search import SearchConfig

    weights = bool(group.get("search_weights", False))
    options = RunnerOptions(search_weights=weights)
    spec = TargetSpec(f"grist-id{sid:02d}", group["entry"], dict(group["args"]), framework=framework, seed=seed)
    out: dict[str, Any] = {"entry": group["entry"], "args": group["args"], "search_weights": weights,
                           "sites": [], "error": None}
    try:
        runner = build_runner(spec, options)
        sites = discover_sites(runner, seed)
    except Exception as exc:  # noqa: BLE001 - a subject that cannot be built is a result
        out["error"] = f"build/discover: {_tail(exc)}"
        return out
    out["setup_s"] = round(time.time() - t_launch, 4)
    out["sites_total"] = len(sites)
    config = SearchConfig(strategy=strategy, max_steps=max_steps, seed=seed, search_weights=weights)
    for site in sites:
        if not site.searched or (only is not None and not on_lines(site.location, *only)):
            continue
        rec: dict[str, Any] = {"id": site.id, "op": site.op, "hazard": site.hazard, "location": site.location,
                               "occurrence": site.occurrence, "candidate": False, "confirmed": False,
                               "fresh_replay": None, "error": None}
        watched = _Watched(runner)
        t0 = time.perf_counter()
        passed: list[dict[str, Any]] = []

        def confirm_into(entry: dict[str, Any], result) -> None:
            """A candidate's fields, its confirmation (the engine's replays), its folder (one per finding:
            variants of one program, built under one name, never share one) and a replay of the folder in a
            fresh build, into ``entry``."""
            cand = result.candidate
            entry.update(candidate=True, candidate_first_op=_op_dict(cand.first_op), candidate_step=int(cand.step),
                         training=bool(cand.training))
            t1 = time.perf_counter()
            try:
                finding = finding_from(runner, spec, site, config, cand, result.seconds, minimise_batch=False)
            except Exception as exc:  # noqa: BLE001
                finding = None
                entry["error"] = f"confirm: {_tail(exc)}"
            if finding is not None:
                done, of = getattr(finding, "replays", (1, 1))
                entry["engine_replays"] = [int(done), int(of)]
                entry["confirmed"] = done == of          # every replay of the engine's own reproduced it
                entry["own"] = bool(getattr(finding, "site_triggered", True))
                entry["phase"] = getattr(finding, "phase", "forward")
                entry["first_op"] = finding.first_op
                try:
                    folder, there = finding_folder(findings_dir, finding)   # never another variant's folder
                    if not there:
                        write_finding(finding, folder)
                    entry["finding"] = _rel(folder)
                    runner.reset()                     # as the engine does before a new build
                    fresh = build_runner(spec, options)
                    loaded = load_finding(folder)
                    check = replay(fresh, loaded)
                    entry["fresh_replay"] = _replays(check, site, loaded.report)
                    entry["fresh_first_op"] = _op_dict(check.first_op)
                except Exception as exc:  # noqa: BLE001 - a replay that raises fails
                    entry["fresh_replay"] = False
                    entry["error"] = f"fresh replay: {_tail(exc)}"
            entry["confirm_s"] = round(time.perf_counter() - t1, 4)     # end to end: see end_to_end
            entry["since_launch_s"] = round(time.time() - t_launch, 4)
            runner.reset()

        def step_past(result) -> None:
            """Another op's finding that the search reported and stepped past: a record of its own."""
            entry = {**rec, "steps": int(result.steps), "search_s": round(float(result.seconds), 4),
                     "status": "stepped past", "passed": True}
            confirm_into(entry, result)
            passed.append(entry)

        try:
            result = search_site(watched, site, config, passed=step_past)
        except Exception as exc:  # noqa: BLE001 - the engine crashed on this site: record, rebuild, go on
            rec.update(error=f"search: {_tail(exc)}", steps=None, search_s=round(time.perf_counter() - t0, 4))
            out["sites"].extend([*passed, rec])
            try:
                runner = build_runner(spec, options)
            except Exception:  # noqa: BLE001
                break
            continue
        event_ops, events, probe_events = watched.split(int(result.steps))
        rec.update(steps=int(result.steps), search_s=round(float(result.seconds), 4), status=str(result.status),
                   exit_reason=str(getattr(result, "exit_reason", "")), best_loss=_finite(result.best_loss),
                   events=events, event_ops=event_ops, probe_events=probe_events,
                   reach=json.loads(json.dumps(getattr(result, "reach", None), default=str)))
        if result.candidate is not None:
            confirm_into(rec, result)
        out["sites"].extend(passed)
        out["sites"].append(rec)
    return out


def _rel(path: Path) -> str:
    """A path relative to the repository root when it lies inside it."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def worker(task: dict[str, Any]) -> dict[str, Any]:
    t_launch = float(task["t_launch"])
    os.chdir(ROOT)                   # op sites are named relative to the repository root
    if task["framework"] == "torch":
        import torch

        torch.set_num_threads(1)
    cache = ROOT / task.get("cache", CACHE.relative_to(ROOT).as_posix())
    findings_dir = cache / "findings" / f"{task['key']}-{task['strategy']}-{task['max_steps']}"
    out = {k: task[k] for k in ("key", "framework", "subject", "strategy", "max_steps", "seed", "code_version")}
    out["engine"] = engine_revision()
    out["groups"] = [search_group(task["framework"], task["subject"], task["strategy"], task["max_steps"],
                                  task["seed"], g, t_launch, findings_dir) for g in task["groups"]]
    out["wall_s"] = round(time.time() - t_launch, 3)
    out["load"] = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    return out


# ----------------------------------------------------------------------------- driver
def make_task(subject: Subject, strategy: str, max_steps: int, seed: int, cache: str | Path,
              version: str) -> dict[str, Any]:
    """One (subject, strategy, budget, seed) for a worker process; ``version``: the subject's
    :func:`code_version` (hashed once per subject by the caller)."""
    return {"key": subject_key(subject), "framework": subject.framework, "subject": subject.id,
            "strategy": strategy, "max_steps": subject.budget(max_steps), "seed": seed, "code_version": version,
            "cache": Path(cache).as_posix(), "groups": groups(subject)}


def result_stem(task: dict[str, Any]) -> str:
    """A (subject, strategy, budget, seed)'s name in the cache (before its code version) and the record."""
    return f"{task['key']}-{task['strategy']}-{task['max_steps']}-s{task['seed']}"


def cache_path(task: dict[str, Any]) -> Path:
    return ROOT / task["cache"] / "results" / f"{result_stem(task)}-{task['code_version']}.json"


def child_env() -> dict[str, str]:
    """The environment of the suite's child processes: one thread per library, TF quiet, a fixed hash seed
    (thread counts change the order of float reductions, and with it a training-reached trajectory)."""
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1",
                TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")


def in_child(script: Path, task: dict[str, Any], out_file: Path, timeout: float) -> tuple[dict | None, str, str]:
    """Run ``script --worker TASK --worker-out OUT_FILE`` in a fresh process (one thread per library,
    TF quiet): (its JSON result, "", "") or (None, how it failed, its stderr)."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    env = child_env()
    cmd = [sys.executable, str(script), "--worker", json.dumps(task), "--worker-out", str(out_file)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s", ""
    if proc.returncode != 0 or not out_file.exists():
        err = (proc.stderr or "").strip()
        return None, f"exit {proc.returncode}: {err.splitlines()[-1] if err else 'no output'}", err
    result = json.loads(out_file.read_text())
    out_file.unlink()
    return result, "", ""


def json_child(cmd: list[str], timeout: float) -> tuple[dict | None, str]:
    """Run a worker command in a fresh process (:func:`child_env`) that prints its result as a JSON line:
    (the last such line, "") or (None, how it failed)."""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr or "").strip().splitlines()
        return None, f"exit {proc.returncode}: {err[-1] if err else 'no output'}"
    return json.loads(lines[-1]), ""


def run_task(task: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One child process; its result, or a record of how it failed."""
    out_file = ROOT / task["cache"] / "tmp" / f"{task['key']}-{task['strategy']}-{os.getpid()}-{time.time_ns()}.json"
    task = dict(task, t_launch=time.time())
    result, failure, err = in_child(Path(__file__).resolve(), task, out_file, timeout)
    if result is None and err:
        log = ROOT / task["cache"] / "crashes" / f"{task['key']}-{task['strategy']}-{task['max_steps']}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"{sys.executable} {Path(__file__).resolve()} --worker '<task>'\n{err}\n")
        failure += f" (log: {_rel(log)})"
    return result if result is not None else dict(task, crash=failure, groups=[])


def newest(folder: Path, pattern: str) -> Path | None:
    """The most recently written file of ``folder`` that matches ``pattern``, or None."""
    return max(folder.glob(pattern), key=lambda p: p.stat().st_mtime, default=None)


def record_path(task: dict[str, Any], record: Path | None = None) -> Path:
    """Where the committed record keeps this (subject, strategy, budget, seed)'s result."""
    return (record or RECORD) / f"{result_stem(task)}.json"


def newest_cached(task: dict[str, Any], record: Path | None = None) -> Path | None:
    """The newest result of this (subject, strategy, budget, seed), whatever its code version: in the
    cache, or in the committed record (:data:`RECORD`), whichever was written last."""
    cached = newest(ROOT / task["cache"] / "results", f"{result_stem(task)}-*.json")
    kept = record_path(task, record)
    candidates = [p for p in (cached, kept) if p is not None and p.exists()]
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


def portable(res: dict[str, Any]) -> dict[str, Any]:
    """``res`` as the committed record keeps it: a finding folder written outside the repository (a
    ``--cache`` elsewhere) is named from its cache's ``findings/`` folder on, as ``<cache>/findings/...``,
    so that no path of the machine that ran it goes into the repository."""
    out = json.loads(json.dumps(res))
    for group in out.get("groups", []):
        for site in group.get("sites", []):
            where = site.get("finding")
            if isinstance(where, str) and Path(where).is_absolute():
                head, sep, tail = where.partition("/findings/")
                site["finding"] = f"<cache>/findings/{tail}" if sep else f"<cache>/{Path(where).name}"
    return out


def keep(task: dict[str, Any], res: dict[str, Any], record: Path | None = None) -> None:
    """Write one task's result to the committed record (:func:`portable`)."""
    path = record_path(task, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(portable(res), indent=1, sort_keys=True) + "\n")


def write_record(tasks: list[dict[str, Any]], results: dict[tuple, dict], record: Path | None = None) -> int:
    """Keep the result of every task that has one in the committed record; the number written."""
    n = 0
    for task in tasks:
        res = results.get((task["key"], task["strategy"]))
        if res is None or "crash" in res:
            continue
        keep(task, res, record)
        n += 1
    return n


def run_all(tasks: list[dict[str, Any]], jobs: int, timeout: float, rerun: bool,
            report_only: bool = False) -> dict[tuple, dict]:
    results: dict[tuple, dict] = {}
    todo = []
    for task in tasks:
        path = newest_cached(task) if report_only else cache_path(task)
        if path is not None and path.exists() and not rerun:
            results[(task["key"], task["strategy"])] = json.loads(path.read_text())
        elif not report_only:
            todo.append(task)
    print(f"{len(tasks) - len(todo)} cached, {len(todo)} to run with {jobs} job(s)", flush=True)

    def one(task):
        t = time.time()
        res = run_task(task, timeout)
        if "crash" not in res:
            path = cache_path(task)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(res, indent=1))
        print(f"  {task['key']:16s} {task['strategy']:9s} {time.time() - t:7.1f}s "
              f"{'CRASH ' + res['crash'].splitlines()[0] if 'crash' in res else _brief(res)}", flush=True)
        return task, res

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for task, res in pool.map(one, todo):
            results[(task["key"], task["strategy"])] = res
    return results


def _brief(res: dict) -> str:
    sites = [s for g in res.get("groups", []) for s in g["sites"]]
    found = [f"{s['op']}:{s['steps']}" for s in sites if s.get("fresh_replay")]
    errs = [g["error"] for g in res.get("groups", []) if g.get("error")] + [s["error"] for s in sites if s.get("error")]
    return f"{len(sites)} sites, findings {found or '-'}" + (f", errors: {errs[0].splitlines()[0]}" if errs else "")


# ----------------------------------------------------------------------------- analysis
def _line_of(location: str | None) -> tuple[str, int] | None:
    if not location or ":" not in location:
        return None
    path, _, line = location.rpartition(":")
    return (path, int(line)) if line.isdigit() else None


def bug_lines(bug: Bug) -> tuple[str, set[int]]:
    """The bug's entry file and its lines marked ``# GRIST bug <id>``."""
    return bug.entry.split(":", 1)[0], set(marked_lines(bug.entry).get(bug.id, []))


def on_lines(location: str | None, path: str, lines: set[int]) -> bool:
    """``location`` (``path:line``) is one of ``lines`` of ``path``."""
    loc = _line_of(location)
    return loc is not None and loc[0] == path and loc[1] in lines


def at_bug(site: dict, bug: Bug) -> bool:
    """The site (when its own hazard fired), or the first op that went non-finite, sits on a line
    marked for ``bug``. A candidate that another op produced while the site was searched (the
    engine's ``site_triggered`` false) is that op's finding, not the site's."""
    path, lines = bug_lines(bug)
    spots = [] if site.get("own") is False else [site.get("location")]
    for key in ("first_op", "fresh_first_op"):
        if isinstance(site.get(key), dict):
            spots.append(site[key].get("location"))
    return any(on_lines(s, path, lines) for s in spots)


def end_to_end(res: dict, site: dict) -> float:
    """Process start to a site's confirmed finding: the process's setup (interpreter, imports, the first
    target built, its sites discovered) + the site's search + its confirmation and fresh replay.

    The setup is the first group's for every group of the process: a subject whose bugs need variants
    of the program builds them one after the other in one process, and a later group's own
    ``setup_s`` (time since launch) holds the earlier groups' whole searches (GRIST's SC_DNN: 465 s for
    its fourth variant, against 19 s for a process that builds that variant first)."""
    setup = next((g["setup_s"] for g in res.get("groups", []) if g.get("setup_s") is not None), 0.0)
    return round(float(setup) + float(site["search_s"]) + float(site.get("confirm_s") or 0.0), 4)


def bug_outcome(subject: Subject, bug: Bug, res: dict | None, max_steps: int, setting: str = "free") -> dict[str, Any]:
    """Found or not at GRIST's op, in ``setting``, with steps, seconds and the replay result."""
    if res is None or "crash" in res:
        return {"found": False, "steps": max_steps, "search_s": None, "e2e_s": None, "replay": "crash"}
    group = bug_group(bug, res, setting)
    if group is None or group.get("error"):
        return {"found": False, "steps": max_steps, "search_s": None, "e2e_s": None, "replay": "error"}
    hits = [s for s in group["sites"] if s.get("confirmed") and at_bug(s, bug)]
    good = [s for s in hits if s.get("fresh_replay")]
    if good:
        best = min(good, key=lambda s: s["steps"])
        return {"found": True, "steps": best["steps"], "search_s": best["search_s"], "e2e_s": end_to_end(res, best),
                "replay": "ok", "site": f"{best['op']}#{best['occurrence']}"}
    return {"found": False, "steps": max_steps, "search_s": None, "e2e_s": None,
            "replay": "FAILED" if hits else "-"}


def program_fired(bug: Bug, res: dict | None) -> str | None:
    """GRIST's own criterion: its loop stops at the first non-finite loss of the bug's program,
    whatever op made it. The op (``op@path:line``) of this strategy's first confirmed, replayed
    finding anywhere in the bug's program (its build, its variant), or None."""
    group = bug_group(bug, res)
    if group is None or group.get("error"):
        return None
    good = [s for s in group["sites"] if s.get("confirmed") and s.get("fresh_replay")]
    if not good:
        return None
    first = min(good, key=lambda s: s["steps"])
    op = first.get("first_op") if isinstance(first.get("first_op"), dict) else first
    return f"{op['op']}@{op['location']}"


def anomalies(subjects: list[Subject], results: dict[tuple, dict], strategies: list[str]) -> dict[str, list]:
    """What the engine owner needs: false findings, NaNs seen without a finding, crashes, other findings."""
    out: dict[str, list] = {"failed_replay": [], "discarded": [], "nan_no_finding": [], "crash": [], "other": []}
    for subj in subjects:
        marked = [b for b in subj.bugs]
        for strat in strategies:
            res = results.get((subject_key(subj), strat))
            tag = f"ID_{subj.id} {strat}"
            if res is None:
                continue
            if "crash" in res:
                out["crash"].append((tag, res["crash"].splitlines()[0][:200]))
                continue
            found_ops = set()
            for g in res["groups"]:
                if g.get("error"):
                    out["crash"].append((tag, g["error"].splitlines()[-1][:200]))
                for s in g["sites"]:
                    where = f"{s['op']}@{s['location']}" + (f"#{s['occurrence']}" if s['occurrence'] else "")
                    if s.get("error"):
                        out["crash"].append((f"{tag} {where}", s["error"].splitlines()[-1][:200]))
                    if s.get("candidate") and "engine_replays" not in s and not s.get("confirmed"):
                        out["discarded"].append((f"{tag} {where}", s.get("candidate_first_op")))
                    elif s.get("candidate") and not (s.get("confirmed") and s.get("fresh_replay")):
                        done, of = s.get("engine_replays") or (0, 0)
                        out["failed_replay"].append(
                            (f"{tag} {where}", f"engine's fresh replays {done}/{of}, replay of the saved folder "
                             f"{'ok' if s.get('fresh_replay') else 'FAILED'}: {s.get('finding')}"))
                    if s.get("confirmed") and s.get("fresh_replay"):
                        for key in ("first_op", "fresh_first_op"):
                            if isinstance(s.get(key), dict):
                                found_ops.add(s[key].get("location"))
                        found_ops.add(s["location"])
                        if not any(at_bug(s, b) for b in marked):
                            first = s.get("first_op") if s.get("own") is False else None
                            what = f"{first['op']}@{first['location']}" if isinstance(first, dict) else where
                            out["other"].append((f"{tag} {what}", s["steps"]))
            for g in res["groups"]:
                for s in g["sites"]:
                    if s.get("events") and not s.get("candidate"):
                        ops = [o for o in s.get("event_ops") or [] if o is None or o.get("location") not in found_ops]
                        if ops:
                            out["nan_no_finding"].append(
                                (f"{tag} site {s['op']}@{s['location']}", s["events"],
                                 ", ".join("?" if o is None else f"{o['op']}@{o['location']}" for o in ops)))
    return out


def miss_note(bug: Bug, res: dict | None) -> str | None:
    """For a missed bug: how close the search of its own site came, and the engine's probe outside
    the bounds (``reach``): where the op would go non-finite if the inputs could leave them."""
    group = bug_group(bug, res)
    if group is None:
        return None
    searched = [s for s in group["sites"] if s["op"] == bug.op and s.get("steps") is not None]
    own = [s for s in searched if at_bug(s, bug)]
    if not own:
        return _ended_elsewhere(bug, searched)
    best = min(own, key=lambda s: s.get("best_loss") if s.get("best_loss") is not None else math.inf)
    reach = best.get("reach") or {}
    loss = best.get("best_loss")
    text = f"closest suspect loss {loss:.3g}" if loss is not None else "no suspect loss"
    if any(s.get("candidate") and not (s.get("confirmed") and s.get("fresh_replay")) for s in own):
        text += " (it triggered, but the finding fails a fresh replay)"
    if reach.get("message"):
        text += f"; probe: {reach['message']}"
    return text


def _ended_elsewhere(bug: Bug, searched: list[dict]) -> str | None:
    """The bug's own site was searched, and its search ended with another op's finding (the first
    op to go non-finite was elsewhere, and the search could not step past it: a NaN in the training
    step, or one that reached the site's own input; GRIST's ID_2a, whose ``log(p)`` search drives
    ``log(1 - p)``, ID_2b, out of its domain first, ended so until searches stepped past such findings).
    The site is not unsearched: it stopped before its op fired.
    ``searched``: the group's searched sites of the bug's op (none of them at the bug: ``at_bug``)."""
    path, lines = bug_lines(bug)
    ended = [s for s in searched if on_lines(s.get("location"), path, lines)
             and s.get("own") is False and isinstance(s.get("first_op"), dict)]
    if not ended:
        return None
    s = min(ended, key=lambda s: s["steps"])
    first = s["first_op"]
    return (f"its site's search ended at step {s['steps']} with another op's finding "
            f"({first['op']}@{first['location']}), before its own op fired")


def _fmt_steps(o: dict, max_steps: int) -> str:
    if o["replay"] == "crash":
        return "crash"
    if not o["found"]:
        return f"- ({max_steps})"
    return f"{o['steps']} ({o['search_s']:.2f}s)"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    return f"{a / b:.1f}x" if b > 0 else "inf"


def _published(bug: Bug) -> str:
    p = bug.grist
    if p.found is None and p.iterations is None and p.seconds is None:
        return "n/a"
    parts = []
    if p.found is not None:
        parts.append("found" if p.found else "missed")
    if p.iterations is not None:
        parts.append(f"{p.iterations} it")
    if p.seconds is not None:
        parts.append(f"{p.seconds:g}s")
    return ", ".join(parts)


def report(subjects: list[Subject], results: dict[tuple, dict], strategies: list[str], max_steps: int,
           frameworks: list[str], missing: list[str], seed: int, note: str = "", section: str = "") -> str:
    runnable = [s for s in subjects if s.runnable]
    bugs = [(s, b) for s in runnable for b in s.bugs]
    both = {(b.id, st, setting): bug_outcome(s, b, results.get((subject_key(s), st)), s.budget(max_steps), setting)
            for s, b in bugs for st in strategies for setting in SETTINGS}
    outcome = {(bid, st): o for (bid, st, setting), o in both.items() if setting == "free"}
    differ = [b for _, b in bugs if b.grist_setting is not None]
    has_random = "random" in strategies

    def random_hard(bug: Bug) -> bool | None:
        if not has_random:
            return None
        o = outcome[(bug.id, "random")]
        return not o["found"] or o["steps"] > RANDOM_HARD_STEPS

    rows = []
    for s, b in bugs:
        row = [b.id, f"{s.name}", b.op, _published(b)]
        row += [_fmt_steps(outcome[(b.id, st)], s.budget(max_steps))
                + (f"; GRIST's setting: {_fmt_steps(both[(b.id, st, 'grist')], s.budget(max_steps))}"
                   if b.grist_setting is not None else "") for st in strategies]
        replays = {outcome[(b.id, st)]["replay"] for st in strategies}
        row.append("FAILED" if "FAILED" in replays else "crash" if "crash" in replays else
                   "ok" if "ok" in replays else "-")
        rh = random_hard(b)
        row.append("?" if rh is None else "**yes**" if rh else "no")
        rows.append(row)
    from benchmarks._results import table

    names = " and ".join({"torch": "PyTorch", "tensorflow": "TensorFlow"}[f] for f in frameworks)
    heading = f"## GRIST's benchmark, {names}" + (f": {section.replace('_', ' ')}" if section else "") + " (issue 17)"
    text = [heading + "\n",
            f"{len(runnable)} runnable subjects, {len(bugs)} bugs; budget **{max_steps} steps per op site**, "
            f"seed {seed}, every searched op site of a subject searched on its own from the factory's state. "
            "A bug counts as found when a finding whose first non-finite op (or whose site, when the site's own "
            "hazard fired) is on the line marked `# GRIST bug <id>` reproduces in every fresh rebuild of the "
            "target (the engine's replays and a replay of the saved folder); a cell shows steps to trigger "
            "(search seconds); `-` is a miss, counted as the budget"
            + "".join(f" (ID_{s.id}: {s.budget(max_steps)} steps, a budget of its own: its steps cost seconds)"
                      for s in runnable if s.budget(max_steps) < max_steps)
            + ". Two settings, which differ for "
            + (", ".join(b.id for b in differ) or "no bug") + ": **weights free** (the cells; RANUM's kind of search: "
            "where GRIST searched a variable, every trainable weight is searched in the engine's box for weights, "
            "its initial range grown by 4 times its largest magnitude on each side) and **GRIST's setting** "
            "(after `;`: inputs, and only the variable GRIST's entry searched, as it bounded it: SC_DNN's gain in "
            "[0, 16]; see `tf_programs/id28_sc_dnn.py`); every other bug is searched on its inputs only in both. "
            "GRIST published: what GRIST's repository records of its own runs (n/a: nothing reachable, see "
            "benchmarks/grist_suite/README.md). "
            f"Random-hard: random does not trigger the bug within {RANDOM_HARD_STEPS} steps.\n",
            table(["bug", "subject", "op", "GRIST published", *strategies, "replay", "random-hard"], rows), ""]
    engines = sorted({r.get("engine", "?") for r in results.values() if "crash" not in r})
    walls = [r["wall_s"] for r in results.values() if "wall_s" in r]
    loads = [r["load"] for r in results.values() if r.get("load") is not None]
    dirty = any("+" in e for e in engines)
    ran_at: dict[str, set[str]] = {st: set() for st in strategies}
    for (_, st), r in results.items():
        if "crash" not in r and st in ran_at:
            ran_at[st].add(r.get("engine", "?"))
    per_strategy = "; ".join(f"{st} at {', '.join(sorted(ran_at[st]))}" for st in strategies)
    engine_text = (f"engine at {engines[0]}" if len(engines) == 1 else
                   f"{len(engines)} commits of the repository ({per_strategy})"
                   + (", some with uncommitted changes to fuzz_core: it was being changed while the suite ran"
                      if dirty else ""))
    text.insert(2, f"Run on {engine_text}; {len(walls)} (subject, strategy) processes, {sum(walls) / 60:.0f} "
                   "process-minutes of wall time in all (one thread each)"
                   + (f", 1-minute load average at their ends: median {statistics.median(loads):.1f}"
                      if loads else "") + ".\n" + (f"\n{note}\n" if note else ""))

    tot, elsewhere = [], {}
    for st in strategies:
        cells = []
        for setting in SETTINGS:
            found = [b for _, b in bugs if both[(b.id, st, setting)]["found"]]
            steps = [both[(b.id, st, setting)]["steps"] for _, b in bugs]
            cells += [f"{len(found)}/{len(bugs)}", _median(steps) if steps else "-"]
        steps = [outcome[(b.id, st)]["steps"] for _, b in bugs]
        fired = {b.id: program_fired(b, results.get((subject_key(s), st))) for s, b in bugs}
        elsewhere[st] = [f"{b} ({op})" for b, op in fired.items() if op and not outcome[(b, st)]["found"]]
        tot.append([st, *cells, f"{sum(op is not None for op in fired.values())}/{len(bugs)}", sum(steps)])
    any_found = sum(any(outcome[(b.id, st)]["found"] for st in strategies) for _, b in bugs)
    text += ["**Totals** (found at GRIST's op; median steps, a miss counted as the budget)\n",
             table(["strategy", "GRIST's setting: found", "median steps", "weights free: found", "median steps",
                    "weights free, by GRIST's criterion", "weights free, total steps"], tot),
             "\nBy GRIST's criterion: its loop counts a bug once the program's loss goes non-finite, whatever op "
             "made it; here, a confirmed and replayed finding at any op of the bug's program (its build). "
             "Counted so and not at GRIST's op: "
             + ("; ".join(f"{st}: {', '.join(elsewhere[st])}" for st in strategies if elsewhere[st]) or "none") + ".",
             f"\nFound by any strategy: {any_found}/{len(bugs)}. Published totals, on their authors' machines "
             f"and all 79 bugs: RANUM 79/79 ({RANUM_S} s per bug), Soft Assertion fuzzer 79/79 "
             f"({SOFT_ASSERTION_S} s per bug), GRIST 78/79.\n"]

    hard = [b for _, b in bugs if random_hard(b)]
    if has_random:
        med = {st: _median([outcome[(b.id, st)]["steps"] for b in hard]) for st in strategies}
        grist_med = {st: _median([both[(b.id, st, "grist")]["steps"] for b in hard]) for st in strategies}
        line = [f"**Random-hard bugs: {len(hard)}** ({', '.join(b.id for b in hard) or 'none'})."]
        if hard:
            line.append(" Median steps to trigger (miss = budget), weights free: "
                        + ", ".join(f"{st} {med[st]:g}" for st in strategies) + "; GRIST's setting: "
                        + ", ".join(f"{st} {grist_med[st]:g}" for st in strategies) + ".")
            if "adaptive" in strategies:
                for other in ("grist", "random"):
                    if other in strategies:
                        line.append(f" {other} / adaptive: **{_ratio(med[other], med['adaptive'])}**.")
        text.append("".join(line) + "\n")

    sec_rows = []
    for st in strategies:
        found = [outcome[(b.id, st)] for _, b in bugs if outcome[(b.id, st)]["found"]]
        if found:
            e2e = statistics.mean(o["e2e_s"] for o in found)
            search = statistics.mean(o["search_s"] for o in found)
            sec_rows.append([st, len(found), f"{e2e:.2f}", f"{search:.3f}"])
        else:
            sec_rows.append([st, 0, "-", "-"])
    text += ["**Seconds per found bug** (this machine). End to end: process start (interpreter, imports, "
             "building the target, discovering its sites) + the bug's site search + confirmation and a "
             "fresh-rebuild replay. Search only: the site's search to the trigger. Beside them, as published "
             f"on their authors' machines: Soft Assertion fuzzer {SOFT_ASSERTION_S} s, RANUM {RANUM_S} s per bug.\n",
             table(["strategy", "bugs found", "end to end (s, mean)", "search only (s, mean)"], sec_rows), ""]

    missed = [(s, b) for s, b in bugs if not any(outcome[(b.id, st)]["found"] for st in strategies)]
    if missed:
        text.append("**Missed by every strategy** (the search of the bug's own site, per strategy):\n")
        for s, b in missed:
            notes = [f"{st}: {n}" for st in strategies
                     if (n := miss_note(b, results.get((subject_key(s), st))))]
            text.append(f"- {b.id} ({b.op}): " + (" | ".join(notes) if notes else "no search of its site"))
        text.append("")

    an = anomalies(runnable, results, strategies)
    text.append(f"**Findings that fail a fresh replay: {len(an['failed_replay'])}** (must be 0)"
                + (": " + "; ".join(t for t, _ in an["failed_replay"]) if an["failed_replay"] else "") + ".")
    text.append(f"Candidates the engine's own replay discarded: {len(an['discarded'])}. "
                f"Sites whose search (within its budget; the engine's probe outside the bounds excluded) saw "
                f"a non-finite value elsewhere and ended without a finding there: "
                f"{len(an['nan_no_finding'])}. Crashes: {len(an['crash'])}.\n")
    if an["other"]:
        seen = sorted({t.split(" ", 2)[0] + " " + t.split(" ", 2)[2] for t, _ in an["other"]})
        text.append("Other confirmed findings (not at GRIST's op): " + "; ".join(f"`{x}`" for x in seen) + ".\n")
    if an["failed_replay"] or an["nan_no_finding"] or an["crash"] or an["discarded"]:
        text.append("<details><summary>Engine anomalies</summary>\n")
        for t, f in an["failed_replay"]:
            text.append(f"- finding that fails a fresh replay: {t} ({f})")
        for t, op in an["discarded"]:
            text.append(f"- candidate discarded by the engine's replay: {t} (first op {op})")
        for t, n, ops in an["nan_no_finding"]:
            text.append(f"- non-finite during the search, no finding: {t}: {n} steps, first op {ops}")
        for t, e in an["crash"]:
            text.append(f"- crash: {t}: {e}")
        text.append("\n</details>\n")
    blocked = [s for s in subjects if not s.runnable]
    text.append("**Subjects that cannot run here**: " + (
        "; ".join(f"ID_{s.id} {s.name} ({s.framework}): {s.reason}" for s in blocked) if blocked else "none")
        + (". Registries not yet written: " + "; ".join(missing) if missing else "") + ".")
    return "\n".join(text)


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frameworks", nargs="+", choices=list(REGISTRIES), default=list(REGISTRIES))
    ap.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES))
    ap.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS)
    ap.add_argument("--subjects", nargs="*", help="GRIST subject ids (26 or ID_26)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=TASK_TIMEOUT_S, help="seconds per (subject, strategy) process")
    ap.add_argument("--rerun", action="store_true", help="ignore cached results")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: report the newest result of each (subject, strategy), any code version, "
                         "from the cache or the committed record")
    ap.add_argument("--no-write", action="store_true", help="print the section; leave RESULTS.md alone")
    ap.add_argument("--cache", default=CACHE.relative_to(ROOT).as_posix(),
                    help="cache folder, relative to the repository root (default: %(default)s)")
    ap.add_argument("--json", help="also write the per-bug outcomes and anomalies to this JSON file")
    ap.add_argument("--note", default="", help="a sentence for the section (the conditions of the run)")
    ap.add_argument("--section", help="write the section grist_suite_SECTION instead of the suite's own "
                                      "(a subset of subjects, another budget)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.section is not None and not re.fullmatch(r"[a-z0-9_]+", args.section):
        ap.error(f"--section: {args.section!r} is not a section name (lower-case letters, digits and _)")
    if args.subjects and not (args.no_write or args.section):
        # the suite's section holds every subject: a run of a few would replace it with them alone
        ap.error("--subjects: a run of a few subjects writes no section of its own; add --no-write (then "
                 "--report-only rebuilds the suite's section from its results and the record) or --section NAME")

    if args.worker:
        result = worker(json.loads(args.worker))
        Path(args.worker_out).write_text(json.dumps(result))
        return 0

    os.chdir(ROOT)
    all_subjects, missing = load_subjects(args.frameworks)
    subjects = pick(all_subjects, args.subjects)
    tasks = []
    for subj in subjects:
        if not subj.runnable:
            continue
        version = code_version(subj)
        tasks += [make_task(subj, st, args.max_steps, args.seed, args.cache, version) for st in args.strategies]
    t0 = time.time()
    results = run_all(tasks, args.jobs, args.timeout, args.rerun, args.report_only)
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    # the frameworks the section covers: those of the subjects it holds
    frameworks = [f for f in args.frameworks if any(s.framework == f for s in subjects)] or args.frameworks
    body = report(subjects, results, args.strategies, args.max_steps, frameworks, missing, args.seed, args.note,
                  args.section or "")
    print(body)
    if args.json:
        runnable = [s for s in subjects if s.runnable]
        outcomes = {b.id: {st: bug_outcome(s, b, results.get((subject_key(s), st)), s.budget(args.max_steps))
                           for st in args.strategies} for s in runnable for b in s.bugs}
        Path(args.json).write_text(json.dumps(
            {"max_steps": args.max_steps, "bugs": outcomes,
             "anomalies": anomalies(runnable, results, args.strategies)}, indent=1, default=str))
    if not args.no_write:
        from benchmarks._results import write_section

        name = "grist_suite" + ("" if set(frameworks) == set(REGISTRIES) else "_" + "_".join(frameworks))
        if args.section:
            name = f"grist_suite_{args.section}"
        cmd_args = [f"--frameworks {' '.join(frameworks)}", f"--max-steps {args.max_steps}"]
        if args.subjects:
            cmd_args.append("--subjects " + " ".join(args.subjects))
        if list(args.strategies) != list(STRATEGIES):
            cmd_args.append("--strategies " + " ".join(args.strategies))
        if args.section:
            cmd_args.append(f"--section {args.section}")
        write_section(name, body, script="grist_suite/run", args=" ".join(cmd_args))
        kept = write_record(tasks, results)
        print(f"kept {kept} results in {_rel(RECORD)}/ (commit them with RESULTS.md)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
