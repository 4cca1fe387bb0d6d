"""T.gemm on a registered matrix unit, with the accumulator in registers (the core's side of
:class:`tilecore.layout.MatrixUnit`).

Contract used by the layout pass (tilecore/passes/layout.py):

- :func:`plan_gemm` is asked, for each ``T.gemm`` whose C is a fragment, whether one of the target's matrix
  units (``tilecore.layout.units_for``) can run it over the block's ``threads``; it returns a
  :class:`GemmPlan` whose ``c_layout`` (the unit's accumulator layout tiled over the block's groups and
  registers) becomes C's layout, or None (C then takes the core's blocked layout and the generic
  register GEMM).
- :func:`lower_gemm` turns the op into the statements each thread runs (placed inside a
  :class:`~tilecore.ir.PerThread` by the caller): operand loads into ``register`` buffers by the unit's A and
  B layouts, and one :class:`~tilecore.ir.MatrixOp` per unit instruction. ``registers`` maps each fragment
  in registers to ``(register buffer, layout)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..layout import FragmentLayout, MatrixUnit


@dataclass
class GemmPlan:
    unit: MatrixUnit
    c_layout: FragmentLayout
    attrs: dict = field(default_factory=dict)


def plan_gemm(op, threads: int, ctx) -> GemmPlan | None:
    """A plan for ``op`` (a ``T.gemm`` TileOp) on a matrix unit of the target, or None."""
    return None


def lower_gemm(op, plan: GemmPlan, registers: dict, ctx):
    raise NotImplementedError("no matrix-unit GEMM lowering yet")


__all__ = ["GemmPlan", "plan_gemm", "lower_gemm"]
