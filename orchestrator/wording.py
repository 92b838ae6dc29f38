"""The words every output uses for a bug and for how a site ended, from one place.

The terminal, the HTML report, JUnit and SARIF and MLflow's tags all say what a bug is and why a
site ended through these functions, so that no two of them can tell one bug two stories (a site
"found" in one place and "not triggered" in another, one bug "precision-only" here and "fails in
float32" there). They read plain data: a bug as ``summary.json`` lists it (:func:`orchestrator.run.records.run_bugs`),
a site as its record's ``to_dict()``.
"""
from __future__ import annotations

import math
from typing import Any

from fuzz_core.sites import position_of


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def precision_words(precision_only: bool | None, overflow: dict[str, Any] | None = None) -> str | None:
    """What a bug found in mixed precision is (None for a float32 campaign's, or where the float32
    replay could not run): ``precision-only (float16)`` when the float32 program stays finite on the
    same values, ``also non-finite in float32`` otherwise; for an overflow of the lower precision's
    range, the value against that range's largest finite value, said as it is (a value that float32
    computes just under the limit overflows through float16's own rounding, not "0.998x its max")."""
    if precision_only is None:
        return None
    overflow = overflow or {}
    dtype = overflow.get("dtype") or "mixed precision"
    words = f"precision-only ({dtype})" if precision_only else f"{dtype}; also non-finite in float32"
    value, limit = _number(overflow.get("value")), _number(overflow.get("limit"))
    if value is not None and limit:
        ratio = abs(value) / limit
        if ratio >= 1:
            words += f"; {value:.4g} is {ratio:.3g}x {dtype}'s largest finite value"
        else:
            words += f"; {value:.4g} in float32, under {dtype}'s largest finite value {limit:.4g}: {dtype}'s own " \
                     f"rounding takes it past"
    return words


def bug_words(bug: dict[str, Any]) -> str:
    """``log (forward) at path:line:col: <hazard>``, then what it is in mixed precision and whether it is
    flaky: one bug, as its smallest reproducer shows it."""
    text = f"{bug.get('op', '?')} ({bug.get('phase') or 'forward'}) at {bug.get('position') or position_of(bug)}"
    if bug.get("hazard"):
        text += f": {bug['hazard']}"
    extra = [w for w in (precision_words(bug.get("precision_only"), bug.get("overflow")),) if w]
    if bug.get("flaky"):
        extra.append("flaky: not every fresh replay reproduced it")
    return text + (f" [{'; '.join(extra)}]" if extra else "")


def _loss(x: Any) -> str:
    number = _number(x)
    return "-" if number is None else f"{number:.4g}"


def site_outcome(site: dict[str, Any], steps: bool = False) -> str:
    """How a site stands, in one phrase: its status, why it ended (``steps``: after how many of its own
    search's steps), and what it says beyond that: who found the bug at it when another site's search did,
    and, for a site that ended without one, how close it came and what the search outside its bounds saw
    (never for a found site: that search did not run, or its verdict no longer matters)."""
    status, reason = site.get("status", "?"), site.get("exit_reason") or "none"
    text = status if reason in ("none", "") else f"{status} ({reason.replace('_', ' ')})"
    if steps:
        text += f" after {site.get('steps', 0)} steps"
    if status in ("found", "flaky"):
        if site.get("found_by"):
            text += f", by the search of {site['found_by']}"
        return text
    if status in ("pending", "searching"):
        return text
    best = _loss(site.get("best_loss"))
    if best != "-":
        text += f", closest suspect loss {best}"
    reach = (site.get("reach") or {}).get("message") if status in ("exhausted", "retired") else None
    if reach:
        text += f"; {reach}"
    return text
