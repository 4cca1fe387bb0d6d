"""The WebGPU intrinsic table: tile ops this backend lowers itself instead of the core's generic loops.

Both entries turn a tile op into a :class:`~tilecore.ir.Collective` that every invocation of the
workgroup runs (``tilecore.simt_distribute`` puts a barrier before and after it); the WGSL for it
is printed by :class:`~tilecore_webgpu.codegen.WebGPUEmitter`.

- ``webgpu.subgroup_reduce`` (``T.reduce_*`` over a workgroup or fragment buffer) needs the
  capability ``feature:subgroup_ops``: profiles whose adapter has the ``subgroups`` feature declare
  it. Each subgroup reduces a strided share of a row with ``subgroupAdd``/``subgroupMax``/
  ``subgroupMin``; the partials of one row meet in workgroup memory and are combined in order.
- ``webgpu.tiled_gemm`` (``T.gemm`` with static sizes on workgroup or fragment buffers): every
  invocation owns a small register block of C (up to 4x4) and walks K once, instead of one element of
  C per invocation with a barrier per row. Each element is still ``c = c + a_k * b_k`` for ``k``
  ascending, so results equal the generic lowering's bit for bit.
"""
from __future__ import annotations

from tilecore.ir import Collective, const_value
from tilecore.plugin import Intrinsic

#: reductions the subgroup path implements, by the kind T.reduce records
SUBGROUP_KINDS = ("sum", "abssum", "max", "absmax", "min")
#: accumulator dtypes subgroup arithmetic takes (f16 would need the shader-f16 subgroup extension)
SUBGROUP_DTYPES = ("float32", "int32", "uint32")
#: the most rows one subgroup reduction handles (its scratch is rows x parts words of workgroup memory)
MAX_REDUCE_ROWS = 256
#: the workgroup-memory words the per-subgroup partials may take
REDUCE_SCRATCH_WORDS = 256
LOCAL_SCOPES = ("shared", "fragment", "local")


def _static(extents) -> bool:
    return all(const_value(e) is not None for e in extents)


def reduce_shape(op) -> tuple[int, int]:
    """``(rows, length)`` of a reduction: the kept extents' product and the reduced extent."""
    src = op.args[0]
    dim = op.attrs["dim"]
    rows = 1
    for d, e in enumerate(src.extents):
        if d != dim:
            rows *= int(const_value(e))
    return rows, int(const_value(src.extents[dim]))


def _reduce_applies(op, ctx) -> bool:
    src, dst = op.args
    if op.attrs.get("kind") in ("max", "min", "absmax") and str(dst.buffer.dtype).startswith("float") \
            and not ctx.option("tilecore.fast_math", False):
        return False  # subgroupMax / subgroupMin may drop NaN: the generic lowering propagates it
    return (op.attrs.get("kind") in SUBGROUP_KINDS and str(dst.buffer.dtype) in SUBGROUP_DTYPES
            and src.buffer.scope in LOCAL_SCOPES and dst.buffer.scope in LOCAL_SCOPES
            and _static(src.extents) and _static(dst.extents) and reduce_shape(op)[0] <= MAX_REDUCE_ROWS)


def lower_subgroup_reduce(op, ctx):
    return Collective("webgpu.subgroup_reduce", tuple(op.args), dict(op.attrs), span=op.span)


def _gemm_applies(op, ctx) -> bool:
    a, b, c = op.args
    return (all(r.buffer.scope in LOCAL_SCOPES for r in (a, b, c))
            and all(_static(r.extents) for r in (a, b, c)))


def lower_tiled_gemm(op, ctx):
    return Collective("webgpu.tiled_gemm", tuple(op.args), dict(op.attrs), span=op.span)


def block_shape(m: int, n: int, threads: int) -> tuple[int, int]:
    """The register block (rows, cols) each invocation computes: 4x4 when that leaves work for every
    invocation, halved (larger side first) until it does; each side divides its extent."""
    tm = next(t for t in (4, 2, 1) if m % t == 0)
    tn = next(t for t in (4, 2, 1) if n % t == 0)
    while (m // tm) * (n // tn) < threads and (tm > 1 or tn > 1):
        if tm >= tn and tm > 1:
            tm //= 2
        else:
            tn //= 2
    return tm, tn


INTRINSICS = [
    Intrinsic("reduce", "webgpu.subgroup_reduce", lower_subgroup_reduce, requires=("feature:subgroup_ops",),
              priority=10, applies=_reduce_applies),
    Intrinsic("gemm", "webgpu.tiled_gemm", lower_tiled_gemm, priority=10, applies=_gemm_applies),
]

__all__ = ["INTRINSICS", "block_shape", "reduce_shape"]
