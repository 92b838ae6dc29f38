"""A bug that another bug hides: the search reports the op that went non-finite first, steps past it,
and goes on to its own op (GRIST's ID_2: ``log(1 - p)`` fires on the way to ``log(p)``)."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, search_site
from fuzz_core.search import SearchConfig, SiteSearch
from orchestrator.cli import app
from orchestrator.config import load_campaign
from orchestrator.export import load_run, sarif_log
from orchestrator.run.campaign import RunOptions, run_campaign
from records import Recorder, check_run

MASKED = "tests/targets/masked.py:make_target"
HIT, MISS = "tests/targets/masked.py:15", "tests/targets/masked.py:16"     # log(p), log(1 - p)


def _site(runner, location: str):
    return next(s for s in discover_sites(runner, 0) if s.op == "log" and s.location == location)


def test_the_search_reports_the_op_that_fires_first_and_goes_on_to_its_own():
    spec = TargetSpec("masked", MASKED, {}, "torch", 0)
    runner = build_runner(spec)
    site = _site(runner, HIT)
    config = SearchConfig("random", 300, seed=0)

    plain = search_site(runner, site, config)               # no one to report to: it ends there
    assert plain.candidate is not None and not plain.candidate.own
    assert plain.candidate.first_op.location == MISS

    passed = []

    def report(result):
        passed.append((result.steps, finding_from(runner, spec, site, config, result.candidate, result.seconds)))

    result = search_site(runner, site, config, passed=report)
    ((step, other),) = passed
    assert step == plain.steps and other.first_op["location"] == MISS and not other.site_triggered
    assert other.replays == (3, 3)                           # the other op's finding stands on its own
    assert result.candidate is not None and result.candidate.own and result.steps > step
    own = finding_from(runner, spec, site, config, result.candidate, result.seconds)
    assert own.site_triggered and own.replays == (3, 3) and own.signature != other.signature


def test_a_step_whose_only_non_finite_values_are_known_is_an_ordinary_step_and_survives_a_checkpoint():
    spec = TargetSpec("masked", MASKED, {}, "torch", 0)
    runner = build_runner(spec)
    config = SearchConfig("random", 300, seed=0)
    search = SiteSearch(runner, _site(runner, HIT), config)
    search.run(300)
    assert search.can_step_past()
    values = dict(search.candidate.values)
    assert search.step_past() and search.passed == [("log", MISS, 0)] and not search.can_step_past()

    arrays, meta = search.checkpoint()
    again = SiteSearch(runner, _site(runner, HIT), config)
    again.restore(arrays, json.loads(json.dumps(meta)))
    assert again.passed == search.passed
    again._end = again.step + 1
    ev = again.evaluate(values)                              # log(1 - p) fires again: not an end
    assert ev.event and not ev.triggered and [o.location for o in ev.origins] == [MISS]
    assert again.candidate is None and ev.grads is not None  # the site's own gradient, as on any step

    fresh = SiteSearch(runner, _site(runner, HIT), config)  # a search that has not reported it stops
    fresh._end = fresh.step + 1
    with pytest.raises(Exception):
        fresh.evaluate(values)
    assert fresh.candidate is not None and not fresh.candidate.own


def test_only_a_forward_step_of_other_named_ops_with_the_site_input_finite_is_passable():
    """The site's own input non-finite (its op downstream of the one that fired: nothing further to search
    for), a backward or update event (the program trained on the step), an op the replay must name, the
    site's own op: the search ends there, as before."""
    from fuzz_core.backends.base import Evaluation, OpRef

    spec = TargetSpec("masked", MASKED, {}, "torch", 0)
    runner = build_runner(spec)
    search = SiteSearch(runner, _site(runner, HIT), SearchConfig("random", 10, seed=0))
    other = OpRef("log", "log", MISS, 0)

    def ev(**kw):
        base = dict(seen=True, hard=1.0, log_loss=1.0, triggered=False, event=True, first_op=other,
                    phase="forward", origins=[other])
        return Evaluation(**{**base, **kw})

    assert search._passable(ev(), 1.0) == [("log", MISS, 0)]
    assert search._passable(ev(), float("inf")) is None              # the site's input went non-finite
    assert search._passable(ev(phase="backward"), 1.0) is None
    assert search._passable(ev(trained=True), 1.0) is None
    assert search._passable(ev(triggered=True), 0.0) is None
    assert search._passable(ev(origins=None), 1.0) is None
    unnamed = OpRef("mul", "mul", "<not located: replay names it>", 0)
    assert search._passable(ev(first_op=unnamed, origins=[unnamed]), 1.0) is None


@pytest.mark.tf
def test_grist_id2a_hidden_by_id2b_is_found_in_the_tf1_program():
    """GRIST's ID_2 re-expressed as a TF1 graph: the search on ``log(p)`` drives ``log(1 - p)`` out of
    its domain first (ID_2b), reports it, and goes on to ``log(p)`` itself (ID_2a)."""
    pytest.importorskip("tensorflow")
    entry = "benchmarks/grist_suite/tf_programs/id02_github_ips6.py:make_target"
    spec = TargetSpec("grist-id02", entry, {}, "tensorflow", 0)
    runner = build_runner(spec)
    site = next(s for s in discover_sites(runner, 0) if s.location.endswith("id02_github_ips6.py:35"))
    config = SearchConfig("adaptive", 1000, seed=0)
    passed = []
    result = search_site(runner, site, config, passed=passed.append)
    assert [p.candidate.first_op.location.rsplit(":", 1)[1] for p in passed] == ["36"]
    assert result.candidate is not None and result.candidate.own
    finding = finding_from(runner, spec, site, config, result.candidate, result.seconds, minimise_batch=False)
    assert finding.replays == (3, 3) and finding.site_triggered


@pytest.mark.parametrize("strategy, own, actors", [("random", True, 0), ("grist", False, 0),
                                                   pytest.param("random", True, 1, marks=pytest.mark.ray)])
def test_a_campaign_keeps_both_findings_and_every_record_agrees(tmp_path: Path, request, strategy: str, own: bool,
                                                                 actors: int):
    """``random`` finds the hidden log after stepping past the other; ``grist`` steps past it and spends
    its budget: the site ends exhausted (its own op never fired), with the probe's word on it, and the
    other log's bug is found all the same, at its own site. Every record counts bugs, one each. On Ray
    the search goes on in its actor from where it stepped past, as in this process."""
    if actors:
        request.getfixturevalue("ray_session")
    path = tmp_path / "masked.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: masked
        targets:
          - {{name: masked, entry: {MASKED}}}
        search: {{strategy: {strategy}, max_steps: 200, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 50}}
        resources: {{num_actors: {actors}, num_cpus: 1, num_gpus: 0}}
        device: cpu
        tracking: {{enabled: false}}
        output: {tmp_path / 'runs'}
        """))
    recorder = Recorder()
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False, observers=[recorder]))
    assert outcome.exit_code == 1
    summary = check_run(outcome.run_dir)
    recorder.check_once()
    assert summary["run"]["executor"] == ("ray" if actors else "local")
    hit = next(s for s in summary["sites"] if s["location"] == HIT)
    miss = next(s for s in summary["sites"] if s["location"] == MISS)
    assert len(hit["passed"]) <= 1          # none when the other log's site had confirmed its bug first
    for folder in hit["passed"]:
        other = json.loads((outcome.run_dir / folder / "finding.json").read_text())
        assert other["first_op"]["location"] == MISS and not other["site_triggered"]
    assert miss["status"] == "found"                            # the bug at the other log is its site's
    bugs = {b["location"]: b for b in summary["bugs"]}
    assert set(bugs) == ({HIT, MISS} if own else {MISS})       # one record per bug, whoever found it
    assert miss["id"] in bugs[MISS]["sites"]
    assert set(hit["passed"]) <= {o["folder"] for o in bugs[MISS]["occurrences"]}
    if own:
        assert hit["status"] == "found" and hit["finding"] not in hit["passed"]
        mine = json.loads((outcome.run_dir / hit["finding"] / "finding.json").read_text())
        assert mine["site_triggered"]
    else:
        assert hit["status"] == "exhausted" and hit["steps"] == 200 and hit["reach"]   # its own op: the probe's word
        assert not hit["finding"]
    for bug in summary["bugs"]:
        done = CliRunner().invoke(app, ["replay", str(outcome.run_dir / bug["reproducer"])])
        assert done.exit_code == 0, done.output
    results = sarif_log(*load_run(outcome.run_dir), outcome.run_dir)["runs"][0]["results"]
    assert sorted(r["partialFingerprints"]["cdeepfuzzSignature/v2"] for r in results) == sorted(
        b["signature"] for b in summary["bugs"])
    if actors:
        return
    done = CliRunner().invoke(app, ["report", str(outcome.run_dir)])      # a page per bug
    assert done.exit_code == 0, done.output
    pages = {p.name for p in (outcome.run_dir / "report" / "findings").glob("*.html")}
    assert pages == {Path(b["reproducer"]).name + ".html" for b in summary["bugs"]}


def test_a_worker_reports_the_other_op_keeps_the_site_live_and_a_new_worker_catches_up_past_it():
    """The worker's quantum that ends on the other op's finding returns it with the site still searching;
    a worker that rebuilds the site from the quanta since (no checkpoint) steps past the same finding
    and lands where the live search stood."""
    from fuzz_core.status import SiteStatus
    from orchestrator.worker import Resume, Worker, WorkerOptions

    spec = TargetSpec("masked", MASKED, {}, "torch", 0)
    worker = Worker(WorkerOptions())
    site = next(s for s in worker.discover(spec) if s.location == HIT)
    config = SearchConfig("random", 300, seed=0)
    first = worker.run(spec, site, config, 50, want_checkpoint=False)
    assert first.finding is not None and not first.finding.site_triggered
    assert first.result.status is SiteStatus.SEARCHING and first.checkpoint is None
    n = first.result.steps
    live = worker.run(spec, site, config, 50, False, Resume(None, (), n), want_checkpoint=False)
    again = Worker(WorkerOptions()).run(spec, site, config, 50, False, Resume(None, ((n, False),), n),
                                        want_checkpoint=False)
    assert [(p.step, p.suspect_loss) for p in again.result.trace] == [(p.step, p.suspect_loss) for p in live.result.trace]
    assert live.finding is not None and live.finding.site_triggered and live.result.status is SiteStatus.FOUND
    assert again.finding is not None and again.finding.signature == live.finding.signature


@pytest.mark.mlflow
@pytest.mark.parametrize("max_site_runs", [100, 0])
def test_mlflow_keeps_the_stepped_past_finding_beside_the_sites_own(tmp_path: Path, max_site_runs: int):
    """The site's run holds its own finding under ``finding/`` and the one it stepped past under
    ``passed/<folder>/``: the second no longer replaces the first's files. Above ``max_site_runs``,
    each finding has a run of its own."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{(tmp_path / 'mlflow.db').resolve().as_posix()}"
    path = tmp_path / "masked.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: masked-mlflow
        targets:
          - {{name: masked, entry: {MASKED}}}
        search: {{strategy: random, max_steps: 200, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 50}}
        resources: {{num_actors: 0, num_cpus: 1, num_gpus: 0}}
        device: cpu
        tracking: {{uri: '{uri}', max_site_runs: {max_site_runs}}}
        output: {tmp_path / 'runs'}
        """))
    outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False))
    assert outcome.exit_code == 1
    summary = check_run(outcome.run_dir)
    hit = next(s for s in summary["sites"] if s["location"] == HIT)
    (passed,) = hit["passed"]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("masked-mlflow")
    runs = client.search_runs([experiment.experiment_id], f"tags.`site.id` = '{hit['id']}'")

    def report(run, artifact: str) -> dict:
        return json.loads(Path(client.download_artifacts(run.info.run_id, artifact, str(tmp_path))).read_text())

    if max_site_runs:
        (run,) = runs
        assert report(run, "finding/finding.json")["site_triggered"]
        assert not report(run, f"passed/{Path(passed).name}/finding.json")["site_triggered"]
        assert run.data.tags["passed"] == Path(passed).name
        assert run.data.tags["signature"] == report(run, "finding/finding.json")["signature"]
        # a fix of the stepped-past finding is recorded beside it, not over the site's own finding
        done = CliRunner().invoke(app, ["fix", str(outcome.run_dir / passed), "--budget", "10"])
        assert "recorded on run" in done.output, done.output
        run = client.get_run(run.info.run_id)
        assert "fix" in report(run, f"passed/{Path(passed).name}/finding.json")
        assert "fix" not in report(run, "finding/finding.json")
        assert f"passed.{Path(passed).name}.fix.verdict" in run.data.tags and "fix.verdict" not in run.data.tags
    else:                                       # above max_site_runs: a run per bug, not per finding
        bug_runs = [r for r in client.search_runs([experiment.experiment_id], "tags.status = 'found'")
                    if "signature" in r.data.tags and "bug.op" not in r.data.tags]
        assert sorted(r.data.tags["signature"] for r in bug_runs) == sorted(b["signature"] for b in summary["bugs"])
        assert sorted(report(r, "finding/finding.json")["site_triggered"] for r in bug_runs) == [False, True]


def test_a_worker_steps_past_another_ops_bug_the_run_has_without_replaying_it():
    """Given the other op's bug among the run's known ones, the quantum returns no finding of it, and
    the search goes on exactly as it does after reporting it (the replay is skipped, not the step)."""
    from fuzz_core.status import SiteStatus
    from orchestrator.worker import Worker, WorkerOptions

    spec = TargetSpec("masked", MASKED, {}, "torch", 0)
    worker = Worker(WorkerOptions())
    site = next(s for s in worker.discover(spec) if s.location == HIT)
    config = SearchConfig("random", 300, seed=0)
    reported = worker.run(spec, site, config, 50, want_checkpoint=False)
    assert reported.finding is not None and not reported.finding.site_triggered
    after = worker.run(spec, site, config, 50, False, want_checkpoint=False)

    other = Worker(WorkerOptions())
    known = frozenset({reported.finding.signature})
    skipped = other.run(spec, site, config, 50, want_checkpoint=False, known=known)
    assert skipped.finding is None and skipped.result.status is SiteStatus.SEARCHING
    assert skipped.result.steps == reported.result.steps
    again = other.run(spec, site, config, 50, False, want_checkpoint=False, known=known)
    assert [(p.step, p.suspect_loss) for p in again.result.trace] == [(p.step, p.suspect_loss) for p in after.result.trace]
