"""The campaign file: pydantic models (``extra="forbid"``) and one-line errors.

Every problem with a campaign file is reported as ``<file>: <field>: <problem> (got <value>)``
and the CLI exits with code 2, before anything starts.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fuzz_core.backends.base import INPUT_RANGE
from fuzz_core.loader import EntryError, entry_file, split_entry

SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class ConfigError(ValueError):
    """A user mistake in a campaign file or the command line: exit 2, no traceback."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class TargetConfig(_Model):
    name: str = Field(pattern=SAFE_NAME, max_length=80)
    entry: str
    framework: Literal["torch", "tensorflow"] | None = None
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("entry")
    @classmethod
    def _entry_shape(cls, v: str) -> str:
        try:
            split_entry(v)
        except EntryError as exc:
            raise ValueError(str(exc)) from None
        return v


class SearchConfigModel(_Model):
    strategy: Literal["adaptive", "grist", "random"] = "adaptive"
    max_steps: int = Field(500, ge=1, le=10_000_000)
    seed: int = Field(0, ge=0, lt=2**31)
    search_weights: bool = False
    minimise: bool = True
    input_range: float = Field(INPUT_RANGE, ge=0, le=1000, description=(
        "inputs without bounds: the sampled data's range grown by this many widths on each side, "
        "never across zero when the data keeps one sign"))


class SchedulerConfig(_Model):
    # share is the default: on the scheduler benchmark (benchmarks/RESULTS.md, scheduler_benefit) it is
    # the policy that keeps every seed within 2x round-robin's steps; loss-slope needs 3x on one
    policy: Literal["loss-slope", "share", "round-robin"] = Field("share", description=(
        "share (default: proportional shares by predicted steps to trigger, with a round-robin reserve "
        "that bounds the worst case) | loss-slope (strict priority by predicted steps, the previous "
        "default) | round-robin (the baseline)"))
    quantum: int = Field(20, ge=1, le=1_000_000)
    horizon: float | None = Field(None, gt=0, description=(
        "loss-slope only: a site is on course while its predicted steps to trigger are within "
        "horizon x its remaining budget; unset: 1 with the adaptive strategy, unlimited otherwise"))

    @field_validator("horizon")
    @classmethod
    def _horizon_for_loss_slope(cls, v: float | None, info) -> float | None:
        if v is not None and info.data.get("policy") != "loss-slope":
            raise ValueError("applies to the loss-slope policy only")
        return v


class Resources(_Model):
    num_actors: int = Field(2, ge=0, le=4096, description="0 runs every site in the driver process")
    num_cpus: float = Field(1, gt=0)
    num_gpus: float = Field(0, ge=0)
    max_restarts: int = Field(3, ge=0)


class Tracking(_Model):
    uri: str | None = None
    enabled: bool = True
    max_site_runs: int = Field(100, ge=0, description=(
        "one MLflow child run per site while the campaign has at most this many sites (one page of the "
        "MLflow UI); above, one child run per target (each site's best loss as a metric) and one per bug"))


class PrecisionConfig(_Model):
    """How the targets compute: as written (fp32), or in mixed precision as they would train."""

    autocast: Literal["fp16", "bf16"] | None = Field(None, description=(
        "PyTorch: run each program's forward pass under torch.autocast with this dtype"))
    grad_scaler: bool = Field(False, description=(
        "PyTorch: the engine's training step goes through a torch.amp.GradScaler (needs autocast)"))
    policy: Literal["mixed_float16", "mixed_bfloat16"] | None = Field(None, description=(
        "TensorFlow: the Keras mixed-precision policy set before the factory builds the model"))

    @field_validator("grad_scaler")
    @classmethod
    def _scaler_needs_autocast(cls, v: bool, info) -> bool:
        if v and info.data.get("autocast") is None:
            raise ValueError("needs precision.autocast (fp16 or bf16): a scaler without autocast scales fp32")
        return v

    def options(self):
        """The :class:`fuzz_core.backends.base.Precision` every runner of the campaign gets."""
        from fuzz_core.backends.base import Precision

        return Precision(self.autocast, self.grad_scaler, self.policy)


class ExpectedBug(_Model):
    """A bug a campaign is written to find: at the op of one of its targets (the catalogue's row: ``log``,
    ``log_grad`` for a backward hazard, ``half_overflow`` ...), on a line of that target's file."""

    target: str
    op: str
    line: int | None = Field(None, ge=1, description="the line of the user's call in the target's entry file")
    column: int | None = Field(None, ge=1, description="its column, where one line holds two such calls")
    phase: Literal["forward", "backward", "update"] | None = None

    def matches(self, bug: dict[str, Any], path: str | None) -> bool:
        """``bug`` (as ``summary.json`` lists it) is this one (``path``: the target's entry file)."""
        location = str(bug.get("location", ""))
        file, _, line = location.rpartition(":")
        return (self.target in (bug.get("targets") or []) and bug.get("op") == self.op
                and (self.phase is None or bug.get("phase") == self.phase)
                and (self.column is None or bug.get("column") == self.column)
                and (self.line is None or (line.isdigit() and int(line) == self.line
                                           and (path is None or file == path))))

    def __str__(self) -> str:
        where = (f" at line {self.line}" + (f":{self.column}" if self.column else "")) if self.line else ""
        return f"{self.op}{f' ({self.phase})' if self.phase else ''} in {self.target}{where}"


class Expect(_Model):
    """What a campaign is written to find (its example's promise): ``cdeepfuzz run`` says whether the run
    found exactly these bugs, no more, and ``summary.json`` keeps the verdict (``expect``). Campaigns of
    a user's own programs leave it out."""

    bugs: list[ExpectedBug] = Field(default_factory=list)


class Campaign(_Model):
    name: str = Field(pattern=SAFE_NAME, max_length=80)
    targets: list[TargetConfig] = Field(min_length=1)
    search: SearchConfigModel = Field(default_factory=SearchConfigModel)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    resources: Resources = Field(default_factory=Resources)
    device: Literal["cpu", "cuda", "auto"] = "auto"
    time_limit_s: float = Field(600, gt=0)
    quantum_timeout_s: float = Field(300, gt=0)
    output: str = "runs"
    tracking: Tracking = Field(default_factory=Tracking)
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig)
    expect: Expect | None = None

    @model_validator(mode="after")
    def _unique_targets(self) -> "Campaign":
        seen: set[str] = set()
        for t in self.targets:
            if t.name in seen:
                raise ValueError(f"targets: two targets are named {t.name!r}")
            seen.add(t.name)
        for i, bug in enumerate(self.expect.bugs if self.expect else []):
            if bug.target not in seen:
                raise ValueError(f"expect.bugs[{i}].target: no target is named {bug.target!r}")
        return self

    def expectation(self, bugs: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Whether the run's ``bugs`` are exactly what :attr:`expect` says (None when it says nothing):
        ``met``, and the expected bugs ``missing`` and the run's bugs ``unexpected``, in words."""
        if self.expect is None:
            return None
        files = {t.name: entry_path(t.entry) for t in self.targets}
        missing = [str(e) for e in self.expect.bugs if not any(e.matches(b, files[e.target]) for b in bugs)]
        unexpected = [f"{b.get('op')} ({b.get('phase')}) at {b.get('position')} in {', '.join(b.get('targets') or [])}"
                      for b in bugs if not any(e.matches(b, files[e.target]) for e in self.expect.bugs)]
        return {"met": not missing and not unexpected, "expected": [str(e) for e in self.expect.bugs],
                "missing": missing, "unexpected": unexpected}


def entry_path(entry: str) -> str | None:
    """The file an entry names, as written (``campaigns/targets/x.py``: the path its op sites' locations
    carry when the campaign runs from the folder it is written for); None for a ``pkg.module`` entry."""
    module, _ = split_entry(entry)
    return Path(module).as_posix() if module.endswith(".py") else None


def _format_error(path: Path, err: dict) -> str:
    loc = ""
    for part in err.get("loc", ()):
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    msg = err.get("msg", "invalid").removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown field"
    value = err.get("input")
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    if len(shown) > 80:
        shown = shown[:77] + "..."
    where = f"{loc}: " if loc else ""
    if err.get("type") == "missing":
        return f"{path}: {where}required field is missing"
    return f"{path}: {where}{msg} (got {shown})"


def parse_campaign(data: Any, path: Path) -> Campaign:
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a campaign file must be a mapping of fields, got {type(data).__name__}")
    try:
        return Campaign.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(path, exc.errors()[0])) from None


def load_campaign(path: str | Path, check_entries: bool = True) -> Campaign:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such campaign file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    campaign = parse_campaign(data, path)
    if check_entries:
        for i, target in enumerate(campaign.targets):
            check_entry(path, i, target.entry, target.args, target=target.name)
    return campaign


def check_entry(path: Path, index: int, entry: str, args: dict[str, Any] | None = None,
                target: str | None = None) -> None:
    """The file exists and defines the factory (read with ast: nothing is imported or run); a factory
    defined there takes every argument of ``args`` (its signature, unless it takes ``**kwargs``)."""
    field = f"targets[{index}].entry"
    module, attr = split_entry(entry)
    try:
        file = entry_file(entry)
    except Exception:  # noqa: BLE001 - a package that fails to import is checked when built
        return
    if file is None:
        raise ConfigError(f"{path}: {field}: no module or file {module!r} (got {entry!r})")
    if not file.is_file():
        raise ConfigError(f"{path}: {field}: no such file {module!r} (got {entry!r})")
    if file.suffix != ".py":
        return
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except SyntaxError as exc:
        raise ConfigError(f"{path}: {field}: {module} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    names = set(defs)
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    names |= {a.asname or a.name for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    if attr not in names:
        raise ConfigError(f"{path}: {field}: {module} defines no {attr!r} (got {entry!r})")
    factory = defs.get(attr)
    if isinstance(factory, (ast.FunctionDef, ast.AsyncFunctionDef)) and args is not None:
        check_args(path, index, attr, factory, args, target=target)


def check_args(path: Path, index: int, attr: str, factory: ast.FunctionDef | ast.AsyncFunctionDef,
               args: dict[str, Any], target: str | None = None) -> None:
    """The factory's own signature takes ``seed`` and every name of ``args`` (unless it takes ``**kwargs``)."""
    a = factory.args
    if a.kwarg is not None:
        return
    takes = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    of = f" of target {target!r}" if target else ""
    for name in ["seed", *args]:
        if name not in takes:
            field = f"targets[{index}].args.{name}" if name != "seed" else f"targets[{index}].entry"
            problem = (f"{attr}(){of} takes no argument {name!r}" if name != "seed"
                       else f"{attr}(){of} must take a seed= argument (the campaign seed)")
            raise ConfigError(f"{path}: {field}: {problem} (it takes {', '.join(takes) or 'none'})")


def params(config: Campaign) -> dict[str, Any]:
    """The campaign as MLflow params: nested mappings, list items keyed by index
    (``targets.0.entry``), empty mappings left out. The tracker flattens them to dotted keys."""

    def index(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: index(v) for k, v in value.items() if v != {}}
        if isinstance(value, list):
            return {str(i): index(v) for i, v in enumerate(value)}
        return value

    return index(config.model_dump())


def cluster_mode() -> bool:
    return bool(os.environ.get("RAY_ADDRESS"))


def check_cluster_settings(campaign: Campaign, output: str, uri: str | None, path: Path) -> None:
    """On a cluster (RAY_ADDRESS set) the output is absolute (or a URI) and tracking goes to an MLflow server."""
    if not cluster_mode():
        return
    if not (Path(output).is_absolute() or "://" in output):
        raise ConfigError(f"{path}: output: on a cluster (RAY_ADDRESS is set) the output must be an absolute "
                          f"path or a URI, shared by every node (got {output!r})")
    if campaign.tracking.enabled and not (uri or "").startswith(("http://", "https://", "databricks")):
        raise ConfigError(f"{path}: tracking.uri: on a cluster (RAY_ADDRESS is set) the tracking URI must be an "
                          f"MLflow server (http://...), given with --tracking-uri, tracking.uri or "
                          f"MLFLOW_TRACKING_URI (got {uri!r}; deploy/cluster.yaml starts one on the head), "
                          f"or set tracking.enabled: false")


def resolve_tracking_uri(cli_uri: str | None = None, *, campaign: Campaign | None = None,
                         run_dir: Path | str | None = None, output: Path | str | None = None,
                         search: Path | str | None = None) -> str | None:
    """The MLflow tracking URI, in one order for every command:

    1. ``--tracking-uri``;
    2. the campaign's ``tracking.uri``;
    3. the run's own (a run folder's ``summary.json``: resume, triage, sync, report);
    4. ``MLFLOW_TRACKING_URI``;
    5. ``sqlite:///<absolute output>/mlflow.db`` for a run writing to ``output``;
    6. the store of the newest run folder under ``search`` (``bugs`` and ``triage`` from a project folder).

    None when none applies.
    """
    if cli_uri:
        return cli_uri
    if campaign is not None and campaign.tracking.uri:
        return campaign.tracking.uri
    if run_dir is not None:
        own = run_tracking_uri(Path(run_dir))
        if own:
            return own
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if output is not None:
        return "sqlite:///" + (Path(output).resolve() / "mlflow.db").as_posix()
    if search is not None:
        return newest_run_tracking_uri(Path(search))
    return None


def run_tracking_uri(run_dir: Path) -> str | None:
    """The tracking URI a run folder's summary.json names (None if none, or unreadable)."""
    from fuzz_core.io import read_json

    try:
        summary = read_json(run_dir / "summary.json")
    except (OSError, ValueError):
        return None
    run = summary.get("run") if isinstance(summary, dict) else None
    uri = run.get("tracking_uri") if isinstance(run, dict) else None
    return uri or None


def newest_run_tracking_uri(folder: Path) -> str | None:
    """The tracking URI of the newest run (by summary.json's time) under ``folder`` that names one."""
    newest, uri = -1.0, None
    for summary in folder.glob("**/summary.json"):
        try:
            mtime = summary.stat().st_mtime
        except OSError:
            continue
        if mtime > newest:
            run_uri = run_tracking_uri(summary.parent)
            if run_uri:
                newest, uri = mtime, run_uri
    return uri
