"""The CPU backend's intrinsic table.

``cpu.gemm_staged_f32``: a 16-bit-float T.gemm converts its A and B tiles to float32 once per call
(stack buffers), then multiplies in float32. The generic lowering converts every B element inside the
innermost loop, M times over; staging does the conversions once and leaves a loop the compiler
vectorizes. Results are identical: both compute the products in float32.
"""
from __future__ import annotations

from tilecore.ir import Allocate, Buffer, TileOp, seq
from tilecore.passes.lower_tile import lower_copy, lower_gemm
from tilecore.plugin import Intrinsic

_HALF = ("float16", "bfloat16")


def _applies(op, ctx) -> bool:
    a, b, c = op.args
    return a.buffer.dtype in _HALF and b.buffer.dtype in _HALF and c.buffer.dtype == "float32"


def _stage(region, name: str, ctx) -> tuple:
    buf = Buffer(name, region.extents, "float32", "local")
    return buf, [Allocate(buf, span=None), lower_copy(TileOp("copy", (region, buf.region())), ctx)]


def lower_gemm_staged(op: TileOp, ctx):
    a, b, c = op.args
    af, stage_a = _stage(a, "A_f32", ctx)
    bf, stage_b = _stage(b, "B_f32", ctx)
    inner = TileOp("gemm", (af.region(), bf.region(), c), dict(op.attrs), span=op.span)
    return seq(stage_a + stage_b + [lower_gemm(inner, ctx)])


TABLE = [
    Intrinsic("gemm", "cpu.gemm_staged_f32", lower_gemm_staged, requires=("dtype:float32:arith",), priority=10,
              applies=_applies),
]
