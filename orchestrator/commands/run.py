"""Run a campaign on the Ray cluster this machine belongs to.

The convenience path of ``deploy/cluster.yaml``::

    ray submit deploy/cluster.yaml orchestrator/launch.py -- campaigns/quickstart.yaml

``ray submit`` copies this file to ``~/launch.py`` on the head node and runs it there with
the head's Python (the cluster's environment, where cdeepfuzz is installed). It also runs
as ``python -m orchestrator.launch CAMPAIGN`` anywhere cdeepfuzz is installed, e.g. as the
entrypoint of ``ray job submit``.

What it does, compared with ``cdeepfuzz run``:

- joins the running cluster (``--address``, else ``RAY_ADDRESS``, else ``"auto"``: the
  cluster that ``ray start`` started on this node); it never starts an embedded Ray;
- finds the campaign relative to the current directory, else relative to the project
  folder that ``deploy/cluster.yaml`` syncs to every node (``--project-dir``, else
  ``CDEEPFUZZ_PROJECT_DIR``, else ``~/cdeepfuzz``), and runs from that folder, so that the
  campaign's relative ``entry:`` paths resolve as they do on a laptop;
- writes under an absolute folder: ``--output``, else the campaign's ``output`` when it is
  absolute or a URI, else ``~/cdeepfuzz-runs`` (the driver is the only writer, so the
  head's disk is enough);
- tracks to ``--tracking-uri``, else the campaign's ``tracking.uri``, else
  ``MLFLOW_TRACKING_URI`` (``deploy/cluster.yaml`` sets it on the head to the MLflow server
  it starts there); an MLflow server is required, as for any run on a cluster;
- exports live Ray metrics per op site (:mod:`orchestrator.observers.metrics`) unless ``--no-metrics``.

Exit codes are those of ``cdeepfuzz run`` (0 no finding, 1 findings, 2 usage or
configuration error, 3 a target could not be built or run); ``--ok-on-findings`` turns 1
into 0, for job schedulers that call every non-zero exit a failure.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __name__ == "__main__" and sys.path and (Path(sys.path[0]) / "__init__.py").is_file() and (
        Path(sys.path[0]).resolve() == Path(__file__).resolve().parent):
    # ``python orchestrator/launch.py``: keep orchestrator/'s modules (config, progress, ...)
    # from shadowing top-level modules; the package itself is imported as ``orchestrator``.
    sys.path.pop(0)

DEFAULT_PROJECT_DIR = "~/cdeepfuzz"
DEFAULT_OUTPUT_DIR = "~/cdeepfuzz-runs"
EXIT_USAGE = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="launch.py", description="Run a cdeepfuzz campaign on the Ray cluster of this node.")
    p.add_argument("campaign", help="campaign YAML file (relative to the current or the project folder)")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else 'auto')")
    p.add_argument("--project-dir", help=f"folder the campaign's relative paths start from "
                                         f"(default: CDEEPFUZZ_PROJECT_DIR, else {DEFAULT_PROJECT_DIR})")
    p.add_argument("--output", help=f"run folder root (default: the campaign's when absolute, else {DEFAULT_OUTPUT_DIR})")
    p.add_argument("--tracking-uri", help="MLflow server (default: the campaign's, else MLFLOW_TRACKING_URI)")
    p.add_argument("--ok-on-findings", action="store_true", help="exit 0, not 1, when the campaign has findings")
    p.add_argument("--no-metrics", action="store_true", help="do not export Ray metrics")
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    return p.parse_args(argv)


def _fail(message: str) -> int:
    print(f"cdeepfuzz launch: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        project, path = locate(args.campaign, args.project_dir)
    except FileNotFoundError as exc:
        return _fail(str(exc))
    os.chdir(project)
    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    os.environ["RAY_ADDRESS"] = address     # cluster mode: no embedded Ray, absolute output, a tracking server

    try:
        from orchestrator.run.campaign import RunOptions, explicit_tracking_uri, run_campaign
        from orchestrator.config import ConfigError, load_campaign
        from orchestrator.run.ray_runtime import join_ray
    except ImportError as exc:   # ~/launch.py run by a Python without cdeepfuzz
        return _fail(f"cdeepfuzz is not installed in {sys.executable} ({exc}); "
                     f"activate the cluster's environment or pip install -e the project")

    try:
        cfg = load_campaign(path)
    except ConfigError as exc:
        return _fail(str(exc))
    output = args.output or default_output(cfg.output)
    if "://" not in output:
        output = str(Path(output).expanduser().resolve())
    uri = explicit_tracking_uri(cfg, args.tracking_uri)
    if cfg.tracking.enabled and not uri:
        return _fail(f"{path}: no MLflow server: give --tracking-uri, set tracking.uri in the campaign, or export "
                     f"MLFLOW_TRACKING_URI=http://<head>:5000 (deploy/cluster.yaml starts one on the head)")
    try:
        join_ray(address)           # before run_campaign does, to report a missing cluster as a usage error
    except Exception as exc:  # noqa: BLE001 - no cluster to join is a usage error here
        return _fail(f"cannot join the Ray cluster at {address!r}: {exc}; start one with `ray start --head` "
                     f"or `ray up deploy/cluster.yaml`")
    try:
        outcome = run_campaign(cfg, path, RunOptions(tracking_uri=args.tracking_uri, progress=not args.quiet,
                                                     live=False if args.plain else None, output=output,
                                                     metrics=not args.no_metrics))
    except ConfigError as exc:
        return _fail(str(exc))
    code = outcome.exit_code
    if args.ok_on_findings and code == 1:
        code = 0
    print(f"cdeepfuzz launch: {outcome.findings} finding(s), exit code {code}; run folder {outcome.run_dir}",
          file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
