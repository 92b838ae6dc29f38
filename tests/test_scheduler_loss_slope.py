"""The loss-slope policy's budget rules: a cheap first pass, the exploration floor, the
plateau -> refresh -> retire path, and a campaign of many guarded sites (fast, no Ray)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pytest

from fuzz_core.status import SiteStatus
from orchestrator.scheduler import Action, LossSlopeScheduler, SiteProgress, make_scheduler


def _report(sched, d, losses, *, used, triggered=False, log_space=False):
    finite = [v for v in losses if math.isfinite(v)]
    sched.on_progress(SiteProgress(d.site_id, used, tuple(losses), min(finite, default=math.nan), triggered,
                                   log_space=log_space))


def _d(site_id):
    """A stand-in for a Decision: _report only reads its site_id."""
    return type("D", (), {"site_id": site_id})()


def test_first_pass_probe_shrinks_with_the_number_of_sites():
    many = make_scheduler("loss-slope", 600, 20)
    for i in range(25):
        many.add_site(f"s{i}")
    first = many.allocate(25)
    assert [d.site_id for d in first] == [f"s{i}" for i in range(25)]  # every site probed, in order
    assert {d.steps for d in first} == {many.min_quantum}              # 4 quanta / 25 sites < min
    few = make_scheduler("loss-slope", 600, 20)
    for i in range(3):
        few.add_site(f"s{i}")
    assert {d.steps for d in few.allocate(3)} == {20}                  # a full quantum each


def test_a_loss_parked_just_above_a_clamp_is_not_about_to_trigger():
    # "pred = loss / max(eps, -slope)" with loss 1e-45 and no fall would say 1e-36 steps
    sched = make_scheduler("loss-slope", 10_000, 20, window=8)
    sched.add_site("parked")
    sched.add_site("falling")
    sched.allocate(2)
    _report(sched, _d("parked"), [1e-45] * 20, used=20)
    _report(sched, _d("falling"), [10.0 - 0.1 * i for i in range(20)], used=20)
    out = sched.allocate(2)
    assert out[0].site_id == "falling" and out[0].steps > out[1].steps



def _flat_and_falling(max_steps: int, start: float, rate: float, log_space: bool = False, **options):
    """A scheduler after two rounds over two sites: "flat" at 5.0, and "fall" falling from
    ``start`` by ``rate`` per step (its losses reported as log space or not)."""
    sched = make_scheduler("loss-slope", max_steps, 20, **options)
    for s in ("flat", "fall"):
        sched.add_site(s)
    used = Counter()
    for _ in range(2):
        for d in sched.allocate(2):
            used[d.site_id] += d.steps
            losses = ([5.0] * d.steps if d.site_id == "flat" else
                      [start - rate * (used["fall"] - d.steps + i) for i in range(d.steps)])
            _report(sched, d, losses, used=used[d.site_id], log_space=log_space and d.site_id == "fall")
    return sched


def test_a_log_space_loss_is_judged_by_the_margin_it_removes():
    """log(margin) less a floor sits near 100 for a log or a division: a fall of 0.05 per step
    is 1% of that level in 16 steps (flat, for a plain loss) but removes 5% of the margin at
    every step (log space). Reported as log space, the site is falling and gets the steps."""
    plain, log = _flat_and_falling(600, 105.0, 0.05), _flat_and_falling(600, 105.0, 0.05, log_space=True)
    assert plain._sites["fall"].pred == math.inf          # a 1% fall of the loss: no evidence
    assert 0 < log._sites["fall"].pred < math.inf
    first = log.allocate(1)[0]
    assert first.site_id == "fall" and first.steps >= log.quantum
    # a report with no losses (a site resumed from its checkpoint) does not unsay it
    log.on_progress(SiteProgress("fall", 30, (), 104.0, False))
    assert log._sites["fall"].log_space


def test_a_site_still_falling_outranks_flat_ones_even_when_its_budget_looks_short():
    """A straight line through the fall says 500 steps with 160 left, but curves are rarely
    straight (a log loss can jump to 0 from far above): still falling beats flat."""
    sched = _flat_and_falling(200, 10.0, 0.02)
    far = sched._sites["fall"]
    assert far.pred > sched._remaining(far)
    assert [d.site_id for d in sched.allocate(1)] == ["fall"]


@pytest.mark.parametrize("horizon, rate, on_course", [
    (None, 0.02, True),   # predicted 480 steps with 160 left: no horizon, still on course
    (4.0, 0.02, True),    # within 4 x 160
    (1.0, 0.02, False),   # past its remaining budget
    (1.0, 0.2, True),     # predicted about 45 steps: within it
])
def test_a_horizon_takes_a_site_predicted_past_its_budget_off_course(horizon, rate, on_course):
    sched = _flat_and_falling(200, 10.0, rate, horizon=horizon)
    fall = sched._sites["fall"]
    assert 0 < fall.pred < math.inf and (fall.pred > sched._remaining(fall)) is (rate == 0.02)
    grants = {d.site_id: d.steps for d in sched.allocate(2)}
    if on_course:   # served first, with more steps than the flat site
        assert next(iter(grants)) == "fall" and grants["fall"] > grants["flat"]
    else:           # two sites off course that never progressed: a quantum each
        assert grants == {"flat": 20, "fall": 20}


@pytest.mark.parametrize("horizon", [0, -1.0, math.nan, "1", True])
def test_a_horizon_must_be_a_positive_number(horizon):
    with pytest.raises(ValueError, match="horizon"):
        make_scheduler("loss-slope", 600, 20, horizon=horizon)


def test_plateau_refresh_then_retire_before_the_budget_is_spent():
    sched = make_scheduler("loss-slope", 1000, 20, window=8, max_refreshes=2, retire_after=200)
    sched.add_site("flat")
    used, actions = 0, []
    while not sched.done:
        for d in sched.allocate(1):
            actions.append(d.action)
            if d.action.retires:
                continue
            used += d.steps
            _report(sched, d, [0.7] * d.steps, used=used)
    assert actions[0] is Action.GRANT
    assert actions[1:3] == [Action.REFRESH, Action.REFRESH]   # refreshes come first
    assert Action.REFRESH not in actions[3:]
    assert actions[-1] is Action.RETIRE_NO_PROGRESS           # not "exhausted": budget left
    assert 200 <= used < 1000                                  # retired early, budget left
    assert sched.status_of("flat") is SiteStatus.RETIRED


def test_a_site_that_keeps_improving_is_never_retired_early():
    sched = make_scheduler("loss-slope", 1000, 20, window=8, retire_after=100)
    sched.add_site("slow")
    used, level = 0, 100.0
    while not sched.done:
        for d in sched.allocate(1):
            if d.action.retires:
                assert d.action is Action.RETIRE_EXHAUSTED
                continue
            losses = []
            for _ in range(d.steps):
                level *= 0.999  # slow but steady: a new best every few steps
                losses.append(level)
            used += d.steps
            _report(sched, d, losses, used=used)
    assert used == 1000  # ran to its budget


def test_refresh_that_helps_resets_the_count_and_keeps_the_site():
    sched = make_scheduler("loss-slope", 10_000, 20, window=8, max_refreshes=1, retire_after=40)
    sched.add_site("p")
    [d] = sched.allocate(1)
    _report(sched, d, [0.7] * 20, used=20)
    [d] = sched.allocate(1)
    assert d.action is Action.REFRESH
    _report(sched, d, [0.3] * 20, used=40)                      # the refresh found a lower loss
    [d] = sched.allocate(1)
    assert d.action is Action.REFRESH and d.steps == 20         # not hopeless, not retired


def test_flat_site_is_not_starved_by_a_falling_one():
    """The floor: a flat site keeps at least ``floor`` of the leader's budget (less one min
    quantum), at every allocation; it is served with small quanta only."""
    sched = make_scheduler("loss-slope", 1_000_000, 20)
    assert isinstance(sched, LossSlopeScheduler)
    for s in ("fast", "flat"):
        sched.add_site(s)
    level, granted = 1e6, Counter()
    for _ in range(200):
        for d in sched.allocate(1):
            granted[d.site_id] += d.steps
            if d.site_id == "fast":
                losses = [level * 0.99 ** (i + 1) for i in range(d.steps)]
                level = losses[-1]
            else:
                losses = [5.0] * d.steps
            _report(sched, d, losses, used=granted[d.site_id])
        assert granted["flat"] >= sched.floor * granted["fast"] - sched.quantum
    assert granted["fast"] > 4 * granted["flat"]       # ... and the falling site gets the most


@dataclass
class Fake:
    """Suspect loss: ``start`` falling by ``rate`` per step; ``flat_until`` steps flat at
    ``start`` first (it then drops to 0 at once: a bug that a ReLU region dying reveals);
    ``floor_at`` > 0 stops the fall at that level forever (a guard: clamp or eps)."""
    start: float
    rate: float = 0.0
    flat_until: int = 0
    floor_at: float = 0.0
    t: int = 0

    def loss(self) -> float:
        if self.flat_until:
            return self.start if self.t < self.flat_until else 0.0
        return max(self.floor_at, self.start - self.rate * self.t)

    def run(self, steps: int) -> tuple[list[float], bool]:
        losses = []
        for _ in range(steps):
            self.t += 1
            losses.append(self.loss())
            if losses[-1] == 0.0:
                return losses, True
        return losses, False


def _campaign() -> tuple[dict[str, Fake], set[str]]:
    sites = {f"guard{i}": Fake(100.0 - i) for i in range(14)}                 # flat from the start
    sites |= {f"clamp{i}": Fake(1.0, 0.05, floor_at=1e-6) for i in range(4)}  # fall, then stop
    sites |= {f"slowfall{i}": Fake(100.0, 0.005) for i in range(2)}           # never in budget
    bugs = {"steady": Fake(1.0, 1 / 70), "fast": Fake(50.0, 10.0), "sudden": Fake(100.0, flat_until=8),
            "late": Fake(100.0, 1.0), "quick": Fake(1.0, 0.25)}
    order = sorted(sites | bugs)  # bugs and guards interleaved by name
    return {k: (sites | bugs)[k] for k in order}, set(bugs)


def until_every_bug(policy: str) -> tuple[int, dict[str, int]]:
    sites, bugs = _campaign()
    sched = make_scheduler(policy, 600, 20)
    for name in sites:
        sched.add_site(name)
    total, used, found = 0, Counter(), {}
    while not sched.done and not bugs <= set(found):
        for d in sched.allocate(1):
            if d.action.retires:
                continue
            losses, hit = sites[d.site_id].run(d.steps)
            used[d.site_id] += len(losses)
            total += len(losses)
            if hit:
                found[d.site_id] = total
            _report(sched, d, losses, used=used[d.site_id], triggered=hit)
    assert bugs <= set(found), found
    assert sum(used.values()) == total and all(v <= 600 for v in used.values())  # budget conserved
    return max(found[b] for b in bugs), found


def test_many_guarded_sites_loss_slope_finds_every_bug_in_far_fewer_steps():
    rr, rr_found = until_every_bug("round-robin")
    ls, ls_found = until_every_bug("loss-slope")
    assert rr / ls >= 2.5, (rr, ls, rr_found, ls_found)  # measured: 2147 / 732
    # the flat-then-sudden bug is not starved: found before round-robin would find it
    assert ls_found["sudden"] <= rr_found["sudden"], (ls_found, rr_found)


def test_a_hopeless_site_that_progressed_is_served_before_one_that_never_moved():
    """Fruitless refreshes make a site hopeless, but one whose loss fell a long way (a bug
    that wanders near the edge before it triggers) still outranks sites that never moved:
    with one slot, past the floor, it gets the steps."""
    sched = make_scheduler("loss-slope", 10_000, 20, window=8, max_refreshes=1, retire_after=5_000)
    for s in ("never", "wanders"):
        sched.add_site(s)
    used = Counter()

    def serve(d):
        used[d.site_id] += d.steps
        if d.site_id == "never":
            losses = [100.0] * d.steps
        else:  # fell from 1.0 to ~0.05 at once, then wanders above its best
            losses = [0.05 + 0.01 * ((used[d.site_id] + i) % 3) for i in range(d.steps)]
            losses[0] = 1.0 if used[d.site_id] == d.steps else losses[0]
        _report(sched, d, losses, used=used[d.site_id])

    for _ in range(200):  # both plateau, are refreshed once in vain, and turn hopeless
        if all(sched._sites[s].hopeless for s in ("never", "wanders")):
            break
        for d in sched.allocate(1):
            serve(d)
    assert sched._sites["never"].hopeless and sched._sites["wanders"].hopeless
    before = Counter(used)
    for _ in range(40):
        for d in sched.allocate(1):
            serve(d)
    gained = {s: used[s] - before[s] for s in used}
    assert gained["wanders"] > 4 * gained["never"] > 0, gained  # preferred, and the other not starved


def test_a_hopeless_site_stays_hopeless_until_its_best_loss_improves():
    """Fruitless refreshes make a site hopeless; one report whose losses happen to fall (noise
    above the best, no new best) must not make it a full-quantum site again, a real gain must."""
    sched = make_scheduler("loss-slope", 10_000, 20, window=8, max_refreshes=1, retire_after=5_000)
    sched.add_site("w")
    used = 0

    def serve(losses_for):
        nonlocal used
        [d] = sched.allocate(1)
        used += d.steps
        _report(sched, d, losses_for(d.steps), used=used)
        return d

    serve(lambda n: [0.7] * n)                               # probe
    while not sched._sites["w"].plateau:
        serve(lambda n: [0.7] * n)
    assert serve(lambda n: [0.7] * n).action is Action.REFRESH   # refreshed, in vain
    while not sched._sites["w"].hopeless:
        serve(lambda n: [0.7] * n)
    level = [0.95]

    def falling(n):     # falls 0.01 a step, a full window of it, and stays above its best (0.7)
        out = [level[0] - 0.01 * i for i in range(n)]
        level[0] -= 0.01 * n
        return out

    for _ in range(3):
        d = serve(falling)
        assert d.action is Action.GRANT and d.steps == sched.min_quantum   # a floor grant, no refresh
    assert not sched._sites["w"].plateau and sched._sites["w"].hopeless
    serve(lambda n: [0.3] * n)                               # a new best
    assert not sched._sites["w"].hopeless
