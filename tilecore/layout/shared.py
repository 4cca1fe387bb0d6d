"""Shared-memory layouts as data: where element ``(row, col)`` of an on-chip tile sits.

:class:`SharedLayout` is a row-major tile with optional row padding (``pad`` elements after every row) and
an optional XOR swizzle of 16-byte units (``swizzle_bytes``: 32, 64 or 128, the swizzles of bulk tile
copies and matrix-unit descriptors): unit ``u`` of row ``r`` is stored at ``u ^ (r % (swizzle_bytes/16))``
within each ``swizzle_bytes`` span. Both keep whole 16-byte units together, so vector accesses of 16 bytes
stay whole; :meth:`check` verifies that the map is a bijection into the tile's storage.

``panels=True`` is the form matrix-unit instructions that read an operand from shared memory by descriptor
(and bulk tile copies) use: the tile is stored as column panels ``swizzle_bytes`` wide, each panel its
``rows x swizzle_bytes`` bytes contiguous, and the swizzle is a function of the byte address, so of the
row's position in the panel: unit ``u`` of row ``r`` is stored at ``u ^ ((r * swizzle_bytes / 128) %
(swizzle_bytes / 16))`` (rows ``r`` of 128-byte panels: ``u ^ (r % 8)``, the plain form's pattern; 64-byte
panels: ``u ^ (r / 2 % 4)``; 32-byte: ``u ^ (r / 4 % 2)``). The pattern repeats every eight 128-byte lines,
so such a tile starts on an :attr:`align_bytes` boundary.
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
    panels: bool = False        #: stored as swizzle_bytes-wide column panels, swizzled by address (above)

    def __post_init__(self):
        if self.swizzle_bytes not in (0, 32, 64, 128):
            raise ValueError(f"swizzle of {self.swizzle_bytes} bytes: use 0, 32, 64 or 128")
        if self.swizzle_bytes and (self.cols * self.elem_bytes) % self.swizzle_bytes:
            raise ValueError(f"a {self.swizzle_bytes}-byte swizzle needs rows of whole {self.swizzle_bytes}-byte "
                             f"spans; a row here is {self.cols * self.elem_bytes} bytes")
        if self.swizzle_bytes and self.pad:
            raise ValueError("a tile is either padded or swizzled, not both")
        if self.panels and (not self.swizzle_bytes or self.rows % 8):
            raise ValueError("a paneled tile is swizzled and has whole groups of 8 rows")

    @property
    def row_elems(self) -> int:
        return self.cols + self.pad

    @property
    def align_bytes(self) -> int:
        """The boundary the tile's storage starts on: where its swizzle pattern starts (16 when none)."""
        return 8 * self.swizzle_bytes if self.panels else 16

    @property
    def panel_elems(self) -> int:
        """Elements of one panel row (``swizzle_bytes`` bytes)."""
        return self.swizzle_bytes // self.elem_bytes

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
        if self.panels:
            u ^= (row * self.swizzle_bytes // 128) % span_units
            return (span * self.rows + row) * self.panel_elems + u * per_unit + within
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
        if self.panels:
            line = binary("div", row, 128 // self.swizzle_bytes) if self.swizzle_bytes < 128 else row
            swz = binary("xor", binary("floormod", unit, span_units), binary("floormod", line, span_units))
            panel = binary("add", binary("mul", binary("div", unit, span_units), self.rows), row)
            return binary("add", binary("mul", panel, self.panel_elems),
                          binary("add", binary("mul", swz, per_unit), binary("floormod", col, per_unit)))
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
