"""Site status: one vocabulary for summary.json, MLflow tags and the CLI."""
from __future__ import annotations

from enum import Enum


class SiteStatus(str, Enum):
    PENDING = "pending"
    SEARCHING = "searching"
    FOUND = "found"
    EXHAUSTED = "exhausted"
    UNREACHABLE = "unreachable"
    ERROR = "error"
    TIMEOUT = "timeout"
    STOPPED = "stopped"

    @property
    def final(self) -> bool:
        return self not in (SiteStatus.PENDING, SiteStatus.SEARCHING)

    def __str__(self) -> str:  # so f-strings and tags show the value
        return self.value
