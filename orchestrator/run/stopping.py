"""Stopping a campaign before it completes: SIGTERM, SIGINT, a time limit.

SIGTERM is what ``ray job stop``, Kubernetes and Slurm send (``ray job stop`` waits
``RAY_JOB_STOP_WAIT_TIME_S``, 3 s by default, then sends SIGKILL); SIGINT is Ctrl-C. Either one
only *asks* the controller to stop: it finishes the write it is in, records every live site as
``stopped``, closes the MLflow runs as KILLED and exits with ``EXIT_STOPPED``. A quantum that runs
in the driver itself (``--local``) is interrupted at once, by :class:`StopRun` raised from the
handler, because a program may take long per step; the site resumes from its last checkpoint.
Outside a quantum nothing is interrupted, so no write is ever cut in half.

Ray's driver installs a SIGTERM handler that aborts with a C++ stack dump (exit 134): ours
replaces it for the time of the run and the previous handlers come back after.
"""
from __future__ import annotations

import logging
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from fuzz_core.status import ExitReason

log = logging.getLogger(__name__)

SIGNALS = {signal.SIGTERM: ExitReason.SIGNAL, signal.SIGINT: ExitReason.INTERRUPTED}


class StopRun(BaseException):
    """Raised inside a quantum that runs in the driver when a stop is asked (not an ``Exception``:
    the engine's own ``except Exception`` must not swallow it)."""

    def __init__(self, reason: ExitReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


class StopRequest:
    """Why the campaign should stop (None while it should go on), set by a signal or the controller."""

    def __init__(self) -> None:
        self.reason: ExitReason | None = None
        self.signal_name: str | None = None
        self._interruptible = 0
        self._previous: dict[int, object] = {}

    def request(self, reason: ExitReason) -> None:
        if self.reason is None:
            self.reason = reason

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """Inside, a stop signal raises :class:`StopRun` at once (a quantum run in this process)."""
        if self.reason is not None:
            raise StopRun(self.reason)
        self._interruptible += 1
        try:
            yield
        finally:
            self._interruptible -= 1

    def _handle(self, signum: int, _frame) -> None:
        first = self.reason is None
        self.request(SIGNALS[signum])
        self.signal_name = self.signal_name or signal.Signals(signum).name
        if first:
            log.warning("stopping the campaign (%s)", signal.Signals(signum).name)
        if self._interruptible:
            raise StopRun(self.reason or SIGNALS[signum])

    def reinstall(self) -> None:
        """Take SIGTERM and SIGINT back after a library replaced the handlers (``ray.init`` does)."""
        if self._previous and threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                signal.signal(signum, self._handle)

    @contextmanager
    def installed(self) -> Iterator["StopRequest"]:
        """Handle SIGTERM and SIGINT while inside (main thread only; elsewhere signals stay as they are)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        for signum in SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)
        try:
            yield self
        finally:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            self._previous.clear()
