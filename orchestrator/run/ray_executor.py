"""A pool of Ray actors, each running one site's quantum at a time.

Sites stay on the actor that holds their search live (affinity), and what travels to the
driver per quantum is the trace, not the site's model and optimizer state: with more than
one actor, each actor keeps its site's latest checkpoint in its node's object store and
returns only a reference (``QuantumOutcome.kept``), which this executor holds and hands to
another actor when the site moves; the data crosses only then. A site whose actor
restarted resumes from the controller's last persisted checkpoint and the quanta since
(``Resume``), which the driver sends only when an actor asks for it (:class:`NeedsResume`).
Ray cannot cancel a running actor task, so a quantum over its time limit is ended with
``ray.kill(actor, no_restart=False)``.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, NamedTuple

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from fuzz_core.engine import TargetSpec
from fuzz_core.sites import OpSite
from orchestrator.run.executors import ActorDied, QuantumTimeout, Task, discovery_timeout
from orchestrator.run.replays import KnownBug, ReplayOutcome, replay_known
from orchestrator.run.stopping import StopRun
from orchestrator.worker import (
    ASK, NeedsResume, QuantumOutcome, Resume, TargetFailure, Worker, WorkerOptions, write_into,
)

log = logging.getLogger(__name__)

# How long to wait for the GPU bundles of a campaign (an autoscaler may be adding nodes).
PLACEMENT_TIMEOUT_S = float(os.environ.get("CDEEPFUZZ_PLACEMENT_TIMEOUT_S", "600"))


@dataclasses.dataclass(frozen=True)
class StoredCheckpoint:
    """A ``Resume.source`` in Ray's object store: fetched by the actor that needs it, and only then."""

    ref: Any

    def load(self):
        return ray.get(self.ref)


class Held(NamedTuple):
    """A site's latest checkpoint, kept in the object store of the actor that ran it."""
    ref: Any
    step: int
    actor: int


@ray.remote
class SiteActor:
    """A :class:`Worker` in its own process. With ``keep`` (more than one actor: sites may move),
    each quantum's checkpoint is put in this node's object store and only its reference returned."""

    def __init__(self, options: WorkerOptions, cwd: str | None = None, keep: bool = False) -> None:
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        self.worker = Worker(_with_gpu_share(options))
        self.keep = keep

    def discover(self, spec: TargetSpec) -> list[OpSite] | TargetFailure:
        return self.worker.try_discover(spec)

    def run(self, task: Task) -> QuantumOutcome | NeedsResume:
        try:
            out = self.worker.run(task.spec, task.site, task.config, task.steps, task.refresh, task.resume,
                                  task.want_checkpoint or self.keep, task.probe_steps, task.known)
        except NeedsResume as exc:
            return exc
        except ObjectLostError:       # the actor that kept the checkpoint died: the driver sends its own
            return NeedsResume(task.site.id)
        if self.keep and not task.want_checkpoint and out.checkpoint is not None:
            out.kept, out.checkpoint = ray.put(out.checkpoint), None
        return write_into(task.into, out)

    def sees(self, path: str, token: str) -> bool:
        """Whether this actor sees the file ``path`` the driver wrote (the run folder is on a disk they share)."""
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read() == token
        except OSError:
            return False

    def replay(self, bugs: list[KnownBug]) -> list[ReplayOutcome]:
        return [replay_known(self.worker, bug) for bug in bugs]

    def pid(self) -> int:
        return os.getpid()

    def gpu_ids(self) -> list:
        return list(ray.get_gpu_ids())


def _with_gpu_share(options: WorkerOptions) -> WorkerOptions:
    """Cap this process's GPU memory at its share when Ray gave it a fraction of a GPU."""
    share = float(os.environ.get("CDEEPFUZZ_GPU_SHARE", "0") or 0)
    if share > 0 and options.device in ("cuda", "auto"):
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.set_per_process_memory_fraction(min(1.0, share))
        except Exception as exc:  # noqa: BLE001
            log.warning("could not cap GPU memory: %s", exc)
    return options


class RayExecutor:
    writes_run_folder = False      # until bind_run_folder has seen every actor see it

    def __init__(self, options: WorkerOptions, num_actors: int, num_cpus: float, num_gpus: float,
                 max_restarts: int, quantum_timeout_s: float, stop=None) -> None:
        self.stop = stop
        self.deadline: float | None = None    # the controller checks the campaign's time limit between waits
        self.discovery_timeout = discovery_timeout(quantum_timeout_s)
        env = {"CDEEPFUZZ_GPU_SHARE": str(num_gpus)} if num_gpus else {}
        actor_options = dict(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts,
                             max_task_retries=0, runtime_env={"env_vars": env} if env else None)
        cwd = os.getcwd() if not os.environ.get("RAY_ADDRESS") else None
        # Actors that share GPUs are packed: one bundle per actor, as few nodes (and so GPUs)
        # as fit, e.g. four 0.25-GPU actors on one GPU instead of one on each of four nodes.
        self.placement_group = _packed_group(num_actors, num_cpus, num_gpus) if num_gpus else None
        self.actors = [SiteActor.options(**actor_options, scheduling_strategy=self._strategy(i))
                       .remote(options, cwd, num_actors > 1) for i in range(num_actors)]
        self.slots = num_actors
        self.timeout = quantum_timeout_s
        self.busy: dict[int, tuple[Any, Task]] = {}      # actor index -> (ref, task)
        self.affinity: dict[str, int] = {}
        self.held: dict[str, Held] = {}                  # site id -> its latest checkpoint in an actor's store
        self.resent = 0                                  # tasks sent again with the driver's checkpoint

    def bind_run_folder(self, run_dir) -> bool:
        """Let the actors write findings and checkpoints into the run folder themselves when every one of
        them sees it (the driver's machine, or a disk every node shares); else they send them back and the
        driver writes them, as before (workers need no shared disk)."""
        import uuid

        token = uuid.uuid4().hex
        marker = os.path.join(str(run_dir), f".actors-see-{token[:8]}")
        try:
            with open(marker, "w", encoding="utf-8") as fh:
                fh.write(token)
            self.writes_run_folder = all(ray.get([a.sees.remote(marker, token) for a in self.actors], timeout=60))
        except Exception as exc:  # noqa: BLE001 - the actors send their results back instead
            log.info("the actors do not write into the run folder (%s): the driver does", exc)
            self.writes_run_folder = False
        finally:
            try:
                os.unlink(marker)
            except OSError:
                pass
        return self.writes_run_folder

    def _strategy(self, index: int):
        if self.placement_group is None:
            return None
        return PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=index)

    @property
    def running(self) -> int:
        return len(self.busy)

    def discover(self, specs: list[TargetSpec]) -> dict[str, list[OpSite] | TargetFailure]:
        """Each target's sites, or its failure; a target whose discovery runs past the quantum time limit
        fails (its actor is killed). A stop request (SIGTERM, SIGINT) raises :class:`StopRun`."""
        pending = {self.actors[i % len(self.actors)].discover.remote(spec): (spec, i % len(self.actors))
                   for i, spec in enumerate(specs)}
        out: dict[str, list[OpSite] | TargetFailure] = {}
        deadline = time.monotonic() + self.discovery_timeout
        while pending:
            if self.stop is not None and self.stop.reason is not None:
                raise StopRun(self.stop.reason)
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.5)
            for ref in ready:
                spec, _index = pending.pop(ref)
                try:
                    out[spec.name] = ray.get(ref)
                except (RayActorError, RayTaskError) as exc:
                    out[spec.name] = TargetFailure(f"discovery failed: {str(exc).splitlines()[0]}", str(exc))
            if pending and time.monotonic() > deadline:
                for ref, (spec, index) in pending.items():
                    ray.kill(self.actors[index], no_restart=False)
                    out[spec.name] = TargetFailure(
                        f"building and running the target once took over {self.discovery_timeout:g}s: it hangs", "")
                pending = {}
        return {spec.name: out[spec.name] for spec in specs}

    def replay(self, bugs: list[KnownBug]) -> list[ReplayOutcome]:
        """Replay known bugs on the actors, each target's bugs on one actor (which builds it once)."""
        by_target: dict[str, list[KnownBug]] = {}
        for bug in bugs:
            by_target.setdefault(bug.spec.name, []).append(bug)
        refs = [(group, self.actors[i % len(self.actors)].replay.remote(group))
                for i, group in enumerate(by_target.values())]
        out: list[ReplayOutcome] = []
        for group, ref in refs:
            try:
                out += ray.get(ref)
            except (RayActorError, RayTaskError) as exc:
                out += [ReplayOutcome(b.signature, None, error=f"the replay failed: {str(exc).splitlines()[0]}",
                                      traceback=str(exc)) for b in group]
        return out

    def free_actor(self, site_id: str) -> int | None:
        owner = self.affinity.get(site_id)
        if owner is not None and owner not in self.busy:
            return owner
        owned = set(self.affinity.values())
        free = [i for i in range(len(self.actors)) if i not in self.busy]
        unowned = [i for i in free if i not in owned]
        return (unowned or free or [None])[0]

    def submit(self, task: Task) -> None:
        index = self.free_actor(task.site.id)
        if index is None:
            raise RuntimeError("no free actor: the controller granted more tasks than slots")
        task.actor = index
        task.started = time.monotonic()
        self.affinity[task.site.id] = index
        self.busy[index] = (self.actors[index].run.remote(self._sent(task)), task)

    def _sent(self, task: Task, ask: bool = True) -> Task:
        """The task as the actor gets it: the resume is the latest checkpoint an actor keeps when it is at
        the site's step, else the controller's (its checkpoint asked for, not sent: most tasks go to the actor
        that holds the site live and never read it)."""
        resume = task.resume or Resume()
        held = self.held.get(task.site.id)
        if held is not None and held.step == resume.step:
            resume = Resume(StoredCheckpoint(held.ref), (), resume.step)
        elif resume.source is not None and ask:
            resume = dataclasses.replace(resume, source=ASK)
        elif resume.source is not None:
            source = resume.source
            resume = dataclasses.replace(resume, source=StoredCheckpoint(ray.put(source.load() if hasattr(
                source, "load") else source)))
        return dataclasses.replace(task, resume=resume)

    def wait(self, timeout: float) -> list[tuple[Task, QuantumOutcome | BaseException]]:
        if not self.busy:
            return []
        refs = [ref for ref, _ in self.busy.values()]
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        done: list[tuple[Task, QuantumOutcome | BaseException]] = []
        for index, (ref, task) in list(self.busy.items()):
            if ref in ready:
                del self.busy[index]
                out = self._result(ref, task)
                if isinstance(out, NeedsResume):         # it did not hold the site: send the checkpoint
                    self.held.pop(task.site.id, None)
                    self.resent += 1
                    self.busy[index] = (self.actors[index].run.remote(self._sent(task, ask=False)), task)
                    continue
                self._keep(task, out)
                done.append((task, out))
            elif time.monotonic() - task.started > self.timeout:
                log.warning("quantum of %s over %.0fs: killing its actor", task.site.label, self.timeout)
                ray.kill(self.actors[index], no_restart=False)
                del self.busy[index]
                self._forget(index)
                done.append((task, QuantumTimeout(f"quantum over {self.timeout:g}s")))
        return done

    def _result(self, ref, task: Task) -> QuantumOutcome | BaseException:
        try:
            return ray.get(ref, timeout=60)
        except RayActorError as exc:
            self._forget(task.actor)
            return ActorDied(str(exc).splitlines()[0] if str(exc) else "actor died")
        except (RayTaskError, GetTimeoutError) as exc:
            return exc

    def _keep(self, task: Task, out) -> None:
        """Hold the checkpoint reference a quantum left in its actor's store (any older one is stale)."""
        self.held.pop(task.site.id, None)
        if isinstance(out, QuantumOutcome) and out.kept is not None:
            self.held[task.site.id] = Held(out.kept, out.result.steps, task.actor)
            out.kept = None

    def _forget(self, index: int) -> None:
        """A restarted actor has lost its searches and what it kept: its sites resume from the controller's
        checkpoints and the quanta since."""
        for site_id, owner in list(self.affinity.items()):
            if owner == index:
                del self.affinity[site_id]
        for site_id, held in list(self.held.items()):
            if held.actor == index:
                del self.held[site_id]

    def actor_pid(self, index: int) -> int:
        return ray.get(self.actors[index].pid.remote())

    def shutdown(self) -> None:
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []
        if self.placement_group is not None:
            try:
                remove_placement_group(self.placement_group)
            except Exception:  # noqa: BLE001
                pass
            self.placement_group = None


def _packed_group(num_actors: int, num_cpus: float, num_gpus: float):
    bundles = [{"CPU": float(num_cpus), "GPU": float(num_gpus)} for _ in range(num_actors)]
    group = placement_group(bundles, strategy="PACK")
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except GetTimeoutError:
        remove_placement_group(group)
        raise RuntimeError(f"the cluster cannot place {num_actors} actors of {num_cpus:g} CPU and {num_gpus:g} GPU "
                           f"within {PLACEMENT_TIMEOUT_S:g}s (see `ray status`; CDEEPFUZZ_PLACEMENT_TIMEOUT_S)") from None
    return group
