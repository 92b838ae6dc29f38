"""TensorFlow backend, TF1-style graph programs: :class:`GraphRunner`.

:class:`GraphRunner` runs a :class:`~fuzz_core.GraphTarget`: sites are the catalogued
ops among the forward ancestors of ``loss`` (recursing into ``If``/``While`` branch
graphs), gradients come from ``tf.gradients`` w.r.t. the fed placeholders, per-op
non-finite flags are fetched in the same ``session.run``, and training runs the
program's own ``train_op`` (a pass of its own: it counts as a step, like ``train_step``).
An op inside a branch graph is measured on a copy of its branch imported into the
outer graph and fed by the control-flow op's real inputs; a ``While`` body's ops are
measured at the first iteration only (later iterations still show up as non-finite
outputs of the ``While`` op). Stateful graph random ops (``RandomUniform``: ``tf.nn.dropout``'s
mask; ``RandomStandardNormal``, ``TruncatedNormal``, ``RandomUniformInt``: noise) keep their state
in the session, so a fresh session draws other values than the search saw at step N and a
finding would not replay: the runner draws their values itself, from the step's seed, and feeds
them in place of the ops' outputs (TF1 lets any tensor be fed), in every pass of the program
(the forward pass and the training step, each its own draw, as the program's own runs are). So
a program's dropout and noise are iterative external values, seeded per step as torch's are.
Random ops inside ``If``/``While`` branch graphs and other kinds (``Multinomial``, shuffles) are
left to the session.

It snapshots and restores every global and local variable of the graph (optimizer slots
and counters included). A training step is watched whole: after the program's ``train_op``
every variable is checked (one fetch); a step that wrote a non-finite value is re-run from
the state it started from, with every op of the loss's gradient graph checked, to name the
first op whose gradient went non-finite (mapped back to the forward op and user line that
created it) or, when every gradient stayed finite, the update. Built by :func:`fuzz_core.backends.tensorflow.make_runner`; like
the rest of the TensorFlow backend, never imported by the driver.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from fuzz_core.backends.base import (
    NOT_LOCATED, WEIGHT_PREFIX, CheckResult, Evaluation, OpRef, RunnerOptions, TargetBatches, batch_size,
)
from fuzz_core.backends.tf_common import (
    Fp32Twin, _collect, _scalar, _shaped, _soft_min, _unique, _var_name, _versions, _warn_unknown, alignment,
    followed_margin, seed_everything,
)
from fuzz_core.backends.tf_recorder import (
    ALWAYS_OK, CALL_TYPES, IF_TYPES, NOT_SEARCHED, PASS_THROUGH, WHILE_TYPES, XP, Call, FlagBook, GraphOp,
    branch_graphs, graph_flag, traceback_location, walk,
)
from fuzz_core.catalogue import DEFAULT_CATALOGUE, Catalogue
from fuzz_core.sites import OpSite
from fuzz_core.target import GraphTarget, TargetError

_SOURCES = ("Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "Variable")


def _named(variables: list, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variables:
        name = prefix + _var_name(v)
        key, i = name, 1
        while key in out:
            key, i = f"{name}_{i}", i + 1
        out[key] = v
    return out



class GraphRunner(Fp32Twin, TargetBatches):
    """One built TF1-style graph target (graph, session, placeholders, loss, train_op)."""

    framework = "tensorflow"

    def __init__(self, name: str, target: GraphTarget, options: RunnerOptions = RunnerOptions(),
                 catalogue: Catalogue = DEFAULT_CATALOGUE) -> None:
        super().__init__(name, target, options, catalogue, GraphTarget)
        self.device = options.device
        self.graph = target.graph
        self.session = target.session
        self.loss = self._as_tensor(target.loss, "loss")
        self.feeds = dict(target.feeds)
        with self.graph.as_default():
            v1 = tf.compat.v1
            variables = (self.graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)
                         + self.graph.get_collection(v1.GraphKeys.LOCAL_VARIABLES))
            trainable = self.graph.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES)
        self._vars = _named(_unique(variables), "graph.")
        self._trainable = _unique(trainable)
        self._params = {_var_name(v): v for v in self._trainable}
        self._assign: dict[str, tuple[Any, Any]] = {}
        self._book: FlagBook | None = None
        self._watch: Any = None                 # a scalar bool op: some variable is not finite
        self._diag: tuple | None = None         # gradient-graph ops of the loss and their flags
        self._site_cache: dict[tuple, Any] = {}
        self._margins: dict[tuple, tuple] = {}      # site key -> (hard, log_loss, log_space) tensors
        self._ahead: dict[tuple, list | None] = {}  # site key -> its lookahead gradients (built on demand)
        self._copies: dict[tuple, str] = {}
        self._copy_count = 0
        self._random: list | None = None        # the program's stateful random ops, fed by the runner
        self._initial = self.get_state()

    def _as_tensor(self, value, what: str):
        if isinstance(value, (list, tuple)):
            value = value[0]
        if not tf.is_tensor(value) or getattr(value, "graph", None) is not self.graph:
            raise TargetError(f"GraphTarget.{what} must be a tensor of GraphTarget.graph")
        return value

    # -- variables ----------------------------------------------------------------------
    def _unfinalize(self) -> None:
        if self.graph.finalized:
            self.graph._unsafe_unfinalize()  # noqa: SLF001 - our check ops live beside the program's

    def weights(self) -> dict[str, np.ndarray]:
        if not self._params:
            return {}
        names = list(self._params)
        values = self.session.run([self._params[n] for n in names])
        return {WEIGHT_PREFIX + n: np.array(v) for n, v in zip(names, values)}

    def get_state(self) -> dict[str, np.ndarray]:
        """Every global and local variable of the graph (optimizer slots and counters included)."""
        if not self._vars:
            return {}
        keys = list(self._vars)
        values = self.session.run([self._vars[k] for k in keys])
        return {k: np.array(v) for k, v in zip(keys, values)}

    def _assign_ops(self, items: list[tuple[str, Any]]):
        ops = []
        for key, var in items:
            hit = self._assign.get(key)
            if hit is None:
                self._unfinalize()
                with self.graph.as_default(), tf.name_scope("cdeepfuzz/assign"):
                    ph = tf.compat.v1.placeholder(var.dtype.base_dtype, shape=var.shape)
                    hit = self._assign[key] = (ph, tf.compat.v1.assign(var, ph).op)
            ops.append(hit[1])
        return ops

    def _load(self, items: list[tuple[str, Any, np.ndarray]]) -> None:
        if not items:
            return
        ops = self._assign_ops([(k, v) for k, v, _ in items])
        feed = {self._assign[k][0]: _shaped(val, v) for k, v, val in items}
        self.session.run(ops, feed_dict=feed)

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        _warn_unknown(state, self._vars.keys(), ("graph.",))
        self._load([(k, v, state[k]) for k, v in self._vars.items() if k in state])

    def versions(self) -> dict[str, str]:
        return _versions()

    # -- batches ------------------------------------------------------------------------
    def _feed(self, values: dict[str, np.ndarray]) -> dict:
        weights = []
        for key, value in values.items():
            if key.startswith(WEIGHT_PREFIX):
                name = key[len(WEIGHT_PREFIX):]          # a _params key: the variable's name
                weights.append(("graph." + name, self._params[name], value))
        if weights:
            self._load(weights)
        return {self.feeds[k]: v for k, v in values.items() if k in self.feeds}

    # -- instrumentation (built once, in the program's graph) ---------------------------
    def _copy_of(self, gop: GraphOp, anchor=None):
        """(inputs, outputs, seen) of an op inside branch graphs, from copies fed by the real inputs
        (those of ``anchor``, a copy of the outermost control-flow op, when given)."""
        seen = None
        copied = None      # the copy (in the outer graph) of the next op down the path
        for depth, (cf, role) in enumerate(gop.path):
            real = (cf if anchor is None else anchor) if depth == 0 else copied
            inputs = list(real.inputs)
            if cf.type in IF_TYPES:
                pred = tf.cast(inputs[0], tf.bool)
                level_seen = pred if role == "then" else tf.logical_not(pred)
                branch_inputs = inputs[1:]
            else:                              # a While: the first iteration of its body; a call
                level_seen = None
                branch_inputs = inputs
            seen = level_seen if seen is None else (seen if level_seen is None else tf.logical_and(seen, level_seen))
            fg = dict(branch_graphs(cf))[role]
            if len(fg.inputs) != len(branch_inputs):
                return None
            prefix = self._import(fg, branch_inputs)
            inner = gop.path[depth + 1][0] if depth + 1 < len(gop.path) else gop.op
            copied = self.graph.get_operation_by_name(f"{prefix}/{inner.name}")
        return list(copied.inputs), list(copied.outputs), seen

    def _import(self, fg, inputs: list) -> str:
        key = (id(fg), tuple(t.name for t in inputs))
        prefix = self._copies.get(key)
        if prefix is None:
            prefix = f"cdeepfuzz/copy{self._copy_count}"
            self._copy_count += 1
            input_map = {ph.name: t for ph, t in zip(fg.inputs, inputs)}
            tf.graph_util.import_graph_def(fg.as_graph_def(), input_map=input_map, name=prefix + "/")
            self._copies[key] = prefix
        return prefix

    def _instrument(self) -> FlagBook:
        if self._book is not None:
            return self._book
        self._unfinalize()
        book = FlagBook()
        counts: dict[tuple[str, str], int] = {}
        with self.graph.as_default(), tf.compat.v1.name_scope("cdeepfuzz/checks/"):
            for gop in walk(self.graph, [self.loss]):
                op = gop.op
                spec = self.catalogue.for_tf(op.type)
                if spec is not None and not any(t.dtype.is_floating for t in op.outputs):
                    spec = None            # integer arithmetic cannot go non-finite
                if spec is None:
                    if gop.path or op.type in PASS_THROUGH:
                        continue
                    flag = graph_flag(op.outputs, nan_only=True)
                    if flag is not None:
                        book.push(flag, (f"{op.type}:{op.name}", traceback_location(op), -1))
                    continue
                location = traceback_location(op)
                occurrence = counts.get((spec.name, location), 0)
                counts[(spec.name, location)] = occurrence + 1
                if gop.path:
                    copied = self._copy_of(gop)
                    if copied is None:
                        continue
                    inputs, outputs, seen = copied
                    name = "/".join([cf.name for cf, _ in gop.path] + [op.name])
                else:
                    inputs, outputs, seen, name = list(op.inputs), list(op.outputs), None, op.name
                kind = f"{op.type}:{name}"
                index = len(book.calls)
                in_ok = NOT_SEARCHED
                if spec.searched:
                    ok = graph_flag(inputs, nan_only=False, negate=True)
                    in_ok = book.push(ok) if ok is not None else ALWAYS_OK
                    bad = graph_flag(outputs, nan_only=False)
                    bad = tf.constant(False) if bad is None else bad
                    flag = book.push(bad if seen is None else tf.logical_and(seen, bad), (kind, location, index))
                else:
                    bad = graph_flag(outputs, nan_only=True)
                    flag = -1 if bad is None else book.push(bad if seen is None else tf.logical_and(seen, bad),
                                                            (kind, location, index))
                book.calls.append(Call(spec, kind, location, occurrence, [_static(t) for t in inputs], flag, in_ok,
                                       True if seen is None else seen, outputs, origin=gop))
                grad_spec = self.catalogue.for_tf_backward(op.type) if self.trains else None
                if grad_spec is not None and not gop.path:   # a backward hazard of the same op, same inputs
                    gocc = counts.get((grad_spec.name, location), 0)
                    counts[(grad_spec.name, location)] = gocc + 1
                    book.calls.append(Call(grad_spec, kind, location, gocc, [_static(t) for t in inputs], -1, in_ok,
                                           True, outputs, origin=gop))
            self._flags = tf.stack([tf.reshape(f, []) for f in book.flags]) if book.flags else tf.zeros([0], tf.bool)
            self._outputs_bad = graph_flag([self.loss], nan_only=False)
            if self._outputs_bad is None:
                self._outputs_bad = tf.constant(False)
        self._book = book
        return book

    def _site_fetches(self, site: OpSite) -> dict | None:
        key = site.key
        if key in self._site_cache:
            return self._site_cache[key]
        call = self._instrument().find(key)
        return self._site_fetches_for(call) if call is not None else None

    def _site_fetches_for(self, call: Call) -> dict | None:
        key = call.key
        if key not in self._site_cache:
            fetches = None
            with self.graph.as_default(), tf.compat.v1.name_scope("cdeepfuzz/site/"):
                inputs, seen = self._differentiable_inputs(call)
                margin = call.spec.margins(inputs, XP) if inputs is not None else None
                if margin is not None:
                    fetches = self._margin_fetches(call, tf.convert_to_tensor(margin), seen)
            self._site_cache[key] = fetches
        return self._site_cache[key]

    def _differentiable_inputs(self, call: Call):
        """The call's inputs, as tensors ``tf.gradients`` can go through.

        A session cannot run a control-flow op (If, While) rewritten after it first ran it,
        and differentiating through one rewrites it (to output its intermediates). When
        the path from the feeds to a site crosses one, the site is measured on a fresh copy
        of the forward graph (reading the same variables, fed by the same placeholders).
        """
        gop = call.origin
        if gop is None:
            return call.inputs, call.seen
        anchor = gop.path[0][0] if gop.path else gop.op
        if not self._crosses_control_flow(anchor):
            return call.inputs, call.seen
        prefix = self._new_view()
        copy = self.graph.get_operation_by_name(f"{prefix}/{anchor.name}")
        if not gop.path:
            return [_static(t) for t in copy.inputs], True
        copied = self._copy_of(gop, anchor=copy)
        if copied is None:
            return None, False
        inputs, _, seen = copied
        return [_static(t) for t in inputs], True if seen is None else seen

    def _crosses_control_flow(self, op) -> bool:
        seen, stack = set(), [t.op for t in op.inputs]
        while stack:
            o = stack.pop()
            if o in seen:
                continue
            seen.add(o)
            if o.type in IF_TYPES + WHILE_TYPES + CALL_TYPES + ("Case", "StatelessCase"):
                return True
            stack.extend(t.op for t in o.inputs)
        return False

    def _new_view(self) -> str:
        """Import a copy of the forward graph (sources mapped to the program's own placeholders
        and variables); returns its name prefix."""
        from tensorflow.core.framework import graph_pb2

        ops = _ancestors([self.loss.op])     # all of them: a While may read gradient accumulators
        keep = {op.name for op in ops}
        full = self.graph.as_graph_def()
        sub = graph_pb2.GraphDef()
        sub.versions.CopyFrom(full.versions)
        sub.library.CopyFrom(full.library)
        sub.node.extend(n for n in full.node if n.name in keep)
        input_map = {t.name: t for op in ops if op.type in _SOURCES for t in op.outputs}
        prefix = f"cdeepfuzz/view{self._copy_count}"
        self._copy_count += 1
        tf.graph_util.import_graph_def(sub, input_map=input_map, name=prefix + "/")
        return prefix

    def _margin_fetches(self, call: Call, m, seen) -> dict:
        m, hard, log_loss = _soft_min(m)
        self._margins[call.key] = (hard, log_loss, call.spec.log_space)
        out = {"hard": tf.cast(hard, tf.float64), "log_loss": tf.cast(log_loss, tf.float64),
               "seen": tf.convert_to_tensor(seen)}
        if m.shape.rank is not None and m.shape.rank >= 1:
            out["rows"] = tf.cast(tf.reduce_min(tf.reshape(m, tf.stack([tf.shape(m)[0], -1])), axis=1), tf.float64)
        names, targets = self._leaf_targets()
        others = [v for v in self._trainable if not any(v is t for t in targets)]
        grads = tf.gradients(hard, targets + others) if targets else []
        out["requires_grad"] = any(g is not None for g in grads)
        out["grads"] = [None if g is None else tf.convert_to_tensor(g) for g in grads[: len(targets)]]
        if call.spec.log_space and targets:
            out["log_grads"] = [None if g is None else tf.convert_to_tensor(g)
                                for g in tf.gradients(log_loss, targets)]
        return out

    def _lookahead_fetches(self, key: tuple) -> list | None:
        """The placeholders' gradient of ``-<dL/dtheta, dm/dtheta>`` over the trainable variables
        (see :meth:`fuzz_core.backends.torch.TorchRunner._lookahead`), ``dm/dtheta`` held fixed by
        ``stop_gradient``: one fetch beside the margin's own. Built the first time a site asks; None
        when no trainable variable reaches both, or an op of the loss's gradient has no gradient."""
        if key in self._ahead:
            return self._ahead[key]
        fetches = None
        hard, log_loss, log_space = self._margins[key]
        names = [n for n in self.searched if n in self.feeds]
        with self.graph.as_default(), tf.compat.v1.name_scope("cdeepfuzz/ahead/"):
            self._unfinalize()
            try:
                toward = tf.gradients(followed_margin(hard, log_space), self._trainable)
                pairs = [(v, tf.stop_gradient(g)) for v, g in zip(self._trainable, toward) if g is not None]
                dl = tf.gradients(self.loss, [v for v, _ in pairs]) if pairs else []
                aligned = alignment(dl, [t for _, t in pairs])
                if aligned is not None and names:
                    grads = tf.gradients(-aligned, [self.feeds[n] for n in names])
                    if any(g is not None for g in grads):
                        fetches = [None if g is None else tf.convert_to_tensor(g) for g in grads]
            except (LookupError, ValueError, TypeError):   # an op without a second-order gradient
                fetches = None
        self._ahead[key] = fetches
        return fetches

    def _leaf_targets(self) -> tuple[list[str], list]:
        names = [n for n in self.searched if n in self.feeds]
        targets = [self.feeds[n] for n in names]
        if self.options.search_weights:
            for n, v in self._params.items():
                names.append(WEIGHT_PREFIX + n)
                targets.append(v)
        return names, targets

    # -- running ------------------------------------------------------------------------
    def discover(self, batch: dict[str, np.ndarray], seed: int) -> list[OpSite]:
        book = self._instrument()
        seed_everything(seed)
        feed = self._feed(batch)
        self.session.run(self.loss, feed_dict=self._with_random(feed, seed))   # the program runs as given
        return book.sites(self.name, lambda call: self._site_fetches_for(call) is not None)

    def check(self, values: dict[str, np.ndarray], seed: int) -> CheckResult:
        book = self._instrument()
        seed_everything(seed)
        feed = self._feed(values)
        loss, flags, out_bad = self.session.run([self.loss, self._flags, self._outputs_bad],
                                                feed_dict=self._with_random(feed, seed))
        flags = [bool(f) for f in flags] + [bool(out_bad)]
        first = book.first_event(flags, flags[-1], traceback_location(self.loss.op))
        result = CheckResult(first is not None, first, book.triggered_sites(flags), _scalar(loss),
                             "forward" if first is not None else None)
        if first is None and self.trains:
            pre = self.get_state()
            feed = self._with_random(feed, seed, TRAIN_DRAW)
            if self._train(feed):
                result.first_op, result.phase, grad_key = self._diagnose(pre, feed)
                result.event = True
                if grad_key is not None:
                    result.triggered[grad_key] = True
        return result

    def evaluate(self, values: dict[str, np.ndarray], site: OpSite, *, grad: bool = True,
                 train: bool = False, seed: int = 0, lookahead: bool = False) -> Evaluation:
        train = train and self.trains
        book = self._instrument()
        site_fetches = self._site_fetches(site)
        seed_everything(seed)
        feed = self._feed(values)
        fetches: dict[str, Any] = {"loss": self.loss, "flags": self._flags, "out_bad": self._outputs_bad}
        if site_fetches is not None:
            fetches["site"] = {k: v for k, v in site_fetches.items()
                               if k not in ("grads", "log_grads", "requires_grad")}
            names, targets = self._leaf_targets()
            want_grads = grad and site_fetches["requires_grad"] and bool(targets)
            if want_grads:
                fetches["grads"] = [g for g in site_fetches["grads"] if g is not None]
                if "log_grads" in site_fetches:
                    fetches["log_grads"] = [g for g in site_fetches["log_grads"] if g is not None]
                ahead = self._lookahead_fetches(site.key) if lookahead and train else None
                if ahead is not None:
                    fetches["train_grads"] = [g for g in ahead if g is not None]
        res = self.session.run(fetches, feed_dict=self._with_random(feed, seed))
        flags = [bool(f) for f in res["flags"]] + [bool(res["out_bad"])]
        first = book.first_event(flags, flags[-1], traceback_location(self.loss.op))
        call = book.find(site.key)
        seen = site_fetches is not None and bool(res["site"]["seen"])
        ev = Evaluation(seen=seen, hard=math.inf, log_loss=math.inf,
                        triggered=call is not None and book.triggered(flags, call),
                        event=first is not None, first_op=first, program_loss=_scalar(res["loss"]))
        if first is not None:
            ev.origins = book.origins(flags, flags[-1], traceback_location(self.loss.op))
        if seen:
            s = res["site"]
            ev.movable = bool(site_fetches["requires_grad"])
            ev.hard, ev.log_loss = float(s["hard"]), float(s["log_loss"])
            n = batch_size(values)
            if "rows" in s and len(s["rows"]) == n and n > 1:
                ev.per_sample = np.asarray(s["rows"], dtype=np.float64)
            if "grads" in res and not ev.triggered:
                shapes = [np.shape(values[n]) if n in values else tuple(t.shape) for n, t in zip(names, targets)]
                ev.grads, ev.grad_norm, ev.connected = _collect(names, shapes, _fill(site_fetches["grads"],
                                                                                      res["grads"]))
                if "log_grads" in res and math.isfinite(ev.log_loss):
                    ev.log_grads, _, _ = _collect(names, shapes, _fill(site_fetches["log_grads"], res["log_grads"]))
                if "train_grads" in res:
                    inputs = [n for n in names if not n.startswith(WEIGHT_PREFIX)]
                    ev.train_grads, _, _ = _collect(inputs, shapes[: len(inputs)],
                                                    _fill(self._ahead[site.key], res["train_grads"]))
        if train and not ev.event:
            pre = self.get_state()
            feed = self._with_random(feed, seed, TRAIN_DRAW)
            bad = self._train(feed)
            ev.passes += 1
            ev.trained = True
            if bad:
                ev.event, ev.state_before = True, pre
                ev.first_op, ev.phase, grad_key = self._diagnose(pre, feed)
                ev.triggered = grad_key == site.key
            elif self.options.search_weights:
                ev.weights = self.weights()
        elif ev.event:
            ev.phase = "forward"
        return ev

    # -- the program's randomness ----------------------------------------------------------
    def _random_ops(self) -> list:
        """The stateful random ops the program's passes run (ancestors of the loss and the train_op,
        not the variables' initialisers, which run once at build), in a stable order."""
        if self._random is None:
            roots = [self.loss.op]
            train = getattr(self.target.train_op, "op", self.target.train_op)
            if train is not None and hasattr(train, "inputs"):
                roots.append(train)
            self._random = sorted((op for op in _ancestors(roots) if op.type in RANDOM_OPS), key=lambda op: op.name)
        return self._random

    def _with_random(self, feed: dict, seed: int, draw: int = 0) -> dict:
        """``feed`` plus a value for every stateful random op, drawn from ``seed`` (``draw``: which pass
        of the step: the forward pass, or the training step)."""
        ops = self._random_ops()
        if not ops:
            return feed
        args = [list(op.inputs) for op in ops]
        flat = [t for a in args for t in a]
        known = [tf.get_static_value(t) for t in flat]
        missing = [t for t, v in zip(flat, known) if v is None]
        fetched = iter(self.session.run(missing, feed_dict=feed)) if missing else iter(())
        values = iter([v if v is not None else next(fetched) for v in known])
        rng = np.random.default_rng([int(seed) % (2**32), draw])
        out = dict(feed)
        for op, a in zip(ops, args):
            given = [np.asarray(next(values)) for _ in a]
            out[op.outputs[0]] = _draw(rng, op.type, given, op.outputs[0].dtype.as_numpy_dtype)
        return out

    # -- the training step, watched -------------------------------------------------------
    def _train(self, feed: dict) -> bool:
        """The program's ``train_op`` on the searched batch; True when it left a variable non-finite."""
        if self._watch is None:
            self._unfinalize()
            with self.graph.as_default(), tf.compat.v1.name_scope("cdeepfuzz/watch/"):
                reads = [tf.convert_to_tensor(v) for v in self._vars.values()
                         if v.dtype.base_dtype.is_floating]
                flag = graph_flag(reads, nan_only=False)
                self._watch = tf.constant(False) if flag is None else flag
        self.session.run(self.target.train_op, feed_dict=feed)
        return bool(self.session.run(self._watch))

    def _diagnose(self, pre: dict[str, np.ndarray], feed: dict) -> tuple[OpRef, str, tuple | None]:
        """A training step left a variable non-finite: from the state it started from, evaluate the
        loss's gradient graph op by op. The first op with finite inputs and a non-finite output
        names the backward phase (by the forward op it differentiates, and the key of that op's
        backward-hazard site when it has one); none: the update."""
        self.set_state(pre)
        ops, flags = self._gradient_graph()
        if flags:
            values = self.session.run(flags, feed_dict=feed)
            for op, (in_ok, out_bad) in zip(ops, values):
                if out_bad and in_ok:
                    forward = _forward_of(self.graph, op.name)
                    if forward is not None:
                        spec = self.catalogue.for_tf(forward.type)
                        grad = next((c for c in self._instrument().calls if c.spec.phase == "backward"
                                     and c.origin is not None and c.origin.op is forward and not c.origin.path), None)
                        return (OpRef(spec.name if spec is not None else forward.type,
                                      f"{forward.type}:{forward.name} (backward)", traceback_location(forward),
                                      grad.occurrence if grad is not None else 0), "backward",
                                grad.key if grad is not None else None)
                    return OpRef(op.type, f"{op.type}:{op.name} (backward)", f"{NOT_LOCATED}>", 0), "backward", None
        train_op = self.target.train_op
        train_op = train_op if hasattr(train_op, "traceback") else getattr(train_op, "op", train_op)
        return OpRef("update", f"{getattr(train_op, 'type', 'train_op')}:{getattr(train_op, 'name', '')}",
                     traceback_location(train_op), 0), "update", None

    def _gradient_graph(self) -> tuple[list, list]:
        """The ops of ``tf.gradients(loss, trainable variables)`` (built once, in creation order:
        from the loss backwards) and, per op, (inputs finite, outputs non-finite) flags."""
        if self._diag is None:
            self._unfinalize()
            ops, flags = [], []
            with self.graph.as_default():
                before = set(self.graph.get_operations())
                with tf.compat.v1.name_scope("cdeepfuzz/diagnosis/"):
                    tf.gradients(self.loss, self._trainable) if self._trainable else None
                new = [op for op in self.graph.get_operations() if op not in before]
                with tf.compat.v1.name_scope("cdeepfuzz/diagnosis_flags/"):
                    for op in new:
                        out_bad = graph_flag(list(op.outputs), nan_only=False)
                        if out_bad is None or "/gradients" not in "/" + op.name:
                            continue
                        in_ok = graph_flag(list(op.inputs), nan_only=False, negate=True)
                        ops.append(op)
                        flags.append((tf.constant(True) if in_ok is None else in_ok, out_bad))
            self._diag = (ops, flags)
        return self._diag


def _forward_of(graph, grad_op_name: str):
    """The forward op a gradient op differentiates: ``.../gradients/enc/Sqrt_grad/mul`` is the
    gradient of ``enc/Sqrt``."""
    parts = grad_op_name.split("/")
    if "gradients" not in parts:
        return None
    rest = parts[parts.index("gradients") + 1:]
    for i, part in enumerate(rest):
        if part.endswith("_grad"):
            name = "/".join(rest[:i] + [part[: -len("_grad")]])
            try:
                return graph.get_operation_by_name(name)
            except (KeyError, ValueError):
                return None
    return None


TRAIN_DRAW = 1                # the training step's own draw of the program's randomness
RANDOM_OPS = {"RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt"}


def _draw(rng: np.random.Generator, kind: str, args: list[np.ndarray], dtype) -> np.ndarray:
    """Values for a stateful random op of ``kind`` with its inputs ``args`` (shape first), as TF
    draws them: uniform in [0, 1), standard normal, normal truncated at two deviations, integers
    in [minval, maxval)."""
    shape = tuple(int(d) for d in np.atleast_1d(args[0]).tolist()) if np.ndim(args[0]) else (int(args[0]),)
    if kind == "RandomUniform":
        return rng.random(shape).astype(dtype)
    if kind == "RandomUniformInt":
        return rng.integers(int(args[1]), int(args[2]), size=shape).astype(dtype)
    x = rng.standard_normal(shape)
    if kind == "TruncatedNormal":
        bad = np.abs(x) > 2
        while bad.any():
            x[bad] = rng.standard_normal(int(bad.sum()))
            bad = np.abs(x) > 2
    return x.astype(dtype)


def _ancestors(ops: list) -> list:
    seen: set = set()
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return list(seen)


def _fill(symbolic: list, values: list) -> list:
    """Put fetched values back in the places of the non-None symbolic gradients."""
    it = iter(values)
    return [None if g is None else next(it) for g in symbolic]


def _static(t):
    """A scalar constant input as a Python number (as torch's Scalar overloads): no hazard search on it."""
    if tf.is_tensor(t) and getattr(t, "op", None) is not None and t.op.type == "Const" and t.shape.rank == 0:
        value = tf.get_static_value(t)
        if value is not None and np.issubdtype(np.asarray(value).dtype, np.number):
            return value.item()
    return t


__all__ = ["GraphRunner"]
