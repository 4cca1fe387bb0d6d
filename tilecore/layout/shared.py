"""Shared-memory layouts as data: where element ``(row, col)`` of an on-chip tile sits.

:class:`SharedLayout` is a row-major tile with optional row padding (``pad`` elements after every row) and
an optional XOR swizzle of 16-byte units (``swizzle_bytes``: 32, 64 or 128, the swizzles of bulk tile
copies and matrix-unit descriptors): unit ``u`` of row ``r`` is stored at ``u ^ (r % (swizzle_bytes/16))``
within each ``swizzle_bytes`` span. Both keep whole 16-byte units together, so vector accesses of 16 bytes
stay whole; :meth:`check` verifies that the map is a bijection into the tile's storage.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SharedLayout:
    rows: int
    cols: int
    elem_bytes: int
    pad: int = 0                #: elements after each row (bank-conflict padding)
    swizzle_bytes: int = 0      #: 0 (none), 32, 64 or 128

    def __post_init__(self):
        if self.swizzle_bytes not in (0, 32, 64, 128):
            raise ValueError(f"swizzle of {self.swizzle_bytes} bytes: use 0, 32, 64 or 128")
        if self.swizzle_bytes and (self.cols * self.elem_bytes) % self.swizzle_bytes:
            raise ValueError(f"a {self.swizzle_bytes}-byte swizzle needs rows of whole {self.swizzle_bytes}-byte "
                             f"spans; a row here is {self.cols * self.elem_bytes} bytes")
        if self.swizzle_bytes and self.pad:
            raise ValueError("a tile is either padded or swizzled, not both")

    @property
    def row_elems(self) -> int:
        return self.cols + self.pad

    @property
    def size(self) -> int:
        """Elements of storage the tile takes."""
        return self.rows * self.row_elems

    def offset(self, row: int, col: int) -> int:
        """The element offset of ``(row, col)`` in the tile's storage."""
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            raise IndexError(f"({row}, {col}) outside a {self.rows}x{self.cols} tile")
        if not self.swizzle_bytes:
            return row * self.row_elems + col
        per_unit = 16 // self.elem_bytes
        span_units = self.swizzle_bytes // 16
        unit, within = divmod(col, per_unit)
        span, u = divmod(unit, span_units)
        u ^= row % span_units
        return row * self.cols + (span * span_units + u) * per_unit + within

    def offset_expr(self, row, col):
        """:meth:`offset` as an IR expression of index expressions."""
        from ..ir import as_expr, binary

        row, col = as_expr(row), as_expr(col)
        if not self.swizzle_bytes:
            return binary("add", binary("mul", row, self.row_elems), col)
        per_unit = 16 // self.elem_bytes
        span_units = self.swizzle_bytes // 16
        unit = binary("div", col, per_unit)
        swz = binary("xor", binary("floormod", unit, span_units), binary("floormod", row, span_units))
        unit2 = binary("add", binary("mul", binary("div", unit, span_units), span_units), swz)
        return binary("add", binary("mul", row, self.cols),
                      binary("add", binary("mul", unit2, per_unit), binary("floormod", col, per_unit)))

    def check(self) -> None:
        seen = {}
        for r in range(self.rows):
            for c in range(self.cols):
                o = self.offset(r, c)
                if not 0 <= o < self.size or o in seen:
                    raise ValueError(f"shared layout {self}: ({r}, {c}) maps to {o}, "
                                     f"{'taken by ' + str(seen[o]) if o in seen else 'outside the tile'}")
                seen[o] = (r, c)


__all__ = ["SharedLayout"]
