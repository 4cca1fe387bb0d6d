"""The CUDA backend's intrinsic table.

``cuda.gemm_mma`` (tensor cores): ``T.gemm`` on 16-bit float operands (float16 or bfloat16, same dtype)
with a float32 accumulator, every operand in block-local memory, tile shapes whole multiples of the
``mma.sync`` m16n8k16 shape, a block of whole warps. It lowers to one
:class:`~tilecore.ir.Collective` statement, ``tc_gemm_mma<...>(A, B, C)`` (prelude/tc_cuda.cuh): every
thread of the block calls it; warps take chunks of the C tile, keep them in registers over the K loop
(``ldmatrix`` where the shared layout allows, 16-bit loads otherwise) and store them back. Transposes
are strides. Chosen by capability (``feature:mma_sync`` and ``dtype:<t>:mma``), never by arch name.

``cuda.copy_async``: ``T.copy`` from a global tensor into a shared buffer of the same dtype whose rows
are whole 16-byte chunks: ``tc_copy_g2s_async<...>`` issues ``cp.async`` (LDGSTS) 16-byte copies with
zero fill past the tensor's edge (element copies when the source rows are not 16-byte aligned at run
time), then commits and waits; thread distribution adds the barrier. Needs ``feature:async_copy``.

``cuda.gemm_simt``: the fallback for every other gemm. The generic gemm lowering (``for i serial: for
k serial: for j parallel``) distributes badly over threads (a barrier per (i, k) step). This one makes
every (i, j) output element one parallel iteration with a private accumulator: ``acc = C[i, j]; for k:
acc += A[i, k] * B[k, j]; C[i, j] = acc``. The additions happen in the same order and the same dtype
as the generic lowering (the accumulator is C's dtype, products of operands cast to it), so results are
identical.
"""
from __future__ import annotations

from tilecore.ir import (Allocate, Buffer, BufferLoad, Collective, For, Region, Store, TileOp, Var,
                         as_expr, binary, cast, compare, const, const_value, logic_and, select, seq, simplify)
from tilecore.passes import tile_pass
from tilecore.passes.matrix import mark_block_threads as _mark_block_threads
from tilecore.passes.lower_tile import matrix_index
from tilecore.plugin import Intrinsic

from ._irutil import nonunit as _nonunit, row_stride, static as _static
from .hopper import persistent_template, splitk_template, wgmma_template

BLOCK_LOCAL = ("shared", "fragment", "local")
MMA_M, MMA_N, MMA_K = 16, 8, 16


def lower_gemm_simt(op: TileOp, ctx):
    a, b, c = op.args
    ta, tb = op.attrs.get("transpose_A"), op.attrs.get("transpose_B")
    m, n = c.extents[-2], c.extents[-1]
    k = a.extents[-2] if ta else a.extents[-1]
    acc = c.buffer.dtype
    i, j, kk = Var("gi"), Var("gj"), Var("gk")
    a_idx = matrix_index(a, kk, i) if ta else matrix_index(a, i, kk)
    b_idx = matrix_index(b, j, kk) if tb else matrix_index(b, kk, j)
    c_idx = matrix_index(c, i, j)
    accb = Buffer("acc", (1,), acc, "var")
    zero = (const(0),)
    init = const(0, acc) if op.attrs.get("clear_accum") else BufferLoad(c.buffer, c_idx)
    update = Store(accb, zero, binary("add", BufferLoad(accb, zero),
                                      binary("mul", cast(acc, BufferLoad(a.buffer, a_idx)),
                                             cast(acc, BufferLoad(b.buffer, b_idx)))), span=op.span)
    body = seq([Allocate(accb, init, span=op.span), For(kk, as_expr(0), k, "serial", update, span=op.span),
                Store(c.buffer, c_idx, BufferLoad(accb, zero), span=op.span)])
    return For(i, as_expr(0), m, "parallel", For(j, as_expr(0), n, "parallel", body, span=op.span), span=op.span)


# -- tensor-core gemm ---------------------------------------------------------------------------------

def _strides(buf: Buffer):
    """Row-major element strides of a buffer with a static shape (None when a dimension is symbolic)."""
    shape = buf.static_shape()
    if shape is None:
        return None
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= int(d)
    return tuple(reversed(out))


def _offset(r: Region):
    """The flat element offset of a region's first element (an expression)."""
    flat = as_expr(0)
    stride = as_expr(1)
    for idx, dim in reversed(list(zip(r.starts, r.buffer.shape))):
        flat = binary("add", flat, binary("mul", idx, stride))
        stride = binary("mul", stride, dim)
    return simplify(flat)


def _aligned(r: Region, elems: int) -> bool:
    """The region starts at a multiple of ``elems`` elements (provably)."""
    off = _offset(r)
    v = const_value(off)
    if v is not None:
        return v % elems == 0
    return const_value(simplify(binary("floormod", off, elems))) == 0


def _gemm_dims(op: TileOp):
    a, b, c = op.args
    ta, tb = bool(op.attrs.get("transpose_A")), bool(op.attrs.get("transpose_B"))
    m, n = _static(c.extents[-2]), _static(c.extents[-1])
    k = _static(a.extents[-2] if ta else a.extents[-1])
    return ta, tb, m, n, k


@tile_pass("cuda.mark_block_threads")
def mark_block_threads(func, ctx):
    """Record the block's thread count on each T.gemm (``block_threads``): mma needs whole warps."""
    return _mark_block_threads(func)


def gemm_mma_applies(op: TileOp, ctx) -> bool:
    a, b, c = op.args
    threads = op.attrs.get("block_threads")
    if not isinstance(threads, int) or threads < 32 or threads % 32:
        return False
    if not all(isinstance(r, Region) and r.buffer.scope in BLOCK_LOCAL for r in (a, b, c)):
        return False
    if a.buffer.dtype not in ("float16", "bfloat16") or b.buffer.dtype != a.buffer.dtype:
        return False
    if c.buffer.dtype != "float32":
        return False
    if any(len(r.extents) < 2 or _strides(r.buffer) is None for r in (a, b, c)):
        return False
    # every dimension but the last two must be a single index
    if any(_static(e) != 1 for r in (a, b, c) for e in r.extents[:-2]):
        return False
    ta, tb, m, n, k = _gemm_dims(op)
    if None in (m, n, k) or m % MMA_M or n % MMA_N or k % MMA_K or not (m and n and k):
        return False
    kb = _static(b.extents[-1] if tb else b.extents[-2])
    ma = _static(a.extents[-1] if ta else a.extents[-2])
    nb = _static(b.extents[-2] if tb else b.extents[-1])
    return (kb, ma, nb) == (k, m, n)


def _warp_tiling(mt: int, nt: int, nwarps: int, cap: int):
    """Chunks of (wm x wn) mma tiles for each warp: the fewest rounds of mma + ldmatrix work per warp."""
    best = None
    for wm in (d for d in range(1, mt + 1) if mt % d == 0):
        for wn in (d for d in range(1, nt + 1) if nt % d == 0):
            if wm * wn > cap:
                continue
            chunks = (mt // wm) * (nt // wn)
            rounds = -(-chunks // nwarps)
            cost = rounds * (wm * wn + 2 * (wm + (wn + 1) // 2))
            key = (cost, -wm * wn, abs(16 * wm - 8 * wn))
            if best is None or key < best[0]:
                best = (key, wm, wn)
    return best[1], best[2]


def gemm_mma_template(s: Collective) -> list:
    """Template arguments of ``tc_gemm_mma`` once the thread count is known (see the CUDA emitter)."""
    at = s.attrs
    threads = int(s.threads or 32)
    nwarps = max(threads // 32, 1)
    cap = 32 if threads <= 256 else 16  # accumulator registers per thread: 4 per mma tile
    wm, wn = _warp_tiling(at["M"] // MMA_M, at["N"] // MMA_N, nwarps, cap)
    b = lambda v: "true" if v else "false"  # noqa: E731
    return [threads, at["M"], at["N"], at["K"], at["SAM"], at["SAK"], at["SBK"], at["SBN"], at["SCM"], at["SCN"],
            wm, wn, b(at["dtype"] == "bfloat16"), b(at["clear"]), b(at["ldsm_a"]), b(at["ldsm_b"])]


def lower_gemm_mma(op: TileOp, ctx):
    a, b, c = op.args
    ta, tb, m, n, k = _gemm_dims(op)
    sa, sb, sc = _strides(a.buffer), _strides(b.buffer), _strides(c.buffer)
    # element (m, k) of A at m * SAM + k * SAK, and so on: a transpose swaps the strides
    sam, sak = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
    sbk, sbn = (sb[-1], sb[-2]) if tb else (sb[-2], sb[-1])
    scm, scn = sc[-2], sc[-1]
    # ldmatrix reads 16-byte rows: one stride 1, the other a multiple of 8 elements, the start aligned
    ldsm_a = _aligned(a, 8) and ((sak == 1 and sam % 8 == 0) or (sam == 1 and sak % 8 == 0))
    ldsm_b = _aligned(b, 8) and ((sbn == 1 and sbk % 8 == 0) or (sbk == 1 and sbn % 8 == 0))
    attrs = {"M": m, "N": n, "K": k, "SAM": sam, "SAK": sak, "SBK": sbk, "SBN": sbn, "SCM": scm, "SCN": scn,
             "dtype": str(a.buffer.dtype), "clear": bool(op.attrs.get("clear_accum")), "ldsm_a": ldsm_a,
             "ldsm_b": ldsm_b}
    return Collective("tc_gemm_mma", (a, b, c), attrs, span=op.span)


# -- cp.async copies ----------------------------------------------------------------------------------

def _copy_plan(op: TileOp):
    """(rows, cols, src row dim, src col dim, dst row stride) for a copy cp.async can do, else None."""
    src, dst = op.args
    if not (isinstance(src, Region) and isinstance(dst, Region)):
        return None
    if src.buffer.scope != "global" or dst.buffer.scope != "shared" or src.buffer.dtype != dst.buffer.dtype:
        return None
    nbytes = dst.buffer.dtype.bytes
    if nbytes not in (1, 2, 4, 8):
        return None
    sd, dd = _nonunit(src.extents), _nonunit(dst.extents)
    if len(sd) != len(dd) or len(dd) not in (1, 2):
        return None
    sdst = _strides(dst.buffer)
    if sdst is None or dd[-1] != dst.buffer.ndim - 1 or sd[-1] != src.buffer.ndim - 1:
        return None
    ext = [_static(dst.extents[d]) for d in dd]
    if any(e is None or e <= 0 for e in ext):
        return None
    for s_d, d_d in zip(sd, dd):  # the source extents, where static, must agree with the destination
        se = _static(src.extents[s_d])
        if se is not None and se != _static(dst.extents[d_d]):
            return None
    rows, cols = (1, ext[0]) if len(dd) == 1 else (ext[0], ext[1])
    dst_ld = sdst[dd[0]] if len(dd) == 2 else cols
    if (cols * nbytes) % 16 or (dst_ld * nbytes) % 16 or not _aligned(dst, 16 // nbytes):
        return None
    return rows, cols, (sd[0] if len(sd) == 2 else None), sd[-1], dst_ld


def copy_async_applies(op: TileOp, ctx) -> bool:
    return _copy_plan(op) is not None


def lower_copy_async(op: TileOp, ctx):
    src, dst = op.args
    rows, cols, rdim, cdim, dst_ld = _copy_plan(op)
    shape = src.buffer.shape
    ok = None
    for d, (start, dim) in enumerate(zip(src.starts, shape)):
        if d not in (rdim, cdim):
            cond = compare("lt", start, dim)
            ok = cond if ok is None else logic_and(ok, cond)
    rows_valid = binary("sub", shape[rdim], src.starts[rdim]) if rdim is not None else as_expr(1)
    cols_valid = binary("sub", shape[cdim], src.starts[cdim])
    if ok is not None and const_value(ok) != 1:
        rows_valid = select(ok, rows_valid, const(0, rows_valid.dtype))
    # one row: its stride is never used, but the helper tests it for 16-byte alignment with the source's
    # address (a stride of 1 element failed that test and sent every 1-D copy to element copies); the row's
    # length is whole 16-byte chunks (_copy_plan)
    src_ld = row_stride(src.buffer, rdim) if rdim is not None else as_expr(cols)
    attrs = {"rows": rows, "cols": cols, "dst_ld": dst_ld}
    args = (dst, src, src_ld, simplify(rows_valid), simplify(cols_valid))
    return Collective("tc_copy_g2s_async", args, attrs, span=op.span)


def copy_async_template(s: Collective) -> list:
    at = s.attrs
    return [int(s.threads or 1), at["rows"], at["cols"], at["dst_ld"]]


#: template arguments of each collective, by name (the CUDA emitter spells ``name<...>(args)``)
COLLECTIVES = {"tc_gemm_mma": gemm_mma_template, "tc_copy_g2s_async": copy_async_template,
               "tc_wgmma_pipeline": wgmma_template, "tc_wgmma_splitk": splitk_template,
               "tc_wgmma_persistent": persistent_template}

TABLE = [
    Intrinsic("gemm", "cuda.gemm_simt", lower_gemm_simt, priority=5),
    Intrinsic("gemm", "cuda.gemm_mma_f16", lower_gemm_mma, requires=("feature:mma_sync", "dtype:float16:mma"),
              priority=20, applies=lambda op, ctx: gemm_mma_applies(op, ctx) and op.args[0].buffer.dtype == "float16"),
    Intrinsic("gemm", "cuda.gemm_mma_bf16", lower_gemm_mma, requires=("feature:mma_sync", "dtype:bfloat16:mma"),
              priority=20, applies=lambda op, ctx: gemm_mma_applies(op, ctx) and op.args[0].buffer.dtype == "bfloat16"),
    Intrinsic("copy", "cuda.copy_async", lower_copy_async, requires=("feature:async_copy",), priority=10,
              applies=copy_async_applies),
]

