"""Integer arithmetic on the thread index, evaluated at every thread of a block at once.

Passes and emitters decide from an index's value at each thread (which threads store one 16-byte unit, which lane
holds a row, which offsets a swizzle flips): :func:`thread_values` evaluates an expression over a numpy array of
thread indices and answers None where the expression reads anything but the thread index and constants, or where
its value is not exactly what the IR means at some thread (a truncating division of a negative number, a division
by a non-positive one). One evaluator serves the core's vectorizer and the backends' emitters."""

from __future__ import annotations

from .dtypes import is_float
from .expr import BinOp, Cast, Cmp, IntImm, Select, ThreadIndex

_CMP = {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal", "eq": "equal", "ne": "not_equal"}
_BIN = {"add": "add", "sub": "subtract", "mul": "multiply", "min": "minimum", "max": "maximum", "xor": "bitwise_xor",
        "bitand": "bitwise_and", "bitor": "bitwise_or"}


def thread_values(e, t, memo: dict | None = None):
    """``e`` at the threads ``t`` (a numpy int64 array of thread indices), or None. ``memo`` (id(e) -> (e, values),
    for one ``t``) evaluates a shared subexpression once (the registers of a fragment share their thread part)."""
    if memo is None:
        return _values(e, t, None)
    hit = memo.get(id(e))
    if hit is not None and hit[0] is e:
        return hit[1]
    out = _values(e, t, memo)
    memo[id(e)] = (e, out)
    return out


def _values(e, t, memo):
    import numpy as np

    if isinstance(e, IntImm):
        return np.full_like(t, int(e.value))
    if isinstance(e, ThreadIndex):
        return t
    if isinstance(e, Cast):
        if is_float(e.dtype) or is_float(e.value.dtype):
            return None
        return thread_values(e.value, t, memo)
    if isinstance(e, Select):
        c, a, b = (thread_values(x, t, memo) for x in (e.cond, e.t, e.f))
        return None if c is None or a is None or b is None else np.where(c != 0, a, b)
    if isinstance(e, Cmp):
        a, b = thread_values(e.a, t, memo), thread_values(e.b, t, memo)
        if a is None or b is None or e.op not in _CMP:
            return None
        return getattr(np, _CMP[e.op])(a, b).astype(np.int64)
    if not isinstance(e, BinOp) or is_float(e.dtype):
        return None
    a, b = thread_values(e.a, t, memo), thread_values(e.b, t, memo)
    if a is None or b is None:
        return None
    op = e.op
    if op in ("floordiv", "floormod", "div", "mod"):
        # numpy's // and % floor; C's truncating div / mod equal them where the dividend is non-negative
        if (b <= 0).any() or (op in ("div", "mod") and (a < 0).any()):
            return None
        return a // b if op in ("floordiv", "div") else a % b
    return getattr(np, _BIN[op])(a, b) if op in _BIN else None
