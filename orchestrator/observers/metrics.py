"""Live campaign metrics for dashboards: Ray metrics, scraped by Prometheus from every node.

:class:`MetricsObserver` calls :class:`CampaignMetrics` after each quantum and each finding::

    metrics = CampaignMetrics(campaign.name)
    metrics.quantum(site, last_loss, best_loss, steps, new_steps)   # after a quantum
    metrics.finding(site)                                           # after a finding is written

Every call is a no-op unless this process is connected to Ray (a ``--local`` run, or a
process that never imported Ray, costs one dict lookup), and a metrics failure is
logged once and never stops the campaign.

Ray exports the values on the Prometheus endpoint of the node the driver runs on
(``ray start --metrics-export-port=PORT``, then ``http://NODE:PORT/metrics``), with the
``ray_`` prefix and a few seconds late (the metrics agent reports every few seconds).
Exported series (tags: ``campaign``, ``target``, ``site`` = the site id, ``op``; Ray adds
``SessionName``, ``NodeAddress`` and friends):

==================================  =======  ==================================================
``ray_cdeepfuzz_suspect_loss``      gauge    suspect loss at the last step of the site's last quantum
``ray_cdeepfuzz_best_loss``         gauge    best (lowest) suspect loss of the site so far
``ray_cdeepfuzz_site_steps``        gauge    steps the site has used
``ray_cdeepfuzz_steps_total``       counter  steps run, per campaign and target (no site tags)
``ray_cdeepfuzz_findings_total``    counter  confirmed findings, per site
==================================  =======  ==================================================

Non-finite losses (a site that has not run yet) are not set: a gauge keeps its last
finite value.
"""
from __future__ import annotations

import logging
import math
import sys
from typing import Any

from orchestrator.observers.base import Observer

log = logging.getLogger(__name__)

SITE_TAGS = ("campaign", "target", "site", "op")
TARGET_TAGS = ("campaign", "target")

SUSPECT_LOSS = "cdeepfuzz_suspect_loss"
BEST_LOSS = "cdeepfuzz_best_loss"
SITE_STEPS = "cdeepfuzz_site_steps"
STEPS = "cdeepfuzz_steps"
FINDINGS = "cdeepfuzz_findings"

_instruments: dict[str, Any] | None = None     # one set per process: Ray keys metrics by name


def ray_connected() -> bool:
    """Whether this process is a Ray driver or worker (without importing Ray)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return bool(ray.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def _make_instruments() -> dict[str, Any]:
    global _instruments
    if _instruments is None:
        from ray.util.metrics import Counter, Gauge

        _instruments = {
            SUSPECT_LOSS: Gauge(SUSPECT_LOSS, "suspect loss of the op site at the last step of its last quantum",
                                tag_keys=SITE_TAGS),
            BEST_LOSS: Gauge(BEST_LOSS, "best (lowest) suspect loss of the op site so far", tag_keys=SITE_TAGS),
            SITE_STEPS: Gauge(SITE_STEPS, "steps the op site has used", tag_keys=SITE_TAGS),
            STEPS: Counter(STEPS, "steps run (forward passes of the target)", tag_keys=TARGET_TAGS),
            FINDINGS: Counter(FINDINGS, "confirmed findings", tag_keys=SITE_TAGS),
        }
    return _instruments


def _site_fields(site: Any) -> tuple[str, str, str]:
    """(site id, target, op) of an OpSite, a SiteRecord (``.site``) or a plain dict."""
    site = getattr(site, "site", site)
    if isinstance(site, dict):
        return str(site.get("id", "")), str(site.get("target", "")), str(site.get("op", ""))
    return str(getattr(site, "id", site)), str(getattr(site, "target", "")), str(getattr(site, "op", ""))


class CampaignMetrics:
    """Per-site gauges and counters of one campaign; a no-op when Ray is not initialized."""

    def __init__(self, campaign: str, enabled: bool = True) -> None:
        self.campaign = campaign
        self.enabled = enabled          # False: export nothing (``cdeepfuzz run --no-metrics``)
        self._seen_steps: dict[str, int] = {}
        self._failed = False

    @property
    def active(self) -> bool:
        return self.enabled and not self._failed and ray_connected()

    def _instruments(self) -> dict[str, Any] | None:
        if not self.active:
            return None
        try:
            return _make_instruments()
        except Exception as exc:  # noqa: BLE001 - dashboards are optional
            self._fail(exc)
            return None

    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        log.warning("Ray metrics disabled for campaign %s: %s", self.campaign, exc)

    def quantum(self, site: Any, last_loss: float | None, best_loss: float | None, steps: int,
                new_steps: int | None = None) -> None:
        """After a quantum: ``steps`` is the site's total; ``new_steps`` those of this quantum.

        Without ``new_steps`` the step counter grows by the change of ``steps`` since this
        object last saw the site (all of ``steps`` the first time).
        """
        inst = self._instruments()
        if inst is None:
            return
        site_id, target, op = _site_fields(site)
        tags = {"campaign": self.campaign, "target": target, "site": site_id, "op": op}
        steps = int(steps)
        if new_steps is None:
            new_steps = steps - self._seen_steps.get(site_id, 0)
        self._seen_steps[site_id] = steps
        try:
            if last_loss is not None and math.isfinite(last_loss):
                inst[SUSPECT_LOSS].set(float(last_loss), tags=tags)
            if best_loss is not None and math.isfinite(best_loss):
                inst[BEST_LOSS].set(float(best_loss), tags=tags)
            inst[SITE_STEPS].set(float(steps), tags=tags)
            if new_steps > 0:
                inst[STEPS].inc(float(new_steps), tags={"campaign": self.campaign, "target": target})
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def finding(self, site: Any) -> None:
        """After a finding was written."""
        inst = self._instruments()
        if inst is None:
            return
        site_id, target, op = _site_fields(site)
        try:
            inst[FINDINGS].inc(1.0, tags={"campaign": self.campaign, "target": target, "site": site_id, "op": op})
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)


class MetricsObserver(Observer):
    """The live metrics as an observer of the run."""

    def __init__(self, campaign: str, enabled: bool = True) -> None:
        self.metrics = CampaignMetrics(campaign, enabled)

    def quantum(self, rec, result) -> None:
        self.metrics.quantum(rec.site, rec.last_loss, rec.best_loss, rec.steps, len(result.trace))

    def finding(self, rec, finding, folder) -> None:
        self.metrics.finding(rec.site)
