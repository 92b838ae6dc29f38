"""What a finding under mixed precision says about the precision (issue: mixed precision).

After a candidate is confirmed in the campaign's precision, the same values are replayed once
in a fresh float32 build (``precision`` off) from the same state: a program that stays finite
there fails only because of the lower precision (``precision_only``: the interesting kind).
A program that runs its own AMP loop (``torch.autocast(..., enabled=True)`` in its train step,
a factory argument that turns it on) is built as the factory builds it, and replayed with
every autocast region disabled (the runner's ``float32()``), so that its float32 replay is
float32 too. For a ``half_overflow`` finding the op's output is measured as well: its dtype,
its largest magnitude (the float32 value where the half one overflowed), the dtype's largest
finite value and by how much the value exceeds it. A program that owns a GradScaler gets the
consecutive skips the found values cause (``scaler_skips``), as the engine's own scaler does.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from contextlib import nullcontext
from typing import Any

import numpy as np

from fuzz_core.backends.base import Precision
from fuzz_core.sites import OpSite

log = logging.getLogger(__name__)

HALF_OVERFLOW = "half_overflow"
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


def compute_dtype(precision: Precision) -> str | None:
    """The lower-precision dtype a campaign computes in (None in float32)."""
    return DTYPES.get(precision.autocast or precision.policy or "")


def _finite(v: float | None) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


def precision_facts(runner, spec, site: OpSite, inputs: dict[str, np.ndarray], state: dict | None, seed: int,
                    first_op: dict[str, Any] | None) -> dict[str, Any]:
    """``precision_only`` (bool, None when the float32 replay could not run) and ``overflow``
    (``dtype``, ``value``, ``limit``, ``excess``; the last three None unless the bug is a
    ``half_overflow``) of a finding confirmed on ``runner`` in mixed precision; ``scaler_skips``
    too when the program owns a GradScaler (the engine's own scaler's count is the caller's)."""
    from fuzz_core.engine import confirm, fresh_runner

    precision = runner.options.precision
    overflow: dict[str, Any] = {"dtype": compute_dtype(precision), "value": None, "limit": None, "excess": None}
    fp32 = None
    facts: dict[str, Any] = {"precision_only": None, "overflow": overflow}
    if getattr(runner, "program_scalers", None):
        try:
            facts["scaler_skips"] = int(confirm(runner, site, inputs, state, seed).scaler_skips)
        except Exception as exc:  # noqa: BLE001
            log.warning("counting the GradScaler's skips of %s failed: %s", site.label, exc)
        finally:
            runner.reset()
    try:
        fp32 = fresh_runner(spec, dataclasses.replace(runner.options, precision=Precision()), live=(runner,))
        with float32(fp32):
            facts["precision_only"] = not confirm(fp32, site, inputs, state, seed).event
    except Exception as exc:  # noqa: BLE001 - the fact is missing, the finding stands
        log.warning("float32 replay of %s failed: %s", site.label, exc)
    key = None
    if first_op and first_op.get("op") == HALF_OVERFLOW:
        key = (HALF_OVERFLOW, str(first_op.get("location", "")), int(first_op.get("occurrence", 0)))
    elif not first_op and site.op == HALF_OVERFLOW:     # a first op that is another row's: its value is not this
        key = site.key
    if key is not None and hasattr(runner, "measure"):
        try:
            _reset(runner, state)
            low = runner.measure(inputs, seed, key)
            if low is not None:
                value = low["value"]
                if not math.isfinite(value) and fp32 is not None and hasattr(fp32, "measure"):
                    _reset(fp32, state)
                    with float32(fp32):
                        wide = fp32.measure(inputs, seed, key, any_dtype=True)
                    value = wide["value"] if wide is not None else value
                overflow.update(dtype=low["dtype"], value=_finite(value), limit=_finite(low["limit"]),
                                excess=_finite(value / low["limit"]) if low["limit"] else None)
        except Exception as exc:  # noqa: BLE001
            log.warning("measuring the output of %s failed: %s", site.label, exc)
        finally:
            runner.reset()
    if fp32 is not None:
        fp32.reset()
    return facts


def float32(runner):
    """The runner's float32 context (every autocast region disabled, the program's own too), where
    it has one; nothing to do elsewhere (a Keras policy is set while the factory builds)."""
    guard = getattr(runner, "float32", None)
    return guard() if guard is not None else nullcontext()


def _reset(runner, state: dict | None) -> None:
    runner.reset()
    if state:
        runner.set_state(state)
