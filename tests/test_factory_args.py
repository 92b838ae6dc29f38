"""Factories name their arguments: a misspelt campaign argument is a one-line error (exit 2), not ignored."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config import ConfigError, load_campaign

ROOT = Path(__file__).resolve().parents[1]
TARGETS = sorted((ROOT / "campaigns" / "targets").glob("*.py"))


@pytest.mark.parametrize("path", TARGETS, ids=lambda p: p.stem)
def test_every_example_factory_names_its_arguments(path: Path):
    """Users copy the examples: none takes ``**_`` / ``**kwargs``, so none swallows a misspelt argument."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    factories = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_target"]
    assert len(factories) == 1
    args = factories[0].args
    assert args.kwarg is None, f"{path.name}: make_target takes **{args.kwarg.arg}"
    assert "seed" in [a.arg for a in args.args + args.kwonlyargs]


def _campaign(tmp_path: Path, args: str, entry: str = "campaigns/targets/log_one_minus_sigmoid.py:make_target") -> Path:
    path = tmp_path / "typo.yaml"
    path.write_text(f"name: typo\ntargets:\n  - {{name: scorer, entry: '{entry}'}}\n"
                    f"  - {{name: sig, entry: '{entry}', args: {args}}}\n")
    return path


def test_an_unknown_factory_argument_names_the_file_the_target_and_the_argument(tmp_path: Path):
    path = _campaign(tmp_path, "{hiden: 3}")
    with pytest.raises(ConfigError) as err:
        load_campaign(path)
    message = str(err.value)
    assert message == (f"{path}: targets[1].args.hiden: make_target() of target 'sig' takes no argument 'hiden' "
                       "(it takes seed, batch, pretrain_steps, lr)")
    result = CliRunner().invoke(app, ["run", str(path), "--local", "--quiet"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"cdeepfuzz: error: {message}"]       # one line, no traceback
    result = CliRunner().invoke(app, ["sites", str(path)])
    assert result.exit_code == 2 and "'hiden'" in result.output and "Traceback" not in result.output


def test_named_arguments_load_and_a_factory_taking_kwargs_takes_anything(tmp_path: Path):
    load_campaign(_campaign(tmp_path, "{batch: 4, pretrain_steps: 0, lr: 0.01}"))
    (tmp_path / "open.py").write_text("def make_target(seed=0, **kwargs):\n    pass\n")
    load_campaign(_campaign(tmp_path, "{hiden: 3}", entry=f"{tmp_path / 'open.py'}:make_target"))


def test_the_signature_the_check_reads_is_the_one_python_calls(tmp_path: Path):
    """The load-time check reads the factory with ast (nothing is imported); it agrees with inspect."""
    from fuzz_core.loader import load_factory

    for path in TARGETS:
        if path.stem.startswith("tf_"):
            continue                            # importing them needs TensorFlow; the ast test above covers them
        tree = ast.parse(path.read_text(encoding="utf-8"))
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_target")
        names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        factory = load_factory(f"{path.relative_to(ROOT).as_posix()}:make_target", ROOT)
        assert list(inspect.signature(factory).parameters) == names, path.name
