"""Replaying real searches, so that the scheduler benchmark's policies share them.

A site's search depends on its seed, strategy and budget and on where its refreshes were
asked for, not on how a scheduler slices it into quanta (``fuzz_core``'s searches are
slice-independent: a quantum of 40 steps gives the trace of two of 20). So the first time
a campaign's quantum needs steps of a site that no campaign has run yet, this cache runs
them for real (a ``fuzz_core`` search in a :class:`~orchestrator.worker.Worker`, with its
confirmation by replay), keeps their trace, and serves any later campaign asking for the
same steps with the same refreshes from that trace. What a campaign measures is unchanged:
each of its quanta gets the trace, status, best loss and finding the real search gives at
that point; only the time to get them shrinks.

The searches are kept as a tree per (search config, site): one :class:`Branch` per tuple
of the steps at which refreshes were applied. A branch a quantum has not reached is grown
from the worker's live search when it stands there, else from a checkpoint of the branch
(every ``CHECKPOINT_EVERY`` steps) or of its parent, re-running the steps in between;
re-run steps are compared with the stored ones, and any difference stops the benchmark
(the searches would not be slice-independent, and the cache not exact).
"""
from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import pickle
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz_core.search import QuantumResult, SearchConfig, TracePoint
from fuzz_core.status import SiteStatus
from orchestrator.run.executors import Task
from orchestrator.worker import ASK, QuantumOutcome, Resume, Worker, WorkerOptions

CHECKPOINT_EVERY = 200     # steps between the checkpoints a branch keeps (each is 50 KB to 1 MB)


class NotReplayable(RuntimeError):
    """A search the cache cannot stand in for (an error, or a trace that did not repeat)."""


@dataclass
class Branch:
    """The trace of one site's search after the refreshes at the steps ``history``."""
    start: int                                       # the step of its last refresh (0: the root)
    points: list[TracePoint] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)   # points[i].step, for bisection
    checkpoints: dict[int, Any] = field(default_factory=dict)
    final: QuantumOutcome | None = None              # the real quantum that ended the search here
    started: bool = False                            # its refresh has been run for real

    @property
    def end(self) -> int:
        return self.steps[-1] if self.steps else self.start

    def index_at(self, step: int) -> int:
        """The index of the first point after ``step`` (a point boundary of the branch)."""
        i = bisect.bisect_right(self.steps, step)
        if (self.steps[i - 1] if i else self.start) != step:
            raise NotReplayable(f"step {step} is not a quantum boundary of this branch")
        return i

    def add(self, trace: list[TracePoint]) -> None:
        for p in trace:
            if p.step <= self.end:
                raise NotReplayable(f"a trace went back from step {self.end} to {p.step}")
            self.points.append(p)
            self.steps.append(p.step)


def _same(a: list[TracePoint], b: list[TracePoint]) -> bool:
    key = lambda p: (p.step, p.suspect_loss, p.best_loss, p.event, p.triggered)  # noqa: E731 - not wall_s
    return [key(p) for p in a] == [key(p) for p in b]


class SearchCache:
    """The real searches of one benchmark seed, shared by every campaign run on it."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.worker = Worker(options)
        self.discovered: dict[str, Any] = {}
        self.trees: dict[tuple[SearchConfig, str], dict[tuple[int, ...], Branch]] = {}
        self.templates: dict[tuple[SearchConfig, str], Any] = {}   # a real quantum result, not final, per site
        self.live: dict[str, tuple[SearchConfig, tuple[int, ...], int]] = {}   # the worker's searches
        # out-of-box probes: (config, site, refreshes, step, probe steps) -> (verdict, steps it ran)
        self.verdicts: dict[tuple, tuple[bool | None, int]] = {}
        self.real_steps = 0      # steps run for real (growing branches, and re-running to reach one)
        self.served_steps = 0    # steps handed to campaigns

    # -- persistence (for tuning runs only: a fresh cache is what a benchmark reports) ---------------
    def save(self, path: Path, fingerprint: str) -> None:
        data = {"fingerprint": fingerprint, "options": self.options, "discovered": self.discovered,
                "trees": self.trees, "templates": self.templates, "verdicts": self.verdicts}
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, fingerprint: str, options: WorkerOptions) -> "SearchCache":
        cache = cls(options)
        if path.exists():
            data = pickle.loads(path.read_bytes())
            if data.get("fingerprint") == fingerprint and data.get("options") == options:
                cache.discovered, cache.trees, cache.templates = data["discovered"], data["trees"], data["templates"]
                cache.verdicts = data.get("verdicts", {})
        return cache

    # -- what campaigns call (through a ReplayingExecutor) ---------------------------------------------
    def discover(self, specs) -> dict[str, Any]:
        out = {}
        for spec in specs:
            key = json.dumps([spec.name, spec.entry, spec.args, spec.framework, spec.seed], sort_keys=True,
                             default=str)
            if key not in self.discovered:
                self.discovered[key] = self.worker.try_discover(spec)
            out[spec.name] = self.discovered[key]
        return out

    def serve(self, task: Task, history: tuple[int, ...], at: int, best: float) -> QuantumOutcome:
        """The outcome of ``task`` for a site whose search stands at step ``at`` after the refreshes
        at ``history`` (the task's own refresh not yet applied), as the real search would give it."""
        site, config = task.site, task.config
        if task.refresh:
            history = history + (at,)
        tree = self.trees.setdefault((config, site.id), {})
        branch = tree.get(history)
        if branch is None:
            branch = tree[history] = Branch(start=at)
        end = min(at + max(0, task.steps), config.max_steps)
        served: list[TracePoint] = []
        step, i = at, branch.index_at(at)
        while True:
            while i < len(branch.points) and step < end and not (served and served[-1].triggered):
                served.append(branch.points[i])
                step, i = branch.points[i].step, i + 1
            stop = step >= end or (served and served[-1].triggered)
            if stop or (branch.final is not None and i == len(branch.points)):
                break
            self._grow(task, history, branch, end)
        self.served_steps += step - at
        final = branch.final if branch.final is not None and i == len(branch.points) else None
        if final is not None:
            result = dataclasses.replace(final.result, steps=step, steps_quantum=step - at, trace=served,
                                         best_loss=served[-1].best_loss if served else final.result.best_loss)
            return QuantumOutcome(site.id, result, None, final.finding, "replay")
        # not final: as the real search's other quanta (the status of a search not ended is SEARCHING)
        best = served[-1].best_loss if served else best
        template = self.templates.get((config, site.id))
        if template is None:
            result = QuantumResult(site.id, step, step - at, served, SiteStatus.SEARCHING, best,
                                   log_space=branch.final.result.log_space if branch.final else False)
        else:
            result = dataclasses.replace(template, steps=step, steps_quantum=step - at, trace=served, best_loss=best)
        outside, probed = self._verdict(task, history, step) if task.probe_steps > 0 else (None, 0)
        return QuantumOutcome(site.id, result, None, None, "replay", outside=outside, probe_steps=probed)

    def _verdict(self, task: Task, history: tuple[int, ...], step: int) -> tuple[bool | None, int]:
        """The out-of-box probe of the site's search standing at ``step`` of branch ``history``,
        run for real the first time (the worker's search is put there, probed, and left as it stood)."""
        key = (task.config, task.site.id, history, step, task.probe_steps)
        if key not in self.verdicts:
            self._reach(task, history, step)
            out = self.worker.run(task.spec, task.site, task.config, 0, False, Resume(ASK, (), step),
                                  probe_steps=task.probe_steps)
            if out.result.steps != step:
                raise NotReplayable(f"{task.site.label}: the probe at step {step} moved the search")
            self.real_steps += out.probe_steps
            self.verdicts[key] = (out.outside, out.probe_steps)
        return self.verdicts[key]

    # -- growing the tree ------------------------------------------------------------------------------
    def _run(self, task: Task, steps: int, refresh: bool, checkpoint: Any = None, fresh: bool = False):
        if fresh or checkpoint is not None:
            self.worker.searches.pop(task.site.id, None)
            resume = Resume.at(checkpoint)
        else:                                  # on from where the worker's live search stands
            live = self.worker.searches.get(task.site.id)
            resume = Resume(ASK, (), live.step if live is not None else -1)
        out = self.worker.run(task.spec, task.site, task.config, steps, refresh, resume)
        self.real_steps += out.result.steps_quantum
        if out.result.status is SiteStatus.ERROR:
            raise NotReplayable(f"{task.site.label}: the search raised: {out.result.error}")
        return out

    def _grow(self, task: Task, history: tuple[int, ...], branch: Branch, end: int) -> None:
        """Run the branch on for real from its end to ``end`` (past it when the last step overshoots)."""
        first = history and not branch.started
        if first:   # the refresh that opens this branch runs with its first quantum
            self._reach(task, history[:-1], branch.start)
        else:
            self._reach(task, history, branch.end)
        out = self._run(task, end - branch.end, refresh=bool(first))
        branch.started = True
        branch.add(out.result.trace)
        if out.result.steps != branch.end:
            raise NotReplayable(f"{task.site.label}: a quantum ended at step {out.result.steps}, "
                                f"its trace at {branch.end}")
        self._keep(task, history, branch, out)

    def _keep(self, task: Task, history: tuple[int, ...], branch: Branch, out: QuantumOutcome) -> None:
        if out.result.status.final:
            branch.final = out
            self.live.pop(task.site.id, None)
            return
        self.templates[task.config, task.site.id] = dataclasses.replace(out.result, trace=[], seconds=0.0)
        self.live[task.site.id] = (task.config, history, out.result.steps)
        if out.checkpoint is not None and all(out.result.steps - c >= CHECKPOINT_EVERY for c in branch.checkpoints):
            branch.checkpoints[out.result.steps] = out.checkpoint

    def _reach(self, task: Task, history: tuple[int, ...], step: int) -> None:
        """Put the worker's search of the site where it stands at ``step`` of branch ``history``."""
        if self.live.get(task.site.id) == (task.config, history, step):
            return
        branch = self.trees[task.config, task.site.id][history]
        done = [c for c in branch.checkpoints if c <= step]
        if done:
            out = self._run(task, 0, refresh=False, checkpoint=branch.checkpoints[max(done)])
        elif not history:
            out = self._run(task, 0, refresh=False, fresh=True)
        else:
            self._reach(task, history[:-1], branch.start)
            out = self._run(task, 0, refresh=True)
        while out.result.steps < step:     # a candidate that did not replay ends a quantum early
            at = out.result.steps
            out = self._run(task, step - at, refresh=False)
            i = branch.index_at(at)
            if not _same(out.result.trace, branch.points[i:i + len(out.result.trace)]):
                raise NotReplayable(f"{task.site.label}: re-running steps {at}-{step} gave another trace: the "
                                    "search is not slice-independent; run the benchmark without the cache")
            if out.result.status.final:
                raise NotReplayable(f"{task.site.label}: re-running to step {step} ended the search")
        if out.result.steps != step:
            raise NotReplayable(f"{task.site.label}: re-running to step {step} overshot to {out.result.steps}")
        self._keep(task, history, branch, out)


@dataclass
class _Position:
    history: tuple[int, ...] = ()
    step: int = 0
    best: float = float("inf")


class ReplayingExecutor:
    """An executor for one campaign (``num_actors: 0``: one slot) whose quanta come from a
    :class:`SearchCache`; the controller cannot tell it from a LocalExecutor."""

    def __init__(self, cache: SearchCache) -> None:
        self.cache = cache
        self.slots = 1
        self._queue: deque[Task] = deque()
        self._at: dict[str, _Position] = {}

    @property
    def running(self) -> int:
        return len(self._queue)

    def discover(self, specs):
        return self.cache.discover(specs)

    def submit(self, task: Task) -> None:
        self._queue.append(task)

    def wait(self, timeout: float):
        if not self._queue:
            return []
        task = self._queue.popleft()
        at = self._at.setdefault(task.site.id, _Position())
        out = self.cache.serve(task, at.history, at.step, at.best)
        if task.refresh:
            at.history = at.history + (at.step,)
        at.step, at.best = out.result.steps, out.result.best_loss
        return [(task, out)]

    def shutdown(self) -> None:
        pass


def fingerprint(root: Path) -> str:
    """A hash of the code a search depends on (the engine, the worker that judges the out-of-box
    probe's verdicts, which the cache replays, and the benchmark's targets): a saved cache is used
    only while it is unchanged."""
    h = hashlib.sha256()
    paths = [p for folder in ("fuzz_core", "benchmarks/targets", "campaigns/targets")
             for p in sorted((root / folder).rglob("*.py"))] + [root / "orchestrator" / "worker.py"]
    for path in paths:
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
