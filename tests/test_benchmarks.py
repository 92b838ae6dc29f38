"""The benchmark scripts import and run (a broken one would only show when someone reruns it)."""
from __future__ import annotations

import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")))
def test_benchmark_script_compiles(script: str):
    py_compile.compile(str(ROOT / "benchmarks" / script), doraise=True)


def test_write_section_replaces_its_block_and_names_the_arguments(tmp_path: Path, monkeypatch):
    from benchmarks import _results

    monkeypatch.setattr(_results, "RESULTS", tmp_path / "RESULTS.md")
    _results.write_section("demo", "first", script="demo_bench", args="--fast")
    _results.write_section("other", "kept")
    _results.write_section("demo", "second", script="demo_bench", args="--fast")
    text = (tmp_path / "RESULTS.md").read_text()
    assert "second" in text and "first" not in text and "kept" in text
    assert "_Written by `benchmarks/demo_bench.py --fast`" in text
    assert "_Written by `benchmarks/other.py`" in text


def test_steps_to_trigger_runs_on_one_subject():
    proc = subprocess.run([sys.executable, "benchmarks/steps_to_trigger.py", "--only", "softmax_xent_mlp",
                           "--strategies", "adaptive", "--max-steps", "20", "--no-write"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| softmax_xent_mlp |" in proc.stdout and "adaptive | 1/1" in proc.stdout, proc.stdout[-2000:]


def test_default_bounds_compares_the_boxes_on_one_subject():
    """Counts in [0, 1] (softmax_xent_mlp's pixels) get the box [0, 2] by the new rule, [-10, 10] by the old."""
    proc = subprocess.run([sys.executable, "benchmarks/default_bounds.py", "--only", "softmax_xent_mlp",
                           "--max-steps", "20", "--no-write"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| softmax_xent_mlp |"))
    assert row.endswith("| x [-10, 10] | x [0, 2] |"), row
    assert "| new | 1/1 |" in proc.stdout, proc.stdout[-2000:]


def test_raw_units_feeds_a_subject_scaled_inputs_and_keeps_its_program():
    import numpy as np
    import torch

    from benchmarks.subjects import subject_entry
    from benchmarks.targets.raw_units import make_target
    from fuzz_core import TargetError
    from fuzz_core.backends.torch import program_optimizers
    from fuzz_core.loader import load_factory

    plain = load_factory(subject_entry("log_one_minus_sigmoid"), ROOT)(pretrain_steps=5)
    raw = make_target("log_one_minus_sigmoid", scale=5.0, pretrain_steps=5)
    assert raw.bounds == {"x": (-15.0, 15.0)} and raw.search == ["x"]
    a, b = plain.sample(np.random.default_rng(0)), raw.sample(np.random.default_rng(0))
    np.testing.assert_allclose(b["x"], 5 * a["x"], rtol=1e-6)
    assert b["x"].dtype == np.float32 and np.array_equal(b["y"], a["y"])      # unsearched: as they are
    with torch.no_grad():
        same = [t.program({k: torch.as_tensor(v) for k, v in batch.items()}) for t, batch in ((plain, a), (raw, b))]
    assert torch.allclose(*same)
    # a train_step's optimizers stay visible to the runner through the wrapper (a GAN's two Adams)
    assert len(program_optimizers(make_target("gan_log_d", pretrain_steps=0))) == 2
    with pytest.raises(TargetError, match="scale"):
        make_target("log_one_minus_sigmoid", scale=0)


def _run(found_at: dict, unspent: dict, total: int) -> dict:
    return {"found_at": found_at, "unspent": unspent, "total": total, "max_steps": 100,
            "bugs": sorted([*found_at, *unspent])}


def test_steps_until_found_charges_a_missed_bug_its_campaign_and_unspent_budget():
    from benchmarks.scheduler_benefit import steps_until_found

    run = _run({"a": 40, "b": 90}, {"c": 70}, total=500)
    assert steps_until_found(run, ["a", "b"]) == 90
    assert steps_until_found(run, ["a", "b", "c"]) == 570
    assert steps_until_found(run, []) == 0


def _three(rr: tuple, ls: tuple, sh: tuple) -> dict:
    return {"round-robin": _run(*rr), "loss-slope": _run(*ls), "share": _run(*sh)}


def test_scheduler_benefit_judges_the_bugs_any_policy_finds_and_the_targets(monkeypatch):
    """A bug no policy finds is left out of the judged figure (it stays in the strict one); a bug
    only some policies miss is charged to those; the targets are judged on share's sums and seeds."""
    import benchmarks.scheduler_benefit as sb

    monkeypatch.setattr(sb, "SCHED_CAMPAIGNS", {"raw units": [("a", "log", 0), ("b", "div", 0), ("c", "exp", 0)]})
    seeds = {
        # seed 0: every policy misses c; loss-slope finds a and b three times sooner, share six times
        0: _three(({"a": 300, "b": 900}, {"c": 50}, 2000), ({"a": 100, "b": 300}, {"c": 50}, 1000),
                  ({"a": 100, "b": 150}, {"c": 50}, 1000)),
        # seed 16: loss-slope misses b, which the others find; share needs more than twice round-robin's
        16: _three(({"a": 300, "b": 600, "c": 900}, {}, 2000), ({"a": 100, "c": 200}, {"b": 40}, 1000),
                   ({"a": 100, "b": 1900, "c": 200}, {}, 2000)),
    }
    runs = {("raw units", st, po, seed): r for seed, by in seeds.items() for po, r in by.items()
            for st in ("grist", "adaptive")}
    text = sb.benefit_section("raw units", runs, [0, 16])
    assert "| grist | 0 | 2 | 2/3, 900 | 2/3, 300, **3.00x** | 2/3, 150, **6.00x** |" in text
    assert "| grist | 16 | 3 | 3/3, 900 | 2/3, 1040, **0.87x** | 3/3, 1900, **0.47x** |" in text
    assert "| grist | tuning: 0 | 900 | 300 | **3.00x** |" in text
    assert "| grist | held out (issue 3): 16 | 900 | 1040 | **0.87x** |" in text
    assert "| grist | all: 0, 16 | 1800 | 1340 | **1.34x** | 0.87x (seed 16), median 1.93x | 2050 | **0.88x** |" in text
    assert "target >= 3x: NOT met; no seed below 0.5x: NOT met, seed 16 (0.47x)" in text
    assert "target >= 2x: NOT met; no seed below 0.5x: NOT met, seed 16 (0.47x)" in text
    assert "Strict (every planted bug, a missed one charged): round-robin 2950, loss-slope 2090, share 2950" in text


def test_scheduler_benefit_meets_the_targets_when_share_is_good_enough(monkeypatch):
    import benchmarks.scheduler_benefit as sb

    monkeypatch.setattr(sb, "SCHED_CAMPAIGNS", {"raw units": [("a", "log", 0)]})
    runs = {}
    for st, (rr, sh) in {"grist": (900, 300), "adaptive": (900, 450)}.items():
        for seed in (24, 25):
            for po, n in (("round-robin", rr), ("loss-slope", rr), ("share", sh)):
                runs["raw units", st, po, seed] = _run({"a": n}, {}, total=n)
    text = sb.benefit_section("raw units", runs, [24, 25])
    assert "- grist, share, all 2 seeds: target >= 3x: met; no seed below 0.5x: met" in text
    assert "- adaptive, share, all 2 seeds: target >= 2x: met; no seed below 0.5x: met" in text
    assert "issue 16's first new seeds: 24-25" in text and "all:" not in text     # one group only


def test_scheduler_benefit_in_parts_reports_each_strategy_on_the_seeds_every_policy_ran(monkeypatch, tmp_path):
    """Runs saved by one part and merged into another come back exactly; a strategy is judged only on
    the seeds that every policy ran with it, and one that no part ran says so."""
    import benchmarks.scheduler_benefit as sb

    monkeypatch.setattr(sb, "SCHED_CAMPAIGNS", {"raw units": [("a", "log", 0)]})
    runs = {("raw units", "adaptive", po, seed): _run({"a": n}, {}, total=n)
            for seed in (16, 24) for po, n in (("round-robin", 900), ("loss-slope", 600), ("share", 300))}
    runs["raw units", "grist", "round-robin", 24] = _run({"a": 900}, {}, total=900)   # share never ran it
    path = tmp_path / "part.json"
    sb.save_runs(str(path), runs, real=10, served=20)
    back = sb.load_runs(str(path))
    assert back == {"real": 10, "served": 20, "runs": runs}
    assert sb.measured_seeds("raw units", "adaptive", runs, [24, 16, 3]) == [16, 24]
    assert sb.measured_seeds("raw units", "grist", runs, [16, 24]) == []
    text = sb.benefit_section("raw units", runs, [16, 24])
    assert "- grist: not run." in text
    assert "- adaptive, share, all 2 seeds: target >= 2x: met; no seed below 0.5x: met" in text
    assert "| adaptive | 24 | 1 | 1/1, 900 |" in text and "| grist |" not in text


@pytest.mark.slow
def test_search_cache_serves_exactly_what_the_real_search_gives(monkeypatch):
    """Two campaigns' worth of quanta, sliced differently and refreshed at different steps, served
    by one cache (the second mostly replayed, partly grown from checkpoints) against a real
    executor each: every quantum's outcome is the same."""
    import benchmarks.search_cache as cache_mod
    from benchmarks.subjects import subject_entry
    from fuzz_core.engine import TargetSpec
    from fuzz_core.search import SearchConfig
    from orchestrator.run.executors import LocalExecutor, Task
    from orchestrator.worker import Resume, WorkerOptions

    monkeypatch.setattr(cache_mod, "CHECKPOINT_EVERY", 8)
    spec = TargetSpec("sqrt_var_guarded", subject_entry("sqrt_var_guarded"), {}, seed=1, base_dir=str(ROOT))
    options = WorkerOptions(minimise=False)
    cache = cache_mod.SearchCache(options)
    sites = [s for s in cache.discover([spec])["sqrt_var_guarded"] if s.searched][:2]
    assert len(sites) == 2
    plans = [[(0, 7, False), (1, 5, False), (0, 13, True), (1, 20, False), (0, 9, False), (1, 4, True),
              (0, 30, False), (1, 11, True)],
             [(0, 3, False), (0, 4, False), (1, 25, False), (0, 20, True), (1, 2, True), (0, 30, False),
              (1, 9, False), (0, 5, True), (1, 3, False)]]
    counts = []
    for plan in plans:
        counts.append((cache.real_steps, cache.served_steps))
        config = SearchConfig("adaptive", 80, 1)
        replay, real = cache_mod.ReplayingExecutor(cache), LocalExecutor(options)
        ran: dict[int, list[tuple[int, bool]]] = {0: [], 1: []}     # each site's quanta so far
        at = {0: 0, 1: 0}                                           # and the step it stands at
        for i, steps, refresh in plan:
            outs = []
            for ex in (replay, real):       # as the controller sends it: where the site stands, and how it got there
                ex.submit(Task(sites[i], spec, config, steps, refresh=refresh,
                               resume=Resume(None, tuple(ran[i]), at[i])))
                [(_, out)] = ex.wait(0)
                r = out.result
                outs.append((r.steps, r.steps_quantum, r.status, r.best_loss, r.log_space,
                             [(p.step, p.suspect_loss, p.event, p.triggered) for p in r.trace]))
            assert outs[0] == outs[1], (i, steps, refresh)
            ran[i].append((steps, refresh))
            at[i] = outs[1][0]
        real.shutdown()
    real, served = cache.real_steps - counts[1][0], cache.served_steps - counts[1][1]
    assert 0 < real < served / 2, (real, served)          # the second campaign mostly replayed


def test_counting_executor_tells_a_guarded_op_firing_from_a_planted_bug_reached_first():
    """A guarded site's search that reaches the subject's planted bug first (acos_cosine's div, one
    line above its acos) found that bug; only the guarded op itself firing is a false alarm."""
    from types import SimpleNamespace

    from benchmarks._campaigns import CountingExecutor

    def outcome(site_id, own):
        result = SimpleNamespace(steps_quantum=2, steps=2)
        return SimpleNamespace(site_id=site_id, result=result, finding=SimpleNamespace(site_triggered=own))

    done = [(None, outcome("div", False)), (None, outcome("log", True))]
    inner = SimpleNamespace(slots=1, wait=lambda timeout: done)
    ex = CountingExecutor(inner)
    ex.wait(0)
    assert ex.found_at == {"div": 2, "log": 4} and ex.own == {"div": False, "log": True}


def test_the_watch_cost_is_measured_on_the_same_steps_and_judged_by_paired_ratios():
    """A real (short) measurement: every step kind is timed, and the headline is the median of the
    back-to-back pairs' ratios, judged against the 1.3x target."""
    from benchmarks.step_watch import cost_report, watch_overhead

    cost = watch_overhead(repeats=3, warmup=1)
    assert set(cost["cpu"]) == {"plain", "watched", "search_step"}
    assert all(v > 0 for v in cost["cpu"].values())
    assert cost["paired"]["q1"] <= cost["paired"]["median"] <= cost["paired"]["q3"]
    text = cost_report(cost)
    assert f"**{cost['paired']['median']:.2f}x**" in text and "target <= 1.3x" in text


def test_precision_runs_on_one_subject():
    proc = subprocess.run([sys.executable, "benchmarks/precision.py", "--only", "mp_attn_softmax", "--max-steps", "10",
                           "--guard-steps", "3", "--no-overhead", "--no-write"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| mp_attn_softmax | found | forward |" in proc.stdout, proc.stdout[-2000:]
    assert "Guarded twins clean: **1/1**" in proc.stdout, proc.stdout[-2000:]


def _per_seed(found: list[int], median: list[float], hard: list[float]) -> dict[str, list]:
    return {"found": found, "median": median, "median_hard": hard}


def test_ablation_verdict_keeps_a_tactic_only_beyond_the_full_arms_spread():
    """A tactic earns its place when removing it loses more finds than the full arm's range over the seeds,
    or raises a mean median by more than that median's range; within the spread it does not."""
    from benchmarks.ablation_suite import verdict

    full = _per_seed([50, 50, 49], [6.5, 6.5, 6.5], [9, 15, 11])
    assert verdict(full, _per_seed([50, 49, 49], [6.5, 6.5, 6.5], [9, 15, 11])) == (False, "within the spread")
    keep, why = verdict(full, _per_seed([49, 49, 47], [6.5, 6.5, 6.5], [15, 20, 19]))
    assert keep and why == "4 (bug, seed) finds lost > spread 1; random-hard median +6.33333 steps > spread 6"
    keep, why = verdict(full, _per_seed([50, 50, 49], [7, 7, 7], [9, 15, 11]))
    assert keep and why == "median +0.5 steps > spread 0"
    keep, why = verdict(_per_seed([52], [7.5], [41]), _per_seed([52], [7.5], [53]))
    assert keep and why == "random-hard median +12 steps > spread 0 (at one seed: no spread to tell chance from cost)"


def test_ablation_against_today_tells_no_worse_from_worse_within_and_beyond_the_spread():
    """An engine against the strategy before the redesign: no worse only with as many finds and no higher
    medians; fewer finds or higher medians are 'worse', qualified by the baseline's own spread."""
    from benchmarks.ablation_suite import against_baseline

    today = _per_seed([48, 50, 49], [7, 7, 8], [20, 30, 25])
    assert against_baseline(today, _per_seed([49, 50, 49], [7, 7, 7], [20, 22, 25])) == "**no worse**"
    assert against_baseline(today, _per_seed([48, 50, 48], [7, 7, 8], [20, 30, 25])) == \
        "worse, within the spread: 1 (bug, seed) finds fewer (spread 2)"
    assert against_baseline(today, _per_seed([46, 48, 49], [7, 7, 8], [40, 50, 45])) == \
        "**worse**: 4 (bug, seed) finds fewer (spread 2); random-hard median +20 steps (spread 10)"
    one = _per_seed([53], [7], [35])
    assert against_baseline(one, _per_seed([52], [7], [41])) == \
        "worse at its one seed (no spread to tell chance from cost): 1 (bug, seed) finds fewer (spread 0); " \
        "random-hard median +6 steps (spread 0)"


def test_ablation_report_pairs_two_arms_on_the_seeds_and_subjects_both_ran():
    """Arms of different coverage are compared where both ran: a seed one arm never ran is left out, and
    so is a subject one of them lacks at a common seed; nothing not run counts as a miss."""
    from benchmarks.ablation_suite import Subject, paired, ran

    subs = [Subject(key=k, name=k, kind="targets", framework="torch", entry="x.py:f") for k in ("a", "b", "c")]
    hit = {"found": True, "steps": 3}
    got = {"full": {(k, seed): hit for k in "abc" for seed in range(5)},
           "part": {(k, seed): (hit if seed < 3 and (k, seed) != ("c", 1) else None) for k in "abc"
                    for seed in range(5)}}
    assert ran(got["part"], subs, list(range(5))) == [0, 1, 2]
    both, seeds = paired(got, "full", "part", subs, list(range(5)))
    assert seeds == [0, 1, 2] and [s.key for s in both] == ["a", "b"]


def test_ablation_compares_two_arms_per_set_and_over_both_at_the_seeds_both_sets_share():
    """A set run at fewer seeds keeps its own row at those; the whole suite's row is taken at the seeds
    both sets were compared at, not at one set's alone; a set where one arm never ran has no row."""
    from benchmarks.ablation_suite import Subject, per_set

    subs = [Subject(key=k, name=k, kind="targets", framework="torch", entry="x.py:f") for k in ("t", "c")]
    parts = [("tuning", subs[:1]), ("check", subs[1:])]
    hit = {"found": True, "steps": 3}
    got = {"full": {(k, seed): hit for k in "tc" for seed in range(5)},
           "arm": {(k, seed): (hit if k == "c" or seed == 0 else None) for k in "tc" for seed in range(5)}}
    rows = [(name, [s.key for s in both], at) for name, both, at in per_set(got, "full", "arm", parts, subs,
                                                                             list(range(5)))]
    assert rows == [("tuning", ["t"], [0]), ("check", ["c"], [0, 1, 2, 3, 4]), ("all", ["t", "c"], [0])]
    got["arm"] = {(k, seed): (hit if k == "c" else None) for k in "tc" for seed in range(5)}
    assert [name for name, _, _ in per_set(got, "full", "arm", parts, subs, list(range(5)))] == ["check"]


def test_ablation_gives_grists_bugs_in_each_setting_the_two_settings_differing_only_where_grist_searched_weights():
    """Issue 56's fifth point: the suite's GRIST bugs counted in GRIST's setting and weights free, 79 each,
    the same bugs in both but for ID_28a-d, which are in each setting once; no program of the repo's own."""
    from benchmarks.ablation_suite import grist_settings, subjects

    (g_name, g), (f_name, f) = grist_settings(subjects())
    assert (g_name, f_name) == ("GRIST's setting", "weights free") and len(g) == len(f) == 79
    assert all(s.kind == "grist" for s in g + f)
    only = sorted({s.key for s in g} ^ {s.key for s in f})
    assert only == sorted(f"ID_28{x}@{how}" for x in "abcd" for how in ("grist", "free"))
    assert all(s.search_weights for s in f if s.key.endswith("@free"))
    assert not any(s.search_weights for s in g)


def test_ablation_full_list_is_the_nine_where_they_ran_and_the_seven_elsewhere(tmp_path: Path, monkeypatch):
    """A tactic's arm is measured against the full list on its own engine: the record ``adaptive`` (the
    nine tactics) at a (subject, seed) it holds, else ``seven-v1``; where neither ran, nothing."""
    import json

    from benchmarks import ablation_suite as suite

    def record(arm: str, subjects: dict) -> None:
        (tmp_path / f"{arm}.json").write_text(json.dumps({"arm": arm, "engines": [], "subjects": subjects}))

    record("adaptive", {"a": {"0": {"found": True, "steps": 9}}})
    record("seven-v1", {"a": {"0": {"found": True, "steps": 5}, "3": {"found": False, "steps": 1000}},
                     "b": {"3": {"found": True, "steps": 4}}})
    monkeypatch.setattr(suite, "RECORD", tmp_path)
    subs = [suite.Subject(key=k, name=k, kind="targets", framework="torch", entry="x.py:f") for k in "ab"]
    full = suite.full_list(subs, [0, 3])
    assert full[("a", 0)]["steps"] == 9 and full[("a", 3)]["found"] is False
    assert full[("b", 3)]["steps"] == 4 and full[("b", 0)] is None


def test_ablation_full_list_takes_the_result_at_the_arms_own_code_version(tmp_path: Path, monkeypatch):
    """An arm run on the seven at a seed the nine also ran is measured against the seven's result there (the
    same code version), not the nine's; without a version to match, the nine's comes first as before."""
    import json

    from benchmarks import ablation_suite as suite

    for arm, steps, version in (("adaptive", 9, "nine"), ("seven-v1", 5, "seven"), ("seven", 6, "seven-v2")):
        (tmp_path / f"{arm}.json").write_text(json.dumps({"arm": arm, "engines": [], "subjects": {
            "a": {"0": {"found": True, "steps": steps, "version": version}}}}))
    monkeypatch.setattr(suite, "RECORD", tmp_path)
    subs = [suite.Subject(key="a", name="a", kind="targets", framework="torch", entry="x.py:f")]
    assert suite.full_list(subs, [0], {("a", 0): {"found": True, "steps": 7, "version": "seven"}})[("a", 0)][
        "steps"] == 5
    assert suite.full_list(subs, [0], {("a", 0): {"found": True, "steps": 7, "version": "nine"}})[("a", 0)][
        "steps"] == 9
    assert suite.full_list(subs, [0], {("a", 0): None})[("a", 0)]["steps"] == 9
    assert suite.full_list(subs, [0], {("a", 0): {"found": True, "steps": 7, "version": "seven-v2"}})[("a", 0)][
        "steps"] == 6                                   # an arm measured by the later worker: the seven by it


def test_ablation_variants_take_the_full_list_from_the_record_only_at_this_code_version(tmp_path: Path,
                                                                                       monkeypatch):
    """A variant's run infers from the full list's recorded results instead of running it again, but only
    when every (subject, seed) it needs was recorded at the code version of now."""
    import json

    from benchmarks import ablation_suite as suite

    subject = next(s for s in suite.subjects() if s.key == "ID_4")
    now = suite.code_version(subject, "adaptive")
    engine = suite.FULL_RECORDS[-1]            # the full list of now
    (tmp_path / f"{engine}.json").write_text(json.dumps({"arm": engine, "engines": [], "subjects": {subject.key: {
        "0": {"found": True, "steps": 3, "version": now, "acts": {"land": 1}},
        "1": {"found": True, "steps": 3, "version": "an-older-engine", "acts": {"land": 1}}}}}))
    monkeypatch.setattr(suite, "RECORD", tmp_path)
    assert suite.recorded_full([subject], [0]) == {
        ("adaptive", subject.key, 0): {"found": True, "steps": 3, "version": now, "acts": {"land": 1}}}
    assert suite.recorded_full([subject], [0, 1]) is None
    assert suite.recorded_full([subject], [0, 2]) is None


def test_ablation_stops_when_the_code_changed_under_a_run_instead_of_recording_misses(tmp_path: Path):
    """A child that finds the sources changed since its run was planned measured nothing: the run stops
    with that message; its subjects are not kept as misses of the engine."""
    from benchmarks.ablation_suite import CODE_CHANGED, _plain, run_task, subjects

    subject = next(s for s in subjects() if s.key == "ID_4")
    task = {"build": subject.build, "runs": [("adaptive", 0, str(tmp_path / "out.json"))],
            "subjects": [_plain(subject)], "versions": {"adaptive": {subject.key: "not-this-code"}},
            "order": {subject.key: []}}
    with pytest.raises(SystemExit, match=CODE_CHANGED):
        run_task(task, timeout=120)
    assert not (tmp_path / "out.json").exists()


class _Point:
    event = "step"


class _Result:
    def __init__(self, steps: int, candidate, status: str = "exhausted"):
        self.steps, self.candidate, self.status, self.seconds, self.trace = steps, candidate, status, 0.1, [_Point()]


class _Search:
    """A site's search that first ends on another op's value it may step past (``first``), then, stepped
    past, on the site's own candidate at step 90: the shape of an RBM's log search, whose line's exp
    overflows first."""

    def __init__(self, runner, site, config, strategy=None):
        self.results = [_Result(12, "other"), _Result(90, "own", "found")]
        self.step, self.strategy_state, self.runs = 0, {}, 0

    def run(self, limit):
        self.runs += 1
        result = self.results.pop(0)
        self.step = result.steps
        return result

    def can_step_past(self):
        return len(self.results) == 1 and self.runs == 1

    def report_and_step_past(self, report):
        return report()


def _judge_by(first_op_line: int):
    """``finding_from`` for the fake search: every replay reproduces; the other op's candidate names its
    first non-finite op at ``first_op_line``, the site's own at the site."""
    from types import SimpleNamespace

    def finding_from(runner, spec, site, config, cand, seconds, minimise_batch=False):
        line = first_op_line if cand == "other" else int(site.location.rsplit(":", 1)[1])
        path = site.location.rsplit(":", 1)[0]
        return SimpleNamespace(replays=(3, 3), site_triggered=cand == "own",
                               first_op={"op": "exp", "location": f"{path}:{line}"})
    return finding_from


@pytest.mark.parametrize("first_op_line, found_at, status", [(62, 12, "stepped past"), (48, 90, "found")])
def test_ablation_counts_a_finding_stepped_past_only_at_the_bug(monkeypatch, first_op_line, found_at, status):
    """Searching ID_51's log, another op's value goes non-finite first: at the marked line (its exp), that
    confirmed finding is the bug, found at its step, and the search ends there, as run.py counts it; on
    another line, it is recorded as stepped past and the search goes on to the site's own finding."""
    from types import SimpleNamespace

    import fuzz_core.engine
    import fuzz_core.search
    from benchmarks import ablation_suite as suite

    subject = next(s for s in suite.subjects() if s.key == "ID_51")
    path = subject.marked[0]
    site = SimpleNamespace(op="log", location=f"{path}:62", occurrence=1, searched=True)
    monkeypatch.setattr(fuzz_core.search, "SiteSearch", _Search)
    monkeypatch.setattr(fuzz_core.engine, "finding_from", _judge_by(first_op_line))
    out = suite.search_subject(None, None, [site], subject, "adaptive", 0, [])
    assert (out["found"], out["steps"]) == (True, found_at)
    rec = out["sites"][0]
    assert rec["status"] == status
    assert [(p["steps"], p["found"], p["own"]) for p in rec["passed"]] == [(12, first_op_line == 62, False)]


def test_ablation_worker_finds_a_real_subject_and_names_its_code_version(tmp_path: Path):
    """The worker for real, in a child process: GRIST's ID_4 (random inputs find it) is found at the
    marked line at two seeds, each result a confirmed finding kept under the run's code version."""
    import json

    from benchmarks.ablation_suite import _plain, code_version, run_task, subjects

    subject = next(s for s in subjects() if s.key == "ID_4")
    runs = [("adaptive", seed, str(tmp_path / f"s{seed}.json")) for seed in (0, 1)]
    task = {"build": subject.build, "runs": runs, "subjects": [_plain(subject)],
            "versions": {"adaptive": {subject.key: code_version(subject, "adaptive")}},
            "order": {subject.key: []}}
    run_task(task, timeout=300)
    for _, _, out in runs:
        res = json.loads(Path(out).read_text())["subjects"][subject.key]
        assert res["found"] and res["steps"] < subject.budget
        assert res["version"] == code_version(subject, "adaptive")
        assert any(r["found"] and r["confirmed"] for r in res["sites"])
