"""JSON Schemas of the files a run publishes: ``summary.json`` and ``finding.json`` (package data)."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMAS = {"summary.json": "summary.schema.json", "finding.json": "finding.schema.json"}


@lru_cache(maxsize=None)
def schema(name: str) -> dict[str, Any]:
    """The schema of ``summary.json`` or ``finding.json``."""
    return json.loads((HERE / SCHEMAS[name]).read_text(encoding="utf-8"))


def validate(path: Path | str) -> None:
    """Validate a written ``summary.json`` or ``finding.json`` against its schema (needs ``jsonschema``)."""
    import jsonschema

    path = Path(path)
    jsonschema.Draft202012Validator(schema(path.name)).validate(json.loads(path.read_text(encoding="utf-8")))
