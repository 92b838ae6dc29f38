"""A scheduler's state as plain JSON data, and back, exactly.

Per-site records are dataclasses whose fields are ``int``, ``float``, ``bool``, ``str``,
a str ``Enum``, ``list[float]``, another such dataclass, or ``X | None`` of those.
Floats round-trip exactly through JSON (``repr``); the non-finite ones, which JSON
lacks, are written as the strings ``"inf"``, ``"-inf"`` and ``"nan"`` (``float()``
reads them back), so ``json.dumps(state, allow_nan=False)`` always works. Each record
class is compiled once into a list of field encoders (a state of 1,000 sites is written
in milliseconds).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from enum import Enum
from functools import lru_cache
from typing import Any, Callable

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def encode_float(x: float) -> float | str:
    x = float(x)
    return x if math.isfinite(x) else repr(x)   # 'inf', '-inf', 'nan'


def decode_float(x: Any) -> float:
    if isinstance(x, str) and x in _NON_FINITE:
        return _NON_FINITE[x]
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"not a float in a scheduler state: {x!r}")
    return float(x)


def _exact(kind: type) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if type(value) is not kind:
            raise ValueError(f"not a {kind.__name__} in a scheduler state: {value!r}")
        return value
    return check


def _optional(tp: Any) -> Any:
    """``X`` for ``X | None`` (either spelling), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def _coders(tp: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """(encode, decode) for one field type."""
    inner = _optional(tp)
    if inner is not None:
        enc, dec = _coders(inner)
        return (lambda v: None if v is None else enc(v)), (lambda v: None if v is None else dec(v))
    if tp is float:
        return encode_float, decode_float
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        enc, dec = _coders(item)
        return (lambda v: [enc(x) for x in v]), (lambda v: [dec(x) for x in _exact(list)(v)])
    if isinstance(tp, type) and issubclass(tp, Enum):
        return (lambda v: v.value), tp
    if dataclasses.is_dataclass(tp):
        return to_json, (lambda v: from_json(tp, v))
    if tp in (int, bool, str):
        return tp, _exact(tp)
    raise TypeError(f"cannot encode a field of type {tp!r}")


@lru_cache(maxsize=None)
def _compiled(cls: type) -> tuple[tuple[str, Callable, Callable], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, *_coders(hints[f.name])) for f in dataclasses.fields(cls))


def to_json(record: Any) -> dict[str, Any]:
    """A dataclass record as a dict of JSON values (every field, by name)."""
    return {name: enc(getattr(record, name)) for name, enc, _ in _compiled(type(record))}


def from_json(cls: type, data: dict[str, Any]) -> Any:
    """The record :func:`to_json` wrote; a missing or unknown field is an error."""
    fields = _compiled(cls)
    if not isinstance(data, dict) or len(data) != len(fields) or any(name not in data for name, _, _ in fields):
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"a {cls.__name__} state needs the fields {sorted(n for n, _, _ in fields)}, got {got}")
    return cls(**{name: dec(data[name]) for name, _, dec in fields})
