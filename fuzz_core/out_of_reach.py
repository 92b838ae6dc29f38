"""Out of reach, measured: where the nearest trigger of a site lies when it is not inside the bounds.

A site whose budget is spent without a trigger says more than ``exhausted``: how close the
search came, and whether the op would go non-finite if its inputs could leave the valid range
the target declares ("would trigger if x[3, 1] reached 52.1; bounds are [-31, 31]"). The probe
goes on from where the search ended, with the ``adaptive`` strategy in a box
:data:`WIDEN` times as wide on each side, for a small budget of its own (:data:`STEPS`, not
counted in the site's). Users judge the risk from it: a trigger just outside the data's range
is a bug waiting for the first outlier; one at 1e30 is not.
"""
from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from fuzz_core.backends.base import WEIGHT_PREFIX

if TYPE_CHECKING:
    from fuzz_core.search import SiteSearch

STEPS = 40          # steps of the probe, beyond the site's budget
WIDEN = 100.0       # the probe's box: the bounds grown by this many of their widths on each side


def widened(bounds: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    out = {}
    for k, (lo, hi) in bounds.items():
        if k.startswith(WEIGHT_PREFIX):
            out[k] = (lo, hi)
            continue
        width = max(hi - lo, 1.0)
        out[k] = (lo - WIDEN * width, hi + WIDEN * width)
    return out


def probe(search: "SiteSearch", steps: int = STEPS) -> dict[str, Any]:
    """Search on without the bounds (within a box :data:`WIDEN` times wider) for ``steps``
    steps; the site's own state is put back afterwards. Returns the ``reach`` record."""
    from fuzz_core.search import QuantumOver, Triggered
    from fuzz_core.strategies import make_strategy

    # everything the probe's steps may change, copied (a strategy may write into the arrays it was
    # given, and a refresh draws from the site's RNG): a probe before the end of a search (the share
    # scheduler asks for one) must leave it to go on exactly as it would have without
    saved = ({k: np.array(v, copy=True) for k, v in search.values.items()}, search.bounds, search.step, search._end,
             search.best, search.strategy_state, search.cache, search.candidate, search._trace, search.trained,
             search.unreachable, search.frozen, copy.deepcopy(search.rng.bit_generator.state))
    original = dict(search.bounds)
    runner_state = search.runner.get_state()
    record: dict[str, Any] = {"best_loss": _finite(search.best), "probe_steps": 0, "triggered": False,
                              "box_factor": WIDEN}
    try:
        search.bounds = widened(original)
        search.strategy_state, search.cache, search.candidate, search._trace = {}, {}, None, []
        strategy = make_strategy("adaptive")
        search._end = search.step + steps
        start = search.step
        try:
            while search.step < search._end and not search.unreachable:
                strategy.iterate(search)
        except (QuantumOver, Triggered):
            pass
        record["probe_steps"] = search.step - start
        record["probe_best_loss"] = _finite(min([p.suspect_loss for p in search._trace] + [math.inf]))
        cand = search.candidate
        if cand is not None:
            record.update(triggered=True, phase=cand.phase, own=bool(cand.own),
                          first_op=cand.first_op.to_dict() if cand.first_op is not None else None,
                          **_outside(cand.values, original))
    except Exception as exc:  # noqa: BLE001 - a program that raises outside its range says so
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        (search.values, search.bounds, search.step, search._end, search.best, search.strategy_state,
         search.cache, search.candidate, search._trace, search.trained, search.unreachable, search.frozen,
         search.rng.bit_generator.state) = saved
        search.runner.reset()                       # the program as the search left it
        search.runner.set_state(runner_state)
    record["message"] = describe(record, original)
    return record


def _outside(values: dict[str, np.ndarray], bounds: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """The searched value furthest outside its bounds: name, index, value, bounds."""
    worst: dict[str, Any] = {"outside": None}
    excess = 0.0
    for k, (lo, hi) in bounds.items():
        if k.startswith(WEIGHT_PREFIX) or k not in values:
            continue
        v = np.asarray(values[k], dtype=np.float64)
        over = np.maximum(v - hi, lo - v)
        if over.size == 0:
            continue
        i = int(np.argmax(over))
        if over.flat[i] > excess:
            excess = float(over.flat[i])
            index = np.unravel_index(i, v.shape)
            worst["outside"] = {"input": k, "index": [int(j) for j in index], "value": float(v.flat[i]),
                                "bounds": [float(lo), float(hi)], "excess": excess}
    return worst


def describe(record: dict[str, Any], bounds: dict[str, tuple[float, float]]) -> str:
    """One line for people."""
    if record.get("error"):
        return f"outside its bounds the program raised ({record['error']})"
    if not record.get("triggered"):
        best = record.get("probe_best_loss")
        closest = f"{best:.4g}" if isinstance(best, (int, float)) else "-"
        return (f"not triggered within {WIDEN:g}x its bounds either ({record['probe_steps']} more steps; "
                f"closest suspect loss {closest})")
    out = record.get("outside")
    if out is None:
        return f"triggered inside its bounds after {record['probe_steps']} more steps: the budget was too small"
    idx = "[" + ", ".join(str(i) for i in out["index"]) + "]" if out["index"] else ""
    lo, hi = out["bounds"]
    return f"would trigger if {out['input']}{idx} reached {out['value']:.4g}; bounds are [{lo:.4g}, {hi:.4g}]"


def _finite(x: float) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None
