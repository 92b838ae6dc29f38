"""``cdeepfuzz fix``: the guard is judged forward and backward, its verdict says how much was checked,
it is shown as a patch of the user's line, and it is recorded on the finding's MLflow run.

Real torch, a real campaign and a real MLflow store (SQLite in a temporary folder); nothing mocked."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fuzz_core import Target
from fuzz_core.fixes import DIFF_FILE, TF_WHY, Guard, guard_mode, source_patch, suggest_and_verify
from orchestrator.cli import app

HERE = "tests/test_fix_verdicts.py"
BUDGET = 30
TINY = float(torch.finfo(torch.float32).tiny)
EPS = float(torch.finfo(torch.float32).eps)


def make_rsqrt(seed: int = 0) -> Target:
    """An inference program (no backward of its own): rsqrt of an input that may reach 0."""
    def program(b):
        return torch.rsqrt(b["x"]).mean()

    return Target(program=program, search=["x"], bounds={"x": (-1.0, 1.0)},
                  sample=lambda rng: {"x": rng.uniform(0.5, 1.0, (4, 3)).astype("float32")})


RSQRT_LINE = make_rsqrt.__code__.co_firstlineno + 3          # the program's return line


def _rsqrt_of(x):
    return torch.rsqrt(x)


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd)


def _campaign(tmp: Path, extra: str = "") -> tuple[Path, str]:
    """One campaign over the rsqrt program, tracked in a SQLite MLflow store: (finding folder, its URI)."""
    path = tmp / "fx.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: fx
        targets:
          - {{name: rs, entry: {HERE}:make_rsqrt}}
        search: {{strategy: adaptive, max_steps: 60, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 20}}
        resources: {{num_actors: 0}}
        device: cpu
        output: {tmp / 'out'}
        """) + extra)
    done = _cli("run", "--plain", str(path))
    assert done.returncode == 1, done.stderr[-3000:]
    (finding,) = (tmp / "out").glob("fx-*/findings/*")
    return finding, "sqlite:///" + (tmp / "out" / "mlflow.db").as_posix()


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> tuple[Path, str]:
    return _campaign(tmp_path_factory.mktemp("fixrun"))


def _fix(finding: Path, *extra: str):
    return CliRunner().invoke(app, ["fix", *extra, "--budget", str(BUDGET)])


# -- the backward pass ----------------------------------------------------------------------------------------
def test_a_clamp_at_tiny_before_rsqrt_is_finite_forward_but_not_backward():
    """rsqrt(x.clamp_min(tiny)) at x = 2e-38: 7e18 forward, -inf gradient (-0.5 * x ** -1.5 overflows)."""
    guard = Guard("clamp_min", "rsqrt", f"{HERE}:{_rsqrt_of.__code__.co_firstlineno + 1}", {"lo": TINY})
    sink: list = []
    x = torch.tensor([2e-38, 1.0])
    with guard_mode([guard], sink=sink):
        y = _rsqrt_of(x)
    assert torch.isfinite(y).all()
    (bad,) = sink
    assert bad["input"] == pytest.approx(2e-38) and bad["gradient"] == float("-inf")
    assert "non-finite gradient" in bad["explanation"]
    sink.clear()
    with guard_mode([Guard("clamp_min", "rsqrt", guard.location, {"lo": EPS})], sink=sink):
        _rsqrt_of(x)
    assert sink == []                                          # at eps: -0.5 * eps ** -1.5, finite


def test_the_rsqrt_finding_tiny_guard_is_not_sufficient_backward_eps_is_verified(campaign):
    finding, _ = campaign
    fix = suggest_and_verify(finding, BUDGET)
    tiny, eps = fix["attempts"]
    assert tiny["guard"]["params"]["lo"] == pytest.approx(TINY) and tiny["status"] == "not sufficient"
    res = tiny["residual"]
    assert res["phase"] == "backward" and res["explanation"].startswith(
        "non-finite gradient through the guard: d rsqrt/d input 0 = -inf at the guard's bound, "
        "input 0 = 1.1754944e-38"), res
    assert res["first_op"]["op"] == "rsqrt" and res["first_op"]["location"] == f"{HERE}:{RSQRT_LINE}"
    assert (finding / res["values"]).is_file()
    assert eps["status"] == "verified" and fix["status"] == "verified"
    assert fix["message"].startswith(f"verified ({eps['guard']['description']}): replayed the finding's input "
                                     f"under the guard: finite forward and backward (the guarded op's gradient "
                                     f"also at the guard's bounds); searched {eps['steps']} steps over 1 suspect")
    assert "none found in" not in fix["message"] and fix["message"].endswith(": none")
    assert fix["checked"] == {"replay": "forward and backward", "steps": eps["steps"], "sites": len(eps["sites"])}


# -- the patch, the path, MLflow ------------------------------------------------------------------------------
@pytest.mark.mlflow
def test_fix_of_finding_json_prints_the_patch_and_records_the_verdict_in_mlflow(campaign, monkeypatch):
    from mlflow.tracking import MlflowClient

    finding, uri = campaign
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    res = _fix(finding, str(finding / "finding.json"))          # the file, not the folder
    assert res.exit_code == 0, res.output
    out = res.output.splitlines()
    assert out[0].startswith("verified (clamp the input to >= eps")
    old = '        return torch.rsqrt(b["x"]).mean()'
    new = f'        return torch.rsqrt(b["x"].clamp_min({EPS:.8g})).mean()'
    assert f"--- a/{HERE}" in out and f"+++ b/{HERE}" in out
    assert f"-{old}" in out and f"+{new}" in out
    assert any(line.startswith(f"@@ -{RSQRT_LINE - 1},3 +{RSQRT_LINE - 1},3 @@") for line in out), out
    report = json.loads((finding / "finding.json").read_text())
    assert (finding / DIFF_FILE).read_text() == report["fix"]["diff"]
    applied = subprocess.run(["git", "apply", "--check", str(finding / DIFF_FILE)], capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr                  # a patch git can apply to this checkout

    summary = json.loads((finding.parent.parent / "summary.json").read_text())
    (site,) = [s for s in summary["sites"] if s.get("finding")]
    rid = site["mlflow_run_id"]
    assert report["fix"]["mlflow"] == {"recorded": True, "uri": uri, "run_id": rid,
                                       "message": f"MLflow: fix.verdict=verified recorded on run {rid} ({uri})"}
    assert out[-1] == report["fix"]["mlflow"]["message"]
    client = MlflowClient(uri)
    tags = client.get_run(rid).data.tags
    assert tags["fix.verdict"] == "verified" and tags["fix.guard"] == report["fix"]["recommended"]["code"]
    assert tags["fix.message"] == report["fix"]["message"] and int(tags["fix.steps"]) > 0
    assert tags["finding.folder"]                                  # the finding's own run, beside the finding
    assert {a.path for a in client.list_artifacts(rid, "finding")} >= {"finding/fix.diff", "finding/finding.json"}


@pytest.mark.mlflow
def test_a_campaign_with_one_run_per_finding_gets_the_verdict_on_that_run(tmp_path, monkeypatch):
    """Above tracking.max_site_runs a finding has its own run, whose id summary.json does not keep."""
    from mlflow.tracking import MlflowClient

    finding, uri = _campaign(tmp_path, "tracking: {max_site_runs: 0}\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    summary = json.loads((finding.parent.parent / "summary.json").read_text())
    assert [s["mlflow_run_id"] for s in summary["sites"]] == [None]
    res = _fix(finding, str(finding))
    assert res.exit_code == 0, res.output
    rid = json.loads((finding / "finding.json").read_text())["fix"]["mlflow"]["run_id"]
    run = MlflowClient(uri).get_run(rid)
    assert run.data.tags["fix.verdict"] == "verified" and run.data.tags["signature"]
    assert run.data.tags["mlflow.parentRunId"] == summary["run"]["mlflow_run_id"]


def test_an_unreachable_store_is_one_line_and_finding_json_still_has_the_verdict(campaign, tmp_path):
    finding, _ = campaign
    missing = "sqlite:///" + (tmp_path / "nowhere" / "mlflow.db").as_posix()
    res = _fix(finding, str(finding), "--tracking-uri", missing)
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("MLflow:")]
    assert lines == [f"MLflow: not recorded: the tracking store {missing} is not reachable (no such file); "
                     f"the verdict is in finding.json"]
    assert not (tmp_path / "nowhere").exists()                      # no empty store made on the way
    fix = json.loads((finding / "finding.json").read_text())["fix"]
    assert fix["status"] == "verified" and fix["mlflow"]["recorded"] is False


def test_a_missing_path_is_a_usage_error(tmp_path):
    res = _fix(tmp_path, str(tmp_path / "nope" / "finding.json"))
    assert res.exit_code == 2 and "no such path" in res.output


# -- TensorFlow --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("named", [True, False])
def test_a_tensorflow_finding_says_why_there_is_no_guard(campaign, tmp_path, named):
    """Named in the target (framework: tensorflow), or not (a campaign may leave it out): its versions say."""
    import shutil

    finding, _ = campaign
    tf = tmp_path / "tf-finding"
    shutil.copytree(finding, tf)
    report = json.loads((tf / "finding.json").read_text())
    report["target"]["framework"] = "tensorflow" if named else None
    report["versions"] = {k: v for k, v in report["versions"].items() if k != "torch"} | {"tensorflow": "2.21.0"}
    report.pop("fix", None)
    (tf / "finding.json").write_text(json.dumps(report))
    res = _fix(tf, str(tf))
    assert res.exit_code == 1, res.output
    assert res.output.splitlines()[0] == f"no fix for the rsqrt at {HERE}:{RSQRT_LINE}:16: {TF_WHY}."
    assert "TorchFunctionMode" in res.output and "by hand" in res.output
    fix = json.loads((tf / "finding.json").read_text())["fix"]
    assert fix["status"] == "no suggestion" and fix["diff"] is None and not (tf / DIFF_FILE).exists()
    readme = Path("README.md").read_text()
    assert "PyTorch programs only" in readme and "TorchFunctionMode" in readme


# -- the patch of other forms -----------------------------------------------------------------------------------
def test_the_patch_rewrites_every_call_of_the_op_on_the_line(tmp_path):
    src = tmp_path / "prog.py"
    src.write_text("import torch\n"
                   "def f(z, x, y):\n"
                   "    a = torch.log(x) + torch.log(x + 1)  # two calls\n"
                   "    b = torch.log(torch.softmax(z, dim=1)) + x.rsqrt() / (y - 1)\n"
                   "    c = torch.log(1 - torch.sigmoid(z)) + x ** 0.5\n")
    after = lambda op, name, line, **p: source_patch(Guard(name, op, f"prog.py:{line}", p), (tmp_path,))  # noqa: E731
    two = after("log", "clamp_min", 3, lo=EPS)
    assert two["after"] == (f"a = torch.log(x.clamp_min({EPS:.8g})) + torch.log((x + 1).clamp_min({EPS:.8g}))"
                            f"  # two calls")
    assert two["diff"].splitlines()[:3] == ["--- a/prog.py", "+++ b/prog.py", "@@ -2,3 +2,3 @@"]
    assert after("log", "stable_log", 4)["after"].startswith("b = torch.log_softmax(z, dim=1) + x.rsqrt()")
    assert after("rsqrt", "clamp_min", 4, lo=EPS)["after"].endswith(f"x.clamp_min({EPS:.8g}).rsqrt() / (y - 1)")
    assert after("div", "abs_min", 4, eps=1e-7)["after"].endswith(
        "x.rsqrt() / torch.copysign((y - 1).abs().clamp_min(1e-07), y - 1)")
    assert after("log", "stable_log", 5)["after"] == "c = torch.nn.functional.logsigmoid(-z) + x ** 0.5"
    assert after("pow", "clamp_min", 5, lo=0.0)["after"].endswith("x.clamp_min(0) ** 0.5")
    assert after("exp", "clamp_max", 5, hi=1.0) is None            # no exp on the line: no patch
    assert after("log", "clamp_min", 3, lo=EPS) == two and source_patch(Guard("clamp_min", "log", "gone.py:3")) is None
