"""Probe a benchmark subject without the engine: is its bug reachable, and only by search?

    .venv/bin/python campaigns/tools/probe.py campaigns/targets/softmax_xent_mlp.py [--steps 300]

For a subject it reports
  * ``random``: how many of 200 sampled batches, and of 200 batches drawn uniformly
    within ``bounds``, make a suspect op go non-finite (with the weights frozen);
  * ``search``: for every suspect op site seen in one forward pass, plain gradient
    descent (Adam, clipped to ``bounds``) on the op's distance to the edge of its
    domain, and the step at which some op first goes non-finite.

It is a development aid for writing subjects (it mirrors the op catalogue of
DESIGN.md in a few lines), not the engine: it imports nothing from fuzz_core but
the Target class and uses no hooks in the subject.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

TINY = float(np.finfo(np.float32).smallest_subnormal)
LOG_TINY = math.log(TINY) - 3.0
EXP_MAX = float(np.log(np.finfo(np.float32).max))

# packet -> (catalogue name, index of the checked input, log space?)
SUSPECT = {
    "log": ("log", 0, True), "log2": ("log", 0, True), "log10": ("log", 0, True),
    "log1p": ("log1p", 0, True), "div": ("div", 1, True), "reciprocal": ("div", 0, True),
    "sqrt": ("sqrt", 0, False), "rsqrt": ("rsqrt", 0, True), "exp": ("exp", 0, False),
    "expm1": ("exp", 0, False), "pow": ("pow", 0, False), "acos": ("acos", 0, False),
    "asin": ("acos", 0, False), "atanh": ("atanh", 0, False), "xlogy": ("log", 1, True),
}
SUSPECT.update({k + "_": v for k, v in list(SUSPECT.items())})
TARGETS_DIR = os.path.join("campaigns", "targets")
UNINITIALISED = ("empty", "new_empty", "resize", "set_")   # their outputs hold garbage, maybe NaN bits


def margin(name: str, args: tuple, idx: int = 0) -> torch.Tensor | None:
    """Elementwise distance to the edge of the domain (<= 0 outside) of input ``idx`` (the
    SUSPECT table's index: the divisor of ``div``, the operand of ``reciprocal``), or None."""
    if name == "pow":
        base, e = args[0], args[1]
        if not isinstance(base, torch.Tensor) or not isinstance(e, (int, float)) or float(e) == int(e):
            return None
        return base
    if idx >= len(args) or not isinstance(args[idx], torch.Tensor):
        return None
    x = args[idx].float()
    if name == "log":
        return x
    if name == "log1p":
        return x + 1
    if name == "div":
        return x.abs()
    if name in ("sqrt", "rsqrt"):
        return x
    if name == "exp":
        return EXP_MAX - x
    if name in ("acos", "atanh"):
        return 1 - x.abs()
    return None


def search_loss(m: torch.Tensor, log_space: bool, soft: bool = False) -> torch.Tensor:
    """Hard minimum of the margin (log space for quantities that shrink multiplicatively).

    With ``soft``, a differentiable surrogate whose gradient is that of a soft minimum, so
    that every element makes progress; in log space its gradient is ``grad(m) / m``,
    computed without ``1/m`` overflowing float32 when ``m`` is subnormal.
    """
    m = m.flatten()
    if not soft:
        if log_space:
            m = torch.log(m.clamp_min(TINY)) - LOG_TINY
        return m.min()
    md = m.detach()
    val = torch.log(md.clamp_min(TINY)) - LOG_TINY if log_space else md
    tau = 0.1 * val.abs().mean().clamp_min(1e-6)
    w = torch.softmax(-val / tau, 0)
    if log_space:
        return (w * m / md.clamp_min(1e-30)).sum()
    return (w * m).sum()


@dataclass
class Call:
    key: tuple
    name: str
    log_space: bool
    args: tuple
    bad: bool = False
    arg: int = 0        # the checked input


def _locate() -> str:
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if TARGETS_DIR in fn:
            return f"{os.path.basename(fn)}:{f.f_lineno}"
        f = f.f_back
    return "<torch>:0"


def _finite(ts) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tree_leaves(ts)
               if isinstance(t, torch.Tensor) and t.is_floating_point())


def _nan(ts) -> bool:
    return any(bool(torch.isnan(t).any()) for t in tree_leaves(ts)
               if isinstance(t, torch.Tensor) and t.is_floating_point())


class Probe(TorchDispatchMode):
    """Records suspect ops; flags a suspect op whose output goes non-finite from finite
    inputs, and any op whose output has a NaN that its inputs did not have."""

    def __init__(self):
        super().__init__()
        self.calls: list[Call] = []
        self.counts: dict = {}
        self.events: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket.__name__
        out = func(*args, **kwargs)
        spec = SUSPECT.get(packet)
        loc = None
        if spec is not None:
            loc = _locate()
            key = (spec[0], loc)
            occ = self.counts.get(key, 0)
            self.counts[key] = occ + 1
            bad = _finite(args) and not _finite(out)
            self.calls.append(Call((spec[0], loc, occ), spec[0], spec[2], tuple(args), bad, spec[1]))
            if bad:
                self.events.append(f"{spec[0]}@{loc}#{occ}")
        elif not func.is_view and not packet.startswith(UNINITIALISED) and _nan(out) and not _nan(args):
            self.events.append(f"{packet}@{_locate()} (NaN)")
        return out


def load(path: str, seed: int = 0, **args):
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, mod.make_target(seed=seed, **args)


def to_torch(batch: dict, search) -> dict:
    out = {}
    for k, v in batch.items():
        t = torch.as_tensor(np.asarray(v))
        if k in search:
            t = t.clone().requires_grad_(True)
        out[k] = t
    return out


def run(target, batch: dict, step_seed: int = 0):
    torch.manual_seed(step_seed)
    probe = Probe()
    with probe:
        res = target.program(batch)
    return probe, _loss(res), res


def _loss(res):
    """The loss of a program's return value: the first of a tuple, ``res["loss"]``, or itself."""
    return res[0] if isinstance(res, (tuple, list)) else res["loss"] if isinstance(res, dict) else res


def _uniform_within_bounds(target, b: dict, rng: np.random.Generator) -> None:
    """Replace every searched input of ``b`` by values drawn uniformly within its bounds."""
    for k in target.search:
        lo, hi = target.bounds[k]
        b[k] = rng.uniform(lo, hi, size=np.shape(b[k])).astype(np.float32)


def random_check(target, n: int = 200, seed: int = 1) -> tuple[int, int, list]:
    rng = np.random.default_rng(seed)
    hits_s = hits_u = 0
    events = []
    with torch.no_grad():
        for i in range(n):
            b = target.sample(rng)
            probe, _, _ = run(target, to_torch(b, ()), i)
            if probe.events:
                hits_s += 1
                events += probe.events[:1]
            _uniform_within_bounds(target, b, rng)
            probe, _, _ = run(target, to_torch(b, ()), i)
            if probe.events:
                hits_u += 1
                events += probe.events[:1]
    return hits_s, hits_u, events


def train_random_check(path: str, n: int = 200, seed: int = 0, uniform: bool = False) -> int | None:
    """Let the program train on ``n`` fresh batches (sampled, or uniform within bounds),
    checking each forward pass; the step at which some op went non-finite, or None."""
    _, target = load(path, seed)
    rng = np.random.default_rng(seed + 1)
    for step in range(n):
        b = target.sample(rng)
        if uniform:
            _uniform_within_bounds(target, b, rng)
        batch = to_torch(b, ())
        probe, _, _ = run(target, batch, step)
        if probe.events:
            return step
        train_step(target, batch, step)
    return None


def train_step(target, batch: dict, step_seed: int):
    if target.train_step is not None:
        torch.manual_seed(step_seed)
        target.train_step({k: v.detach() for k, v in batch.items()})
    elif target.optimizer is not None:
        torch.manual_seed(step_seed)
        target.optimizer.zero_grad()
        _loss(target.program({k: v.detach() for k, v in batch.items()})).backward()
        target.optimizer.step()


def search_site(path: str, key: tuple, steps: int, train: bool, lr_frac: float = 0.02, seed: int = 0,
                args: dict | None = None, verbose: bool = False):
    _, target = load(path, seed, **(args or {}))
    rng = np.random.default_rng(seed)
    batch = to_torch(target.sample(rng), target.search)
    leaves = [batch[k] for k in target.search]
    opt = torch.optim.Adam([{"params": [batch[k]], "lr": lr_frac * (target.bounds[k][1] - target.bounds[k][0])}
                            for k in target.search])
    best = math.inf
    for step in range(steps):
        probe, loss, _ = run(target, batch, step)
        if probe.events:
            return step, probe.events, best
        calls = [c for c in probe.calls if c.key == key]
        if calls:
            m = margin(calls[0].name, calls[0].args, calls[0].arg)
            sl = search_loss(m, calls[0].log_space, soft=True)
            hard = float(search_loss(m.detach(), calls[0].log_space))
            best = min(best, hard)
            if verbose and step % 20 == 0:
                print(f"    step {step}: margin {hard:.4g}"
                      f" loss {float(loss.detach()):.4g}")
            grads = torch.autograd.grad(sl, leaves, allow_unused=True)
        else:
            grads = [None] * len(leaves)
        if train and target.trains:      # the program's own step, on the batch just checked
            train_step(target, batch, step)
        opt.zero_grad()
        for leaf, g in zip(leaves, grads):
            leaf.grad = None if g is None else g.detach()
        opt.step()
        with torch.no_grad():
            for k in target.search:
                batch[k].clamp_(*target.bounds[k])
    return None, [], best


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--frozen", action="store_true", help="never run the program's training step")
    ap.add_argument("--n-random", type=int, default=200)
    ap.add_argument("--no-random", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--lr", type=float, default=0.02, help="step size, a fraction of the bounds' width")
    a = ap.parse_args(argv)
    _, target = load(a.path)
    rng = np.random.default_rng(0)
    batch = to_torch(target.sample(rng), target.search)
    probe, loss, _ = run(target, batch)
    print(f"{a.path}: loss {float(loss.detach()):.4g}, trains={target.trains}, bounds={target.bounds}")
    if not a.no_random:
        hs, hu, ev = random_check(target, a.n_random)
        print(f"  random: sampled {hs}/{a.n_random}, uniform {hu}/{a.n_random} trigger {ev[:3]}")
        if target.trains and not a.frozen:
            print(f"  training on {a.n_random} random batches: first trigger at step"
                  f" {train_random_check(a.path, a.n_random)} (sampled),"
                  f" {train_random_check(a.path, a.n_random, uniform=True)} (uniform)")
    seen = []
    for c in probe.calls:
        if c.key in seen:
            continue
        m = margin(c.name, c.args, c.arg)
        if m is None:
            continue
        seen.append(c.key)
        step, events, best = search_site(a.path, c.key, a.steps, train=not a.frozen, lr_frac=a.lr, verbose=a.verbose)
        print(f"  site {c.key}: start {float(search_loss(m.detach(), c.log_space)):.4g}"
              f" -> {'TRIGGER at step %d %s' % (step, events[:2]) if step is not None else 'no trigger, best %.4g' % best}")


if __name__ == "__main__":
    main()
