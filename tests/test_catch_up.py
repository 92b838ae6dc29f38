"""A site's state does not travel at every quantum: a worker that does not hold the site live rebuilds it
from its last checkpoint (or the factory's state) and the quanta run since, and lands exactly where the
uninterrupted search stood; the controller asks for a checkpoint once in CHECKPOINT_QUANTA quanta; on Ray
a site that moves to another actor takes the state the first actor kept in its object store."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fuzz_core.engine import TargetSpec
from fuzz_core.search import SearchConfig
from orchestrator.run.executors import Task
from orchestrator.worker import ASK, CatchUpMismatch, NeedsResume, QuantumOutcome, Resume, Worker, WorkerOptions

ENTRY = "campaigns/targets/log_one_minus_sigmoid.py:make_target"     # trains: its model state moves each step


def _spec() -> TargetSpec:
    return TargetSpec("sig", ENTRY, base_dir=os.getcwd())


def _trace(out: QuantumOutcome) -> list[tuple]:
    return [(p.step, p.suspect_loss, p.best_loss, p.event) for p in out.result.trace]


@pytest.fixture(scope="module")
def uninterrupted():
    """One worker runs quanta of 3, 4 (a refresh), 2 and 5 steps, a checkpoint after the first only."""
    worker = Worker(WorkerOptions())
    spec = _spec()
    site = next(s for s in worker.discover(spec) if s.searched and s.op == "log")
    config = SearchConfig("grist", 200, 3)
    outs = [worker.run(spec, site, config, 3, want_checkpoint=True)]
    for steps, refresh in ((4, True), (2, False)):
        outs.append(worker.run(spec, site, config, steps, refresh, Resume(ASK, (), outs[-1].result.steps),
                               want_checkpoint=False))
    assert all(o.checkpoint is None for o in outs[1:]) and outs[0].checkpoint is not None
    last = worker.run(spec, site, config, 5, False, Resume(ASK, (), 9), want_checkpoint=False)
    assert last.result.steps == 14 and not last.result.status.final
    return site, config, outs, last


@pytest.mark.parametrize("start", ["checkpoint", "factory"])
def test_a_new_worker_lands_where_the_live_search_stood(uninterrupted, start):
    site, config, outs, last = uninterrupted
    if start == "checkpoint":           # the checkpoint after 3 steps, then the two quanta since
        resume = Resume(outs[0].checkpoint, ((4, True), (2, False)), 9)
    else:                               # no checkpoint at all: from the factory's state, every quantum again
        resume = Resume(None, ((3, False), (4, True), (2, False)), 9)
    again = Worker(WorkerOptions()).run(_spec(), site, config, 5, False, resume, want_checkpoint=False)
    assert _trace(again) == _trace(last)
    assert again.result.best_loss == last.result.best_loss


def test_a_worker_asks_for_what_it_does_not_hold(uninterrupted):
    site, config, _, _ = uninterrupted
    with pytest.raises(NeedsResume):
        Worker(WorkerOptions()).run(_spec(), site, config, 5, False, Resume(ASK, (), 9))


def test_quanta_that_do_not_land_on_the_step_are_refused(uninterrupted):
    site, config, outs, _ = uninterrupted
    with pytest.raises(CatchUpMismatch, match="reached step 7, not 9"):
        Worker(WorkerOptions()).run(_spec(), site, config, 5, False, Resume(outs[0].checkpoint, ((4, True),), 9))


def test_adaptive_on_a_program_that_trains_does_not_depend_on_its_slicing():
    """Every step of a tactic of its own (a ride's steps, its steering, a walk) is one step that a quantum
    may cut: the next quantum makes the same step, and a tactic's state changes only once its step is taken.
    Two quanta after a refresh against 320 one-step quanta, through gradient steps and a ride of the
    program's training."""
    spec = TargetSpec("rsqrt-b16", "benchmarks/targets/raw_units.py:make_target",
                      {"subject": "rsqrt_norm_guarded", "scale": 10.0, "batch": 16}, seed=7, base_dir=os.getcwd())
    config = SearchConfig("adaptive", 1500, 7)

    def run(slices):
        worker = Worker(WorkerOptions())
        site = next(s for s in worker.discover(spec) if s.searched and s.op == "rsqrt")
        points, step = [], 0
        for steps, refresh in slices:
            out = worker.run(spec, site, config, steps, refresh, Resume(ASK, (), step) if step else None,
                             want_checkpoint=False)
            points += _trace(out)
            step = out.result.steps
        return points

    whole = run([(35, False), (120, True), (200, False)])
    kinds = {p[3].split(":")[0] for p in whole}
    assert {"land", "ride"} <= kinds, f"the case: gradient steps, then riding the training ({kinds})"
    assert run([(35, False)] + [(1, i == 0) for i in range(120)] + [(1, False)] * 200) == whole


def test_the_controller_asks_for_a_checkpoint_once_in_a_while(tmp_path: Path):
    """A --local campaign of one site: 10 quanta, checkpoints only at every CHECKPOINT_QUANTA-th."""
    from orchestrator.run import controller as ctl
    from orchestrator.run.campaign import RunOptions, run_campaign
    from orchestrator.config import load_campaign

    path = tmp_path / "c.yaml"
    path.write_text(f"""name: cadence
targets:
  - {{name: guarded, entry: campaigns/targets/sqrt_var_guarded.py:make_target}}
search: {{strategy: grist, max_steps: 50, seed: 0}}
scheduler: {{policy: round-robin, quantum: 5}}
resources: {{num_actors: 0}}
device: cpu
output: {tmp_path / 'runs'}
tracking: {{enabled: false}}
""")
    seen = []
    real = ctl.Controller._quantum

    def counting(self, rec, out):
        seen.append((rec.site.id, out.checkpoint is not None or out.checkpoint_file is not None,
                     out.result.status.final))
        return real(self, rec, out)

    ctl.Controller._quantum = counting
    try:
        outcome = run_campaign(load_campaign(path), path, RunOptions(progress=False, live=False))
    finally:
        ctl.Controller._quantum = real
    assert outcome.exit_code == 0
    per_site: dict[str, list[bool]] = {}
    for site_id, sent, final in seen:
        if not final:
            per_site.setdefault(site_id, []).append(sent)
    assert per_site, "the campaign ran quanta"
    for sent in per_site.values():
        expected = [(i + 1) % ctl.CHECKPOINT_QUANTA == 0 for i in range(len(sent))]
        assert sent == expected


@pytest.mark.ray
def test_a_site_that_moves_to_another_actor_takes_the_state_the_first_one_kept(ray_session, tmp_path: Path):
    from orchestrator.run.ray_executor import RayExecutor
    from test_reliability import SLOW_SUBJECT, _wait

    module, hold, mark = tmp_path / "held.py", tmp_path / "hold", tmp_path / "in_step"
    module.write_text(SLOW_SUBJECT.format(path=str(Path("campaigns/targets/softmax_xent_mlp.py").resolve()),
                                          hold=str(hold), mark=str(mark)))
    executor = RayExecutor(WorkerOptions(device="cpu"), num_actors=2, num_cpus=1, num_gpus=0,
                           max_restarts=1, quantum_timeout_s=120)
    try:
        spec, held_spec = _spec(), TargetSpec("held", f"{module}:make_target", base_dir=os.getcwd())
        found = executor.discover([spec, held_spec])
        site = next(s for s in found[spec.name] if s.searched)
        held = next(s for s in found[held_spec.name] if s.searched)
        config = SearchConfig("grist", 200, 3)
        executor.submit(Task(site, spec, config, 3, want_checkpoint=False))
        (task, first), = _wait(executor)
        home = task.actor
        assert first.checkpoint is None, "no checkpoint asked for: none came to the driver"
        assert executor.held[site.id] == (executor.held[site.id].ref, 3, home), "a reference to what the actor kept"
        # the site's actor is busy (a program held inside a step): its next quantum goes to the other actor
        hold.touch()
        executor.affinity[held.id] = home
        executor.submit(Task(held, held_spec, config, 5))
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert time.monotonic() < deadline, "the held program never started its step"
            time.sleep(0.02)
        executor.submit(Task(site, spec, config, 2, False, Resume(None, ((3, False),), 3), want_checkpoint=False))
        (task, out), = _wait(executor)
        assert task.site.id == site.id and task.actor != home
        assert isinstance(out, QuantumOutcome) and out.result.steps == 5
        assert executor.resent == 0, "the state came from the first actor's object store, not from the driver"
        # the same two quanta on one worker, uninterrupted
        worker = Worker(WorkerOptions())
        worker.run(spec, site, config, 3)
        live = worker.run(spec, site, config, 2, False, Resume(ASK, (), 3))
        assert _trace(out) == _trace(live)
        hold.unlink()
        _wait(executor)
    finally:
        hold.unlink(missing_ok=True)
        executor.shutdown()


def test_a_checkpoint_is_a_copy_that_the_search_it_came_from_does_not_change():
    """A checkpoint kept in memory (a local executor hands it to the driver as it is; the scheduler
    benchmark's cache keeps several) once shared the strategy's lists with the live search: a drift's
    phase losses grew in it after it was taken, and a resume from it went elsewhere (seed 20 of the
    scheduler benchmark: ``NotReplayable``). Taken while drifting, it must resume to the same trace
    as the search it came from, twice."""
    import copy

    import numpy as np

    from fuzz_core.engine import build_runner, discover_sites
    from fuzz_core.search import SiteSearch

    spec = TargetSpec("rsqrt-b16", "benchmarks/targets/raw_units.py:make_target",
                      {"subject": "rsqrt_norm_guarded", "scale": 10.0, "batch": 16}, seed=7, base_dir=os.getcwd())
    config = SearchConfig("adaptive", 1500, 7)

    def search():
        runner = build_runner(spec)
        site = next(s for s in discover_sites(runner, 7) if s.searched and s.op == "rsqrt")
        return SiteSearch(runner, site, config)

    live = search()
    while not (live.strategy_state.get("ride.active") and live.strategy_state.get("ride.steps", 0) >= 3):
        assert live.step < 600 and not live.run(1).status.final, "the case: a site that rides the training"
    arrays, meta = live.checkpoint()
    kept = ({k: v.copy() for k, v in arrays.items()}, copy.deepcopy(meta))
    trace = lambda r: [(p.step, p.suspect_loss, p.event) for p in r.trace]  # noqa: E731
    after = trace(live.run(40))
    assert any(e == "ride" for _, _, e in after)
    assert meta == kept[1] and all(np.array_equal(arrays[k], kept[0][k]) for k in arrays)
    for _ in range(2):
        again = search()
        again.restore(arrays, meta)
        assert trace(again.run(40)) == after


def test_a_worker_gives_tensorflow_its_cpu_share_unless_the_user_chose(monkeypatch):
    """TF reads its thread pools' sizes once, at start: the worker sets them (as torch's) before a TF target
    is built, so a TF1 graph's float reductions run in one order whatever the machine's cores; a count the
    user set stays."""
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "3")
    Worker(WorkerOptions(num_threads=2))
    assert os.environ["TF_NUM_INTRAOP_THREADS"] == "2" and os.environ["TF_NUM_INTEROP_THREADS"] == "3"
