"""Bad campaign files: a one-line error naming the file, field and value; exit 2; nothing started."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config import ConfigError, load_campaign

GOOD_TARGET = "{name: t, entry: campaigns/targets/softmax_xent_mlp.py:make_target}"

# (file text, text that the one-line message must contain)
CASES = {
    "not_yaml": ("name: [unclosed\n", "not valid YAML"),
    "tabs": ("name: x\n\ttargets: []\n", "not valid YAML"),
    "a_list": ("- 1\n- 2\n", "must be a mapping"),
    "empty": ("", "must be a mapping"),
    "no_targets": ("name: x\n", "targets: required field is missing"),
    "no_name": (f"targets: [{GOOD_TARGET}]\n", "name: required field is missing"),
    "empty_targets": ("name: x\ntargets: []\n", "targets"),
    "unknown_top": (f"name: x\ntargets: [{GOOD_TARGET}]\nbogus: 1\n", "bogus: unknown field (got 1)"),
    "unknown_search": (f"name: x\ntargets: [{GOOD_TARGET}]\nsearch: {{stratgy: grist}}\n", "search.stratgy: unknown field"),
    "bad_strategy": (f"name: x\ntargets: [{GOOD_TARGET}]\nsearch: {{strategy: magic}}\n", "search.strategy"),
    "negative_budget": (f"name: x\ntargets: [{GOOD_TARGET}]\nsearch: {{max_steps: -5}}\n", "search.max_steps"),
    "budget_type": (f"name: x\ntargets: [{GOOD_TARGET}]\nsearch: {{max_steps: lots}}\n", "'lots'"),
    "zero_quantum": (f"name: x\ntargets: [{GOOD_TARGET}]\nscheduler: {{quantum: 0}}\n", "scheduler.quantum"),
    "zero_horizon": (f"name: x\ntargets: [{GOOD_TARGET}]\nscheduler: {{horizon: 0}}\n", "scheduler.horizon"),
    "horizon_round_robin": (f"name: x\ntargets: [{GOOD_TARGET}]\nscheduler: {{policy: round-robin, horizon: 1}}\n",
                            "scheduler.horizon: applies to the loss-slope policy only (got 1)"),
    "bad_policy": (f"name: x\ntargets: [{GOOD_TARGET}]\nscheduler: {{policy: fifo}}\n", "scheduler.policy"),
    "negative_actors": (f"name: x\ntargets: [{GOOD_TARGET}]\nresources: {{num_actors: -1}}\n", "resources.num_actors"),
    "negative_gpus": (f"name: x\ntargets: [{GOOD_TARGET}]\nresources: {{num_gpus: -0.5}}\n", "resources.num_gpus"),
    "bad_device": (f"name: x\ntargets: [{GOOD_TARGET}]\ndevice: tpu\n", "device"),
    "zero_time": (f"name: x\ntargets: [{GOOD_TARGET}]\ntime_limit_s: 0\n", "time_limit_s"),
    "bad_name": (f"name: 'a b/c'\ntargets: [{GOOD_TARGET}]\n", "name"),
    "entry_no_colon": ("name: x\ntargets: [{name: t, entry: campaigns/targets/softmax_xent_mlp.py}]\n", "targets[0].entry"),
    "missing_file": ("name: x\ntargets: [{name: t, entry: campaigns/targets/nope.py:make_target}]\n", "no such file"),
    "missing_factory": ("name: x\ntargets: [{name: t, entry: campaigns/targets/softmax_xent_mlp.py:make_it}]\n", "defines no 'make_it'"),
    "missing_module": ("name: x\ntargets: [{name: t, entry: no_such_pkg.mod:make}]\n", "no module or file"),
    "args_not_mapping": ("name: x\ntargets: [{name: t, entry: campaigns/targets/softmax_xent_mlp.py:make_target, args: 3}]\n", "targets[0].args"),
    "bad_framework": ("name: x\ntargets: [{name: t, entry: campaigns/targets/softmax_xent_mlp.py:make_target, framework: jax}]\n", "targets[0].framework"),
    "duplicate_targets": (f"name: x\ntargets: [{GOOD_TARGET}, {GOOD_TARGET}]\n", "two targets are named 't'"),
    "weights_not_bool": (f"name: x\ntargets: [{GOOD_TARGET}]\nsearch: {{search_weights: maybe}}\n", "search.search_weights"),
    "tracking_unknown": (f"name: x\ntargets: [{GOOD_TARGET}]\ntracking: {{url: x}}\n", "tracking.url: unknown field"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_campaign_is_one_line_naming_file_and_field(tmp_path: Path, case: str):
    text, expected = CASES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_campaign(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert expected in message, message


def test_cli_exit_2_without_traceback_and_nothing_started(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: x
        targets: [{GOOD_TARGET}]
        search: {{max_steps: -1}}
        output: {tmp_path / 'out'}
    """))
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "search.max_steps" in result.output
    assert not (tmp_path / "out").exists()


def test_missing_campaign_file_exit_2():
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "no/such/campaign.yaml"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "no such campaign file" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"run": null}'])
def test_sync_with_an_unreadable_summary_is_a_one_line_error(tmp_path: Path, content: str):
    (tmp_path / "summary.json").write_text(content)
    result = CliRunner().invoke(app, ["sync", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "summary.json" in result.output or "--tracking-uri" in result.output
    assert "Traceback" not in result.output


def test_the_newest_run_lookup_skips_summaries_that_name_no_tracking_uri(tmp_path: Path, monkeypatch):
    import os

    from orchestrator.config import resolve_tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    good = tmp_path / "runs" / "a-1" / "summary.json"
    good.parent.mkdir(parents=True)
    good.write_text('{"run": {"tracking_uri": "sqlite:////tmp/a.db"}}')
    for i, content in enumerate(["{not json", "[1, 2]", '{"run": null}', '{"run": ["x"]}']):
        bad = tmp_path / "runs" / f"b-{i}" / "summary.json"
        bad.parent.mkdir(parents=True)
        bad.write_text(content)
        os.utime(bad, (good.stat().st_mtime + 10 + i,) * 2)   # newer than the good one
    assert resolve_tracking_uri(None, search=tmp_path) == "sqlite:////tmp/a.db"


def test_one_tracking_uri_order_for_every_command(tmp_path: Path, monkeypatch):
    """--tracking-uri, tracking.uri, the run's own, MLFLOW_TRACKING_URI, the output's SQLite, the newest run."""
    from orchestrator.config import resolve_tracking_uri

    run = tmp_path / "out" / "c-1"
    run.mkdir(parents=True)
    (run / "summary.json").write_text('{"run": {"tracking_uri": "http://own:5000"}}')
    path = tmp_path / "c.yaml"
    path.write_text(f"name: x\ntargets: [{GOOD_TARGET}]\ntracking: {{uri: http://campaign:5000}}\n")
    campaign = load_campaign(path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert resolve_tracking_uri("http://cli:5000", campaign=campaign, run_dir=run) == "http://cli:5000"
    assert resolve_tracking_uri(None, campaign=campaign, run_dir=run) == "http://campaign:5000"
    assert resolve_tracking_uri(None, run_dir=run, output=tmp_path) == "http://own:5000"
    assert resolve_tracking_uri(None, output=tmp_path, search=tmp_path) == "http://env:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert resolve_tracking_uri(None, output=tmp_path / "o") == "sqlite:///" + (tmp_path / "o").resolve().as_posix() + "/mlflow.db"
    assert resolve_tracking_uri(None, search=tmp_path) == "http://own:5000"
    assert resolve_tracking_uri(None) is None


@pytest.mark.parametrize("factory, args, field", [
    ("def make_target(seed=0, hidden=32):\n    pass\n", "{hiden: 3}", "targets[0].args.hiden"),
    ("def make_target(hidden=32):\n    pass\n", "{}", "targets[0].entry"),
])
def test_an_argument_the_factory_does_not_take_is_a_configuration_error(tmp_path: Path, factory, args, field):
    (tmp_path / "f.py").write_text(factory)
    path = tmp_path / "c.yaml"
    path.write_text(f"name: x\ntargets: [{{name: t, entry: '{tmp_path / 'f.py'}:make_target', args: {args}}}]\n")
    with pytest.raises(ConfigError) as err:
        load_campaign(path)
    assert str(err.value).startswith(f"{path}: {field}: make_target() ")
    (tmp_path / "g.py").write_text("def make_target(**kwargs):\n    pass\n")      # **kwargs takes anything
    path.write_text(f"name: x\ntargets: [{{name: t, entry: '{tmp_path / 'g.py'}:make_target', args: {args}}}]\n")
    load_campaign(path)


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_resume_of_a_folder_without_a_readable_state_is_a_one_line_error(tmp_path: Path, content: str):
    (tmp_path / "summary.json").write_text(content)
    result = CliRunner().invoke(app, ["run", "--resume", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "state.db" in result.output and "Traceback" not in result.output
    (tmp_path / "state.db").write_text(content)            # not a database
    result = CliRunner().invoke(app, ["run", "--resume", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "state.db" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("scheduler, strategy, options", [
    ("{policy: loss-slope}", "adaptive", {"horizon": 1.0}),   # adaptive: a site too slow for its budget is off course
    ("{policy: loss-slope}", "grist", {"horizon": None}),     # grist, random: no horizon
    ("{policy: loss-slope}", "random", {"horizon": None}),
    ("{policy: loss-slope, horizon: 3}", "grist", {"horizon": 3.0}),   # the campaign's own wins
    ("{policy: loss-slope, horizon: 2.5}", "adaptive", {"horizon": 2.5}),
    ("{policy: round-robin}", "adaptive", {}),     # round-robin takes no options
    ("{}", "adaptive", {}),                        # the default is share
    ("{policy: share}", "adaptive", {}),           # share takes none from the campaign
])
def test_scheduler_options_follow_the_campaign_and_its_strategy(tmp_path: Path, scheduler, strategy, options):
    from orchestrator.run.controller import scheduler_options
    from orchestrator.scheduler import make_scheduler

    path = tmp_path / "c.yaml"
    path.write_text(f"name: x\ntargets: [{GOOD_TARGET}]\nsearch: {{strategy: {strategy}}}\nscheduler: {scheduler}\n")
    campaign = load_campaign(path)
    assert scheduler_options(campaign) == options
    sched = make_scheduler(campaign.scheduler.policy, 100, campaign.scheduler.quantum, **scheduler_options(campaign))
    assert getattr(sched, "horizon", None) == options.get("horizon")
