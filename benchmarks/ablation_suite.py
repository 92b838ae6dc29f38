"""The adaptive strategy in several arms, side by side, over the repository's whole subject set and seeds.

    python benchmarks/ablation_suite.py [--arms adaptive adaptive-no:escape ...] [--seeds 0 1 2 3 4]
                                        [--subjects ID_3 softmax_xent_mlp ...] [--jobs 2] [--max-steps 1000]
                                        [--record-as NAME] [--report-only] [--no-write]

**Subjects** (:func:`subjects`): every bug of GRIST's suite (``benchmarks/grist_suite``, 79 bugs; the four
whose settings differ, ID_28a to ID_28d, once in each setting: GRIST's and weights free), every buggy
program of ``campaigns/targets`` that ``benchmarks/steps_to_trigger.py`` searches (PyTorch and TensorFlow),
and the mixed-precision ones of ``benchmarks/precision.py`` under its settings. A GRIST bug is searched on
its own sites only (the searched sites on the lines marked ``# GRIST bug <id>``, as
``benchmarks/grist_suite/ablation.py``) and counts as found when the engine confirms a candidate
(``finding_from``: every replay reproduces it) at the marked line (``run.at_bug``), the candidates of
other ops that a search steps past included (an RBM's ``exp`` on the line of the ``log`` searched; worker
version 2, as ``run.py`` counts them: version 1 stepped past them uncounted); a program of
``campaigns/targets`` has no marks: every searched site is searched, and its figure is its fastest confirmed
finding (as ``steps_to_trigger.py``). Budget: ``--max-steps`` per site (GRIST's ID_17: its own 100). A miss
counts as the budget.

**Arms** (:func:`make_arm`): ``adaptive`` (the strategy as it is), ``adaptive-no:<tactic>`` (its tactic list
without one tactic), ``adaptive:<option>=<value>`` (one :class:`AdaptiveOptions` setting changed), and
``random`` (fresh random inputs, :data:`RANDOM_HARD_STEPS` steps, seed 0 only: it decides which subjects are
random-hard). ``--record-as NAME`` keeps the results of a run of ``adaptive`` under another arm's name: the
engine of another commit measured with this harness (``today``: the strategy before issue 56's redesign).

**Seeds**: the search seed (the site's batches and the program's randomness at each step); every target is
built with seed 0, so every seed searches the same program, as ``grist_suite/ablation.py`` does (a GRIST
VAE's pretraining is kept per factory seed, five minutes each).

**Cost**: one child process per program build builds the target once and runs every (arm, seed) asked for on
it, seed by seed, each seed's arms in turn (a :class:`SiteSearch` resets the runner to the factory's state);
``--jobs`` of them at once (at most 2 on this machine). A subject's sites are searched best-known first and each later site only up to the fewest
steps found so far: its figure (the fewest steps of any site that finds it) is the same, for less. Results are
cached per (build, seed, arm, code version) in ``benchmarks/ablation/.cache/``; each run keeps its arms'
results in ``benchmarks/ablation/record/<arm>.json`` (committed), from which the report is built. A run of
variants alone takes the full list's results from the record where it holds them at this code version
(:func:`recorded_full`), and runs the full list first otherwise.

**Report**: per arm and set (tuning, check), bugs found, median steps (all subjects; random-hard ones), each
per seed, and search seconds; per tactic of ``adaptive``, the arm without it against the full list on
the same engine (:func:`full_list`), and whether it earns its place (:func:`verdict`); per engine (an arm that is no variant), against ``today``
per set and over both, when the report shows it (:func:`against_baseline`). Every figure is taken at the
seeds an arm (or both arms of a comparison) was run at and on the subjects run at each (:func:`paired`).
The tuning and check sets are fixed by :func:`split` (a hash of the bug's or program's name), written
before any tuning. Writes ``docs/adaptive-ablation.md`` and the section
``ablation_suite`` of ``benchmarks/RESULTS.md``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HERE = ROOT / "benchmarks" / "ablation"
CACHE = HERE / ".cache"
RECORD = HERE / "record"
DOC = ROOT / "docs" / "adaptive-ablation.md"
WORKER_VERSION = "2"            # bump when what a worker measures changes (2: a finding stepped past counts)
MAX_STEPS = 1000
SEEDS = (0, 1, 2, 3, 4)
RANDOM_HARD_STEPS = 100         # random does not trigger the subject within this many steps: random-hard
SPLIT_SALT = "issue-56"         # the tuning / check split (split()); fixed before any tuning
ARM_TIMEOUT_S = 2400            # seconds per arm in a child process
CODE_CHANGED = "the code changed since this run was planned"
FULL = "full list"               # the report's name for full_list(): the full tactic list on an arm's engine
# the full list's records, oldest first: the nine tactics (b639164), the seven as worker version 1 measured
# them (the arms' own worker: it stepped past findings at the bug uncounted), the seven as now measured, the
# six (the seven less `curvature`, which did not earn its place): the last is the engine of now
FULL_RECORDS = ("adaptive", "seven-v1", "seven", "six")
OLDER_WORKER = ("adaptive", "seven-v1")     # measured by worker version 1: not compared with BASELINE (version 2)
FULL_WHICH = ("the record's result at the arm's own code version: `adaptive`, the nine tactics of b639164, at "
              "the seeds it was run at, `seven-v1` (the seven, measured by worker version 1 as the arms were) "
              "at the others")
BASELINE = "today"              # the record's arm of the strategy before issue 56's redesign (755b291)


# ----------------------------------------------------------------------------- subjects
@dataclass(frozen=True)
class Subject:
    """One bug to find: a GRIST bug in one setting, or a buggy program of ``campaigns/targets``."""

    key: str                    # "ID_28a@grist", "ID_3", "softmax_xent_mlp"
    name: str                   # the bug or program: what the split hashes (a bug's two settings split alike)
    kind: str                   # "grist", "targets" or "precision"
    framework: str
    entry: str
    args: dict = field(default_factory=dict)
    search_weights: bool = False
    precision: dict | None = None   # benchmarks/precision.py's Subject fields for a mixed-precision program
    budget: int = MAX_STEPS
    marked: tuple[str, tuple[int, ...]] | None = None   # a GRIST bug's entry file and marked lines

    @property
    def build(self) -> str:
        """The program build this subject is searched in (several GRIST bugs share one)."""
        spec = [self.framework, self.entry, self.args, self.search_weights, self.precision]
        return hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def split(name: str) -> str:
    """"tuning" or "check": half each, by a hash of the bug's (or program's) name, fixed before any tuning."""
    return "tuning" if hashlib.sha256(f"{SPLIT_SALT}:{name}".encode()).digest()[0] % 2 == 0 else "check"


def subjects(max_steps: int = MAX_STEPS) -> list[Subject]:
    from benchmarks.grist_suite import run as suite
    from benchmarks.grist_suite.model import SETTINGS
    from benchmarks.precision import SUBJECTS as PRECISION
    from benchmarks.subjects import BUGGY, BUGGY_TF

    out: list[Subject] = []
    grist, _ = suite.load_subjects(list(suite.REGISTRIES))
    for subject in grist:
        if not subject.runnable:
            continue
        for bug in subject.bugs:
            path, lines = suite.bug_lines(bug)
            for setting in SETTINGS if bug.grist_setting is not None else ("free",):
                args, weights = bug.setting(setting)
                key = bug.id if bug.grist_setting is None else f"{bug.id}@{setting}"
                out.append(Subject(key, bug.id, "grist", subject.framework, bug.entry, args, weights,
                                   budget=subject.budget(max_steps), marked=(path, tuple(sorted(lines)))))
    for name, entry in {**BUGGY, **BUGGY_TF}.items():
        out.append(Subject(name, name, "targets", "tensorflow" if name.startswith("tf_") else "torch", entry,
                           budget=max_steps))
    for name, p in PRECISION.items():
        out.append(Subject(name, name, "precision", p.framework, f"campaigns/targets/{name}.py:make_target",
                           precision=asdict(p), budget=max_steps))
    return out


def pick(all_subjects: list[Subject], wanted: list[str] | None) -> list[Subject]:
    if not wanted:
        return all_subjects
    chosen = [s for s in all_subjects if s.key in wanted or s.name in wanted]
    unknown = [w for w in wanted if not any(w in (s.key, s.name) for s in all_subjects)]
    if unknown:
        raise SystemExit(f"ablation_suite.py: error: --subjects: no subject {', '.join(map(repr, unknown))} "
                         "(keys such as ID_3, ID_28a@grist, softmax_xent_mlp)")
    return chosen


# ----------------------------------------------------------------------------- arms
def make_arm(name: str):
    """The strategy object of an arm (see the module's docstring)."""
    from fuzz_core.strategies import make_strategy

    if name in ("adaptive", "random"):
        return make_strategy(name)
    from dataclasses import replace

    from fuzz_core.strategies.adaptive import DEFAULT_TACTICS, Adaptive, AdaptiveOptions

    if name.startswith("adaptive-no:"):
        drop = set(name.split(":", 1)[1].split("+"))
        known = {t.name for t in DEFAULT_TACTICS}
        if not drop <= known:
            raise ValueError(f"arm {name!r}: no tactic {sorted(drop - known)}; tactics: {sorted(known)}")
        return Adaptive(tactics=[t for t in DEFAULT_TACTICS if t.name not in drop])
    if name.startswith("adaptive:"):
        option, _, value = name.split(":", 1)[1].partition("=")
        default = getattr(AdaptiveOptions(), option)
        return Adaptive(options=replace(AdaptiveOptions(), **{option: type(default)(value)}))
    raise ValueError(f"unknown arm {name!r}")


def arm_budget(arm: str, subject: Subject) -> int:
    return min(RANDOM_HARD_STEPS, subject.budget) if arm == "random" else subject.budget


def code_version(subject: Subject, arm: str) -> str:
    """A hash of what an arm's result on a subject depends on: the engine's sources (the adaptive strategy's
    only for its own arms), the subject's program files, the harness's worker."""
    from benchmarks.grist_suite.run import suite_imports

    h = hashlib.sha1(WORKER_VERSION.encode())
    files = [p for p in sorted((ROOT / "fuzz_core").rglob("*.py"))
             if arm != "random" or "strategies/adaptive" not in p.relative_to(ROOT).as_posix()]
    path = ROOT / subject.entry.split(":", 1)[0]
    files.append(path)
    files.extend(sorted(p for p in path.parent.glob("_*.py")))
    files.extend(q for q in suite_imports(path) if q not in files)
    for p in files:
        h.update(p.relative_to(ROOT).as_posix().encode())
        h.update(p.read_bytes())
    h.update(json.dumps([subject.args, subject.search_weights, subject.precision, subject.budget,
                         list(subject.marked or ())], sort_keys=True).encode())
    return h.hexdigest()[:12]


# ----------------------------------------------------------------------------- worker (child process)
def _options(subject: Subject):
    from fuzz_core.backends.base import Precision, RunnerOptions

    if subject.precision is None:
        return RunnerOptions(search_weights=subject.search_weights)
    p = subject.precision
    return RunnerOptions(precision=Precision(autocast=p["autocast"], grad_scaler=p["grad_scaler"], policy=p["policy"]))


def search_subject(runner, spec, sites, subject: Subject, arm: str, seed: int, order: list[str]) -> dict[str, Any]:
    """Search the subject's sites with one arm: (found, steps, site, seconds) and what each search took."""
    from benchmarks.grist_suite.run import at_bug, on_lines
    from fuzz_core.engine import finding_from
    from fuzz_core.search import SearchConfig, SiteSearch

    own = [s for s in sites if s.searched and (subject.marked is None or on_lines(s.location, subject.marked[0],
                                                                                  set(subject.marked[1])))]
    rank = {label: i for i, label in enumerate(order)}
    own.sort(key=lambda s: rank.get(_label(s), len(rank)))
    budget = arm_budget(arm, subject)
    best: dict[str, Any] | None = None
    out: dict[str, Any] = {"found": False, "steps": budget, "site": None, "search_s": None, "sites": []}
    t_all = time.perf_counter()
    for site in own:
        limit = best["steps"] if best else budget
        config = SearchConfig(strategy="random" if arm == "random" else "adaptive", max_steps=limit, seed=seed,
                              search_weights=subject.search_weights, reach_steps=0)
        t0 = time.perf_counter()
        search = SiteSearch(runner, site, config, strategy=make_arm(arm))
        result = search.run(limit)
        events: dict[str, int] = {}
        _count(events, result.trace)

        def judged(result) -> dict[str, Any]:
            """The search's candidate confirmed (every replay reproduces it) and judged: found when it is
            at the bug (``run.at_bug``: the site's own op, or the first op to go non-finite, on a marked
            line; any confirmed candidate for a program without marked lines)."""
            finding = finding_from(runner, spec, site, config, result.candidate, result.seconds,
                                   minimise_batch=False)
            done, of = finding.replays
            out = {"steps": int(result.steps), "search_s": round(float(result.seconds), 3),
                   "confirmed": done == of, "own": bool(finding.site_triggered), "first_op": finding.first_op,
                   "location": site.location}
            out["found"] = bool(out["confirmed"] and (subject.marked is None or at_bug(out, _MarkedBug(subject))))
            return out

        passed: list[dict[str, Any]] = []
        while search.can_step_past():            # another op's finding first: confirm it, go on toward the site's own
            passed.append(search.report_and_step_past(lambda: judged(result)))
            if passed[-1]["found"]:              # ... unless it is at the bug (an RBM's exp on log's line):
                break                            # the bug is found there, as run.py counts it
            result = search.run(limit - search.step)
            _count(events, result.trace)
        rec: dict[str, Any] = {"site": _label(site), "steps": int(result.steps), "status": str(result.status),
                               "search_s": round(float(result.seconds), 3), "events": events, "found": False,
                               "acts": dict(search.strategy_state.get("core.acts") or {})}
        if passed:
            rec["passed"] = passed
        if passed and passed[-1]["found"]:
            rec.update(passed[-1], status="stepped past")
        elif result.candidate is not None:
            rec.update(judged(result))
        rec["wall_s"] = round(time.perf_counter() - t0, 3)
        out["sites"].append(rec)
        if rec["found"] and (best is None or rec["steps"] < best["steps"]):
            best = rec
    if best is not None:
        out.update(found=True, steps=best["steps"], site=best["site"], search_s=best["search_s"])
    out["total_s"] = round(time.perf_counter() - t_all, 3)
    return out


class _MarkedBug:
    """What ``run.at_bug`` reads of a bug (its entry and id), for a subject's marked lines."""

    def __init__(self, subject: Subject) -> None:
        self.entry, self.id = subject.entry, subject.name


def _label(site) -> str:
    return f"{site.op}@{site.location}#{site.occurrence}"


def _count(events: dict[str, int], trace) -> None:
    """Steps per event label (each a tactic's name, in the adaptive strategy): who took the steps."""
    for point in trace:
        events[point.event] = events.get(point.event, 0) + 1


def worker(task: dict[str, Any]) -> None:
    """Build the task's program once, run each arm over its subjects, write each arm's results as it ends."""
    os.chdir(ROOT)
    subs = [Subject(**{**s, "marked": tuple(s["marked"]) if s["marked"] else None}) for s in task["subjects"]]
    for arm, versions in task["versions"].items():
        changed = [s.key for s in subs if code_version(s, arm) != versions[s.key]]
        if changed:      # the sources changed since the run was planned: its results would be misnamed
            raise SystemExit(f"{CODE_CHANGED} ({arm}: {', '.join(changed)}): run again")
    first = subs[0]
    if first.framework == "torch":
        import torch

        torch.set_num_threads(1)
    from fuzz_core.engine import TargetSpec, build_runner, discover_sites

    t0 = time.time()
    spec = TargetSpec(f"ablation-{first.build}", first.entry, dict(first.args), framework=first.framework, seed=0)
    runner = build_runner(spec, _options(first))
    sites = discover_sites(runner, 0)
    setup_s = round(time.time() - t0, 3)
    for arm, seed, out_file in task["runs"]:
        res: dict[str, Any] = {"arm": arm, "seed": seed, "setup_s": setup_s, "engine": _engine(), "subjects": {}}
        for s in subs:
            try:
                res["subjects"][s.key] = search_subject(runner, spec, sites, s, arm, seed,
                                                        task["order"].get(s.key, []))
            except Exception as exc:  # noqa: BLE001 - a crash is a result: a miss with its error
                import traceback

                res["subjects"][s.key] = {"found": False, "steps": arm_budget(arm, s), "error":
                                          "".join(traceback.format_exception_only(type(exc), exc)).strip()[-400:]}
                runner = build_runner(spec, _options(first))
            res["subjects"][s.key]["version"] = task["versions"][arm][s.key]
        Path(out_file).parent.mkdir(parents=True, exist_ok=True)
        Path(out_file).write_text(json.dumps(res, default=str))


def _engine() -> str:
    from benchmarks.grist_suite.run import engine_revision

    return engine_revision()


# ----------------------------------------------------------------------------- driver
def cache_file(build: str, seed: int, arm: str, version: str) -> Path:
    safe = arm.replace(":", "~").replace("/", "_")
    return CACHE / f"{build}-s{seed}-{safe}-{version}.json"


def plan(subs: list[Subject], arms: list[str], seeds: list[int], rerun: bool,
         full: dict[tuple, dict] | None = None) -> tuple[list[dict], dict]:
    """The child tasks still to run, and the results already cached: {(arm, key, seed): result}.

    ``full``: results of the arm ``adaptive`` at this code version. A variant of it (:func:`tactics_of`) on a
    build and seed where none of its tactics acted in ``full`` is that result by construction (a tactic
    that never acted changed nothing: ``tests/test_adaptive_tactics.py``); it is written as such,
    ``inferred``, and not run."""
    builds: dict[str, list[Subject]] = {}
    for s in subs:
        builds.setdefault(s.build, []).append(s)
    versions = {arm: {s.key: code_version(s, arm) for s in subs} for arm in arms}
    order = _site_order()
    cached: dict[tuple, dict] = {}
    tasks = []
    for build, members in builds.items():
        todo = []
        for seed in seeds:                      # seed by seed, each seed's arms in turn: a fixed order
            for arm in arms:
                if arm == "random" and seed != 0:
                    continue
                version = hashlib.sha1("".join(versions[arm][s.key] for s in members).encode()).hexdigest()[:12]
                path = cache_file(build, seed, arm, version)
                if rerun or not path.exists():
                    same = _inferred(arm, members, seed, full or {})
                    if same is None:
                        todo.append((arm, seed, str(path)))
                        continue
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps({"arm": arm, "seed": seed, "subjects": same}))
                for key, r in json.loads(path.read_text())["subjects"].items():
                    cached[(arm, key, seed)] = r
        if todo:
            tasks.append({"build": build, "runs": todo, "subjects": [_plain(s) for s in members],
                          "versions": {a: {s.key: versions[a][s.key] for s in members} for a in arms},
                          "order": {s.key: order.get(s.key, []) for s in members}})
    return tasks, cached


def _inferred(arm: str, members: list[Subject], seed: int, full: dict[tuple, dict]) -> dict | None:
    """The arm's results on a build and seed, when none of its tactics acted there in ``full``, or when the
    full list missed every subject of the build at every seed (a variant is not run on a subject no arm of
    the strategy finds: counted a miss, ``not_run``); else None."""
    tactics = tactics_of(arm)
    if tactics is None:
        return None
    out = {}
    for s in members:
        r = full.get(("adaptive", s.key, seed))
        if r is None or "error" in r:
            return None
        runs = [v for (a, k, _), v in full.items() if a == "adaptive" and k == s.key]
        if runs and not any(v.get("found") for v in runs):
            out[s.key] = {"found": False, "steps": s.budget, "version": r.get("version"), "not_run": True}
            continue
        acts = r["acts"] if "acts" in r else _acts(r)
        if any(acts.get(t) for t in tactics):
            return None
        out[s.key] = {**r, "inferred": True}
    return out


def _plain(s: Subject) -> dict:
    return {**asdict(s), "marked": list(s.marked) if s.marked else None}


def _site_order() -> dict[str, list[str]]:
    """Per subject, its sites by how fast the newest record found the subject there (the finding site first)."""
    out: dict[str, list[str]] = {}
    for path in sorted(RECORD.glob("*.json")):
        for key, per_seed in json.loads(path.read_text()).get("subjects", {}).items():
            for r in per_seed.values():
                if r.get("site") and r["site"] not in out.setdefault(key, []):
                    out[key].insert(0, r["site"])
    return out


def run_task(task: dict, timeout: float) -> dict[tuple, dict]:
    """One child process; the results of the arms it wrote (a crashed or late child: its missing arms, errors)."""
    from benchmarks.grist_suite.run import json_child

    t0 = time.time()
    _, failure = json_child([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(task)],
                            timeout * len(task["runs"]))
    if failure and CODE_CHANGED in failure:     # no result of the engine: nothing to record as a miss
        raise SystemExit(f"ablation_suite.py: {failure}")
    out: dict[tuple, dict] = {}
    for arm, seed, path in task["runs"]:
        p = Path(path)
        if p.exists():
            for key, r in json.loads(p.read_text())["subjects"].items():
                out[(arm, key, seed)] = r
        else:
            for s in task["subjects"]:
                out[(arm, s["key"], seed)] = {"found": False, "steps": s["budget"], "error": failure or "no result"}
    found = sum(r.get("found", False) for r in out.values())
    print(f"  {task['subjects'][0]['key']:24s} {len(task['runs'])} (arm, seed) runs, "
          f"{len(out)} results, {found} found, {time.time() - t0:6.0f} s" + (f"  [{failure}]" if failure else ""),
          flush=True)
    return out


def run(subs: list[Subject], arms: list[str], seeds: list[int], jobs: int, rerun: bool) -> dict[tuple, dict]:
    """Every (subject, arm, seed): first the arms that are no variant of ``adaptive`` (``adaptive`` itself
    among them when a variant is asked for), then the variants, inferred where they can be (:func:`plan`)."""
    variants = [a for a in arms if tactics_of(a) is not None]
    first = [a for a in arms if a not in variants]
    recorded = recorded_full(subs, seeds) if variants and "adaptive" not in first else None
    if variants and "adaptive" not in first and recorded is None:
        first.append("adaptive")
    results = _run(subs, first, seeds, jobs, rerun) if first else {}
    if variants:
        full = recorded or {k: r for k, r in results.items() if k[0] == "adaptive"}
        results.update(_run(subs, variants, seeds, jobs, rerun, full))
    return results


def recorded_full(subs: list[Subject], seeds: list[int]) -> dict[tuple, dict] | None:
    """The full list's results that the variants are inferred from, taken from the record (:func:`full_list`)
    instead of run again, when it holds every (subject, seed) at this code version (the same engine, program
    and worker: the same search); else None."""
    versions = {s.key: code_version(s, "adaptive") for s in subs}
    now = {(s.key, seed): {"version": versions[s.key]} for s in subs for seed in seeds}
    full = full_list(subs, seeds, now)
    if any(r is None or "error" in r or r.get("version") != now[k]["version"] for k, r in full.items()):
        return None
    return {("adaptive", *k): r for k, r in full.items()}


def _run(subs: list[Subject], arms: list[str], seeds: list[int], jobs: int, rerun: bool,
         full: dict[tuple, dict] | None = None) -> dict[tuple, dict]:
    tasks, results = plan(subs, arms, seeds, rerun, full)
    # the cheapest first (the full arm's seconds in this run, else the record's), so that a run cut short
    # leaves the most builds with every arm measured: the report can be built from those alone
    cost = _record_seconds()
    for (arm, key, _), r in (full or {}).items():
        cost[key] = max(cost.get(key, 0.0), float(r.get("total_s") or 0))
    tasks.sort(key=lambda t: sum(cost.get(s["key"], 30.0) for s in t["subjects"]) * len(t["runs"]))
    inferred = sum(bool(r.get("inferred")) for r in results.values())
    print(f"{', '.join(arms)}: {len(results)} results cached ({inferred} inferred), {len(tasks)} child processes "
          f"to run with {jobs} job(s)", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for out in pool.map(lambda t: run_task(t, ARM_TIMEOUT_S), tasks):
            results.update(out)
    return results


def _record_seconds() -> dict[str, float]:
    out: dict[str, float] = {}
    for path in RECORD.glob("*.json"):
        for key, per_seed in json.loads(path.read_text()).get("subjects", {}).items():
            out[key] = max([out.get(key, 0.0)] + [float(r.get("total_s") or 0) for r in per_seed.values()])
    return out


def load_record(arm: str) -> dict[str, dict[str, dict]]:
    path = RECORD / f"{arm.replace(':', '~')}.json"
    return json.loads(path.read_text())["subjects"] if path.exists() else {}


def keep(results: dict[tuple, dict], record_as: dict[str, str]) -> list[str]:
    """Merge the run's results into the committed record, one file per arm (``record_as``: arm -> its name
    there); the arms written."""
    by_arm: dict[str, dict] = {}
    for (arm, key, seed), r in results.items():
        by_arm.setdefault(record_as.get(arm, arm), {}).setdefault(key, {})[str(seed)] = _slim(r)
    RECORD.mkdir(parents=True, exist_ok=True)
    for arm, subjects_ in by_arm.items():
        path = RECORD / f"{arm.replace(':', '~')}.json"
        kept = json.loads(path.read_text()) if path.exists() else {}
        merged = kept.get("subjects", {})
        for key, per_seed in subjects_.items():
            merged.setdefault(key, {}).update(per_seed)
        engines = set(kept.get("engines", [])) | {_engine()}
        path.write_text(json.dumps({**kept, "arm": arm, "engines": sorted(engines),
                                    "subjects": {k: dict(sorted(v.items())) for k, v in sorted(merged.items())}},
                                   indent=0, sort_keys=True) + "\n")
    return sorted(by_arm)


def _slim(r: dict) -> dict:
    """A result as the record keeps it: the outcome, the seconds, how often each tactic acted."""
    keepers = ("found", "steps", "site", "search_s", "total_s", "version", "error", "inferred", "not_run")
    acts = r.get("acts") if "acts" in r else _acts(r)
    return {**{k: r[k] for k in keepers if k in r and r[k] is not None}, **({"acts": acts} if acts else {})}


def _acts(r: dict) -> dict[str, int]:
    """How often each tactic acted on a subject (a step it took, a reaction), over all its sites' searches."""
    out: dict[str, int] = {}
    for site in r.get("sites", []):
        for k, n in (site.get("acts") or {}).items():
            out[k] = out.get(k, 0) + n
    return out


def tactics_of(arm: str) -> tuple[str, ...] | None:
    """The tactics whose acting an arm changes (it removes them, or changes a setting they read), or None
    for an arm that is not a variant of ``adaptive``."""
    if arm.startswith("adaptive-no:"):
        return tuple(arm.split(":", 1)[1].split("+"))
    if arm.startswith("adaptive:"):
        from dataclasses import fields as fields_of

        from fuzz_core.strategies.adaptive import AdaptiveOptions

        option = arm.split(":", 1)[1].partition("=")[0]
        return tuple(next(f.metadata["tactics"] for f in fields_of(AdaptiveOptions) if f.name == option))
    return None


# ----------------------------------------------------------------------------- report
def outcomes(arm: str, subs: list[Subject], seeds: list[int]) -> dict[tuple[str, int], dict]:
    """(subject, seed) -> result of an arm, from the record; a missing one is None."""
    rec = load_record(arm)
    return {(s.key, seed): rec.get(s.key, {}).get(str(seed)) for s in subs for seed in seeds}


def per_seed(o: dict[tuple[str, int], dict], subs: list[Subject], seeds: list[int], budget_of) -> dict[str, list]:
    """Per seed: bugs found (all, tuning, check), median steps (all, random-hard), search seconds, of an arm's
    results ``o`` (its :func:`outcomes`, or a part of them)."""
    hard = random_hard(subs)
    out: dict[str, list] = {k: [] for k in ("found", "tuning", "check", "median", "median_hard", "seconds",
                                            "missing")}
    for seed in seeds:
        rs = {s.key: o[(s.key, seed)] for s in subs}
        steps = {k: (r["steps"] if r and r.get("found") else budget_of[k]) for k, r in rs.items()}
        found = {k for k, r in rs.items() if r and r.get("found")}
        out["found"].append(len(found))
        out["tuning"].append(sum(split(s.name) == "tuning" for s in subs if s.key in found))
        out["check"].append(sum(split(s.name) == "check" for s in subs if s.key in found))
        out["median"].append(statistics.median(steps.values()))
        out["median_hard"].append(statistics.median([steps[k] for k in hard]) if hard else None)
        out["seconds"].append(sum(float(r.get("total_s") or 0) for r in rs.values() if r))
        out["missing"].append(sum(r is None for r in rs.values()))
    return out


def full_list(subs: list[Subject], seeds: list[int],
              like: dict[tuple[str, int], dict] | None = None) -> dict[tuple[str, int], dict]:
    """The full tactic list's results, that an arm without a tactic (or with a setting changed) is measured
    against: the record of the engine each arm's seeds were run on. Seeds 0 to 2 of the tactics' arms ran on
    b639164's nine tactics (the record ``adaptive``); after two of the nine were removed, later seeds on the
    seven (``seven-v1``: the seven measured by the worker of version 1, as those arms were; ``seven`` holds
    them measured now, ``six`` the six that remain), so a (subject, seed) result is the first of
    :data:`FULL_RECORDS` that has one; but where ``like`` (the arm's results) names the code version it ran
    at, the record's result at that same version comes first: an arm run later on the seven at a seed the
    nine also ran, or by a later worker."""
    recs = [outcomes(a, subs, seeds) for a in FULL_RECORDS]
    out = {}
    for k in recs[0]:
        have = [r[k] for r in recs if r[k] is not None]
        version = ((like or {}).get(k) or {}).get("version")
        same = [r for r in have if version and r.get("version") == version]
        out[k] = (same or have or [None])[0]
    return out


def random_hard(subs: list[Subject]) -> list[str]:
    """The subjects ``random`` (seed 0, :data:`RANDOM_HARD_STEPS` steps) does not find."""
    o = outcomes("random", subs, [0])
    return [s.key for s in subs if not (o[(s.key, 0)] or {}).get("found", False)]


def verdict(full: dict[str, list], without: dict[str, list]) -> tuple[bool, str]:
    """Does a tactic earn its place? Removing it must cost found bugs or median steps by more than the full
    arm's seed-to-seed spread: the bugs lost, summed over the seeds, more than the range (max - min) of the
    full arm's bugs found per seed; or the mean over the seeds of the median steps (all subjects, or the
    random-hard ones) raised by more than the range of the full arm's medians per seed."""
    reasons = []
    lost = sum(full["found"]) - sum(without["found"])
    spread = max(full["found"]) - min(full["found"])
    if lost > spread:
        reasons.append(f"{lost} (bug, seed) finds lost > spread {spread}")
    for key, what in (("median", "median"), ("median_hard", "random-hard median")):
        if None in full[key] or None in without[key]:
            continue
        d = statistics.mean(without[key]) - statistics.mean(full[key])
        spread_m = max(full[key]) - min(full[key])
        if d > spread_m:
            reasons.append(f"{what} +{d:g} steps > spread {spread_m:g}")
    why = "; ".join(reasons) or "within the spread"
    if len(full["found"]) == 1:
        why += " (at one seed: no spread to tell chance from cost)"
    return bool(reasons), why


def against_baseline(base: dict[str, list], other: dict[str, list]) -> str:
    """Is an engine no worse than the strategy before the redesign (``BASELINE``)? "No worse": as many
    (bug, seed) finds or more, and the mean over the seeds of each median (all subjects, random-hard ones) no
    higher; "worse, within the spread": fewer finds or a higher median, by no more than the baseline's own
    seed-to-seed range (as :func:`verdict` reads a tactic); "worse" beyond it; at one seed, only "worse at
    its one seed"."""
    worse, beyond = [], False
    lost = sum(base["found"]) - sum(other["found"])
    if lost > 0:
        spread = max(base["found"]) - min(base["found"])
        beyond |= lost > spread
        worse.append(f"{lost} (bug, seed) finds fewer (spread {spread})")
    for key, what in (("median", "median"), ("median_hard", "random-hard median")):
        if None in base[key] or None in other[key]:
            continue
        d = statistics.mean(other[key]) - statistics.mean(base[key])
        if d > 0:
            spread_m = max(base[key]) - min(base[key])
            beyond |= d > spread_m
            worse.append(f"{what} +{d:g} steps (spread {spread_m:g})")
    if not worse:
        return "**no worse**"
    if len(base["found"]) < 2:
        return "worse at its one seed (no spread to tell chance from cost): " + "; ".join(worse)
    return ("**worse**: " if beyond else "worse, within the spread: ") + "; ".join(worse)


def _fmt(xs: list, digits: int = 0) -> str:
    if any(x is None for x in xs):
        return "-"
    mean = statistics.mean(xs)
    text = f"{mean:.{digits}f}" if digits else f"{mean:.1f}".rstrip("0").rstrip(".")
    return f"{text} ({', '.join(f'{x:g}' for x in xs)})"


def ran(got: dict[tuple[str, int], dict], subs: list[Subject], seeds: list[int]) -> list[int]:
    """The seeds an arm was run at, on any of ``subs`` (``got``: its :func:`outcomes`)."""
    return [seed for seed in seeds if any(got[(s.key, seed)] is not None for s in subs)]


def paired(got: dict[str, dict], a: str, b: str, subs: list[Subject],
           seeds: list[int]) -> tuple[list[Subject], list[int]]:
    """The seeds both arms were run at, and the subjects both were run on at every one of them: what two
    arms are compared on (a result not run is no miss of either)."""
    common = [seed for seed in ran(got[a], subs, seeds) if seed in ran(got[b], subs, seeds)]
    both = [s for s in subs if all(got[x][(s.key, seed)] is not None for x in (a, b) for seed in common)]
    return both, common


def per_set(got: dict[str, dict], a: str, b: str, parts: list[tuple[str, list[Subject]]], subs: list[Subject],
            seeds: list[int]):
    """Two arms compared per set and over both: (set, subjects, seeds) for each set where both ran (at the
    seeds and on the subjects of :func:`paired`), then ("all", ...) over the whole suite at the seeds both
    sets were compared at, when both were."""
    at_set: dict[str, list[int]] = {}
    for name, part in parts:
        both, at = paired(got, a, b, part, seeds)
        if both and at:
            at_set[name] = at
            yield name, both, at
    if len(at_set) == len(parts) > 1:
        common = [x for x in seeds if all(x in at for at in at_set.values())]
        both, at = paired(got, a, b, subs, common)
        if both and at:
            yield "all", both, at


def grist_settings(subs: list[Subject]) -> list[tuple[str, list[Subject]]]:
    """GRIST's bugs among ``subs`` in each of the two settings (issue 56, item 5): GRIST's (inputs, and where
    GRIST searched a variable, ID_28a-d's gain, that variable in GRIST's bound: the ``@grist`` subjects) and
    weights free (RANUM's kind of search, every trainable weight searched: the ``@free`` ones); every other
    bug is searched the same way in both, so it is in both."""
    from benchmarks.grist_suite.model import SETTINGS

    names = {"grist": "GRIST's setting", "free": "weights free"}
    grist = [s for s in subs if s.kind == "grist"]
    return [(names[setting], [s for s in grist if s.key.partition("@")[2] in ("", setting)]) for setting in SETTINGS]


def report(subs: list[Subject], arms: list[str], seeds: list[int]) -> str:
    from benchmarks._results import table

    budget_of = {s.key: s.budget for s in subs}
    hard = random_hard(subs)
    tuning = [s for s in subs if split(s.name) == "tuning"]
    got = {arm: outcomes(arm, subs, seeds) for arm in arms}          # each arm's record, read once
    parts = [(name, [s for s in subs if split(s.name) == name]) for name in ("tuning", "check")]
    rows = []
    for arm in arms:
        for name, part in parts:      # per set: the seeds the arm was run at there, the subjects it ran at each
            at = ran(got[arm], part, seeds)
            ran_on = [s for s in part if all(got[arm][(s.key, seed)] is not None for seed in at)]
            if not at or not ran_on:
                continue
            st = per_seed(got[arm], ran_on, at, budget_of)
            rows.append([f"`{arm}`", name, ", ".join(map(str, at)), f"{len(ran_on)} of {len(part)}",
                         _fmt(st["found"]), _fmt(st["median"]), _fmt(st["median_hard"]), f"{sum(st['seconds']):.0f}"])
    n_hard_t = sum(1 for s in tuning if s.key in hard)
    text = [
        "## The adaptive strategy's arms, side by side (issue 56)\n",
        f"{len(subs)} subjects{_which(subs)}: {sum(s.kind == 'grist' for s in subs)} of GRIST's bugs (ID_28a-d "
        f"once in each setting, GRIST's and weights free), {sum(s.kind == 'targets' for s in subs)} buggy "
        f"programs of `campaigns/targets` and {sum(s.kind == 'precision' for s in subs)} mixed-precision ones; "
        f"seeds {', '.join(map(str, seeds))} (the search seed; every program built with seed 0), each arm at "
        f"those it was run at (`seeds`); budget {MAX_STEPS} steps per site (ID_17: 100); "
        "a miss counts as the budget. Tuning set "
        f"{len(tuning)} subjects ({n_hard_t} random-hard), check set {len(subs) - len(tuning)} "
        f"({len(hard) - n_hard_t} random-hard), split by a hash of the name before any tuning. Random-hard: "
        f"`random` (seed 0) does not find it within {RANDOM_HARD_STEPS} steps: {len(hard)} subjects; a subject "
        "random inputs trigger in a few steps tests nothing, so their median is given apart. A cell: the mean "
        "over the arm's seeds (each seed's value). Each arm per set, at the seeds it was run at there "
        "(`seeds`), on the subjects it was run on at each of them (`subjects`). Seconds: every search and "
        "confirmation of the arm on those, all its seeds, one thread each, on this shared machine.\n",
        table(["arm", "set", "seeds", "subjects", "found", "median steps", "median steps, random-hard",
               "seconds"], rows), ""]
    ablated = [a for a in arms if a.startswith("adaptive-no:") or a.startswith("adaptive:")]
    if ablated:
        vrows = []
        for arm in ablated:
            ref = {**got, FULL: full_list(subs, seeds, got[arm])}
            for name, both, at in per_set(ref, FULL, arm, parts, subs, seeds):
                f_st, a_st = (per_seed(ref[a], both, at, budget_of) for a in (FULL, arm))
                keep_, why = verdict(f_st, a_st)
                vrows.append([f"`{arm}`", name, ", ".join(map(str, at)), f"{len(both)}", _fmt(f_st["found"]),
                              _fmt(a_st["found"]), _fmt(f_st["median_hard"]), _fmt(a_st["median_hard"]),
                              _fmt(f_st["median"]), _fmt(a_st["median"]),
                              ("**earns its place**: " if keep_ else "does not earn its place: ") + why])
        text += [f"Each tactic and setting against the full list of tactics on the same engine ({FULL_WHICH}), "
                 "per set and over both, at the seeds both were run at "
                 "(`seeds`), on the subjects both were run on at each (`subjects`): " + verdict.__doc__.split("?", 1)[1]
                 .strip().replace("\n   ", "").replace("  ", " ") + "\n",
                 table(["arm", "set", "seeds", "subjects", "found with", "found without", "random-hard median with",
                        "without", "median with", "without", "verdict"], vrows), ""]
    # the engines (not an arm without a tactic), as this worker measures them (not the full list's older records)
    engines = [a for a in arms if tactics_of(a) is None and a not in OLDER_WORKER]
    if BASELINE in got:
        crows = []
        for arm in [a for a in engines if a != BASELINE]:
            for name, both, at in per_set(got, BASELINE, arm, parts, subs, seeds):
                b_st, a_st = (per_seed(got[a], both, at, budget_of) for a in (BASELINE, arm))
                crows.append([f"`{arm}`", name, ", ".join(map(str, at)), f"{len(both)}", _fmt(b_st["found"]),
                              _fmt(a_st["found"]), _fmt(b_st["median_hard"]), _fmt(a_st["median_hard"]),
                              _fmt(b_st["median"]), _fmt(a_st["median"]), against_baseline(b_st, a_st)])
        if crows:
            text += [f"Each engine against `{BASELINE}`, per set and over both, at the seeds both were run at "
                     "(`seeds`), on the subjects both were run on at each (`subjects`): "
                     + against_baseline.__doc__.split("?", 1)[1].strip().replace("\n   ", "").replace("  ", " ")
                     + "\n",
                     table(["arm", "set", "seeds", "subjects", f"found: `{BASELINE}`", "found",
                            f"random-hard median: `{BASELINE}`", "random-hard median", f"median: `{BASELINE}`",
                            "median", "verdict"], crows), ""]
    srows = []
    for arm in engines:
        for name, part in grist_settings(subs):
            at = [x for x in seeds if all(got[arm][(s.key, x)] is not None for s in part)]
            if part and at:
                st = per_seed(got[arm], part, at, budget_of)
                srows.append([f"`{arm}`", name, ", ".join(map(str, at)), f"{_fmt(st['found'])} of {len(part)}",
                              _fmt(st["median"]), _fmt(st["median_hard"])])
    if srows:
        text += ["GRIST's bugs in the two settings of issue 56's fifth point, each engine at the seeds it ran on "
                 "every one of them: **GRIST's setting** (inputs only, and where GRIST searched a variable, "
                 "ID_28a-d's gain, that variable in GRIST's bound [0, 16]) and **weights free** (RANUM's kind "
                 "of search: every trainable weight searched in the engine's box for weights); every other bug "
                 "is searched the same way in both. A miss counts as the budget.\n",
                 table(["engine", "setting", "seeds", "found", "median steps", "median steps, random-hard"],
                       srows), ""]
    detail = []
    for s in subs:
        cells = []
        for arm in arms:
            vals = [got[arm][(s.key, seed)] for seed in seeds]
            cells.append(" ".join("?" if v is None else str(v["steps"]) if v.get("found") else "-" for v in vals))
        detail.append([s.key, split(s.name), "yes" if s.key in hard else "", *cells])
    text += [f"<details><summary>Per subject: steps at seeds {', '.join(map(str, seeds))} (`-`: a miss; `?`: not "
             "run)</summary>\n",
             table(["subject", "set", "random-hard", *[f"`{a}`" for a in arms]], detail), "\n</details>\n"]
    return "\n".join(text)


def _which(subs: list[Subject]) -> str:
    """Which part of the whole subject set ``subs`` is, in words (empty for the whole set)."""
    every = subjects()
    if len(subs) == len(every):
        return ""
    sets = {split(s.name) for s in subs}
    if len(sets) != 1:
        return " (a part of the subject set)"
    name = sets.pop()
    size = sum(split(s.name) == name for s in every)
    return f" (the {name} set only)" if len(subs) == size else f" ({len(subs)} of the {name} set's {size})"


def write_doc(body: str) -> None:
    """Put the report between the generated-table markers of ``docs/adaptive-ablation.md`` (the rest of the
    page is written by hand: what each tactic answers, and what the table decided)."""
    start, end = "<!-- ablation_suite:start -->", "<!-- ablation_suite:end -->"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    text = DOC.read_text() if DOC.exists() else f"# The adaptive strategy's ablation\n\n{start}\n{end}\n"
    if start not in text:
        text = text.rstrip() + f"\n\n{start}\n{end}\n"
    head, rest = text.split(start, 1)
    DOC.write_text(f"{head}{start}\n{body.rstrip()}\n{end}{rest.split(end, 1)[1]}")


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", default=["adaptive"])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--subjects", nargs="*", help="subject keys or names (ID_3, ID_28a@grist, softmax_xent_mlp)")
    ap.add_argument("--set", choices=["tuning", "check"], help="only the subjects of one set (split())")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rerun", action="store_true", help="ignore cached results")
    ap.add_argument("--record-as", help="keep the results of the arm `adaptive` under this arm name (another engine)")
    ap.add_argument("--report-arms", nargs="+", help="the arms the report shows (default: --arms)")
    ap.add_argument("--report-only", action="store_true", help="run nothing: the report from the record")
    ap.add_argument("--no-write", action="store_true", help="print the report; leave docs/ and RESULTS.md alone")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        print("{}")
        return 0
    os.chdir(ROOT)
    subs = [s for s in pick(subjects(), args.subjects) if args.set is None or split(s.name) == args.set]
    if not args.report_only:
        for arm in args.arms:         # an arm to run; a report reads arms of the record's engines too
            try:
                make_arm(arm)
            except (ValueError, ImportError, AttributeError, TypeError) as exc:
                ap.error(f"--arms: {exc}")
        t0 = time.time()
        results = run(subs, args.arms, args.seeds, args.jobs, args.rerun)
        print(f"done in {time.time() - t0:.0f} s", flush=True)
        # the full list a variant needed and ran unasked is the engine of now: its record, not the nine's
        implicit = {} if "adaptive" in args.arms else {"adaptive": FULL_RECORDS[-1]}
        kept = keep(results, {"adaptive": args.record_as} if args.record_as else implicit)
        print(f"kept in {RECORD.relative_to(ROOT)}/: {', '.join(kept)}", flush=True)
    shown = args.report_arms or [args.record_as or a if a == "adaptive" else a for a in args.arms]
    if "random" not in shown and not (RECORD / "random.json").exists():
        print("(no random arm recorded yet: run --arms random --seeds 0 for the random-hard set)")
    everyone = subjects()
    body = report(subs if args.subjects or args.set else everyone, [a for a in shown if a != "random"], args.seeds)
    print(body)
    if not args.no_write:            # a part of the set too: the report's first line says which part
        from benchmarks._results import write_section

        write_doc(body)
        chosen = (["--set", args.set] if args.set else []) + (["--subjects", *args.subjects] if args.subjects else [])
        write_section("ablation_suite", body, script="ablation_suite",
                      args=" ".join(["--arms", *shown, "--seeds", *map(str, args.seeds), *chosen]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
