"""Shared-memory swizzle requests."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SwizzledLayout:
    """A request that a shared buffer be stored swizzled (XOR of the column by the row, in 16-byte units).

    It is a hint, as all of ``T.annotate_layout``: the backend that reads it picks the swizzle its copy
    unit needs (a bulk tile copy may always swizzle its tiles by 128 bytes), the others
    keep the plain row-major layout. Results are the same either way."""

    buffer: str
    continuous: int | None = None
    k_major: bool = True

    def __repr__(self) -> str:  # the hint is part of the kernel's IR text, hence of its cache key
        return f"make_swizzled_layout({self.buffer}, continuous={self.continuous}, k_major={self.k_major})"


def make_swizzled_layout(buffer, continuity: int | None = None, k_major: bool = True, allow_pad: bool = True):
    """``T.annotate_layout({A_shared: make_swizzled_layout(A_shared)})``."""
    from ..errors import ParseError
    from ..ir import Buffer

    if not isinstance(buffer, Buffer) or buffer.scope != "shared":
        raise ParseError(f"make_swizzled_layout takes a T.alloc_shared buffer, got {buffer!r}")
    return SwizzledLayout(buffer.name, continuity, k_major)
