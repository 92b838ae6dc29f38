"""PyTorch backend: runs a :class:`~fuzz_core.Target` under the recorder.

The only module of fuzz_core (with torch_recorder) that imports torch.
"""
from __future__ import annotations

import json
import math
import random
from contextlib import contextmanager, nullcontext
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from fuzz_core.backends.base import (
    LOG_TAU, WEIGHT_PREFIX, CheckResult, Evaluation, RunnerOptions, TargetBatches, batch_size, bisect_last,
    collect_grads,
)
from fuzz_core.backends.base import NOT_LOCATED, OpRef
from fuzz_core.backends.torch_recorder import (
    Recorder, RecordingMode, WatchMode, any_nonfinite, nonfinite, nonfinite_of,
)
from fuzz_core.backends.torch_state import TorchState, WriteWatch, host_array, is_grad_scaler, storage_of
from fuzz_core.catalogue import DEFAULT_CATALOGUE, Catalogue, log_floor
from fuzz_core.sites import OpSite, relative_path
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
    log = staticmethod(torch.log)

    @staticmethod
    def widen(x: Any) -> Any:
        """float16/bfloat16 to float32 (differentiably); wider tensors as they are."""
        return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x

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
    if name == "log_grad_min":      # largest x > 0 whose log has an infinite gradient (1/x)
        return _last_nonfinite(torch.reciprocal, _nextafter(0.0, 1.0, dtype), 1.0, dtype)
    if name == "rsqrt_grad_min":    # largest x > 0 where rsqrt's gradient -x**-1.5 / 2 overflows
        return _last_nonfinite(lambda t: 0.5 * torch.rsqrt(t) ** 3, _nextafter(0.0, 1.0, dtype), 1.0, dtype)
    if name == "reciprocal_grad_max":   # largest x > 0 where reciprocal's gradient -(1/x)**2 overflows
        return _last_nonfinite(lambda t: torch.reciprocal(t) * torch.reciprocal(t), _nextafter(0.0, 1.0, dtype),
                               1.0, dtype)
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


def program_optimizers(target: Target) -> list[Any]:
    """The optimizers whose state belongs to the program (``Target.optimizer``, and those its
    ``program`` or ``train_step`` reaches: a GAN's two Adams), saved, restored and reset with it."""
    return TorchState(target).optimizers


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
    """Seed every generator a program may draw from (its iterative external values).

    ``torch.manual_seed`` costs ~0.27 ms a call on a machine with no GPU (it queues lazy seeds
    for CUDA and XPU with a captured stack), a few percent of a small step: seed the CPU
    generator, and the accelerators' only where they exist."""
    torch.default_generator.manual_seed(seed)
    for seed_all in _accelerator_seeders():
        seed_all(seed)
    np.random.seed(seed % (2**32))
    random.seed(seed)


@lru_cache(maxsize=1)
def _accelerator_seeders() -> tuple:
    seeders = []
    if torch.cuda.is_available():
        seeders.append(torch.cuda.manual_seed_all)
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        seeders.append(torch.xpu.manual_seed_all)
    if torch.backends.mps.is_available():
        seeders.append(torch.mps.manual_seed)
    return tuple(seeders)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}
SCALER_KEY = "obj.engine.grad_scaler"   # the engine's own GradScaler in the saved state
COLLAPSE_SKIPS = 24    # consecutive skips on one input that are a loss-scale collapse (65536 falls below 1 after 17)


class TorchRunner(TargetBatches):
    """One built PyTorch target, ready to run steps for any of its sites.

    A step is watched whole: the forward pass op by op (one device sync for every flag),
    then, when the program trains, its gradients and the state its update wrote (one more
    sync). Only a step known bad is re-run, from a device copy of the state it started
    from, with every autograd node and update op checked, to name the first op at fault.
    """

    framework = "torch"

    def __init__(self, name: str, target: Target, options: RunnerOptions = RunnerOptions(),
                 catalogue: Catalogue = DEFAULT_CATALOGUE) -> None:
        super().__init__(name, target, options, catalogue, Target)
        if target.model is not None and not isinstance(target.model, torch.nn.Module):
            raise TargetError(f"Target.model must be a torch.nn.Module, got {type(target.model).__name__}")
        self.device = resolve_device(options.device)
        if target.model is not None:
            target.model.to(self.device)
        self.state = TorchState(target)
        self._params = self._named_params()
        self.watch = WriteWatch()
        self._grad_specs = catalogue.torch_backward_specs() if self.trains else {}
        self._op_info: dict = {}    # aten overload -> what it is to the catalogue, for every step's recorder
        self._program_at = _where(target.program)
        # mixed precision (the campaign's ``precision:``): the program's forward under torch.autocast; the
        # engine's own training step through a GradScaler (a program with its own train_step runs as it is)
        precision = options.precision
        self._autocast_dtype = AUTOCAST.get(precision.autocast) if precision.autocast else None
        self.scaler = None
        if precision.grad_scaler and self.trains and target.train_step is None and self._optimizers:
            self.scaler = torch.amp.GradScaler(self.device.type)
            self.state.add_object(SCALER_KEY, self.scaler)
        self._skips = 0                 # consecutive skips of the last training step's input
        # the program's own GradScalers (an AMP loop in its train_step): check() counts their skips
        self.program_scalers = [o for k, o in self.state.objects.items()
                                if k != SCALER_KEY and is_grad_scaler(o) and o.is_enabled()] \
            if target.train_step is not None else []
        self._collapse: tuple[int, float] | None = None   # (skips, scale) when the last step collapsed the scale

    # -- state ------------------------------------------------------------------------
    def _named_params(self) -> dict[str, torch.nn.Parameter]:
        if self.target.model is None:
            return {}
        return {n: p for n, p in self.target.model.named_parameters() if p.requires_grad}

    @property
    def _optimizers(self) -> list[Any]:
        return self.state.optimizers

    def weights(self) -> dict[str, np.ndarray]:
        return {WEIGHT_PREFIX + n: host_array(p) for n, p in self._params.items()}

    def get_state(self) -> dict[str, np.ndarray]:
        """Weights, buffers, every other tensor the program holds that changed, and optimizer
        state, as flat NumPy arrays (safetensors-ready)."""
        return self.state.get()

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self.state.set(state, self.device)

    def reset(self) -> None:
        """Back to the factory's initial state (every tracked tensor, optimizer and scheduler)."""
        self.state.reset(self.device)

    def state_changed(self) -> bool:
        return self.state.changed()

    @property
    def untracked(self) -> list[str]:
        """Writes the engine cannot undo (it then builds the target afresh for each site)."""
        return ([f"in-place {op} at {loc}" for op, loc in self.watch.untracked]
                + [f"tensor {k} (too large to keep a copy of)" for k in self.state.unrestorable])

    def versions(self) -> dict[str, str]:
        return {"torch": str(torch.__version__)}   # a plain str: unpickled without torch (a Ray driver)

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
    def _autocast(self, enabled: bool = True):
        """``torch.autocast`` with the campaign's dtype around a forward pass (nothing in fp32)."""
        if self._autocast_dtype is None or not enabled:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._autocast_dtype)

    def _forward(self, batch: dict, seed: int, locate_all: bool):
        seed_everything(seed)
        self.watch.start(self.state, list(batch.values()))
        recorder = Recorder(self.catalogue, locate_all=locate_all, watch=self.watch, extra_specs=self._grad_specs,
                            info_cache=self._op_info)
        with self._autocast(), RecordingMode(recorder):
            out = self.target.program(batch)
        return recorder, out

    def measure(self, values: dict[str, np.ndarray], seed: int, key: tuple[str, str, int],
                any_dtype: bool = False) -> dict | None:
        """The output of the op of an output-range site (``half_overflow``) on these values: its
        dtype and largest magnitude, under this runner's precision. ``any_dtype``: record the row's
        ops whatever their output dtype (the float32 value of an op that overflowed in half)."""
        batch, _ = self._tensors(values, grad=False)
        recorder = Recorder(self.catalogue, locate_all=True, measure=any_dtype, info_cache=self._op_info)
        seed_everything(seed)
        with torch.no_grad(), self._autocast(), RecordingMode(recorder):
            self.target.program(batch)
        call = recorder.find(key)
        if call is None or not call.inputs or not isinstance(call.inputs[0], torch.Tensor):
            return None
        out = call.inputs[0].detach()
        value = float(out.abs().max().double()) if out.numel() else 0.0
        return {"dtype": str(out.dtype).removeprefix("torch."), "value": value,
                "limit": float(torch.finfo(out.dtype).max)}

    def discover(self, batch: dict[str, np.ndarray], seed: int) -> list[OpSite]:
        tensors, _ = self._tensors(batch, grad=False)
        recorder, _ = self._forward(tensors, seed, locate_all=False)
        return recorder.sites(self.name, lambda call: call.spec.margins(call.inputs, XP) is not None)

    def check(self, values: dict[str, np.ndarray], seed: int) -> CheckResult:
        """The check-only detector: run the unmodified program's whole step once (its training
        step too, when it trains) and name the first op that went non-finite."""
        batch, _ = self._tensors(values, grad=False)
        pre = self.state.capture() if self.trains else None
        with torch.set_grad_enabled(self.trains):
            recorder, out = self._forward(batch, seed, locate_all=True)
        flags = recorder.resolve([any_nonfinite(out)])
        loss = program_loss(out)
        first = recorder.first_event(flags, flags[-1], self._program_at)
        result = CheckResult(first is not None, first, recorder.triggered_sites(flags), _scalar(loss),
                             "forward" if first is not None else None)
        if first is None and self.trains and loss is not None:
            scales = self._program_scales()
            phase = self._train(batch, loss, seed, pre)[1]
            result.scaler_skips = self._program_skips(batch, seed, scales) if scales else self._skips
            if phase is not None:
                result.first_op, grad_key, phase = self._located(pre, values, seed, phase)
                result.event, result.phase = True, phase
                if grad_key is not None:
                    result.triggered[grad_key] = True
        return result

    def evaluate(self, values: dict[str, np.ndarray], site: OpSite, *, grad: bool = True,
                 train: bool = False, seed: int = 0, lookahead: bool = False) -> Evaluation:
        """One step: forward under the recorder; the site's margin, losses and gradients; then the
        program's own training step, watched. Any non-finite value sets ``event`` and ``phase``.
        ``lookahead``: also the inputs' gradient of the margin's change under the training step
        (``Evaluation.train_grads``; only when the program trains its parameters on its loss)."""
        train = train and self.trains
        batch, leaves = self._tensors(values, grad=grad)
        pre = self.state.capture() if (train or self.state.changed()) else None
        with torch.set_grad_enabled(grad or train):
            recorder, out = self._forward(batch, seed, locate_all=False)
        loss = program_loss(out)
        call = recorder.find(site.key)
        with torch.set_grad_enabled(grad or train):
            margin = call.spec.margins(call.inputs, XP) if call is not None else None
        flags = recorder.resolve([any_nonfinite(out)])
        first = recorder.first_event(flags, flags[-1], self._program_at)
        ev = Evaluation(seen=margin is not None, hard=math.inf, log_loss=math.inf,
                        triggered=call is not None and recorder.triggered(flags, call),
                        event=first is not None, first_op=first, program_loss=_scalar(loss),
                        phase="forward" if first is not None else None)
        if first is not None:
            ev.origins = recorder.origins(flags, flags[-1], self._program_at)
        if margin is not None:
            ahead = loss if lookahead and train and grad and not ev.event else None
            # another op's non-finite value leaves the site's own gradient: a search may step past it
            self._score(ev, margin, call.spec.log_space, grad and not ev.triggered, leaves,
                        retain=train, batch_size=batch_size(values), lookahead=ahead)
        if train and not ev.event and loss is not None:
            ev.trained, ev.phase = self._train(batch, loss, seed, pre)
            ev.passes += int(self.target.train_step is not None)
            ev.scaler_skips = self._skips
            if ev.phase is not None:
                ev.event = True
                ev.first_op, grad_key, ev.phase = self._located(pre, values, seed, ev.phase)
                ev.triggered = grad_key == site.key
            elif ev.trained and self.options.search_weights:
                ev.weights = self.weights()
        if ev.event and pre is not None:
            ev.state_before = self.state.materialize(pre)
        return ev

    def _score(self, ev: Evaluation, margin: torch.Tensor, log_space: bool, grad: bool, leaves: dict,
               retain: bool, batch_size: int, lookahead: torch.Tensor | None = None) -> None:
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
        if torch.is_grad_enabled() and not hard.requires_grad:
            ev.movable = False         # no searched value and no trained weight reaches the margin
        if not (grad and leaves and hard.requires_grad):
            return
        names = list(leaves)
        targets = [leaves[n] for n in names]
        ahead = lookahead is not None
        keep = retain or log_space or ahead
        # the lookahead follows the hard minimum (in log space for log-space ops): a soft minimum
        # spreads its weight over near-ties, whose pulls on the weights cancel out
        followed = torch.log(torch.clamp(hard, min=tiny)) if log_space else hard
        try:
            ev.grads, ev.grad_norm, ev.connected = _grads(hard, names, targets, keep)
            if log_space and math.isfinite(ev.log_loss):
                ev.log_grads, _, _ = _grads(log_loss, names, targets, retain or ahead)
        except RuntimeError:   # the program overwrote in place a tensor autograd saved
            ev.grads, ev.log_grads, ev.grad_norm, ev.connected = None, None, 0.0, False
            return
        if ahead:
            try:
                ev.train_grads = self._lookahead(followed, lookahead, names, targets, retain)
            except RuntimeError:   # an op without a double backward, or a tensor overwritten in place
                ev.train_grads = None

    def _lookahead(self, margin: torch.Tensor, loss: torch.Tensor, names: list[str],
                   targets: list[torch.Tensor], retain: bool) -> dict[str, np.ndarray] | None:
        """The inputs' gradient of ``-<dL/dtheta, dm/dtheta>`` over the parameters theta that the
        program's optimizers update: one gradient step of its loss ``L`` on this batch changes the
        margin ``m`` by ``-lr <dL/dtheta, dm/dtheta>`` to first order, so descending this gradient
        makes the program's own training carry the margin toward the edge (a bug that training
        reaches: the weights must grow before any input in the box can cross). ``dm/dtheta`` is
        held fixed; a double backward through ``dL/dtheta`` gives the rest. None when nothing the
        optimizers update reaches the margin, or an op has no double backward."""
        params = [p for p in self.state.params() if p.requires_grad]
        inputs = [(n, t) for n, t in zip(names, targets) if not n.startswith(WEIGHT_PREFIX)]
        if not params or not inputs or not loss.requires_grad:
            return None
        toward = torch.autograd.grad(margin, params, retain_graph=True, allow_unused=True)
        pairs = [(p, v.detach()) for p, v in zip(params, toward) if v is not None]
        if not pairs:
            return None
        dl = torch.autograd.grad(loss.float().mean(), [p for p, _ in pairs], create_graph=True,
                                 retain_graph=True, allow_unused=True)
        terms = [(g * v).sum() for g, (_, v) in zip(dl, pairs) if g is not None and g.requires_grad]
        if not terms:
            return None
        grads = torch.autograd.grad(-torch.stack(terms).sum(), [t for _, t in inputs],
                                    allow_unused=True, retain_graph=retain)
        out, _, connected = collect_grads([n for n, _ in inputs], [tuple(t.shape) for _, t in inputs], list(grads),
                                          lambda g: g.detach().cpu().double().numpy())
        return out if connected else None

    def _train(self, batch: dict, loss: torch.Tensor, seed: int,
               pre: dict | None = None) -> tuple[bool, str | None]:
        """The program's own training step on the searched batch (GRIST keeps training), then one
        sync: (trained, None), or the phase whose values went non-finite (backward: a gradient;
        update: a tensor the step wrote, or an optimizer slot). A tensor that already held inf
        before the step (a mask buffer) is not the update's doing."""
        target = self.target
        before = self.state.versions()
        self._skips, self._collapse = 0, None
        if target.train_step is not None:
            seed_everything(seed ^ 0x5EED5EED)     # the step's own seed: the same in every process
            self.watch.start(self.state, list(batch.values()))
            with WatchMode(self.watch):
                target.train_step({k: v.detach() for k, v in batch.items()})
        elif self._optimizers and loss.requires_grad:
            for opt in self._optimizers:
                opt.zero_grad(set_to_none=True)
            if self.scaler is not None:
                if self._scaled_step(loss):
                    return True, "update"
            else:
                loss.mean().backward()
                for opt in self._optimizers:
                    opt.step()
        else:
            return False, None
        written = {k: t for k, t in self.state.changed_since(before).items() if t.is_floating_point()}
        grads = [t.grad for t in self.state.current().values() if t.grad is not None and t.grad.is_floating_point()]
        slots = self.state.slots()
        watched = grads + list(written.values()) + slots
        if not bool(_maybe_nonfinite(watched)) or not bool(nonfinite(watched)):   # one sync for a good step
            return True, None
        if bool(nonfinite(grads)):
            return True, "backward"
        return True, "update" if pre is None or self._newly_nonfinite(written, slots, pre) else None

    def _scaled_step(self, loss: torch.Tensor) -> bool:
        """The training step through the engine's GradScaler, as a mixed-precision loop runs it:
        ``scale(loss).backward()``, ``step``, ``update``. A step the scaler skips (inf or NaN in the
        scaled gradients: the scale halves) is its job, not a finding: the same input is tried
        again at the smaller scale, and the consecutive skips it causes are counted. True when the
        scale collapsed (below 1, or :data:`COLLAPSE_SKIPS` skips): a gradient that overflows
        whatever the scale, a finding of phase ``update``."""
        scaler, loss = self.scaler, loss.mean()
        while True:
            before = scaler.get_scale()
            scaler.scale(loss).backward(retain_graph=True)
            for opt in self._optimizers:
                scaler.step(opt)
            scaler.update()
            after = scaler.get_scale()
            if not after < before:
                return False
            self._skips += 1
            if after < 1.0 or self._skips >= COLLAPSE_SKIPS:
                self._collapse = (self._skips, after)
                return True
            for opt in self._optimizers:
                opt.zero_grad(set_to_none=True)

    def _program_scales(self) -> list[float]:
        return [scaler.get_scale() for scaler in self.program_scalers]

    def _program_skips(self, batch: dict, seed: int, before: list[float]) -> int:
        """Consecutive steps the program's own GradScaler skips on this batch: a step that lowered a
        scale is a skip, and the program's step is run again on the same batch (its next step in a
        loop that meets the batch again) until no scale falls, or :data:`COLLAPSE_SKIPS` are counted.
        Unlike the engine's own scaler the count goes on below a scale of 1 (the program's loop, not
        the engine, decides what happens there): all the skips the batch causes. The program's code
        runs as written; only the scalers' scales are read. The state the repeats leave is the
        caller's to restore (a bad step's diagnosis restores the state it started from)."""
        skips, after = 0, self._program_scales()
        while skips < COLLAPSE_SKIPS and any(a < b for a, b in zip(after, before)):
            skips += 1
            before = after
            seed_everything(seed ^ 0x5EED5EED)
            self.target.train_step({k: v.detach() for k, v in batch.items()})
            after = self._program_scales()
        return skips

    @contextmanager
    def float32(self):
        """Every ``torch.autocast`` region entered inside runs disabled, the program's own included
        (an AMP loop written with ``torch.autocast(..., enabled=True)``): the float32 program, for
        the re-check of a mixed-precision finding. ``torch.autocast`` enables itself through
        ``torch.set_autocast_enabled``, which is wrapped for the duration to enable nothing; a
        GradScaler of the program still scales, float32 gradients that do not overflow."""
        original = torch.set_autocast_enabled

        def disabled(*args):
            return original(*args[:-1], False)

        torch.set_autocast_enabled = disabled
        try:
            yield
        finally:
            torch.set_autocast_enabled = original

    def _located(self, pre: dict | None, values: dict[str, np.ndarray], seed: int,
                 phase: str) -> tuple[OpRef | None, tuple[str, str, int] | None, str]:
        """The op a bad training step names: the loss-scale collapse itself, else :meth:`_diagnose`."""
        if self._collapse is not None:
            return OpRef("loss_scale", "GradScaler: loss-scale collapse", self._program_at, 0, nan=False), None, \
                "update"
        return self._diagnose(pre, values, seed, phase)

    def _newly_nonfinite(self, written: dict[str, torch.Tensor], slots: list[torch.Tensor], pre: dict) -> bool:
        """Did the step make a value non-finite (not one that held inf before it, a mask)?"""
        if bool(nonfinite(slots)):
            return True
        for k, t in written.items():
            if bool(nonfinite([t])):
                old = pre["tensors"].get(k)
                if old is None or not bool(nonfinite([old])) or not torch.equal(
                        torch.isfinite(old), torch.isfinite(t.detach())):
                    return True
        return False

    def _diagnose(self, pre: dict | None, values: dict[str, np.ndarray], seed: int,
                  phase: str) -> tuple[OpRef | None, tuple[str, str, int] | None, str]:
        """Re-run a bad step from the state it started from, every autograd node hooked and every
        in-place write into the program's state checked: the first op at fault (in whichever phase:
        ``phase`` is only what the cheap check saw), and the key of the backward-hazard site it
        belongs to."""
        if pre is not None:
            self.state.restore(pre)
        batch, _ = self._tensors(values, grad=False)
        state = self.state

        def is_state(t: torch.Tensor) -> bool:
            return (t.is_leaf and t.requires_grad) or storage_of(t) in state.storages()

        recorder = Recorder(self.catalogue, locate_all=True, diagnose=True, extra_specs=self._grad_specs,
                            is_state=is_state, info_cache=self._op_info)
        seed_everything(seed)
        with torch.enable_grad(), RecordingMode(recorder):
            with self._autocast():
                out = self.target.program(batch)
            loss = program_loss(out)
            recorder.attach_hooks()
            if self.target.train_step is not None:
                seed_everything(seed ^ 0x5EED5EED)
                self.target.train_step({k: v.detach() for k, v in batch.items()})
            elif loss is not None and loss.requires_grad:
                for opt in self._optimizers:
                    opt.zero_grad(set_to_none=True)
                loss.mean().backward()
                for opt in self._optimizers:
                    opt.step()
        program = self._program_at
        problem = recorder.first_problem(any_nonfinite(out), program)
        if problem is None:
            return OpRef(phase, phase, f"{NOT_LOCATED}: replay names it>", 0), None, phase
        found, what = problem
        if found == "forward":                  # inside a train_step's own forward pass
            return what, None, found
        if found == "backward":
            op, kind, location, occurrence, grad_name = what
            key = (grad_name, location, occurrence) if grad_name else None
            return OpRef(op, f"{kind} (backward)", location, occurrence), key, found
        kind, location = what
        if self.target.train_step is None:      # the engine stepped the optimizer: name the program
            location = program
        opt = type(self._optimizers[0]).__name__ if self._optimizers else "train_step"
        return OpRef("update", f"{opt}: {kind}", location, 0), None, found


def _where(fn: Any) -> str:
    """``path:line`` of a function's definition (repo-relative), for what has no call site of its own."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return f"{relative_path(code.co_filename)}:{code.co_firstlineno}" if code is not None else "<program>"


def _maybe_nonfinite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A 0-dim bool on the device that is true whenever some tensor holds inf or NaN, from each
    tensor's sum (a sum over inf or NaN is never finite; +inf and -inf together make NaN). It is
    also true when finite values sum past the dtype's range, so only ``False`` is conclusive:
    :func:`nonfinite` settles a ``True``. A sum reads memory once with no comparison: 2.3x
    cheaper than ``aminmax`` over a Transformer's gradients and weights."""
    return nonfinite_of([t.detach().sum(dtype=torch.float32 if t.element_size() < 4 else None)
                         for t in tensors if t.numel()])


def _grads(loss: torch.Tensor, names: list[str], targets: list[torch.Tensor],
           retain: bool) -> tuple[dict[str, np.ndarray], float, bool]:
    grads = torch.autograd.grad(loss, targets, allow_unused=True, retain_graph=retain)
    return collect_grads(names, [tuple(t.shape) for t in targets], grads, lambda g: g.detach().cpu().double().numpy())


def _scalar(t: torch.Tensor | None) -> float:
    if t is None:
        return float("nan")
    return float(t.detach().float().mean())


def make_runner(name: str, target: Any, options: RunnerOptions) -> TorchRunner:
    return TorchRunner(name, target, options)
