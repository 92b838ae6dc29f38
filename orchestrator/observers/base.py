"""Observers: everything that records a run subscribes to the controller's transitions.

The controller changes state (in its run-state store) and then tells its :class:`Observer`
what changed. ``summary.json``, MLflow, Parquet, the bug store, live metrics and the terminal
view are observers; benchmarks and tests subscribe the same way. Every method of
:class:`Observer` does nothing: an observer overrides what it needs, and a run without
tracking simply has no MLflow observer (no ``if tracker is not None`` anywhere).

:class:`Observers` fans a call out to several; an observer that raises is logged and counted
(:attr:`Observers.failures`), never allowed to stop the campaign: the run-state store, not an
observer, is the source of truth.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fuzz_core.findings import Finding
    from fuzz_core.search import QuantumResult
    from fuzz_core.status import SiteStatus
    from orchestrator.run.records import FindingRecord, RunRecord, SiteRecord, TargetRecord

log = logging.getLogger(__name__)


class Observer:
    """A subscriber to a run's transitions; every method is a no-op by default."""

    def run_started(self, run: "RunRecord", resumed: bool) -> None:
        """The run began (or resumed); its targets and sites are not known yet."""

    def target_added(self, target: "TargetRecord") -> None:
        """A target was discovered (``status`` ``error`` when it could not be built or run)."""

    def site_added(self, rec: "SiteRecord") -> None:
        """A site joined the campaign (also every site of a resumed run, final or not)."""

    def sites_ready(self, sites: list["SiteRecord"]) -> None:
        """Every site of every target has been added; the search begins."""

    def quantum(self, rec: "SiteRecord", result: "QuantumResult") -> None:
        """A quantum's result was committed: its trace, the site's new steps and losses."""

    def finding(self, rec: "SiteRecord", finding: "Finding", folder: Path) -> None:
        """A finding was written (atomically, before this call) and committed: an occurrence of the bug
        ``finding.signature``, found by the search of ``rec``'s site (whose op it need not be at)."""

    def findings_restored(self, findings: list["FindingRecord"]) -> None:
        """A resumed run's findings so far (before ``sites_ready``): the bugs it has found already."""

    def site_changed(self, rec: "SiteRecord", before: "SiteStatus") -> None:
        """A site's status changed (the only place where it does: ``Controller.set_status``)."""

    def known_bug(self, record: dict[str, Any]) -> None:
        """The reuse phase replayed a known bug: ``record`` says what happened to it."""

    def tick(self) -> None:
        """Called on every turn of the controller's loop (observers keep their own cadence)."""

    def message(self, text: str) -> None:
        """A line for people (the terminal view prints it)."""

    def run_ended(self, run: "RunRecord") -> None:
        """The run ended (state and exit reason set, every site final or stopped, all committed)."""


class Observers(Observer):
    """Several observers, called in order; a failing one is logged and counted, never raised."""

    def __init__(self, observers: list[Observer]) -> None:
        self.observers = list(observers)
        self.failures: dict[str, int] = {}

    def add(self, observer: Observer) -> None:
        self.observers.append(observer)

    def _call(self, name: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, name)(*args)
            except Exception:  # noqa: BLE001 - an observer never stops the campaign
                key = type(observer).__name__
                self.failures[key] = self.failures.get(key, 0) + 1
                if self.failures[key] <= 3:
                    log.exception("observer %s failed in %s", key, name)

    def run_started(self, run, resumed):
        self._call("run_started", run, resumed)

    def target_added(self, target):
        self._call("target_added", target)

    def site_added(self, rec):
        self._call("site_added", rec)

    def sites_ready(self, sites):
        self._call("sites_ready", sites)

    def quantum(self, rec, result):
        self._call("quantum", rec, result)

    def finding(self, rec, finding, folder):
        self._call("finding", rec, finding, folder)

    def findings_restored(self, findings):
        self._call("findings_restored", findings)

    def site_changed(self, rec, before):
        self._call("site_changed", rec, before)

    def known_bug(self, record):
        self._call("known_bug", record)

    def tick(self):
        self._call("tick")

    def message(self, text):
        self._call("message", text)

    def run_ended(self, run):
        self._call("run_ended", run)
