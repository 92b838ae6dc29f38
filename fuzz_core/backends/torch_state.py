"""Everything a PyTorch program can mutate between steps, saved, restored and watched.

A site must start from the state the factory built, whatever the program's shape. The
state of a :class:`~fuzz_core.Target` is:

* ``model.<key>``: the model's parameters and buffers (its ``state_dict``, non-persistent
  buffers included);
* ``tensor.<path>``: every other tensor reachable from the program (plain tensors handed
  to an optimizer, tensors and modules captured in ``program``'s or ``train_step``'s
  closure, module-level tensors of the user's script; see :mod:`fuzz_core.reach`);
* ``optim.*``, ``optim<i>.*``: the state of every optimizer (``Target.optimizer`` and
  those found the same way), and ``obj.<path>``: learning-rate schedulers and gradient
  scalers, as JSON.

What proves that restoring this state restores the program is :class:`WriteWatch`: every
in-place write of a step is checked against the storages of the tracked tensors and of
the tensors the step itself created. A write anywhere else (a cache the program keeps
between calls, a tensor the walk could not reach) is recorded, and the engine then
builds the target afresh for each site instead of sharing one build.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from fuzz_core.reach import Slot, reachable
from fuzz_core.target import Target, TargetError

_META = "__meta__"
SNAPSHOT_LIMIT = 256 << 20   # bytes of tensors outside the model and optimizers kept for resets


_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


def host_array(t: torch.Tensor) -> np.ndarray:
    """A tensor as a NumPy array of its own, on the host. A floating dtype NumPy lacks (bfloat16,
    the float8 types) comes as float32: each of its values is exactly a float32, and a restore
    casts it back into the tensor's dtype, so the round trip is exact."""
    t = t.detach()
    if t.is_floating_point() and t.dtype not in _NUMPY_FLOATS:
        t = t.float()
    return t.cpu().numpy().copy()


def _optim_prefix(i: int) -> str:
    """State keys of the i-th optimizer: ``optim.`` for the first (the one-optimizer layout of
    older checkpoints), ``optim1.``, ``optim2.``, ... for the others."""
    return "optim." if i == 0 else f"optim{i}."


def _is_optimizer(value: Any, duck: bool = False) -> bool:
    return isinstance(value, torch.optim.Optimizer) or duck and all(
        hasattr(value, a) for a in ("zero_grad", "step", "state_dict", "load_state_dict", "param_groups"))


def _scaler_kinds() -> tuple[type, ...]:
    return tuple(k for k in (getattr(torch.amp, "GradScaler", None),
                             getattr(getattr(torch.cuda, "amp", None), "GradScaler", None)) if isinstance(k, type))


def is_grad_scaler(value: Any) -> bool:
    return isinstance(value, _scaler_kinds())


def _is_stateful(value: Any) -> bool:
    """Objects whose state a program's step changes and that say it with a state_dict."""
    lr_scheduler = getattr(torch.optim.lr_scheduler, "LRScheduler", None)
    kinds = tuple(k for k in (lr_scheduler,) if isinstance(k, type)) + _scaler_kinds()
    return isinstance(value, kinds)


def storage_of(t: torch.Tensor) -> int:
    """An id of the memory a tensor lives in (views share it); 0 when it has none."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:   # meta, sparse, some subclasses
        return 0


class TorchState:
    """The tracked state of one built target: find it, snapshot it, restore it, prove it."""

    def __init__(self, target: Target) -> None:
        self.tensors: dict[str, torch.Tensor] = {}     # the tensors as the factory built them
        self.places: dict[str, Slot] = {}              # where the program holds them, if it can rebind them
        self.optimizers: list[Any] = []
        self.objects: dict[str, Any] = {}
        ids: set[int] = set()

        def add(name: str, t: torch.Tensor, slot: Slot | None = None) -> None:
            if id(t) in ids:
                return
            ids.add(id(t))
            key, i = name, 1
            while key in self.tensors:
                key, i = f"{name}_{i}", i + 1
            self.tensors[key] = t
            if slot is not None:
                self.places[key] = slot

        model = target.model
        if model is not None:
            for k, v in model.state_dict(keep_vars=True).items():
                add("model." + k, v)
            for k, v in model.named_buffers():
                add("model." + k, v)
        for opt in _as_list(target.optimizer):
            if _is_optimizer(opt, duck=True):
                self._add_optimizer(opt)
        if target.optimizer is not None and not self.optimizers:
            raise TargetError(f"Target.optimizer must be a torch optimizer (zero_grad, step, state_dict) "
                              f"or a list of them, got {type(target.optimizer).__name__}")
        self.core: set[str] = set(self.tensors)     # the model's: always part of a snapshot
        roots = [("program", target.program), ("train_step", target.train_step)]
        for path, value, slot in reachable(roots, _is_leaf):
            if isinstance(value, torch.Tensor):
                add("tensor." + path, value, slot)
            elif isinstance(value, torch.nn.Module):
                for k, v in value.state_dict(keep_vars=True).items():
                    add(f"tensor.{path}.{k}", v)
                for k, v in value.named_buffers():
                    add(f"tensor.{path}.{k}", v)
            elif _is_optimizer(value):
                self._add_optimizer(value)
            elif _is_stateful(value) and all(value is not o for o in self.objects.values()):
                self.objects["obj." + path] = value
        for i, opt in enumerate(self.optimizers):
            for g, group in enumerate(opt.param_groups):
                for j, p in enumerate(group["params"]):
                    add(f"tensor.optim{i}.group{g}.{j}", p)
        ids_core = {id(p) for p in self.params()}
        self.core |= {k for k, t in self.tensors.items() if id(t) in ids_core or t.requires_grad}
        self._clean = self.versions()
        # autograd flags as built: a program that turns requires_grad on, or leaves a .grad behind
        # (gradients accumulate), must not hand them to the next site
        self._flags = {k: (t.requires_grad, t.grad is None) for k, t in self.tensors.items() if t.is_leaf}
        self._buffers: dict[Any, torch.Tensor] = {}     # capture()'s copies, reused step after step
        self.initial = self.get(everything=True)
        self.unrestorable: list[str] = []          # tracked tensors written that the initial snapshot lacks

    def add_object(self, name: str, obj: Any) -> None:
        """Track a stateful object the engine itself adds to the program (the GradScaler of a
        ``precision.grad_scaler`` campaign): saved, restored and reset with the rest."""
        self.objects[name] = obj
        self.initial[name] = _json_array(_plain(obj.state_dict()))

    def _add_optimizer(self, opt: Any) -> None:
        if all(opt is not o for o in self.optimizers):
            self.optimizers.append(opt)

    # -- what a step may write --------------------------------------------------------------
    def current(self) -> dict[str, torch.Tensor]:
        """Each tracked tensor as the program holds it now: where the program rebound a closure
        variable, a dict item or an attribute (``nonlocal W; W = W - lr * W.grad``), the new one."""
        if not self.places:
            return self.tensors
        out = dict(self.tensors)
        for k, slot in self.places.items():
            v = slot.get()
            if isinstance(v, torch.Tensor) and v is not out[k]:
                out[k] = v
        return out

    def _unbind(self) -> None:
        """Put the factory's tensors back where the program rebound other ones."""
        for k, slot in self.places.items():
            if slot.get() is not self.tensors[k]:
                slot.set(self.tensors[k])

    def storages(self) -> set[int]:
        """Memory of every tracked tensor, optimizer slot and parameter gradient (now)."""
        held = self.current()
        out = {storage_of(t) for t in self.tensors.values()}
        out.update(storage_of(t) for k, t in held.items() if t is not self.tensors[k])   # rebound ones
        for opt in self.optimizers:
            for slots in getattr(opt, "state", {}).values():
                out.update(storage_of(v) for v in slots.values() if isinstance(v, torch.Tensor))
        out.update(storage_of(t.grad) for t in held.values() if t.grad is not None)
        out.discard(0)
        return out

    def versions(self) -> dict[str, tuple[int, int]]:
        """Which tensor each name holds and its in-place write counter: a change of either is a
        write (in place, or a rebinding)."""
        return {k: (id(t), t._version) for k, t in self.current().items()}

    def written(self) -> list[str]:
        """Tracked tensors written (or rebound) since the last reset (or build)."""
        return list(self.changed_since(self._clean))

    def changed_since(self, before: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
        """The tensors (as held now) whose binding or write counter differs from ``before``."""
        return {k: t for k, t in self.current().items() if (id(t), t._version) != before[k]}

    def changed(self) -> bool:
        """The state is no longer the one the last reset left (a step trained, a buffer moved)."""
        return bool(self.written()) or any(getattr(opt, "state", None) for opt in self.optimizers)

    def params(self) -> list[torch.Tensor]:
        """The tensors the optimizers update."""
        return [p for opt in self.optimizers for g in opt.param_groups for p in g["params"]]

    def slots(self) -> list[torch.Tensor]:
        """The optimizers' floating-point state tensors (moments, ...), checked after an update."""
        return [v for opt in self.optimizers for slots in getattr(opt, "state", {}).values()
                for v in slots.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]

    # -- device-side snapshots of one step (a bad step is re-run from it) ------------------------
    def capture(self) -> dict[str, Any]:
        """The state the next step starts from, copied on the device (no host transfer), into
        buffers kept from one step to the next (a copy per step, no allocation). Valid until the
        next capture: a bad step's candidate materializes it at once."""
        keep = set(self.core) | set(self.written())
        pairs: list[tuple[Any, torch.Tensor]] = [(k, t.detach()) for k, t in self.current().items() if k in keep]
        snap: dict[str, Any] = {"tensors": {}, "optim": [], "objects": {}}
        for i, opt in enumerate(self.optimizers):
            sd = opt.state_dict()
            state: dict = {}
            for pid, slots in sd["state"].items():
                state[pid] = {}
                for slot, v in slots.items():
                    if isinstance(v, torch.Tensor):
                        pairs.append(((i, pid, slot), v.detach()))
                    else:
                        state[pid][slot] = v
            snap["optim"].append({"state": state, "param_groups": json.loads(json.dumps(sd["param_groups"],
                                                                                        default=repr))})
        buffers = self._buffers
        dst = []
        for key, src in pairs:
            buf = buffers.get(key)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype or buf.device != src.device:
                buf = buffers[key] = torch.empty_like(src)
            dst.append(buf)
        if dst:
            torch._foreach_copy_(dst, [src for _, src in pairs])
        for (key, _), buf in zip(pairs, dst):
            if isinstance(key, tuple):
                i, pid, slot = key
                snap["optim"][i]["state"][pid][slot] = buf
            else:
                snap["tensors"][key] = buf
        for name, obj in self.objects.items():
            snap["objects"][name] = _plain(obj.state_dict())
        return snap

    def restore(self, snap: dict[str, Any]) -> None:
        """Back to a :meth:`capture` (for a diagnosis re-run of a bad step)."""
        self._unbind()
        with torch.no_grad():
            for k, v in snap["tensors"].items():
                self.tensors[k].copy_(v)
        for opt, sd in zip(self.optimizers, snap["optim"]):
            opt.load_state_dict({"state": {pid: {s: v.clone() if isinstance(v, torch.Tensor) else v
                                                 for s, v in slots.items()} for pid, slots in sd["state"].items()},
                                 "param_groups": sd["param_groups"]})
        for name, value in snap["objects"].items():
            self.objects[name].load_state_dict(_unplain(value))

    def materialize(self, snap: dict[str, Any]) -> dict[str, np.ndarray]:
        """A :meth:`capture` in the layout of :meth:`get` (NumPy, safetensors-ready)."""
        state = {k: host_array(v) for k, v in snap["tensors"].items()}
        for i, sd in enumerate(snap["optim"]):
            prefix = _optim_prefix(i)
            meta = {"param_groups": sd["param_groups"], "scalars": {}}
            for pid, slots in sd["state"].items():
                for slot, value in slots.items():
                    if isinstance(value, torch.Tensor):
                        state[f"{prefix}{pid}.{slot}"] = host_array(value)
                    else:
                        meta["scalars"][f"{pid}.{slot}"] = value
            state[prefix + _META] = _json_array(meta)
        for name, value in snap["objects"].items():
            state[name] = _json_array(value)
        return state

    # -- snapshots ------------------------------------------------------------------------
    def get(self, everything: bool = False) -> dict[str, np.ndarray]:
        """The state as flat NumPy arrays (safetensors-ready): the model's and the optimized
        tensors, and every other tracked tensor that was written (``everything``: all of them
        up to :data:`SNAPSHOT_LIMIT` bytes, for the initial snapshot)."""
        keep = set(self.core) | set(self.written())
        if everything:
            budget = SNAPSHOT_LIMIT
            for k, t in self.tensors.items():
                size = t.numel() * t.element_size()
                if k not in keep and size <= budget:
                    keep.add(k)
                    budget -= size
        state = {k: host_array(v) for k, v in self.current().items() if k in keep}
        for i, opt in enumerate(self.optimizers):
            prefix = _optim_prefix(i)
            sd = opt.state_dict()
            meta = {"param_groups": sd["param_groups"], "scalars": {}}
            for pid, slots in sd["state"].items():
                for slot, value in slots.items():
                    if isinstance(value, torch.Tensor):
                        state[f"{prefix}{pid}.{slot}"] = host_array(value)
                    else:
                        meta["scalars"][f"{pid}.{slot}"] = value
            state[prefix + _META] = _json_array(meta)
        for name, obj in self.objects.items():
            state[name] = _json_array(_plain(obj.state_dict()))
        return state

    def set(self, state: dict[str, np.ndarray], device: torch.device) -> None:
        """Restore a :meth:`get`: values go into the factory's tensors, put back in their places."""
        self._unbind()
        with torch.no_grad():
            for k, t in self.tensors.items():
                if k in state:
                    value = torch.from_numpy(np.array(state[k]))
                    if tuple(value.shape) != tuple(t.shape):
                        t.data = value.to(device=t.device, dtype=t.dtype)
                    else:
                        t.copy_(value)
        for i, opt in enumerate(self.optimizers):
            prefix = _optim_prefix(i)
            if prefix + _META not in state:
                continue
            meta = _json_value(state[prefix + _META])
            slots: dict[int, dict] = {}
            for key, value in state.items():
                if key.startswith(prefix) and key != prefix + _META:
                    pid, slot = key[len(prefix):].split(".", 1)
                    slots.setdefault(int(pid), {})[slot] = torch.from_numpy(np.array(value)).to(device)
            for key, value in meta["scalars"].items():
                pid, slot = key.split(".", 1)
                slots.setdefault(int(pid), {})[slot] = value
            opt.load_state_dict({"state": slots, "param_groups": meta["param_groups"]})
        for name, obj in self.objects.items():
            if name in state:
                obj.load_state_dict(_json_value(state[name]))

    def reset(self, device: torch.device) -> None:
        """Back to the initial state: the written tensors, every optimizer and stateful object.
        A written tensor the initial snapshot lacks (too large to keep) is noted in
        ``unrestorable``: the engine then builds the target afresh for each site."""
        written = set(self.written())
        self.unrestorable += [k for k in written if k not in self.initial and k not in self.unrestorable]
        state = {k: v for k, v in self.initial.items() if k in written or not k.startswith(("model.", "tensor."))}
        self.set(state, device)
        initial = self.initial
        for i, opt in enumerate(self.optimizers):
            prefix = _optim_prefix(i)
            if not any(k.startswith(prefix) and k != prefix + _META for k in initial):
                getattr(opt, "state", {}).clear()   # load_state_dict keeps slots it is not given
        for k, (requires_grad, no_grad) in self._flags.items():
            t = self.tensors[k]
            if no_grad and t.grad is not None:
                t.grad = None
            if t.requires_grad != requires_grad:
                t.requires_grad_(requires_grad)
        self._clean = self.versions()



def _is_leaf(value: Any) -> bool:
    return (isinstance(value, (torch.Tensor, torch.nn.Module)) or _is_optimizer(value)
            or _is_stateful(value))


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _plain(value: Any) -> Any:
    """A state_dict as JSON-able data (tensors as lists: schedulers and scalers hold few)."""
    if isinstance(value, torch.Tensor):
        return {"__tensor__": value.detach().cpu().tolist(), "dtype": str(value.dtype).split(".")[-1]}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return repr(value)


def _unplain(value: Any) -> Any:
    if isinstance(value, dict):
        if "__tensor__" in value:
            return torch.tensor(value["__tensor__"], dtype=getattr(torch, value["dtype"]))
        return {k: _unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return value


def _json_array(value: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), dtype=np.uint8).copy()


def _json_value(array: np.ndarray) -> Any:
    return _unplain(json.loads(bytes(np.asarray(array, dtype=np.uint8)).decode()))


class WriteWatch:
    """Checks every in-place write of a step against the memory the engine can restore.

    ``allowed`` is the tracked state's memory at the start of the step plus the memory of
    everything the step created (the batch, op outputs); a write elsewhere is recorded in
    ``untracked`` as ``(op, location)``.
    """

    def __init__(self) -> None:
        self.allowed: set[int] = set()
        self.untracked: list[tuple[str, str]] = []

    def start(self, state: TorchState, created: list[torch.Tensor]) -> None:
        self.allowed = state.storages()
        self.allowed.update(storage_of(t) for t in created)

    def created(self, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            self.allowed.add(storage_of(out))
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self.allowed.add(storage_of(t))

    def wrote(self, tensors: list[torch.Tensor], op: str, location) -> None:
        for t in tensors:
            ptr = storage_of(t)
            if ptr and ptr not in self.allowed:
                self.untracked.append((op, location() if callable(location) else location))
                self.allowed.add(ptr)      # one report per tensor
