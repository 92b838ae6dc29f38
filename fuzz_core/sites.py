"""Op sites: one suspect op at one place in one target, and where user code calls it."""
from __future__ import annotations

import hashlib
import itertools
import linecache
import os
import sys
from dataclasses import asdict, dataclass, field
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
    # 1-based column of the call in its line, when known (Python 3.11+): shown to people
    # (``position``, ``label``) but no part of the id, the key or a bug's signature
    column: int | None = field(default=None, compare=False)

    @property
    def position(self) -> str:
        """``path:line:col`` of the call (``path:line`` when its column is unknown)."""
        return position(self.location, self.column)

    @property
    def label(self) -> str:
        return f"{self.target}:{self.op}@{self.position}#{self.occurrence}"

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
        column = d.get("column")
        return cls(**{k: d[k] for k in ("id", "target", "op", "kind", "hazard", "location", "occurrence")},
                   searched=d.get("searched", True), column=int(column) if column else None)


def site_id(target: str, op: str, location: str, occurrence: int) -> str:
    """A short hash, safe as a file name and a Parquet partition value."""
    text = f"{target}\x00{op}\x00{location}\x00{occurrence}"
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def make_site(target: str, op: str, kind: str, hazard: str, location: str, occurrence: int,
              searched: bool = True, column: int | None = None) -> OpSite:
    """An op site; its column is ``column``, else the one a :class:`Location` carries."""
    return OpSite(site_id(target, op, location, occurrence), target, op, kind, hazard, str(location),
                  occurrence, searched, column if column is not None else column_of(location))


def position(location: str, column: int | None) -> str:
    """``path:line:col`` for people; ``location`` itself when the column is unknown."""
    return f"{location}:{column}" if column else str(location)


def position_of(entry) -> str:
    """:func:`position` of a site's, a first op's or a recorded op's dict (``location``, ``column``),
    as summary.json and finding.json hold them; files written before columns were recorded have none."""
    column = entry.get("column")
    return position(str(entry.get("location", "")), column if isinstance(column, int) else None)


def _lines_of(location: str) -> tuple[list[str], int] | None:
    """The lines of the file a ``path:line`` location names (relative to the current directory or a
    ``sys.path`` root, as :func:`relative_path` made it) and the 1-based line; None when unreadable."""
    path, _, line = str(location).rpartition(":")
    if not path or not line.isdigit():
        return None
    for root in (os.getcwd(), *sys.path):
        file = Path(root or ".") / path
        if file.is_file():
            try:
                return file.read_text(encoding="utf-8", errors="replace").splitlines(), int(line)
            except OSError:
                return None
    return None


def source_line(location: str) -> str | None:
    """The code on a location's line as the file reads now (stripped), or None."""
    got = _lines_of(location)
    if got is None or not 1 <= got[1] <= len(got[0]):
        return None
    return got[0][got[1] - 1].strip() or None


def relocated(location: str, code: str | None) -> str | None:
    """Where the line ``code`` sits now: ``location`` itself while its line still reads ``code``,
    else the line of the same file that reads it, the nearest to the old one (an edit elsewhere in
    the file moved it); None when no line of the file reads it (the code itself changed) or it
    cannot be told (no code recorded, an unreadable file)."""
    got = _lines_of(location) if code else None
    if got is None:
        return None
    lines, old = got
    hits = [i + 1 for i, text in enumerate(lines) if text.strip() == code]
    if not hits:
        return None
    best = min(hits, key=lambda n: (abs(n - old), n))
    return f"{str(location).rpartition(':')[0]}:{best}"


class Location(str):
    """A ``path:line`` location that also carries the 1-based column of the call (or None).

    It is equal to, hashes as, prints as and serialises as the plain ``path:line`` string, so
    ids, occurrence counts, keys and signatures are those of the string; the column is extra
    data that rides along from :meth:`CallerLocator.locate` to the sites and first ops a
    recorder makes (:func:`column_of`)."""

    column: int | None = None

    def __new__(cls, text: str, column: int | None = None) -> "Location":
        self = super().__new__(cls, text)
        self.column = column
        return self

    def __reduce__(self):
        return (Location, (str(self), self.column))


def column_of(location: object) -> int | None:
    """The column a location carries (a :class:`Location`), else None."""
    return getattr(location, "column", None)


def call_column(code, lasti: int, lineno: int | None) -> int | None:
    """1-based column (in characters) where the instruction at byte offset ``lasti`` of ``code``
    starts in its source line: for a frame suspended in a call, the start of the call expression
    (``torch.log(b)`` in ``torch.log(a) + torch.log(b)``; ``a`` in ``a / b``). None before Python
    3.11 (no code positions), or when the instruction starts on a line other than ``lineno``."""
    positions = getattr(code, "co_positions", None)
    if positions is None or lasti < 0:
        return None
    try:
        pos = next(itertools.islice(positions(), lasti // 2, None), None)
    except Exception:  # noqa: BLE001 - a column is a nicety, never worth an error
        return None
    if pos is None or pos[2] is None or (lineno is not None and pos[0] != lineno):
        return None
    col = pos[2]          # a byte offset in the line's UTF-8
    if pos[0]:
        line = linecache.getline(code.co_filename, pos[0])
        if line and not line.isascii():
            col = len(line.encode("utf-8")[:col].decode("utf-8", "replace"))
    return col + 1


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
        self._at: dict[tuple[object, int], Location] = {}   # (code, lasti) -> its location and column

    def skips(self, filename: str) -> bool:
        """Is this file the framework's, fuzz_core's or the interpreter's (not the user's)?"""
        return filename.startswith(self._skip) or filename.startswith("<frozen") or "contextlib" in filename

    def _skipped(self, code) -> bool:
        hit = self._skip_code.get(code)
        if hit is None:
            hit = self._skip_code[code] = self.skips(code.co_filename)
        return hit

    def locate(self, depth: int = 1) -> str:
        """The user's ``path:line``, as a :class:`Location` that carries the call's column."""
        frame = sys._getframe(depth)
        while frame is not None and self._skipped(frame.f_code):
            frame = frame.f_back
        if frame is None:
            return "<unknown>:0"
        code, lasti = frame.f_code, frame.f_lasti
        hit = self._at.get((code, lasti))
        if hit is not None:
            return hit
        fn = code.co_filename
        rel = self._rel.get(fn)
        if rel is None:
            rel = self._rel[fn] = relative_path(fn)
        line = frame.f_lineno
        hit = self._at[(code, lasti)] = Location(f"{rel}:{line}", call_column(code, lasti, line))
        return hit
