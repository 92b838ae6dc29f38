"""The step-budget scheduler: decides which op sites get the next quanta of steps.

Pure (stdlib, numpy and ``fuzz_core.status``): the controller reports with
``on_progress`` and ``retire``, asks with ``allocate``, and alone turns the returned
:class:`Decision` values into actor calls. Policies, one module each: ``share`` (the
default: proportional shares by predicted chance of triggering soon, composed of the
parts in ``parts.py``), ``loss-slope`` (the previous default: strict priority between
tiers) and ``round-robin`` (the baseline). Missing or NaN data in a report means
"continue". ``Scheduler.state()`` / ``restore()`` make resume a reload.
"""
from orchestrator.scheduling.core import (
    RETIRED_AS, Action, Allocation, Decision, RankedScheduler, Scheduler, SiteBook, SiteProgress,
)
from orchestrator.scheduling.factory import (
    DEFAULT_POLICY, POLICIES, make_scheduler, policy_options, restore_scheduler,
)
from orchestrator.scheduling.loss_slope import LossSlopeScheduler
from orchestrator.scheduling.parts import (
    CurvePredictor, Patience, PlateauRefresh, PowerSchedule, StarvationGuard,
)
from orchestrator.scheduling.round_robin import RoundRobinScheduler
from orchestrator.scheduling.share import ShareScheduler

__all__ = [
    "Action", "Allocation", "CurvePredictor", "DEFAULT_POLICY", "Decision", "LossSlopeScheduler", "POLICIES",
    "Patience", "PlateauRefresh", "PowerSchedule", "RETIRED_AS", "RankedScheduler", "RoundRobinScheduler", "Scheduler",
    "ShareScheduler", "SiteBook", "SiteProgress", "StarvationGuard", "make_scheduler", "policy_options",
    "restore_scheduler",
]
