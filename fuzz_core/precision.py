"""What a finding under mixed precision says about the precision (issue: mixed precision).

After a candidate is confirmed in the campaign's precision, the same values are replayed once
in a fresh float32 build (``precision`` off): a program that stays finite there fails only
because of the lower precision (``precision_only``: the interesting kind). For a
``half_overflow`` finding the op's output is measured as well: its dtype, its largest
magnitude (the float32 value where the half one overflowed), the dtype's largest finite value
and by how much the value exceeds it.
"""
from __future__ import annotations

import dataclasses
import logging
import math
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
    ``half_overflow``) of a finding confirmed on ``runner`` in mixed precision."""
    from fuzz_core.engine import confirm, fresh_runner

    precision = runner.options.precision
    overflow: dict[str, Any] = {"dtype": compute_dtype(precision), "value": None, "limit": None, "excess": None}
    fp32 = None
    facts: dict[str, Any] = {"precision_only": None, "overflow": overflow}
    try:
        fp32 = fresh_runner(spec, dataclasses.replace(runner.options, precision=Precision()), live=(runner,))
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


def _reset(runner, state: dict | None) -> None:
    runner.reset()
    if state:
        runner.set_state(state)
