"""The ``cdeepfuzz`` command. Each command parses its arguments and calls one library function.

Exit codes of ``run`` (:data:`orchestrator.run.campaign.EXIT_CODES`): 0 completed and found no bug,
1 completed and found bugs, 2 usage or configuration error (nothing started), 3 a target could not
be built or its program raised (3 wins over 1), 4 stopped before completion (SIGTERM, SIGINT,
``time_limit_s``; resume with ``--resume``), 5 an internal error of CDeepFuzz (a bug to report).
``sites``: 0, 2, 3 (a target could not be built or run), 5. ``replay``: 0 reproduced, 1 not
reproduced, 2 usage, 3 the target could not be built or its program raised, 5. ``fix``: 0 verified,
1 not, 2, 3, 5 as ``replay``.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from orchestrator.config import ConfigError

EXIT_CODES_HELP = ("Exit codes of run: 0 completed, no bug found; 1 completed, bugs found; 2 usage or "
                   "configuration error; 3 a target could not be built or its program raised; 4 stopped before "
                   "completion (SIGTERM, SIGINT, time limit: continue with --resume); 5 internal error of "
                   "CDeepFuzz (please report it).")
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find NaN/Inf bugs in deep-learning programs by gradient back-propagation.",
                  epilog=EXIT_CODES_HELP)

EXIT_TARGET, EXIT_INTERNAL = 3, 5


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"cdeepfuzz: error: {message}", err=True)
    raise typer.Exit(code)


def _target_failed(what: str, failure, traceback: bool = True) -> None:
    """The one line ``sites``, ``run``, ``replay`` and ``fix`` print for a broken target, then exit 3 (5: ours)."""
    from orchestrator.run.failures import describe

    typer.echo(describe(what, failure), err=True)
    if traceback and failure.traceback:
        typer.echo(failure.traceback.rstrip(), err=True)
    raise typer.Exit(EXIT_INTERNAL if failure.internal else EXIT_TARGET)


@app.command()
def run(
    campaign: Optional[Path] = typer.Argument(None, help="campaign YAML file (not needed with --resume)"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue the run in this run folder"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow tracking URI"),
    address: Optional[str] = typer.Option(None, "--address", help="join this Ray cluster (else RAY_ADDRESS)"),
    cluster: bool = typer.Option(False, "--cluster", help="join the Ray cluster of this node (--address auto)"),
    project_dir: Optional[str] = typer.Option(None, "--project-dir",
                                              help="on a cluster: the folder campaign paths start from (else "
                                                   "CDEEPFUZZ_PROJECT_DIR, else ~/cdeepfuzz)"),
    local: bool = typer.Option(False, "--local", help="run every site in this process, without Ray"),
    output: Optional[str] = typer.Option(None, "--output", help="override the campaign's output folder"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress output"),
    plain: bool = typer.Option(False, "--plain", help="plain progress lines even on a terminal"),
    no_metrics: bool = typer.Option(False, "--no-metrics", help="do not export live Ray metrics"),
    ok_on_findings: bool = typer.Option(False, "--ok-on-findings",
                                        help="exit 0, not 1, when the campaign completed and found bugs "
                                             "(for job schedulers that call any non-zero exit a failure)"),
    junit_xml: Optional[Path] = typer.Option(None, "--junit-xml", metavar="PATH",
                                             help="also write the run as JUnit XML: one test case per op site "
                                                  "(failure: a bug at that site; error: a target or site error; skipped: "
                                                  "not searched)"),
    sarif: Optional[Path] = typer.Option(None, "--sarif", metavar="PATH",
                                         help="also write the bugs as SARIF 2.1.0 (one result per bug at the "
                                              "user's file:line:col), for code scanning"),
    profile: bool = typer.Option(False, "--profile",
                                 help="at the end, print to stderr where the seconds went: each phase of the run "
                                      "from process start, and the heavy imports (torch, mlflow, ray, ...)"),
) -> None:
    """Run a campaign: discover every suspect op site and search them.

    Exit codes: 0 completed, no bug found; 1 completed, bugs found; 2 usage or configuration error;
    3 a target could not be built or its program raised; 4 stopped before completion (SIGTERM, SIGINT,
    time limit: continue with --resume); 5 internal error of CDeepFuzz (please report it).
    """
    from orchestrator import phases

    phases.mark("CLI imports (typer, pydantic)")
    if profile:
        phases.watch_imports()
    from orchestrator.commands.run import RunArgs, run as run_command

    try:
        code = run_command(RunArgs(campaign, resume, tracking_uri, address, cluster, project_dir, local, output,
                                   quiet, plain, not no_metrics, ok_on_findings, junit_xml=junit_xml, sarif=sarif))
    except ConfigError as exc:
        _fail(str(exc))
    if profile:
        typer.echo(phases.report(), err=True)
    raise typer.Exit(code)


@app.command()
def sites(campaign: Path = typer.Argument(..., help="campaign YAML file"),
          as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """List every suspect op site found in the campaign's targets (nothing is searched)."""
    from orchestrator.commands.sites import discover, print_table
    from orchestrator.run.failures import describe

    try:
        rows, broken = discover(campaign)
    except ConfigError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        print_table(rows)
    for name, failure in broken:
        typer.echo(describe(f"target {name}", failure), err=True)
        if failure.traceback:
            typer.echo(failure.traceback.rstrip(), err=True)
    if broken:
        raise typer.Exit(EXIT_INTERNAL if any(f.internal for _, f in broken) else EXIT_TARGET)


@app.command()
def replay(folder: Path = typer.Argument(..., help="a finding folder (or its finding.json)"),
           trust: bool = typer.Option(False, "--trust", help="run a factory outside the current directory tree"),
           device: str = typer.Option("cpu", "--device", help="cpu | cuda | auto")) -> None:
    """Rebuild the target, restore the saved values, run the unmodified program: exit 0 if the bug reproduces."""
    from orchestrator.commands.replay import ReplayError, TargetBroken, replay_folder

    try:
        reproduced, message = replay_folder(folder, trust=trust, device=device)
    except ReplayError as exc:
        _fail(str(exc))
    except TargetBroken as exc:
        _target_failed(f"target {exc.name}", exc.failure)
    typer.echo(message)
    raise typer.Exit(0 if reproduced else 1)


@app.command()
def bugs(campaign: Optional[str] = typer.Option(None, "--campaign", help="only bugs seen in this campaign"),
         state: Optional[str] = typer.Option(None, "--state", help="triage state: new, confirmed, fixed, regressed, ..."),
         output: Optional[Path] = typer.Option(None, "--output",
                                               help="the campaigns' output folder (default: the newest run's here)"),
         occurrences: bool = typer.Option(False, "--occurrences", help="list each bug's findings too"),
         as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """List bugs, not runs: one row per bug across every run of an output folder."""
    from orchestrator.commands.bugs import BugsError, list_bugs
    from orchestrator.commands.table import render, terminal_width

    try:
        folder, rows = list_bugs(output, campaign, state, occurrences=occurrences)
    except BugsError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    typer.echo(f"{len(rows)} bug{'' if len(rows) == 1 else 's'} in {folder / 'bugs'}")
    if not rows:
        return
    header = ["signature", "triage", "op", "phase", "runs", "finds", "last seen", "where"]
    table = [[r["signature"], r["triage"], r["op"], r["phase"], r["runs"], r["occurrences"],
              (r["last_seen"] or "")[:10], r["position"]] for r in rows]
    for line in render(header, table, terminal_width(), [("where", 20, True), ("last seen", 0, False),
                                                         ("op", 6, False)]):
        typer.echo(line)
    if occurrences:
        for r in rows:
            typer.echo(f"{r['signature']} {r['op']} at {r['position']}: {r['hazard']}")
            for o in r.get("occurrence_list") or []:
                typer.echo(f"  {o.get('folder')} (run {o.get('run') or '-'}, target {o.get('target')}, step "
                           f"{o.get('step')}, {o.get('batch_size')} row(s))")


@app.command()
def sync(run_folder: Path = typer.Argument(..., help="a run folder whose tracking was spooled"),
         tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="default: the run's own")) -> None:
    """Send what a run spooled while MLflow was unreachable, then make MLflow agree with the run's store
    (exit 1 if some is still left)."""
    from orchestrator.commands.sync import sync as send

    try:
        uri, result = send(run_folder, tracking_uri)
    except ConfigError as exc:
        _fail(str(exc))
    typer.echo(f"sent {result.sent}, dropped {result.dropped} (stale or invalid), left {result.left}; "
               f"{result.mirrored} MLflow run(s) brought in line with the run-state store -> {uri}")
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
def triage(bug: str = typer.Argument(..., help="a bug's signature (cdeepfuzz bugs), a finding folder, or the MLflow "
                                               "run id of an occurrence"),
           state: str = typer.Option(..., "--state",
                                     help="new | confirmed | duplicate | wontfix | fixed | regressed | not-reproduced"),
           note: Optional[str] = typer.Option(None, "--note", help="a note kept with the state"),
           output: Optional[Path] = typer.Option(None, "--output",
                                                 help="the campaigns' output folder (default: the newest run's here)"),
           tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri",
                                                      help="the MLflow store that mirrors it")) -> None:
    """Set the triage state of a bug, once, for every run where it occurred."""
    from orchestrator.commands.triage import TriageError, triage as set_state

    try:
        result = set_state(bug, state, note, tracking_uri, output=output)
    except TriageError as exc:
        _fail(str(exc))
    typer.echo(result.describe())


@app.command()
def fix(folder: Path = typer.Argument(..., help="a finding folder, or its finding.json"),
        budget: int = typer.Option(200, "--budget", min=1, help="search steps per suspect op of the guarded program"),
        trust: bool = typer.Option(False, "--trust", help="run a factory outside the current directory tree"),
        device: str = typer.Option("cpu", "--device", help="cpu | cuda | auto"),
        tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri",
                                                   help="MLflow tracking URI (else the finding's run's own, else "
                                                        "MLFLOW_TRACKING_URI)")) -> None:
    """Suggest a guard for a finding, verify it forward and backward by searching the guarded program, print
    it as a patch of the source line and record the verdict in finding.json and MLflow; exit 0 if verified."""
    from fuzz_core.findings import FindingError
    from orchestrator.commands.fix import fix as suggest
    from orchestrator.commands.fix import shown
    from orchestrator.commands.replay import ReplayError, TargetBroken

    try:
        section = suggest(folder, budget, trust, device, tracking_uri)
    except (FindingError, ReplayError) as exc:
        _fail(str(exc))
    except TargetBroken as exc:
        _target_failed(f"target {exc.name}", exc.failure)
    for line in shown(section):
        typer.echo(line)
    raise typer.Exit(0 if section["status"] == "verified" else 1)


@app.command()
def ui(folder: Optional[Path] = typer.Argument(None, help="a run folder or an output folder (default: the newest "
                                                          "run under the current directory)"),
       host: str = typer.Option("127.0.0.1", "--host"),
       port: int = typer.Option(5000, "--port", min=1, max=65535)) -> None:
    """Open a run in MLflow: the campaign's experiment (its runs, one per site), not MLflow's start page. A
    local store gets an MLflow UI on HOST:PORT until Ctrl-C; a tracking server is only named."""
    from orchestrator.commands.ui import UiError, serve

    try:
        serve(folder, host, port, typer.echo)
    except UiError as exc:
        _fail(str(exc))


def main() -> None:
    # a normal run prints CDeepFuzz's lines, not MLflow's INFO lines ("Creating initial MLflow database
    # tables...") nor TensorFlow's start-up banners; either can be asked for back through its own variable
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=os.environ.get("CDEEPFUZZ_LOG", "WARNING").upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:  # noqa: BLE001 - CDeepFuzz itself failed: never exit 1 ("findings") for it
        import traceback

        from orchestrator.run.failures import BUG_REPORT

        traceback.print_exc()
        print(f"cdeepfuzz: INTERNAL ERROR of CDeepFuzz ({BUG_REPORT})", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERNAL)
    finally:
        # The exit's garbage collections need not walk every object of torch, MLflow, ... (1-2 s):
        # what is left is freed with the process.
        gc.freeze()


if __name__ == "__main__":
    main()
