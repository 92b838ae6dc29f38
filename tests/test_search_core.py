"""The framework-neutral search, driven by a small NumPy runner (no torch, no TF).

The fake program is ``log(sigmoid(x @ w))``-like: its margin is a probability
that approaches 0 multiplicatively, the case the adaptive strategy's log-space
Polyak step is built for; and a zero divisor ``x @ w`` that must be hit exactly.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from fuzz_core.backends.base import CheckResult, Evaluation, OpRef
from fuzz_core.catalogue import log_floor
from fuzz_core.search import SearchConfig, SiteSearch, step_seed
from fuzz_core.sites import make_site
from fuzz_core.status import SiteStatus

TINY = float(np.nextafter(np.float32(0), np.float32(1)))
VALLEY_CURVATURE = np.logspace(0, 3, 8)
VALLEY_CENTRE = np.linspace(-0.5, 0.5, 8)


class FakeRunner:
    """A runner whose "program" is NumPy arithmetic with a known margin and gradient."""

    framework = "fake"
    trains = False

    def __init__(self, op: str, w: np.ndarray, hi: float = 30.0) -> None:
        self.name, self.op, self.w, self.hi = "fake", op, w.astype(np.float32), hi
        self.searched = ["x"]
        self.calls = 0

    def sample(self, rng):
        return {"x": rng.uniform(-1, 1, size=(4, self.w.size)).astype(np.float32)}

    def bounds(self, batch):
        return {"x": (-self.hi, self.hi)}

    def discover(self, batch, seed):
        op = "sqrt" if self.op == "valley" else self.op       # sqrt(q(x) - 1e-6)
        return [make_site("fake", op, op, "test", "fake.py:1", 0)]

    def _margins(self, x):
        if self.op == "valley":                  # a narrow valley: q(x) < 1e-6, curvatures 1 .. 1e3
            d = x.astype(np.float64) - VALLEY_CENTRE
            return (VALLEY_CURVATURE * d * d).sum(axis=1) - 1e-6, 2 * VALLEY_CURVATURE * d, False
        z = x.astype(np.float64) @ self.w.astype(np.float64)
        if self.op == "log":                     # p = sigmoid(-z) in float32: underflows to 0
            with np.errstate(over="ignore"):
                p = np.float32(1) / (np.float32(1) + np.exp(np.float32(z).astype(np.float32)))
            return p.astype(np.float64), -p * (1 - p), True
        return np.abs(z.astype(np.float32)).astype(np.float64), np.sign(z), False  # div by z

    def evaluate(self, values, site, *, grad=True, train=False, seed=0):
        self.calls += 1
        x = values["x"]
        m, dm_dz, _ = self._margins(x)
        i = int(np.argmin(m))
        triggered = bool(m[i] <= 0)
        gx = np.zeros_like(x, dtype=np.float64)
        gx[i] = dm_dz[i] if self.op == "valley" else dm_dz[i] * self.w
        ev = Evaluation(seen=True, hard=float(m[i]), log_loss=math.inf, triggered=triggered, event=triggered,
                        first_op=OpRef(self.op, self.op, "fake.py:1") if triggered else None,
                        per_sample=m.copy(), grads={"x": gx}, grad_norm=float(np.linalg.norm(gx)),
                        connected=True)
        if m[i] > 0:
            ev.log_loss = float(np.log(m[i]) - log_floor(TINY))
            ev.log_grads = {"x": gx / m[i]}
        return ev

    def check(self, values, seed):
        m, _, _ = self._margins(values["x"])
        hit = bool((m <= 0).any())
        return CheckResult(hit, None, {("log", "fake.py:1", 0): hit})

    def weights(self):
        return {}

    def reset(self):
        pass

    def get_state(self):
        return {}

    def set_state(self, state):
        pass

    def versions(self):
        return {}


def _search(op="log", strategy="adaptive", max_steps=200, seed=0):
    runner = FakeRunner(op, np.linspace(-1, 1, 8))
    site = runner.discover(None, 0)[0]
    return runner, SiteSearch(runner, site, SearchConfig(strategy=strategy, max_steps=max_steps, seed=seed))


def test_adaptive_reaches_underflow_in_a_few_steps():
    runner, s = _search("log")
    res = s.run(200)
    assert res.status is SiteStatus.FOUND
    assert res.steps <= 4, res.trace
    assert runner.calls == res.steps            # every forward pass is a step


def test_grist_needs_many_more_steps_than_adaptive():
    _, a = _search("log", "adaptive")
    _, g = _search("log", "grist", max_steps=2000)
    ra, rg = a.run(2000), g.run(2000)
    steps_g = rg.steps if rg.status is SiteStatus.FOUND else 2000
    assert ra.status is SiteStatus.FOUND
    assert steps_g >= 10 * ra.steps


def test_a_quantum_says_whether_its_losses_are_log_space():
    """The scheduler judges a log-space loss by differences of logs; the site's spec says."""
    assert _search("log")[1].run(1).log_space is True
    assert _search("valley")[1].run(1).log_space is False        # sqrt: a plain margin


def test_budget_is_never_exceeded_and_quanta_add_up():
    runner, s = _search("div", "random", max_steps=50)
    total = 0
    while s.status() is SiteStatus.SEARCHING:
        res = s.run(7)
        assert res.steps_quantum <= 7
        total += res.steps_quantum
    probe = res.reach["probe_steps"]            # the out-of-reach probe past the budget, counted apart
    assert 0 < probe <= 40
    assert s.step == total == 50 == runner.calls - probe
    assert s.status() is SiteStatus.EXHAUSTED


def test_values_stay_inside_bounds():
    _, s = _search("log", "grist", max_steps=300)
    s.run(300)
    lo, hi = s.bounds["x"]
    assert np.all(s.values["x"] >= lo) and np.all(s.values["x"] <= hi)
    assert np.all(np.isfinite(s.values["x"]))


def test_same_seed_same_steps_and_values():
    _, a = _search("log", seed=3)
    _, b = _search("log", seed=3)
    ra, rb = a.run(100), b.run(100)
    assert ra.steps == rb.steps
    np.testing.assert_array_equal(ra.candidate.values["x"], rb.candidate.values["x"])


def test_checkpoint_restore_continues_identically():
    _, a = _search("div", "grist", max_steps=120)
    a.run(40)
    arrays, meta = a.checkpoint()
    _, b = _search("div", "grist", max_steps=120)
    b.restore(arrays, meta)
    ra, rb = a.run(40), b.run(40)
    assert [p.suspect_loss for p in ra.trace] == [p.suspect_loss for p in rb.trace]
    assert a.step == b.step == 80


def _points(result) -> list[tuple]:
    """A quantum's trace as comparable tuples: step, suspect loss, event."""
    return [(p.step, p.suspect_loss, p.event) for p in result.trace]


@pytest.mark.parametrize("strategy", ["adaptive", "grist", "random"])
@pytest.mark.parametrize("op", ["valley", "div", "log"])
@pytest.mark.parametrize("quantum", [1, 3, 7])
def test_a_search_does_not_depend_on_how_it_is_sliced_into_quanta(strategy, op, quantum):
    """The scheduler picks quantum sizes; a site's search must not change with them. A quantum
    that ends inside an iteration's list of proposals goes on with that list next time (it
    neither skips the proposal it could not evaluate nor starts a pending escape walk first)."""
    _, whole = _search(op, strategy, max_steps=120)
    expected = _points(whole.run(120))
    _, sliced = _search(op, strategy, max_steps=120)
    got = []
    while sliced.status() is SiteStatus.SEARCHING:
        got += _points(sliced.run(quantum))
    assert got == expected
    # and resumed from its checkpoint by a new search each quantum, as on another actor
    _, search = _search(op, strategy, max_steps=120)
    got = []
    while True:
        result = search.run(quantum)
        got += _points(result)
        if result.status is not SiteStatus.SEARCHING:
            break
        checkpoint = search.checkpoint()
        _, search = _search(op, strategy, max_steps=120)
        search.restore(*checkpoint)
    assert got == expected


def test_adaptive_checkpoint_keeps_its_tactics_state_and_its_last_evaluation(tmp_path):
    """Through safetensors and JSON, as the controller writes them: a site checkpointed in the middle of an
    escape walk (a tactic holding the site, with steps left) goes on exactly as the original (its last
    evaluation is in the checkpoint, so it is not redone)."""
    from fuzz_core.io import atomic_save_arrays, atomic_write_json, load_arrays, read_json

    _, a = _search("valley", max_steps=300)
    a.run(70)
    arrays, meta = a.checkpoint()
    assert meta["strategy"]["escape.left"] > 0 and meta["strategy"]["core.acts"]["escape"] > 0
    atomic_save_arrays(tmp_path / "c.safetensors", arrays)
    atomic_write_json(tmp_path / "m.json", meta)
    _, b = _search("valley", max_steps=300)
    b.restore(load_arrays(tmp_path / "c.safetensors"), read_json(tmp_path / "m.json"))
    assert any(k.startswith("cache.current.grads/") for k in arrays) and "current" in meta["cache"]
    ra, rb = a.run(300), b.run(300)
    assert ra.status is rb.status and ra.steps == rb.steps
    assert len(_points(ra)) > 100 and _points(rb) == _points(ra)


def test_step_seed_depends_on_campaign_site_and_step():
    assert step_seed(0, "abc", 1) == step_seed(0, "abc", 1)
    assert len({step_seed(0, "abc", 1), step_seed(1, "abc", 1), step_seed(0, "abd", 1), step_seed(0, "abc", 2)}) == 4


@pytest.mark.parametrize("strategy", ["adaptive", "grist", "random"])
def test_every_strategy_counts_steps_in_the_trace(strategy):
    runner, s = _search("div", strategy, max_steps=30)
    res = s.run(30)
    assert [p.step for p in res.trace] == list(range(1, res.steps + 1))
    probe = res.reach["probe_steps"] if res.reach else 0     # run apart when the budget ends untriggered
    assert runner.calls == res.steps + probe


class _WideRunner(FakeRunner):
    """The fake program with a batch of 40 samples."""

    def sample(self, rng):
        return {"x": rng.uniform(-1, 1, size=(40, self.w.size)).astype(np.float32)}


@pytest.mark.parametrize("strategy, rows", [("grist", 2), ("adaptive", 10)])
def test_a_scheduler_refresh_replaces_the_strategys_own_share_of_the_batch(strategy, rows):
    """grist replaces 5% of its batch (GRIST's own refresh), adaptive a quarter: a refresh the
    scheduler asks for must not replace more of a grist batch than GRIST itself would."""
    runner = _WideRunner("div", np.linspace(-1, 1, 8))
    search = SiteSearch(runner, runner.discover(None, 0)[0], SearchConfig(strategy, 100, 0))
    search.run(3)
    changed = 0
    for _ in range(2):                    # adaptive walks out of a plateau first, then refreshes
        before = search.values["x"].copy()
        search.run(0, refresh=True)       # the refresh alone, no step
        changed = max(changed, int((search.values["x"] != before).any(axis=1).sum()))
    assert changed == rows
