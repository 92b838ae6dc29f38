"""Running a campaign end to end: folders, Ray, MLflow, the controller, summary.json.

``run_campaign`` is what ``cdeepfuzz run`` calls; it returns the CLI's exit code:
0 completed with no finding, 1 findings, 2 usage or configuration error (raised
as ConfigError before anything starts), 3 a target could not be built or run.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from fuzz_core.engine import TargetSpec
from fuzz_core.io import atomic_write_json
from fuzz_core.search import SearchConfig
from fuzz_core.status import SiteStatus
from orchestrator.config import Campaign, ConfigError, cluster_mode
from orchestrator.run.controller import Controller, LoopLimits
from orchestrator.run.executors import LocalExecutor
from orchestrator.observers.progress import Progress
from orchestrator.observers.summary import now, write_summary
from orchestrator.worker import WorkerOptions

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_TARGET = 0, 1, 2, 3


@dataclass
class RunOptions:
    tracking_uri: str | None = None
    address: str | None = None
    local: bool = False             # run every site in this process (no Ray)
    progress: bool = True
    live: bool | None = None        # rich live table (default: when stderr is a TTY)
    output: str | None = None
    resume: str | None = None       # a run folder to continue
    metrics: bool = True            # export live Ray metrics (when connected to Ray)


@dataclass
class RunOutcome:
    exit_code: int
    run_dir: Path
    summary: Path
    tracking_uri: str | None
    findings: int


def explicit_tracking_uri(campaign: Campaign, cli_uri: str | None) -> str | None:
    """``--tracking-uri``, then ``tracking.uri``, then MLFLOW_TRACKING_URI; None if none is given."""
    return cli_uri or campaign.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")


def resolve_tracking_uri(campaign: Campaign, output_root: Path, cli_uri: str | None) -> str:
    """The URI given (:func:`explicit_tracking_uri`), else SQLite in the output."""
    uri = explicit_tracking_uri(campaign, cli_uri)
    if uri:
        return uri
    return "sqlite:///" + (output_root.resolve() / "mlflow.db").as_posix()


def check_cluster_settings(campaign: Campaign, output: str, uri: str | None, path: Path) -> None:
    if not cluster_mode():
        return
    if not (Path(output).is_absolute() or "://" in output):
        raise ConfigError(f"{path}: output: on a cluster (RAY_ADDRESS is set) the output must be an absolute "
                          f"path or a URI, shared by every node (got {output!r})")
    if campaign.tracking.enabled and uri and not uri.startswith(("http://", "https://", "databricks")):
        raise ConfigError(f"{path}: tracking.uri: on a cluster (RAY_ADDRESS is set) the tracking URI must be an "
                          f"MLflow server (http://...), given with --tracking-uri, tracking.uri or "
                          f"MLFLOW_TRACKING_URI (got {uri!r})")


def make_run_dir(root: Path, name: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = root / f"{name}-{stamp}"
    n = 1
    while run_dir.exists():
        n += 1
        run_dir = root / f"{name}-{stamp}-{n}"
    run_dir.mkdir(parents=True)
    return run_dir


def target_specs(campaign: Campaign) -> dict[str, TargetSpec]:
    base = os.getcwd()
    return {t.name: TargetSpec(t.name, t.entry, dict(t.args), t.framework, campaign.search.seed, base)
            for t in campaign.targets}


def run_campaign(campaign: Campaign, path: Path, options: RunOptions = RunOptions()) -> RunOutcome:
    resume_dir = Path(options.resume) if options.resume else None
    previous_run: dict = {}
    previous = None
    if resume_dir is not None:
        from orchestrator.run.resume import load_previous

        campaign, previous_run, previous = load_previous(resume_dir)
        path = Path((previous_run.get("campaign_file") or path))
    output = options.output or campaign.output
    explicit_uri = explicit_tracking_uri(campaign, options.tracking_uri)
    check_cluster_settings(campaign, output, explicit_uri, path)
    root = resume_dir.parent if resume_dir is not None else Path(output)
    local = options.local or campaign.resources.num_actors == 0
    specs = target_specs(campaign)
    executor = _local_executor(campaign) if local else _ray_executor(campaign, options.address)
    try:
        found = executor.discover(list(specs.values()))
        _raise_contract_errors(found, campaign, path)
    except BaseException:
        executor.shutdown()
        raise
    root.mkdir(parents=True, exist_ok=True)
    uri = (previous_run.get("tracking_uri") if previous_run and not explicit_uri else None) or (
        resolve_tracking_uri(campaign, root, options.tracking_uri) if campaign.tracking.enabled else None)
    run_dir = resume_dir if resume_dir is not None else make_run_dir(root, campaign.name)
    tracker = _tracker(uri, campaign, run_dir) if uri else None
    config = SearchConfig(campaign.search.strategy, campaign.search.max_steps, campaign.search.seed,
                          campaign.search.search_weights)
    started = previous_run.get("started") or now()
    t0 = time.monotonic() - float(previous_run.get("seconds") or 0)
    with Progress(campaign.name, campaign.search.max_steps, campaign.time_limit_s, options.progress,
                  options.live) as progress:
        progress.message(f"cdeepfuzz: campaign {campaign.name} -> {run_dir}" + (" (resumed)" if previous else "")
                         + (f" (MLflow: {uri})" if uri else ""))
        ctl = Controller(campaign, run_dir, executor, tracker, _store(root, campaign.name, run_dir.name),
                         progress, specs, config, LoopLimits(campaign.time_limit_s, campaign.resources.max_restarts),
                         metrics=options.metrics)

        def summary(state: str, code: int | None = None) -> Path:
            if tracker is not None:
                for rec in ctl.sites.values():
                    rec.mlflow_run_id = rec.mlflow_run_id or tracker.run_id(rec.site.id)
            run = {"folder": run_dir.as_posix(), "campaign_file": str(path), "started": started, "updated": now(),
                   "state": state, "seconds": round(time.monotonic() - t0, 3), "exit_code": code,
                   "tracking_uri": uri, "stopped": ctl.stopped_reason, "executor": "local" if local else "ray",
                   "mlflow_run_id": (tracker.run_id("campaign") if tracker else None)
                   or previous_run.get("mlflow_run_id"), "resumed": previous is not None}
            return write_summary(run_dir, {"name": campaign.name, "file": str(path),
                                           "config": campaign.model_dump()}, run,
                                 list(ctl.targets.values()), list(ctl.sites.values()))

        ctl.on_change = lambda: summary("running")
        end_status = "FAILED"
        try:
            if tracker is not None:
                from orchestrator.config import params

                tracker.start_campaign("campaign", run_dir.name, params(campaign),
                                       {"campaign": campaign.name, "run.folder": run_dir.name},
                                       run_id=previous_run.get("mlflow_run_id"))
            ctl.add_targets(found, previous)
            progress.budget = max(1, campaign.search.max_steps * len(ctl.sites))
            if tracker is not None:
                tracker.flush(10)
            summary("running")
            ctl.run()
            end_status = "KILLED" if ctl.stopped_reason == "interrupted" else "FINISHED"
        finally:
            code = exit_code(ctl)
            atomic_write_json(run_dir / "allocation.json", [a._asdict() for a in ctl.scheduler.allocation_log])
            if tracker is not None:
                tracker.set_tags("campaign", {"exit_code": str(code), "findings": str(_findings(ctl))})
                tracker.end("campaign", end_status)
                tracker.close(timeout=30, status="KILLED")
            path_summary = summary("stopped" if ctl.stopped_reason else "completed", code)
            executor.shutdown()
        progress.message(f"cdeepfuzz: {_findings(ctl)} finding(s); summary: {path_summary}")
        if uri:
            progress.message(f"cdeepfuzz: mlflow ui --backend-store-uri {uri}")
    return RunOutcome(code, run_dir, path_summary, uri, _findings(ctl))


def _raise_contract_errors(found: dict, campaign: Campaign, path: Path) -> None:
    """A factory that breaks the target contract is a configuration error: exit 2, nothing written."""
    for i, t in enumerate(campaign.targets):
        result = found.get(t.name)
        if isinstance(result, Exception) and getattr(result, "contract", False):
            raise ConfigError(f"{path}: targets[{i}] ({t.name}): {result}")


def _findings(ctl: Controller) -> int:
    return sum(1 for s in ctl.sites.values() if s.finding)


def exit_code(ctl: Controller) -> int:
    if any(t.status == "error" for t in ctl.targets.values()) or any(
            s.status is SiteStatus.ERROR for s in ctl.sites.values()):
        return EXIT_TARGET
    return EXIT_FINDINGS if _findings(ctl) else EXIT_OK


def worker_options(campaign: Campaign) -> WorkerOptions:
    return WorkerOptions(device=campaign.device, search_weights=campaign.search.search_weights,
                         num_threads=max(1, int(math.floor(campaign.resources.num_cpus))),
                         minimise=campaign.search.minimise)


def _local_executor(campaign: Campaign) -> LocalExecutor:
    return LocalExecutor(worker_options(campaign))


def _ray_executor(campaign: Campaign, address: str | None):
    from orchestrator.run.ray_runtime import ensure_ray
    from orchestrator.run.ray_executor import RayExecutor

    res = campaign.resources
    num_gpus = ensure_ray(address, res)
    return RayExecutor(worker_options(campaign), res.num_actors, res.num_cpus,
                       res.num_gpus if num_gpus else 0.0, res.max_restarts, campaign.quantum_timeout_s)


def _tracker(uri: str, campaign: Campaign, run_dir: Path):
    from orchestrator.observers.tracking import Tracker

    return Tracker(uri, campaign.name, run_dir)


def _store(root: Path, campaign: str, run: str):
    from orchestrator.observers.parquet import ParquetStore

    return ParquetStore(root, campaign, run)
