"""The whole training step under watch in TF1-style graph programs, and the graphs that crashed.

* A placeholder of unknown batch size (``[None, 8]``) with no gradient path to a site (only the
  weights reach it) is ``unreachable`` from the inputs, and searched through the weights with
  ``search_weights`` (it crashed with a TypeError before).
* A VAE whose ``sqrt(exp(logvar))`` goes to sqrt(0): finite forward, infinite gradient, NaN
  variables after one train step: found in the backward phase, named by the forward Sqrt op.
* Adam with epsilon 0 writes 0 / 0 into a variable whose gradient is 0: the update phase.
"""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from fuzz_core import GraphTarget  # noqa: E402
from fuzz_core.backends.base import RunnerOptions  # noqa: E402
from fuzz_core.backends.tf_graph import GraphRunner  # noqa: E402
from fuzz_core.engine import TargetSpec, discover_sites, finding_from, search_site  # noqa: E402
from fuzz_core.search import SearchConfig  # noqa: E402
from fuzz_core.status import SiteStatus  # noqa: E402

pytestmark = pytest.mark.tf
v1 = tf.compat.v1
HERE = "tests/test_step_watch_tf.py"


def _line(marker: str) -> int:
    with open(HERE) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}"))


def weights_only_site(seed: int = 0, train: bool = False) -> GraphTarget:
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 8], name="x")
        w = v1.get_variable("w", [8, 1], initializer=v1.constant_initializer(0.1))
        scale = v1.get_variable("scale", [], initializer=v1.constant_initializer(2.0))
        fit = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        loss = fit + tf.math.log(scale)            # WEIGHTS-ONLY-LOG: no path from x
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss) if train else None
        session = v1.Session(graph=graph)
        session.run(v1.global_variables_initializer())
    return GraphTarget(graph=graph, session=session, feeds={"x": x}, loss=loss, train_op=train_op,
                       sample=lambda rng: {"x": rng.uniform(-1, 1, (4, 8)).astype(np.float32)},
                       bounds={"x": (-1.0, 1.0)}, search=["x"])


def test_a_site_only_the_weights_reach_is_unreachable_from_a_placeholder_of_unknown_batch_size():
    runner = GraphRunner("w", weights_only_site())
    site = next(s for s in discover_sites(runner, 0) if s.op == "log")
    result = search_site(runner, site, SearchConfig("adaptive", 20, 0))
    assert result.status is SiteStatus.UNREACHABLE


def test_with_search_weights_the_same_site_is_searched_through_the_weights():
    runner = GraphRunner("w", weights_only_site(), RunnerOptions(search_weights=True))
    site = next(s for s in discover_sites(runner, 0) if s.op == "log")
    result = search_site(runner, site, SearchConfig("adaptive", 60, 0, search_weights=True))
    assert result.status is SiteStatus.FOUND and result.candidate.weights_searched


def vae(seed: int = 0) -> GraphTarget:
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 6], name="x")
        noise = v1.placeholder(tf.float32, [None, 2], name="noise")
        w_enc = v1.get_variable("w_enc", [6, 4], initializer=v1.glorot_uniform_initializer(seed=seed))
        w_dec = v1.get_variable("w_dec", [2, 6], initializer=v1.glorot_uniform_initializer(seed=seed + 1))
        h = tf.matmul(x, w_enc)
        mu, logvar = h[:, :2], h[:, 2:]
        std = tf.sqrt(tf.exp(logvar))                      # TF-VAE-SQRT
        recon = tf.matmul(mu + std * noise, w_dec)
        loss = tf.reduce_mean(tf.square(recon - x)) + tf.reduce_mean(tf.square(mu) + tf.square(std))
        train_op = v1.train.AdamOptimizer(1e-3).minimize(loss)
        session = v1.Session(graph=graph)
        session.run(v1.global_variables_initializer())
    return GraphTarget(graph=graph, session=session, feeds={"x": x, "noise": noise}, loss=loss, train_op=train_op,
                       sample=lambda rng: {"x": rng.uniform(0, 1, (8, 6)).astype(np.float32),
                                           "noise": rng.normal(size=(8, 2)).astype(np.float32)},
                       bounds={"x": (-100.0, 100.0)}, search=["x"])


def test_tf1_vae_sqrt_at_zero_is_found_in_the_backward_phase():
    runner = GraphRunner("vae", vae())
    config = SearchConfig("adaptive", 60, 0)
    found = []
    for site in discover_sites(runner, 0):
        result = search_site(runner, site, config)
        if result.candidate is not None and result.candidate.phase == "backward":
            found.append((site, result))
    assert found, "no search met the infinite gradient of sqrt(0)"
    site, result = found[0]
    first = result.candidate.first_op
    assert first.op == "sqrt" and first.location == f"{HERE}:{_line('TF-VAE-SQRT')}"
    finding = finding_from(runner, TargetSpec("vae", f"{HERE}:vae"), site, config, result.candidate, result.seconds)
    assert finding.phase == "backward" and finding.replays == (3, 3)


def adam_zero_eps(seed: int = 0) -> GraphTarget:
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        w = v1.get_variable("w", [4, 1], initializer=v1.constant_initializer(0.5))
        unused = v1.get_variable("unused", [1], initializer=v1.constant_initializer(1.0))
        loss = tf.reduce_mean(tf.math.log(tf.sigmoid(tf.matmul(x, w)) + 1.0)) + 0.0 * unused[0]
        train_op = v1.train.AdamOptimizer(1e-3, epsilon=0.0).minimize(loss)   # TF-ADAM
        session = v1.Session(graph=graph)
        session.run(v1.global_variables_initializer())
    return GraphTarget(graph=graph, session=session, feeds={"x": x}, loss=loss, train_op=train_op,
                       sample=lambda rng: {"x": rng.uniform(-1, 1, (4, 4)).astype(np.float32)},
                       bounds={"x": (-1.0, 1.0)}, search=["x"])


def test_tf1_adam_writing_nan_is_found_in_the_update_phase():
    runner = GraphRunner("adam", adam_zero_eps())
    site = next(s for s in discover_sites(runner, 0) if s.op == "log")
    config = SearchConfig("adaptive", 10, 0)
    result = search_site(runner, site, config)
    cand = result.candidate
    assert cand is not None and cand.phase == "update"
    assert cand.first_op.location == f"{HERE}:{_line('TF-ADAM')}"
    finding = finding_from(runner, TargetSpec("adam", f"{HERE}:adam_zero_eps"), site, config, cand, result.seconds)
    assert finding.replays == (3, 3) and finding.state is not None


def dropout_net(seed: int = 0) -> GraphTarget:
    """A classifier that trains with dropout: tf.nn.dropout divides by 1 - rate inside TensorFlow."""
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        keep = v1.placeholder_with_default(0.5, [], name="keep")
        w = v1.get_variable("w", [4, 3], initializer=v1.glorot_uniform_initializer(seed=seed))
        h = tf.nn.dropout(tf.nn.relu(tf.matmul(x, w)), rate=1 - keep)          # DROPOUT
        p = tf.nn.softmax(h)
        loss = -tf.reduce_mean(tf.math.log(p[:, 0]))                          # DROPOUT-LOG
        train_op = v1.train.GradientDescentOptimizer(0.01).minimize(loss)
        session = v1.Session(graph=graph)
        session.run(v1.global_variables_initializer())
    return GraphTarget(graph=graph, session=session, feeds={"x": x}, loss=loss, train_op=train_op,
                       sample=lambda rng: {"x": rng.uniform(0, 1, (8, 4)).astype(np.float32)},
                       bounds={"x": (0.0, 1.0)}, search=["x"])


def test_a_frameworks_own_division_that_nothing_can_move_is_retired_at_once_even_while_training():
    runner = GraphRunner("drop", dropout_net())
    sites = {s.op: s for s in discover_sites(runner, 0)}
    div = sites["div"]
    assert div.location == f"{HERE}:{_line('DROPOUT')}", "attributed to the user's call"
    result = search_site(runner, div, SearchConfig("adaptive", 200, 0))
    assert result.status is SiteStatus.UNREACHABLE and result.steps <= 2
    log = search_site(runner, sites["log"], SearchConfig("adaptive", 30, 0))
    assert log.status is not SiteStatus.UNREACHABLE, "the user's own log is searched"


def keras_vae(seed: int = 0):
    """A Keras encoder whose std = sqrt(exp(logvar)) underflows to sqrt(0) (TF2, eager)."""
    from fuzz_core import Target

    tf.keras.utils.set_random_seed(seed)
    enc = tf.keras.layers.Dense(4)
    dec = tf.keras.layers.Dense(6)
    model = tf.keras.Sequential([tf.keras.Input((6,)), enc])
    decoder = tf.keras.Sequential([tf.keras.Input((2,)), dec])
    opt = tf.keras.optimizers.Adam(1e-3)

    def program(batch):
        h = model(batch["x"])
        mu, logvar = h[:, :2], h[:, 2:]
        std = tf.sqrt(tf.exp(logvar))                                            # KERAS-SQRT
        recon = decoder(mu + std * batch["eps"])
        return tf.reduce_mean(tf.square(recon - batch["x"])) + tf.reduce_mean(tf.square(mu) + tf.square(std))

    class Both(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.a, self.b = model, decoder

    return Target(program=program, model=Both(), optimizer=opt,
                  sample=lambda rng: {"x": rng.uniform(0, 1, (8, 6)).astype(np.float32),
                                      "eps": rng.normal(size=(8, 2)).astype(np.float32)},
                  bounds={"x": (-100.0, 100.0)}, search=["x"])


def test_keras_sqrt_at_zero_is_found_in_the_backward_phase_and_named():
    from fuzz_core.backends.tensorflow import EagerRunner

    runner = EagerRunner("kvae", keras_vae())
    sites = {s.op: s for s in discover_sites(runner, 0)}
    assert "sqrt_grad" in sites, "the program trains: sqrt's backward hazard is a site"
    config = SearchConfig("adaptive", 60, 0)
    result = search_site(runner, sites["sqrt_grad"], config)
    cand = result.candidate
    assert cand is not None and cand.phase == "backward" and cand.own
    assert cand.first_op.op == "sqrt" and cand.first_op.location == f"{HERE}:{_line('KERAS-SQRT')}"
    finding = finding_from(runner, TargetSpec("kvae", f"{HERE}:keras_vae"), sites["sqrt_grad"], config, cand,
                           result.seconds)
    assert finding.replays == (3, 3)
