"""Cluster deployment: launcher configs, the KubeRay manifest, `ray job submit` end to end, live metrics, GPUs.

The end-to-end tests start their own Ray head (``ray start --head --block``) and MLflow
server as child processes on loopback, submit campaigns with the ``ray job submit`` CLI and
read the results back over HTTP. They never touch the Ray that other tests of the same
pytest process start in-process (``conftest.ray_session``):

- the head gets its own ``--temp-dir`` (a short folder under /tmp, for Unix socket path
  limits), so its ``ray_current_cluster`` file is not the one ``ray.init()`` reads in
  /tmp/ray: a later ``ray.init()`` in this process still starts its own Ray;
- every port is given (a free one), none left to a default another Ray may hold (the
  dashboard agent's 52365, the client server's 10001);
- this process never calls ``ray.init`` for that cluster (the CLI, HTTP and the job's own
  driver talk to it), and ``ray stop`` is never run: it kills every Ray on the machine.
  Teardown stops the jobs, sends SIGTERM to the ``ray start --block`` process (it drains
  and stops the processes it started), then SIGKILLs whatever is left in that process's
  session, which holds only processes this test started;
- ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray use 127.0.0.1 as the node address
  instead of the machine's external one: everything stays on loopback.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from records import check_run

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
BIN = Path(sys.executable).parent
SUBJECTS = {   # two torch subjects with a planted bug each, found in a few steps
    "sig": "campaigns/targets/log_one_minus_sigmoid.py",
    "softmax-mlp": "campaigns/targets/softmax_xent_mlp.py",
}
JOB_TIMEOUT_S = 150
METRIC_NAMES = ("ray_cdeepfuzz_suspect_loss", "ray_cdeepfuzz_best_loss", "ray_cdeepfuzz_site_steps",
                "ray_cdeepfuzz_steps_total", "ray_cdeepfuzz_findings_total")

pytestmark = [pytest.mark.ray, pytest.mark.slow]


# -- launcher configs ---------------------------------------------------------------------------
def _ray_schema() -> dict:
    import ray

    return json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


def _launcher_config(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


@pytest.mark.parametrize("name", ["cluster.yaml", "onprem.yaml"])
def test_launcher_config_matches_the_schema_in_the_ray_wheel(name: str):
    jsonschema = pytest.importorskip("jsonschema")
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = _launcher_config(name)
    jsonschema.validate(config, _ray_schema())
    # What `ray up` does before it starts anything: defaults filled in, then Ray's own checks
    # (head_node_type among the node types, min/max workers, on-prem head_ip and worker_ips).
    validate_config(prepare_config(copy.deepcopy(config)))


@pytest.mark.parametrize("name", ["cluster.yaml", "onprem.yaml"])
def test_launcher_config_installs_and_activates_cdeepfuzz(name: str):
    import ray

    config = _launcher_config(name)
    assert config["file_mounts"].get("~/cdeepfuzz") == ".", "the repository (campaigns included) is synced"
    assert (REPO / "campaigns" / "targets").is_dir()
    setup = "\n".join(config["setup_commands"])
    assert f'"ray[default]=={ray.__version__}"' in setup, "the cluster runs the Ray version of this checkout"
    assert "-e ~/cdeepfuzz" in setup
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        for command in config[key]:
            assert command.startswith("source ~/cdeepfuzz-venv/bin/activate && "), (key, command)
    head = " ".join(config["head_start_ray_commands"])
    assert "ray start --head" in head and "--metrics-export-port=" in head and "mlflow server" in head
    assert "MLFLOW_TRACKING_URI=http://127.0.0.1:5000" in head
    assert "--metrics-export-port=" in " ".join(config["worker_start_ray_commands"])
    if config["provider"]["type"] == "aws":
        gpu = config["available_node_types"]["gpu_worker"]["node_config"]["InstanceType"]
        assert gpu.startswith(("g4", "g5", "g6", "p3", "p4", "p5")), gpu
    else:
        assert config["provider"]["type"] == "local" and config["provider"]["worker_ips"]


# -- the KubeRay manifest -------------------------------------------------------------------------
def _manifests() -> dict[str, list[dict]]:
    docs: dict[str, list[dict]] = {}
    for doc in yaml.safe_load_all((DEPLOY / "kuberay" / "rayjob.yaml").read_text()):
        if doc:
            docs.setdefault(doc["kind"], []).append(doc)
    return docs


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_rayjob_manifest_runs_a_campaign_with_an_mlflow_server():
    import ray

    docs = _manifests()
    (job,) = docs["RayJob"]
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    entry = spec["entrypoint"]
    assert "cdeepfuzz run campaigns/" in entry
    # findings are a success through --ok-on-findings; never `|| test $? -eq 1`, which made any crash
    # that exits 1 (and exit 1 meant "findings") a SUCCEEDED job
    assert "--ok-on-findings" in entry and "test $?" not in entry
    campaign = entry.split("cdeepfuzz run ", 1)[1].split()[0]
    output = entry.split("--output ", 1)[1].split()[0]
    assert Path(output).is_absolute(), "a cluster run needs an absolute output"
    if (REPO / campaign).is_file():     # the campaign ships in the image (COPY campaigns)
        from orchestrator.config import load_campaign

        cwd = os.getcwd()
        os.chdir(REPO)
        try:
            load_campaign(REPO / campaign)
        finally:
            os.chdir(cwd)

    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"      # the submitter pod reaches it
    assert "metrics-export-port" in head["rayStartParams"]
    (head_container,) = head["template"]["spec"]["containers"]
    workers = cluster["workerGroupSpecs"]
    assert workers and all(w["groupName"] and w["maxReplicas"] >= w["minReplicas"] for w in workers)
    gpu_groups = [w for w in workers
                  if any("nvidia.com/gpu" in c["resources"].get("limits", {}) for c in w["template"]["spec"]["containers"])]
    assert gpu_groups, "a GPU worker group"
    images = {c["image"] for g in [head] + workers for c in g["template"]["spec"]["containers"]}
    assert len(images) == 1, images

    # The output lies on a volume of the head (the driver runs there and is the only writer).
    mounts = {m["mountPath"]: m["name"] for m in head_container["volumeMounts"]}
    mount = next(p for p in mounts if output == p or output.startswith(p.rstrip("/") + "/"))
    volume = next(v for v in head["template"]["spec"]["volumes"] if v["name"] == mounts[mount])
    claims = {d["metadata"]["name"] for d in docs["PersistentVolumeClaim"]}
    assert volume["persistentVolumeClaim"]["claimName"] in claims

    # MLflow: a Deployment running `mlflow server`, a Service in front of it, and the URI in
    # the job's environment pointing at that Service.
    (service,) = docs["Service"]
    (deployment,) = docs["Deployment"]
    pod = deployment["spec"]["template"]
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items())
    (mlflow,) = pod["spec"]["containers"]
    args = " ".join(mlflow.get("command", []) + mlflow.get("args", []))
    assert "mlflow server" in args and "--host=0.0.0.0" in args
    (port,) = service["spec"]["ports"]
    container_ports = {p["name"]: p["containerPort"] for p in mlflow["ports"]}
    assert container_ports[port["targetPort"]] == int(args.split("--port=", 1)[1].split()[0])
    uri = f"http://{service['metadata']['name']}:{port['port']}"
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["env_vars"]["MLFLOW_TRACKING_URI"] == uri
    assert _env(head_container)["MLFLOW_TRACKING_URI"] == uri
    allowed = args.split("--allowed-hosts=", 1)[1].split()[0].split(",")
    assert f"{service['metadata']['name']}:{port['port']}" in allowed, "MLflow 3 rejects other Host headers"


def test_grafana_dashboard_queries_the_exported_metrics():
    from orchestrator.observers import metrics

    dashboard = json.loads((DEPLOY / "grafana" / "cdeepfuzz-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {f"ray_{metrics.SUSPECT_LOSS}", f"ray_{metrics.BEST_LOSS}", f"ray_{metrics.STEPS}_total",
             f"ray_{metrics.FINDINGS}_total"}
    assert names <= set(METRIC_NAMES)                   # the names the end-to-end test sees exported
    assert all(n + "{" in " ".join(exprs) for n in names)
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "campaign"}
    readme = (DEPLOY / "README.md").read_text()
    assert exprs[0].replace('"', '\\"') in readme, "the README shows the loss panel's query"


# -- a real head, an MLflow server, `ray job submit` -----------------------------------------------
def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _get_json(url: str, timeout: float = 5) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read().decode())
    except (OSError, ValueError):
        return None


def _get_text(url: str, timeout: float = 5) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except OSError:
        return None


def _session_pids(sid: int) -> list[int]:
    """Processes of the session ``sid`` (a session this test created with setsid)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the process (leader of its own session), wait, then SIGKILL its whole session."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = _session_pids(proc.pid)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    proc.wait(5)


def _wait_until(check, timeout: float, what: str, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        for p, log in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{what}: {p.args[0]} exited with {p.returncode}:\n"
                                   + Path(log).read_text(errors="replace")[-3000:])
        time.sleep(0.5)
    raise TimeoutError(f"{what} not ready in {timeout:.0f}s")


@pytest.fixture(scope="module")
def stack():
    """A Ray head with its dashboard and metrics endpoint, and an MLflow server, on loopback."""
    from ray._private.utils import get_dashboard_dependency_error

    if get_dashboard_dependency_error() is not None:   # a missing precondition fails, never skips
        pytest.fail("needs ray[default] (pip install -e '.[cluster]') for the dashboard and `ray job submit`")
    for tool in ("ray", "mlflow", "cdeepfuzz"):
        if not (BIN / tool).exists():
            pytest.fail(f"{tool} is not installed next to {sys.executable}")

    tmp = Path(tempfile.mkdtemp(prefix="cdfc-", dir="/tmp"))     # short: Unix socket paths
    (gcs, dash, metrics, agent_http, agent_grpc, env_agent, node_mgr, obj_mgr, client, mlflow_port) = _free_ports(10)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1",
               RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               RAY_metrics_report_interval_ms="2000")
    head_log, mlflow_log = tmp / "head.log", tmp / "mlflow.log"
    head = mlflow = None
    try:
        with open(head_log, "wb") as out:
            head = subprocess.Popen(
                [str(BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats",
                 f"--temp-dir={tmp / 'ray'}", "--node-ip-address=127.0.0.1", f"--port={gcs}",
                 "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
                 f"--metrics-export-port={metrics}", f"--dashboard-agent-listen-port={agent_http}",
                 f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={env_agent}",
                 f"--node-manager-port={node_mgr}", f"--object-manager-port={obj_mgr}",
                 f"--ray-client-server-port={client}", "--num-cpus=2", "--num-gpus=0"],
                cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        with open(mlflow_log, "wb") as out:
            mlflow = subprocess.Popen(
                [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
                 "--artifacts-destination", str(tmp / "artifacts"), "--host", "127.0.0.1",
                 "--port", str(mlflow_port), "--workers", "1"],
                cwd=tmp, env=dict(env, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),   # no job runners
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        dashboard = f"http://127.0.0.1:{dash}"
        tracking = f"http://127.0.0.1:{mlflow_port}"
        procs = [(head, head_log), (mlflow, mlflow_log)]
        _wait_until(lambda: _get_json(f"{dashboard}/api/version"), 120, "the Ray dashboard", procs)
        _wait_until(lambda: _get_text(f"{tracking}/health"), 120, "the MLflow server", procs)
        yield {"tmp": tmp, "env": env, "dashboard": dashboard, "tracking": tracking,
               "metrics": f"http://127.0.0.1:{metrics}/metrics", "head_log": head_log}
    finally:
        for proc in (mlflow, head):
            if proc is not None:
                _stop(proc, grace_s=20)
        shutil.rmtree(tmp, ignore_errors=True)


def _write_job_dir(root: Path, name: str, output: Path) -> Path:
    """A small working dir for `ray job submit`: the campaign and its subjects, at their repo paths."""
    for rel in SUBJECTS.values():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / rel)
    targets = "\n".join(f"  - {{name: {n}, entry: {rel}:make_target}}" for n, rel in SUBJECTS.items())
    (root / "campaigns" / f"{name}.yaml").write_text(
        f"name: {name}\ntargets:\n{targets}\n" + textwrap.dedent(f"""\
        search: {{strategy: adaptive, max_steps: 50, seed: 0}}
        scheduler: {{policy: loss-slope, quantum: 10}}
        resources: {{num_actors: 1, num_cpus: 1, num_gpus: 0}}
        device: cpu
        time_limit_s: 120
        output: {output}
        """))
    return root


def _ray(stack, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ray"), *args], env=stack["env"], cwd=stack["tmp"], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _submit(stack, job_id: str, working_dir: Path, entrypoint: list[str], env_vars: dict | None = None) -> None:
    args = ["job", "submit", "--address", stack["dashboard"], "--submission-id", job_id,
            "--working-dir", str(working_dir), "--no-wait"]
    if env_vars:
        args += ["--runtime-env-json", json.dumps({"env_vars": env_vars})]
    done = _ray(stack, *args, "--", *entrypoint)
    assert done.returncode == 0, done.stdout + done.stderr


def _findings(text: str) -> int:
    """The count on the campaign's closing line ``cdeepfuzz: N bug(s); summary: ...`` (-1 if absent)."""
    found = re.findall(r"^cdeepfuzz: (\d+) bugs?;", text, flags=re.M)
    return int(found[-1]) if found else -1


def _cdeepfuzz_series(text: str | None, campaign: str) -> dict[str, list[str]]:
    series: dict[str, list[str]] = {}
    for line in (text or "").splitlines():
        if line.startswith("ray_cdeepfuzz_") and f'campaign="{campaign}"' in line:
            series.setdefault(line.split("{", 1)[0], []).append(line)
    return series


@pytest.fixture(scope="module")
def jobs(stack):
    """Two campaigns submitted at once: `cdeepfuzz run` as the docs show, and `cdeepfuzz run --cluster`
    (what launch.py was: it joins the cluster of this node; with metrics).

    While they run, the head's Prometheus endpoint is polled: gauges of a finished driver
    disappear from it some seconds after the driver exits (counters stay).
    """
    tmp = stack["tmp"]
    submitted = {
        # deploy/README.md's recipe: findings (exit 1) still make the job SUCCEEDED.
        "run": ("cluster-run", ["cdeepfuzz", "run", "campaigns/cluster-run.yaml", "--tracking-uri",
                                stack["tracking"], "--ok-on-findings"], None),
        # The former launch.py path: --cluster, tracking from the environment as on KubeRay.
        "launch": ("cluster-metrics", ["cdeepfuzz", "run", "campaigns/cluster-metrics.yaml", "--cluster",
                                       "--ok-on-findings", "--plain"],
                   {"MLFLOW_TRACKING_URI": stack["tracking"]}),
    }
    ids = {}
    for key, (name, entrypoint, env_vars) in submitted.items():
        work = _write_job_dir(tmp / f"job-{key}", name, tmp / "runs" / name)
        ids[key] = f"cdf-{key}-{os.getpid()}-{int(time.time())}"
        _submit(stack, ids[key], work, entrypoint, env_vars)
    info: dict[str, dict] = {}
    metrics: dict[str, list[str]] = {}     # "<campaign>/<series name>" -> lines
    wanted = ["cluster-metrics", "cluster-run"]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            for key, job_id in ids.items():
                if key not in info:
                    got = _get_json(f"{stack['dashboard']}/api/jobs/{job_id}") or {}
                    if got.get("status") in ("SUCCEEDED", "FAILED", "STOPPED"):
                        info[key] = got
            text = _get_text(stack["metrics"])
            for campaign in ("cluster-metrics", "cluster-run"):
                for k, v in _cdeepfuzz_series(text, campaign).items():
                    metrics.setdefault(f"{campaign}/{k}", v)
            if len(info) == len(ids):
                if {f"{c}/{n}" for c in wanted for n in METRIC_NAMES} <= set(metrics):
                    break
                deadline = min(deadline, time.monotonic() + 20)   # the last export comes a few seconds late
            time.sleep(1)
    finally:
        for key, job_id in ids.items():
            if key not in info:
                _ray(stack, "job", "stop", "--address", stack["dashboard"], "--no-wait", job_id)
    yield {"ids": ids, "info": info, "metrics": metrics}


def test_ray_job_submit_runs_a_campaign_tracked_in_mlflow(stack, jobs):
    job_id = jobs["ids"]["run"]
    info = jobs["info"].get("run")
    logs = _ray(stack, "job", "logs", "--address", stack["dashboard"], job_id)
    assert info is not None, f"job {job_id} did not end in {JOB_TIMEOUT_S}s:\n{logs.stdout[-3000:]}"
    assert info["status"] == "SUCCEEDED", f"{info.get('message')}\n{logs.stdout[-3000:]}"

    # `ray job logs` shows the plain progress lines, no rich table, no escape codes.
    assert logs.returncode == 0, logs.stderr
    ours = [line for line in logs.stdout.splitlines()
            if line.startswith(("[cluster-run]", "cdeepfuzz:"))]
    assert any(line.startswith("[cluster-run] steps ") for line in ours), logs.stdout[-3000:]
    assert any(" found (triggered) " in line for line in ours), logs.stdout[-3000:]
    assert not [line for line in ours if "\x1b[" in line or any(ch in line for ch in "━│┃┏┡└")]
    assert _findings(logs.stdout) >= 2, logs.stdout[-3000:]

    # The run folder is on the absolute output; the campaign itself exited 1 (findings).
    (summary_path,) = (stack["tmp"] / "runs" / "cluster-run").glob("cluster-run-*/summary.json")
    summary = check_run(summary_path.parent)
    assert summary["run"]["executor"] == "ray" and summary["run"]["exit_code"] == 1
    assert summary["run"]["tracking_uri"] == stack["tracking"]
    found = {(s["target"], s["op"]) for s in summary["sites"] if s["status"] == "found"}
    assert {("sig", "log"), ("softmax-mlp", "log")} <= found

    # The bugs are in the output folder's bug database: `cdeepfuzz bugs` lists them.
    env = {k: v for k, v in stack["env"].items() if k != "RAY_metrics_report_interval_ms"}
    bugs = subprocess.run([str(BIN / "cdeepfuzz"), "bugs", "--output", str(summary_path.parent.parent), "--json",
                           "--campaign", "cluster-run"], env=env, cwd=stack["tmp"], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert bugs.returncode == 0, bugs.stderr
    listed = json.loads(bugs.stdout)
    assert {b["signature"] for b in listed} == {b["signature"] for b in summary["bugs"]}
    assert all(b["triage"] == "new" and b["campaigns"] == ["cluster-run"] for b in listed)
    seen = {k.split("/", 1)[1] for k in jobs["metrics"] if k.startswith("cluster-run/")}
    assert set(METRIC_NAMES) <= seen, f"seen: {sorted(jobs['metrics'])}"     # `cdeepfuzz run` exports them


def test_run_cluster_joins_the_cluster_of_this_node_and_exports_metrics(stack, jobs):
    job_id = jobs["ids"]["launch"]
    info = jobs["info"].get("launch")
    logs = _ray(stack, "job", "logs", "--address", stack["dashboard"], job_id)
    assert info is not None and info["status"] == "SUCCEEDED", f"{info}\n{logs.stdout[-3000:]}"
    assert _findings(logs.stdout + logs.stderr) >= 2, logs.stdout[-3000:]
    assert "\x1b[" not in logs.stdout.split("Running entrypoint", 1)[-1], "Ray is joined without colours"
    (summary_path,) = (stack["tmp"] / "runs" / "cluster-metrics").glob("cluster-metrics-*/summary.json")
    summary = check_run(summary_path.parent)
    assert summary["run"]["exit_code"] == 1 and summary["run"]["executor"] == "ray"
    assert summary["run"]["tracking_uri"] == stack["tracking"], "tracking from MLFLOW_TRACKING_URI"

    # The head's Prometheus endpoint showed the per-site gauges and the counters.
    metrics = {k.split("/", 1)[1]: v for k, v in jobs["metrics"].items() if k.startswith("cluster-metrics/")}
    assert set(METRIC_NAMES) <= set(metrics), f"seen: {sorted(jobs['metrics'])}"
    site_ids = {s["id"] for s in summary["sites"]}
    for line in metrics["ray_cdeepfuzz_suspect_loss"]:
        assert 'target="' in line and 'op="' in line
        assert line.split('site="', 1)[1].split('"', 1)[0] in site_ids
    assert any('op="log"' in line for line in metrics["ray_cdeepfuzz_findings_total"])


def test_ray_job_stop_stops_a_running_campaign_cleanly_and_it_resumes(stack):
    """`ray job stop` sends SIGTERM: the driver records every live site as stopped (reason signal), closes
    the MLflow runs KILLED and says how to resume; the run then resumes to the end (here with --local)."""
    from mlflow.tracking import MlflowClient

    tmp = stack["tmp"]
    work = tmp / "job-stop"
    (work / "tests" / "targets").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "targets" / "faults.py", work / "tests" / "targets" / "faults.py")
    hold, mark, output = tmp / "stop-hold", tmp / "stop-mark", tmp / "runs" / "stopme"
    (work / "campaigns").mkdir()
    (work / "campaigns" / "stopme.yaml").write_text(textwrap.dedent(f"""\
        name: stopme
        targets:
          - {{name: quick, entry: tests/targets/faults.py:make_target}}
          - {{name: held, entry: tests/targets/faults.py:make_target, args: {{hold: '{hold}', mark: '{mark}', after: 4}}}}
        search: {{strategy: adaptive, max_steps: 200, seed: 0}}
        scheduler: {{policy: round-robin, quantum: 10}}
        resources: {{num_actors: 1, num_cpus: 1, num_gpus: 0}}
        device: cpu
        output: {output}
        """))
    hold.touch()
    job_id = f"cdf-stop-{os.getpid()}-{int(time.time())}"
    try:
        _submit(stack, job_id, work, ["cdeepfuzz", "run", "campaigns/stopme.yaml", "--plain"],
                {"MLFLOW_TRACKING_URI": stack["tracking"], "RAY_JOB_STOP_WAIT_TIME_S": "30"})
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not mark.exists():               # the held program waits inside a step, on the actor
            status = (_get_json(f"{stack['dashboard']}/api/jobs/{job_id}") or {}).get("status")
            assert status in (None, "PENDING", "RUNNING"), _ray(stack, "job", "logs", "--address",
                                                                 stack["dashboard"], job_id).stdout[-3000:]
            assert time.monotonic() < deadline, "the held program never started its step"
            time.sleep(0.2)
        stopped = _ray(stack, "job", "stop", "--address", stack["dashboard"], job_id, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        info = _get_json(f"{stack['dashboard']}/api/jobs/{job_id}") or {}
        assert info.get("status") == "STOPPED", info
    finally:
        hold.unlink(missing_ok=True)
        _ray(stack, "job", "stop", "--address", stack["dashboard"], "--no-wait", job_id)
    logs = _ray(stack, "job", "logs", "--address", stack["dashboard"], job_id).stdout
    (run_dir,) = output.glob("stopme-*")
    ours = [line for line in logs.splitlines() if line.startswith("cdeepfuzz:")]
    assert ours[-1].endswith(f"cdeepfuzz run --resume {run_dir}"), logs[-3000:]
    assert "*** SIGTERM received" not in logs, "Ray's abort handler ran instead of ours"
    summary = check_run(run_dir)
    run = summary["run"]
    assert (run["state"], run["exit_reason"], run["exit_code"], run["executor"]) == ("stopped", "signal", 4, "ray")
    sites = {s["target"]: s for s in summary["sites"]}
    assert (sites["quick"]["status"], sites["held"]["status"], sites["held"]["exit_reason"]) == (
        "found", "stopped", "signal")
    client = MlflowClient(stack["tracking"])
    assert client.get_run(run["mlflow_run_id"]).info.status == "KILLED"
    assert client.get_run(sites["held"]["mlflow_run_id"]).info.status == "KILLED"
    assert client.get_run(sites["quick"]["mlflow_run_id"]).info.status == "FINISHED"

    env = {k: v for k, v in stack["env"].items() if k != "RAY_metrics_report_interval_ms"}
    resumed = subprocess.run([str(BIN / "cdeepfuzz"), "run", "--resume", str(run_dir), "--local", "--plain"],
                             cwd=work, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    after = check_run(run_dir)
    assert after["run"]["state"] == "completed" and after["run"]["mlflow_run_id"] == run["mlflow_run_id"]
    assert {s["status"] for s in after["sites"]} == {"found"}
    assert client.get_run(run["mlflow_run_id"]).info.status == "FINISHED"


# -- `cdeepfuzz run` on a cluster, without one ------------------------------------------------------
def test_run_has_the_former_launch_options():
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    for option in ("--cluster", "--project-dir", "--ok-on-findings", "--no-metrics", "--address", "--resume"):
        assert option in done.stdout, option
    assert not (REPO / "orchestrator" / "launch.py").exists(), "one argument parser: cdeepfuzz run"


def test_run_finds_the_campaign_in_the_synced_project(tmp_path: Path, monkeypatch):
    from orchestrator.commands import run as launch

    home = tmp_path / "home"
    project = home / "cdeepfuzz"
    (project / "campaigns").mkdir(parents=True)
    (project / "campaigns" / "c.yaml").write_text("name: c\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("CDEEPFUZZ_PROJECT_DIR", raising=False)
    monkeypatch.chdir(home)
    assert launch.locate("campaigns/c.yaml") == (project.resolve(), Path("campaigns/c.yaml"))
    monkeypatch.chdir(project)
    assert launch.locate("campaigns/c.yaml") == (project.resolve(), Path("campaigns/c.yaml"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CDEEPFUZZ_PROJECT_DIR", str(project))
    assert launch.locate("campaigns/c.yaml")[0] == project.resolve()
    with pytest.raises(FileNotFoundError):
        launch.locate("campaigns/missing.yaml")
    assert launch.default_output("runs") == str(home / "cdeepfuzz-runs")
    assert launch.default_output("/data/runs") == "/data/runs"
    assert launch.default_output("s3://bucket/runs") == "s3://bucket/runs"


def test_run_refuses_a_cluster_run_without_an_mlflow_server(tmp_path: Path):
    _write_job_dir(tmp_path, "no-server", tmp_path / "runs")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "CDEEPFUZZ_PROJECT_DIR")}
    for args, message in ((["campaigns/no-server.yaml", "--address", "auto"], "MLflow server"),
                          (["campaigns/missing.yaml", "--cluster"], "no such campaign file")):
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists(), "nothing is written before the checks pass"


# -- metrics without a cluster -----------------------------------------------------------------------
def test_campaign_metrics_are_a_no_op_without_ray(monkeypatch):
    from orchestrator.observers import metrics as m

    monkeypatch.setattr(m, "ray_connected", lambda: False)
    cm = m.CampaignMetrics("offline")
    cm.quantum({"id": "abc", "target": "t", "op": "log"}, 1.0, 0.5, 10)
    cm.finding({"id": "abc", "target": "t", "op": "log"})
    assert not cm.active


def test_campaign_metrics_disabled_export_nothing_even_with_ray(monkeypatch):
    """``cdeepfuzz run --no-metrics`` reaches the metrics observer as CampaignMetrics(enabled=False)."""
    from orchestrator.observers import metrics as m

    made = []
    monkeypatch.setattr(m, "ray_connected", lambda: True)
    monkeypatch.setattr(m, "_make_instruments", lambda: made.append(1) or {})
    off = m.CampaignMetrics("quiet", enabled=False)
    off.quantum({"id": "abc", "target": "t", "op": "log"}, 1.0, 0.5, 10)
    off.finding({"id": "abc", "target": "t", "op": "log"})
    assert not off.active and made == []
    assert m.CampaignMetrics("loud").active


# -- GPUs (run on a CUDA machine; skipped elsewhere) ---------------------------------------------------
def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


needs_cuda = pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_gpu_share_caps_the_process_memory():
    script = textwrap.dedent("""
        import torch
        from orchestrator.run.ray_executor import _with_gpu_share
        from orchestrator.worker import WorkerOptions

        _with_gpu_share(WorkerOptions(device="cuda"))
        if hasattr(torch.cuda, "get_per_process_memory_fraction"):
            assert abs(torch.cuda.get_per_process_memory_fraction(0) - 0.25) < 1e-6
        total = torch.cuda.get_device_properties(0).total_memory
        small = torch.empty(int(0.10 * total), dtype=torch.uint8, device="cuda")
        try:
            torch.empty(int(0.40 * total), dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            print("capped")
        else:
            print("not capped")
    """)
    env = dict(os.environ, CDEEPFUZZ_GPU_SHARE="0.25")   # a process of its own: the cap is per process
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "capped"


@pytest.mark.gpu
@needs_cuda       # at collection: no session Ray is started only to skip
def test_fractional_gpu_actors_place_their_targets_on_their_gpu(ray_session):
    import ray

    from fuzz_core.engine import TargetSpec
    from orchestrator.run.ray_executor import RayExecutor
    from orchestrator.worker import WorkerOptions

    spec = TargetSpec("sig", f"{SUBJECTS['sig']}:make_target", {}, None, 0, str(REPO))
    executor = RayExecutor(WorkerOptions(device="cuda"), num_actors=2, num_cpus=0.5, num_gpus=0.5,
                           max_restarts=0, quantum_timeout_s=120)
    try:
        found = executor.discover([spec])
        assert not isinstance(found["sig"], Exception), found["sig"]

        def placement(actor_self):
            import os as _os

            import torch as _torch

            runner = actor_self.worker.runner(spec)
            params = [p.device.type for p in runner.target.model.parameters()] if getattr(
                getattr(runner, "target", None), "model", None) is not None else []
            frac = (_torch.cuda.get_per_process_memory_fraction(0)
                    if hasattr(_torch.cuda, "get_per_process_memory_fraction") else None)
            return {"device": str(runner.device), "params": params, "visible": _os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "gpu_ids": [str(i) for i in ray.get_gpu_ids()], "fraction": frac}

        for got in ray.get([a.__ray_call__.remote(placement) for a in executor.actors], timeout=120):
            assert got["device"].startswith("cuda"), got
            assert all(d == "cuda" for d in got["params"]), got
            assert got["visible"] == ",".join(got["gpu_ids"]), got      # Ray pinned the actor to its GPU
            if got["fraction"] is not None:
                assert abs(got["fraction"] - 0.5) < 1e-6, got
    finally:
        executor.shutdown()


# -- placement: actors sharing GPUs are packed (logical GPUs) ------------------------------------------
def test_gpu_actors_are_packed_in_a_placement_group(ray_session):
    import ray
    from ray.util import placement_group_table

    from orchestrator.run.ray_executor import RayExecutor
    from orchestrator.worker import WorkerOptions

    executor = RayExecutor(WorkerOptions(device="cpu"), num_actors=2, num_cpus=0.5, num_gpus=0.5,
                           max_restarts=0, quantum_timeout_s=60)
    group = getattr(executor, "placement_group", None)
    try:
        if group is None:
            pytest.skip("RayExecutor does not place GPU actors in a placement group yet")
        table = placement_group_table(group)
        assert table["strategy"] == "PACK" and table["state"] == "CREATED"
        assert [b["GPU"] for b in table["bundles"].values()] == [0.5, 0.5]
        assert len(set(table["bundles_to_node_id"].values())) == 1
        ids = ray.get([a.gpu_ids.remote() for a in executor.actors], timeout=60)
        assert len({str(i[0]) for i in ids}) == 1          # both halves of the same logical GPU
    finally:
        executor.shutdown()
    assert placement_group_table(group)["state"] == "REMOVED"
