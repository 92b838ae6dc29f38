"""A finding as a pytest file: ``test_reproducer.py`` in the finding folder.

The file rebuilds the target from the factory, the arguments and the seed the finding saved
(as ``cdeepfuzz replay`` does), loads ``values.safetensors`` beside it and asserts that the
program stays finite on those values: the check-only detector sees no NaN or infinity in the
forward pass, the backward pass or the training step. While the bug is there it fails, naming
the first op that went non-finite, its phase and its ``file:line``; once the program is fixed
it passes, so a developer can drop the folder into their suite as a regression test.

Entries are relative to the folder the campaign ran in (the project root). The file records
that root relative to its own folder, and finds it again, in this order, from: the environment
variable ``CDEEPFUZZ_ROOT``, that relative path, then the folders above the test file and
above the current directory (the first that holds the entry's file). So it runs from any
directory, and keeps running when the finding folder is copied into the project's tests.
"""
from __future__ import annotations

import ast
import json
import os
import pprint
from pathlib import Path
from typing import Any

from fuzz_core.io import atomic_write_bytes, load_arrays
from fuzz_core.sites import position_of

__all__ = ["ROOT_ENV", "TEST_FILE", "check_finite", "describe", "find_root", "render", "write_reproducer"]

TEST_FILE = "test_reproducer.py"
ROOT_ENV = "CDEEPFUZZ_ROOT"


# -- writing ----------------------------------------------------------------------------------------
def write_reproducer(folder: Path, report: dict[str, Any], root: Path | None = None) -> Path:
    """Write ``test_reproducer.py`` into a finding folder; ``root``: where the entry is resolved
    (the campaign's current directory)."""
    folder = Path(folder)
    root = Path(root) if root is not None else Path.cwd()
    try:
        hint = Path(os.path.relpath(root.resolve(), folder.resolve())).as_posix()
    except ValueError:       # another drive (Windows): only the search upwards and the variable remain
        hint = None
    path = folder / TEST_FILE
    atomic_write_bytes(path, render(report, hint).encode())
    return path


def _literal(value: Any) -> str:
    """``value`` as Python source when it reads back equal, else as a ``json.loads`` call."""
    text = pprint.pformat(value, width=88, sort_dicts=False)
    try:
        if ast.literal_eval(text) == value:
            return text
    except (ValueError, SyntaxError):
        pass
    return f"json.loads({json.dumps(value)!r})"


def _bug_line(report: dict[str, Any]) -> str:
    first = report.get("first_op") or {}
    site = report.get("site") or {}
    op = first.get("op") or site.get("op", "?")
    where = position_of(first) if first.get("location") else (position_of(site) if site.get("location") else "?")
    phase = report.get("phase") or "forward"
    return f"{op} at {where} went non-finite in the {phase} pass"


def render(report: dict[str, Any], root_from_folder: str | None) -> str:
    """The source of ``test_reproducer.py`` for a finding report (``finding.json``'s content)."""
    target = {k: report["target"].get(k) for k in ("name", "entry", "args", "framework", "seed")}
    site = report.get("site") or {}
    expected = {"site": site.get("label"), "hazard": report.get("hazard"), "phase": report.get("phase", "forward"),
                "first_op": report.get("first_op"), "signature": report.get("signature")}
    precision = report.get("precision") or {}
    mixed = {k: precision.get(k) for k in ("autocast", "grad_scaler", "policy")} if (
        precision.get("autocast") or precision.get("policy")) else None
    precision_line = f"PRECISION = {_literal(mixed)}   # the mixed precision it was found in\n" if mixed else ""
    precision_arg = ", precision=PRECISION" if mixed else ""
    flaky = ""
    if report.get("flaky"):
        rep = report.get("replays") or {}
        flaky = (f"\nThe finding is flaky: {rep.get('reproduced', '?')} of {rep.get('of', '?')} fresh replays reproduced "
                 "it\n(randomness the engine cannot re-seed), so this test may pass while the bug is there.\n")
    return f'''"""Regression test written by CDeepFuzz for one finding: {_bug_line(report)}.

Site {site.get("label")} ({report.get("hazard")}) of target {target["name"]!r}.
The test rebuilds the target from its factory and seed, loads the values CDeepFuzz saved beside
this file (values.safetensors) and asserts that the program stays finite on them (forward,
backward and training step). It fails while the bug is there, naming the op, its phase and its
file:line, and passes once the program is fixed: keep it in your test suite.
{flaky}
Run it with ``pytest {TEST_FILE}`` from any directory. The project the campaign ran in (where the
entry below is found) is looked up from ${ROOT_ENV}, from ROOT_FROM_HERE, then in the folders above
this file and above the current directory; set ${ROOT_ENV} when it is elsewhere.
"""
import json  # noqa: F401 - for values that are not plain literals
from pathlib import Path

from fuzz_core.reproducer import check_finite, describe, find_root

HERE = Path(__file__).resolve().parent
VALUES = HERE / "values.safetensors"
TARGET = {_literal(target)}
STEP_SEED = {int(report.get("step_seed", 0))}
DEVICE = {str(report.get("device") or "cpu")!r}
ROOT_FROM_HERE = {root_from_folder!r}   # the folder the campaign ran in, relative to this file's folder
EXPECTED = {_literal(expected)}
{precision_line}

def test_program_stays_finite_on_the_saved_values(monkeypatch):
    root = find_root(TARGET["entry"], HERE, ROOT_FROM_HERE)
    monkeypatch.chdir(root)    # as the campaign ran: entries and the factory's own paths are relative to it
    result = check_finite(TARGET, VALUES, STEP_SEED, root=root, device=DEVICE{precision_arg})
    assert not result.event, describe(result, EXPECTED)
'''


# -- what the generated file calls --------------------------------------------------------------------
def _entry_path(entry: str) -> Path:
    """What an entry names below a root: its file (``path/to/file.py:factory``), or its module's
    path (``pkg.module:factory`` -> ``pkg/module``)."""
    from fuzz_core.loader import split_entry

    module, _ = split_entry(entry)
    if module.endswith(".py") or "/" in module or os.sep in module:
        return Path(module)
    return Path(*module.split("."))


def _holds(root: Path, entry: str) -> bool:
    rel = _entry_path(entry)
    if rel.is_absolute():
        return rel.is_file()
    if rel.suffix == ".py":
        return (root / rel).is_file()
    return (root / rel.with_suffix(".py")).is_file() or (root / rel / "__init__.py").is_file()


def find_root(entry: str, here: Path, root_from_here: str | None = None) -> Path:
    """The folder the campaign ran in: ``$CDEEPFUZZ_ROOT``; else ``here / root_from_here`` when it holds
    the entry's file; else the first folder above ``here``, then above the current directory, that does."""
    forced = os.environ.get(ROOT_ENV)
    if forced:
        root = Path(forced).resolve()
        if not root.is_dir():
            raise FileNotFoundError(f"{ROOT_ENV}={forced}: no such directory")
        return root
    candidates: list[Path] = []
    if root_from_here:
        candidates.append((Path(here) / root_from_here).resolve())
    for start in (Path(here).resolve(), Path.cwd().resolve()):
        candidates.extend([start, *start.parents])
    for root in candidates:
        if root.is_dir() and _holds(root, entry):
            return root
    if _entry_path(entry).suffix != ".py" and _importable(entry):
        return Path.cwd().resolve()       # an installed package: found wherever the test runs
    raise FileNotFoundError(f"cannot find the project that holds the finding's factory {entry!r} (looked at "
                            f"{root_from_here or 'no recorded path'} from {here}, and above {here} and the "
                            f"current directory): set {ROOT_ENV} to the folder the campaign ran in")


def _importable(entry: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(entry.rpartition(":")[0]) is not None
    except (ImportError, ValueError):
        return False


def check_finite(target: dict[str, Any], values: Path | str, step_seed: int, *, root: Path | str,
                 device: str = "cpu", precision: dict[str, Any] | None = None):
    """Rebuild the target in ``root`` and run its unmodified program once on the saved values (and
    saved weights) under the check-only detector, in the finding's ``precision`` (fp32 when None);
    the :class:`CheckResult` (``event``: something went non-finite)."""
    from fuzz_core.backends.base import Precision, RunnerOptions
    from fuzz_core.engine import TargetSpec, build_runner

    arrays = load_arrays(Path(values))
    inputs = {k[6:]: v for k, v in arrays.items() if k.startswith("input.")}
    state = {k[6:]: v for k, v in arrays.items() if k.startswith("state.")}
    spec = TargetSpec(str(target["name"]), str(target["entry"]), dict(target.get("args") or {}),
                      target.get("framework"), int(target.get("seed") or 0), base_dir=str(root))
    runner = build_runner(spec, RunnerOptions(device=device, precision=Precision.from_dict(precision)))
    runner.reset()
    if state:
        runner.set_state(state)
    return runner.check(inputs, int(step_seed))


def describe(result, expected: dict[str, Any] | None = None) -> str:
    """One paragraph for a failed reproducer: the first non-finite op, its phase and ``file:line``."""
    expected = expected or {}
    phase = result.phase or "forward"
    first = result.first_op
    if first is not None:
        occurrence = f" (call #{first.occurrence} on that line)" if first.occurrence else ""
        head = f"{first.op} ({first.kind}) at {first.position}{occurrence} went non-finite in the {phase} pass"
    else:
        head = f"the program went non-finite in the {phase} pass (no op named)"
    found = expected.get("first_op") or {}
    seen = (f"; CDeepFuzz found {found.get('op')} at {position_of(found)} ({expected.get('phase', 'forward')})"
            if found and (first is None or (found.get("op"), found.get("location")) != (first.op, first.location))
            else "")
    return (f"{head}: the program is not finite on the values CDeepFuzz saved "
            f"(site {expected.get('site')}, hazard {expected.get('hazard')}, bug {expected.get('signature')}){seen}")
