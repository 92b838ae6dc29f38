"""The policies a campaign can name (``scheduler.policy``), built from its options."""
from __future__ import annotations

import inspect
from typing import Any

from orchestrator.scheduling.core import Scheduler
from orchestrator.scheduling.loss_slope import LossSlopeScheduler
from orchestrator.scheduling.round_robin import RoundRobinScheduler
from orchestrator.scheduling.share import ShareScheduler

POLICIES: dict[str, type[Scheduler]] = {
    ShareScheduler.policy: ShareScheduler,
    LossSlopeScheduler.policy: LossSlopeScheduler,
    RoundRobinScheduler.policy: RoundRobinScheduler,
}
DEFAULT_POLICY = ShareScheduler.policy


def policy_options(policy: str) -> list[str]:
    """The option names a policy accepts (beyond max_steps and quantum)."""
    cls = _policy(policy)
    return sorted(set(inspect.signature(cls.__init__).parameters) - {"self", "max_steps", "quantum"})


def make_scheduler(policy: str, max_steps: int, quantum: int, **options: Any) -> Scheduler:
    """Build the scheduler named by a campaign's ``scheduler.policy`` (a str or str Enum)."""
    known = policy_options(policy)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for policy {policy!r}; known: {known}")
    return _policy(policy)(max_steps, quantum, **options)


def restore_scheduler(state: dict[str, Any]) -> Scheduler:
    """A scheduler rebuilt from a :meth:`Scheduler.state` alone (its config is in it)."""
    config = state.get("config") if isinstance(state, dict) else None
    if not isinstance(config, dict):
        raise ValueError("not a scheduler state: no config")
    sched = make_scheduler(config.get("policy"), config.get("max_steps"), config.get("quantum"),
                           **(config.get("options") or {}))
    sched.restore(state)
    return sched


def _policy(policy: Any) -> type[Scheduler]:
    cls = POLICIES.get(getattr(policy, "value", policy))
    if cls is None:
        raise ValueError(f"unknown scheduler policy {policy!r}; known: {sorted(POLICIES)}")
    return cls
