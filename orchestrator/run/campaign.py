"""Running a campaign end to end: the run folder and its state store, Ray or the driver alone, the
observers, the reuse phase, the controller, and the exit code.

``run_campaign`` is what ``cdeepfuzz run`` calls; it returns the CLI's exit code (:data:`EXIT_CODES`):

- 0 the campaign completed and found no bug;
- 1 it completed and found at least one bug;
- 2 a usage or configuration error (raised as :class:`ConfigError` before anything starts);
- 3 a target could not be built or its program raised (3 wins over 1);
- 4 stopped before completion (SIGTERM, SIGINT / Ctrl-C, or ``time_limit_s``): resume it with
  ``cdeepfuzz run --resume RUN_FOLDER`` (4 wins over 3 and 1);
- 5 an internal error of CDeepFuzz itself (a bug to report; 5 wins over everything).
"""
from __future__ import annotations

import logging
import math
import os
import sqlite3
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from fuzz_core.engine import TargetSpec
from fuzz_core.io import atomic_write_json
from fuzz_core.search import SearchConfig
from fuzz_core.status import ExitReason, RunState, SiteStatus
from orchestrator.config import Campaign, ConfigError, check_cluster_settings, parse_campaign, resolve_tracking_uri
from orchestrator.observers.base import Observer, Observers
from orchestrator.observers import tracking_process
from orchestrator.observers.tracking_sender import SPOOL_NAME
from orchestrator.phases import mark
from orchestrator.run import failures
from orchestrator.run.controller import Controller, LoopLimits
from orchestrator.run.executors import LocalExecutor
from orchestrator.run.records import RunRecord
from orchestrator.run.state import FILENAME as STATE_DB
from orchestrator.run.state import RunStore, StoreError, now
from orchestrator.run.stopping import StopRequest, StopRun
from orchestrator.worker import WorkerOptions

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_TARGET, EXIT_STOPPED, EXIT_INTERNAL = 0, 1, 2, 3, 4, 5
EXIT_CODES = {
    EXIT_OK: "completed, no bug found",
    EXIT_FINDINGS: "completed, bugs found",
    EXIT_USAGE: "usage or configuration error (nothing started)",
    EXIT_TARGET: "a target could not be built or its program raised",
    EXIT_STOPPED: "stopped before completion (SIGTERM, SIGINT, time limit): resume with --resume",
    EXIT_INTERNAL: "internal error of CDeepFuzz (a bug: please report it)",
}
ALLOCATION = "allocation.json"
STOP_CLOSE_S = 2.0        # MLflow's close under a stop: what is left is spooled (cdeepfuzz sync), not lost
CLOSE_S = 30.0


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
    known_bugs: bool = True         # the reuse phase: replay the known bugs of the targets first
    observers: list[Observer] = field(default_factory=list)   # more subscribers (benchmarks, tests)
    executor: Any = None            # what runs the quanta (default: Ray's actors, or this process): a
                                    # benchmark's simulated actors measure the driver alone


@dataclass
class RunOutcome:
    exit_code: int
    run_dir: Path | None
    summary: Path | None
    tracking_uri: str | None
    bugs: int                       # the run's bugs (distinct signatures; summary.json lists their findings)
    state: RunState = RunState.COMPLETED
    exit_reason: ExitReason = ExitReason.COMPLETED
    driver: dict = field(default_factory=dict)   # the driver's own bookkeeping: quanta, status changes, seconds


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


def worker_options(campaign: Campaign) -> WorkerOptions:
    return WorkerOptions(device=campaign.device, search_weights=campaign.search.search_weights,
                         num_threads=max(1, int(math.floor(campaign.resources.num_cpus))),
                         minimise=campaign.search.minimise, input_range=campaign.search.input_range,
                         precision=campaign.precision.options())


def search_config(campaign: Campaign) -> SearchConfig:
    return SearchConfig(campaign.search.strategy, campaign.search.max_steps, campaign.search.seed,
                        campaign.search.search_weights)


def load_resumable(run_dir: Path) -> tuple[Campaign, RunStore, RunRecord]:
    """The campaign, store and run record of a run folder to resume (ConfigError when it is not one)."""
    if not (run_dir / STATE_DB).is_file():
        raise ConfigError(f"{run_dir}: not a run folder of this CDeepFuzz (no {STATE_DB}; runs written by an "
                          f"older version cannot be resumed)")
    try:
        store = RunStore(run_dir / STATE_DB)
        record = store.run()
    except (StoreError, OSError, ValueError, sqlite3.Error) as exc:
        raise ConfigError(f"{run_dir / STATE_DB}: cannot read it: {exc}") from None
    if record.state is RunState.COMPLETED:
        store.close()
        raise ConfigError(f"{run_dir}: the run completed; nothing to resume")
    return parse_campaign(record.config, run_dir / STATE_DB), store, record


def run_campaign(campaign: Campaign | None, path: Path | None, options: RunOptions = RunOptions()) -> RunOutcome:
    """Run (or resume) a campaign; SIGTERM and SIGINT stop it cleanly while it runs."""
    stop = StopRequest()
    with stop.installed():
        try:
            return _run(campaign, path, options, stop)
        finally:
            tracking_process.discard()     # an MLflow child no tracker took over (the run ended before it)


def _run(campaign: Campaign | None, path: Path | None, options: RunOptions, stop: StopRequest) -> RunOutcome:
    resume_dir = Path(options.resume) if options.resume else None
    store: RunStore | None = None
    previous: RunRecord | None = None
    if resume_dir is not None:
        campaign, store, previous = load_resumable(resume_dir)
        path = Path(previous.campaign_file or resume_dir)
    assert campaign is not None and path is not None
    output = options.output or campaign.output
    uri = (resolve_tracking_uri(options.tracking_uri, campaign=campaign, run_dir=resume_dir,
                                output=None) if campaign.tracking.enabled else None)
    check_cluster_settings(campaign, output, uri, path)
    root = resume_dir.parent if resume_dir is not None else Path(output)
    if campaign.tracking.enabled:      # MLflow's import and store set-up beside Ray's start and discovery
        tracking_process.start(uri or resolve_tracking_uri(None, output=root))
    local = options.local or campaign.resources.num_actors == 0
    specs = target_specs(campaign)
    executor = options.executor or (LocalExecutor(worker_options(campaign), campaign.quantum_timeout_s, stop)
                                    if local else _ray_executor(campaign, options.address, stop))
    mark("local executor" if local else "Ray started, actors asked for")
    found: dict = {}
    if previous is None:
        try:
            found = executor.discover(list(specs.values()))
            mark("targets built, sites found")
        except StopRun as exc:
            executor.shutdown()
            print(f"cdeepfuzz: stopped ({exc.reason.value}) while discovering the targets' sites; no run folder was "
                  f"made: run the campaign again", flush=True)
            return RunOutcome(EXIT_STOPPED, None, None, None, 0, RunState.STOPPED, exc.reason)
        except BaseException:
            executor.shutdown()
            raise
        root.mkdir(parents=True, exist_ok=True)
        run_dir = make_run_dir(root, campaign.name)
        store = RunStore(run_dir / STATE_DB)
    else:
        run_dir = resume_dir
    if hasattr(executor, "bind_run_folder"):      # actors that see the run folder write into it themselves
        executor.bind_run_folder(run_dir)
    if campaign.tracking.enabled and uri is None:
        uri = resolve_tracking_uri(None, output=root)
    record = previous or RunRecord(campaign.name, str(path), campaign.model_dump(), run_dir.as_posix(), now(),
                                   "local" if local else "ray", tracking_uri=uri)
    if previous is not None:
        record.resumed += 1
        record.state, record.exit_reason, record.exit_code = RunState.RUNNING, ExitReason.NONE, None
        record.error = record.traceback = None
        record.tracking_uri = uri
    store.put_run(record)
    began = time.monotonic()               # time_limit_s counts from here: a resumed run gets it again
    t0 = began - record.seconds            # run.seconds adds up over resumes
    observers, view, summary_writer, tracking = _observers(campaign, run_dir, root, store, record, uri, options, t0)
    mark("run folder, store, observers")
    config = search_config(campaign)
    ctl = Controller(campaign, run_dir, executor, specs, config,
                     LoopLimits(campaign.time_limit_s, campaign.resources.max_restarts), store, record,
                     observers, stop)
    with view:
        observers.message(f"cdeepfuzz: campaign {campaign.name} -> {run_dir}" + (" (resumed)" if previous else "")
                          + (f" (MLflow: {uri})" if uri else ""))
        try:
            observers.run_started(record, previous is not None)
            if previous is None:
                ctl.add_targets(found)
                mark("sites registered (MLflow runs created)")
                if options.known_bugs:
                    from orchestrator.run.reuse import replay_known_bugs

                    replay_known_bugs(ctl, root)
            else:
                ctl.restore()
            mark("known bugs replayed" if previous is None else "run restored")
            ctl.run(started=began)
            mark("search and confirmation")
            record.state = RunState.STOPPED if stop.reason else RunState.COMPLETED
            record.exit_reason = stop.reason or ExitReason.COMPLETED
        except (StopRun, KeyboardInterrupt) as exc:     # before the loop (the reuse phase)
            reason = exc.reason if isinstance(exc, StopRun) else ExitReason.INTERRUPTED
            stop.request(reason)
            ctl.run(started=began)         # records every live site as stopped
            record.state, record.exit_reason = RunState.STOPPED, reason
        except Exception as exc:  # noqa: BLE001 - CDeepFuzz itself failed: say so, keep what was written
            record.state, record.exit_reason = RunState.FAILED, ExitReason.INTERNAL_ERROR
            record.error = f"{type(exc).__name__}: {exc}"
            record.traceback = traceback.format_exc()
            log.debug("internal error", exc_info=True)
            try:
                stop.request(ExitReason.INTERNAL_ERROR)
                ctl.run(started=began)
            except Exception:  # noqa: BLE001
                log.exception("could not record the live sites as stopped")
        finally:
            summary = _finish(ctl, record, store, run_dir, t0, observers, summary_writer, tracking, stop)
            executor.shutdown()
            ctl.close()
            store.close()
            mark("run closed (MLflow, summary.json)")
        code = record.exit_code
        for line in _closing_lines(ctl, record, run_dir, summary, uri, observers):
            observers.message(line)
    driver = {"sites": len(ctl.sites), "quanta": ctl.quanta, "driver_seconds": round(ctl.driver_seconds, 4),
              "loop_seconds": round(ctl.loop_seconds, 4),
              "status_changes": ctl.status_changes, "status_seconds": round(ctl.status_seconds, 4),
              "summary_writes": summary_writer.writes, "summary_seconds": round(summary_writer.write_seconds, 4)}
    return RunOutcome(code, run_dir, summary, uri, ctl.bugs(), record.state, record.exit_reason, driver)


def _finish(ctl: Controller, record: RunRecord, store: RunStore, run_dir: Path, t0: float, observers: Observers,
            summary_writer, tracking, stop: StopRequest) -> Path:
    """Record the end: targets' roll-up, exit code, allocation.json; the observers end (MLflow runs closed,
    within seconds under a stop: what is left is spooled); the MLflow ids are persisted; summary.json last."""
    ctl.finish_targets()
    record.exit_code = exit_code(ctl, record)
    record.seconds = round(time.monotonic() - t0, 3)
    store.put_run(record)
    atomic_write_json(run_dir / ALLOCATION, [a._asdict() for a in ctl.scheduler.allocation_log])
    observers.run_ended(record)
    if tracking is not None:
        tracker, observer = tracking
        tracker.close(timeout=STOP_CLOSE_S if stop.reason else CLOSE_S, status="KILLED")
        observer.refresh_ids()
        ctl.save_records()
    return summary_writer.write()


def _closing_lines(ctl: Controller, record: RunRecord, run_dir: Path, summary: Path, uri: str | None,
                   observers: Observers) -> list[str]:
    bugs = ctl.bugs()
    lines = [f"cdeepfuzz: {bugs} bug{'' if bugs == 1 else 's'}; summary: {summary}"]
    verdict = _expectation(summary)
    if verdict is not None and record.state is RunState.COMPLETED:
        if verdict["met"]:
            lines.append(f"cdeepfuzz: as this campaign expects: {'; '.join(verdict['expected']) or 'no bug'}")
        else:
            lines.append("cdeepfuzz: NOT as this campaign expects:"
                         + "".join(f" missing {m};" for m in verdict["missing"])
                         + "".join(f" unexpected {u};" for u in verdict["unexpected"]))
    if observers.failures:
        lines.append(f"cdeepfuzz: warning: some records could not be written ({observers.failures}); "
                     f"the run-state store {run_dir / STATE_DB} has everything")
    if uri:
        lines.append(tracking_line(uri, run_dir))
    spooled = spooled_operations(run_dir)
    if spooled:
        lines.append(f"cdeepfuzz: {spooled} MLflow operation(s) were spooled while the tracking server did not "
                     f"answer ({run_dir / SPOOL_NAME}); send them with: cdeepfuzz sync {run_dir}")
    if record.state is RunState.FAILED:
        lines.append(f"cdeepfuzz: INTERNAL ERROR: {record.error} ({failures.BUG_REPORT} in {summary})")
    if record.state in (RunState.STOPPED, RunState.FAILED):
        why = ctl.stop_request.signal_name or record.exit_reason.value
        lines.append(f"cdeepfuzz: stopped before completion ({why}, exit code {record.exit_code}); "
                     f"continue with: cdeepfuzz run --resume {run_dir}")
    return lines


def _expectation(summary: Path) -> dict | None:
    from fuzz_core.io import read_json

    try:
        return read_json(summary).get("expect")
    except (OSError, ValueError):
        return None


def tracking_line(uri: str, run_dir: Path | None = None) -> str:
    """Where to look at the run in MLflow: a server is opened in a browser; a local store has no server:
    ``cdeepfuzz ui`` starts one on it, at the campaign's experiment."""
    if uri.startswith(("http://", "https://")):
        return f"cdeepfuzz: MLflow: open {uri} in a browser"
    if uri.startswith(("sqlite:", "file:")) or "://" not in uri and not uri.startswith("databricks"):
        return f"cdeepfuzz: MLflow: cdeepfuzz ui {run_dir}" if run_dir else f"cdeepfuzz: MLflow: cdeepfuzz ui"
    return f"cdeepfuzz: MLflow tracking: {uri}"              # databricks, postgresql://, ...: the store's own UI


def spooled_operations(run_dir: Path) -> int:
    """MLflow operations of this run still in its spool (not sent: ``cdeepfuzz sync`` sends them)."""
    try:
        with open(run_dir / SPOOL_NAME, encoding="utf-8") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0


def exit_code(ctl: Controller, record: RunRecord) -> int:
    """5 internal error, else 4 stopped, else 3 a target failed, else 1 findings, else 0."""
    reasons = {t.exit_reason for t in ctl.targets.values()} | {
        s.exit_reason for s in ctl.sites.values() if s.status is SiteStatus.ERROR}
    if record.state is RunState.FAILED or ExitReason.INTERNAL_ERROR in reasons:
        return EXIT_INTERNAL
    if record.state is RunState.STOPPED:
        return EXIT_STOPPED
    if (any(t.status is SiteStatus.ERROR for t in ctl.targets.values())
            or any(s.status is SiteStatus.ERROR for s in ctl.sites.values())):
        return EXIT_TARGET
    return EXIT_FINDINGS if ctl.bugs() else EXIT_OK


def _observers(campaign: Campaign, run_dir: Path, root: Path, store: RunStore, record: RunRecord,
               uri: str | None, options: RunOptions, t0: float):
    from orchestrator.observers.exporter import Exporter
    from orchestrator.observers.metrics import MetricsObserver
    from orchestrator.observers.progress import LiveView
    from orchestrator.observers.summary import SummaryObserver

    view = LiveView(campaign.name, campaign.search.max_steps, campaign.time_limit_s, options.progress, options.live,
                    started=t0)
    summary = SummaryObserver(run_dir, store, record, started=t0)
    chain: list[Observer] = [summary, MetricsObserver(campaign.name, options.metrics)]
    tracking = mlflow = None
    if uri:
        from orchestrator.observers.mlflow import MlflowObserver
        from orchestrator.observers.tracking import Tracker

        tracker = Tracker(uri, campaign.name, run_dir)
        mlflow = MlflowObserver(tracker, campaign, run_dir, root, record)
        tracking = (tracker, mlflow)
    # before the MLflow observer: its last export sends the curves before the runs end
    chain.append(Exporter(run_dir, root, campaign.name, campaign.search.strategy, mlflow, summary))
    chain += [o for o in (mlflow, view, *options.observers) if o is not None]
    return Observers(chain), view, summary, tracking


def _ray_executor(campaign: Campaign, address: str | None, stop: StopRequest):
    from orchestrator.run.ray_executor import RayExecutor
    from orchestrator.run.ray_runtime import ensure_ray

    res = campaign.resources
    num_gpus = ensure_ray(address, res)
    stop.reinstall()          # ray.init replaced SIGTERM's handler with one that aborts (exit 134)
    return RayExecutor(worker_options(campaign), res.num_actors, res.num_cpus,
                       res.num_gpus if num_gpus else 0.0, res.max_restarts, campaign.quantum_timeout_s, stop)
