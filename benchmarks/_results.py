"""Writing one benchmark's section of benchmarks/RESULTS.md (each script owns its section)."""
from __future__ import annotations

import platform
import re
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = ("# Benchmark results\n\nEach section is written by the script it names; rerun the script to "
          "refresh it. Figures are machine-independent where possible (steps, ratios measured side by "
          "side in one run); seconds are from the machine named in the section.\n")


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_section(name: str, body: str, script: str | None = None, args: str = "") -> None:
    """Replace the section ``name`` (delimited by HTML comments) or append it."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = f"benchmarks/{script or name}.py" + (f" {args}" if args else "")
    block = f"<!-- {name}:start -->\n{body.rstrip()}\n\n_Written by `{command}`, {stamp}, {machine()}._\n<!-- {name}:end -->"
    pattern = re.compile(rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)


def table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
