"""Parquet store for loss traces and the corpus of findings (pyarrow only).

Layout under ``root`` (hive partitioning; the partition columns live in the folder
names, never inside the files)::

    traces/campaign=<campaign>/site_id=<site id>/part-<run>-<first step:09d>.parquet   (a run's quanta)
    traces/campaign=<campaign>/site_id=<site id>/part-<run>-<seq:06d>-<uuid8>.parquet (other writers)
    findings/campaign=<campaign>/part-<run>-<site id>.parquet

One trace shard is written per ``write_traces`` call and per site; one small file per
finding. A campaign's exporter writes a shard per site per export (every few seconds), named by the
site's first step in it, so rows exported again (after a driver was killed) replace their shard
instead of adding a second copy. Every write goes to a hidden temporary name in the same folder
(``.part-….parquet.tmp``), is fsynced, then renamed with ``os.replace``: a reader never
sees a half-written file under its final name, and a temporary left by a hard crash is
ignored by pyarrow, pandas (their discovery skips names starting with ``.`` or ``_``)
and DuckDB globs on ``*.parquet``.

Partition values (campaign, site id) and the run name are path components: they must
match ``[A-Za-z0-9._-]+`` and must not start with ``.`` or ``_`` (pyarrow silently skips
such folders); anything else is a ``ValueError`` that names the value.

``TRACE_SCHEMA`` (one row per event of a site's search):

- ``campaign`` (string): campaign name; hive partition column.
- ``run`` (string): the campaign run folder name (``<campaign>-<time>``).
- ``site_id`` (string): op site id (short hash); hive partition column.
- ``target`` (string): name of the target the site belongs to.
- ``op`` (string): op kind (``log``, ``div``, …).
- ``step`` (int64): the site's step number (every forward pass counts).
- ``suspect_loss`` (float64): suspect loss at this step (may be NaN or inf).
- ``best_loss`` (float64): lowest suspect loss seen so far by this site.
- ``grad_norm`` (float64): norm of the gradient of the suspect loss.
- ``strategy`` (string): search strategy (``adaptive``, ``grist``, ``random``).
- ``event`` (string): ``step``, ``refresh``, ``mutation``, ``trigger``, …
- ``triggered`` (bool): whether the op produced a non-finite value at this step.
- ``wall_s`` (float64): seconds since the site's search began.

``FINDING_SCHEMA`` (one row per confirmed finding):

- ``campaign`` (string, partition), ``run`` (string), ``site_id``, ``target``, ``op``:
  as above.
- ``hazard`` (string): how the op fails (``log of x <= 0``, …).
- ``location`` (string): repo-relative ``path:line`` of the user's call.
- ``signature`` (string): dedupe hash of the finding.
- ``steps`` (int64): steps the search took; ``seconds`` (float64): its wall time.
- ``trigger`` (string): what was searched to trigger it (``inputs`` / ``weights``).
- ``training`` (bool): whether the program trained between steps.
- ``first_op`` (string), ``first_op_location`` (string): the first op that went
  non-finite and where it is called.
- ``batch_size`` (int64): batch size of the candidate; ``minimised_size`` (int64): after
  minimisation.
- ``folder`` (string): path of the finding folder, relative to the run folder.
- ``found_at`` (timestamp[us, UTC]): when the finding was confirmed.
- ``status`` (string): the site's status, ``found`` or ``flaky`` (:class:`fuzz_core.status.SiteStatus`);
  ``exit_reason`` (string): ``triggered`` or ``triggered_flaky`` (:class:`ExitReason`);
  ``phase`` (string): where the first non-finite value arose (``forward``, ``backward``, ``update``).
  Null in files written before these columns existed.
- Mixed precision (``finding.json``'s ``precision``, ``precision_only``, ``overflow`` and
  ``scaler_skips``); null in a float32 campaign, and in files written before these columns existed:
  ``precision`` (string): the campaign's precision in one word (``fp16``, ``bf16``,
  ``fp16+grad_scaler``, ``mixed_float16``, ``mixed_bfloat16``); ``precision_only`` (bool): the
  same values stay finite in float32 (null when the float32 replay could not run);
  ``overflow_dtype`` (string): the dtype the op computed in (``float16``, ``bfloat16``);
  ``overflow_value`` (float64), ``overflow_limit`` (float64), ``overflow_excess`` (float64): for a
  ``half_overflow``, the op's largest magnitude (its float32 value where the half one overflowed),
  the dtype's largest finite value and their ratio; ``scaler_skips`` (int64): consecutive steps a
  GradScaler (the engine's, or the program's own) skipped on the found values.

Site ids are hex strings that can look like numbers: readers that infer hive types
(pandas, DuckDB's ``hive_types_autocast``) may turn them into integers; pass
``partitioning=TRACE_PARTITIONING`` to pandas or ``hive_types={'site_id': 'VARCHAR'}`` to
DuckDB. ``read_traces``/``read_findings`` always return the documented schema.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq


__all__ = [
    "FINDING_PARTITIONING",
    "FINDING_SCHEMA",
    "TRACE_PARTITIONING",
    "TRACE_SCHEMA",
    "ParquetStore",
    "finding_row",
    "precision_columns",
    "read_findings",
    "read_traces",
    "validate_component",
]

TRACE_SCHEMA = pa.schema(
    [
        ("campaign", pa.string()),
        ("run", pa.string()),
        ("site_id", pa.string()),
        ("target", pa.string()),
        ("op", pa.string()),
        ("step", pa.int64()),
        ("suspect_loss", pa.float64()),
        ("best_loss", pa.float64()),
        ("grad_norm", pa.float64()),
        ("strategy", pa.string()),
        ("event", pa.string()),
        ("triggered", pa.bool_()),
        ("wall_s", pa.float64()),
    ]
)

FINDING_SCHEMA = pa.schema(
    [
        ("campaign", pa.string()),
        ("run", pa.string()),
        ("site_id", pa.string()),
        ("target", pa.string()),
        ("op", pa.string()),
        ("hazard", pa.string()),
        ("location", pa.string()),
        ("signature", pa.string()),
        ("steps", pa.int64()),
        ("seconds", pa.float64()),
        ("trigger", pa.string()),
        ("training", pa.bool_()),
        ("first_op", pa.string()),
        ("first_op_location", pa.string()),
        ("batch_size", pa.int64()),
        ("minimised_size", pa.int64()),
        ("folder", pa.string()),
        ("found_at", pa.timestamp("us", tz="UTC")),
        ("status", pa.string()),
        ("exit_reason", pa.string()),
        ("phase", pa.string()),
        ("precision", pa.string()),
        ("precision_only", pa.bool_()),
        ("overflow_dtype", pa.string()),
        ("overflow_value", pa.float64()),
        ("overflow_limit", pa.float64()),
        ("overflow_excess", pa.float64()),
        ("scaler_skips", pa.int64()),
    ]
)

TRACE_PARTITIONING = ds.partitioning(
    pa.schema([("campaign", pa.string()), ("site_id", pa.string())]), flavor="hive"
)
FINDING_PARTITIONING = ds.partitioning(pa.schema([("campaign", pa.string())]), flavor="hive")

TRACES_DIR = "traces"
FINDINGS_DIR = "findings"
TRACE_REQUIRED = ("site_id", "step", "event")
FINDING_REQUIRED = ("site_id",)

_SAFE = re.compile(r"[A-Za-z0-9._-]+")


def validate_component(value: object, what: str = "partition value") -> str:
    """Return ``value`` if it is a safe path component, else raise ``ValueError``."""
    if not isinstance(value, str) or not _SAFE.fullmatch(value):
        raise ValueError(f"{what} {value!r} must match [A-Za-z0-9._-]+")
    if value[0] in "._":
        raise ValueError(f"{what} {value!r} must not start with '.' or '_'")
    return value


def _file_schema(schema: pa.Schema, partitions: Iterable[str]) -> pa.Schema:
    """The schema stored inside the files: ``schema`` without the partition columns."""
    drop = set(partitions)
    return pa.schema([f for f in schema if f.name not in drop])


def _write_parquet(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` and fsync it (a seam for crash tests)."""
    with open(path, "wb") as fh:
        pq.write_table(table, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _atomic_write(table: pa.Table, final: Path) -> Path:
    """Write ``table`` under a hidden temporary name, then rename it to ``final``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        _write_parquet(table, tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def _check_keys(row: Mapping[str, Any], schema: pa.Schema, required: Iterable[str]) -> None:
    """Reject unknown columns (typos) and missing required ones."""
    unknown = set(row) - set(schema.names)
    if unknown:
        raise ValueError(f"unknown columns {sorted(unknown)}; expected some of {schema.names}")
    missing = [k for k in required if row.get(k) is None]
    if missing:
        raise ValueError(f"row is missing required columns {missing}: {dict(row)!r}")


class ParquetStore:
    """Writer of one campaign run's trace shards and findings under ``root``."""

    def __init__(self, root: Path | str, campaign: str, run: str) -> None:
        self.root = Path(root)
        self.campaign = validate_component(campaign, "campaign")
        self.run = validate_component(run, "run")
        self._seq = 0
        self._lock = threading.Lock()

    def _next_seq(self) -> int:
        with self._lock:
            seq = self._seq
            self._seq += 1
        return seq

    def _own(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Fill campaign and run, rejecting rows that name another campaign or run."""
        out = dict(row)
        for name, mine in (("campaign", self.campaign), ("run", self.run)):
            if out.setdefault(name, mine) != mine:
                raise ValueError(f"row {name} {out[name]!r} differs from the store's {mine!r}")
        return out

    def write_traces(self, rows: list[dict[str, Any]], part: str | None = None) -> list[Path]:
        """Write ``rows`` as one shard per site; return the shard paths (none if no rows).

        Each row has the columns of ``TRACE_SCHEMA``; ``campaign`` and ``run`` default to
        the store's, a missing optional column is null. ``part`` names the shard
        (``part-<run>-<part>.parquet``, replacing one of that name): a writer that may write the
        same rows twice (a quantum run again after a resume) gives a stable one.
        """
        by_site: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            _check_keys(row, TRACE_SCHEMA, TRACE_REQUIRED)
            own = self._own(row)
            validate_component(own["site_id"], "site_id")
            by_site.setdefault(own["site_id"], []).append(own)
        schema = _file_schema(TRACE_SCHEMA, ("campaign", "site_id"))
        paths = []
        for site_id, site_rows in by_site.items():
            table = pa.Table.from_pylist(site_rows, schema=schema)
            name = (f"part-{self.run}-{validate_component(part, 'part')}.parquet" if part is not None
                    else f"part-{self.run}-{self._next_seq():06d}-{uuid.uuid4().hex[:8]}.parquet")
            folder = self.root / TRACES_DIR / f"campaign={self.campaign}" / f"site_id={site_id}"
            paths.append(_atomic_write(table, folder / name))
        return paths

    def write_finding(self, row: dict[str, Any]) -> Path:
        """Write one finding (columns of ``FINDING_SCHEMA``) to its own file.

        ``found_at`` defaults to now; a naive datetime is taken as UTC.
        """
        _check_keys(row, FINDING_SCHEMA, FINDING_REQUIRED)
        own = self._own(row)
        site_id = validate_component(own["site_id"], "site_id")
        found_at = own.get("found_at") or dt.datetime.now(dt.timezone.utc)
        if found_at.tzinfo is None:
            found_at = found_at.replace(tzinfo=dt.timezone.utc)
        own["found_at"] = found_at
        schema = _file_schema(FINDING_SCHEMA, ("campaign",))
        table = pa.Table.from_pylist([own], schema=schema)
        name = f"part-{self.run}-{site_id}.parquet"
        return _atomic_write(table, self.root / FINDINGS_DIR / f"campaign={self.campaign}" / name)


def _read(
    folder: Path,
    schema: pa.Schema,
    partitioning: ds.Partitioning,
    filters: Mapping[str, str | None],
) -> pa.Table:
    """Read a hive-partitioned folder with ``schema``; empty table when nothing is there."""
    if not folder.is_dir():
        return schema.empty_table()
    dataset = ds.dataset(folder, format="parquet", partitioning=partitioning, schema=schema)
    expr = None
    for name, value in filters.items():
        if value is not None:
            term = ds.field(name) == validate_component(value, name)
            expr = term if expr is None else expr & term
    return dataset.to_table(filter=expr)


def read_traces(
    root: Path | str, campaign: str | None = None, site_id: str | None = None
) -> pa.Table:
    """All trace rows under ``root`` (optionally one campaign / one site), ``TRACE_SCHEMA``."""
    filters = {"campaign": campaign, "site_id": site_id}
    return _read(Path(root) / TRACES_DIR, TRACE_SCHEMA, TRACE_PARTITIONING, filters)


def read_findings(root: Path | str, campaign: str | None = None) -> pa.Table:
    """All findings under ``root`` (optionally one campaign), ``FINDING_SCHEMA``."""
    filters = {"campaign": campaign}
    return _read(Path(root) / FINDINGS_DIR, FINDING_SCHEMA, FINDING_PARTITIONING, filters)


def finding_row(report: dict[str, Any], folder: str) -> dict[str, Any]:
    """A finding's row of ``FINDING_SCHEMA``, from its ``finding.json`` (``folder``: relative to the run
    folder's parent, ``<run>/findings/<name>``)."""
    site = report.get("site") or {}
    first = report.get("first_op") or {}
    mini = report.get("minimised") or {}
    batch = int(report.get("batch_size") or 0)
    flaky = bool(report.get("flaky", False))
    bug = report.get("bug") or {}
    return {"site_id": site.get("id"), "target": site.get("target"), "op": bug.get("op") or site.get("op"),
            "hazard": bug.get("hazard") or report.get("hazard"), "location": bug.get("location") or site.get("location"),
            "signature": report.get("signature"), "steps": int(report.get("step", 0)),
            "seconds": float(report.get("seconds") or 0.0), "trigger": report.get("trigger"),
            "training": bool(report.get("training")), "first_op": first.get("kind", ""),
            "first_op_location": first.get("location", ""),
            "batch_size": int(mini.get("original_batch_size", batch) or batch), "minimised_size": batch,
            "folder": folder, "status": "flaky" if flaky else "found",
            "exit_reason": "triggered_flaky" if flaky else "triggered", "phase": str(report.get("phase") or "forward"),
            **precision_columns(report)}


def precision_columns(report: dict[str, Any]) -> dict[str, Any]:
    """The mixed-precision columns of a finding's row (every one null in a float32 campaign), from its report."""
    precision = report.get("precision") or {}
    word = precision.get("autocast") or precision.get("policy")
    if not word:
        return {}
    if precision.get("grad_scaler"):
        word += "+grad_scaler"
    overflow = report.get("overflow") or {}
    skips = report.get("scaler_skips")
    only = report.get("precision_only")
    return {"precision": word, "precision_only": None if only is None else bool(only),
            "overflow_dtype": overflow.get("dtype"), "overflow_value": _number(overflow.get("value")),
            "overflow_limit": _number(overflow.get("limit")), "overflow_excess": _number(overflow.get("excess")),
            "scaler_skips": None if skips is None else int(skips)}


def _number(x: Any) -> float | None:
    return None if x is None else float(x)

