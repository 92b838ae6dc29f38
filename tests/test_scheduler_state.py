"""A scheduler's state round trip (issue 16): ``state()`` is plain JSON data, and a scheduler
restored from the state taken after any call makes exactly the decisions the uninterrupted
one makes, whatever happens next (property tests that drive two schedulers side by side)."""
from __future__ import annotations

import json
import logging
import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fuzz_core.status import SiteStatus
from orchestrator.scheduler import Action, Decision, SiteProgress, make_scheduler, restore_scheduler
from orchestrator.scheduling.codec import decode_float, encode_float

POLICIES = ["share", "loss-slope", "round-robin"]
LOSS = st.one_of(st.floats(min_value=0, max_value=1e6), st.just(math.nan), st.just(math.inf),
                 st.just(-0.0), st.just(5e-324))


def _through_json(state: dict) -> dict:
    return json.loads(json.dumps(state, allow_nan=False))   # no NaN/Infinity tokens: strict JSON


def _twin(sched, policy: str, max_steps: int, quantum: int):
    twin = make_scheduler(policy, max_steps, quantum)
    state = _through_json(sched.state())
    twin.restore(state)
    assert _through_json(twin.state()) == state                 # the round trip is exact
    assert twin.in_flight() == sched.in_flight()
    return twin


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=15, deadline=None)
@given(data=st.data(), n_sites=st.integers(1, 6), max_steps=st.integers(1, 200), quantum=st.integers(1, 40),
       cut=st.integers(0, 60))
def test_a_restored_scheduler_decides_exactly_as_the_uninterrupted_one(policy, data, n_sites, max_steps,
                                                                        quantum, cut):
    """Drive one scheduler with random calls; at call number ``cut`` (an allocation, a report or a
    retirement, with quanta in flight) copy it through its JSON state; then make every later call
    on both and compare every decision, status and state."""
    sched = make_scheduler(policy, max_steps, quantum)
    twin = None
    for i in range(n_sites):
        sched.add_site(f"s{i}", steps_used=data.draw(st.sampled_from([0, 0, 0, max_steps // 2, max_steps])))
    calls = 0
    running: dict[str, int] = {}
    used: dict[str, int] = {f"s{i}": 0 for i in range(n_sites)}

    def both(method: str, *args):
        nonlocal calls, twin
        if twin is None and calls >= cut:
            twin = _twin(sched, policy, max_steps, quantum)
        calls += 1
        out = getattr(sched, method)(*args)
        if twin is not None:
            assert getattr(twin, method)(*args) == out, (method, args)
        return out

    for r in range(40):
        if r % 10 == 9 and data.draw(st.booleans()):        # a site that joins late (a target built late)
            used[f"late{r}"] = 0
            both("add_site", f"late{r}")
        for d in both("allocate", data.draw(st.integers(0, 3))):
            if not d.action.retires:
                running[d.site_id] = d.steps
        for site_id in sorted(running):
            if not data.draw(st.booleans()):
                continue
            steps = running.pop(site_id)
            used[site_id] += data.draw(st.sampled_from([steps, steps, max(0, steps - 3)]))
            if data.draw(st.integers(0, 15)) == 0:
                both("retire", site_id, data.draw(st.sampled_from(["error", "timeout", "unreachable"])))
            both("on_progress", SiteProgress(
                site_id, data.draw(st.sampled_from([used[site_id], used[site_id], math.nan])),
                tuple(data.draw(st.lists(LOSS, max_size=12))), data.draw(LOSS),
                data.draw(st.sampled_from([False] * 6 + [True])), data.draw(st.booleans()),
                data.draw(st.booleans()), data.draw(st.sampled_from([None, None, True, False]))))
        if twin is not None:
            assert twin.done == sched.done
            assert [twin.status_of(s) for s in used] == [sched.status_of(s) for s in used]
    if twin is not None:
        assert _through_json(twin.state()) == _through_json(sched.state())


@pytest.mark.parametrize("policy", POLICIES)
def test_a_state_restores_alone_and_only_into_its_own_configuration(policy):
    sched = make_scheduler(policy, 300, 20)
    for i in range(3):
        sched.add_site(f"s{i}")
    sched.allocate(2)
    sched.on_progress(SiteProgress("s0", 20, tuple(10.0 - 0.1 * i for i in range(20)), 8.1, False))
    state = _through_json(sched.state())
    alone = restore_scheduler(state)
    assert type(alone) is type(sched) and alone.in_flight() == sched.in_flight() == [sched.in_flight()[0]]
    assert alone.allocate(3) == sched.allocate(3)
    with pytest.raises(ValueError, match="configured"):
        make_scheduler(policy, 301, 20).restore(state)
    other = "round-robin" if policy != "round-robin" else "share"
    with pytest.raises(ValueError, match="configured"):
        make_scheduler(other, 300, 20).restore(state)
    with pytest.raises(ValueError, match="format"):
        make_scheduler(policy, 300, 20).restore({**state, "format": 99})
    broken = json.loads(json.dumps(state))
    del broken["sites"][0]["used"]
    with pytest.raises(ValueError, match="used"):
        make_scheduler(policy, 300, 20).restore(broken)


def test_restored_statuses_use_the_site_status_vocabulary():
    sched = make_scheduler("share", 100, 20)
    for s in ("found", "spent", "broken", "idle"):
        sched.add_site(s)
    sched.allocate(3)
    sched.on_progress(SiteProgress("found", 5, (0.0,), 0.0, True))
    sched.retire("broken", SiteStatus.ERROR)
    sched.on_progress(SiteProgress("spent", 100, (1.0,), 1.0, False))
    twin = restore_scheduler(_through_json(sched.state()))
    assert [twin.status_of(s) for s in ("found", "spent", "broken", "idle")] == [
        SiteStatus.FOUND, SiteStatus.EXHAUSTED, SiteStatus.ERROR, SiteStatus.PENDING]
    # the pending retirements come out once, from the restored scheduler as from the original
    pending = [Decision("found", Action.RETIRE_FOUND), Decision("spent", Action.RETIRE_EXHAUSTED)]
    assert twin.allocate(0) == pending and sched.allocate(0) == pending
    assert twin.allocate(0) == [] and sched.allocate(0) == []


@given(st.floats(allow_nan=True, allow_infinity=True))
@example(-0.0)
@example(math.nan)
@example(math.inf)
@example(-math.inf)
@example(5e-324)
def test_floats_round_trip_exactly_through_json(x):
    back = decode_float(json.loads(json.dumps(encode_float(x), allow_nan=False)))
    assert (math.isnan(x) and math.isnan(back)) or (back == x and math.copysign(1, back) == math.copysign(1, x))


@pytest.mark.parametrize("junk", ["1.5", "Infinity", None, True, [1.0]])
def test_a_float_field_refuses_junk(junk):
    with pytest.raises(ValueError, match="float"):
        decode_float(junk)


# -- resume from the run-state store: the latest snapshot, then only the calls logged after it ----------------

class _Box:
    """Where the scripted campaign makes its calls (a resume swaps the scheduler in it)."""

    def __init__(self, sched) -> None:
        self.s = sched


def _script(box: _Box, seed: int, n_sites: int, max_steps: int):
    """A campaign's calls as the controller makes them, one per ``next()``: sites added (a few late),
    allocations, reports of the grants (falling, flat or junk losses, now and then a trigger) and
    controller-side retirements. What it reports depends only on the decisions it was given, so an
    interrupted scheduler that resumes exactly leads it through the same calls."""
    rng = random.Random(seed)
    used: dict[str, int] = {}
    running: dict[str, int] = {}
    d_probe: dict[str, int] = {}                              # the probe each running grant asked for
    for i in range(n_sites):
        used[f"s{i}"] = rng.choice([0, 0, 0, 0, max_steps // 2, max_steps])
        box.s.add_site(f"s{i}", steps_used=used[f"s{i}"])
        yield
    for r in range(300):
        if box.s.done:
            return
        if r % 25 == 24 and len(used) < n_sites + 3:          # a target built late
            used[f"late{r}"] = 0
            box.s.add_site(f"late{r}")
            yield
        for d in box.s.allocate(rng.randint(0, 3)):
            if not d.action.retires:
                running[d.site_id], d_probe[d.site_id] = d.steps, d.reach_steps
        yield
        for site_id in sorted(running):
            if rng.random() < 0.4:
                continue
            steps = running.pop(site_id)
            if rng.random() < 0.03:
                box.s.retire(site_id, rng.choice(["error", "timeout"]))
                yield
                continue
            start = used[site_id]
            used[site_id] += rng.choice([steps, steps, max(0, steps - 3)])
            shape = sum(map(ord, site_id)) % 3
            losses = tuple(
                math.nan if rng.random() < 0.05 else
                max(0.0, 50.0 - 0.3 * t) if shape == 0 else
                5.0 + 0.01 * rng.random() if shape == 1 else
                100.0 / (1 + t) + rng.random()
                for t in range(start, used[site_id]))
            best = min((v for v in losses if math.isfinite(v)), default=math.inf)
            box.s.on_progress(SiteProgress(site_id, used[site_id], losses, best,
                                           rng.random() < 0.02 or best == 0.0, rng.random() < 0.05,
                                           shape == 2 and rng.random() < 0.5,
                                           rng.choice([None, True, False]) if d_probe.pop(site_id, 0) else None))
            yield


def _recorded(tmp_path, name: str, policy: str, max_steps: int = 300, quantum: int = 10):
    from orchestrator.run.controller import RecordedScheduler
    from orchestrator.run.state import RunStore

    return RecordedScheduler(make_scheduler(policy, max_steps, quantum), RunStore(tmp_path / name / "state.db"))


def _reopen(tmp_path, name: str, policy: str, max_steps: int = 300, quantum: int = 10):
    """A resume: the store opened again, a new scheduler rebuilt from it."""
    rec = _recorded(tmp_path, name, policy, max_steps, quantum)
    how = rec.reload(lambda: make_scheduler(policy, max_steps, quantum))
    return rec, how


def _full_replay(store, policy: str, max_steps: int = 300, quantum: int = 10):
    from orchestrator.run.controller import replay_scheduler

    sched = make_scheduler(policy, max_steps, quantum)
    replay_scheduler(sched, store.scheduler_log())
    return sched


def _run_to_end(gen) -> None:
    for _ in gen:
        pass


@pytest.mark.parametrize("policy", POLICIES)
def test_a_resume_from_a_snapshot_and_the_suffix_equals_a_full_replay(tmp_path, monkeypatch, policy):
    """Killed after call k (everything committed up to it; a transaction in flight is lost, the same as a
    kill before it): the resume restores the latest snapshot and replays only the calls after it. Its
    state equals a full replay's and the killed scheduler's, its allocation log is the whole campaign's,
    and it goes on to the same grants and the same end as the uninterrupted campaign."""
    from orchestrator.run import controller

    monkeypatch.setattr(controller, "SNAPSHOT_CALLS", 9)
    seed, n_sites = 11, 7
    ref = _Box(_recorded(tmp_path, "reference", policy))
    _run_to_end(_script(ref, seed, n_sites, 300))
    total_calls = ref.s.store.log_position
    assert ref.s.scheduler.done and total_calls > 100
    for k in sorted({3, 9, 10, 23, total_calls // 3, total_calls // 2, (4 * total_calls) // 5, total_calls - 1}):
        name = f"killed-{k}"
        box = _Box(_recorded(tmp_path, name, policy))
        gen = _script(box, seed, n_sites, 300)
        for _ in range(k):
            next(gen)
        killed = box.s
        killed.store.close()
        resumed, how = _reopen(tmp_path, name, policy)
        if k < 9:                       # killed before the first snapshot: the log is short
            assert how == "log" and resumed.store.scheduler_state() is None
        else:
            position = resumed.store.scheduler_state()[1]
            assert how == "snapshot" and 0 < position <= k
            assert k - position < max(9, n_sites + 3), "only a short suffix is replayed"
        full = _full_replay(resumed.store, policy)
        assert _through_json(resumed.scheduler.state()) == _through_json(full.state())
        assert _through_json(resumed.scheduler.state()) == _through_json(killed.scheduler.state())
        assert resumed.allocation_log == full.allocation_log == killed.allocation_log
        box.s = resumed
        _run_to_end(gen)
        assert resumed.allocation_log == ref.s.allocation_log, k     # the same grants, in the same order
        assert _through_json(resumed.scheduler.state()) == _through_json(ref.s.scheduler.state())
        resumed.store.close()


def _tamper(tmp_path, name: str, sql: str, args: tuple = ()) -> None:
    import sqlite3

    db = sqlite3.connect(tmp_path / name / "state.db")
    with db:
        db.execute(sql, args)
    db.close()


def _killed_campaign(tmp_path, name: str, policy: str, calls: int):
    box = _Box(_recorded(tmp_path, name, policy))
    gen = _script(box, 5, 6, 300)
    for _ in range(calls):
        next(gen)
    box.s.store.close()
    return box.s


@pytest.mark.parametrize("old", ["no snapshot", "no position", "no grants logged"])
def test_a_store_without_a_snapshot_position_resumes_by_full_replay(tmp_path, monkeypatch, caplog, old):
    """Run folders written before snapshots had a position (or before allocations logged their grants)
    resume as they did: by replaying the whole log, without a warning."""
    from orchestrator.run import controller

    monkeypatch.setattr(controller, "SNAPSHOT_CALLS", 9)
    killed = _killed_campaign(tmp_path, "old", "share", 60)
    if old == "no snapshot":
        _tamper(tmp_path, "old", "DELETE FROM scheduler_state")
    elif old == "no position":
        _tamper(tmp_path, "old", "UPDATE scheduler_state SET seq = NULL")
    else:
        _tamper(tmp_path, "old", "UPDATE scheduler_log SET args = json_remove(args, '$.grants') WHERE call = 'allocate'")
    with caplog.at_level(logging.INFO, logger="orchestrator.run.controller"):
        resumed, how = _reopen(tmp_path, "old", "share")
    assert how == "log"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert _through_json(resumed.scheduler.state()) == _through_json(killed.scheduler.state())
    assert resumed.allocation_log == killed.allocation_log


@pytest.mark.parametrize("corrupt", ["not json", "not a state", "a field missing", "another configuration",
                                     "another policy", "past the log", "behind its state",
                                     "grants differ"])
def test_an_unusable_snapshot_falls_back_to_full_replay_with_a_warning(tmp_path, monkeypatch, caplog, corrupt):
    from orchestrator.run import controller

    monkeypatch.setattr(controller, "SNAPSHOT_CALLS", 9)
    killed = _killed_campaign(tmp_path, "bad", "loss-slope", 70)
    state = json.loads(json.dumps(killed.scheduler.state()))
    if corrupt == "not json":
        _tamper(tmp_path, "bad", "UPDATE scheduler_state SET state = '{\"format\": 1, \"sit'")
    elif corrupt == "not a state":
        _tamper(tmp_path, "bad", "UPDATE scheduler_state SET state = '[1, 2]'")
    elif corrupt == "a field missing":
        del state["sites"][0]["used"]
        _tamper(tmp_path, "bad", "UPDATE scheduler_state SET state = ?", (json.dumps(state),))
    elif corrupt == "another configuration":
        state = _through_json(make_scheduler("loss-slope", 999, 10).state())
        _tamper(tmp_path, "bad", "UPDATE scheduler_state SET state = ?", (json.dumps(state),))
    elif corrupt == "another policy":
        _tamper(tmp_path, "bad", "UPDATE scheduler_state SET policy = 'share'")
    elif corrupt == "past the log":
        _tamper(tmp_path, "bad", "UPDATE scheduler_state SET seq = 10000")
    elif corrupt == "behind its state":     # a position before the calls the state reflects
        _tamper(tmp_path, "bad", "UPDATE scheduler_state SET seq = seq - 4")
    else:     # the snapshot and the log disagree: a replayed allocation does not make the grants logged
        _tamper(tmp_path, "bad", "UPDATE scheduler_log SET args = json_set(args, '$.grants', json('[[\"s0\", 1]]')) "
                "WHERE seq = (SELECT MIN(seq) FROM scheduler_log WHERE call = 'allocate' AND seq > "
                "(SELECT seq FROM scheduler_state))")
    with caplog.at_level(logging.WARNING, logger="orchestrator.run.controller"):
        resumed, how = _reopen(tmp_path, "bad", "loss-slope")
    assert how == "log"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("replaying its whole log" in w for w in warned)
    if corrupt == "grants differ":
        assert any("the log recorded [['s0', 1]]" in w for w in warned)
    assert _through_json(resumed.scheduler.state()) == _through_json(killed.scheduler.state())
    assert resumed.allocation_log == killed.allocation_log


def test_snapshots_keep_the_suffix_short_and_their_cost_per_call_flat(tmp_path, monkeypatch):
    """A snapshot every SNAPSHOT_CALLS calls, or every as many calls as there are sites when there are
    more (``state()`` costs O(sites), so the cost per call does not grow with the campaign); each in the
    transaction of the call at its position."""
    from orchestrator.run import controller

    monkeypatch.setattr(controller, "SNAPSHOT_CALLS", 16)
    rec = _recorded(tmp_path, "cadence", "round-robin")
    positions = []
    real = rec.store.put_scheduler_state

    def put(policy, seq, state):
        assert rec.store._depth > 0 and seq == rec.store.log_position     # inside the call's transaction
        positions.append(seq)
        real(policy, seq, state)

    monkeypatch.setattr(rec.store, "put_scheduler_state", put)
    for i in range(40):
        rec.add_site(f"s{i}")
    for _ in range(30):
        rec.allocate(1)
    assert positions == [16, 56]     # after 16 calls (16 sites), then after 40 more (40 sites by then)
