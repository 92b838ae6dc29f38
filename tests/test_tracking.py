"""Tests of the MLflow tracker (background writer, spool, findings queries)."""

from __future__ import annotations

import json
import math
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.observers import tracking, tracking_sender
from orchestrator.observers.tracking import Tracker, flatten_params
from orchestrator.observers.tracking_sender import SpoolReplay, default_sqlite_uri, replay_spool

pytestmark = pytest.mark.mlflow
MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient

SITES = ("a1b2c3d4", "00c0ffee", "5eed5eed")
CONFIG = {
    "search": {"strategy": "adaptive", "max_steps": 500, "seed": 0},
    "targets": [{"name": "softmax-mlp", "args": {"hidden": 32}}],
    "resources": {"num_actors": 2},
    "notes": "x" * 7000,
}


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the module (each new store runs MLflow's migrations)."""
    uri = default_sqlite_uri(tmp_path_factory.mktemp("mlflow"))
    MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    return uri


@pytest.fixture(autouse=True)
def _http_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracker sets MLflow's HTTP variables process-wide; undo them after each test."""
    for name, value in tracking_sender.HTTP_ENV_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")


def _site_tags(site: str, status: str = "searching") -> dict:
    return {
        "site.id": site,
        "site.op": "log",
        "site.location": "campaigns/targets/softmax_mlp.py:12",
        "site.target": "softmax-mlp",
        "status": status,
        "hazard": "log of x <= 0",
        "training": True,
    }


def _finding_dir(root: Path, site: str) -> Path:
    folder = root / "findings" / site
    folder.mkdir(parents=True)
    (folder / "finding.json").write_text(json.dumps({"site_id": site, "steps": 4}))
    (folder / "replay.sh").write_text("cdeepfuzz replay .\n")
    return folder


def _run_campaign(tracker: Tracker, root: Path, metric_rows: int = 5) -> None:
    """A parent and three children: s0 finished, s1 found (artifacts), s2 left open."""
    tracker.start_campaign("campaign", "quickstart-run", CONFIG, {"cdeepfuzz.version": "0.1.0"})
    for i, site in enumerate(SITES):
        tracker.start_site(site, f"log@softmax_mlp.py:12#{i}", _site_tags(site))
        rows = [("suspect_loss", 1.0 / (s + 1), s) for s in range(metric_rows)]
        rows += [("grad_norm", math.inf, 1), ("grad_norm", -math.inf, 2), ("best_loss", math.nan, 0)]
        tracker.log_metrics(site, rows + [("bogus", "not a number", 0)])  # type: ignore[list-item]
    tracker.set_tags(SITES[1], {"status": "found", "signature": "deadbeef", "trigger": "inputs"})
    tracker.log_metrics(SITES[1], [("steps", 4, 4)])
    tracker.log_artifacts(SITES[1], _finding_dir(root, SITES[1]))
    tracker.end(SITES[0], "FINISHED")
    tracker.end(SITES[1], "FINISHED")


def _check_campaign(client: MlflowClient, parent_id: str, metric_rows: int = 5) -> dict[str, str]:
    """Check what ``_run_campaign`` logged; return site id -> run id."""
    parent = client.get_run(parent_id)
    params = parent.data.params
    assert params["search.max_steps"] == "500" and params["search.strategy"] == "adaptive"
    assert json.loads(params["targets"]) == CONFIG["targets"]
    assert len(params["notes"]) == 6000
    assert parent.data.tags["cdeepfuzz.version"] == "0.1.0"
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'"
    )
    by_site = {r.data.tags["site.id"]: r for r in children}
    assert sorted(by_site) == sorted(SITES)
    for run in by_site.values():
        assert run.data.tags["triage"] == "new" and run.data.tags["training"] == "true"
        history = client.get_metric_history(run.info.run_id, "suspect_loss")
        assert sorted((m.step, m.value) for m in history) == [
            (s, 1.0 / (s + 1)) for s in range(metric_rows)
        ]
        grads = sorted(client.get_metric_history(run.info.run_id, "grad_norm"), key=lambda m: m.step)
        assert [m.value for m in grads] == [sys.float_info.max, -sys.float_info.max]
        assert math.isnan(run.data.metrics["best_loss"])
        assert "bogus" not in run.data.metrics
    found = by_site[SITES[1]]
    assert found.data.tags["status"] == "found" and found.data.metrics["steps"] == 4
    arts = {a.path for a in client.list_artifacts(found.info.run_id, "finding")}
    assert arts == {"finding/finding.json", "finding/replay.sh"}
    assert by_site[SITES[0]].info.status == "FINISHED"
    return {site: run.info.run_id for site, run in by_site.items()}


def test_flatten_params_truncates_and_dots() -> None:
    flat = flatten_params({"a": {"b": {"c": 1}, "d": [1, 2]}, "e": None, "bad key!": "x" * 7000})
    assert flat == {"a.b.c": "1", "a.d": "[1, 2]", "e": "None", "bad key_": "x" * 6000}


def test_default_sqlite_uri_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_sqlite_uri("runs") == f"sqlite:///{tmp_path.resolve().as_posix()}/runs/mlflow.db"
    assert default_sqlite_uri(tmp_path).startswith("sqlite:////")


def test_parent_children_metrics_artifacts(store_uri: str, tmp_path: Path) -> None:
    tracker = Tracker(store_uri, "camp-a", tmp_path / "spool")
    _run_campaign(tracker, tmp_path, metric_rows=2500)  # > 1000 metrics: several batches
    tracker.end(SITES[2], "FAILED")
    assert tracker.flush(60)
    parent_id = tracker.parent_run_id
    assert parent_id and tracker.run_id("campaign") == parent_id
    assert tracker.close(timeout=60)  # the campaign run is still open: ended as KILLED
    client = MlflowClient(tracking_uri=store_uri)
    ids = _check_campaign(client, parent_id, metric_rows=2500)
    assert ids[SITES[1]] == tracker.run_id(SITES[1])
    assert client.get_run(ids[SITES[2]]).info.status == "FAILED"
    assert client.get_run(parent_id).info.status == "KILLED"
    local = client.download_artifacts(ids[SITES[1]], "finding/finding.json", str(tmp_path))
    assert json.loads(Path(local).read_text())["site_id"] == SITES[1]
    experiment = client.get_experiment(client.get_run(parent_id).info.experiment_id)
    assert "mlartifacts" in experiment.artifact_location  # next to the db, not ./mlruns
    assert not (tmp_path / "spool" / tracking.SPOOL_NAME).exists()


def test_resume_reuses_the_parent_run(store_uri: str, tmp_path: Path) -> None:
    first = Tracker(store_uri, "camp-resume", tmp_path)
    first.start_campaign("campaign", "resume-run", {"seed": 0}, {})
    first.close(timeout=60, status="KILLED")
    parent_id = first.parent_run_id
    again = Tracker(store_uri, "camp-resume", tmp_path)
    again.start_campaign("campaign", "resume-run", {"seed": 1, "extra": 2}, {"resumed": True}, parent_id)
    assert again.flush(60)
    assert again.parent_run_id == parent_id
    run = MlflowClient(tracking_uri=store_uri).get_run(parent_id)
    assert run.info.status == "RUNNING"
    assert run.data.params == {"seed": "0", "extra": "2"}  # MLflow params never change
    assert run.data.tags["resumed"] == "true"
    again.end("campaign", "FINISHED")
    assert again.close(timeout=60)
    assert MlflowClient(tracking_uri=store_uri).get_run(parent_id).info.status == "FINISHED"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_server_spools_then_replays(store_uri: str, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    tracker = Tracker(f"http://127.0.0.1:{_free_port()}", "camp-offline", spool, probe_interval_s=60)
    began = time.monotonic()
    _run_campaign(tracker, tmp_path)
    assert time.monotonic() - began < 0.5  # enqueueing never waits for the server
    began = time.monotonic()
    tracker.close(timeout=10)
    assert time.monotonic() - began < 12
    assert tracker.offline and tracker.run_id("campaign") is None
    lines = [json.loads(x) for x in (spool / tracking.SPOOL_NAME).read_text().splitlines()]
    kinds = [line["kind"] for line in lines]
    assert kinds[0] == "start_campaign" and kinds.count("start_site") == 3
    assert kinds[-2:] == ["end", "end"]  # close ended the open site, then the campaign
    result = replay_spool(store_uri, spool)
    assert result == SpoolReplay(sent=len(lines), dropped=0, left=0)
    assert not (spool / tracking.SPOOL_NAME).exists()
    client = MlflowClient(tracking_uri=store_uri)
    experiment = client.get_experiment_by_name("camp-offline")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`mlflow.parentRunId` IS NULL")
    ids = _check_campaign(client, parent.info.run_id)
    assert client.get_run(ids[SITES[2]]).info.status == "KILLED"
    assert parent.info.status == "KILLED"


class _Flaky:
    """Wraps a sender's ``apply``/``ping``: raises a connection error while ``down``."""

    def __init__(self, sender: tracking_sender._Sender) -> None:
        self.down = True
        self.apply, self.ping = sender.apply, sender.ping
        sender.apply, sender.ping = self._wrap(sender.apply), self._wrap(sender.ping)

    def _wrap(self, fn):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            if self.down:
                raise ConnectionRefusedError("server down")
            return fn(*args, **kwargs)

        return call


def test_reconnects_and_replays_the_spool(store_uri: str, tmp_path: Path) -> None:
    tracker = Tracker(store_uri, "camp-flaky", tmp_path, tries=1, probe_interval_s=0.1)
    flaky = _Flaky(tracker._sender)
    _run_campaign(tracker, tmp_path)
    assert tracker.flush(30)
    assert tracker.offline and (tmp_path / tracking.SPOOL_NAME).exists()
    flaky.down = False
    deadline = time.monotonic() + 30
    while tracker.offline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not tracker.offline and not (tmp_path / tracking.SPOOL_NAME).exists()
    tracker.end(SITES[2], "FINISHED")
    tracker.end("campaign", "FINISHED")
    assert tracker.close(timeout=30)
    client = MlflowClient(tracking_uri=store_uri)
    _check_campaign(client, tracker.parent_run_id)
    assert client.get_run(tracker.run_id(SITES[2])).info.status == "FINISHED"


def test_slow_server_does_not_block_close(store_uri: str, tmp_path: Path) -> None:
    tracker = Tracker(store_uri, "camp-slow", tmp_path)
    release = threading.Event()
    real = tracker._sender.apply
    tracker._sender.apply = lambda rec: (release.wait(5), real(rec))  # type: ignore[method-assign]
    began = time.monotonic()
    _run_campaign(tracker, tmp_path)
    assert not tracker.flush(0.2)
    assert not tracker.close(timeout=0.5)
    assert time.monotonic() - began < 0.5 + tracking.CLOSE_GRACE_S + 1.0
    release.set()  # the call in flight returns; the writer spools the rest and stops
    tracker._thread.join(10)
    assert not tracker._thread.is_alive()
    kinds = [json.loads(x)["kind"] for x in (tmp_path / tracking.SPOOL_NAME).read_text().splitlines()]
    # start_campaign was in flight when close gave up on it: spooled first (a replay adopts the run its call
    # made meanwhile), then what was queued behind it, in order
    assert kinds[0] == "start_campaign" and kinds[1] == "start_site" and kinds[-1] == "end"


def test_methods_never_raise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tracker = Tracker(f"http://127.0.0.1:{_free_port()}", "camp-x", tmp_path)
    tracker.start_site("s", "label", None)  # type: ignore[arg-type]
    tracker.log_metrics("s", [("loss", 1.0)])  # type: ignore[list-item]
    tracker.end("s", "DONE")  # type: ignore[arg-type]
    assert "not one of" in caplog.text and "start_site failed" in caplog.text
    tracker.close(timeout=5, status=None)
    tracker.set_tags("s", {"a": 1})  # after close: ignored, logged


def test_a_child_that_dies_is_replaced_and_told_the_run_ids(store_uri: str, tmp_path: Path) -> None:
    """MLflow runs in a child process: when it dies, the writer spools; its probe starts another child,
    which learns the run ids of the first and replays the spool onto the same runs."""
    tracker = Tracker(store_uri, "camp-child", tmp_path, tries=1, probe_interval_s=0.1)
    _run_campaign(tracker, tmp_path)
    assert tracker.flush(120) and not tracker.offline
    first = tracker._sender._proc
    first.kill()
    first.wait(10)
    tracker.log_metrics(SITES[2], [("steps", 7, 7)])
    tracker.end(SITES[2], "FINISHED")
    tracker.end("campaign", "FINISHED")
    assert tracker.flush(60)
    deadline = time.monotonic() + 120
    while (tracker.offline or (tmp_path / tracking.SPOOL_NAME).exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not tracker.offline and tracker._sender._proc is not first
    assert tracker.close(timeout=30)
    client = MlflowClient(tracking_uri=store_uri)
    ids = _check_campaign(client, tracker.parent_run_id)
    experiment = client.get_experiment_by_name("camp-child").experiment_id
    assert len(client.search_runs([experiment])) == 1 + len(SITES)     # none made twice
    last = client.get_run(ids[SITES[2]])
    assert last.info.status == "FINISHED" and last.data.metrics["steps"] == 7
    assert client.get_run(tracker.parent_run_id).info.status == "FINISHED"


def test_the_child_outlives_a_ctrl_c_and_ends_with_its_driver(store_uri: str, tmp_path: Path) -> None:
    """A Ctrl-C reaches the whole process group: the child ignores it (the driver's stop still ends its runs
    through it); a driver killed with SIGKILL closes the child's input, and the child exits."""
    import signal
    import subprocess

    driver = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from orchestrator.observers.tracking import Tracker\n"
        f"t = Tracker({store_uri!r}, 'camp-orphan', {str(tmp_path)!r})\n"
        "t.start_campaign('campaign', 'r', {}, {})\n"
        "assert t.flush(120)\n"
        "print(t._sender._proc.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        child = int(driver.stdout.readline())
        import os

        os.kill(child, signal.SIGINT)
        time.sleep(0.5)
        os.kill(child, 0)                     # still there
        driver.kill()
        driver.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the MLflow child outlived its killed driver")
    finally:
        driver.kill()


def test_a_run_stopped_before_its_tracker_leaves_no_mlflow_process(tmp_path: Path) -> None:
    """A campaign stopped while its targets are being built ends before it makes its tracker: the MLflow
    child started for it at the run's start ends with the run."""
    from fuzz_core.status import ExitReason
    from orchestrator.config import load_campaign
    from orchestrator.observers import tracking_process
    from orchestrator.run.campaign import EXIT_STOPPED, RunOptions, run_campaign
    from orchestrator.run.stopping import StopRun

    class StoppedWhileBuilding:
        def discover(self, specs):  # noqa: ANN001, ANN201
            raise StopRun(ExitReason.INTERRUPTED)

        def shutdown(self) -> None:
            pass

    path = tmp_path / "c.yaml"
    path.write_text(f"name: gone\ntargets:\n  - {{name: t, entry: tests/targets/faults.py:make_target}}\n"
                    f"resources: {{num_actors: 0}}\noutput: {tmp_path / 'out'}\n")
    started = []
    real = tracking_process._spawn
    tracking_process._spawn = lambda uri: started.append(real(uri)) or started[-1]
    try:
        out = run_campaign(load_campaign(path), path, RunOptions(progress=False, executor=StoppedWhileBuilding()))
    finally:
        tracking_process._spawn = real
    assert out.exit_code == EXIT_STOPPED and out.run_dir is None
    assert started and all(p.poll() is not None for p in started) and not tracking_process._STARTED


def test_a_new_store_is_a_copy_of_one_empty_store_per_mlflow_version(tmp_path: Path, monkeypatch) -> None:
    """MLflow's migrations run once per version (into the cache); a new store is a copy of that empty
    store and takes runs like a migrated one. Where the cache cannot be written, the migrations run for
    the store itself."""
    import mlflow

    monkeypatch.setenv("CDEEPFUZZ_CACHE", str(tmp_path / "cache"))
    first, second = tmp_path / "a" / "mlflow.db", tmp_path / "b" / "mlflow.db"
    tracking_sender._create_sqlite(first)
    (template,) = (tmp_path / "cache").glob(f"mlflow-{mlflow.__version__}-*.db")
    made = template.stat().st_mtime_ns
    tracking_sender._create_sqlite(second)
    assert template.stat().st_mtime_ns == made and first.read_bytes() == second.read_bytes()
    (tmp_path / "blocked").write_text("a file where the cache folder would be")
    monkeypatch.setenv("CDEEPFUZZ_CACHE", str(tmp_path / "blocked" / "cache"))
    third = tmp_path / "c" / "mlflow.db"
    tracking_sender._create_sqlite(third)
    for db in (second, third):
        client = MlflowClient(tracking_uri="sqlite:///" + db.as_posix())
        experiment = client.create_experiment("copied")
        run = client.create_run(experiment)
        client.log_metric(run.info.run_id, "loss", 1.5)
        assert client.get_run(run.info.run_id).data.metrics == {"loss": 1.5}
    assert sorted(p.name for p in tmp_path.rglob("*.init")) == []
