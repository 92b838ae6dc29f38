"""Op sites: one suspect op at one place in one target, and where user code calls it."""
from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

_FUZZ_CORE_DIR = str(Path(__file__).resolve().parent)


@dataclass(frozen=True)
class OpSite:
    """The unit of work. ``id`` is stable across runs and machines."""

    id: str
    target: str
    op: str            # catalogue name ("log", "div", ...)
    kind: str          # the framework op as recorded ("log_", "div.out", "RealDiv")
    hazard: str
    location: str      # repo-relative "path:line" of the user's call
    occurrence: int    # index among calls of this op at this location in one pass
    searched: bool = True

    @property
    def label(self) -> str:
        return f"{self.target}:{self.op}@{self.location}#{self.occurrence}"

    @property
    def key(self) -> tuple[str, str, int]:
        """What identifies the site inside one forward pass."""
        return (self.op, self.location, self.occurrence)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["label"] = self.label
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "OpSite":
        return cls(**{k: d[k] for k in ("id", "target", "op", "kind", "hazard", "location", "occurrence")},
                   searched=d.get("searched", True))


def site_id(target: str, op: str, location: str, occurrence: int) -> str:
    """A short hash, safe as a file name and a Parquet partition value."""
    text = f"{target}\x00{op}\x00{location}\x00{occurrence}"
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def make_site(target: str, op: str, kind: str, hazard: str, location: str, occurrence: int,
              searched: bool = True) -> OpSite:
    return OpSite(site_id(target, op, location, occurrence), target, op, kind, hazard, location,
                  occurrence, searched)


def relative_path(filename: str) -> str:
    """A path relative to the current directory, or to its sys.path root; never absolute."""
    path = os.path.abspath(filename)
    cwd = os.getcwd()
    if path.startswith(cwd + os.sep):
        return Path(os.path.relpath(path, cwd)).as_posix()
    best = None
    for root in sys.path:
        root = os.path.abspath(root or ".")
        if path.startswith(root + os.sep) and (best is None or len(root) > len(best)):
            best = root
    if best is not None:
        return Path(os.path.relpath(path, best)).as_posix()
    return Path(path).name


class CallerLocator:
    """Finds the first stack frame outside the framework and fuzz_core, cached per code object."""

    def __init__(self, skip_dirs: tuple[str, ...]) -> None:
        self._skip = tuple(d.rstrip(os.sep) + os.sep for d in skip_dirs + (_FUZZ_CORE_DIR,))
        self._skip_code: dict[object, bool] = {}
        self._rel: dict[str, str] = {}

    def skips(self, filename: str) -> bool:
        """Is this file the framework's, fuzz_core's or the interpreter's (not the user's)?"""
        return filename.startswith(self._skip) or filename.startswith("<frozen") or "contextlib" in filename

    def _skipped(self, code) -> bool:
        hit = self._skip_code.get(code)
        if hit is None:
            hit = self._skip_code[code] = self.skips(code.co_filename)
        return hit

    def locate(self, depth: int = 1) -> str:
        frame = sys._getframe(depth)
        while frame is not None and self._skipped(frame.f_code):
            frame = frame.f_back
        if frame is None:
            return "<unknown>:0"
        fn = frame.f_code.co_filename
        rel = self._rel.get(fn)
        if rel is None:
            rel = self._rel[fn] = relative_path(fn)
        return f"{rel}:{frame.f_lineno}"
