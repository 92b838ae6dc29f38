"""The TensorFlow backend: TF2 (eager, tf.function, Keras) and TF1-style graph subjects.

Every TF subject of ``campaigns/targets/tf_*.py`` is built once per module. For each the
sites are discovered with the right op types at the user's ``file:line``; each buggy
subject's bug is found by the adaptive search within 200 steps and confirmed by replay;
the guarded twins give no finding; searches are deterministic; ops inside ``tf.cond``,
``tf.while_loop`` and an autograph ``if`` are sites.
"""
from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from fuzz_core import GraphTarget, Target  # noqa: E402
from fuzz_core.backends import detect_framework  # noqa: E402
from fuzz_core.backends.base import WEIGHT_PREFIX, RunnerOptions  # noqa: E402
from fuzz_core.engine import TargetSpec, build_runner, confirmed, discover_sites, finding_from, search_site  # noqa: E402
from fuzz_core.search import SearchConfig  # noqa: E402
from fuzz_core.status import SiteStatus  # noqa: E402

pytestmark = pytest.mark.tf

TARGETS = Path("campaigns/targets")
CONFIG = SearchConfig(strategy="adaptive", max_steps=200)

# subject -> searched sites (catalogue op, TF op type, text on the user's line[, occurrence]),
#            stable ops recorded (same), the buggy site (index into searched) or None
SUBJECTS = {
    "tf_softmax_xent_mlp": dict(
        searched=[("log", "Log", "tf.math.log(p)")],
        stable=[("softmax", "Softmax", 'p = model(b["x"])')], bug=0),
    "tf_softmax_xent_guarded": dict(
        searched=[], stable=[("cross_entropy", "SoftmaxCrossEntropyWithLogits", "softmax_cross_entropy_with_logits")],
        bug=None),
    "tf_naive_softmax": dict(
        searched=[("exp", "Exp", "e = tf.exp(z)"), ("div", "RealDiv", "return e / tf.reduce_sum")], stable=[],
        bug=0),
    "tf_vae_sqrt_exp": dict(
        searched=[("exp", "Exp", "var = tf.exp(logvar)"), ("sqrt", "Sqrt", "std = tf.sqrt(var)")], stable=[],
        bug=0),
    "tf_poisson_glm": dict(searched=[("exp", "Exp", "rate = tf.exp(eta)")], stable=[], bug=0, training=True),
    "tf_graph_bce": dict(
        searched=[("log", "Log", "tf.math.log(p) + (1.0 - y)", 0), ("log", "Log", "tf.math.log(p) + (1.0 - y)", 1)],
        stable=[], bug=1),
    "tf_graph_bce_guarded": dict(
        searched=[], stable=[("softplus", "Softplus", "log_sigmoid(z)", 0), ("softplus", "Softplus", "log_sigmoid(z)", 1)],
        bug=None),
    "tf_graph_scale_div": dict(
        searched=[("div", "RealDiv", "lambda: r / scale"), ("log", "Log", "tf.math.log(scale)")],
        stable=[("softplus", "Softplus", "scale = tf.nn.softplus")], bug=0),
    "tf_graph_scale_div_guarded": dict(
        searched=[("div", "RealDiv", "lambda: r / scale"), ("log", "Log", "tf.math.log(scale)")],
        stable=[("softplus", "Softplus", "scale = tf.nn.softplus")], bug=None),
    "tf_graph_vae": dict(
        searched=[("exp", "Exp", "var = tf.exp(logvar)"), ("sqrt", "Sqrt", "std = tf.sqrt(var)")], stable=[],
        bug=0),
}
BUGGY = [name for name, s in SUBJECTS.items() if s["bug"] is not None]
GUARDED = [name for name, s in SUBJECTS.items() if s["bug"] is None]
TF2 = {"tf_softmax_xent_mlp", "tf_softmax_xent_guarded", "tf_naive_softmax", "tf_vae_sqrt_exp", "tf_poisson_glm"}

_RUNNERS: dict[str, tuple] = {}


def line_of(path: Path, text: str) -> int:
    """The line of code (docstrings left out) that holds ``text``."""
    source = path.read_text()
    docs = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            docs.update(range(node.lineno, node.end_lineno + 1))
    hits = [i for i, line in enumerate(source.splitlines(), 1) if text in line and i not in docs]
    assert len(hits) == 1, f"{text!r} is on lines {hits} of {path}"
    return hits[0]


def mark(tag: str) -> int:
    """The line of this file that ends in the comment ``# <tag>``."""
    return line_of(Path(__file__).relative_to(Path.cwd()), "# " + tag)


def spec_of(name: str) -> TargetSpec:
    return TargetSpec(name, f"{TARGETS}/{name}.py:make_target", framework="tensorflow")


def built(name: str):
    """(runner, spec, sites): each subject is built once per module."""
    hit = _RUNNERS.get(name)
    if hit is None:
        spec = spec_of(name)
        runner = build_runner(spec, RunnerOptions(device="cpu"))
        hit = _RUNNERS[name] = (runner, spec, discover_sites(runner, spec.seed))
    return hit


def expected(name: str, rows) -> set:
    path = TARGETS / f"{name}.py"
    out = set()
    for row in rows:
        op, kind, text = row[:3]
        occurrence = row[3] if len(row) > 3 else 0
        out.add((op, kind, f"{path.as_posix()}:{line_of(path, text)}", occurrence))
    return out


def site_rows(sites, searched: bool) -> set:
    return {(s.op, s.kind.split(":")[0], s.location, s.occurrence) for s in sites if s.searched == searched}


def bug_site(name: str):
    _, _, sites = built(name)
    subject = SUBJECTS[name]
    op, kind, text = subject["searched"][subject["bug"]][:3]
    occurrence = subject["searched"][subject["bug"]][3] if len(subject["searched"][subject["bug"]]) > 3 else 0
    location = f"{(TARGETS / f'{name}.py').as_posix()}:{line_of(TARGETS / f'{name}.py', text)}"
    return next(s for s in sites if (s.op, s.location, s.occurrence) == (op, location, occurrence)
                and s.kind.split(":")[0] == kind)


# ---- sites ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SUBJECTS))
def test_sites_have_op_types_and_user_locations(name):
    runner, _, sites = built(name)
    assert runner.framework == "tensorflow"
    assert type(runner).__name__ == ("EagerRunner" if name in TF2 else "GraphRunner")
    assert site_rows(sites, True) == expected(name, SUBJECTS[name]["searched"])
    assert site_rows(sites, False) == expected(name, SUBJECTS[name]["stable"])
    for s in sites:
        assert not s.location.startswith("/") and s.location.startswith("campaigns/targets/tf_")
    ids = [s.id for s in sites]
    assert len(set(ids)) == len(ids)


def test_sites_are_stable_across_builds():
    """Ids depend on (target, op, path:line, occurrence) only: a second build agrees."""
    _, spec, sites = built("tf_graph_scale_div")
    runner = build_runner(spec, RunnerOptions())
    again = discover_sites(runner, 0)
    assert [s.id for s in again] == [s.id for s in sites]


def test_state_keys_do_not_depend_on_what_the_process_built_before():
    """Keras numbers layer names per process; a replay or a Ray actor must restore by the same keys."""
    first, spec, _ = built("tf_naive_softmax")
    second = build_runner(spec, RunnerOptions())            # its layers are named dense_9, ... now
    assert list(second.get_state()) == list(first.get_state())
    assert list(second.weights()) == list(first.weights())


# ---- bugs ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", BUGGY)
def test_random_batches_do_not_trigger_at_once(name):
    """Neither sampled batches nor batches drawn uniformly within the bounds trigger it."""
    runner, _, _ = built(name)
    rng = np.random.default_rng(7)
    runner.reset()
    for _ in range(3):
        batch = runner.sample(rng)
        assert not runner.check(batch, 0).event
        bounds = runner.bounds(batch)
        for key, (lo, hi) in bounds.items():
            batch[key] = rng.uniform(lo, hi, size=batch[key].shape).astype(batch[key].dtype)
        assert not runner.check(batch, 0).event


@pytest.mark.parametrize("name", BUGGY)
def test_adaptive_search_finds_the_bug_and_replay_confirms_it(name):
    runner, spec, _ = built(name)
    site = bug_site(name)
    result = search_site(runner, site, CONFIG)
    assert result.status == SiteStatus.FOUND, f"{site.label}: {result.status} after {result.steps} steps"
    assert result.steps <= 50
    cand = result.candidate
    if SUBJECTS[name].get("training"):
        assert cand.training
    finding = finding_from(runner, spec, site, CONFIG, cand, result.seconds)
    assert finding is not None, "the candidate did not replay"
    assert finding.first_op is not None
    assert finding.first_op["location"].startswith(f"campaigns/targets/{name}.py:")
    assert finding.minimised["batch_size"] >= 1
    if SUBJECTS[name].get("training"):
        assert finding.state is not None and finding.training       # reached only through training
    # the minimised finding replays on the factory's state plus the saved one
    runner.reset()
    if finding.state:
        runner.set_state(finding.state)
    assert finding.replays == (3, 3)
    assert confirmed(runner.check(finding.inputs, finding.step_seed), site, cand)


def test_training_bug_is_not_reachable_without_training():
    """tf_poisson_glm: with its training step switched off, the search exhausts."""
    runner, _, _ = built("tf_poisson_glm")
    site = bug_site("tf_poisson_glm")
    runner.trains = False
    try:
        result = search_site(runner, site, SearchConfig(strategy="adaptive", max_steps=60))
    finally:
        runner.trains = True
    assert result.candidate is None


@pytest.mark.parametrize("name", GUARDED)
def test_guarded_twins_stay_clean(name):
    runner, _, sites = built(name)
    for site in [s for s in sites if s.searched]:
        result = search_site(runner, site, CONFIG)
        assert result.candidate is None and result.status == SiteStatus.EXHAUSTED, site.label
    runner.reset()
    assert not runner.check(runner.sample(np.random.default_rng(3)), 0).event


# ---- determinism, state --------------------------------------------------------------

@pytest.mark.parametrize("name", ["tf_poisson_glm", "tf_graph_scale_div"])
def test_same_seed_same_steps(name):
    runner, _, _ = built(name)
    site = bug_site(name)
    a = search_site(runner, site, CONFIG)
    b = search_site(runner, site, CONFIG)
    assert a.steps == b.steps
    assert [p.suspect_loss for p in a.trace] == [p.suspect_loss for p in b.trace]
    for key in a.candidate.values:
        np.testing.assert_array_equal(a.candidate.values[key], b.candidate.values[key])


def _dropout_target():
    keras = tf.keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.Dropout(0.5),
                              keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(1e-2)

    def program(b):
        noise = tf.random.normal(tf.shape(b["x"]), stddev=0.01)
        return tf.reduce_mean(tf.math.log(tf.exp(model(b["x"] + noise, training=True)) + 1.0))

    return Target(program=program, sample=lambda r: {"x": r.normal(size=(4, 6)).astype(np.float32)},
                  model=model, optimizer=opt, search=["x"])


def test_randomness_is_seeded_per_step_and_state_round_trips():
    """Dropout (a Keras SeedGenerator) and tf.random: same seed, same pass; reset restores every variable."""
    target = _dropout_target()
    assert detect_framework(target) == "tensorflow"
    runner = build_runner_from(target)
    state0 = runner.get_state()
    assert any(k.endswith("seed_generator_state") for k in state0)
    assert any(k.startswith("optim.") and "momentum" in k for k in state0)   # slots exist from the start
    batch = runner.sample(np.random.default_rng(0))
    site = [s for s in runner.discover(batch, 0) if s.op == "log"][0]
    a = runner.evaluate(batch, site, grad=True, train=False, seed=11)
    b = runner.evaluate(batch, site, grad=True, train=False, seed=11)
    c = runner.evaluate(batch, site, grad=True, train=False, seed=12)
    assert a.program_loss == b.program_loss and a.hard == b.hard
    assert a.program_loss != c.program_loss
    np.testing.assert_array_equal(a.grads["x"], b.grads["x"])
    for seed in range(3):
        assert runner.evaluate(batch, site, grad=True, train=True, seed=seed).trained
    trained = runner.get_state()
    assert any(not np.array_equal(trained[k], state0[k]) for k in state0 if k.startswith("optim."))
    runner.reset()
    for k, v in runner.get_state().items():
        np.testing.assert_array_equal(v, state0[k])
    runner.set_state(trained)
    for k, v in runner.get_state().items():
        np.testing.assert_array_equal(v, trained[k])
    # the training pass reuses the forward pass: one step each
    assert runner.evaluate(batch, site, grad=True, train=True, seed=0).passes == 1


def build_runner_from(target, options: RunnerOptions = RunnerOptions()):
    from fuzz_core.backends.tensorflow import make_runner

    return make_runner("inline", target, options)


def test_searched_weights_round_trip():
    runner = build_runner_from(_dropout_target(), RunnerOptions(search_weights=True))
    weights = runner.weights()
    assert weights and all(k.startswith(WEIGHT_PREFIX) for k in weights)
    batch = dict(runner.sample(np.random.default_rng(0)))
    site = [s for s in runner.discover(batch, 0) if s.op == "log"][0]
    batch.update({k: v * 0.5 for k, v in weights.items()})
    ev = runner.evaluate(batch, site, grad=True, train=False, seed=0)
    assert set(ev.grads) == {"x", *weights}
    for k, v in runner.weights().items():
        np.testing.assert_allclose(v, weights[k] * 0.5)


# ---- control flow --------------------------------------------------------------------

def _tf2_control_flow_target():
    w = tf.Variable(np.full((3, 1), 0.5, np.float32), name="w")

    @tf.function
    def program(b):
        z = tf.matmul(b["x"], w)
        y = tf.cond(tf.reduce_sum(z) > 0, lambda: tf.math.log(z), lambda: -z)      # COND-LOG
        if tf.reduce_max(z) > -100.0:                                                # autograph if
            y = y + tf.sqrt(z + 1.0)                                                 # AUTOGRAPH-SQRT
        i = tf.constant(0)
        acc = tf.zeros_like(z)
        while i < 2:                                                                 # autograph while
            acc = acc + tf.math.log1p(z)                                             # WHILE-LOG1P
            i += 1
        return tf.reduce_mean(y + acc)

    return Target(program=program, sample=lambda r: {"x": r.uniform(0.5, 1.0, (4, 3)).astype(np.float32)},
                  model=[w], bounds={"x": (-2.0, 2.0)}, search=["x"])


def test_tf2_ops_in_cond_autograph_if_and_while_are_sites():
    runner = build_runner_from(_tf2_control_flow_target())
    batch = runner.sample(np.random.default_rng(0))
    sites = runner.discover(batch, 0)
    here = Path(__file__).relative_to(Path.cwd()).as_posix()
    rows = {(s.op, s.location, s.occurrence) for s in sites}
    assert ("log", f"{here}:{mark('COND-LOG')}", 0) in rows
    assert ("sqrt", f"{here}:{mark('AUTOGRAPH-SQRT')}", 0) in rows
    loop = f"{here}:{mark('WHILE-LOG1P')}"
    assert {("log1p", loop, 0), ("log1p", loop, 1)} <= rows          # one per iteration
    site = next(s for s in sites if s.op == "log")
    result = search_site(runner, site, CONFIG)
    assert result.status == SiteStatus.FOUND       # the log, or another op that went non-finite first
    assert confirmed(runner.check(result.candidate.values, result.candidate.seed), site, result.candidate)


def _tf1_control_flow_target(train: bool):
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = v1.get_variable("w", [3, 3], initializer=v1.constant_initializer(0.5))
        z = tf.matmul(x, w)
        y = tf.cond(tf.reduce_sum(z) > 0, lambda: tf.math.log(z + 1.0), lambda: tf.exp(z))   # TF1-COND

        def body(i, a):
            return i + 1, tf.sqrt(a + 1.0)                                                   # TF1-WHILE

        _, a = tf.while_loop(lambda i, a: i < 3, body, [tf.constant(0), y])
        loss = tf.reduce_mean(a)
        train_op = v1.train.GradientDescentOptimizer(0.01).minimize(loss) if train else None
        session = v1.Session(graph=graph)
        session.run(v1.global_variables_initializer())
    return GraphTarget(graph=graph, session=session, feeds={"x": x}, loss=loss, train_op=train_op,
                       sample=lambda r: {"x": r.uniform(0, 1, (4, 3)).astype(np.float32)},
                       bounds={"x": (-5.0, 5.0)}, search=["x"])


@pytest.mark.parametrize("train", [False, True])
def test_tf1_ops_in_cond_and_while_branch_graphs_are_sites(train):
    runner = build_runner_from(_tf1_control_flow_target(train))
    batch = runner.sample(np.random.default_rng(0))
    sites = runner.discover(batch, 0)
    here = Path(__file__).relative_to(Path.cwd()).as_posix()
    cond_line = f"{here}:{mark('TF1-COND')}"
    rows = {(s.op, s.kind, s.location) for s in sites}
    assert ("log", "Log:cond/Log", cond_line) in rows
    assert ("exp", "Exp:cond/Exp", cond_line) in rows
    assert ("sqrt", "Sqrt:while/Sqrt", f"{here}:{mark('TF1-WHILE')}") in rows
    log_site = next(s for s in sites if s.kind == "Log:cond/Log")
    exp_site = next(s for s in sites if s.kind == "Exp:cond/Exp")
    ev = runner.evaluate(batch, log_site, grad=True, train=train, seed=0)
    assert ev.seen and ev.connected and math.isfinite(ev.hard)
    assert not runner.evaluate(batch, exp_site, grad=True, train=False, seed=0).seen   # the branch not taken
    sqrt_site = next(s for s in sites if s.op == "sqrt")
    assert runner.evaluate(batch, sqrt_site, grad=True, train=False, seed=0).connected   # through the cond
    result = search_site(runner, log_site, SearchConfig(strategy="adaptive", max_steps=100))
    assert result.status == SiteStatus.FOUND       # the log, or the sqrt below it first (a NaN either way)
    assert confirmed(runner.check(result.candidate.values, result.candidate.seed), log_site, result.candidate)
    # z = 0.5 * row sum: one row below -1 makes log(z + 1) NaN while the sum keeps the then-branch
    bad = {"x": np.array([[-2.0, -2.0, -2.0], [5.0, 5.0, 5.0]], np.float32)}
    runner.reset()
    check = runner.check(bad, 0)
    assert check.triggered[log_site.key]
    assert check.first_op.kind == "Log:cond/Log" and check.first_op.location == cond_line


# ---- the numbers margins use -----------------------------------------------------------

def test_dtype_limits_and_flushed_subnormals():
    from fuzz_core.backends.tf_recorder import XP, dtype_limit, tiny_of

    assert dtype_limit("exp_max", tf.float32) == pytest.approx(88.7228, abs=1e-3)
    assert dtype_limit("exp_max", tf.float16) == pytest.approx(11.09, abs=0.01)
    assert math.isfinite(float(tf.exp(tf.constant(dtype_limit("exp_max", tf.float32)))))
    assert tiny_of(tf.float32) == pytest.approx(np.finfo(np.float32).tiny)     # TF's CPU kernels flush subnormals
    x = tf.constant([0.0, 1.0])
    assert float(XP.next_down(0.0, x)) < 0 and float(tf.reduce_min(x - XP.next_down(0.0, x))) > 0


def test_graph_randomness_is_drawn_from_the_step_seed_and_replays_in_a_fresh_build():
    """A TF1 graph's dropout mask and input noise are stateful ops whose state a session advances
    at every run: the runner draws their values from the step's seed and feeds them, so the same
    seed gives the same pass in the same build, in a fresh build, and after other passes; another
    seed gives another draw, and the training step draws its own."""
    spec = TargetSpec("dropout-noise", "campaigns/targets/tf_graph_dropout_noise.py:make_target", {}, seed=0)
    first = build_runner(spec)
    batch = first.sample(np.random.default_rng(0))

    def loss(runner, seed):
        runner.reset()                                  # a check trains: each from the factory's state
        return runner.check(batch, seed).program_loss

    at_11 = loss(first, 11)
    assert loss(first, 12) != at_11
    assert loss(first, 11) == at_11
    assert loss(build_runner(spec), 11) == at_11
    kinds = {op.type for op in first._random_ops()}
    assert kinds == {"RandomStandardNormal", "RandomUniform"}, kinds
