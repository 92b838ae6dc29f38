"""The work of one actor (or of the driver, with ``num_actors: 0``): build targets, run quanta.

A :class:`Worker` keeps the targets it has built and the searches of the sites it
owns. It returns plain data (the quantum's trace, the checkpoint, a confirmed
finding with its values) and writes nothing: the controller is the only writer.
"""
from __future__ import annotations

import logging
import os
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fuzz_core.backends.base import RunnerOptions
from fuzz_core.engine import TargetSpec, build_runner, discover_sites, finding_from
from fuzz_core.loader import EntryError
from fuzz_core.findings import Finding
from fuzz_core.search import QuantumResult, SearchConfig, SiteSearch
from fuzz_core.sites import OpSite
from fuzz_core.status import SiteStatus
from fuzz_core.target import TargetError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerOptions:
    device: str = "cpu"
    search_weights: bool = False
    num_threads: int = 1
    minimise: bool = True


@dataclass
class QuantumOutcome:
    """Everything a quantum produced, sent back to the controller."""

    site_id: str
    result: QuantumResult
    checkpoint: tuple[dict[str, np.ndarray], dict] | None
    finding: Finding | None = None
    worker: str = ""


class TargetFailure(Exception):
    """A target that could not be built or whose program raised.

    ``contract`` marks a user mistake that breaks the target contract (the factory is
    missing, returns the wrong thing, bounds with low > high, a sample without a
    batch dimension): a configuration error (exit 2), not a bug of the program (exit 3).
    """

    def __init__(self, message: str, tb: str, contract: bool = False) -> None:
        super().__init__(message)
        self.tb = tb
        self.contract = contract

    def __reduce__(self):
        # Ray (and multiprocessing) rebuild an exception from ``type(exc)(*exc.args)`` unless told
        # otherwise: without this the driver gets a TypeError instead of the user's message.
        return (type(self), (str(self), self.tb, self.contract))


def _failure(exc: Exception) -> TargetFailure:
    contract = isinstance(exc, (TargetError, EntryError))
    message = str(exc) if contract else f"{type(exc).__name__}: {exc}"
    return TargetFailure(message, traceback.format_exc(), contract)


@dataclass
class Worker:
    options: WorkerOptions = field(default_factory=WorkerOptions)
    runners: dict[str, Any] = field(default_factory=dict)
    searches: dict[str, SiteSearch] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)   # target name -> site id whose state the runner holds

    def __post_init__(self) -> None:
        _set_threads(self.options.num_threads)

    def name(self) -> str:
        return f"pid{os.getpid()}"

    def runner(self, spec: TargetSpec):
        runner = self.runners.get(spec.name)
        if runner is None:
            try:
                runner = build_runner(spec, RunnerOptions(device=self.options.device,
                                                          search_weights=self.options.search_weights))
            except Exception as exc:  # noqa: BLE001 - reported per target, the campaign goes on
                raise _failure(exc) from None
            self.runners[spec.name] = runner
        return runner

    def discover(self, spec: TargetSpec) -> list[OpSite]:
        runner = self.runner(spec)
        try:
            return discover_sites(runner, spec.seed)
        except Exception as exc:  # noqa: BLE001
            raise _failure(exc) from None

    def try_discover(self, spec: TargetSpec) -> list[OpSite] | TargetFailure:
        """:meth:`discover`, with a target's failure returned, not raised: it is reported per target."""
        try:
            return self.discover(spec)
        except TargetFailure as exc:
            return exc

    def run(self, spec: TargetSpec, site: OpSite, config: SearchConfig, steps: int, refresh: bool = False,
            checkpoint: tuple[dict[str, np.ndarray], dict] | None = None) -> QuantumOutcome:
        runner = self.runner(spec)
        search = self.searches.get(site.id)
        if search is None or checkpoint is not None and search.step < int(checkpoint[1]["step"]):
            search = SiteSearch(runner, site, config)
            if checkpoint is not None:
                search.restore(*checkpoint)
            self.searches[site.id] = search
        elif self.owner.get(spec.name) != site.id:
            search.resume()
        self.owner[spec.name] = site.id
        try:
            result = search.run(steps, refresh=refresh)
        except Exception as exc:  # noqa: BLE001 - the program raised: this site is an error
            self.searches.pop(site.id, None)
            self.owner.pop(spec.name, None)
            result = QuantumResult(site.id, search.step, 0, [], SiteStatus.ERROR, search.best,
                                   error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}",
                                   seconds=search.seconds)
            return QuantumOutcome(site.id, result, None, worker=self.name())
        finding = None
        if result.candidate is not None:
            finding = finding_from(runner, spec, site, config, result.candidate, result.seconds,
                                   device=str(getattr(runner, "device", "cpu")), minimise_batch=self.options.minimise)
            if finding is None:     # did not replay: not a finding; the search goes on from here
                search.candidate = None
                result.candidate = None
                result.status = search.status()
            self.owner.pop(spec.name, None)
        if result.status.final:
            self.searches.pop(site.id, None)
            return QuantumOutcome(site.id, result, None, finding, self.name())
        search.park()
        return QuantumOutcome(site.id, result, search.checkpoint(), finding, self.name())


def _set_threads(n: int) -> None:
    try:
        import torch

        torch.set_num_threads(max(1, int(n)))
    except Exception:  # noqa: BLE001 - torch is optional in a TF-only worker
        pass
