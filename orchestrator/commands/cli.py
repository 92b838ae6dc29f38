"""The ``cdeepfuzz`` command. Each command parses its arguments and calls one library function.

Exit codes of ``run``: 0 no finding, 1 findings, 2 usage or configuration error,
3 a target could not be built or run. ``replay``: 0 reproduced, 1 not reproduced, 2 usage.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from orchestrator.config import ConfigError, load_campaign

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find NaN/Inf bugs in deep-learning programs by gradient back-propagation.")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"cdeepfuzz: error: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def run(
    campaign: Optional[Path] = typer.Argument(None, help="campaign YAML file (not needed with --resume)"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue the run in this run folder"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow tracking URI"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (else RAY_ADDRESS)"),
    local: bool = typer.Option(False, "--local", help="run every site in this process, without Ray"),
    output: Optional[str] = typer.Option(None, "--output", help="override the campaign's output folder"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress output"),
    plain: bool = typer.Option(False, "--plain", help="plain progress lines even on a terminal"),
    ok_on_findings: bool = typer.Option(False, "--ok-on-findings",
                                        help="exit 0, not 1, when the campaign completed with findings "
                                             "(for job schedulers that call any non-zero exit a failure)"),
) -> None:
    """Run a campaign: discover every suspect op site and search them."""
    from orchestrator.run.campaign import RunOptions, run_campaign

    if campaign is None and resume is None:
        _fail("give a campaign file, or --resume RUN_FOLDER")
    try:
        cfg = load_campaign(campaign) if campaign is not None else None
        outcome = run_campaign(cfg, campaign or resume, RunOptions(
            tracking_uri=tracking_uri, address=address, local=local, progress=not quiet,
            live=False if plain else None, output=output, resume=str(resume) if resume else None))
    except ConfigError as exc:
        _fail(str(exc))
    raise typer.Exit(0 if ok_on_findings and outcome.exit_code == 1 else outcome.exit_code)


@app.command()
def sites(campaign: Path = typer.Argument(..., help="campaign YAML file"),
          as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """List every suspect op site found in the campaign's targets (nothing is searched)."""
    from orchestrator.run.campaign import target_specs, worker_options
    from orchestrator.worker import TargetFailure, Worker

    try:
        cfg = load_campaign(campaign)
    except ConfigError as exc:
        _fail(str(exc))
    worker = Worker(worker_options(cfg))
    rows, failed = [], False
    for spec in target_specs(cfg).values():
        found = worker.try_discover(spec)
        if isinstance(found, TargetFailure):
            failed = True
            typer.echo(f"cdeepfuzz: target {spec.name}: could not be built or run: {found}\n{found.tb}", err=True)
            continue
        rows += [s.to_dict() for s in found]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        _sites_table(rows)
    raise typer.Exit(3 if failed else 0)


def _sites_table(rows: list[dict]) -> None:
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


@app.command()
def replay(folder: Path = typer.Argument(..., help="a finding folder"),
           trust: bool = typer.Option(False, "--trust", help="run a factory outside the current directory tree"),
           device: str = typer.Option("cpu", "--device", help="cpu | cuda | auto")) -> None:
    """Rebuild the target, restore the saved values, run the unmodified program: exit 0 if the bug reproduces."""
    from orchestrator.commands.replay import ReplayError, replay_folder

    try:
        reproduced, message = replay_folder(folder, trust=trust, device=device)
    except ReplayError as exc:
        _fail(str(exc))
    typer.echo(message)
    raise typer.Exit(0 if reproduced else 1)


@app.command()
def bugs(campaign: Optional[str] = typer.Option(None, "--campaign", help="only this campaign"),
         state: Optional[str] = typer.Option(None, "--state", help="triage state: new, confirmed, ..."),
         tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri"),
         as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """List findings from MLflow."""
    from orchestrator.commands.bugs import find_tracking_uri, list_bugs

    uri = find_tracking_uri(tracking_uri)
    if uri is None:
        _fail("no tracking store: give --tracking-uri, set MLFLOW_TRACKING_URI, or run from a folder with runs")
    rows = list_bugs(uri, campaign, state)
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(rows)} finding(s) in {uri}")
    for col in ("campaign", "site", "hazard", "steps", "status", "triage", "run id"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(str(r.get("campaign", "")), str(r.get("label") or r.get("site_id", "")),
                      str(r.get("hazard", "")), str(r.get("steps", "")), str(r.get("status", "")),
                      str(r.get("triage", "")), str(r.get("run_id", "")))
    Console().print(table)


@app.command()
def sync(run_folder: Path = typer.Argument(..., help="a run folder whose tracking was spooled"),
         tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="default: the run's own")) -> None:
    """Send what a run spooled while MLflow was unreachable (exit 1 if some is still left)."""
    from fuzz_core.io import read_json
    from orchestrator.observers.summary import tracking_uri_of
    from orchestrator.observers.tracking_sender import SPOOL_NAME, replay_spool

    summary = run_folder / "summary.json"
    uri = tracking_uri
    if uri is None and summary.is_file():
        try:
            uri = tracking_uri_of(read_json(summary))
        except (OSError, ValueError) as exc:
            _fail(f"{summary}: cannot be read ({exc}): give --tracking-uri")
    if not uri:
        _fail(f"{run_folder}: no tracking URI: give --tracking-uri")
    if not (run_folder / SPOOL_NAME).is_file():
        typer.echo(f"nothing to send: {run_folder / SPOOL_NAME} does not exist")
        return
    result = replay_spool(uri, run_folder)
    typer.echo(f"sent {result.sent}, dropped {result.dropped} (invalid), left {result.left} -> {uri}")
    raise typer.Exit(1 if result.left else 0)


@app.command()
def report(folder: Path = typer.Argument(..., help="a run folder, or an output folder (its newest run)"),
           all_runs: bool = typer.Option(False, "--all", help="report every run of an output folder")) -> None:
    """Write an HTML report (loss curves, findings, budget allocation) into the run folder's report/."""
    from orchestrator.commands.report import ReportError, describe, write_reports

    try:
        pages = write_reports(folder, all_runs=all_runs)
    except ReportError as exc:
        _fail(str(exc))
    typer.echo(describe(pages))


@app.command()
def triage(finding: str = typer.Argument(..., help="a finding folder, or the MLflow run id of its site run"),
           state: str = typer.Option(..., "--state", help="new | confirmed | duplicate | wontfix | fixed"),
           note: Optional[str] = typer.Option(None, "--note", help="a note kept with the state"),
           tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri")) -> None:
    """Set the triage state of a finding (tags on its MLflow site run)."""
    from orchestrator.commands.triage import TriageError, triage as set_state

    try:
        result = set_state(finding, state, note, tracking_uri)
    except TriageError as exc:
        _fail(str(exc))
    typer.echo(result.describe())


@app.command()
def fix(folder: Path = typer.Argument(..., help="a finding folder"),
        budget: int = typer.Option(200, "--budget", min=1, help="search steps per suspect op of the guarded program"),
        trust: bool = typer.Option(False, "--trust", help="run a factory outside the current directory tree"),
        device: str = typer.Option("cpu", "--device", help="cpu | cuda | auto")) -> None:
    """Suggest a guard for a finding and verify it by searching the guarded program; exit 0 if verified."""
    from fuzz_core.findings import FindingError, load_finding
    from fuzz_core.fixes import suggest_and_verify
    from fuzz_core.loader import EntryError
    from orchestrator.commands.replay import ReplayError, check_trusted

    try:
        check_trusted(str(load_finding(folder).report["target"].get("entry", "")), trust)
        section = suggest_and_verify(folder, budget, device=device)
    except (FindingError, ReplayError) as exc:
        _fail(str(exc))
    except (EntryError, ImportError, OSError) as exc:
        _fail(f"cannot build the finding's target: {exc} (run from the folder the campaign ran in: "
              f"the entry is relative to it)")
    typer.echo(section["message"])
    for attempt in section.get("attempts", []):
        residual = attempt.get("residual") or {}
        typer.echo(f"  - {attempt['guard']['description']}: {attempt['status']} ({attempt['steps']} steps)"
                   + (f": {residual.get('explanation')}" if residual else ""))
    if section.get("recommended"):
        typer.echo(f"guard: {section['recommended']['code']}")
    raise typer.Exit(0 if section["status"] == "verified" else 1)


def main() -> None:
    logging.basicConfig(level=os.environ.get("CDEEPFUZZ_LOG", "WARNING").upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
