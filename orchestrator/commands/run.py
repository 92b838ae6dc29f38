"""``cdeepfuzz run``: a campaign on this machine, or on the Ray cluster this machine belongs to.

On a laptop it starts an embedded Ray (or none with ``--local``). On a cluster (``--address``,
``RAY_ADDRESS``, or ``--cluster`` which joins the cluster of this node: ``--address auto``) it
never starts Ray and, as the former ``launch.py`` did:

- finds the campaign relative to the current directory, else relative to the project folder
  that ``deploy/cluster.yaml`` syncs to every node (``--project-dir``, else
  ``CDEEPFUZZ_PROJECT_DIR``, else ``~/cdeepfuzz``), and runs from that folder, so that the
  campaign's relative ``entry:`` paths resolve as they do on a laptop;
- writes under an absolute folder: ``--output``, else the campaign's ``output`` when it is
  absolute or a URI, else ``~/cdeepfuzz-runs`` (the driver is the only writer: the head's disk
  is enough);
- needs an MLflow server (``--tracking-uri``, ``tracking.uri`` or ``MLFLOW_TRACKING_URI``;
  ``deploy/cluster.yaml`` sets the latter on the head).

Exit codes: :data:`orchestrator.run.campaign.EXIT_CODES`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import ConfigError, check_cluster_settings, load_campaign, resolve_tracking_uri

DEFAULT_PROJECT_DIR = "~/cdeepfuzz"
DEFAULT_OUTPUT_DIR = "~/cdeepfuzz-runs"


def locate(campaign: str, project_dir: str | None = None) -> tuple[Path, Path]:
    """(folder to run from, campaign path relative to it or absolute)."""
    given = Path(campaign).expanduser()
    explicit = project_dir or os.environ.get("CDEEPFUZZ_PROJECT_DIR")
    if explicit:
        project = Path(explicit).expanduser().resolve()
        if given.is_absolute():
            return project, given
        if (project / given).is_file():
            return project, given
        if given.is_file():
            return project, given.resolve()
        raise FileNotFoundError(f"{campaign}: no such campaign file in {project} nor in {Path.cwd()}")
    if given.is_absolute() or given.is_file():
        return Path.cwd().resolve(), given
    project = Path(DEFAULT_PROJECT_DIR).expanduser().resolve()
    if (project / given).is_file():
        return project, given
    raise FileNotFoundError(f"{campaign}: no such campaign file in {Path.cwd()} nor in {project}")


def default_output(campaign_output: str) -> str:
    if "://" in campaign_output or Path(campaign_output).is_absolute():
        return campaign_output
    return str(Path(DEFAULT_OUTPUT_DIR).expanduser())


@dataclass
class RunArgs:
    campaign: Path | None
    resume: Path | None = None
    tracking_uri: str | None = None
    address: str | None = None
    cluster: bool = False
    project_dir: str | None = None
    local: bool = False
    output: str | None = None
    quiet: bool = False
    plain: bool = False
    metrics: bool = True
    ok_on_findings: bool = False
    junit_xml: Path | None = None     # write the run as JUnit XML here (one test case per site)
    sarif: Path | None = None         # write the findings as SARIF 2.1.0 here (one result per finding)


def run(args: RunArgs) -> int:
    """The ``run`` command: its exit code (ConfigError for a usage or configuration mistake)."""
    from orchestrator.phases import mark
    from orchestrator.run.campaign import EXIT_FINDINGS, EXIT_OK, RunOptions, run_campaign

    mark("driver imports")
    if args.campaign is None and args.resume is None:
        raise ConfigError("give a campaign file, or --resume RUN_FOLDER")
    reports = _report_paths(args)     # absolute before a cluster run moves to its project folder
    address = args.address or ("auto" if args.cluster else None) or os.environ.get("RAY_ADDRESS")
    output = args.output
    campaign_path = args.campaign
    if address and not args.local:
        os.environ["RAY_ADDRESS"] = address      # cluster mode: no embedded Ray, absolute output, a tracking server
        if campaign_path is not None:
            try:
                project, campaign_path = locate(str(campaign_path), args.project_dir)
            except FileNotFoundError as exc:
                raise ConfigError(str(exc)) from None
            os.chdir(project)
    cfg = load_campaign(campaign_path) if campaign_path is not None else None
    mark("campaign read")
    if address and not args.local:
        if cfg is not None:
            output = output or default_output(cfg.output)
            if "://" not in output:
                output = str(Path(output).expanduser().resolve())
            uri = resolve_tracking_uri(args.tracking_uri, campaign=cfg) if cfg.tracking.enabled else None
            check_cluster_settings(cfg, output, uri, campaign_path)
        _join(address)
    outcome = run_campaign(cfg, campaign_path or args.resume, RunOptions(
        tracking_uri=args.tracking_uri, address=address, local=args.local, progress=not args.quiet,
        live=False if args.plain else None, output=output, resume=str(args.resume) if args.resume else None,
        metrics=args.metrics))
    _write_reports(outcome, reports, quiet=args.quiet)
    if reports:
        mark("JUnit XML, SARIF")
    return EXIT_OK if args.ok_on_findings and outcome.exit_code == EXIT_FINDINGS else outcome.exit_code


def _report_paths(args: RunArgs) -> dict[str, Path]:
    """``--junit-xml`` and ``--sarif``, absolute; their folders must exist (a usage error found before the run)."""
    paths = {}
    for kind, given in (("JUnit XML", args.junit_xml), ("SARIF", args.sarif)):
        if given is None:
            continue
        path = Path(given).expanduser().absolute()
        if not path.parent.is_dir():
            raise ConfigError(f"{given}: no such folder for the {kind} file")
        if path.is_dir():
            raise ConfigError(f"{given}: is a folder; give a file name for the {kind} file")
        paths[kind] = path
    return paths


def _write_reports(outcome, reports: dict[str, Path], quiet: bool = False) -> None:
    """The run's JUnit XML and SARIF, from its folder (also after a stop: what was searched so far)."""
    import sys

    from orchestrator.export import write_junit_xml, write_sarif

    if not reports or outcome.run_dir is None or outcome.summary is None:
        return
    writers = {"JUnit XML": write_junit_xml, "SARIF": write_sarif}
    for kind, path in reports.items():
        try:
            writers[kind](outcome.run_dir, path)
        except (OSError, ValueError) as exc:    # the run stands (its exit code too); the report is missing
            print(f"cdeepfuzz: warning: could not write the {kind} file {path}: {exc}", file=sys.stderr, flush=True)
            continue
        if not quiet:
            print(f"cdeepfuzz: {kind}: {path}", file=sys.stderr, flush=True)   # beside the closing lines


def _join(address: str) -> None:
    from orchestrator.run.ray_runtime import join_ray

    try:
        join_ray(address)      # before anything else, to report a missing cluster as a usage error
    except Exception as exc:  # noqa: BLE001 - no cluster to join is a usage error here
        raise ConfigError(f"cannot join the Ray cluster at {address!r}: {exc}; start one with `ray start --head` "
                          f"or `ray up deploy/cluster.yaml`, or run without --address/RAY_ADDRESS") from None
