"""The whole training step under watch (issue 15): bugs that arise only in the backward pass or
the optimizer update, found and replayed; guarded twins clean; the cost of the watch.

For every subject of :data:`SUBJECTS` (``campaigns/targets/<name>.py``, each with a
``<name>_guarded.py`` twin) and every strategy, every searched op site is searched on its own
from the factory's state (``build_runner``, ``discover_sites``, ``SiteSearch(...).run``,
``finding_from``: 3 fresh replays), the out-of-reach probe off. A subject's figure is its
fastest site with a finding (phase, first op, steps, seconds, replays). Checked over every
search: no finding fails a fresh replay (the subject expected to be flaky aside), no search
met a non-finite value and ended without a finding (each ``runner.evaluate`` is watched, and
each trace), every guarded twin gives no candidate at all. The adaptive findings are written
to folders and replayed with ``cdeepfuzz replay`` in a fresh process. Last, the cost of the
watch: ``TorchRunner.evaluate(..., train=True)`` against the plain forward + ``backward()`` +
``step()`` of the same program (``benchmarks/targets/transformer_256.py``), side by side, in
its own section (``--cost-only`` measures it alone).

    python benchmarks/step_watch.py [--max-steps 100] [--guard-steps 60] [--only NAME ...] [--cost-only]
"""
from __future__ import annotations

import argparse
import ast
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import interleaved_cost, table, write_section  # noqa: E402

STRATEGIES = ("adaptive", "grist", "random")


@dataclass(frozen=True)
class Expect:
    """Where a subject's bug arises: its phase, the op that first goes non-finite and the
    text of that op's line in the subject's file; ``flaky``: randomness the engine cannot
    re-seed decides whether a replay reproduces it."""

    phase: str
    op: str
    line: str
    flaky: bool = False


SUBJECTS: dict[str, Expect] = {
    "attn_empty_sequence": Expect("backward", "sqrt", "return gain * x / (torch.sqrt((x ** 2).mean(-1, keepdim=True)) + eps)"),
    "instnorm_flatline": Expect("backward", "sqrt", "return (h - mean) / (torch.sqrt(var) + eps)"),
    "logreg_focal_plain": Expect("backward", "pow", "return (alpha_t * (1 - p_t) ** gamma * ce).mean()"),
    "gan_minibatch_std": Expect("backward", "sqrt", "std = torch.sqrt(((x - x.mean(0)) ** 2).mean(0)).mean()"),
    "vae_logvar_underflow": Expect("backward", "sqrt", "std = torch.sqrt(var)"),
    "poisson_adam_overflow": Expect("update", "update", "def program(b):"),
    "poincare_hierarchy": Expect("backward", "acosh", "return torch.acosh(1 + 2 * sq / denom)"),
    "tf_graph_triplet_adam": Expect("backward", "sqrt", "return tf.sqrt(tf.reduce_sum(tf.square(a - b), 1))"),
    "tf_graph_dropout_noise": Expect("backward", "sqrt", "std = tf.sqrt(var)"),
    "tf_keras_angular": Expect("backward", "acos", "return tf.acos(tf.clip_by_value(cosine(a, b), -1.0, 1.0))"),
}
TARGETS = ROOT / "campaigns" / "targets"


def entry(name: str) -> str:
    return f"campaigns/targets/{name}.py:make_target"


def line_of(name: str, text: str) -> str:
    """``path:line`` (repo-relative) of the one line of code (docstrings left out) holding ``text``."""
    path = TARGETS / f"{name}.py"
    source = path.read_text()
    docs = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            docs.update(range(node.lineno, node.end_lineno + 1))
    hits = [i for i, line in enumerate(source.splitlines(), 1) if text in line and i not in docs]
    if len(hits) != 1:
        raise ValueError(f"{text!r} is on lines {hits} of {path}")
    return f"campaigns/targets/{name}.py:{hits[0]}"


@dataclass
class SiteOutcome:
    site: str
    status: str
    steps: int
    seconds: float
    phase: str | None = None
    first_op: str | None = None
    replays: tuple[int, int] | None = None
    met_nonfinite: bool = False        # some step of this search saw a non-finite value
    error: str | None = None
    finding: object = None
    facts: dict = field(default_factory=dict)   # what a benchmark reads off the finding (precision facts)

    @property
    def found(self) -> bool:
        return self.replays is not None and self.replays[0] > 0

    @property
    def lost(self) -> bool:
        """Met a non-finite value and ended without a finding (must never happen)."""
        return self.met_nonfinite and self.replays is None and self.error is None


@dataclass
class Outcome:
    sites: list[SiteOutcome] = field(default_factory=list)
    build_error: str | None = None     # the target could not be built (a result to report)

    @property
    def best(self) -> SiteOutcome | None:
        found = [s for s in self.sites if s.replays is not None]
        return min(found, key=lambda s: (s.steps, s.seconds)) if found else None


def _watched(runner) -> dict:
    """Wrap ``runner.evaluate`` (this instance only) to note any step with a non-finite value."""
    seen = {"nonfinite": False}
    evaluate = runner.evaluate

    def watch(*args, **kwargs):
        ev = evaluate(*args, **kwargs)
        if ev.event or ev.triggered or not math.isfinite(ev.program_loss):
            seen["nonfinite"] = True
        return ev

    runner.evaluate = watch
    return seen


def search_subject(name: str, strategy: str, max_steps: int, seed: int = 0) -> Outcome:
    from fuzz_core.engine import TargetSpec, build_runner, discover_sites

    spec = TargetSpec(name, entry(name), seed=seed)
    runner = build_runner(spec)
    return Outcome(search_sites(runner, spec, discover_sites(runner, seed), strategy, max_steps, seed))


def _op_at(first: dict) -> str:
    return f"{first.get('op')}@{first.get('location')}"


def search_sites(runner, spec, sites, strategy: str, max_steps: int, seed: int = 0,
                 describe=_op_at) -> list[SiteOutcome]:
    """Search every searched site of a built target from the factory's state, confirm each
    candidate (``finding_from``: fresh replays), and note any step that met a non-finite value;
    ``describe`` names a finding's first op."""
    from fuzz_core.engine import finding_from
    from fuzz_core.search import SearchConfig, SiteSearch

    seen = _watched(runner)
    config = SearchConfig(strategy=strategy, max_steps=max_steps, seed=seed, reach_steps=0)
    out: list[SiteOutcome] = []
    for site in [s for s in sites if s.searched]:
        seen["nonfinite"] = False
        label = f"{site.op}@{site.location.rsplit(':', 1)[-1]}#{site.occurrence}"
        t0 = time.perf_counter()
        try:
            result = SiteSearch(runner, site, config).run(max_steps)
        except Exception as exc:  # noqa: BLE001 - an engine crash is a result to report
            out.append(SiteOutcome(label, "crash", 0, time.perf_counter() - t0, error=repr(exc)[:200]))
            continue
        seconds = time.perf_counter() - t0
        in_trace = any(p.triggered or p.event == "trigger" for p in result.trace)
        so = SiteOutcome(label, result.status.value, result.steps, seconds,
                         met_nonfinite=seen["nonfinite"] or in_trace)
        cand = result.candidate
        if cand is not None:
            so.phase = cand.phase
            try:
                finding = finding_from(runner, spec, site, config, cand, result.seconds, minimise_batch=False)
            except Exception as exc:  # noqa: BLE001
                so.error = f"finding_from: {exc!r}"[:200]
            else:
                so.finding = finding
                so.replays = tuple(finding.replays)
                so.phase = finding.phase
                so.first_op = describe(finding.first_op or {})
        out.append(so)
    return out


def replay_in_fresh_process(finding, folder: Path) -> tuple[int, str]:
    """Write the finding's folder and run ``cdeepfuzz replay`` on it from the repository root."""
    from fuzz_core.findings import write_finding

    write_finding(finding, folder)
    proc = subprocess.run([str(Path(sys.executable).with_name("cdeepfuzz")), "replay", str(folder)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    message = next((ln for ln in reversed(lines) if "reproduced" in ln), lines[-1] if lines else "")
    return proc.returncode, message.strip()


# ---- the cost of the watch ----------------------------------------------------------------

def watch_overhead(repeats: int = 41, warmup: int = 3) -> dict[str, dict[str, float]]:
    """Median seconds, wall and CPU (this process, one thread), of the plain step (forward,
    ``loss.backward()``, ``optimizer.step()``), of ``TorchRunner.evaluate(train=True)`` without
    the search's own gradient (the watch alone) and with it (a full search step), interleaved on
    the same program and batch, each from the factory's state."""
    import numpy as np
    import torch

    from fuzz_core.engine import TargetSpec, build_runner, discover_sites

    spec = TargetSpec("transformer_256", "benchmarks/targets/transformer_256.py:make_target")
    runner = build_runner(spec)
    site = next(s for s in discover_sites(runner, 0) if s.searched)
    values = runner.sample(np.random.default_rng(1))
    target = runner.target

    def plain():
        batch = {k: torch.as_tensor(v) for k, v in values.items()}
        loss = target.program(batch)
        target.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        target.optimizer.step()

    steps = {"plain": plain,
             "watched": lambda: runner.evaluate(values, site, grad=False, train=True, seed=0),
             "search_step": lambda: runner.evaluate(values, site, grad=True, train=True, seed=0)}
    return interleaved_cost(steps, runner.reset, repeats, warmup)


# ---- report -------------------------------------------------------------------------------

def _fmt_best(o: Outcome, max_steps: int) -> list[str]:
    b = o.best
    if b is None:
        crash = [s for s in o.sites if s.error]
        return ["crash" if crash else "missed", "-", "-", f"({max_steps})", "-", "-"]
    found = "flaky" if b.replays[0] < b.replays[1] else "found"
    return [found, b.phase or "-", (b.first_op or "-").replace("campaigns/targets/", ""), str(b.steps),
            f"{b.seconds:.2f}", f"{b.replays[0]}/{b.replays[1]}"]


def cost_report(cost: dict) -> str:
    """The cost of the watch, judged on CPU time (the work a step does; wall time on a shared
    machine moves with the other users' load), wall time shown beside it."""
    cpu, wall = cost["cpu"], cost["wall"]
    rows = []
    labels = {"plain": "plain: forward + `loss.backward()` + `optimizer.step()`",
              "watched": "`TorchRunner.evaluate(grad=False, train=True)`: the watched step",
              "search_step": "`TorchRunner.evaluate(grad=True, train=True)`: a search step (the watch plus the "
                             "site's suspect-loss gradient)"}
    for key, label in labels.items():
        rows.append([label, f"{cpu[key]:.4f}", f"{cpu[key] / cpu['plain']:.2f}", f"{wall[key]:.4f}",
                     f"{wall[key] / wall['plain']:.2f}"])
    paired = cost["paired"]
    ratio = paired["median"]
    return "\n".join([
        "## The cost of watching the whole step (issue 15)\n",
        "`benchmarks/targets/transformer_256.py` (2-layer `nn.TransformerEncoder`, d_model 256, batch 8 x 32 "
        f"tokens, SGD), the same batch, each step from the factory's state; interleaved, one thread, median of "
        f"{cost['repeats']} repeats after {cost['warmup']} warm-ups.\n",
        table(["step", "CPU s", "x plain (CPU)", "wall s", "x plain (wall)"], rows), "",
        f"Watched / plain, CPU time, the median of the {cost['repeats']} back-to-back pairs' ratios: **{ratio:.2f}x** "
        f"(target <= 1.3x: {'met' if ratio <= 1.3 else '**not met**'}; quartiles {paired['q1']:.2f}-{paired['q3']:.2f}x; "
        f"ratio of the medians {cpu['watched'] / cpu['plain']:.2f}x); wall time {wall['watched'] / wall['plain']:.2f}x. "
        f"A full search step, which also takes the suspect loss's gradient, costs "
        f"{cpu['search_step'] / cpu['plain']:.2f}x (CPU)."])


def report(results: dict, guards: dict, strategies: list[str], max_steps: int, guard_steps: int,
           replays: dict) -> str:
    names = [n for n in SUBJECTS if any((n, s) in results for s in strategies)]
    rows = []
    for name in names:
        exp = SUBJECTS[name]
        want = f"{exp.phase}, {exp.op}@{line_of(name, exp.line).rsplit(':', 1)[-1]}"
        for s in strategies:
            o = results[(name, s)]
            cells = _fmt_best(o, max_steps)
            b = o.best
            match = "-"
            if b is not None:
                match = "yes" if (b.phase == exp.phase and b.first_op
                                  == f"{exp.op}@{line_of(name, exp.line)}") else "**no**"
            rows.append([name if s == strategies[0] else "", want if s == strategies[0] else "", s, *cells, match])
    text = [f"## The whole step under watch: backward and update bugs (issue 15)\n\n"
            f"Budget {max_steps} steps per op site (guarded twins {guard_steps}), every searched site from the "
            "factory's state, out-of-reach probe off; a subject's figure is its fastest site with a finding "
            "(3 fresh replays by `finding_from`). `first op` is the op the finding names and its line; "
            "`as expected`: phase and first op as the subject's docstring says.\n",
            table(["subject", "expected (phase, op@line)", "strategy", "result", "phase", "first op", "steps",
                   "seconds", "replays", "as expected"], rows), ""]
    summary = []
    for s in strategies:
        outs = [results[(n, s)] for n in names]
        found = [o.best for o in outs if o.best is not None]
        steps = [o.best.steps if o.best is not None else max_steps for o in outs]
        summary.append([s, f"{len(found)}/{len(outs)}", statistics.median(steps) if steps else "-",
                        max(steps) if steps else "-"])
    text.append(table(["strategy", "subjects found", "median steps (miss = budget)", "max steps"], summary))
    all_sites = [so for o in results.values() for so in o.sites]
    expected_flaky = {n for n, e in SUBJECTS.items() if e.flaky}
    fail_replay = [(n, s, so) for (n, s), o in results.items() for so in o.sites
                   if so.replays is not None and so.replays[0] < so.replays[1] and n not in expected_flaky]
    flaky_expected = [(n, s, so) for (n, s), o in results.items() for so in o.sites
                      if so.replays is not None and so.replays[0] < so.replays[1] and n in expected_flaky]
    lost = [(n, s, so) for (n, s), o in results.items() for so in o.sites if so.lost]
    crashes = [(n, s, so) for (n, s), o in results.items() for so in o.sites if so.error]
    adaptive = [results[(n, "adaptive")].best for n in names if (n, "adaptive") in results]
    med = statistics.median([b.steps if b is not None else max_steps for b in adaptive]) if adaptive else None
    guard_rows = []
    for (name, s), o in guards.items():
        cands = [so for so in o.sites if so.phase is not None or so.error]
        guard_rows.append([name, s, len(o.sites), sum(so.steps for so in o.sites),
                           "none" if not cands else "; ".join(f"{c.site}: {c.phase} {c.first_op or c.error}"
                                                              for c in cands)])
    clean = all(row[-1] == "none" for row in guard_rows)
    text += ["", "### Targets", "",
             f"- Median steps of `adaptive` over the {len(adaptive)} backward/update subjects: **{med}** "
             f"(target <= 10: {'met' if med is not None and med <= 10 else '**not met**'}).",
             f"- Guarded twins with no candidate at all, every strategy: **{sum(r[-1] == 'none' for r in guard_rows)}"
             f"/{len(guard_rows)}** ({'met' if clean else '**not met**'}).",
             f"- Findings that fail a fresh replay (reproduced by fewer than all 3), subjects not expected to be "
             f"flaky: **{len(fail_replay)}** of {sum(so.replays is not None for so in all_sites)} findings "
             f"(target 0: {'met' if not fail_replay else '**not met**'})"
             + "".join(f"; {n}/{s} {so.site} {so.replays[0]}/{so.replays[1]}" for n, s, so in fail_replay) + ".",
             f"- Flaky findings of the subject expected to be flaky (randomness inside a TF1 graph): "
             f"{len(flaky_expected)}" + "".join(f"; {n}/{s} {so.site} {so.replays[0]}/{so.replays[1]}"
                                                for n, s, so in flaky_expected) + ".",
             f"- Searches that met a non-finite value and ended without a finding: **{len(lost)}** of "
             f"{len(all_sites)} searches (target 0: {'met' if not lost else '**not met**'})"
             + "".join(f"; {n}/{s} {so.site}" for n, s, so in lost) + ".",
             f"- Engine errors during a search or its confirmation: {len(crashes)}"
             + "".join(f"; {n}/{s} {so.site}: {so.error}" for n, s, so in crashes) + "."]
    if guard_rows:
        text += ["", table(["guarded twin", "strategy", "sites", "steps", "candidates"], guard_rows)]
    if replays:
        rrows = [[n, str(rc), msg.replace("campaigns/targets/", "")[:150]] for n, (rc, msg) in replays.items()]
        text += ["", "`cdeepfuzz replay FOLDER` in a fresh process, on each subject's adaptive finding "
                 "(exit 0: reproduced; a flaky finding may not be):", "", table(["subject", "exit", "message"], rrows)]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=100)
    ap.add_argument("--guard-steps", type=int, default=60)
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    ap.add_argument("--only", nargs="*", help="subject names to run (their twins too)")
    ap.add_argument("--no-guards", action="store_true")
    ap.add_argument("--no-replay", action="store_true", help="skip `cdeepfuzz replay` in a fresh process")
    ap.add_argument("--no-overhead", action="store_true", help="skip the cost of the watch")
    ap.add_argument("--cost-only", action="store_true", help="measure the cost of the watch only")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.cost_only:
        return _cost(args)
    names = [n for n in SUBJECTS if not args.only or n in args.only]
    results: dict[tuple[str, str], Outcome] = {}
    guards: dict[tuple[str, str], Outcome] = {}
    replays: dict[str, tuple[int, str]] = {}
    with tempfile.TemporaryDirectory(prefix="step-watch-") as tmp:
        for name in names:
            for s in args.strategies:
                o = results[(name, s)] = search_subject(name, s, args.max_steps)
                cells = _fmt_best(o, args.max_steps)
                print(f"{name:26s} {s:9s} {' '.join(cells)}", flush=True)
                b = o.best
                if s == "adaptive" and b is not None and b.finding is not None and not args.no_replay:
                    replays[name] = replay_in_fresh_process(b.finding, Path(tmp) / name)
                    print(f"    cdeepfuzz replay: exit {replays[name][0]}: {replays[name][1]}", flush=True)
                for so in o.sites:
                    so.finding = None
            if not args.no_guards:
                twin = f"{name}_guarded"
                for s in args.strategies:
                    o = guards[(twin, s)] = search_subject(twin, s, args.guard_steps)
                    cands = [so for so in o.sites if so.phase is not None or so.error]
                    print(f"{twin:26s} {s:9s} {'clean' if not cands else cands}", flush=True)
    body = report(results, guards, args.strategies, args.max_steps, args.guard_steps, replays)
    print(body)
    if not args.no_write:
        write_section("step_watch", body, script="step_watch")
    return 0 if args.no_overhead else _cost(args)


def _cost(args) -> int:
    body = cost_report(watch_overhead())
    print(body)
    if not args.no_write:
        write_section("step_watch_cost", body, script="step_watch", args="--cost-only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
