"""Small IR queries the CUDA plugin's lowerings share (intrinsics, the Hopper passes, register programs)."""
from __future__ import annotations

from tilecore.ir import Region, as_expr, binary, const_value, simplify


class NoMatch(Exception):
    """A lowering does not apply; the message says why (recorded for the user)."""


def need(cond, why: str = "") -> None:
    if not cond:
        raise NoMatch(why)


def static(e):
    """The integer value of ``e`` when it simplifies to a constant, else None."""
    return const_value(simplify(as_expr(e)))


def full(r) -> bool:
    """``r`` is a region covering the whole of a buffer with a static shape."""
    if not isinstance(r, Region):
        return False
    shape = r.buffer.static_shape()
    return (shape is not None and all(static(x) == 0 for x in r.starts)
            and tuple(static(x) for x in r.extents) == tuple(shape))


def nonunit(extents) -> list:
    """The dimensions whose extent is not 1."""
    return [d for d, e in enumerate(extents) if static(e) != 1]


def row_stride(buf, dim: int):
    """Elements between consecutive indices of dimension ``dim`` of a row-major buffer (an expression)."""
    ld = as_expr(1)
    for d in buf.shape[dim + 1:]:
        ld = binary("mul", ld, d)
    return simplify(ld)
