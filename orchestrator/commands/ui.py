"""``cdeepfuzz ui [FOLDER]``: a run in MLflow, at its campaign's experiment.

The run's tracking store is the one its ``summary.json`` names (else ``MLFLOW_TRACKING_URI``). A local store
(SQLite, or a file store) has no server: ``mlflow ui`` is started on it, in the foreground, and the line
printed first is the address of the campaign's experiment, its runs (one per op site) as a table, not
MLflow's start page (MLflow 3 opens on its GenAI pages); experiments CDeepFuzz creates say so to MLflow
(``mlflow.experimentKind``), and an older one is told so here. A tracking server is only named.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable


class UiError(ValueError):
    """No run to show, or no tracking store for it (exit 2)."""


def experiment_url(base: str, experiment_id: str) -> str:
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}"


def _run_of(folder: Path | None) -> Path:
    """The run folder itself, or the newest run of an output folder (of the newest output under the current
    directory when none is given)."""
    from fuzz_core.dedupe import find_output
    from orchestrator.commands.report import ReportError, run_folders

    if folder is None:
        folder = find_output(Path.cwd())
        if folder is None:
            raise UiError("no runs under the current directory: give a run folder")
    try:
        return run_folders(folder)[-1]
    except ReportError as exc:
        raise UiError(str(exc)) from None


def serve(folder: Path | None, host: str, port: int, say: Callable[[str], None]) -> None:
    """Name the experiment's address, and serve a local store's UI until Ctrl-C."""
    from fuzz_core.io import read_json
    from orchestrator.config import resolve_tracking_uri
    from orchestrator.observers.tracking_sender import EXPERIMENT_KIND, RUNS_KIND, _make_client

    run_dir = _run_of(folder)
    uri = resolve_tracking_uri(None, run_dir=run_dir)
    if not uri:
        raise UiError(f"{run_dir}: the run kept no tracking store (tracking was off)")
    campaign = str((read_json(run_dir / "summary.json").get("campaign") or {}).get("name") or "")
    client = _make_client(uri)
    experiment = client.get_experiment_by_name(campaign)
    if experiment is None:
        raise UiError(f"{uri}: no experiment {campaign!r} (its MLflow writes were spooled: cdeepfuzz sync {run_dir})")
    if experiment.tags.get(EXPERIMENT_KIND) != RUNS_KIND:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND, RUNS_KIND)
    if uri.startswith(("http://", "https://")):
        say(f"MLflow: {experiment_url(uri, experiment.experiment_id)}")
        return
    say(f"MLflow UI: {experiment_url(f'http://{host}:{port}', experiment.experiment_id)} (Ctrl-C to stop)")
    sys.stdout.flush()
    # this process becomes MLflow's UI (a signal that stops it stops the UI: no server left behind)
    os.execv(sys.executable, [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host,
                              "--port", str(port)])
