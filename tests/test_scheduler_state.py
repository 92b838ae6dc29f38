"""A scheduler's state round trip (issue 16): ``state()`` is plain JSON data, and a scheduler
restored from the state taken after any call makes exactly the decisions the uninterrupted
one makes, whatever happens next (property tests that drive two schedulers side by side)."""
from __future__ import annotations

import json
import math

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
                data.draw(st.booleans())))
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
