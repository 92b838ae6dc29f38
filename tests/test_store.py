"""Tests of the Parquet traces and findings store."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import pyarrow as pa
import pytest

from orchestrator.observers import parquet as store
from orchestrator.observers.parquet import (
    FINDING_SCHEMA,
    TRACE_PARTITIONING,
    TRACE_SCHEMA,
    ParquetStore,
    read_findings,
    read_traces,
)

SITES = ("a1b2c3d4", "00123456")  # the second looks like a number to type inference


def _trace_rows(site_id: str, n: int, start: int = 0) -> list[dict]:
    return [
        {
            "site_id": site_id,
            "target": "softmax-mlp",
            "op": "log",
            "step": start + i,
            "suspect_loss": 1.0 / (i + 1),
            "best_loss": 1.0 / (i + 1),
            "grad_norm": math.inf if i == 1 else 0.5,
            "strategy": "adaptive",
            "event": "trigger" if i == n - 1 else "step",
            "triggered": i == n - 1,
            "wall_s": 0.01 * i,
        }
        for i in range(n)
    ]


def _finding_row(site_id: str) -> dict:
    return {
        "site_id": site_id,
        "target": "softmax-mlp",
        "op": "log",
        "hazard": "log of x <= 0",
        "location": "campaigns/targets/softmax_mlp.py:12",
        "signature": "deadbeef",
        "steps": 7,
        "seconds": 0.25,
        "trigger": "inputs",
        "training": True,
        "first_op": "aten.log",
        "first_op_location": "campaigns/targets/softmax_mlp.py:12",
        "batch_size": 8,
        "minimised_size": 1,
        "folder": f"findings/{site_id}",
        "found_at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
    }


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    """Two campaigns; the first with two sites over two flushes, one finding each."""
    s = ParquetStore(tmp_path, "quickstart", "quickstart-20260101-000000")
    s.write_traces(_trace_rows(SITES[0], 3) + _trace_rows(SITES[1], 2))
    s.write_traces(_trace_rows(SITES[0], 4, start=3))
    s.write_finding(_finding_row(SITES[0]))
    other = ParquetStore(tmp_path, "other", "other-run")
    other.write_traces(_trace_rows(SITES[0], 5))
    other.write_finding(_finding_row(SITES[1]))
    return tmp_path


def test_layout_one_shard_per_site_per_call(tmp_path: Path) -> None:
    s = ParquetStore(tmp_path, "quickstart", "run-1")
    paths = s.write_traces(_trace_rows(SITES[0], 3) + _trace_rows(SITES[1], 2))
    paths += s.write_traces(_trace_rows(SITES[0], 1))
    rel = [p.relative_to(tmp_path).parts for p in paths]
    assert [r[:3] for r in rel] == [
        ("traces", "campaign=quickstart", f"site_id={SITES[0]}"),
        ("traces", "campaign=quickstart", f"site_id={SITES[1]}"),
        ("traces", "campaign=quickstart", f"site_id={SITES[0]}"),
    ]
    assert [r[3][: len("part-run-1-000000")] for r in rel] == [
        "part-run-1-000000",
        "part-run-1-000001",
        "part-run-1-000002",
    ]
    import pyarrow.parquet as pq

    stored = pq.read_schema(paths[0])
    assert "campaign" not in stored.names and "site_id" not in stored.names
    assert s.write_traces([]) == []


def test_round_trip(filled: Path) -> None:
    traces = read_traces(filled)
    assert traces.schema == TRACE_SCHEMA
    assert traces.num_rows == 3 + 2 + 4 + 5
    mine = read_traces(filled, campaign="quickstart")
    assert mine.num_rows == 9
    assert set(mine.column("run").to_pylist()) == {"quickstart-20260101-000000"}
    site = read_traces(filled, campaign="quickstart", site_id=SITES[1]).to_pylist()
    assert [r["step"] for r in site] == [0, 1]
    assert site[1]["grad_norm"] == math.inf and site[1]["triggered"] is True
    assert site[0]["site_id"] == "00123456"  # stays a string

    findings = read_findings(filled)
    assert findings.schema == FINDING_SCHEMA
    assert findings.num_rows == 2
    one = read_findings(filled, campaign="quickstart").to_pylist()
    assert len(one) == 1
    assert one[0]["site_id"] == SITES[0] and one[0]["minimised_size"] == 1
    assert one[0]["found_at"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


def test_empty_reads_have_the_schema(tmp_path: Path) -> None:
    assert read_traces(tmp_path).schema == TRACE_SCHEMA
    assert read_traces(tmp_path).num_rows == 0
    assert read_findings(tmp_path / "missing").schema == FINDING_SCHEMA
    ParquetStore(tmp_path, "c", "r").write_traces(_trace_rows(SITES[0], 2))
    none = read_traces(tmp_path, campaign="nope")
    assert none.num_rows == 0 and none.schema == TRACE_SCHEMA


def test_pandas_reads_traces(filled: Path) -> None:
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(filled / "traces", engine="pyarrow", partitioning=TRACE_PARTITIONING)
    assert set(df.columns) == set(TRACE_SCHEMA.names)
    assert len(df) == 14
    counts = df.groupby(["campaign", "site_id"], observed=True).size().to_dict()
    assert counts == {("quickstart", SITES[0]): 7, ("quickstart", SITES[1]): 2, ("other", SITES[0]): 5}
    findings = pd.read_parquet(filled / "findings", engine="pyarrow")
    assert set(findings.columns) == set(FINDING_SCHEMA.names) and len(findings) == 2


def test_duckdb_reads_traces(filled: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    glob = (filled / "traces" / "**" / "*.parquet").as_posix()
    con = duckdb.connect()
    rel = con.sql(
        f"SELECT * FROM read_parquet('{glob}', hive_partitioning=true,"
        " hive_types={'campaign': 'VARCHAR', 'site_id': 'VARCHAR'})"
    )
    assert set(rel.columns) == set(TRACE_SCHEMA.names)
    rows = con.sql(
        f"SELECT campaign, site_id, count(*) FROM read_parquet('{glob}', hive_partitioning=true,"
        " hive_types={'site_id': 'VARCHAR'}) GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert rows == [("other", SITES[0], 5), ("quickstart", SITES[1], 2), ("quickstart", SITES[0], 7)]
    fglob = (filled / "findings" / "**" / "*.parquet").as_posix()
    n = con.sql(f"SELECT count(*) FROM read_parquet('{fglob}', hive_partitioning=true)").fetchall()
    assert n == [(2,)]


@pytest.mark.parametrize("bad", ["a/b", "..", ".hidden", "_tmp", "", "sp ace", "é"])
def test_bad_partition_values_rejected(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="campaign"):
        ParquetStore(tmp_path, bad, "run")
    s = ParquetStore(tmp_path, "ok", "run")
    with pytest.raises(ValueError, match="site_id") as err:
        s.write_traces(_trace_rows(bad, 1))
    assert repr(bad) in str(err.value)
    with pytest.raises(ValueError, match="site_id"):
        s.write_finding(_finding_row(bad))
    assert not (tmp_path / "traces").exists() and not (tmp_path / "findings").exists()


def test_bad_rows_rejected(tmp_path: Path) -> None:
    s = ParquetStore(tmp_path, "c", "r")
    with pytest.raises(ValueError, match="unknown columns"):
        s.write_traces([{**_trace_rows(SITES[0], 1)[0], "sucpect_loss": 1.0}])
    with pytest.raises(ValueError, match="missing"):
        s.write_traces([{"site_id": SITES[0], "event": "step"}])
    with pytest.raises(ValueError, match="differs"):
        s.write_traces([{**_trace_rows(SITES[0], 1)[0], "campaign": "other"}])


def test_crash_mid_write_leaves_no_final_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = store._write_parquet
    written: list[Path] = []

    def write_then_crash(table: pa.Table, path: Path) -> None:
        real(table, path)
        written.append(path)
        raise OSError("disk gone")

    monkeypatch.setattr(store, "_write_parquet", write_then_crash)
    s = ParquetStore(tmp_path, "c", "r")
    with pytest.raises(OSError, match="disk gone"):
        s.write_traces(_trace_rows(SITES[0], 3))
    with pytest.raises(OSError, match="disk gone"):
        s.write_finding(_finding_row(SITES[0]))
    assert len(written) == 2 and all(p.name.startswith(".") for p in written)
    assert list(tmp_path.rglob("*.parquet")) == []
    assert read_traces(tmp_path).num_rows == 0 and read_findings(tmp_path).num_rows == 0


def test_leftover_temp_file_is_ignored_by_readers(tmp_path: Path) -> None:
    """A hard crash (no cleanup) leaves a hidden temp file; readers must skip it."""
    s = ParquetStore(tmp_path, "c", "r")
    (good,) = s.write_traces(_trace_rows(SITES[0], 2))
    (good.parent / f".{good.name.replace('000000', '000001')}.tmp").write_bytes(b"PAR1 trunc")
    assert read_traces(tmp_path).num_rows == 2
    pd = pytest.importorskip("pandas")
    assert len(pd.read_parquet(tmp_path / "traces", partitioning=TRACE_PARTITIONING)) == 2
    duckdb = pytest.importorskip("duckdb")
    glob = (tmp_path / "traces" / "**" / "*.parquet").as_posix()
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{glob}')").fetchall() == [(2,)]
