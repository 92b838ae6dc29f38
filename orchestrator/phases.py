"""Where a command's seconds go, from the start of its process (``cdeepfuzz run --profile``).

The run marks the end of each of its phases (:func:`mark`); a phase lasts from the previous mark
(the first one: from the start of the process, read from ``/proc`` where there is one, so that the
interpreter's own start and the CLI's imports are counted). :func:`watch_imports` also times the
imports of the heavy packages (``torch``, ``torch._dynamo``, ``mlflow``, ``ray``, ...), wherever they
happen: an import is counted inside the phase that ran it as well. :func:`report` is the text that
``--profile`` prints to stderr at the end of the run. Marks cost a clock read, profiled or not.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

# Imports worth naming: each is timed from the start of its import to its end (what it imports
# itself included; torch._dynamo, imported lazily by torch on first use, is timed on its own).
WATCHED = ("torch", "torch._dynamo", "mlflow", "ray", "tensorflow", "sklearn", "pyarrow")


def process_age() -> float | None:
    """Seconds since this process started (its ``exec``: the interpreter's start included), from
    ``/proc/self/stat``; None where there is no ``/proc`` (the profile then starts at this import)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            started_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])      # field 22: starttime
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


@dataclass
class Profile:
    """The phases of one process's command, in order, and the watched imports."""

    origin: float                                  # perf_counter() value of the process's start
    known_start: bool                              # origin is the process's start, not this module's import
    phases: list[tuple[str, float, float]] = field(default_factory=list)   # name, seconds, CPU seconds
    imports: dict[str, float] = field(default_factory=dict)
    _last: float = 0.0
    _last_cpu: float = 0.0

    def mark(self, name: str) -> None:
        """The phase ``name`` ends now; it began at the previous mark. Its CPU time is the process's
        (every thread's: the MLflow writer's too) over the phase."""
        now, cpu = time.perf_counter(), time.process_time()
        self.phases.append((name, now - (self._last or self.origin), cpu - self._last_cpu))
        self._last, self._last_cpu = now, cpu

    def total(self) -> float:
        return time.perf_counter() - self.origin


def _start() -> Profile:
    age = process_age()
    now = time.perf_counter()
    known = age is not None and 0 <= age < 3600      # else a clock this kernel keeps otherwise
    return Profile(now - age if known else now, known)


PROFILE = _start()


def mark(name: str) -> None:
    """The current phase of this process is ``name`` and ends now."""
    PROFILE.mark(name)


class _ImportTimer:
    """A finder that finds nothing itself: for a watched module it wraps the loader that the other
    finders found, to time its ``exec_module`` (the module's code, its own imports included)."""

    def __init__(self, names: tuple[str, ...], into: dict[str, float]) -> None:
        self.names, self.into = frozenset(names), into

    def find_spec(self, name, path=None, target=None):
        if name not in self.names or name in self.into:
            return None
        import importlib.util

        sys.meta_path.remove(self)           # let the others find it (and not come back here for it)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _TimedLoader(spec.loader, name, self.into)
        return spec


class _TimedLoader:
    def __init__(self, loader, name: str, into: dict[str, float]) -> None:
        self.loader, self.name, self.into = loader, name, into

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = self.loader   # the module keeps its own loader (reloads, resources)
        module.__loader__ = self.loader
        began = time.perf_counter()
        try:
            self.loader.exec_module(module)
        finally:
            self.into[self.name] = time.perf_counter() - began

    def __getattr__(self, item):
        return getattr(self.loader, item)


def watch_imports(names: tuple[str, ...] = WATCHED) -> None:
    """Time the imports of ``names`` that happen from now on (those done before are reported as such)."""
    for name in names:
        if name in sys.modules:
            PROFILE.imports.setdefault(name, float("nan"))     # imported before the watch began
    if not any(isinstance(f, _ImportTimer) for f in sys.meta_path):
        sys.meta_path.insert(0, _ImportTimer(names, PROFILE.imports))


def report(profile: Profile = PROFILE) -> str:
    """The phases with their seconds (and the process's CPU seconds: less than the phase's own where it
    waited, on Ray or a disk, or the machine was busy), then the watched imports."""
    total = profile.total()
    origin = "process start" if profile.known_start else "the CLI's first import (process start unknown)"
    lines = [f"cdeepfuzz: profile: {total:.2f} s from {origin} to the end of the run"]
    width = max((len(name) for name, *_ in profile.phases), default=0)
    at = 0.0
    for name, seconds, cpu in profile.phases:
        at += seconds
        lines.append(f"  {name:<{width}}  {seconds:6.2f} s  (CPU {cpu:6.2f} s; at {at:6.2f} s)")
    rest = total - at
    if profile.phases and rest > 0.005:
        lines.append(f"  {'(until this report)':<{width}}  {rest:6.2f} s")
    timed = {k: v for k, v in profile.imports.items() if v == v}
    if timed:
        lines.append("  imports, inside the phases above: " + ", ".join(
            f"{name} {seconds:.2f} s" for name, seconds in sorted(timed.items(), key=lambda kv: -kv[1])))
    before = sorted(k for k, v in profile.imports.items() if v != v)
    if before:
        lines.append("  imported before the profile began: " + ", ".join(before))
    return "\n".join(lines)
