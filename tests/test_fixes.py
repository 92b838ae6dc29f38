"""Fix suggestions: guards above autograd at the finding's path:line, verified by searching again."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fuzz_core import Target
from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, search_site
from fuzz_core.findings import write_finding
from fuzz_core.fixes import Guard, guard_mode, suggest, suggest_and_verify
from fuzz_core.search import SearchConfig
from orchestrator.cli import app

BUDGET = 30          # search steps per site of the guarded program
HERE = "tests/test_fixes.py"


# -- small subjects (their entries are this file) --------------------------------------------------------
def _sample(rng: np.random.Generator):
    return {"x": rng.uniform(0.5, 1.0, (8, 3)).astype(np.float32),
            "s": rng.uniform(0.1, 0.5, (8, 1)).astype(np.float32)}


def make_two_logs(seed: int = 0, **_) -> Target:
    """The same bug at two sites: a guard at the first line leaves the second."""
    def program(b):
        a = torch.log(b["x"]).sum()
        c = torch.log(b["x"]).mean()
        return a + c

    return Target(program=program, sample=_sample, bounds={"x": (-1.0, 1.0), "s": (0.0, 1.5)}, search=["x", "s"])


def make_log_then_exp(seed: int = 0, **_) -> Target:
    """``exp(-s * log x)`` = ``x ** -s``: a log clamped at tiny gives -87.3, and ``s > 1.02`` overflows the exp;
    clamped at eps it gives -15.9 and the exp stays finite over the whole box."""
    def program(b):
        lp = torch.log(b["x"])
        return torch.exp(-lp * b["s"]).mean()

    return Target(program=program, sample=_sample, bounds={"x": (-1.0, 1.0), "s": (0.0, 1.5)}, search=["x", "s"])


def _log_of(x):
    return torch.log(x)


LOG_LINE = f"{HERE}:{_log_of.__code__.co_firstlineno + 1}"


def _found(tmp_path: Path, name: str, entry: str, op: str, occurrence: int = 0, max_steps: int = 200):
    """Search the target's ``op`` site as a campaign would; write the confirmed finding; return (runner, folder)."""
    spec = TargetSpec(name, entry, {}, None, 0)
    runner = build_runner(spec)
    sites = discover_sites(runner, 0)
    site = next(s for s in sites if s.op == op and s.occurrence == occurrence)
    config = SearchConfig("adaptive", max_steps, 0)
    result = search_site(runner, site, config)
    assert result.candidate is not None, f"{name}: {site.label} not found in {max_steps} steps"
    finding = finding_from(runner, spec, site, config, result.candidate, result.seconds)
    assert finding is not None
    return runner, write_finding(finding, tmp_path / name / finding.folder_name)


def _fix_of(folder: Path) -> dict:
    return json.loads((folder / "finding.json").read_text())["fix"]


# -- the mode -------------------------------------------------------------------------------------------
def test_guard_is_applied_above_autograd_at_its_location_only():
    x = torch.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    guard = Guard("clamp_min", "log", LOG_LINE, {"lo": float(torch.finfo(torch.float32).tiny)})
    with guard_mode([guard]):
        y = _log_of(x)
        other = torch.log(x)                        # another line: not guarded
    assert torch.isfinite(y).all() and torch.isnan(other[0])
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.isfinite(g).all() and g.tolist() == [0.0, 0.0, 0.5]   # the gradient goes through the clamp
    z = torch.tensor([[0.0, 200.0], [1.0, 2.0]], requires_grad=True)
    stable = Guard("stable_log", "log", LOG_LINE)
    with guard_mode([stable]):
        lp = _log_of(torch.softmax(z, dim=1))
    assert torch.allclose(lp, torch.log_softmax(z, 1)) and torch.isfinite(lp).all()
    (gz,) = torch.autograd.grad(lp[:, 0].sum(), z)
    assert torch.isfinite(gz).all()
    assert torch.isinf(_log_of(torch.softmax(z.detach(), dim=1))[0, 0])   # without the mode: -inf


def _two_logs_of(x):
    return torch.log(x) + torch.log(x - 1)


def test_a_guard_with_a_column_guards_that_call_alone():
    line = f"{HERE}:{_two_logs_of.__code__.co_firstlineno + 1}"
    second = len("    return torch.log(x) + ") + 1           # 1-based column where the second call starts
    x = torch.tensor([0.5, -1.0])
    with guard_mode([Guard("clamp_min", "log", line, {"lo": 1e-7}, column=second)]):
        y = _two_logs_of(x)
    assert torch.isfinite(y[0]) and torch.isnan(y[1])                    # log(x - 1) clamped, log(x) not
    with guard_mode([Guard("clamp_min", "log", line, {"lo": 1e-7}, column=1)]):
        assert torch.isnan(_two_logs_of(x)).all()                        # no call starts at column 1: none guarded
    with guard_mode([Guard("clamp_min", "log", line, {"lo": 1e-7})]):    # no column: every call on the line
        assert torch.isfinite(_two_logs_of(torch.tensor([0.5, -3.0]))).all()


def test_suggestions_follow_the_op_and_its_inputs():
    names = lambda op, probe={}: [(g.name, g.params) for g in suggest(op, "f.py:1", probe)]  # noqa: E731
    stable = suggest("log", "f.py:1", {"provenance": [("softmax", "f.py:0:5")]}, column=3)[0]
    assert (stable.name, stable.source, stable.origin, stable.column) == ("stable_log", "softmax", "f.py:0:5", 3)
    assert [n for n, _ in names("log", {"provenance": [("softmax", "a.py:1:1"), ("softmax", "b.py:1:1")]})] == [
        "clamp_min", "clamp_min"]                                # two softmaxes feed the call: no one rewrite
    assert [n for n, _ in names("log")] == ["clamp_min", "clamp_min"]
    assert names("sqrt")[0] == ("clamp_min", {"lo": 0.0})
    assert names("div")[0][0] == "abs_min" and names("exp")[0][1]["hi"] < 88.73
    assert names("pow", {"exponent": -0.5})[0][1]["lo"] > 0 and names("pow", {"exponent": 0.5})[0][1]["lo"] == 0
    assert names("acos")[0][1] == {"lo": -1.0, "hi": 1.0}
    assert [p["lo"] for _, p in names("acosh")] == [1.0, 1.0 + float(torch.finfo(torch.float32).eps)]
    assert names("mvlgamma", {"p": 3})[0][1]["lo"] == pytest.approx(1.0, abs=1e-6)   # (p - 1) / 2, and eps
    assert names("lgamma") == [] and names("digamma") == []
    assert suggest("log", "f.py:1", {})[0].code == ""             # written by the patch, with the line's names


# -- verified on real subjects --------------------------------------------------------------------------
@pytest.mark.parametrize("name,entry,op,occurrence,first_status", [
    ("vae", "campaigns/targets/vae_sqrt_var.py:make_target", "sqrt", 0, "not sufficient"),   # sqrt(0) -> log(0) later
    ("divexp", "campaigns/targets/div_sum_exp.py:make_target", "div", 0, "not sufficient"),  # d(a/b)/db at tiny
    ("sig", "campaigns/targets/log_one_minus_sigmoid.py:make_target", "log", 1, "no patch"),   # log(1 - sigmoid)
])
def test_a_fix_is_verified_on_real_subjects(tmp_path: Path, name, entry, op, occurrence, first_status):
    runner, folder = _found(tmp_path, name, entry, op, occurrence)
    fix = suggest_and_verify(folder, BUDGET, runner=runner)
    assert fix == _fix_of(folder)
    assert fix["status"] == "verified", fix["message"]
    assert fix["message"].startswith("verified")
    assert fix["attempts"][0]["status"] == first_status
    assert fix["recommended"] == fix["attempts"][-1]["guard"] and fix["diff"] == fix["attempts"][-1]["diff"]
    if name == "vae":        # the first guard (clamp to 0) gives std = 0 and log(std) = -inf on the next line
        residual = fix["attempts"][0]["residual"]
        assert residual["first_op"]["op"] == "log" and residual["first_op"]["location"].endswith("vae_sqrt_var.py:53")
        assert (folder / residual["values"]).is_file()
    if name == "divexp":     # |b| >= tiny keeps a / b finite, not its gradient -a / b**2 (backward is checked too)
        residual = fix["attempts"][0]["residual"]
        assert residual["phase"] == "backward" and "at the guard's bound" in residual["explanation"]
        assert fix["attempts"][0]["guard"]["params"]["eps"] == pytest.approx(float(torch.finfo(torch.float32).tiny))
    if name == "sig":        # logsigmoid(-z) needs z, which the log's line does not hold: the clamp
        assert fix["attempts"][0]["guard"]["name"] == "stable_log"
        assert fix["attempts"][0]["why"] == (
            "logsigmoid needs the input of the sigmoid that computed `1 - p`, and line 43 of "
            "campaigns/targets/log_one_minus_sigmoid.py does not hold it (the sigmoid runs at "
            "campaigns/targets/log_one_minus_sigmoid.py:42:9)")
        assert fix["recommended"]["name"] == "clamp_min" and fix["recommended"]["column"] == 43
        assert fix["recommended"]["code"] == ("return -(y * torch.log(p) + (1 - y) * torch.log((1 - p).clamp_min("
                                              "1.1754944e-38))).mean()")
    else:
        # every site of the guarded program is searched, the backward hazards of one that trains too
        expected = {"vae": 4, "divexp": 2}[name]     # vae: sqrt, log and their backward rows
        assert fix["attempts"][-1]["steps"] > 0 and len(fix["attempts"][-1]["sites"]) == expected


# -- not sufficient ------------------------------------------------------------------------------------------
def test_same_bug_at_another_site_is_not_sufficient_through_the_cli(tmp_path: Path):
    _, folder = _found(tmp_path, "two", f"{HERE}:make_two_logs", "log")
    report = json.loads((folder / "finding.json").read_text())
    res = CliRunner().invoke(app, ["fix", str(folder), "--budget", str(BUDGET)])
    assert res.exit_code == 1, res.output
    fix = _fix_of(folder)
    assert res.output.startswith(f"no fix for the log at {report['site']['location']}:") and fix["message"] in res.output
    assert "2 guard(s) tried and none keeps the program finite" in fix["message"]
    assert fix["status"] == "not sufficient" and fix["recommended"] is None and len(fix["attempts"]) == 2
    for attempt in fix["attempts"]:
        first = attempt["residual"]["first_op"]
        assert first["op"] == "log" and first["location"] != report["site"]["location"]   # the other line


def test_a_clamp_at_tiny_that_overflows_later_is_found_by_the_search(tmp_path: Path):
    runner, folder = _found(tmp_path, "logexp", f"{HERE}:make_log_then_exp", "log")
    fix = suggest_and_verify(folder, BUDGET, runner=runner)
    tiny, eps = fix["attempts"]
    assert tiny["status"] == "not sufficient" and tiny["steps"] > 0          # the reproducer alone stays finite
    assert tiny["residual"]["first_op"]["op"] == "exp"
    assert "exp" in tiny["residual"]["searched"]
    assert eps["status"] == "verified" and fix["status"] == "verified"
    assert fix["recommended"]["params"]["lo"] == pytest.approx(float(torch.finfo(torch.float32).eps))
