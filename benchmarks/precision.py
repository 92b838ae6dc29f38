"""Mixed precision (issue 19): the fp16-only bugs of the ``mp_*`` subjects, found by ``adaptive``;
guarded twins clean; the precision-only share; the recorder's cost under autocast.

For every subject of :data:`SUBJECTS` (``campaigns/targets/<name>.py``, each with a
``<name>_guarded.py`` twin) the target is built as a mixed-precision campaign builds it
(``build_runner(spec, RunnerOptions(precision=Precision(autocast="fp16", ...)))``; the Keras
subject with ``Precision(policy="mixed_float16")``), its op sites discovered, and every searched
site searched on its own with ``adaptive`` from the factory's state (``SiteSearch(...).run``,
the out-of-reach probe off) and confirmed by ``finding_from`` (fresh replays, then the fp32
re-check). A subject's figure is its fastest site with a finding: steps, seconds, phase, the
first op, and the precision facts of the finding (the dtype, the value and by how much it
exceeds the dtype's largest finite value, ``precision_only``, the consecutive skips of a
GradScaler: the engine's, or the program's own as in ``mp_cnn_scaler``). Every guarded twin is
searched the same way and must give no candidate. Last, the recorder's cost under autocast:
``TorchRunner.evaluate`` (the watched step) against the plain autocast forward of the same
program (``mp_t5_ff``), interleaved, as ``benchmarks/step_watch.py`` measures the watch.

    python benchmarks/precision.py [--max-steps 100] [--guard-steps 60] [--only NAME ...] [--no-tf]
                                   [--no-overhead] [--no-write]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import interleaved_cost, table, write_section  # noqa: E402
from benchmarks.step_watch import Outcome, search_sites  # noqa: E402


@dataclass(frozen=True)
class Subject:
    """How a campaign runs the subject: its framework and precision settings."""

    framework: str = "torch"
    autocast: str | None = "fp16"
    grad_scaler: bool = False
    policy: str | None = None
    note: str = ""


SUBJECTS: dict[str, Subject] = {
    "mp_t5_ff": Subject(note="T5 FF `wi` output past 65504"),
    "mp_attn_softmax": Subject(note="hand softmax: fp16 `exp` of a logit > 11.09"),
    "mp_sum_loss": Subject(note="loss summed over 16,384 terms in fp16"),
    "mp_layernorm": Subject(note="hand LayerNorm: `(x - mean) ** 2` past 65504"),
    "mp_cnn_scaler": Subject(note="own GradScaler loop: fp16 weight gradient, scale collapse"),
    "mp_keras_poisson": Subject("tensorflow", None, False, "mixed_float16", "Keras `exponential` output in float16"),
}
TIME_STEPS_TARGET = 10      # the target: median steps over the subjects


def entry(name: str) -> str:
    return f"campaigns/targets/{name}.py:make_target"


def options_for(subject: Subject):
    from fuzz_core.backends.base import Precision, RunnerOptions

    return RunnerOptions(precision=Precision(autocast=subject.autocast, grad_scaler=subject.grad_scaler,
                                             policy=subject.policy))


def precision_facts(finding) -> dict:
    overflow = finding.overflow or {}
    return {"precision_only": finding.precision_only, "dtype": overflow.get("dtype"),
            "value": overflow.get("value"), "limit": overflow.get("limit"), "excess": overflow.get("excess"),
            "scaler_skips": finding.scaler_skips}


def _op_kind_at(first: dict) -> str:
    op, kind = first.get("op"), first.get("kind")
    return f"{op}{'' if kind in (None, op) else f' ({kind})'}@{first.get('location')}"


def search_subject(name: str, subject: Subject, max_steps: int, seed: int = 0) -> Outcome:
    from fuzz_core.engine import TargetSpec, build_runner, discover_sites

    spec = TargetSpec(name, entry(name), framework=subject.framework, seed=seed)
    out = Outcome()
    try:
        runner = build_runner(spec, options_for(subject))
        sites = discover_sites(runner, seed)
    except Exception as exc:  # noqa: BLE001 - a subject the engine cannot build is a result to report
        out.build_error = repr(exc)[:200]
        return out
    out.sites = search_sites(runner, spec, sites, "adaptive", max_steps, seed, describe=_op_kind_at)
    for so in out.sites:
        if so.finding is not None:
            so.facts = precision_facts(so.finding)
            so.finding = None
    return out


# ---- the recorder's cost under autocast -----------------------------------------------------

def autocast_overhead(repeats: int = 41, warmup: int = 3) -> dict:
    """Median seconds, wall and CPU (one thread), of the plain autocast forward of ``mp_t5_ff``
    (``torch.autocast(fp16)`` around ``program``), of ``TorchRunner.evaluate(grad=False)`` (the
    watched step: recorder and checks) and of ``evaluate(grad=True)`` (a search step), interleaved
    on the same batch from the factory's state."""
    import numpy as np
    import torch

    from fuzz_core.engine import TargetSpec, build_runner, discover_sites

    spec = TargetSpec("mp_t5_ff", entry("mp_t5_ff"), framework="torch")
    runner = build_runner(spec, options_for(SUBJECTS["mp_t5_ff"]))
    site = next(s for s in discover_sites(runner, 0) if s.searched)
    values = runner.sample(np.random.default_rng(1))
    target = runner.target

    def plain():
        batch = {k: torch.as_tensor(v) for k, v in values.items()}
        with torch.autocast("cpu", dtype=torch.float16):
            loss = target.program(batch)
        float(loss)

    steps = {"plain": plain,
             "watched": lambda: runner.evaluate(values, site, grad=False, train=True, seed=0),
             "search_step": lambda: runner.evaluate(values, site, grad=True, train=True, seed=0)}
    return interleaved_cost(steps, runner.reset, repeats, warmup)


def overhead_report(cost: dict) -> str:
    cpu, wall = cost["cpu"], cost["wall"]
    labels = {"plain": "plain: `program` under `torch.autocast(fp16)`",
              "watched": "`TorchRunner.evaluate(grad=False)`: the watched step (recorder, half_overflow margins)",
              "search_step": "`TorchRunner.evaluate(grad=True)`: a search step (plus the suspect loss's gradient)"}
    rows = [[label, f"{cpu[k]:.5f}", f"{cpu[k] / cpu['plain']:.2f}", f"{wall[k]:.5f}", f"{wall[k] / wall['plain']:.2f}"]
            for k, label in labels.items()]
    p = cost["paired"]
    return "\n".join([
        "### The recorder's cost under autocast\n",
        f"`campaigns/targets/mp_t5_ff.py` (two T5 FF layers, d 32, batch 8 x 8 frames) under fp16 autocast, the "
        f"same batch, each step from the factory's state; interleaved, one thread, median of {cost['repeats']} "
        f"repeats after {cost['warmup']} warm-ups.\n",
        table(["step", "CPU s", "x plain (CPU)", "wall s", "x plain (wall)"], rows), "",
        f"Watched / plain autocast step, CPU time, the median of the back-to-back pairs' ratios: "
        f"**{p['median']:.2f}x** (quartiles {p['q1']:.2f}-{p['q3']:.2f}x); a search step "
        f"{cpu['search_step'] / cpu['plain']:.2f}x. (A tiny program: the recorder's fixed cost per op dominates.)"])


# ---- report ---------------------------------------------------------------------------------

def _num(v, fmt: str = "{:.4g}") -> str:
    return "-" if v is None else fmt.format(v)


def _row(name: str, o: Outcome, max_steps: int) -> list[str]:
    b = o.best
    if b is None:
        why = "build error" if o.build_error else ("crash" if any(s.error for s in o.sites) else "missed")
        return [name, why, "-", f"({max_steps})", "-", "-", "-", "-", "-", "-", "-"]
    f = b.facts
    found = "flaky" if b.replays[0] < b.replays[1] else "found"
    only = {True: "yes", False: "no"}.get(f.get("precision_only"), "-")
    return [name, found, b.phase or "-", str(b.steps), f"{b.seconds:.2f}",
            (b.first_op or "-").replace("campaigns/targets/", ""), f.get("dtype") or "-", _num(f.get("value")),
            _num(f.get("excess"), "{:.3g}x"), only, _num(f.get("scaler_skips"), "{}")]


def report(results: dict, guards: dict, max_steps: int, guard_steps: int) -> str:
    names = list(results)
    rows = [_row(n, results[n], max_steps) for n in names]
    text = ["## Mixed precision: fp16-only bugs (issue 19)\n",
            f"`adaptive`, budget {max_steps} steps per op site (guarded twins {guard_steps}), every searched site "
            "from the factory's state, out-of-reach probe off; torch subjects under `Precision(autocast=\"fp16\")`, the "
            "Keras one under `Precision(policy=\"mixed_float16\")`. A subject's figure is its fastest site with a "
            "finding (`finding_from`: fresh replays, then the fp32 re-check, every autocast region disabled, the "
            "program's own too). `value`: the op's output in float32 where the half one overflowed; `excess`: value / "
            "the dtype's largest finite value; `scaler skips`: consecutive steps a GradScaler skips on the found values "
            "(`mp_cnn_scaler`: its own, in its train step).\n",
            table(["subject", "result", "phase", "steps", "seconds", "first op", "dtype", "value", "excess",
                   "precision-only", "scaler skips"], rows), ""]
    found = [results[n].best for n in names if results[n].best is not None]
    steps = [results[n].best.steps if results[n].best is not None else max_steps for n in names]
    median = statistics.median(steps) if steps else math.nan
    only = [b for b in found if b.facts.get("precision_only") is True]
    known = [b for b in found if b.facts.get("precision_only") is not None]
    text.append(f"- Subjects found: **{len(found)}/{len(names)}**; median steps (a miss counts as the budget): "
                f"**{median}** (target <= {TIME_STEPS_TARGET}: {'met' if median <= TIME_STEPS_TARGET else '**not met**'}); "
                f"max {max(steps) if steps else '-'}.")
    text.append(f"- Precision-only share of the findings: **{len(only)}/{len(known)}**"
                + (f" ({len(found) - len(known)} without the fact)" if len(known) < len(found) else "") + ".")
    errors = [(n, o.build_error) for n, o in results.items() if o.build_error] + \
             [(n, f"{s.site}: {s.error}") for n, o in results.items() for s in o.sites if s.error]
    text.append(f"- Engine errors: {len(errors)}" + "".join(f"; {n}: {e}" for n, e in errors) + ".")
    if guards:
        grows = []
        for twin, o in guards.items():
            cands = [s for s in o.sites if s.phase is not None]
            verdict = "build error" if o.build_error else ("clean" if not cands else
                                                            "**flagged**: " + ", ".join(f"{s.site} ({s.phase})" for s in cands))
            grows.append([twin, str(len(o.sites)), str(sum(s.steps for s in o.sites)), verdict])
        clean = sum(1 for r in grows if r[3] == "clean")
        text += ["", f"Guarded twins clean: **{clean}/{len(grows)}**.", "",
                 table(["guarded twin", "sites", "steps", "verdict"], grows)]
    return "\n".join(text)


def _tf_available() -> bool:
    try:
        import tensorflow  # noqa: F401
    except Exception:  # noqa: BLE001 - TensorFlow is an optional extra
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=100)
    ap.add_argument("--guard-steps", type=int, default=60)
    ap.add_argument("--only", nargs="*", help="subject names to run (their twins too)")
    ap.add_argument("--no-guards", action="store_true")
    ap.add_argument("--no-tf", action="store_true", help="leave out the Keras subject")
    ap.add_argument("--no-overhead", action="store_true", help="skip the recorder's cost under autocast")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    chosen = [n for n in SUBJECTS if not args.only or n in args.only]
    tf_ok = not args.no_tf and any(SUBJECTS[n].framework == "tensorflow" for n in chosen) and _tf_available()
    names = [n for n in chosen if SUBJECTS[n].framework != "tensorflow" or tf_ok]
    results: dict[str, Outcome] = {}
    guards: dict[str, Outcome] = {}
    for name in names:
        o = results[name] = search_subject(name, SUBJECTS[name], args.max_steps)
        print(" ".join(_row(name, o, args.max_steps)), flush=True)
        if not args.no_guards:
            twin = f"{name}_guarded"
            g = guards[twin] = search_subject(twin, SUBJECTS[name], args.guard_steps)
            cands = [s.site for s in g.sites if s.phase is not None]
            print(f"{twin:28s} {'clean' if not cands and not g.build_error else cands or g.build_error}", flush=True)
    body = report(results, guards, args.max_steps, args.guard_steps)
    if not args.no_overhead and "mp_t5_ff" in names:
        body += "\n\n" + overhead_report(autocast_overhead())
    print(body)
    if not args.no_write:
        extra = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in (("max_steps", args.max_steps),
                                                                     ("guard_steps", args.guard_steps)))
        write_section("precision", body, script="precision", args=extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
