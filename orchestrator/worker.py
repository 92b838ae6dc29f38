"""The work of one actor (or of the driver, with ``num_actors: 0``): build targets, run quanta.

A :class:`Worker` keeps the targets it has built and the searches of the sites it
owns. It returns plain data (the quantum's trace, a confirmed finding with its values,
and a checkpoint only when asked for one) and writes nothing: the controller is the only
writer.

A site's search stays live in the worker that runs it; what travels is only what changed
(the trace). A task carries a :class:`Resume` for the worker that does not hold the site
live (a restarted actor, a site moved to another actor, a resumed campaign): the site's
last checkpoint (none: the factory's state at step 0) and the quanta it ran since, which
the worker runs again first. Searches are deterministic and slice-independent (a quantum
of 40 steps gives the trace of two of 20), so the re-run lands exactly where the search
stood, and the controller need only persist a checkpoint at the cadence a resume can
afford to re-run.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fuzz_core.backends.base import INPUT_RANGE, Precision, RunnerOptions
from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from, fresh_runner, same_op
from fuzz_core.errors import INTERNAL_HINT, classify
from fuzz_core.loader import EntryError
from fuzz_core.out_of_reach import probe
from fuzz_core.findings import Finding, bug_of, finding_folder, write_finding
from fuzz_core.io import atomic_save_arrays, atomic_write_json
from fuzz_core.search import QuantumResult, SearchConfig, SiteSearch
from fuzz_core.sites import OpSite
from fuzz_core.status import ExitReason, SiteStatus
from fuzz_core.target import TargetError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerOptions:
    device: str = "cpu"
    search_weights: bool = False
    num_threads: int = 1
    minimise: bool = True
    input_range: float = INPUT_RANGE     # search.input_range: the default box of inputs without bounds
    precision: Precision = Precision()   # the campaign's precision: (fp32 by default)


Checkpoint = tuple[dict[str, np.ndarray], dict]


class Ask:
    """A :attr:`Resume.source` that is not sent: a worker that does not hold the site live answers
    :class:`NeedsResume`, and the executor sends the task again with the checkpoint."""

    def __repr__(self) -> str:
        return "ASK"

    def __reduce__(self) -> str:
        return "ASK"          # pickled by name: one object in every process, so ``is ASK`` holds


ASK = Ask()


@dataclass(frozen=True)
class Resume:
    """Where a site's search stands, for a worker that does not hold it live at ``step``.

    ``source``: the site's last checkpoint, as ``(arrays, meta)``, as an object with a ``load()``
    that returns them (read only when needed: a file on the driver's disk, an object in Ray's
    store), None for none (the factory's state at step 0), or :data:`ASK`; ``since``: the quanta
    run after it, ``(steps, refresh)`` each, which the worker runs again before the task's own;
    ``step``: the site's step once they have run."""

    source: Any = None
    since: tuple[tuple[int, bool], ...] = ()
    step: int = 0

    @classmethod
    def at(cls, checkpoint: Checkpoint | None) -> "Resume":
        """A resume from ``checkpoint`` alone (None: from step 0)."""
        return cls(checkpoint, (), int(checkpoint[1]["step"]) if checkpoint is not None else 0)


class NeedsResume(Exception):
    """The worker does not hold the site live at the task's step, and the task's resume was :data:`ASK`."""


class CatchUpMismatch(RuntimeError):
    """Re-running the quanta since a checkpoint did not land where the search stood."""


@dataclass
class QuantumOutcome:
    """Everything a quantum produced, sent back to the controller (a checkpoint only when the task
    asked for one, and never for a final quantum). A worker that writes into the run folder itself
    (:class:`RunFolder`) returns where it wrote the finding and the checkpoint instead of their data."""

    site_id: str
    result: QuantumResult
    checkpoint: Checkpoint | None
    finding: Finding | None = None
    worker: str = ""
    kept: Any = None          # where the worker runs, a reference to the site's checkpoint (Ray's object store)
    outside: bool | None = None   # the out-of-box probe the task asked for: did the site's own op fire? (None: none ran)
    probe_steps: int = 0          # steps that probe ran (beyond the site's budget)
    folder: str | None = None             # the finding's folder, written by the worker
    checkpoint_file: str | None = None    # the checkpoint's arrays file, written by the worker


@dataclass(frozen=True)
class RunFolder:
    """Where a worker that sees the run folder writes what a quantum produced, so that the controller's loop
    only records it: ``findings``, the findings folder (a finding's own folder is chosen there:
    :func:`fuzz_core.findings.finding_folder`); ``checkpoint``, the arrays file of the checkpoint slot the
    controller wants filled (None: no checkpoint is due)."""

    findings: str
    checkpoint: str | None = None


def save_checkpoint(arrays_file: Path, checkpoint: Checkpoint) -> None:
    """A checkpoint's two files, each atomic: its arrays, then its meta beside them (``.json``)."""
    arrays, meta = checkpoint
    atomic_save_arrays(arrays_file, arrays)
    atomic_write_json(arrays_file.with_suffix(".json"), meta)


def write_into(folder: RunFolder | None, outcome: QuantumOutcome) -> QuantumOutcome:
    """Write ``outcome``'s finding and checkpoint into the run folder (when the worker sees it), and say where."""
    if folder is None:
        return outcome
    if outcome.finding is not None:
        where, there = finding_folder(Path(folder.findings), outcome.finding)
        if not there:
            write_finding(outcome.finding, where, display=where)
        outcome.folder = str(where)
    if outcome.checkpoint is not None and folder.checkpoint:
        save_checkpoint(Path(folder.checkpoint), outcome.checkpoint)
        outcome.checkpoint, outcome.checkpoint_file = None, folder.checkpoint
    return outcome


class TargetFailure(Exception):
    """A target that could not be built or whose program raised.

    ``contract`` marks a user mistake that breaks the target contract (the factory is
    missing, returns the wrong thing, bounds with low > high, a sample without a
    batch dimension): a configuration error (exit 2), not a bug of the program (exit 3).
    """

    def __init__(self, message: str, tb: str, contract: bool = False,
                 reason: str = ExitReason.TARGET_ERROR.value) -> None:
        super().__init__(message)
        self.tb = tb
        self.contract = contract
        self.reason = reason         # an ExitReason value: target_error, or internal_error (the tool's bug)

    def __reduce__(self):
        # Ray (and multiprocessing) rebuild an exception from ``type(exc)(*exc.args)`` unless told
        # otherwise: without this the driver gets a TypeError instead of the user's message.
        return (type(self), (str(self), self.tb, self.contract, self.reason))


def _failure(exc: Exception) -> TargetFailure:
    contract = isinstance(exc, (TargetError, EntryError))
    message = str(exc) if contract else f"{type(exc).__name__}: {exc}"
    reason = ExitReason.TARGET_ERROR if contract else classify(exc)
    if reason is ExitReason.INTERNAL_ERROR:
        message = f"internal error: {message} ({INTERNAL_HINT})"
    return TargetFailure(message, traceback.format_exc(), contract, reason.value)


MAX_PRIVATE = 16    # builds kept for sites of targets that need one each (the oldest is dropped)


@dataclass
class Worker:
    """Sites of a target share one build while the engine can undo everything the program writes
    (the runner's state tracking and write watch prove it, step by step). The first write it
    cannot undo (a cache the program keeps between calls, a tensor it cannot reach) moves the
    target to a build of its own for each site: the site that made the write keeps the build
    it wrote into, every other site starts from a new build (or its checkpoint)."""

    options: WorkerOptions = field(default_factory=WorkerOptions)
    runners: dict[str, Any] = field(default_factory=dict)
    searches: dict[str, SiteSearch] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)   # target name -> site id whose state is live
    private: dict[str, Any] = field(default_factory=dict)   # site id -> its own build
    isolated: dict[str, list[str]] = field(default_factory=dict)   # target -> the writes that forced it

    def __post_init__(self) -> None:
        _set_threads(self.options.num_threads)

    def name(self) -> str:
        return f"pid{os.getpid()}"

    def _options(self) -> RunnerOptions:
        return RunnerOptions(device=self.options.device, search_weights=self.options.search_weights,
                             input_range=self.options.input_range, precision=self.options.precision)

    def _live(self, spec: TargetSpec) -> tuple:
        """Every build of this target in this process (they share the factory's module state)."""
        return tuple(r for r in [self.runners.get(spec.name)] + [s.runner for s in self.searches.values()
                                                                 if s.site.target == spec.name] if r is not None)

    def runner(self, spec: TargetSpec):
        runner = self.runners.get(spec.name)
        if runner is None:
            try:
                runner = build_runner(spec, self._options())
            except Exception as exc:  # noqa: BLE001 - reported per target, the campaign goes on
                raise _failure(exc) from None
            self.runners[spec.name] = runner
        return runner

    def _site_runner(self, spec: TargetSpec, site_id: str):
        """The build a site's search runs on: the target's shared one, or a build of its own."""
        if spec.name not in self.isolated:
            return self.runner(spec)
        runner = self.private.get(site_id)
        if runner is None:
            self.owner.pop(spec.name, None)          # the builds are reset: every site resumes
            try:
                runner = fresh_runner(spec, self._options(), live=self._live(spec))
            except Exception as exc:  # noqa: BLE001
                raise _failure(exc) from None
            self.private[site_id] = runner
            while len(self.private) > MAX_PRIVATE:   # the oldest build goes; its site resumes from its checkpoint
                old = next(iter(self.private))
                self.private.pop(old)
                self.searches.pop(old, None)
        return runner

    def _check_isolation(self, spec: TargetSpec, runner, site_id: str | None) -> None:
        """After a pass: did the program write what the engine cannot undo? Then every site of the
        target gets a build of its own from now on."""
        untracked = getattr(runner, "untracked", None)
        if not untracked or spec.name in self.isolated:
            return
        self.isolated[spec.name] = list(untracked)
        log.warning("target %s writes state the engine cannot restore (%s): each site gets its own build",
                    spec.name, "; ".join(untracked[:3]))
        self.runners.pop(spec.name, None)
        for other in [k for k, s in self.searches.items() if s.site.target == spec.name and k != site_id]:
            self.searches.pop(other)                 # they resume from their checkpoints on new builds
        if site_id is not None:
            self.private[site_id] = runner           # the site that wrote keeps what it wrote into

    def discover(self, spec: TargetSpec) -> list[OpSite]:
        runner = self.runner(spec)
        try:
            sites = discover_sites(runner, spec.seed)
        except Exception as exc:  # noqa: BLE001
            raise _failure(exc) from None
        self._check_isolation(spec, runner, None)
        return sites

    def try_discover(self, spec: TargetSpec) -> list[OpSite] | TargetFailure:
        """:meth:`discover`, with a target's failure returned, not raised: it is reported per target."""
        try:
            return self.discover(spec)
        except TargetFailure as exc:
            return exc

    def run(self, spec: TargetSpec, site: OpSite, config: SearchConfig, steps: int, refresh: bool = False,
            resume: Resume | None = None, want_checkpoint: bool = True, probe_steps: int = 0,
            known: frozenset[str] = frozenset()) -> QuantumOutcome:
        """Run a quantum of ``steps`` steps of ``site`` (after a refresh); the search held live here
        when it stands at ``resume.step``, else rebuilt from ``resume`` (None: a new search). Raises
        :class:`NeedsResume` when that would need a resume that was not sent (:data:`ASK`).
        ``probe_steps`` > 0: a site still searching after the quantum is then probed outside its
        bounds for that many steps (:func:`reach_verdict`), its search left as it stood. ``known``:
        the signatures of the bugs the run has confirmed; a search that ends on another op's bug
        among them steps past it without replaying it again (the trajectory is the same either way)."""
        resume = resume if resume is not None else Resume()
        runner = self._site_runner(spec, site.id)
        search = self.searches.get(site.id)
        if search is not None and (search.runner is not runner or search.step != resume.step):
            search = None                            # its build was replaced, or it is elsewhere: resume
        if search is None:
            if resume.source is ASK:
                raise NeedsResume(site.id)
            source = resume.source
            checkpoint = source.load() if hasattr(source, "load") else source
            self.owner.pop(spec.name, None)          # the build is this site's now: whoever held it resumes
            search = self._resumed(runner, site, config, checkpoint, resume)
        elif self.owner.get(spec.name) != site.id:
            search.resume()
        self.owner[spec.name] = site.id
        try:
            result = search.run(steps, refresh=refresh)
        except Exception as exc:  # noqa: BLE001 - the program raised: this site is an error
            self._drop(spec, site.id)
            reason = classify(exc)
            hint = f"\n{INTERNAL_HINT}" if reason is ExitReason.INTERNAL_ERROR else ""
            result = QuantumResult(site.id, search.step, 0, [], SiteStatus.ERROR, search.best,
                                   error=f"{type(exc).__name__}: {exc}{hint}\n{traceback.format_exc()}",
                                   seconds=search.seconds, exit_reason=reason)
            return QuantumOutcome(site.id, result, None, worker=self.name())
        self._check_isolation(spec, runner, site.id)
        finding = None
        if result.candidate is not None:
            def confirm():
                return finding_from(runner, spec, site, config, result.candidate, result.seconds,
                                    device=str(getattr(runner, "device", "cpu")), minimise_batch=self.options.minimise)

            if search.can_step_past() and _bug_signature(site, result.candidate) in known:
                search.step_past()                   # another op's bug the run has: one finding of it is enough
                result.status = search.status()
                result.exit_reason = ExitReason.BUDGET_SPENT if result.status.final else ExitReason.NONE
            elif search.can_step_past():             # another op went non-finite first: report it, go on
                finding = search.report_and_step_past(confirm)
                self.owner[spec.name] = site.id      # its confirmation reset the builds; the search's state is back
                result.status = search.status()      # searching, or exhausted at this very step
                result.exit_reason = ExitReason.BUDGET_SPENT if result.status.final else ExitReason.NONE
            else:
                finding = confirm()
                self.owner.pop(spec.name, None)      # confirmation reset the builds of this target
                result.status = SiteStatus.FLAKY if finding.flaky else SiteStatus.FOUND
                result.exit_reason = ExitReason.TRIGGERED_FLAKY if finding.flaky else ExitReason.TRIGGERED
        if result.status.final:
            self._drop(spec, site.id)
            return QuantumOutcome(site.id, result, None, finding, self.name())
        outside, probed = reach_verdict(search, probe_steps) if probe_steps > 0 else (None, 0)
        search.park()
        return QuantumOutcome(site.id, result, search.checkpoint() if want_checkpoint else None, finding,
                              self.name(), outside=outside, probe_steps=probed)

    def _resumed(self, runner, site: OpSite, config: SearchConfig, checkpoint: Checkpoint | None,
                 resume: Resume) -> SiteSearch:
        """A search rebuilt at ``resume.step``: ``checkpoint`` restored, the quanta since run again."""
        search = SiteSearch(runner, site, config)
        if checkpoint is not None:
            search.restore(*checkpoint)
        self.searches[site.id] = search
        for steps, refresh in resume.since:
            again = search.run(int(steps), refresh=bool(refresh))
            if again.candidate is not None and search.step_past():
                continue                             # another op's finding, reported when it was first made
            if again.status.final or again.candidate is not None:
                self.searches.pop(site.id, None)
                raise CatchUpMismatch(f"re-running the quanta of {site.label} since its checkpoint ended its "
                                      f"search at step {search.step} ({again.status.value}); the uninterrupted "
                                      f"search went on: the program is not deterministic")
        if search.step != resume.step:
            self.searches.pop(site.id, None)
            raise CatchUpMismatch(f"re-running the quanta of {site.label} since its checkpoint reached step "
                                  f"{search.step}, not {resume.step}")
        return search

    def _drop(self, spec: TargetSpec, site_id: str) -> None:
        self.searches.pop(site_id, None)
        self.private.pop(site_id, None)
        if self.owner.get(spec.name) == site_id:
            self.owner.pop(spec.name, None)


def _bug_signature(site: OpSite, candidate) -> str:
    """The signature of the bug ``candidate`` shows, as its replay would name it."""
    first = candidate.first_op.to_dict() if candidate.first_op else None
    return bug_of(site.to_dict(), candidate.own, first, candidate.phase).signature


def _set_threads(n: int) -> None:
    """The worker's CPU share as each framework's thread count: the count changes the order of float
    reductions, and with it a search that rides the program's training (on TF's default pools, one
    thread per core, a TF1 graph's reductions follow the machine's cores). TensorFlow reads its pools'
    sizes once, when it starts: unless the user set them, they are set here before it does (in a process
    that started it already, its threading API refuses, and the pools stay as they are). Two runs with
    more than one actor can still differ: the scheduler's decisions follow the order in which quanta
    finish (README, "Repeatable runs")."""
    n = max(1, int(n))
    try:
        import torch

        torch.set_num_threads(n)
    except Exception:  # noqa: BLE001 - torch is optional in a TF-only worker
        pass
    for var in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        os.environ.setdefault(var, str(n))
    if "tensorflow" in sys.modules:
        try:
            tf = sys.modules["tensorflow"]
            tf.config.threading.set_intra_op_parallelism_threads(int(os.environ["TF_NUM_INTRAOP_THREADS"]))
            tf.config.threading.set_inter_op_parallelism_threads(int(os.environ["TF_NUM_INTEROP_THREADS"]))
        except Exception:  # noqa: BLE001 - RuntimeError once TF's runtime has started
            pass


def reach_verdict(search, steps: int) -> tuple[bool | None, int]:
    """Whether the site's own op goes non-finite once its inputs may leave their bounds: the
    out-of-box probe of :mod:`fuzz_core.out_of_reach` (``adaptive`` in a box
    :data:`~fuzz_core.out_of_reach.WIDEN` times as wide, ``steps`` steps beyond the budget, the
    search put back as it stood), judged on the op that fired first. A trigger of another op
    (a guarded ``log(1 + exp(x))`` whose ``exp`` overflows first) is not this site's: its op is
    guarded. Returns (the verdict, the probe's steps); (None, its steps) when the program raised
    outside its bounds (no verdict).

    Two cases count as fired besides the site's own op named first. The site's own hazard firing in a
    step where another op is named first: ``exp(z) / exp(z).sum()`` overflows its two ``exp`` at once,
    and the first one named is not a guard of the second. And, for a backward row (``log_grad``,
    ``sqrt_grad``: the gradient of a call whose input nears the edge), the same call's forward hazard:
    its input went past the gradient's region on its way to the forward edge (``log(p)`` of a softmax
    reached ``p = 0``, so it passed the subnormal ``p`` whose gradient overflows), and the probe's wide
    box just got there in one stride."""
    record = probe(search, steps)
    if record.get("error"):
        return None, int(record["probe_steps"])
    site, first = search.site, record.get("first_op")
    own = bool(record["triggered"]) and (
        bool(record.get("own"))
        or same_op(first, site)
        or (record.get("phase") == "forward" and _same_call(first, site)))
    return own, int(record["probe_steps"])


def _same_call(first: dict | None, site) -> bool:
    """``first`` (a first op's dict) is the call ``site`` watches: the same framework op at the same
    place (a backward row's site and the forward row's share it)."""
    return first is not None and (first.get("kind"), str(first.get("location", "")), int(first.get("occurrence", 0))) == (
        site.kind, site.location, site.occurrence)

