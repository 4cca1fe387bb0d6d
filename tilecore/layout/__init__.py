"""Layouts (TileLang's ``tilelang.layout``): ``make_swizzled_layout`` for ``T.annotate_layout``."""
from __future__ import annotations

from .swizzle import SwizzledLayout, make_swizzled_layout

__all__ = ["SwizzledLayout", "make_swizzled_layout"]


def __getattr__(name):
    from ..errors import not_provided

    raise not_provided("tilecore.layout", name)
