"""Tests for orchestrator.scheduler, every policy: budget, retirement, status vocabulary,
fairness, determinism, and side-by-side simulations against round-robin (all fast, no Ray).
The policies' own rules are in test_scheduler_loss_slope.py and test_scheduler_share.py, the
state round trip in test_scheduler_state.py."""
from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fuzz_core.status import SiteStatus
from orchestrator.scheduler import (
    Action,
    Decision,
    LossSlopeScheduler,
    RoundRobinScheduler,
    Scheduler,
    ShareScheduler,
    SiteProgress,
    make_scheduler,
)
from orchestrator.scheduling.numeric import is_plateau as _is_plateau
from orchestrator.scheduling.numeric import predicted_steps as _predicted_steps
from orchestrator.scheduling.numeric import quantum_for as _quantum_for
from orchestrator.scheduling.numeric import slope as _slope

POLICIES = ["share", "loss-slope", "round-robin"]
LOSS = st.one_of(st.floats(min_value=0, max_value=1e6), st.just(math.nan), st.just(math.inf))


def _progress(site_id: str, used: int, losses, *, triggered=False, hint=False, best=None):
    losses = tuple(losses)
    finite = [v for v in losses if math.isfinite(v)]
    best = min(finite, default=math.nan) if best is None else best
    return SiteProgress(site_id, used, losses, best, triggered, hint)


def _falling(start: float, rate: float, n: int) -> list[float]:
    return [max(0.0, start - rate * (i + 1)) for i in range(n)]


# ---------------------------------------------------------------- pure helpers

def test_slope_of_a_line_and_of_too_little_data():
    assert _slope([10, 8, 6, 4]) == pytest.approx(-2)
    assert math.isnan(_slope([]))
    assert math.isnan(_slope([3.0]))
    assert math.isnan(_slope([math.nan, 1.0, math.inf]))


@given(st.lists(LOSS, max_size=40))
@example([-0.0, -0.0])
@example([math.inf, math.nan, 1.0])
@example([1e308, 1e308, 0.0])
def test_slope_never_raises_and_is_finite_or_nan(losses):
    s = _slope(losses)
    assert math.isnan(s) or math.isfinite(s)


def test_slope_skips_nan_but_keeps_step_spacing():
    assert _slope([10, math.nan, 6, math.inf, 2]) == pytest.approx(-2)


def test_predicted_steps():
    assert _predicted_steps(10.0, -2.0) == pytest.approx(5)
    assert _predicted_steps(0.0, 1.0) == 0
    assert _predicted_steps(-0.0, math.nan) == math.inf  # slope unknown wins
    assert _predicted_steps(1.0, 0.0) == pytest.approx(1e9)  # flat: loss / eps
    assert _predicted_steps(1.0, 5.0) > 1e8  # rising
    for junk in (math.nan, math.inf, None, "x"):
        assert _predicted_steps(junk, -1.0) == math.inf


def test_quantum_for_is_inverse_and_clamped():
    assert _quantum_for(50, 50, 20, 5, 80) == 20
    assert _quantum_for(25, 50, 20, 5, 80) == 40
    assert _quantum_for(1, 50, 20, 5, 80) == 80
    assert _quantum_for(5000, 50, 20, 5, 80) == 5
    assert _quantum_for(math.inf, 50, 20, 5, 80) == 5
    assert _quantum_for(0.0, 50, 20, 5, 80) == 80
    assert _quantum_for(10, math.nan, 20, 5, 80) == 20


def test_is_plateau():
    assert _is_plateau([1.0] * 10, 0.01)
    assert _is_plateau([1.0 + 0.01 * i for i in range(10)], 0.01)  # rising
    assert not _is_plateau(_falling(1.0, 0.05, 10), 0.01)
    assert not _is_plateau([0.0] * 10, 0.01)  # at the boundary
    assert not _is_plateau([1.0, math.nan], 0.01)


# ---------------------------------------------------------------- construction

@pytest.mark.parametrize("kwargs, bad", [
    (dict(policy="loss-slope", max_steps=0, quantum=20), "0"),
    (dict(policy="round-robin", max_steps=500, quantum=-3), "-3"),
    (dict(policy="round-robin", max_steps=2.5, quantum=20), "2.5"),
    (dict(policy="loss-slope", max_steps=True, quantum=20), "True"),
    (dict(policy="fifo", max_steps=500, quantum=20), "'fifo'"),
    (dict(policy="loss-slope", max_steps=500, quantum=20, window=1), "1"),
    (dict(policy="loss-slope", max_steps=500, quantum=20, plateau_tol=1.5), "1.5"),
    (dict(policy="loss-slope", max_steps=500, quantum=20, plateau_tol=math.nan), "nan"),
    (dict(policy="loss-slope", max_steps=500, quantum=20, min_quantum=30), "30"),
    (dict(policy="loss-slope", max_steps=500, quantum=20, max_quantum=10), "10"),
    (dict(policy="loss-slope", max_steps=500, quantum=20, starve_after=0), "0"),
    (dict(policy="loss-slope", max_steps=500, quantum=20, max_refreshes=-1), "-1"),
    (dict(policy="round-robin", max_steps=500, quantum=20, window=8), "window"),
    (dict(policy="share", max_steps=500, quantum=20, schedule={"floor": 0}), "0"),
    (dict(policy="share", max_steps=500, quantum=20, schedule={"power": -1.0}), "-1.0"),
    (dict(policy="share", max_steps=500, quantum=20, predictor={"window": 2}), "2"),
    (dict(policy="share", max_steps=500, quantum=20, refresh={"max_refreshes": -1}), "-1"),
    (dict(policy="share", max_steps=500, quantum=20, patience={"after": 0}), "0"),
    (dict(policy="share", max_steps=500, quantum=20, guard={"reserve": 0}), "0"),
    (dict(policy="share", max_steps=500, quantum=20, guard={"reserve": 1.0}), "1.0"),
    (dict(policy="share", max_steps=500, quantum=20, guard={"rounds": 4}), "rounds"),
    (dict(policy="share", max_steps=500, quantum=20, schedule={"cap": 0.5}), "0.5"),
    (dict(policy="share", max_steps=500, quantum=20, min_quantum=21), "21"),
    (dict(policy="share", max_steps=500, quantum=20, schedule={"flor": 0.1}), "flor"),
    (dict(policy="share", max_steps=500, quantum=20, schedule=0.1), "0.1"),
    (dict(policy="share", max_steps=500, quantum=20, horizon=1.0), "horizon"),
])
def test_bad_arguments_raise_with_the_value(kwargs, bad):
    with pytest.raises(ValueError, match=re.escape(bad)):
        make_scheduler(**kwargs)


def test_factory_and_protocol_errors():
    assert isinstance(make_scheduler("loss-slope", 500, 20), LossSlopeScheduler)
    assert isinstance(make_scheduler("share", 500, 20), ShareScheduler)
    rr = make_scheduler("round-robin", 500, 20)
    assert isinstance(rr, RoundRobinScheduler) and isinstance(rr, Scheduler)
    rr.add_site("a")
    with pytest.raises(ValueError, match="'a'"):
        rr.add_site("a")
    with pytest.raises(KeyError, match="'zz'"):
        rr.on_progress(_progress("zz", 1, [1.0]))
    with pytest.raises(ValueError, match="-1"):
        rr.allocate(-1)


# ---------------------------------------------------------------- budget and retirement

def _drive_randomly(sched: Scheduler, data, n_sites: int, rounds: int, max_steps: int) -> None:
    """Fake controller: random slots, random reports (nan, inf, junk, fewer steps than granted),
    random retirements; checks every invariant after each allocate."""
    for i in range(n_sites):
        sched.add_site(f"s{i}")
    used: Counter = Counter()            # what each site used: its reports, or its grants when junk
    running: dict[str, int] = {}
    retired: set[str] = set()
    triggered: set[str] = set()
    for _ in range(rounds):
        slots = data.draw(st.integers(0, 3))
        decisions = sched.allocate(slots)
        grants = [d for d in decisions if d.action in (Action.GRANT, Action.REFRESH)]
        assert len(grants) <= slots
        for d in decisions:
            assert d.site_id not in retired, d                       # no decision after a retirement
            if d.action.retires:
                retired.add(d.site_id)
                assert (d.action is Action.RETIRE_FOUND) == (d.site_id in triggered), d
                assert (d.action is Action.RETIRE_EXHAUSTED) == (d.site_id not in triggered
                                                                and used[d.site_id] >= max_steps), d
                assert sched.status_of(d.site_id) is {Action.RETIRE_FOUND: SiteStatus.FOUND,
                                                      Action.RETIRE_EXHAUSTED: SiteStatus.EXHAUSTED,
                                                      Action.RETIRE_NO_PROGRESS: SiteStatus.RETIRED}[d.action]
                continue
            assert d.site_id not in running and d.steps >= 1
            assert used[d.site_id] + d.steps <= max_steps              # budget conserved
            assert sched.status_of(d.site_id) is SiteStatus.SEARCHING
            running[d.site_id] = d.steps
        for site_id in list(running):
            if not data.draw(st.booleans()):
                continue  # still running
            steps = running.pop(site_id)
            report = data.draw(st.sampled_from([used[site_id] + steps, used[site_id] + steps // 2, math.nan, None]))
            used[site_id] = max(used[site_id], report if isinstance(report, int) else used[site_id] + steps)
            if data.draw(st.integers(0, 9)) == 0:
                sched.retire(site_id, data.draw(st.sampled_from(["error", SiteStatus.TIMEOUT])))
                retired.add(site_id)
            hit = data.draw(st.sampled_from([False, False, False, True, None]))
            if hit is True and site_id not in retired:
                triggered.add(site_id)
            sched.on_progress(SiteProgress(
                site_id, report, tuple(data.draw(st.lists(LOSS, max_size=8))),
                data.draw(LOSS), hit, data.draw(st.sampled_from([False, True, math.nan]))))
        for site_id in retired:
            assert sched.status_of(site_id).final
    assert all(v <= max_steps for v in used.values())
    assert all(isinstance(sched.status_of(f"s{i}"), SiteStatus) for i in range(n_sites))


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), n_sites=st.integers(1, 5), max_steps=st.integers(1, 120),
       quantum=st.integers(1, 50))
def test_budget_is_conserved_under_random_progress(policy, data, n_sites, max_steps, quantum):
    sched = make_scheduler(policy, max_steps, quantum)
    _drive_randomly(sched, data, n_sites, rounds=40, max_steps=max_steps)


@pytest.mark.parametrize("policy", POLICIES)
def test_found_site_is_retired_once_and_never_granted_again(policy):
    sched = make_scheduler(policy, 500, 20)
    sched.add_site("a")
    sched.add_site("b")
    [ga, gb] = sched.allocate(2)
    sched.on_progress(_progress("a", 7, [0.5, 0.0], triggered=True))
    sched.on_progress(_progress("b", 20, _falling(1, 0.01, 20)))
    assert not sched.done
    out = sched.allocate(2)
    assert Decision("a", Action.RETIRE_FOUND) in out
    assert [d.site_id for d in out if d.action is Action.GRANT] == ["b"]
    assert sched.status_of("a") is SiteStatus.FOUND
    sched.on_progress(_progress("a", 9, [0.0], triggered=True))  # late report: ignored
    for _ in range(5):
        sched.on_progress(_progress("b", 0, [1.0]))
        assert all(d.site_id == "b" for d in sched.allocate(4))
    assert all(d.action is not Action.RETIRE_FOUND for d in sched.allocate(4))   # exactly once


@pytest.mark.parametrize("policy", POLICIES)
def test_exhausted_site_gets_no_more_steps(policy):
    sched = make_scheduler(policy, 50, 20)
    sched.add_site("a")
    steps = []
    retirements = []
    while not sched.done:
        for d in sched.allocate(1):
            if d.action.retires:
                retirements.append(d)
                continue
            steps.append(d.steps)
            sched.on_progress(_progress("a", sum(steps), _falling(1.0 - 0.01 * sum(steps[:-1]), 0.01, d.steps)))
    assert sum(steps) == 50 and steps[-1] == 50 - sum(steps[:-1])  # min(k, remaining)
    assert retirements == [Decision("a", Action.RETIRE_EXHAUSTED)]
    assert sched.status_of("a") is SiteStatus.EXHAUSTED
    assert sched.allocate(3) == []


@pytest.mark.parametrize("policy", POLICIES)
def test_resumed_site_and_controller_retirement(policy):
    sched = make_scheduler(policy, 100, 30)
    sched.add_site("old", steps_used=90)
    sched.add_site("new")
    sched.add_site("spent", steps_used=100)
    assert [sched.status_of(s) for s in ("old", "new")] == [SiteStatus.PENDING] * 2
    assert sched.status_of("spent") is SiteStatus.EXHAUSTED
    out = sched.allocate(2)
    assert out[0] == Decision("spent", Action.RETIRE_EXHAUSTED)
    assert Decision("old", Action.GRANT, 10) in out
    sched.retire("new", "timeout")
    sched.retire("new", SiteStatus.ERROR)  # first status wins
    assert sched.status_of("new") is SiteStatus.TIMEOUT
    with pytest.raises(ValueError, match="'gone'"):
        sched.retire("old", "gone")        # not a status of fuzz_core.status.SiteStatus
    sched.on_progress(_progress("old", 100, [1.0]))
    assert sched.allocate(2) == [Decision("old", Action.RETIRE_EXHAUSTED)]
    assert sched.done


@pytest.mark.parametrize("policy", POLICIES)
def test_steps_a_grant_did_not_use_go_back_to_the_site(policy):
    """A quantum lost to a dead actor (reported with the checkpoint's steps) or ended early: the
    site's budget is what it used, so it is not retired as exhausted with steps left."""
    sched = make_scheduler(policy, 40, 20)
    sched.add_site("a")
    [d] = sched.allocate(1)
    sched.on_progress(SiteProgress("a", 0, (), math.nan, False))          # the quantum was lost
    granted = [d.steps]
    while not sched.done:
        for d in sched.allocate(1):
            if not d.action.retires:
                granted.append(d.steps)
                used = sum(granted) - granted[0]
                sched.on_progress(_progress("a", used, _falling(1.0 - 0.01 * (used - d.steps), 0.01, d.steps)))
    assert sum(granted) - granted[0] == 40 and sched.status_of("a") is SiteStatus.EXHAUSTED


def test_allocation_log_accumulates():
    sched = make_scheduler("round-robin", 100, 30)
    sched.add_site("a")
    sched.add_site("b")
    sched.allocate(2)
    assert sched.allocation_log == [("a", 30, 30), ("b", 30, 60)]
    assert sched.allocation_log[1].total == 60


# ---------------------------------------------------------------- policies

def test_round_robin_gives_equal_quanta_in_turn():
    sched = make_scheduler("round-robin", 10_000, 20)
    for i in range(5):
        sched.add_site(f"s{i}")
    served = []
    for _ in range(50):
        for d in sched.allocate(2):
            assert d.action is Action.GRANT and d.steps == 20
            served.append(d.site_id)
            sched.on_progress(_progress(d.site_id, 0, [1.0]))
    counts = Counter(served)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert served[:5] == ["s0", "s1", "s2", "s3", "s4"]


def test_fastest_falling_site_gets_the_largest_quantum_first():
    sched = make_scheduler("loss-slope", 10_000, 20)
    rates = {"slow": 0.008, "mid": 0.02, "fast": 0.05}  # 0.001 would count as a plateau
    for name in rates:
        sched.add_site(name)
    sched.allocate(3)
    for name, rate in rates.items():
        sched.on_progress(_progress(name, 20, _falling(10.0, rate, 20)))
    out = sched.allocate(3)
    steps = {d.site_id: d.steps for d in out}
    assert [d.site_id for d in out] == ["fast", "mid", "slow"]
    assert steps["fast"] > steps["mid"] > steps["slow"] >= 5
    assert steps["fast"] <= 80 and all(d.action is Action.GRANT for d in out)


def _max_wait(sched: Scheduler, sites: dict, rounds: int) -> dict[str, int]:
    """One slot; ``sites`` maps id -> loss rate per step (never reaching 0). Returns the
    longest run of allocations each site went without a grant."""
    level = {s: 1e6 for s in sites}
    for s in sites:
        sched.add_site(s)
    since = dict.fromkeys(sites, 0)
    worst = dict.fromkeys(sites, 0)
    for _ in range(rounds):
        for d in sched.allocate(1):
            losses = [level[d.site_id] * (1 - sites[d.site_id]) ** (i + 1) for i in range(d.steps)]
            level[d.site_id] = losses[-1]
            sched.on_progress(_progress(d.site_id, 0, losses))
            since[d.site_id] = -1
        for s in sites:
            since[s] += 1
            worst[s] = max(worst[s], since[s])
    return worst


@pytest.mark.parametrize("policy", POLICIES)
def test_no_live_site_starves_even_with_one_very_fast_site(policy):
    sites = {"fast": 0.5, **{f"flat{i}": 0.0 for i in range(4)}, "slowish": 1e-4}
    sched = make_scheduler(policy, 1_000_000, 20)
    worst = _max_wait(sched, sites, rounds=300)
    guard = {"loss-slope": lambda s: s.starve_after, "share": lambda s: s.guard.bound(len(sites))}
    bound = len(sites) + guard.get(policy, lambda s: 0)(sched)
    assert max(worst.values()) <= bound, worst


def test_plateau_gives_refresh_then_floor_quanta_when_refreshes_do_not_help():
    sched = make_scheduler("loss-slope", 10_000, 20, window=8, max_refreshes=2)
    sched.add_site("p")
    actions = []
    for _ in range(6):
        [d] = sched.allocate(1)
        actions.append((d.action, d.steps))
        sched.on_progress(_progress("p", 0, [0.7] * d.steps))
    assert actions[0] == (Action.GRANT, 20)
    assert actions[1] == (Action.REFRESH, 20)
    assert actions[2] == (Action.REFRESH, 20)
    assert actions[3:] == [(Action.GRANT, 5)] * 3  # hopeless: min_quantum only


def test_refresh_that_helps_is_allowed_again_and_hint_triggers_refresh():
    sched = make_scheduler("loss-slope", 10_000, 20, window=8, max_refreshes=1)
    sched.add_site("p")
    sched.allocate(1)
    sched.on_progress(_progress("p", 20, [0.7] * 20))
    assert sched.allocate(1)[0].action is Action.REFRESH
    sched.on_progress(_progress("p", 40, [0.3] * 20))  # refresh lowered the best loss
    assert sched.allocate(1)[0].action is Action.REFRESH
    sched.add_site("q")
    assert sched.allocate(1)[0] == Decision("q", Action.GRANT, 20)
    sched.on_progress(_progress("q", 20, [0.9, 0.8], hint=True))
    assert sched.allocate(1)[0].action is Action.REFRESH


@pytest.mark.parametrize("policy", POLICIES)
def test_nan_and_inf_losses_are_tolerated(policy):
    sched = make_scheduler(policy, 200, 20)
    sched.add_site("a")
    junk = [math.nan, math.inf, -math.inf, None, "bad", 1e308]
    for _ in range(4):
        [d] = sched.allocate(1)
        sched.on_progress(SiteProgress("a", math.nan, tuple(junk), math.nan, math.nan))
    sched.on_progress(SiteProgress("a", None, None, None, None, None))  # type: ignore[arg-type]
    [d] = sched.allocate(1)
    assert d.action in (Action.GRANT, Action.REFRESH) and d.steps >= 1
    assert sched.status_of("a") is SiteStatus.SEARCHING


# ---------------------------------------------------------------- side-by-side simulation

@dataclass
class FakeSite:
    """A site whose suspect loss falls linearly from ``start`` by ``rate`` per step and
    triggers at 0; a ``stuck`` site sits on a plateau until its samples are refreshed."""
    start: float
    rate: float
    stuck: bool = False
    t: int = 0

    def run(self, steps: int, refresh: bool) -> tuple[int, list[float], bool]:
        self.stuck = self.stuck and not refresh
        losses = []
        for _ in range(steps):
            if not self.stuck:
                self.t += 1
            losses.append(max(0.0, self.start - self.rate * self.t))
            if losses[-1] == 0.0:
                return len(losses), losses, True  # the search stops at the trigger
        return steps, losses, False


def simulate(policy: str, sites: dict[str, FakeSite], *, max_steps: int = 3000,
             quantum: int = 20) -> dict[str, int | None]:
    """Run a one-slot campaign; return, per site, the campaign's total steps spent when
    it triggered (None: never)."""
    sched = make_scheduler(policy, max_steps, quantum)
    for name in sites:
        sched.add_site(name)
    used: dict[str, int] = defaultdict(int)
    found: dict[str, int | None] = dict.fromkeys(sites)
    total = 0
    while not sched.done:
        for d in sched.allocate(1):
            if d.action.retires:
                continue
            n, losses, hit = sites[d.site_id].run(d.steps, d.action is Action.REFRESH)
            used[d.site_id] += n
            total += n
            if hit:
                found[d.site_id] = total
            sched.on_progress(_progress(d.site_id, used[d.site_id], losses, triggered=hit))
    return found | {"_total": total}


def _campaign():
    return {"slow": FakeSite(15.0, 0.01), "fast1": FakeSite(1.0, 0.01),
            "fast2": FakeSite(1.0, 0.01)}  # 1500 steps vs 100 and 100


# share keeps half the steps round-robin (its starvation guard): with 3 sites, two of them equally
# promising, each gets at most 1/6 + 1/4 of the steps, so the later one is found at best 1.25x sooner
@pytest.mark.parametrize("policy, fast_sum, fast_max", [("loss-slope", 1.4, 1.25), ("share", 1.3, 1.1)])
def test_simulation_reaches_the_few_step_sites_sooner(policy, fast_sum, fast_max):
    ls, rr = simulate(policy, _campaign()), simulate("round-robin", _campaign())
    # Sites stop at their trigger, so the work to find *every* site is the same ...
    assert ls["_total"] == rr["_total"] == 1700
    assert ls["slow"] == rr["slow"] == 1700
    # ... but the policy spends far fewer steps before the few-step sites are found
    # (measured: loss-slope 145 and 225 steps, share 150 and 270, against 280 and 300).
    ls_fast, rr_fast = [ls["fast1"], ls["fast2"]], [rr["fast1"], rr["fast2"]]
    assert sum(rr_fast) / sum(ls_fast) >= fast_sum, (ls, rr)
    assert max(rr_fast) / max(ls_fast) >= fast_max, (ls, rr)


@pytest.mark.parametrize("policy", ["loss-slope", "share"])
def test_simulation_finds_all_with_fewer_steps_when_a_site_plateaus(policy):
    def campaign():
        return {**_campaign(), "stuck": FakeSite(0.4, 0.01, stuck=True)}  # 40 steps once freed

    ls = simulate(policy, campaign())
    rr = simulate("round-robin", campaign())
    assert all(ls[s] is not None for s in campaign())  # a REFRESH freed the stuck site
    assert rr["stuck"] is None  # round-robin spent its whole budget on the plateau
    assert rr["_total"] / ls["_total"] >= 2.0, (ls, rr)


def test_decisions_do_not_depend_on_hash_randomness(tmp_path):
    """The same calls give the same decisions in processes with different string hashing
    (no set or hash order reaches a decision)."""
    import subprocess
    import sys

    script = tmp_path / "drive.py"
    script.write_text("""
import math
from orchestrator.scheduler import make_scheduler, SiteProgress
out = []
for policy in ("share", "loss-slope", "round-robin"):
    s = make_scheduler(policy, 400, 20)
    for i in range(12):
        s.add_site(f"site-{i}")
    used = {}
    for r in range(80):
        for d in s.allocate(2):
            out.append((policy, d.site_id, d.action.value, d.steps))
            if d.action.retires:
                continue
            n = int(d.site_id.split("-")[1])
            used[d.site_id] = used.get(d.site_id, 0) + d.steps
            t = used[d.site_id]
            losses = tuple(max(0.0, 50.0 - (n % 4) * 0.05 * (t - d.steps + i)) for i in range(d.steps))
            s.on_progress(SiteProgress(d.site_id, t, losses, min(losses), losses[-1] == 0.0, log_space=n % 2 == 0))
print(out)
""")
    runs = [subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                           env={**__import__("os").environ, "PYTHONHASHSEED": seed}) for seed in ("1", "2")]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout and len(runs[0].stdout) > 1000


def test_package_is_pure():
    """stdlib, numpy and fuzz_core.status only: no ray, mlflow, torch or the rest of the orchestrator."""
    import ast
    from pathlib import Path

    import orchestrator.scheduling as pkg

    roots = set()
    for path in sorted(Path(pkg.__file__).parent.glob("*.py")) + [Path(pkg.__file__).parent.parent / "scheduler.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                roots.add(node.module)
    outside = {r for r in roots if not r.startswith("orchestrator.scheduling")}
    assert {r.split(".")[0] for r in outside} <= {
        "__future__", "abc", "collections", "dataclasses", "enum", "functools", "heapq", "inspect", "json",
        "logging", "math", "types", "typing", "numpy", "fuzz_core"}, outside
    assert {r for r in outside if r.startswith("fuzz_core")} == {"fuzz_core.status"}
