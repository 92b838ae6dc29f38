"""The controller: the only writer. It turns scheduler decisions into executor tasks and records
every change in the run-state store before its observers hear of it.

Per quantum result, in this order: the finding folder (atomic, written once), the checkpoint
when one came (a new file per step), then one transaction of the run-state store (the site's
steps, losses, status, checkpoint reference and the quanta run since it, and the scheduler call
that reported it), then the observers (summary.json, MLflow, Parquet, the bug store, metrics,
the terminal). A site's status changes in :meth:`Controller.set_status` alone, and a final
status never changes again (except ``stopped``, which a resume reopens): each site run is
ended once.

Every call to the scheduler is logged in the store, in the same transaction as what caused
it, and a snapshot of its state is stored at a cadence with the log position it reflects, so
a resumed campaign reloads the scheduler (the snapshot, then the few calls logged after it:
it is pure) and re-dispatches the quanta that were in flight: it goes on exactly as the
uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from fuzz_core.engine import TargetSpec
from fuzz_core.findings import finding_folder, write_finding
from fuzz_core.io import load_arrays, read_json
from fuzz_core.search import SearchConfig
from fuzz_core.sites import OpSite
from fuzz_core.status import ExitReason, SiteStatus
from orchestrator.observers.base import Observer
from orchestrator.run import failures
from orchestrator.run.executors import ActorDied, QuantumTimeout, Task
from orchestrator.run.records import FindingRecord, RunRecord, SiteRecord, TargetRecord, at_site, target_rollup
from orchestrator.run.state import RunStore
from orchestrator.run.stopping import StopRequest, StopRun
from orchestrator.scheduler import Action, Allocation, SiteProgress, make_scheduler
from orchestrator.worker import QuantumOutcome, Resume, RunFolder, TargetFailure, save_checkpoint

log = logging.getLogger(__name__)

MAX_TIMEOUTS = 2      # quanta over their time limit before a site is retired as timeout
WAIT_S = 0.5
PERSIST_S = 5.0       # how often what observers learned (MLflow run ids) is persisted
SNAPSHOT_CALLS = 256  # scheduler calls between two snapshots of its state (at least; and at least one per site)
CHECKPOINTS = "checkpoints"
FINDINGS = "findings"
# A site's checkpoint is asked for once it has run this many quanta, or this many seconds of search,
# since its last one: a worker that does not hold the site live (a resume, a restarted or another actor)
# runs those quanta again from the checkpoint, so its model and optimizer state need not travel at
# every quantum.
CHECKPOINT_QUANTA = 8
CHECKPOINT_S = 60.0


@dataclass
class LoopLimits:
    time_limit_s: float
    max_deaths: int


def scheduler_options(campaign) -> dict:
    """The policy options a campaign implies: loss-slope's ``horizon`` is the campaign's, else 1
    with the adaptive strategy (its bugs trigger within a few dozen steps, so a site too slow to
    reach its edge within its budget is rarely one) and unlimited with the others (grist's small
    fixed steps make a bug's loss fall slowly for hundreds of steps before it jumps to 0)."""
    if campaign.scheduler.policy != "loss-slope":
        return {}
    horizon = campaign.scheduler.horizon
    if horizon is None and campaign.search.strategy == "adaptive":
        horizon = 1.0
    return {"horizon": horizon}


class RecordedScheduler:
    """The campaign's scheduler, with every call logged in the run-state store (for exact resume), and
    a snapshot of its ``state()`` at a cadence: a resume restores the latest snapshot and replays only
    the calls logged after it.

    Each call, its log row and (when due) the snapshot are written in one transaction, so the snapshot
    and the log position it reflects always agree. A snapshot is due every ``SNAPSHOT_CALLS`` calls,
    or every as many calls as there are sites when there are more: ``state()`` costs O(sites), so the
    cost per call stays flat at any size (a snapshot at every status change would be O(sites) each,
    O(sites^2) per campaign), and the suffix a resume replays stays short. The controller also takes
    one when live sites are stopped, at the end, and after a resume."""

    def __init__(self, scheduler, store: RunStore) -> None:
        self.scheduler, self.store = scheduler, store
        self._earlier: list[Allocation] = []     # the grants before the snapshot a resume restored
        self._since = 0                          # calls logged since the last snapshot

    def add_site(self, site_id: str, steps_used: int = 0) -> None:
        with self.store.transaction():
            self.scheduler.add_site(site_id, steps_used=steps_used)
            self._logged("add_site", {"site_id": site_id, "steps_used": steps_used})

    def on_progress(self, progress: SiteProgress) -> None:
        with self.store.transaction():
            self.scheduler.on_progress(progress)
            self._logged("on_progress", {**progress.__dict__, "losses": list(progress.losses)})

    def retire(self, site_id: str, status: str) -> None:
        with self.store.transaction():
            self.scheduler.retire(site_id, status)
            self._logged("retire", {"site_id": site_id, "status": status})

    def allocate(self, free_slots: int):
        with self.store.transaction():
            decisions = self.scheduler.allocate(free_slots)
            self._logged("allocate", {"free_slots": free_slots, "grants": _grants(decisions)})
        return decisions

    def _logged(self, call: str, args: dict[str, Any]) -> None:
        self.store.log_call(call, args)
        self._since += 1
        if self._since >= max(SNAPSHOT_CALLS, self.scheduler.registered):
            self.snapshot()

    @property
    def done(self) -> bool:
        return self.scheduler.done

    @property
    def allocation_log(self) -> list[Allocation]:
        """Every grant of the campaign (the resumed parts included), in order."""
        return self._earlier + self.scheduler.allocation_log

    def snapshot(self) -> None:
        """Store the scheduler's ``state()`` at the log's current position (in the open transaction)."""
        self.store.put_scheduler_state(self.scheduler.policy, self.store.log_position, self.scheduler.state())
        self._since = 0

    def reload(self, fresh: Callable[[], Any]) -> str:
        """Rebuild the scheduler from the store: the latest snapshot and the calls logged after it; the
        whole log when there is no snapshot (a store written before snapshots had a position), or when it
        cannot be used (corrupt, from another configuration, or the suffix does not replay to the grants
        it logged): then with a warning, from ``fresh()``. Says which it did ("snapshot" or "log")."""
        reason = None
        try:
            snap = self.store.scheduler_state()
        except ValueError as exc:
            snap, reason = None, f"its text is not JSON ({exc})"
        position = snap[1] if snap is not None else None
        if snap is not None and position is not None:
            try:
                earlier = self.store.grants(position)
                if earlier is None:
                    log.info("the run-state store logged grants only after the scheduler snapshot at call %s: "
                             "replaying the whole log", position)
                else:
                    self._restore(snap[0], position, snap[2], earlier)
                    return "snapshot"
            except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            self.scheduler, self._earlier = fresh(), []
        if reason is not None:
            log.warning("the scheduler snapshot of %s cannot be used (%s): rebuilding the scheduler by "
                        "replaying its whole log", self.store.path, reason)
        calls = self.store.scheduler_log()
        replay_scheduler(self.scheduler, calls)
        self._since = len(calls)
        return "log"

    def _restore(self, policy: str, position: int, state: Any, earlier: list[tuple[str, int]]) -> None:
        if policy != self.scheduler.policy:
            raise ValueError(f"it was taken of a {policy!r} scheduler, this campaign's is {self.scheduler.policy!r}")
        if not 0 <= position <= self.store.log_position:
            raise ValueError(f"its position {position} is past the log's end ({self.store.log_position})")
        self.scheduler.restore(state)
        calls = self.store.scheduler_log(after=position)
        replay_scheduler(self.scheduler, calls, check=True)
        total, self._earlier = 0, []
        for site_id, steps in earlier:
            total += steps
            self._earlier.append(Allocation(site_id, steps, total))
        self._since = len(calls)


@dataclass(frozen=True)
class CheckpointFile:
    """A site's checkpoint in the run folder, read only when a worker needs it (``Resume.source``)."""

    path: Path

    def load(self):
        meta_path = self.path.with_suffix(".json")
        if not (self.path.is_file() and meta_path.is_file()):
            raise FileNotFoundError(f"{self.path}: the checkpoint the run-state store names is missing")
        return load_arrays(self.path), read_json(meta_path)


def _grants(decisions) -> list[list[Any]]:
    """The grants among an allocation's decisions, as the log records them: [site id, steps]."""
    return [[d.site_id, d.steps] for d in decisions if not d.action.retires]


def replay_scheduler(scheduler, calls: list[tuple[str, dict[str, Any]]], check: bool = False) -> None:
    """Rebuild a scheduler's state by making again, in order, every call a run logged; with ``check``, an
    allocation that does not make the grants the log recorded is an error (a ValueError)."""
    for call, args in calls:
        if call == "on_progress":
            args = {**args, "losses": tuple(args.get("losses") or ())}
            scheduler.on_progress(SiteProgress(**args))
        elif call == "allocate":
            grants = _grants(scheduler.allocate(args["free_slots"]))
            if check and "grants" in args and grants != args["grants"]:
                raise ValueError(f"a replayed allocation granted {grants}, the log recorded {args['grants']}")
        elif call == "add_site":
            scheduler.add_site(args["site_id"], steps_used=args["steps_used"])
        elif call == "retire":
            scheduler.retire(args["site_id"], args["status"])
        else:
            raise ValueError(f"unknown scheduler call {call!r} in the run-state store")


class Controller:
    def __init__(self, campaign, run_dir: Path, executor, specs: dict[str, TargetSpec], config: SearchConfig,
                 limits: LoopLimits, store: RunStore, run: RunRecord, observers: Observer | None = None,
                 stop: StopRequest | None = None) -> None:
        self.campaign = campaign
        self.run_dir = Path(run_dir)
        self._absolute = self.run_dir.resolve().as_posix()
        self.executor = executor
        self.specs = specs
        self.config = config
        self.limits = limits
        self.store = store
        self.record = run
        self.observers = observers if observers is not None else Observer()
        self.stop_request = stop if stop is not None else StopRequest()
        self.targets: dict[str, TargetRecord] = {}
        self.sites: dict[str, SiteRecord] = {}
        self._order: dict[str, int] = {}
        self.scheduler = RecordedScheduler(self._new_scheduler(), store)
        self._events: list[Callable[[], None]] = []
        self._garbage: list[str] = []     # checkpoints to delete once the transaction that replaced them commits
        self._depth = 0
        self._reported = True          # a report since the last allocate: retirements may be pending
        self._resubmit: list[SiteRecord] = []
        self._dispatches = 0
        self._persisted_at = time.monotonic()
        self._stored_ids: dict[str | None, str | None] = {}   # site id (None: the run) -> MLflow run id stored
        self._checkpointed_s: dict[str, float] = {}    # site id -> its search seconds at its last checkpoint
        self.quanta = 0                  # results handled, and the driver's own seconds (all but the waits)
        self.driver_seconds = 0.0
        self.loop_seconds = 0.0          # the loop's wall time, waits included
        self.status_changes = 0          # how many, and the driver's seconds spent on them (store and observers)
        self.status_seconds = 0.0
        self._dirty: dict[str, SiteRecord] = {}   # records changed in the open transaction
        self._pruned = 0                 # the traces of the store's outbox pruned up to (exported already)
        self._deleter: queue.SimpleQueue[list[str]] = queue.SimpleQueue()   # checkpoints of final sites
        threading.Thread(target=self._remove_checkpoints, name="cdeepfuzz-cleanup", daemon=True).start()
        self._bugs: dict[str, str] = {}  # signature -> the folder of its first finding in this run
        self._flaky: dict[str, bool] = {}   # finding folder -> flaky

    def _new_scheduler(self):
        c = self.campaign
        return make_scheduler(c.scheduler.policy, max_steps=self.config.max_steps, quantum=c.scheduler.quantum,
                              **scheduler_options(c))

    # -- transactions -------------------------------------------------------------------------
    @contextmanager
    def _txn(self) -> Iterator[None]:
        """One transaction of the store (nested ones join it); once the outermost one committed, the
        observers hear of its changes and the checkpoints it replaced are deleted."""
        self._depth += 1
        try:
            with self.store.transaction():
                yield
                if self._depth == 1 and self._dirty:     # each record changed in it, written once
                    self.store.put_sites([(r, self._order[r.site.id]) for r in self._dirty.values()])
                    self._dirty.clear()
        except BaseException:
            if self._depth == 1:
                self._events, self._garbage = [], []
                self._dirty.clear()
            raise
        finally:
            self._depth -= 1
        if self._depth:
            return
        events, self._events = self._events, []
        garbage, self._garbage = self._garbage, []
        if garbage:
            self._deleter.put(garbage)
        for event in events:
            event()

    def _touch(self, rec: SiteRecord) -> None:
        """``rec`` changed: the store gets it as it is when the transaction ends (one write per record per
        transaction, however often it changed in it)."""
        self._dirty[rec.site.id] = rec

    # -- the one place where a site's status changes -------------------------------------------
    def set_status(self, rec: SiteRecord, status: SiteStatus, reason: ExitReason = ExitReason.NONE, *,
                   error: str | None = None, traceback: str | None = None) -> None:
        t0 = time.perf_counter()
        before = rec.status
        # a final status never changes, but for a stopped site (a resume reopens it) and for a site that
        # ended without a finding where another site's search then found the bug at it
        if before.final and before is not SiteStatus.STOPPED and not (status.finding and not before.finding):
            raise RuntimeError(f"site {rec.site.label} is already {before.value}: it cannot become {status.value}")
        if status is before and reason is rec.exit_reason:
            return
        rec.status, rec.exit_reason = status, reason
        if error is not None:
            rec.error, rec.traceback = error, traceback
        if status.final and status is not SiteStatus.STOPPED:
            rec.inflight, rec.since = None, []
            if rec.checkpoint:
                self._garbage.append(rec.checkpoint)
                rec.checkpoint = None
        with self._txn():
            self._touch(rec)
            self.store.transition(rec)
            self._events.append(lambda: self._notify_change(rec, before))
        self.status_changes += 1
        self.status_seconds += time.perf_counter() - t0

    def _notify_change(self, rec: SiteRecord, before: SiteStatus) -> None:
        t0 = time.perf_counter()
        self.observers.site_changed(rec, before)
        self.status_seconds += time.perf_counter() - t0

    # -- discovery ------------------------------------------------------------------------------
    def add_targets(self, found: dict[str, list[OpSite] | BaseException]) -> None:
        """Register the discovered sites of a new run (``found``: target name -> sites, or its failure)."""
        with self._txn():
            for index, (name, spec) in enumerate(self.specs.items()):
                rec = self.targets[name] = TargetRecord(name, spec.entry, spec.framework)
                result = found[name]
                if isinstance(result, BaseException):
                    failure = (failures.from_target_failure(result) if isinstance(result, TargetFailure)
                               else failures.from_exception(result))
                    rec.status, rec.exit_reason = SiteStatus.ERROR, failure.reason
                    rec.error, rec.traceback = failure.message, failure.traceback
                    self.store.put_target(rec, index)
                    self._events.append(lambda rec=rec, f=failure: (
                        self.observers.target_added(rec),
                        self.observers.message(failures.describe(f"target {rec.name}", f))))
                    continue
                for site in result:
                    if not site.searched:
                        rec.recorded.append({"op": site.op, "kind": site.kind, "location": site.location,
                                             "column": site.column})
                        continue
                    rec.sites += 1
                    self._add_site(SiteRecord(site))
                self.store.put_target(rec, index)
                self._events.append(lambda rec=rec: self.observers.target_added(rec))
        self.observers.sites_ready(list(self.sites.values()))
        self._persist_learned(force=True)      # the MLflow run ids, known by now: a resume reopens the same runs

    def _add_site(self, rec: SiteRecord) -> None:
        self._order[rec.site.id] = len(self._order)
        self.sites[rec.site.id] = rec
        self.scheduler.add_site(rec.site.id, steps_used=rec.steps)
        self._touch(rec)
        self._events.append(lambda: self.observers.site_added(rec))

    def restore(self) -> None:
        """Reload a run from its store: the records, the scheduler (its latest snapshot and the calls logged
        after it), each site's checkpoint reference and the quanta since it; stopped sites are reopened and
        the quanta in flight are dispatched again first."""
        self.targets = {t.name: t for t in self.store.targets()}
        how = self.scheduler.reload(self._new_scheduler)
        log.info("scheduler rebuilt from its %s", "snapshot and the calls after it" if how == "snapshot"
                 else "whole log")
        with self._txn():
            self.scheduler.snapshot()          # the next resume replays nothing of what this one did
        found = self.store.findings()
        for record in found:
            self._flaky[record.folder] = record.flaky
            self._bugs.setdefault(record.signature, record.folder)
        self.observers.findings_restored(found)
        for index, rec in enumerate(self.store.sites()):
            self._order[rec.site.id] = index
            self.sites[rec.site.id] = rec
            self._stored_ids[rec.site.id] = rec.mlflow_run_id
            if rec.checkpoint and not (self.run_dir / rec.checkpoint).is_file():
                raise FileNotFoundError(f"{self.run_dir / rec.checkpoint}: the checkpoint the run-state store "
                                        "names is missing")
        for target in self.targets.values():
            self.observers.target_added(target)
        for rec in self.sites.values():
            self.observers.site_added(rec)
        for rec in self.sites.values():
            if rec.status is SiteStatus.STOPPED:
                self.set_status(rec, SiteStatus.SEARCHING if rec.steps or rec.inflight else SiteStatus.PENDING)
        self._resubmit = sorted((r for r in self.sites.values() if r.inflight and not r.status.final),
                                key=lambda r: r.inflight.get("seq", 0))
        self._reported = not self._resubmit     # killed after a report: its allocation is still to come
        self._dispatches = max([r.inflight.get("seq", 0) for r in self._resubmit] + [0])
        self.observers.sites_ready(list(self.sites.values()))
        self._persist_learned(force=True)      # the MLflow run ids, known by now: a resume reopens the same runs

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, started: float | None = None) -> None:
        """Search until every site is final, the time limit passes or a stop is asked; then record
        every live site as stopped (with the reason)."""
        t0 = time.monotonic() if started is None else started
        deadline = t0 + self.limits.time_limit_s
        if hasattr(self.executor, "deadline"):
            self.executor.deadline = deadline
        stop = self.stop_request
        began = time.perf_counter()
        try:
            while not self.scheduler.done and stop.reason is None:
                if time.monotonic() > deadline:
                    stop.request(ExitReason.TIME_LIMIT)
                    break
                turn = time.perf_counter()
                self._dispatch()
                waited = time.perf_counter()
                done = self.executor.wait(WAIT_S)
                waited = time.perf_counter() - waited
                with self._txn():             # every result of the turn in one transaction, one commit
                    for task, outcome in done:
                        self._handle(task, outcome)
                self.observers.tick()
                self._persist_learned()
                self.quanta += len(done)
                self.driver_seconds += time.perf_counter() - turn - waited
        except StopRun as exc:
            stop.request(exc.reason)
        except KeyboardInterrupt:
            stop.request(ExitReason.INTERRUPTED)
        finally:
            self.loop_seconds += time.perf_counter() - began
        if stop.reason is not None:
            self._stop_live(stop.reason)

    def _stop_live(self, reason: ExitReason) -> None:
        with self._txn():
            for rec in self.sites.values():
                if not rec.status.final:
                    self.set_status(rec, SiteStatus.STOPPED, reason)
            self.scheduler.snapshot()          # a resume replays nothing

    def _dispatch(self) -> None:
        free = max(0, self.executor.slots - self.executor.running)
        tasks: list[Task] = []
        with self._txn():
            while self._resubmit and free:          # quanta a killed driver left in flight, as they were
                rec = self._resubmit.pop(0)
                tasks.append(self._task(rec, rec.inflight["action"] == Action.REFRESH.value, rec.inflight["steps"],
                                        rec.inflight.get("reach_steps", 0)))
                free -= 1
            if not self._resubmit and (free or self._reported):
                self._reported = False
                for decision in self.scheduler.allocate(free):
                    rec = self.sites[decision.site_id]
                    retired = _RETIREMENTS.get(decision.action.name)
                    if retired is not None:
                        if not rec.status.final:
                            self.set_status(rec, *retired)
                        continue
                    self._dispatches += 1
                    rec.inflight = {"action": decision.action.value, "steps": decision.steps,
                                    "seq": self._dispatches, "reach_steps": decision.reach_steps}
                    if rec.status is SiteStatus.PENDING:
                        self.set_status(rec, SiteStatus.SEARCHING)     # writes the record too
                    else:
                        self._touch(rec)
                    tasks.append(self._task(rec, decision.action is Action.REFRESH, decision.steps, decision.reach_steps))
        for task in tasks:
            self.executor.submit(task)

    def _task(self, rec: SiteRecord, refresh: bool, steps: int, reach_steps: int = 0) -> Task:
        source = CheckpointFile(self.run_dir / rec.checkpoint) if rec.checkpoint else None
        resume = Resume(source, tuple((int(n), bool(r)) for n, r in rec.since), rec.steps)
        due = len(rec.since) + 1 >= CHECKPOINT_QUANTA or rec.seconds - self._checkpointed_s.get(rec.site.id, 0.0) \
            >= CHECKPOINT_S
        into = None
        if getattr(self.executor, "writes_run_folder", False):   # the worker writes, the loop only records
            slot = self._slot(rec) if due else None
            into = RunFolder(f"{self._absolute}/{FINDINGS}", f"{self._absolute}/{slot}" if slot else None)
        return Task(rec.site, self.specs[rec.site.target], self.config, steps, refresh=refresh, resume=resume,
                    want_checkpoint=due, probe_steps=reach_steps, into=into, known=self._known())

    def _known(self) -> frozenset[str]:
        """The run's bugs confirmed solid so far (a flaky one's next finding may replay solid)."""
        return frozenset(sig for sig, folder in self._bugs.items() if not self._flaky.get(folder))

    # -- results ----------------------------------------------------------------------------------
    def _handle(self, task: Task, outcome: QuantumOutcome | BaseException) -> None:
        rec = self.sites[task.site.id]
        if isinstance(outcome, QuantumOutcome):
            self._quantum(rec, outcome)
            return
        self._reported = True
        with self._txn():
            rec.inflight = None
            if isinstance(outcome, QuantumTimeout):
                rec.timeouts += 1
                if rec.timeouts >= MAX_TIMEOUTS:
                    self._retire(rec, SiteStatus.TIMEOUT, ExitReason.QUANTUM_TIMEOUT,
                                 error=f"{rec.timeouts} quanta over the time limit ({outcome})")
                    return
            elif isinstance(outcome, ActorDied):
                rec.deaths += 1
                if rec.deaths > self.limits.max_deaths:
                    self._retire(rec, SiteStatus.ERROR, ExitReason.ACTOR_DIED,
                                 error=f"its actor died {rec.deaths} times: {outcome}")
                    return
            else:
                failure = _failure_of(outcome)
                self._retire(rec, SiteStatus.ERROR, failure.reason, error=failure.message, traceback=failure.traceback)
                self._events.append(lambda: self.observers.message(failures.describe(f"site {rec.site.label}", failure)))
                return
            log.info("%s: %s; resuming from its checkpoint", rec.site.label, outcome)
            self._touch(rec)
            self.scheduler.on_progress(SiteProgress(rec.site.id, rec.steps, (), rec.best_loss, False))

    def _quantum(self, rec: SiteRecord, out: QuantumOutcome) -> None:
        result = out.result
        self._reported = True
        finding = self._known_as(out.finding) if out.finding is not None else None
        folder = None
        if finding is not None:
            folder = Path(out.folder) if out.folder else self._write_finding(finding)
            if out.folder and finding is not out.finding:      # a known bug's new lines: its record says so
                write_finding(finding, folder, display=folder)
        with self._txn():
            if out.checkpoint_file is not None or out.checkpoint is not None:
                rec.checkpoint = (Path(out.checkpoint_file).relative_to(self._absolute).as_posix()
                                  if out.checkpoint_file else self._write_checkpoint(rec, out.checkpoint))
                rec.since = []
                self._checkpointed_s[rec.site.id] = result.seconds
            elif not result.status.final:             # a resume runs it again from the checkpoint
                refresh = (rec.inflight or {}).get("action") == Action.REFRESH.value
                rec.since.append([result.steps - rec.steps, refresh])
            rec.inflight = None
            rec.steps, rec.seconds = result.steps, result.seconds
            rec.best_loss = min(rec.best_loss, result.best_loss)
            if result.trace:
                rec.last_loss = result.trace[-1].suspect_loss
                self.store.put_trace(rec.site.id, int(time.time() * 1000), result.trace)   # the exporter's outbox
            at = None                                 # the site the finding's bug is at (rec: its own op)
            if finding is not None:
                where = folder.resolve().relative_to(self._absolute).as_posix()
                self._record_finding(FindingRecord.of(finding, where))
                at = rec if finding.site_triggered else self._site_at(finding)
                if at is rec:
                    rec.finding = where
                elif where not in rec.passed:         # another op's bug: its search goes on past it (or ended there)
                    rec.passed = [*rec.passed, where]
            if result.reach:
                rec.reach = result.reach
            status, reason, failure = _outcome_status(result, finding, own=at is rec)
            if not status.final and rec.finding:      # the bug at this site, found by another's search meanwhile
                status, reason = self._found(rec.finding)
            losses = tuple(p.suspect_loss for p in result.trace)
            if out.outside is not None:
                log.info("%s: its own op %s outside its bounds (%d probe steps)", rec.site.label,
                         "fired" if out.outside else "did not fire", out.probe_steps)
            self.scheduler.on_progress(SiteProgress(rec.site.id, result.steps, losses, rec.best_loss,
                                                    status.finding, log_space=result.log_space,
                                                    outside=out.outside))
            if not status.final:                      # else _retire's set_status writes the record
                self._touch(rec)
            self._events.append(lambda: self.observers.quantum(rec, result))
            if finding is not None:
                self._events.append(lambda: self.observers.finding(rec, finding, folder))
            if status.final:
                self._retire(rec, status, reason, error=failure and failure.message,
                             traceback=failure and failure.traceback)
                if failure is not None:
                    self._events.append(lambda: self.observers.message(
                        failures.describe(f"site {rec.site.label}", failure, "its program raised")))
            if at is not None and at is not rec:
                self._found_at(at, where, rec)

    def _record_finding(self, record: FindingRecord) -> None:
        self.store.put_finding(record)
        self._flaky[record.folder] = record.flaky
        self._bugs.setdefault(record.signature, record.folder)

    def _found(self, folder: str) -> tuple[SiteStatus, ExitReason]:
        """The status and reason of a site whose bug's finding is ``folder``: found, or flaky as it is."""
        if self._flaky.get(folder, False):
            return SiteStatus.FLAKY, ExitReason.TRIGGERED_FLAKY
        return SiteStatus.FOUND, ExitReason.TRIGGERED

    def _site_at(self, finding) -> SiteRecord | None:
        """The searched site of the finding's target that its bug is at (another op's call), if any."""
        bug = finding.bug.to_dict()
        return next((s for s in self.sites.values() if s.site.target == finding.site.target
                     and at_site(bug, s.site)), None)

    def _found_at(self, at: SiteRecord, folder: str, by: SiteRecord) -> None:
        """Another site's search found the bug at ``at``: ``at`` is found too (a site is found when a bug
        at its op is confirmed, whichever search drove it there). A live site is retired (its search has
        nothing left to find), now or, when a quantum of it is in flight, when that quantum reports; a
        site that ended without a finding is found after all."""
        if at.finding:
            return
        at.finding, at.found_by = folder, by.site.label
        status, reason = self._found(folder)
        if at.status.final:
            if not at.status.finding and at.status is not SiteStatus.STOPPED:
                self.set_status(at, status, reason)
        elif at.inflight is None:
            self._retire(at, status, reason)
        else:
            self._touch(at)

    def _retire(self, rec: SiteRecord, status: SiteStatus, reason: ExitReason, *, error: str | None = None,
                traceback: str | None = None) -> None:
        """A site ends on the controller's own finding: the scheduler hears it once, the records once."""
        with self._txn():
            self.scheduler.retire(rec.site.id, status.value)
            self.set_status(rec, status, reason, error=error, traceback=traceback)

    # -- writing ---------------------------------------------------------------------------------
    def _known_as(self, finding):
        """The finding as an occurrence of the known bug it is, when the reuse phase replayed that bug
        where its line of code sits now (lines were added above it): its signature at the new lines is
        that bug's, whose triage state it keeps, and not a new bug's."""
        aliases = {r["moved_to"]: r["signature"] for r in self.store.known_bugs() if r.get("moved_to")}
        known = aliases.get(finding.signature)
        if known is None:
            return finding
        return dataclasses.replace(finding, known_as=known, notes=[
            *finding.notes, f"the known bug {known}, found before its line of code moved"])

    def _write_finding(self, finding) -> Path:
        """The finding's folder, written once (:func:`fuzz_core.findings.finding_folder`: unique per finding;
        a driver killed after writing it and resumed finds it again at the same step, and keeps the
        folder it wrote)."""
        folder, there = finding_folder(self.run_dir / FINDINGS, finding)
        if not there:
            write_finding(finding, folder, display=folder)
        return folder

    @staticmethod
    def _slot(rec: SiteRecord) -> str:
        """Two slots per site, used in turn: the new checkpoint never replaces the one the store names
        until the transaction that names it commits (a driver killed in between resumes from the old)."""
        slot = "b" if rec.checkpoint and rec.checkpoint.endswith(".a.safetensors") else "a"
        return f"{CHECKPOINTS}/{rec.site.id}.{slot}.safetensors"

    def _write_checkpoint(self, rec: SiteRecord, checkpoint) -> str:
        """A checkpoint a worker sent back (it does not see the run folder), into the site's free slot."""
        slot = self._slot(rec)
        save_checkpoint(self.run_dir / slot, checkpoint)
        return slot

    def _remove_checkpoints(self) -> None:
        """Both slots of each final site's checkpoint, off the loop (a file left by a killed driver is never
        read: the store names the checkpoints that count)."""
        while True:
            refs = self._deleter.get()
            if refs is None:
                return
            for ref in refs:
                path = self.run_dir / ref
                base = path.name.split(".", 1)[0]
                for slot in ("a", "b"):
                    for suffix in (".safetensors", ".json"):
                        (path.parent / f"{base}.{slot}{suffix}").unlink(missing_ok=True)

    # -- the end ------------------------------------------------------------------------------------
    def finish_targets(self) -> None:
        """Each target's status from its sites' (a target that broke stays ``error``)."""
        by_target: dict[str, list[SiteRecord]] = {}
        for rec in self.sites.values():
            by_target.setdefault(rec.site.target, []).append(rec)
        with self._txn():
            for index, target in enumerate(self.targets.values()):
                target.status, target.exit_reason = target_rollup(target, by_target.get(target.name, []))
                self.store.put_target(target, index)
            for rec in self.sites.values():
                self._touch(rec)
            self.scheduler.snapshot()
            self.store.put_run(self.record)

    def _persist_learned(self, force: bool = False) -> None:
        """Every few seconds, persist what observers learned about the records (the MLflow run ids)."""
        now = time.monotonic()
        if not force and now - self._persisted_at < PERSIST_S:
            return
        self._persisted_at = now
        changed = [rec for rec in self.sites.values() if rec.mlflow_run_id != self._stored_ids.get(rec.site.id)]
        exported = _exported(self.run_dir)
        with self._txn():
            for rec in changed:
                self._touch(rec)
            if changed or self.record.mlflow_run_id != self._stored_ids.get(None):
                self.store.put_run(self.record)
            if exported > self._pruned:          # the traces the exporter has put in Parquet and MLflow
                self.store.prune_traces(exported)
                self._pruned = exported
        self._stored_ids.update({rec.site.id: rec.mlflow_run_id for rec in changed})
        self._stored_ids[None] = self.record.mlflow_run_id

    def save_records(self) -> None:
        """Persist every site and the run as they are now (what observers learned: MLflow run ids)."""
        with self._txn():
            for rec in self.sites.values():
                self._touch(rec)
            self.store.put_run(self.record)

    def close(self) -> None:
        """The run is over: the clean-up thread deletes what is queued, then stops."""
        self._deleter.put(None)

    def bugs(self) -> int:
        """The run's bugs: distinct signatures among its findings."""
        return len(self._bugs)

_RETIREMENTS = {
    "RETIRE_EXHAUSTED": (SiteStatus.EXHAUSTED, ExitReason.BUDGET_SPENT),
    "RETIRE_NO_PROGRESS": (SiteStatus.RETIRED, ExitReason.NO_PROGRESS),
    "RETIRE_FOUND": (SiteStatus.FOUND, ExitReason.TRIGGERED),     # never reached: a finding retires its site
}


def _outcome_status(result, finding, own: bool = True) -> tuple[SiteStatus, ExitReason, failures.Failure | None]:
    """The status, exit reason and (for an error) classified failure a quantum's result implies. A
    finding of another op that the site's search stepped past (the worker left its status searching,
    or exhausted at that step) does not end the site: its own op may still go out of its domain. One
    it could not step past (a backward or update step went non-finite: the training it ran is the
    program's) ends the search there, blocked, with budget left: retired, not found (its own op did
    not go out of its domain)."""
    if finding is not None and result.status in (SiteStatus.FOUND, SiteStatus.FLAKY):
        if not own:
            return SiteStatus.RETIRED, ExitReason.BLOCKED, None
        flaky = bool(getattr(finding, "flaky", False))
        return ((SiteStatus.FLAKY, ExitReason.TRIGGERED_FLAKY) if flaky
                else (SiteStatus.FOUND, ExitReason.TRIGGERED)) + (None,)
    status = result.status
    given = getattr(result, "exit_reason", ExitReason.NONE)
    if status is SiteStatus.ERROR:
        failure = failures.from_quantum(result.error, given)
        return SiteStatus.ERROR, failure.reason, failure
    if status in (SiteStatus.FOUND, SiteStatus.FLAKY):     # a candidate that did not replay: go on
        return SiteStatus.SEARCHING, ExitReason.NONE, None
    if status is SiteStatus.UNREACHABLE:
        return status, ExitReason.UNREACHABLE, None
    if status is SiteStatus.EXHAUSTED:
        return status, given if given is not ExitReason.NONE else ExitReason.BUDGET_SPENT, None
    if status is SiteStatus.RETIRED:
        return status, given if given is not ExitReason.NONE else ExitReason.NO_PROGRESS, None
    if status is SiteStatus.TIMEOUT:
        return status, ExitReason.QUANTUM_TIMEOUT, None
    return SiteStatus.SEARCHING, ExitReason.NONE, None


def _exported(run_dir: Path) -> int:
    """The exporter's watermark of the traces (:mod:`orchestrator.observers.exporter`), 0 when none yet."""
    try:
        return int(read_json(run_dir / "exported.json").get("traces", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def _failure_of(outcome: BaseException) -> failures.Failure:
    """A task that raised: the user's target (a TargetFailure, also inside a Ray task error) or the tool."""
    return failures.from_escaped(outcome)


def finite(x: float) -> float:
    return float(x) if x is not None and math.isfinite(x) else float("nan")
