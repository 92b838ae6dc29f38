"""The bug store observer: each finding joins its bug in ``<output>/bugs/<signature>/``
(:mod:`fuzz_core.dedupe`: every occurrence, the smallest reproducer and the bug's triage state)."""
from __future__ import annotations

from pathlib import Path

from fuzz_core.dedupe import BUGS_DIR, REPRODUCER, record_finding
from orchestrator.observers.base import Observer


def reproducer_folder(root: Path | str, signature: str) -> Path:
    """Where the smallest reproducer of a bug lies in an output folder."""
    return Path(root) / BUGS_DIR / signature / REPRODUCER


class BugStoreObserver(Observer):
    def __init__(self, root: Path | str, campaign: str = "") -> None:
        self.root = Path(root)
        self.campaign = campaign

    def finding(self, rec, finding, folder) -> None:
        record_finding(self.root, folder, self.campaign)
