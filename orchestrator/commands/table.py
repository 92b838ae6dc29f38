"""Plain tables for the commands that list things (``sites``, ``bugs``): one line per row, never wrapped.

On a terminal the lines fit its width: the columns named ``shrink`` give up room, in that order,
down to their minimum (a path loses its middle and keeps its ``file:line:col``; other text loses its
end). Piped into a file or ``grep`` (no terminal), nothing is cut: each row stays one whole line.
"""
from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence

GAP = "  "
ELLIPSIS = "…"


def terminal_width(stream=None) -> int | None:
    """The terminal's width, or None when ``stream`` (stdout) is not a terminal."""
    stream = stream or sys.stdout
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    return shutil.get_terminal_size((80, 24)).columns


def cut(text: str, width: int, keep_end: bool) -> str:
    """``text`` in at most ``width`` characters: its middle dropped (``keep_end``: a path, whose end tells
    the file and line) or its end."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:max(0, width)]
    if not keep_end:
        return text[:width - 1] + ELLIPSIS
    tail = text.rsplit("/", 1)[-1]
    if len(tail) + 2 <= width:
        head = width - len(tail) - 1
        return text[:head] + ELLIPSIS + tail if head > 0 else ELLIPSIS + tail
    return ELLIPSIS + text[len(text) - (width - 1):]


def render(header: Sequence[str], rows: Sequence[Sequence[str]], width: int | None = None,
           shrink: Sequence[tuple[str, int, bool]] = ()) -> list[str]:
    """The table's lines. ``shrink``: (column name, its narrowest width, keep its end) in the order they
    give up room when the lines are wider than ``width`` (None: no limit)."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    if width is not None:
        over = sum(widths) + len(GAP) * (len(widths) - 1) - width
        for name, narrowest, _ in shrink:
            if over <= 0:
                break
            i = list(header).index(name)
            give = min(over, max(0, widths[i] - max(narrowest, len(header[i]))))
            widths[i] -= give
            over -= give
    keep = {name: keep_end for name, _, keep_end in shrink}
    lines = []
    for row in cells:
        parts = [cut(c, widths[i], keep.get(header[i], False)).ljust(widths[i]) for i, c in enumerate(row)]
        lines.append(GAP.join(parts).rstrip())
    return lines
