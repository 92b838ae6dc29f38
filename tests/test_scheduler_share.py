"""The ``share`` policy: each composable part alone (pure, no scheduler), then the policy's
own promises: shares in proportion to weights, never zero, a cheap first pass, refresh then
retirement without progress, and the issue-3 failure mode (a bug that looks worse than its
decoys) no longer starved. Fast, no Ray."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pytest

from fuzz_core.status import SiteStatus
from orchestrator.scheduler import (
    Action, CurvePredictor, Patience, PlateauRefresh, PowerSchedule, ShareScheduler, SiteProgress,
    StarvationGuard, make_scheduler,
)
from orchestrator.scheduling.parts import CurveStats, ReachProbe, ReachStats, RefreshStats


def _feed(pred: CurvePredictor, st: CurveStats, losses, used: int = 0, log_space: bool = False) -> bool:
    finite = [v for v in losses if math.isfinite(v)]
    return pred.observe(st, tuple(losses), min(finite, default=math.nan), log_space, used)


# ------------------------------------------------------------------------------ the predictor

def test_predictor_reads_a_steady_fall_as_steps_to_trigger():
    p, st = CurvePredictor(window=8), CurveStats()
    assert math.isnan(st.pred)
    _feed(p, st, [10.0 - 0.5 * i for i in range(8)])
    assert st.pred == pytest.approx(6.5 / 0.5) and st.best == 6.5 and st.first == 10.0


@pytest.mark.parametrize("losses, why", [
    ([5.0] * 8, "flat"),
    ([1e-45] * 8, "parked at a clamp: a tiny loss that does not fall is not about to trigger"),
    ([5.0, 5.0001, 4.99995, 5.0] * 2, "a fall within the tolerance"),
])
def test_predictor_sees_no_progress(losses, why):
    p, st = CurvePredictor(window=8), CurveStats()
    _feed(p, st, losses)
    assert st.pred == math.inf, why


def test_predictor_a_report_with_no_new_best_says_the_fall_stopped():
    p, st = CurvePredictor(window=8), CurveStats()
    assert _feed(p, st, [10.0 - i for i in range(5)])             # a real gain
    assert 0 < st.pred < math.inf
    assert not _feed(p, st, [7.0, 6.5, 6.8], used=8)               # noise above the best (6.0)
    assert st.pred == math.inf and st.gained == 0


def test_predictor_judges_log_space_losses_by_the_margin_they_remove():
    """Near 100 in log space, 0.05 a step is 1% of the level (flat for a plain loss) but 5% of
    the margin at every step."""
    falls = [105.0 - 0.05 * i for i in range(16)]
    plain, log = CurveStats(), CurveStats()
    _feed(CurvePredictor(), plain, falls)
    _feed(CurvePredictor(), log, falls, log_space=True)
    assert plain.pred == math.inf and 0 < log.pred < math.inf
    CurvePredictor().observe(log, (), 104.0, False, 30)            # a resumed site's empty report
    assert log.log_space                                           # ... does not unsay it


def test_predictor_tolerates_junk():
    p, st = CurvePredictor(), CurveStats()
    p.observe(st, (math.nan, None, "x", math.inf), math.nan, math.nan, 0)
    p.observe(st, None, None, None, 0)
    assert st.best == math.inf and math.isnan(st.pred)


# ------------------------------------------------------------------------------ the power schedule

def test_power_schedule_weight_grows_with_the_chance_of_triggering_soon():
    s = PowerSchedule(floor=0.2, cap=4.0)
    assert s.weight(math.nan, 100) == 1.0                # no prediction yet: optimistic
    assert s.weight(0.0, 100) == 4.0                     # at the edge: the cap
    assert s.weight(math.inf, 100) == pytest.approx(0.2)  # not falling: the floor, never 0
    preds = [1, 10, 100, 1_000, 10_000, 1e9]
    weights = [PowerSchedule(floor=0.01, cap=4.0).weight(p, 1000, ref=1.0) for p in preds]
    assert weights == sorted(weights, reverse=True) and len(set(weights)) == 4
    assert all(0.01 <= w <= 4.0 for w in weights) and weights[0] == 4.0   # the closest site gets the cap
    assert s.weight(10, 1000, ref=1.0) == pytest.approx(0.4)              # ten times farther: a tenth
    assert s.weight(500, 100) < s.weight(500, 1000)     # more budget left: more chance within it
    assert PowerSchedule(power=2.0, cap=4.0).weight(10, 1000, ref=5.0) == pytest.approx(4.0 / 4)


# ------------------------------------------------------------------------------ refresh and patience

def test_plateau_refresh_counts_fruitless_refreshes_until_stale():
    r, st = PlateauRefresh(max_refreshes=2), RefreshStats()
    r.observe(st, plateau=True, gained=False, helped=False)
    assert r.wants_refresh(st)
    for _ in range(2):
        r.granted(st, refreshed=True, best=1.0)
        assert not r.wants_refresh(st)
        r.observe(st, plateau=True, gained=False, helped=False)    # judged at the next plateau: in vain
    assert st.fruitless == 2 and st.stale and not r.wants_refresh(st)
    r.observe(st, plateau=False, gained=True, helped=True)         # a real gain: judged afresh
    assert not st.stale and st.fruitless == 0


def test_a_refresh_that_helped_does_not_count():
    r, st = PlateauRefresh(max_refreshes=1), RefreshStats()
    r.observe(st, plateau=True, gained=False, helped=False)
    r.granted(st, refreshed=True, best=1.0)
    r.observe(st, plateau=True, gained=False, helped=True)
    assert st.fruitless == 0 and r.wants_refresh(st)


def test_patience_gives_up_on_stale_sites_only():
    p = Patience()
    assert p.steps(1000) == 500 and Patience(after=7).steps(1000) == 7     # default: half the budget
    assert p.gives_up(stale=True, used=600, gained=100, max_steps=1000)
    assert not p.gives_up(stale=True, used=599, gained=100, max_steps=1000)
    assert not p.gives_up(stale=False, used=1000, gained=0, max_steps=1000)
    # a site whose op fired outside its bounds waits for the training that brings it in: never given up
    assert not p.gives_up(stale=True, used=600, gained=100, max_steps=1000, outside=True)
    assert p.gives_up(stale=True, used=600, gained=100, max_steps=1000, outside=False)


def test_starvation_guard_keeps_its_reserve_of_the_steps_and_bounds_the_waits():
    g = StarvationGuard(reserve=0.5)
    assert g.lane(0, 0) == "reserve" and g.lane(5, 0) == "share" and g.lane(5, 80) == "reserve"
    assert g.bound(0) == 0 and g.bound(25) == 50 and g.bound(1000) == 2000
    assert StarvationGuard(reserve=0.2).bound(10) == 50       # 4 share grants between two reserve turns
    reserve = share = 0
    for size in [80, 5, 33, 80, 80, 7] * 20:                  # share grants of any size, reserve turns of 5
        if g.lane(reserve, share) == "reserve":
            reserve += 5
        else:
            share += size
    assert 0.45 <= reserve / (reserve + share) <= 0.55


def test_every_live_site_keeps_the_reserve_share_of_the_steps():
    """One site falls fast (the power schedule's favourite), five are flat: each flat one still
    gets at least about reserve / live of the steps, as under round-robin with half the steps."""
    sched = make_scheduler("share", 1_000_000, 20)
    sites = ["fast"] + [f"flat{i}" for i in range(5)]
    for s in sites:
        sched.add_site(s)
    used, level = Counter(), 1e6
    for _ in range(600):
        for d in sched.allocate(1):
            if d.site_id == "fast":
                losses = [level * 0.99 ** (i + 1) for i in range(d.steps)]
                level = losses[-1]
            else:
                losses = [5.0 + 0.01 * (i % 2) for i in range(d.steps)]
            used[d.site_id] += d.steps
            _report(sched, d.site_id, used[d.site_id], losses)
    total = sum(used.values())
    # the other half follows the weights: fast has the cap (4), each flat one the floor (0.25)
    assert used["fast"] / total >= 0.9 * (1 / 12 + 0.5 * 4 / (4 + 5 * 0.25)), used
    assert min(used[s] for s in sites[1:]) / total >= 0.9 * sched.guard.reserve / len(sites), used


# ------------------------------------------------------------------------------ the policy

def _report(sched, site_id: str, used: int, losses, triggered: bool = False, log_space: bool = False):
    finite = [v for v in losses if math.isfinite(v)]
    sched.on_progress(SiteProgress(site_id, used, tuple(losses), min(finite, default=math.nan), triggered,
                                   log_space=log_space))


def test_first_pass_probes_every_site_in_order_cheaply():
    sched = make_scheduler("share", 600, 20)
    for i in range(25):
        sched.add_site(f"s{i}")
    first = sched.allocate(25)
    assert [d.site_id for d in first] == [f"s{i}" for i in range(25)]
    assert {d.steps for d in first} == {sched.min_quantum}         # 4 quanta over 25 sites < min_quantum


def test_shares_follow_the_weights_and_never_fall_to_zero():
    """A site falling steadily and a flat one, one slot: the flat one keeps the floor's share."""
    sched = make_scheduler("share", 1_000_000, 20)
    assert isinstance(sched, ShareScheduler)
    for s in ("fall", "flat"):
        sched.add_site(s)
    used, level = Counter(), 1e6
    for _ in range(400):
        for d in sched.allocate(1):
            if d.site_id == "fall":
                losses = [level * 0.99 ** (i + 1) for i in range(d.steps)]
                level = losses[-1]
            else:
                losses = [5.0 + 0.01 * (i % 2) for i in range(d.steps)]
            used[d.site_id] += d.steps
            _report(sched, d.site_id, used[d.site_id], losses)
    share = used["flat"] / (used["fall"] + used["flat"])
    # its half of the reserve, and the floor's part of the rest beside the falling site's cap
    floor, cap, reserve = sched.schedule.floor, sched.schedule.cap, sched.guard.reserve
    expected = reserve / 2 + (1 - reserve) * floor / (floor + cap)
    assert share == pytest.approx(expected, rel=0.1), (used, share)
    assert share >= reserve / 2 * 0.95


def test_plateau_refresh_then_retire_without_progress_with_budget_left():
    sched = make_scheduler("share", 1000, 20, predictor={"window": 8}, patience={"after": 200})
    sched.add_site("flat")
    used, actions = 0, []
    while not sched.done:
        for d in sched.allocate(1):
            actions.append(d.action)
            if d.action.retires:
                continue
            used += d.steps
            _report(sched, "flat", used, [0.7] * d.steps)
    assert Action.REFRESH in actions[:8]      # once it sat still as long as its probe took (5-step grants)
    assert actions[-1] is Action.RETIRE_NO_PROGRESS and actions.count(Action.RETIRE_NO_PROGRESS) == 1
    assert 200 <= used < 1000 and sched.status_of("flat") is SiteStatus.RETIRED


def test_refresh_waits_longer_the_more_progress_it_would_throw_away():
    """A plateau is ripe after a full window and as many steps without a gain as the site took to
    reach its best: a site that fell for 300 steps, then sat still, is not refreshed before 600."""
    refresh = PlateauRefresh()
    assert not refresh.ripe(used=20, gained=12, window=16)     # not a full window yet
    assert refresh.ripe(used=28, gained=12, window=16)
    assert not refresh.ripe(used=599, gained=300, window=16)
    assert refresh.ripe(used=600, gained=300, window=16)
    assert PlateauRefresh(grow=0).ripe(used=316, gained=300, window=16)   # the old rule: a window
    with pytest.raises(ValueError, match="grow"):
        PlateauRefresh(grow=-1)

    def refreshes(fall_steps: int) -> list[int]:
        """A site whose loss falls for ``fall_steps`` steps, then stays flat: the steps at its refreshes."""
        sched = make_scheduler("share", 3000, 20, predictor={"window": 8}, refresh={"max_refreshes": 50})
        sched.add_site("s")
        used, at, level = 0, [], 100.0
        while not sched.done and used < 1500:
            for d in sched.allocate(1):
                if d.action.retires:
                    continue
                if d.action is Action.REFRESH:
                    at.append(used)
                losses = []
                for _ in range(d.steps):
                    used += 1
                    level = level * 0.99 if used <= fall_steps else level
                    losses.append(level)
                _report(sched, "s", used, losses)
        return at

    assert refreshes(300)[0] >= 600
    assert refreshes(0)[0] < 100


def test_a_stalled_site_that_progressed_outweighs_one_that_never_moved():
    s = PowerSchedule()
    assert s.weight(math.inf, 100, progressed=True) == pytest.approx(1.0)
    assert s.weight(math.inf, 100, progressed=False) == pytest.approx(s.floor) and s.floor < 1.0
    assert PowerSchedule(stalled=9.0, cap=4.0).weight(math.inf, 100, progressed=True) == pytest.approx(4.0)   # within the cap
    with pytest.raises(ValueError, match="progress"):
        PowerSchedule(progress=1.5)


def test_a_loss_parked_at_a_clamp_is_not_a_stalled_bug():
    """Both fell from 1.0 most of the way to the edge; one sits at its clamp (the same value at every
    step: a guarded op), the other still moves: only the one that moves keeps the stalled weight."""
    parked, wanders = CurveStats(), CurveStats()
    p = CurvePredictor(window=8)
    _feed(p, parked, [1.0 - 0.12 * i for i in range(8)])
    _feed(p, wanders, [1.0 - 0.12 * i for i in range(8)])
    _feed(p, parked, [1e-6] * 8, used=8)
    _feed(p, wanders, [1e-6, 3e-4, 2e-5, 1e-4, 6e-5, 2e-4, 1e-5, 4e-5], used=8)
    assert not parked.moving and wanders.moving
    weights = {}
    for name, losses in (("parked", [1e-6] * 8), ("wanders", [1e-6, 3e-4, 2e-5, 1e-4, 6e-5, 2e-4, 1e-5, 4e-5])):
        sched = make_scheduler("share", 1000, 20)
        sched.add_site(name)
        reports = [(8, tuple(1.0 - 0.12 * i for i in range(8)), 0.16), (16, tuple(losses), 1e-6),
                   (24, tuple(losses), 1e-6)]          # the last has no new best: the fall has stopped
        for used, trace, best in reports:
            assert [d.site_id for d in sched.allocate(1)] == [name]
            sched.on_progress(SiteProgress(name, used, trace, best, False))
        weights[name] = sched.weight(sched._sites[name])
    assert weights == {"parked": pytest.approx(sched.schedule.floor), "wanders": pytest.approx(sched.schedule.stalled)}


def test_a_site_that_keeps_improving_is_never_retired_early():
    sched = make_scheduler("share", 1000, 20, predictor={"window": 8}, patience={"after": 100})
    sched.add_site("slow")
    used, level = 0, 100.0
    while not sched.done:
        for d in sched.allocate(1):
            if d.action.retires:
                assert d.action is Action.RETIRE_EXHAUSTED
                continue
            losses = []
            for _ in range(d.steps):
                level *= 0.999
                losses.append(level)
            used += d.steps
            _report(sched, "slow", used, losses)
    assert used == 1000 and sched.status_of("slow") is SiteStatus.EXHAUSTED


def test_a_late_site_joins_at_the_present():
    """A site added after many grants gets its share from then on, not the backlog of every turn it
    missed (which would shut the others out until it caught up)."""
    sched = make_scheduler("share", 1_000_000, 20)
    sched.add_site("early")
    used = Counter()
    for _ in range(50):
        for d in sched.allocate(1):
            used[d.site_id] += d.steps
            _report(sched, d.site_id, used[d.site_id], [5.0 + 0.01 * (i % 2) for i in range(d.steps)])
    sched.add_site("late")
    served = []
    for _ in range(6):
        for d in sched.allocate(1):
            served.append(d.site_id)
            used[d.site_id] += d.steps
            _report(sched, d.site_id, used[d.site_id], [5.0 + 0.01 * (i % 2) for i in range(d.steps)])
    assert served[0] == "late" and served.count("early") >= 2, served


def test_many_slots_never_grant_a_running_site_twice():
    sched = make_scheduler("share", 10_000, 20)
    for i in range(5):
        sched.add_site(f"s{i}")
    running = set()
    for r in range(30):
        for d in sched.allocate(3):
            assert d.site_id not in running
            running.add(d.site_id)
        done = sorted(running)[: 1 + r % 2]
        for s in done:
            running.discard(s)
            _report(sched, s, 20 * (r + 1), [5.0 - 0.01 * i for i in range(20)])


# ------------------------------------------------------------------------------ against round-robin

@dataclass
class Fake:
    """Suspect loss: ``start`` falling by ``rate`` per step; ``flat_until`` steps flat at ``start``
    first (then 0 at once: a bug that looks flat, then triggers); ``floor_at`` > 0 stops the fall
    at that level forever (a decoy: a guard's clamp or eps)."""
    start: float
    rate: float = 0.0
    flat_until: int = 0
    floor_at: float = 0.0
    t: int = 0
    outside: bool | None = None    # what an out-of-box probe says (None: the program gives no verdict)

    def run(self, steps: int) -> tuple[list[float], bool]:
        losses = []
        for _ in range(steps):
            self.t += 1
            if self.flat_until:
                loss = self.start + 0.01 * (self.t % 3) if self.t < self.flat_until else 0.0
            else:
                loss = max(self.floor_at, self.start - self.rate * self.t)
            losses.append(loss)
            if loss == 0.0:
                return losses, True
        return losses, False


def _until_found(policy: str, sites: dict[str, Fake], bugs: set[str], max_steps: int = 1500, **options) -> int:
    """Campaign steps until every bug in ``bugs`` triggered, the out-of-box probes' steps included."""
    sched = make_scheduler(policy, max_steps, 20, **options)
    for name in sites:
        sched.add_site(name)
    total, used, found = 0, Counter(), {}
    while not sched.done and not bugs <= set(found):
        for d in sched.allocate(1):
            if d.action.retires:
                continue
            losses, hit = sites[d.site_id].run(d.steps)
            used[d.site_id] += len(losses)
            total += len(losses) + (d.reach_steps if not hit else 0)
            if hit:
                found[d.site_id] = total
            finite = [v for v in losses if math.isfinite(v)]
            sched.on_progress(SiteProgress(d.site_id, used[d.site_id], tuple(losses), min(finite, default=math.nan),
                                           hit, outside=sites[d.site_id].outside if d.reach_steps and not hit else None))
    assert bugs <= set(found), (policy, found)
    return max(found[b] for b in bugs)


def test_a_bug_that_looks_worse_than_its_decoys_is_not_starved():
    """Issue 3's failure: decoys that fell fast and sit at their clamps, and a bug that looks flat
    for 300 of its steps, then triggers. Strict priority served the decoys first; shares keep the
    bug within twice round-robin's steps."""
    def campaign():
        sites = {f"clamp{i}": Fake(1.0, 0.2, floor_at=1e-6 * (i + 1)) for i in range(6)}
        sites |= {f"guard{i}": Fake(50.0 + i) for i in range(12)}
        sites |= {"bug": Fake(80.0, flat_until=300)}
        return dict(sorted(sites.items()))

    rr = _until_found("round-robin", campaign(), {"bug"})
    share = _until_found("share", campaign(), {"bug"})
    assert share <= 2 * rr, (share, rr)


def test_the_out_of_box_probe_tells_a_guarded_op_from_a_bug():
    """Issue 16's remaining failure on the scheduler benchmark: guarded ops whose loss creeps
    toward their clamp (the most promising-looking sites of all) and a bug that the program's own
    training brings to the edge, flat until it jumps. No loss-based prediction tells them apart;
    the out-of-box probe does (the guarded op does not fire even 100x outside its bounds, the
    bug's does), and the bug is found in a fraction of round-robin's steps, probes included."""
    def campaign():
        sites = {f"creep{i}": Fake(100.0, 0.05, floor_at=60.0 + i, outside=False) for i in range(8)}
        sites |= {f"guard{i}": Fake(50.0 + i, outside=False) for i in range(12)}
        sites |= {"bug": Fake(80.0, flat_until=300, outside=True)}
        return dict(sorted(sites.items()))

    rr = _until_found("round-robin", campaign(), {"bug"})
    blind = _until_found("share", campaign(), {"bug"}, reach={"steps": 0})
    probed = _until_found("share", campaign(), {"bug"})
    assert probed * 2 <= rr and probed * 2 <= blind, (probed, blind, rr)


def test_reach_probe_is_asked_once_per_growth_of_the_steps_used():
    p, st = ReachProbe(after=20, steps=16, growth=2.0), ReachStats()
    assert not p.due(st, 19) and p.ask(st, 19) == 0
    assert p.ask(st, 25) == 16 and st.next_at == 50     # asked: the next only at twice the steps
    assert p.ask(st, 30) == 0                           # unanswered (a program that raised): not again yet
    p.observe(st, None)
    assert st.outside is None and st.probes == 0
    assert p.ask(st, 50) == 16
    p.observe(st, False)
    assert st.outside is False and st.probes == 1 and p.ask(st, 99) == 0 and p.due(st, 100)
    p.observe(st, True)                                 # training brought its edge into reach: no more probes
    assert p.ask(st, 10_000) == 0
    assert ReachProbe(steps=0).ask(ReachStats(), 10_000) == 0
    with pytest.raises(ValueError, match="growth"):
        ReachProbe(growth=1.0)


def test_power_schedule_follows_the_probe_verdict_over_the_loss():
    s = PowerSchedule(floor=0.1, cap=16.0, unreached=0.25, reached=1.0)
    assert s.weight(1.0, 1000, ref=1.0, outside=False) == pytest.approx(0.025)   # the closest: still a guard
    assert PowerSchedule().weight(1.0, 1000, ref=1.0, outside=False) == pytest.approx(0.1)   # default: the floor
    with pytest.raises(ValueError, match="unreached"):
        PowerSchedule(unreached=1.5)
    assert s.weight(math.inf, 1000, outside=True) == 1.0                         # flat, but it can fire
    assert s.weight(1.0, 1000, ref=1.0, outside=True) == 16.0                    # a better weight stays
    assert s.weight(math.inf, 1000, outside=None) == pytest.approx(0.1)          # no verdict: as before


def test_a_probe_grant_is_small_and_its_verdict_sets_the_weight():
    sched = make_scheduler("share", 1000, 20)
    for name in ("a", "b"):
        sched.add_site(name)
    used = Counter()
    grants = []
    for _ in range(40):
        for d in sched.allocate(1):
            grants.append(d)
            used[d.site_id] += d.steps
            losses = [5.0 + 0.01 * (i % 2) for i in range(d.steps)]
            sched.on_progress(SiteProgress(d.site_id, used[d.site_id], tuple(losses), 5.0, False,
                                           outside=(d.site_id == "b") if d.reach_steps else None))
    asked = [d for d in grants if d.reach_steps]
    assert {d.site_id for d in asked} == {"a", "b"}
    assert all(d.steps == sched.min_quantum and d.reach_steps == sched.reach.steps for d in asked)
    assert all(used_before >= sched.reach.after for used_before in
               [sum(g.steps for g in grants[:i] if g.site_id == d.site_id) for i, d in enumerate(grants) if d.reach_steps])
    a, b = sched._sites["a"], sched._sites["b"]
    assert sched.weight(a) == pytest.approx(sched.schedule.floor * sched.schedule.unreached)
    assert sched.weight(b) >= sched.schedule.reached
    assert [d.site_id for d in asked].count("b") == 1      # a verdict that it fires is final

