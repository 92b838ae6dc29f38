"""One vocabulary for summary.json, finding.json, Parquet, MLflow tags and the CLI.

Every site, and every run, carries a :class:`SiteStatus` (or :class:`RunState`) and an
:class:`ExitReason` that says why it ended. ``exhausted`` means the budget was spent; a
site the scheduler retired early with budget left is ``retired`` (reason ``no_progress``).
"""
from __future__ import annotations

from enum import Enum


class _Value(str, Enum):
    def __str__(self) -> str:  # so f-strings and tags show the value
        return self.value


class SiteStatus(_Value):
    PENDING = "pending"
    SEARCHING = "searching"
    FOUND = "found"              # a bug at its op, confirmed by every replay (whichever site's search found it)
    FLAKY = "flaky"              # a candidate that some replays reproduced, not all
    EXHAUSTED = "exhausted"      # its whole step budget spent, nothing found
    RETIRED = "retired"          # ended early, budget left: no progress, or blocked by another op's bug
    UNREACHABLE = "unreachable"  # no gradient path from any searched value, nothing else moves
    ERROR = "error"              # the program raised, its actor kept dying, or an internal error
    TIMEOUT = "timeout"          # quanta over their time limit
    STOPPED = "stopped"          # the campaign stopped first (time limit, signal, Ctrl-C)

    @property
    def final(self) -> bool:
        return self not in (SiteStatus.PENDING, SiteStatus.SEARCHING)

    @property
    def finding(self) -> bool:
        """The site ended with a finding (reproduced always, or sometimes)."""
        return self in (SiteStatus.FOUND, SiteStatus.FLAKY)


class RunState(_Value):
    RUNNING = "running"
    COMPLETED = "completed"      # every site reached a final status of its own
    STOPPED = "stopped"          # stopped before completion (time limit, signal, Ctrl-C)
    FAILED = "failed"            # the campaign itself failed (not a target: the tool or its environment)


class ExitReason(_Value):
    """Why a site, or a run, ended."""

    NONE = "none"                      # not ended yet
    TRIGGERED = "triggered"            # a replay confirmed the candidate
    TRIGGERED_FLAKY = "triggered_flaky"  # some replays confirmed it
    BUDGET_SPENT = "budget_spent"      # max_steps used
    NO_PROGRESS = "no_progress"        # retired by the scheduler: refreshes stayed fruitless
    BLOCKED = "blocked"                # retired: its search ended on another op's bug it cannot step past
    UNREACHABLE = "unreachable"        # no gradient path to the suspect loss
    TARGET_ERROR = "target_error"      # the factory or program raised
    INTERNAL_ERROR = "internal_error"  # CDeepFuzz itself failed (a bug to report, not the user's)
    ACTOR_DIED = "actor_died"          # its actor kept dying
    QUANTUM_TIMEOUT = "quantum_timeout"  # quanta over quantum_timeout_s
    TIME_LIMIT = "time_limit"          # the campaign's time_limit_s
    SIGNAL = "signal"                  # SIGTERM (ray job stop, Kubernetes, Slurm)
    INTERRUPTED = "interrupted"        # SIGINT / Ctrl-C
    COMPLETED = "completed"            # a run: every site ended on its own


class Phase(_Value):
    """Where in a step a non-finite value arose."""

    FORWARD = "forward"      # an op of the program's forward pass, or its loss
    BACKWARD = "backward"    # a gradient of the program's own training step
    UPDATE = "update"        # the optimizer's update, or the weights it wrote
