"""Layouts: where fragment elements live (thread, register), shared-memory tile layouts, matrix units.

:class:`FragmentLayout` (fragment.py) is the core's model of a fragment in registers; :class:`SharedLayout`
(shared.py) of a padded or swizzled shared tile; :class:`MatrixUnit` (matrix.py) is how a backend registers
a matrix instruction's operand layouts; :func:`plan_conversion` (convert.py) how to move a fragment's
elements from one layout to another (register moves, xor or indexed shuffles, or a shared-memory round
trip). ``make_swizzled_layout`` is TileLang's ``tilelang.layout`` hint for ``T.annotate_layout``. docs/layout.md describes the model.
"""
from __future__ import annotations

from .convert import Conversion, apply_conversion, plan_conversion
from .fragment import Digit, FragmentLayout, blocked
from .matrix import MatrixUnit, units_for
from .shared import SharedLayout
from .swizzle import SwizzledLayout, make_swizzled_layout

__all__ = ["Conversion", "Digit", "FragmentLayout", "MatrixUnit", "SharedLayout", "SwizzledLayout", "blocked",
           "make_swizzled_layout", "units_for", "apply_conversion", "plan_conversion"]


def __getattr__(name):
    from ..errors import not_provided

    raise not_provided("tilecore.layout", name)
