"""Integer helpers for kernel drivers (TileLang's ``tilelang.math``)."""
from __future__ import annotations

__all__ = ["cdiv", "next_power_of_2"]


def next_power_of_2(x: int) -> int:
    """The smallest power of two >= ``x`` (1 for ``x <= 1``)."""
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``a / b`` rounded up."""
    return -(-a // b)


def __getattr__(name):
    from ..errors import not_provided

    raise not_provided("tilecore.math", name)
