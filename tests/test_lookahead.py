"""The lookahead gradient (``Evaluation.train_grads``): how the searched inputs steer the program's
own training step toward the edge.

One gradient step of the program's loss ``L`` at learning rate ``lr`` on a batch ``x`` moves the
weights to ``theta - lr dL/dtheta(x)``; the margin ``m`` the search follows, measured at a fixed
point ``x0``, then changes by ``-lr <dL/dtheta(x), dm/dtheta(x0)>`` to first order. So the
derivative in ``x`` (at ``x0``) of "the margin at ``x0`` after one plain SGD step on ``x``" is
``lr * train_grads``. Every backend (PyTorch, TF1 graphs, TF2 eager) is held to that by central
finite differences on a small softmax regression in float64 (a log of a softmax: a log-space
site, so ``m`` is ``log`` of the hard minimum), trained by plain gradient descent.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from fuzz_core import Target
from fuzz_core.backends.base import RunnerOptions
from fuzz_core.engine import TargetSpec, build_runner, discover_sites

LR = 1e-3
FEATURES, CLASSES, ROWS = 5, 4, 6


def _data(seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.uniform(-1, 1, (ROWS, FEATURES)), "y": rng.integers(0, CLASSES, ROWS)}


def torch_target(seed: int = 0, optimizer: bool = True) -> Target:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(FEATURES, CLASSES).double()
    with torch.no_grad():
        model.weight.mul_(3.0)
    opt = torch.optim.SGD(model.parameters(), lr=LR) if optimizer else None

    def program(batch):
        p = torch.softmax(model(batch["x"]), dim=1)
        onehot = torch.nn.functional.one_hot(batch["y"], CLASSES).double()
        return -(onehot * torch.log(p)).sum(1).mean()

    return Target(program=program, sample=lambda rng: _data(), model=model, optimizer=opt,
                  bounds={"x": (-5.0, 5.0)}, search=["x"])


def graph_target(seed: int = 0):
    import tensorflow as tf

    from fuzz_core import GraphTarget

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float64, [None, FEATURES], name="x")
        y = v1.placeholder(tf.int64, [None], name="y")
        init = np.random.default_rng(seed).normal(0, 1.0, (FEATURES, CLASSES))
        w = tf.Variable(init, dtype=tf.float64)
        b = tf.Variable(np.zeros(CLASSES), dtype=tf.float64)
        p = tf.nn.softmax(tf.matmul(x, w) + b)
        loss = -tf.reduce_mean(tf.reduce_sum(tf.one_hot(y, CLASSES, dtype=tf.float64) * tf.math.log(p), axis=1))
        train = v1.train.GradientDescentOptimizer(LR).minimize(loss)
        session = v1.Session(graph=graph)
        session.run(v1.global_variables_initializer())
    return GraphTarget(graph=graph, session=session, feeds={"x": x, "y": y}, loss=loss, train_op=train,
                       sample=lambda rng: _data(), bounds={"x": (-5.0, 5.0)}, search=["x"])


def eager_target(seed: int = 0) -> Target:
    import tensorflow as tf

    init = np.random.default_rng(seed).normal(0, 1.0, (FEATURES, CLASSES))
    w = tf.Variable(init, dtype=tf.float64)
    b = tf.Variable(np.zeros(CLASSES), dtype=tf.float64)

    def program(batch):
        p = tf.nn.softmax(tf.matmul(batch["x"], w) + b)
        onehot = tf.one_hot(batch["y"], CLASSES, dtype=tf.float64)
        return -tf.reduce_mean(tf.reduce_sum(onehot * tf.math.log(p), axis=1))

    return Target(program=program, sample=lambda rng: _data(), model=[w, b],
                  optimizer=tf.keras.optimizers.SGD(learning_rate=LR), bounds={"x": (-5.0, 5.0)}, search=["x"])


def _runner(factory, framework: str):
    import sys

    module = sys.modules[__name__]
    spec = TargetSpec("lookahead", f"{module.__name__}:{factory}", framework=framework)
    return build_runner(spec, RunnerOptions())


def _log_site(runner):
    sites = [s for s in discover_sites(runner, 0) if s.op == "log" and s.searched]
    assert sites, "the softmax regression has a searched log site"
    return sites[0]


def _margin_after_step(runner, site, x: np.ndarray, x0: dict) -> float:
    """log of the hard-minimum margin at ``x0`` after one training step on ``x``, from the start state."""
    runner.reset()
    runner.evaluate(dict(x0, x=x), site, grad=False, train=True, seed=0)
    ev = runner.evaluate(x0, site, grad=False, train=False, seed=0)
    return math.log(ev.hard)


def _check_first_order(runner) -> None:
    site = _log_site(runner)
    x0 = _data()
    runner.reset()
    ev = runner.evaluate(x0, site, grad=True, train=True, seed=0, lookahead=True)
    assert ev.trained and ev.train_grads is not None and set(ev.train_grads) == {"x"}
    predicted = LR * ev.train_grads["x"]
    assert np.abs(predicted).max() > 0
    rng = np.random.default_rng(11)
    eps = 1e-4
    for _ in range(4):
        d = rng.standard_normal(x0["x"].shape)
        up = _margin_after_step(runner, site, x0["x"] + eps * d, x0)
        down = _margin_after_step(runner, site, x0["x"] - eps * d, x0)
        measured = (up - down) / (2 * eps)
        expected = float((predicted * d).sum())
        assert measured == pytest.approx(expected, rel=2e-2, abs=1e-9), (measured, expected)


def test_torch_lookahead_is_the_margins_derivative_through_one_training_step():
    _check_first_order(_runner("torch_target", "torch"))


@pytest.mark.tf
def test_graph_lookahead_is_the_margins_derivative_through_one_training_step():
    pytest.importorskip("tensorflow")
    _check_first_order(_runner("graph_target", "tensorflow"))


@pytest.mark.tf
def test_eager_lookahead_is_the_margins_derivative_through_one_training_step():
    pytest.importorskip("tensorflow")
    _check_first_order(_runner("eager_target", "tensorflow"))


def test_no_lookahead_without_a_training_step_or_when_not_asked():
    runner = _runner("torch_target", "torch")
    site = _log_site(runner)
    ev = runner.evaluate(_data(), site, grad=True, train=True, seed=0)
    assert ev.train_grads is None                      # not asked
    ev = runner.evaluate(_data(), site, grad=True, train=False, seed=0, lookahead=True)
    assert ev.train_grads is None                      # no training step in this pass


def untrained_target(seed: int = 0) -> Target:
    return torch_target(seed, optimizer=False)


def test_no_lookahead_for_a_program_that_does_not_train():
    runner = _runner("untrained_target", "torch")
    site = _log_site(runner)
    ev = runner.evaluate(_data(), site, grad=True, train=True, seed=0, lookahead=True)
    assert ev.grads is not None and ev.train_grads is None
