"""``cdeepfuzz sites``: every suspect op site of a campaign's targets, nothing searched.

A target that cannot be built or run is reported with the same line as ``cdeepfuzz run`` (exit 3;
5 for an internal error of CDeepFuzz)."""
from __future__ import annotations

from pathlib import Path

from orchestrator.config import load_campaign


def discover(campaign: Path) -> tuple[list[dict], list[tuple[str, object]]]:
    """(one row per site, (target name, its classified failure) per broken target)."""
    from orchestrator.run.campaign import target_specs, worker_options
    from orchestrator.run.failures import from_target_failure
    from orchestrator.worker import TargetFailure, Worker

    cfg = load_campaign(campaign)
    worker = Worker(worker_options(cfg))
    rows, broken = [], []
    for spec in target_specs(cfg).values():
        found = worker.try_discover(spec)
        if isinstance(found, TargetFailure):
            broken.append((spec.name, from_target_failure(found)))
            continue
        rows += [s.to_dict() for s in found]
    return rows, broken


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{sum(r['searched'] for r in rows)} suspect op sites "
                        f"({sum(not r['searched'] for r in rows)} stable ops recorded, not searched)")
    for col in ("target", "op", "kind", "hazard", "location", "occ", "id", "searched"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["target"], r["op"], r["kind"], r["hazard"], r["location"], str(r["occurrence"]),
                      r["id"], "yes" if r["searched"] else "no (stable)")
    Console().print(table)
