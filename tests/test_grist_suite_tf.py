"""The TensorFlow half of the GRIST suite: every registered factory builds, runs and marks GRIST's ops.

For each distinct (factory, args) of ``benchmarks.grist_suite.subjects_tf`` the graph is built once:
its sampled batch matches its feeds, stays inside its bounds and is reproducible from the
generator's seed; the program's loss is finite on it and its train op runs; and the engine's own
site discovery finds, for every bug of that target, a site of the bug's op on a line the module
marks ``# GRIST bug <id>`` (what the suite runner relies on to say "found at GRIST's op").
The U-Net (ID_17) is built on 188 x 188 images instead of its 572 x 572 (same graph, a 30 s pass
less); every other factory runs with its registered arguments.
"""
from __future__ import annotations

import inspect
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from benchmarks.grist_suite.model import MARK, ROOT, marked_lines  # noqa: E402
from benchmarks.grist_suite.subjects_tf import BUGS, SUBJECTS  # noqa: E402
from fuzz_core.io import atomic_save_arrays, load_arrays  # noqa: E402

pytestmark = pytest.mark.tf

PROGRAMS = ROOT / "benchmarks" / "grist_suite" / "tf_programs"
BY_TARGET: dict[tuple[str, tuple], list] = defaultdict(list)
for _bug in BUGS:
    BY_TARGET[(_bug.entry, tuple(sorted(_bug.args.items())))].append(_bug)
TARGETS = sorted(BY_TARGET)
SMALLER = {"id17_tf_unet": {"nx": 188}}     # the U-Net's smallest-but-one valid size: same ops, 9x fewer pixels


def _target_id(key) -> str:
    entry, args = key
    return Path(entry.split(":")[0]).stem + "".join(f"-{v}" for _, v in args)


def test_registry_lists_every_tensorflow_subject_once_with_papers_bug_ids():
    ids = [s.id for s in SUBJECTS]
    assert len(ids) == len(set(ids)) == 41
    assert all(1 <= i <= 63 and s.framework == "tensorflow" for i, s in zip(ids, SUBJECTS))
    assert sum(len(s.bugs) for s in SUBJECTS) == 57
    for subject in SUBJECTS:
        assert subject.runnable or subject.reason, subject.id
        bug_ids = [b.id for b in subject.bugs]
        if len(bug_ids) == 1:
            assert bug_ids == [f"ID_{subject.id}"]
        else:
            assert bug_ids == [f"ID_{subject.id}{chr(ord('a') + k)}" for k in range(len(bug_ids))]


def test_every_bug_has_a_marked_line_on_its_op_and_no_mark_is_stray():
    ops = {"log": "tf.math.log(", "exp": "tf.exp(", "sqrt": "tf.sqrt(", "div": ("/", "divide(")}
    for bug in BUGS:
        path = ROOT / bug.entry.split(":")[0]
        assert path.is_file(), bug.entry
        lines = marked_lines(bug.entry).get(bug.id)
        assert lines, f"{bug.id}: no '# GRIST bug {bug.id}' in {bug.entry}"
        text = path.read_text().splitlines()
        for n in lines:
            code = text[n - 1].split("#")[0]
            assert any(tok in code for tok in np.atleast_1d(ops[bug.op])), f"{bug.id}: line {n} has no {bug.op}"
    registered = {b.id for b in BUGS}
    for path in PROGRAMS.glob("id*.py"):
        for line in path.read_text().splitlines():
            m = MARK.search(line)
            if m:
                stray = set(re.split(r"[,\s]+", m.group(1).strip())) - registered
                assert not stray, f"{path.name} marks unregistered bugs {stray}"


def test_factories_name_their_arguments():
    from fuzz_core.loader import load_factory

    for entry, _ in TARGETS:
        params = inspect.signature(load_factory(entry, ROOT)).parameters
        assert "seed" in params and params["seed"].default == 0, entry
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), f"{entry} takes **kwargs"


@pytest.mark.parametrize("key", [pytest.param(k, marks=pytest.mark.slow) if _target_id(k) in SMALLER else k
                                 for k in TARGETS], ids=[_target_id(k) for k in TARGETS])
def test_factory_builds_runs_and_its_sites_sit_on_the_marked_lines(key, short_pretraining):
    from fuzz_core import GraphTarget
    from fuzz_core.backends import load_backend
    from fuzz_core.backends.base import RunnerOptions
    from fuzz_core.engine import discover_sites
    from fuzz_core.loader import call_factory, load_factory

    entry, args = key
    target = call_factory(load_factory(entry, ROOT), 0, {**short_pretraining(dict(args)), **SMALLER.get(_target_id(key), {})})
    assert isinstance(target, GraphTarget)
    batch = target.sample(np.random.default_rng(7))
    again = target.sample(np.random.default_rng(7))
    assert set(batch) == set(target.feeds), "sample() must return exactly the feeds"
    assert len({v.shape[0] for v in batch.values()}) == 1
    for name in batch:
        np.testing.assert_array_equal(batch[name], again[name])
    assert target.search and set(target.search) <= set(target.bounds)
    for name in target.search:
        lo, hi = target.bounds[name]
        assert np.issubdtype(batch[name].dtype, np.floating)
        assert lo <= batch[name].min() and batch[name].max() <= hi, name
    feed = {target.feeds[k]: v for k, v in batch.items()}
    assert np.isfinite(target.session.run(target.loss, feed))
    target.session.run(target.train_op, feed)
    assert np.isfinite(target.session.run(target.loss, feed))

    runner = load_backend("tensorflow").make_runner(_target_id(key), target, RunnerOptions())
    sites = discover_sites(runner, 0)
    where = {(s.op, s.location) for s in sites if s.searched}
    path = entry.split(":")[0]
    for bug in BY_TARGET[key]:
        marked = {f"{path}:{n}" for n in marked_lines(entry)[bug.id]}
        assert any((bug.op, loc) in where for loc in marked), f"{bug.id}: no {bug.op} site on {sorted(marked)}"


def test_grists_own_loop_drives_a_program_to_a_non_finite_loss_and_keeps_its_outcome():
    """``grist_loop.py`` (GRIST's loop beside the strategy): on ID_10 it ends at a non-finite loss
    within a few iterations; for an op not on the marked line it says the op is missing rather than
    searching something else; its kept outcome is keyed by the loop's and the program's sources."""
    from benchmarks.grist_suite import grist_loop as gl

    subject = next(s for s in SUBJECTS if s.id == 10)
    out = gl.grist_loop(subject, subject.bugs[0], 50)
    assert out["iterations"] is not None and 1 <= out["iterations"] <= 50

    wrong = type(subject.bugs[0])(subject.bugs[0].id, "sqrt", subject.bugs[0].entry)   # no sqrt on that line
    assert "not found" in gl.grist_loop(subject, wrong, 5)["error"]

    other = next(s for s in SUBJECTS if s.id == 21)
    assert gl._version(subject) != gl._version(other) and gl._version(subject) == gl._version(subject)

    # given a time instead (GRIST's own limit is one): ID_40 takes it tens of thousands of iterations
    bmi = next(s for s in SUBJECTS if s.id == 40)
    timed = gl.grist_loop(bmi, bmi.bugs[0], None, seconds=1.0)
    assert timed["iterations"] is None and timed["ran"] > 10 and timed["seconds"] >= 1.0, timed


def test_a_program_trained_before_the_search_is_trained_once_and_every_build_loads_it(tmp_path, monkeypatch):
    """GRIST's VAE sqrt entries train 27,500 steps before their search: ``pretrained.pretrain`` trains
    once, keeps the variables (the optimizer's slots too) under a key of the graph, the steps and the
    seed, and every later build (the search's, each fresh replay's) loads them; a file that cannot be
    read is trained anew and written whole."""
    from benchmarks.grist_suite import pretrained
    from benchmarks.grist_suite.tf_programs import id35_nikolenko_ch10_04_01 as vae

    def variables(target):
        graph = target.session.graph
        return sorted(graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES), key=lambda v: v.name)

    monkeypatch.setenv("GRIST_SUITE_PRETRAINED", str(tmp_path))
    args = {"variant": "sqrt", "n_z": 2, "pretrain_steps": 3}
    first = vae.make_target(**args)
    files = list(tmp_path.iterdir())
    assert files == [pretrained.path(first.session.graph, 3, 0)]
    assert pretrained.key(first.session.graph, 4, 0) != files[0].stem != pretrained.key(first.session.graph, 3, 1)
    names = [v.name for v in variables(first)]
    trained = first.session.run(variables(first))
    assert sorted(load_arrays(files[0])) == sorted(names) and len(names) > 12     # Adam's slots kept too
    untrained = vae.make_target(**{**args, "pretrain_steps": 0})
    assert not np.array_equal(untrained.session.run(variables(untrained))[0], trained[0])
    assert len(list(tmp_path.iterdir())) == 1          # no training, nothing kept

    altered = load_arrays(files[0])
    altered[names[0]] = altered[names[0]] + 1.0
    atomic_save_arrays(files[0], altered)
    second = vae.make_target(**args)
    np.testing.assert_array_equal(second.session.run(variables(second)[0]), altered[names[0]])   # loaded, not trained

    files[0].write_bytes(b"not an archive")
    third = vae.make_target(**args)
    for a, b in zip(trained, third.session.run(variables(third))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert sorted(load_arrays(files[0])) == sorted(names)
    assert [f.name for f in tmp_path.iterdir()] == [files[0].name]      # no temp file left


def test_the_suite_keeps_a_stepped_past_finding_in_a_folder_of_its_own(tmp_path):
    """GRIST's ID_2: the ``log(p)`` site's search reports ID_2b's ``log(1 - p)`` and goes on to ID_2a; the
    suite records both, each in its own folder (the later finding once took the first one's), and each
    folder replays in a fresh build as its record says."""
    import time

    from benchmarks.grist_suite import run as suite
    from benchmarks.grist_suite.subjects_tf import SUBJECTS as TF

    subject = next(s for s in TF if s.id == 2)
    (group,) = suite.groups(subject)
    bug = next(b for b in subject.bugs if b.id == "ID_2a")
    out = suite.search_group("tensorflow", 2, "adaptive", 1000, 0, group, time.time(), tmp_path,
                             only=suite.bug_lines(bug))
    passed, own = out["sites"]
    assert passed["status"] == "stepped past" and passed["own"] is False and own["own"] is True
    assert passed["first_op"]["location"].endswith(":36") and own["first_op"]["location"].endswith(":35")
    assert passed["finding"] != own["finding"]                    # one folder per finding, named by its bug's op
    assert passed["finding"].endswith(f"-s{passed['candidate_step']}") and own["finding"].endswith(f"-s{own['candidate_step']}")
    assert passed["fresh_replay"] and own["fresh_replay"] and own["steps"] > passed["steps"]
    assert suite.at_bug(own, bug) and not suite.at_bug(passed, bug)
