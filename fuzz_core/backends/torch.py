"""PyTorch backend: runs a :class:`~fuzz_core.Target` under the recorder.

The only module of fuzz_core (with torch_recorder) that imports torch.
"""
from __future__ import annotations

import json
import math
import random
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from fuzz_core.backends.base import (
    LOG_TAU, WEIGHT_PREFIX, CheckResult, Evaluation, RunnerOptions, TargetBatches, batch_size, bisect_last,
    collect_grads,
)
from fuzz_core.backends.torch_recorder import LOCATOR, Recorder, RecordingMode, any_nonfinite
from fuzz_core.catalogue import DEFAULT_CATALOGUE, Catalogue, log_floor
from fuzz_core.sites import OpSite
from fuzz_core.target import Target, TargetError


class TorchXP:
    """The array namespace that catalogue margins use, for torch tensors."""

    is_tensor = staticmethod(lambda x: isinstance(x, torch.Tensor))
    abs = staticmethod(torch.abs)
    minimum = staticmethod(torch.minimum)
    maximum = staticmethod(torch.maximum)
    where = staticmethod(torch.where)
    round = staticmethod(torch.round)
    full_like = staticmethod(torch.full_like)

    @staticmethod
    def as_float(x: Any, like: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if x.is_floating_point():
                return x
            dtype = like.dtype if isinstance(like, torch.Tensor) and like.is_floating_point() else torch.get_default_dtype()
            return x.to(dtype)
        return torch.tensor(float(x), dtype=like.dtype, device=like.device)

    @staticmethod
    def next_down(value: float, like: Any) -> float:
        return _nextafter(float(value), -math.inf, like.dtype)

    @staticmethod
    def next_up(value: float, like: Any) -> float:
        return _nextafter(float(value), math.inf, like.dtype)

    @staticmethod
    def limit(name: str, like: Any) -> float:
        return dtype_limit(name, like.dtype)

    @staticmethod
    def big(like: Any) -> float:
        return float(torch.finfo(like.dtype).max) / 4


XP = TorchXP()


@lru_cache(maxsize=None)
def _nextafter(value: float, toward: float, dtype: torch.dtype) -> float:
    return float(torch.nextafter(torch.tensor(value, dtype=dtype), torch.tensor(toward, dtype=dtype)))


@lru_cache(maxsize=None)
def dtype_limit(name: str, dtype: torch.dtype) -> float:
    """Dtype-dependent domain ends, found by bisection on the op itself."""
    if name == "exp_max":
        return _last_finite(torch.exp, 0.0, 1000.0, dtype)
    if name == "expm1_max":
        return _last_finite(torch.expm1, 0.0, 1000.0, dtype)
    if name == "digamma_radius":   # largest x > 0 where digamma(x) = -inf (-1/x overflows)
        tiny = float(torch.finfo(dtype).tiny)
        lo = _nextafter(0.0, 1.0, dtype)
        if math.isfinite(float(torch.digamma(torch.tensor(lo, dtype=dtype)))):
            return 0.0
        return _last_nonfinite(torch.digamma, lo, 1.0, dtype) if tiny else 0.0
    raise KeyError(f"unknown limit {name!r}")


def _bisect(pred, lo: float, hi: float, dtype: torch.dtype) -> float:
    return bisect_last(pred, lo, hi, lambda v: float(torch.tensor(v, dtype=dtype)),
                       lambda a, b: _nextafter(a, b, dtype))


def _last_finite(fn, lo: float, hi: float, dtype: torch.dtype) -> float:
    return _bisect(lambda v: math.isfinite(float(fn(torch.tensor(v, dtype=dtype)))), lo, hi, dtype)


def _last_nonfinite(fn, lo: float, hi: float, dtype: torch.dtype) -> float:
    return _bisect(lambda v: not math.isfinite(float(fn(torch.tensor(v, dtype=dtype)))), lo, hi, dtype)


def tiny_of(dtype: torch.dtype) -> float:
    return _nextafter(0.0, 1.0, dtype)


def _optim_prefix(i: int) -> str:
    """State keys of the i-th optimizer: ``optim.`` for the first (the one-optimizer layout of
    older checkpoints), ``optim1.``, ``optim2.``, ... for the others."""
    return "optim." if i == 0 else f"optim{i}."


def program_optimizers(target: Target) -> list[Any]:
    """The optimizers whose state belongs to the program, so that it is saved, restored and reset
    with the weights: ``Target.optimizer`` (one, or a list), and those a ``train_step`` holds in
    its closure or, for a bound method, in its object's attributes (a GAN's two Adams). Without
    them a site would start from moments another site's search left behind."""
    found: list[Any] = []

    def add(value: Any, duck: bool = False) -> None:
        ok = isinstance(value, torch.optim.Optimizer) or duck and all(
            hasattr(value, a) for a in ("zero_grad", "step", "state_dict", "load_state_dict"))
        if ok and all(value is not o for o in found):
            found.append(value)

    def add_all(value: Any, duck: bool = False) -> None:
        for v in (value.values() if isinstance(value, dict) else
                  value if isinstance(value, (list, tuple)) else (value,)):
            add(v, duck)

    def walk(fn: Any, depth: int) -> None:
        owner = getattr(fn, "__self__", None)
        if owner is not None and hasattr(owner, "__dict__"):
            for v in vars(owner).values():
                add_all(v)
        for cell in getattr(getattr(fn, "__func__", fn), "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:         # a cell not filled yet
                continue
            add_all(v)
            if depth < 3 and callable(v) and hasattr(v, "__closure__"):
                walk(v, depth + 1)

    add_all(target.optimizer, duck=True)   # named by the user: any optimizer-like object
    if target.optimizer is not None and not found:
        raise TargetError(f"Target.optimizer must be a torch optimizer (zero_grad, step, state_dict) "
                          f"or a list of them, got {type(target.optimizer).__name__}")
    if target.train_step is not None:
        walk(target.train_step, 0)
    return found


def program_loss(out: Any) -> torch.Tensor | None:
    """The loss of a program's return value: a tensor, the first of a tuple, or out["loss"]."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return out.get("loss") if isinstance(out.get("loss"), torch.Tensor) else None
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def seed_everything(seed: int) -> None:
    """Seed every generator a program may draw from (its iterative external values)."""
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))
    random.seed(seed)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class TorchRunner(TargetBatches):
    """One built PyTorch target, ready to run steps for any of its sites."""

    framework = "torch"

    def __init__(self, name: str, target: Target, options: RunnerOptions = RunnerOptions(),
                 catalogue: Catalogue = DEFAULT_CATALOGUE) -> None:
        super().__init__(name, target, options, catalogue, Target)
        if target.model is not None and not isinstance(target.model, torch.nn.Module):
            raise TargetError(f"Target.model must be a torch.nn.Module, got {type(target.model).__name__}")
        self.device = resolve_device(options.device)
        if target.model is not None:
            target.model.to(self.device)
        self._params = self._named_params()
        self._optimizers = program_optimizers(target)
        self._initial = self.get_state()

    # -- state ------------------------------------------------------------------------
    def _named_params(self) -> dict[str, torch.nn.Parameter]:
        if self.target.model is None:
            return {}
        return {n: p for n, p in self.target.model.named_parameters() if p.requires_grad}

    def weights(self) -> dict[str, np.ndarray]:
        return {WEIGHT_PREFIX + n: p.detach().cpu().numpy().copy() for n, p in self._params.items()}

    def get_state(self) -> dict[str, np.ndarray]:
        """Weights, buffers and optimizer state as flat NumPy arrays (safetensors-ready)."""
        state: dict[str, np.ndarray] = {}
        if self.target.model is not None:
            for k, v in self.target.model.state_dict().items():
                state["model." + k] = v.detach().cpu().numpy().copy()
        for i, opt in enumerate(self._optimizers):
            prefix = _optim_prefix(i)
            sd = opt.state_dict()
            meta = {"param_groups": sd["param_groups"], "scalars": {}}
            for pid, slots in sd["state"].items():
                for slot, value in slots.items():
                    if isinstance(value, torch.Tensor):
                        state[f"{prefix}{pid}.{slot}"] = value.detach().cpu().numpy().copy()
                    else:
                        meta["scalars"][f"{pid}.{slot}"] = value
            state[prefix + "__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8).copy()
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        model = self.target.model
        if model is not None:
            sd = {k[6:]: torch.from_numpy(np.array(v)) for k, v in state.items() if k.startswith("model.")}
            if sd:
                model.load_state_dict(sd, strict=False)
        for i, opt in enumerate(self._optimizers):
            prefix = _optim_prefix(i)
            if prefix + "__meta__" not in state:
                continue
            meta = json.loads(bytes(np.asarray(state[prefix + "__meta__"], dtype=np.uint8)).decode())
            slots: dict[int, dict] = {}
            for key, value in state.items():
                if key.startswith(prefix) and key != prefix + "__meta__":
                    pid, slot = key[len(prefix):].split(".", 1)
                    slots.setdefault(int(pid), {})[slot] = torch.from_numpy(np.array(value)).to(self.device)
            for key, value in meta["scalars"].items():
                pid, slot = key.split(".", 1)
                slots.setdefault(int(pid), {})[slot] = value
            opt.load_state_dict({"state": slots, "param_groups": meta["param_groups"]})

    def reset(self) -> None:
        """Back to the factory's initial state (weights, buffers, every optimizer)."""
        super().reset()
        for i, opt in enumerate(self._optimizers):
            prefix = _optim_prefix(i)
            if not any(k.startswith(prefix) and k != prefix + "__meta__" for k in self._initial):
                getattr(opt, "state", {}).clear()   # load_state_dict keeps slots it is not given

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}

    # -- batches ----------------------------------------------------------------------
    def _tensors(self, values: dict[str, np.ndarray], grad: bool) -> tuple[dict, dict]:
        batch, leaves = {}, {}
        for name, value in values.items():
            if name.startswith(WEIGHT_PREFIX):
                continue
            t = torch.as_tensor(np.ascontiguousarray(value), device=self.device)
            if grad and name in self.searched:
                t = t.clone().requires_grad_(True)
                leaves[name] = t
            batch[name] = t
        with torch.no_grad():
            for name, value in values.items():
                if name.startswith(WEIGHT_PREFIX):
                    p = self._params[name[len(WEIGHT_PREFIX):]]
                    p.copy_(torch.as_tensor(value, device=self.device, dtype=p.dtype))
                    if grad:
                        leaves[name] = p
        return batch, leaves

    # -- running ----------------------------------------------------------------------
    def _forward(self, batch: dict, seed: int, locate_all: bool):
        seed_everything(seed)
        recorder = Recorder(self.catalogue, locate_all=locate_all)
        with RecordingMode(recorder):
            out = self.target.program(batch)
        return recorder, out

    def discover(self, batch: dict[str, np.ndarray], seed: int) -> list[OpSite]:
        tensors, _ = self._tensors(batch, grad=False)
        recorder, _ = self._forward(tensors, seed, locate_all=False)
        return recorder.sites(self.name, lambda call: call.spec.margins(call.inputs, XP) is not None)

    def check(self, values: dict[str, np.ndarray], seed: int) -> CheckResult:
        """The check-only detector: run the unmodified program once, name the first bad op."""
        batch, _ = self._tensors(values, grad=False)
        with torch.no_grad():
            recorder, out = self._forward(batch, seed, locate_all=True)
            flags = recorder.resolve([any_nonfinite(out)])
        loss = program_loss(out)
        first = recorder.first_event(flags, flags[-1], LOCATOR.locate(1))
        return CheckResult(first is not None, first, recorder.triggered_sites(flags), _scalar(loss))

    def evaluate(self, values: dict[str, np.ndarray], site: OpSite, *, grad: bool = True,
                 train: bool = False, seed: int = 0) -> Evaluation:
        """One step: forward under the recorder; the site's margin, losses and gradients."""
        train = train and self.trains
        batch, leaves = self._tensors(values, grad=grad)
        with torch.set_grad_enabled(grad or train):
            recorder, out = self._forward(batch, seed, locate_all=False)
        loss = program_loss(out)
        call = recorder.find(site.key)
        margin = call.spec.margins(call.inputs, XP) if call is not None else None
        flags = recorder.resolve([any_nonfinite(out)])
        first = recorder.first_event(flags, flags[-1], site.location)
        ev = Evaluation(seen=margin is not None, hard=math.inf, log_loss=math.inf,
                        triggered=call is not None and recorder.triggered(flags, call),
                        event=first is not None, first_op=first, program_loss=_scalar(loss))
        if margin is not None:
            self._score(ev, margin, call.spec.log_space, grad and not ev.triggered, leaves,
                        retain=train, batch_size=batch_size(values))
        if train and not ev.event and loss is not None:
            self._train(batch, loss, ev, seed)
        return ev

    def _score(self, ev: Evaluation, margin: torch.Tensor, log_space: bool, grad: bool, leaves: dict,
               retain: bool, batch_size: int) -> None:
        m = margin.float() if margin.dtype in (torch.float16, torch.bfloat16) else margin
        flat = m.reshape(-1)
        hard = flat.min()
        tiny = tiny_of(m.dtype)
        log_loss = -LOG_TAU * torch.logsumexp(-torch.log(torch.clamp(flat, min=tiny)) / LOG_TAU, 0) - log_floor(tiny)
        stats = [hard.detach().reshape(1), log_loss.detach().reshape(1)]
        if m.dim() >= 1 and m.shape[0] == batch_size and batch_size > 1:
            stats.append(m.detach().reshape(batch_size, -1).min(1).values)
        stats = torch.cat([t.double() for t in stats]).cpu().numpy()
        ev.hard, ev.log_loss = float(stats[0]), float(stats[1])
        if len(stats) > 2:
            ev.per_sample = stats[2:]
        if not (grad and leaves and hard.requires_grad):
            return
        names = list(leaves)
        targets = [leaves[n] for n in names]
        keep = retain or log_space
        try:
            ev.grads, ev.grad_norm, ev.connected = _grads(hard, names, targets, keep)
            if log_space and math.isfinite(ev.log_loss):
                ev.log_grads, _, _ = _grads(log_loss, names, targets, retain)
        except RuntimeError:   # the program overwrote in place a tensor autograd saved
            ev.grads, ev.log_grads, ev.grad_norm, ev.connected = None, None, 0.0, False

    def _train(self, batch: dict, loss: torch.Tensor, ev: Evaluation, seed: int) -> None:
        """The program's own training step on the searched batch (GRIST keeps training)."""
        target = self.target
        if target.train_step is not None:
            seed_everything(seed ^ 0x5EED5EED)     # the step's own seed: the same in every process
            target.train_step({k: v.detach() for k, v in batch.items()})
            ev.passes += 1
        elif self._optimizers and loss.requires_grad:
            for opt in self._optimizers:
                opt.zero_grad(set_to_none=True)
            loss.mean().backward()
            for opt in self._optimizers:
                opt.step()
        else:
            return
        ev.trained = True
        if self.options.search_weights:
            ev.weights = self.weights()


def _grads(loss: torch.Tensor, names: list[str], targets: list[torch.Tensor],
           retain: bool) -> tuple[dict[str, np.ndarray], float, bool]:
    grads = torch.autograd.grad(loss, targets, allow_unused=True, retain_graph=retain)
    return collect_grads(names, targets, grads, lambda g: g.detach().cpu().double().numpy())


def _scalar(t: torch.Tensor | None) -> float:
    if t is None:
        return float("nan")
    return float(t.detach().float().mean())


def make_runner(name: str, target: Any, options: RunnerOptions) -> TorchRunner:
    return TorchRunner(name, target, options)
