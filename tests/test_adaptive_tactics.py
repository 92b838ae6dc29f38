"""The adaptive strategy's tactics, each on a synthetic loss (NumPy runners: no framework program).

Every test judges a tactic by what it is for: found within a budget at every one of several seeds with
the tactic, and not without it, or the steps it takes (their labels, sizes, order) on a loss built to show
them. None pins a step count of one seed. ``tests/test_drift.py`` holds the real programs that the
training tactics answer.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from fuzz_core.backends.base import Evaluation, OpRef
from fuzz_core.catalogue import log_floor
from fuzz_core.search import SearchConfig, SiteSearch
from fuzz_core.sites import make_site
from fuzz_core.status import SiteStatus
from fuzz_core.strategies.adaptive import DEFAULT_TACTICS, Adaptive, AdaptiveOptions
from fuzz_core.strategies.adaptive.core import CoreState, load, save
from fuzz_core.strategies.adaptive.steps import between, box_reach, mutate, sign_step
from tests.test_search_core import FakeRunner

SEEDS = range(5)
TINY = float(np.nextafter(np.float32(0), np.float32(1)))


def without(*names: str) -> Adaptive:
    return Adaptive(tactics=[t for t in DEFAULT_TACTICS if t.name not in names])


def search(runner, strategy: Adaptive, budget: int, seed: int = 0) -> SiteSearch:
    site = runner.discover(None, 0)[0]
    return SiteSearch(runner, site, SearchConfig(max_steps=budget, seed=seed, reach_steps=0), strategy=strategy)


def found_within(make_runner, strategy_of, budget: int) -> list[int | None]:
    """Steps to the trigger at each seed (None: missed within ``budget``)."""
    out = []
    for seed in SEEDS:
        s = search(make_runner(), strategy_of(), budget, seed)
        r = s.run(budget)
        out.append(r.steps if r.status is SiteStatus.FOUND else None)
    return out


def fake(op: str) -> FakeRunner:
    return FakeRunner(op, np.linspace(-1, 1, 8))


def labels(result) -> list[str]:
    return [p.event for p in result.trace]


# -- the loop ----------------------------------------------------------------------------------------

def test_every_tactic_has_a_name_a_state_and_a_docstring_naming_its_failure():
    names = [t.name for t in DEFAULT_TACTICS]
    assert len(set(names)) == len(names)
    for t in DEFAULT_TACTICS:
        assert t.__doc__ and len(t.__doc__.split()) > 20, t.name
        t.State()                                   # every field has a default


def test_a_tactic_that_never_acted_leaves_the_search_as_it_was():
    """The ablation harness relies on it: removing a tactic that took no step and made no reaction on a
    site gives that site's search exactly as the full list does."""
    for op in ("log", "div", "valley"):
        full = search(fake(op), Adaptive(), 300, seed=2)
        r_full = full.run(300)
        acts = full.strategy_state["core.acts"]
        idle = [t.name for t in DEFAULT_TACTICS if not acts.get(t.name)]
        assert idle, op
        for name in idle:
            other = search(fake(op), without(name), 300, seed=2)
            r = other.run(300)
            assert [(p.step, p.suspect_loss, p.event) for p in r.trace] == \
                   [(p.step, p.suspect_loss, p.event) for p in r_full.trace], (op, name)


def test_the_state_checkpoints_as_plain_values_and_arrays():
    store: dict = {}
    core = CoreState(seed_step=3, recent=[1.0, 0.5], acts={"land": 2})
    save("core", core, store)
    assert store["core.recent"] == [1.0, 0.5] and store["core.acts"] == {"land": 2}
    assert load("core", CoreState, store) == core
    with pytest.raises(TypeError, match="core.label"):
        save("core", CoreState(label=object()), {})


def test_options_are_checked_and_a_tactic_list_has_no_repeats():
    with pytest.raises(ValueError, match="ride_patience"):
        AdaptiveOptions(ride_patience=0)
    with pytest.raises(ValueError, match="twice"):
        Adaptive(tactics=[DEFAULT_TACTICS[0], DEFAULT_TACTICS[0]])


def test_a_list_without_any_tactic_still_takes_a_step_per_iteration():
    s = search(fake("log"), Adaptive(tactics=[]), 20)
    r = s.run(20)
    assert r.steps == 20 and set(labels(r)) <= {"start", "idle"}


# -- Land ----------------------------------------------------------------------------------------------

def test_land_crosses_a_multiplicative_edge_in_log_space_in_a_step_or_two():
    """A sigmoid output that underflows: linear in log space, one Polyak step there crosses it."""
    assert all(n is not None and n <= 3 for n in found_within(lambda: fake("log"), Adaptive, 3))
    assert found_within(lambda: fake("log"), lambda: without("land"), 3) == [None] * len(SEEDS)


def proposals_after_one_step(op: str, tactic: str) -> list[tuple[str, dict]]:
    """What ``tactic`` proposes on the fake ``op`` after the search's first step."""
    s = search(fake(op), Adaptive(), 50)
    s.run(1)
    ctx = s.strategy._open(s)
    return list(next(t for t in ctx.tactics if t.name == tactic).proposals(ctx))


def test_land_aims_onto_a_point_edge_and_past_a_crossed_one():
    got = [label for label, _ in proposals_after_one_step("log", "land")]
    assert got[:3] == ["land:log", "land:linear", "land:cross"]      # log space first for a softmax-like op
    assert "land:back" in got and got[-1] == "land:sign"
    got = [label for label, _ in proposals_after_one_step("div", "land")]
    assert "land:cross" not in got and "land:back" not in got        # a zero divisor is hit, not crossed


# -- Exact ---------------------------------------------------------------------------------------------

def test_exact_hits_a_zero_divisor_that_gradient_steps_only_approach():
    steps = found_within(lambda: fake("div"), Adaptive, 5)
    assert all(n is not None for n in steps), steps
    assert found_within(lambda: fake("div"), lambda: without("exact"), 200) == [None] * len(SEEDS)


def test_exact_proposes_each_batch_once():
    batches = [x["x"].tobytes() for _, x in proposals_after_one_step("div", "exact")]
    assert len(batches) == len(set(batches)) and len(batches) >= 8


def test_mutations_are_deterministic_and_stay_in_the_box():
    x = np.linspace(0.1, 0.9, 32, dtype=np.float32).reshape(4, 8)
    for salt, kind in enumerate(("zero", "copy", "flat", "low", "high", "one", "minus_one", "jitter")):
        a, b = mutate(kind, x, [1], 0.0, 1.0, salt), mutate(kind, x, [1], 0.0, 1.0, salt)
        np.testing.assert_array_equal(a, b)
        assert a.min() >= 0.0 and a.max() <= 1.0
        np.testing.assert_array_equal(np.delete(a, 1, axis=0), np.delete(x, 1, axis=0))   # the weakest row only


# -- Escape and Refresh ---------------------------------------------------------------------------------

class Flat(FakeRunner):
    """A margin no step of the search changes (its gradient is 0 but connected): every round fails."""

    def evaluate(self, values, site, *, grad=True, train=False, seed=0, **kw):
        ev = super().evaluate(values, site, grad=grad, train=train, seed=seed)
        ev.hard = ev.hard + 10.0
        ev.per_sample = ev.per_sample + 10.0
        ev.triggered = ev.event = False
        ev.log_loss, ev.log_grads = math.inf, None
        return ev


def test_escape_walks_twelve_sign_steps_after_a_failed_round():
    """Gradient steps stall in a narrow valley: a failed round, then a walk of twelve steps, each 2.5% of the
    box along the gradient's sign, taken whatever the margin does."""
    s = search(fake("valley"), Adaptive(), 400)
    events, moves = [], []
    while s.status() is SiteStatus.SEARCHING and events.count("escape") < 12:
        before = s.values["x"].copy()
        r = s.run(1)
        events += labels(r)
        if labels(r) == ["escape"]:
            moves.append(np.abs(s.values["x"] - before))
    first = events.index("escape")
    assert events[first:first + 12] == ["escape"] * 12
    width = s.bounds["x"][1] - s.bounds["x"][0]
    for move in moves:
        assert np.allclose(move[move > 0], 0.025 * width, rtol=1e-4)


def test_sign_steps_are_a_fraction_of_the_box_and_clipped():
    x = {"x": np.array([[0.0, 0.5, 1.0]])}
    g = {"x": np.array([[1.0, -1.0, -1.0]])}
    out = sign_step(x, g, 0.1, {"x": (0.0, 1.0)})
    np.testing.assert_allclose(out["x"], [[0.0, 0.6, 1.0]])
    out = sign_step(x, g, 0.1, {"x": (0.0, 1.0)}, extra={"x": np.array([[0.0, -1.0, 0.0]])})
    np.testing.assert_allclose(out["x"], [[0.0, 0.7, 1.0]])


def test_the_schedulers_refresh_replaces_refresh_fraction_of_the_batch_and_measures_the_point_anew():
    """The strategy has no refresh of its own (its ablation: no result changed on the check set); the
    scheduler's refresh of a plateaued site replaces a quarter of the rows (every strategy's
    ``refresh_fraction``), the least important."""
    assert Adaptive().refresh_fraction == 0.25
    s = search(Flat("div", np.linspace(-1, 1, 8)), Adaptive(), 200)
    s.run(5)
    before = s.values["x"].copy()
    r = s.run(1, refresh=True)
    assert r.trace and r.trace[0].event == "refresh"          # the refreshed point's first measurement
    assert int((s.values["x"] != before).any(axis=1).sum()) == 1        # a quarter of the 4 rows
    assert "refresh" not in {t.name for t in DEFAULT_TACTICS}


# -- the training tactics: Ride, Steer, Freeze -------------------------------------------------

class Trains:
    """A program that trains: a weight ``w`` grows by ``rate`` times the batch's mean at every step, and
    the margin of row ``i`` is ``need - w * sum(x_i)`` over inputs in ``[0, 1]``: at ``w = 0`` no input in
    the box reaches the edge; only the training can take the margin there. ``fight``: the training
    instead takes back what the inputs gained (a hazard on the loss the training lowers)."""

    framework = "fake"
    trains = True

    def __init__(self, need: float = 3.0, rate: float = 0.02, fight: bool = False) -> None:
        self.name, self.searched, self.need, self.rate, self.fight = "trains", ["x"], need, rate, fight
        self.w = self.w0 = 0.2
        self.calls = 0

    def sample(self, rng):
        return {"x": rng.uniform(0, 0.3, size=(4, 2)).astype(np.float32)}

    def bounds(self, batch):
        return {"x": (0.0, 1.0)}

    def discover(self, batch, seed):
        return [make_site("trains", "sqrt", "sqrt", "test", "trains.py:1", 0)]

    def evaluate(self, values, site, *, grad=True, train=False, seed=0, lookahead=False):
        self.calls += 1
        x = values["x"].astype(np.float64)
        m = self.need - self.w * x.sum(axis=1)
        i = int(np.argmin(m))
        g = np.zeros_like(x)
        g[i] = -self.w
        triggered = bool(m[i] <= 0)
        ev = Evaluation(seen=True, hard=float(m[i]), log_loss=math.inf, triggered=triggered, event=triggered,
                        first_op=OpRef("sqrt", "sqrt", "trains.py:1") if triggered else None,
                        per_sample=m.copy(), grads={"x": g}, grad_norm=float(abs(self.w)), connected=True)
        if lookahead:
            ev.train_grads = {"x": -np.ones_like(x) * self.rate}
        if train and not triggered:
            self.w += (-self.rate * x.sum() if self.fight else self.rate * x.mean())
            ev.trained = True
        return ev

    def check(self, values, seed):
        raise NotImplementedError

    def weights(self):
        return {}

    def reset(self):
        self.w = self.w0

    def get_state(self):
        return {"w": np.array(self.w)}

    def set_state(self, state):
        self.w = float(state["w"])

    def versions(self):
        return {}


def test_a_site_whose_edge_is_out_of_the_boxs_reach_rides_the_programs_training():
    for seed in SEEDS:
        s = search(Trains(), Adaptive(), 600, seed)
        r = s.run(600)
        assert r.status is SiteStatus.FOUND, seed
        assert s.strategy_state["core.acts"].get("ride"), seed
    # a ride's steps are sign steps of 15% of the box against the margin's gradient, taken whatever it does
    s = search(Trains(), without("steer"), 600)
    while s.status() is SiteStatus.SEARCHING and not s.strategy_state.get("ride.active"):
        s.run(1)
    before = s.values["x"].copy()
    s.run(1)
    moved = np.abs(s.values["x"] - before)
    assert np.all(np.isclose(moved, 0.15) | np.isclose(moved, 0.0) | (s.values["x"] == 1.0))


def test_a_ride_that_gives_up_rides_again_from_the_factorys_state_then_stops():
    runner = Trains(need=1e6, rate=0.0)        # nothing moves the margin: every ride gives up
    s = search(runner, Adaptive(options=AdaptiveOptions(ride_patience=5)), 400)
    s.run(400)
    assert s.strategy_state["ride.rides"] == 2 and s.strategy_state["ride.done"] is True


def test_steer_adds_the_lookahead_during_a_ride_and_learns_which_rule_goes():
    s = search(Trains(), Adaptive(), 600)
    s.run(600)
    assert s.strategy_state["core.acts"].get("steer")
    s = search(Trains(need=1e6), Adaptive(options=AdaptiveOptions(ride_patience=80)), 200)
    s.run(200)
    gains = s.strategy_state["steer.gains"]
    assert sum(g is not None for g in gains) >= 2            # the rules were tried in turn


def test_freeze_answers_a_training_that_takes_back_the_searchs_progress():
    """Every training step takes back what the inputs gained (the edge is within the box's reach at the
    factory's weights, and out of it once the program has trained on the search's batches): measured at
    both, the point is nearer the edge at the factory's, and the site searches from there at every step,
    and finds it. Without it, the training wins."""
    def fights():
        return Trains(need=0.3, rate=0.05, fight=True)

    for seed in SEEDS:
        s = search(fights(), Adaptive(), 300, seed)
        r = s.run(300)
        assert r.status is SiteStatus.FOUND and s.frozen, seed
    assert found_within(fights, lambda: without("freeze"), 300) == [None] * len(SEEDS)


def test_freeze_puts_todays_state_back_where_the_factorys_is_no_nearer():
    """A training that helps (``w`` grows): the factory's weights leave the point farther from the edge,
    and the site goes on from today's state exactly, not frozen."""
    runner = Trains(need=30.0, rate=0.05)
    s = search(runner, Adaptive(), 300)
    s.run(20)
    ctx = s.strategy._open(s)
    freeze = next(t for t in ctx.tactics if t.name == "freeze")
    freeze.st.stage = 1                     # as its reaction to a failed round leaves it
    s.strategy._close(ctx)
    r = s.run(1)
    assert labels(r) == ["freeze"] and s.strategy_state["freeze.stage"] == 2
    saved = float(s.strategy_state["freeze.saved"]["w"])
    r = s.run(1)
    assert labels(r) == ["freeze"] and s.strategy_state["freeze.stage"] == 0
    assert not s.frozen and runner.w == saved


def test_box_reach_is_the_linear_models_best_fall_inside_the_box():
    x = {"x": np.array([0.25, 0.5])}
    g = {"x": np.array([2.0, -4.0])}
    assert box_reach(x, g, {"x": (0.0, 1.0)}) == pytest.approx(2.0 * 0.25 + 4.0 * 0.5)
    assert between(x, {"x": np.array([1.0, 1.0])}, 0.5)["x"].tolist() == [0.625, 0.75]


class Seeds(Trains):
    """:class:`Trains` that keeps the seed of the randomness each step ran under."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.seeds: list[int] = []

    def evaluate(self, values, site, *, grad=True, train=False, seed=0, lookahead=False):
        self.seeds.append(seed)
        return super().evaluate(values, site, grad=grad, train=train, seed=seed, lookahead=lookahead)


def test_a_ride_keeps_the_randomness_its_point_was_measured_under_and_a_new_ride_draws_anew():
    """A ride's steps measure one network (dropout masks, noise: the point's), not another at each step;
    the ride after a give-up starts under a new draw."""
    runner = Seeds(need=1e6, rate=0.0)
    s = search(runner, Adaptive(options=AdaptiveOptions(ride_patience=20)), 300)
    r = s.run(300)
    seeds = [seed for event, seed in zip(labels(r), runner.seeds) if event == "ride"]
    assert s.strategy_state["ride.rides"] == 2
    switches = sum(a != b for a, b in zip(seeds, seeds[1:]))
    assert len(set(seeds)) == 2 and switches == 1, "one randomness per ride, a new one for the second"
