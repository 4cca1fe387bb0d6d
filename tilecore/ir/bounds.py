"""Integer bounds of index expressions: a small interval analysis.

``int_bounds(e, ranges)`` gives ``(lo, hi)`` with ``lo <= e <= hi`` for every value the variables in
``ranges`` (Var -> (lo, hi), keyed by identity) may take, or None when it cannot tell. It knows
constants, the variables in ``ranges``, ``+ - *``, ``//`` and ``%`` by positive constants, ``min``,
``max`` and integer casts; anything else (a memory load, a variable of unknown range) is unknown.
"""
from __future__ import annotations

from .dtypes import is_float
from .expr import BinOp, Cast, Var, const_value


def int_bounds(e, ranges: dict):
    v = const_value(e)
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(e, Var):
        return ranges.get(id(e))
    if isinstance(e, Cast) and not is_float(e.dtype) and not is_float(e.value.dtype):
        return int_bounds(e.value, ranges)
    if not isinstance(e, BinOp) or is_float(e.dtype):
        return None
    a, b = int_bounds(e.a, ranges), int_bounds(e.b, ranges)
    if a is None or b is None:
        return None
    if e.op == "add":
        return (a[0] + b[0], a[1] + b[1])
    if e.op == "sub":
        return (a[0] - b[1], a[1] - b[0])
    if e.op == "mul":
        p = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
        return (min(p), max(p))
    if e.op == "min":
        return (min(a[0], b[0]), min(a[1], b[1]))
    if e.op == "max":
        return (max(a[0], b[0]), max(a[1], b[1]))
    if e.op in ("floordiv", "floormod") and b[0] == b[1] and b[0] > 0:
        d = b[0]
        if e.op == "floordiv":
            return (a[0] // d, a[1] // d)
        if a[0] // d == a[1] // d:  # one period: no wrap-around
            return (a[0] % d, a[1] % d)
        return (0, d - 1)
    return None


def loop_range(start, extent, ranges: dict):
    """The range of a loop variable running ``start .. start + extent - 1`` (None if unknown or empty)."""
    s, n = int_bounds(start, ranges), int_bounds(extent, ranges)
    if s is None or n is None or n[1] < 1:
        return None
    return (s[0], s[1] + n[1] - 1)


__all__ = ["int_bounds", "loop_range"]
