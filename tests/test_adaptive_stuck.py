"""A ride step that neither trained nor moved the inputs is one the next step repeats (under the ride's
fixed randomness): the ride refreshes samples at once instead of waiting for its periodic refresh."""
import numpy as np

from fuzz_core.backends.base import Evaluation
from fuzz_core.search import SearchConfig, SiteSearch
from fuzz_core.strategies.adaptive import Adaptive
from fuzz_core.strategies.adaptive.steps import in_place
from tests.test_adaptive_tactics import Trains


def test_a_step_that_left_every_input_where_it_was_is_in_place():
    x = {"x": np.zeros((2, 3), np.float32)}
    assert in_place(x, dict(x))
    assert in_place(x, {"x": np.zeros((2, 3), np.float32)})              # equal values, a new array
    assert not in_place(x, {"x": np.full((2, 3), 0.15, np.float32)})     # the inputs moved


class Pinned(Trains):
    """A program whose training step never runs on the ride's batches (a non-finite value elsewhere skips
    it), with every input pushed to the box's corner: each ride step is the same step."""

    def evaluate(self, values, site, *, grad=True, train=False, seed=0, lookahead=False):
        ev = super().evaluate(values, site, grad=grad, train=False, seed=seed, lookahead=lookahead)
        ev.trained = False
        return ev


def _decreases_in_a_ride(runner, steps: int = 30) -> int:
    """Ride steps (sign steps toward the upper bound: inputs only grow) after which some input fell: a refresh."""
    s = SiteSearch(runner, runner.discover(None, 0)[0], SearchConfig(max_steps=400, seed=0, reach_steps=0),
                   strategy=Adaptive())
    while s.status().value == "searching" and not s.strategy_state.get("ride.active"):
        s.run(1)
    falls = 0
    for _ in range(steps):
        before = s.values["x"].copy()
        s.run(1)
        falls += bool((s.values["x"] < before).any())
    return falls


def test_a_ride_step_that_neither_trained_nor_moved_refreshes_samples_at_once():
    assert _decreases_in_a_ride(Pinned(need=1e6, rate=0.0)) > 0
    assert _decreases_in_a_ride(Trains(need=1e6, rate=0.0)) == 0      # it trained: the next step differs
