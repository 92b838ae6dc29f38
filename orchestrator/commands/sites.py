"""``cdeepfuzz sites``: every suspect op site of a campaign's targets, nothing searched.

A target that cannot be built or run is reported with the same line as ``cdeepfuzz run`` (exit 3;
5 for an internal error of CDeepFuzz)."""
from __future__ import annotations

from pathlib import Path

from fuzz_core.sites import position_of
from orchestrator.config import load_campaign


def boxes(runner, site_id: str, seed: int) -> dict[str, dict]:
    """The box each searched input of a site is searched in, as its search computes it (the
    target's ``bounds``, else the default that follows the data), with the sampled data's range."""
    from fuzz_core.search import site_rng

    bounds = runner.bounds(dict(runner.sample(site_rng(seed, site_id))))
    given = runner.target.bounds
    ranges = runner.data_ranges()
    return {name: {"box": [float(lo), float(hi)], "source": "bounds" if name in given else "default",
                   "data": list(ranges[name]) if name in ranges else None}
            for name, (lo, hi) in bounds.items() if name in runner.searched}


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
        runner = worker.runner(spec)
        for site in found:
            row = site.to_dict()
            row["inputs"] = boxes(runner, site.id, spec.seed) if row["searched"] else {}
            rows.append(row)
    return rows, broken


def _interval(lo: float, hi: float) -> str:
    return f"[{lo:.4g}, {hi:.4g}]"


def box_lines(rows: list[dict]) -> list[str]:
    """One line per target and searched input: its box, and the data's range where it was defaulted."""
    out, seen = [], set()
    for r in rows:
        for name, b in r.get("inputs", {}).items():
            line = f"{r['target']}: {name} in {_interval(*b['box'])}"
            if b["source"] == "bounds":
                line += " (the target's bounds)"
            elif b["data"] is not None:
                line += f" (default: sampled data lies in {_interval(*b['data'])})"
            if line not in seen:
                seen.add(line)
                out.append(line)
    return out


def print_table(rows: list[dict]) -> None:
    """The sites, one line each (cut to the terminal's width on a terminal, whole when piped), then the
    box of every searched input."""
    from orchestrator.commands.table import render, terminal_width

    print(f"{sum(r['searched'] for r in rows)} suspect op sites "
          f"({sum(not r['searched'] for r in rows)} stable ops recorded, not searched)")
    header = ["target", "op", "where", "occ", "id", "searched", "hazard"]
    table = [[r["target"], r["op"], position_of(r), r["occurrence"], r["id"],
              "yes" if r["searched"] else "no", r["hazard"]] for r in rows]
    for line in render(header, table, terminal_width(), [("hazard", 12, False), ("where", 20, True),
                                                         ("target", 8, False)]):
        print(line)
    lines = box_lines(rows)
    if lines:
        print("searched inputs (the box each search stays in):")
        for line in lines:
            print("  " + line)
