"""The CUDA backend's intrinsic table (first increment: no tensor cores yet).

``cuda.gemm_simt``: the generic gemm lowering (``for i serial: for k serial: for j parallel``)
distributes badly over threads (a barrier per (i, k) step). This one makes every (i, j) output element
one parallel iteration with a private accumulator: ``acc = C[i, j]; for k: acc += A[i, k] * B[k, j];
C[i, j] = acc``. The additions happen in the same order and the same dtype as the generic lowering
(the accumulator is C's dtype, products of operands cast to it), so results are identical.
"""
from __future__ import annotations

from tilecore.ir import Allocate, Buffer, BufferLoad, For, Store, TileOp, Var, as_expr, binary, cast, const, seq
from tilecore.plugin import Intrinsic


def _mat(r, row, col):
    idx = list(r.starts)
    idx[-2] = binary("add", idx[-2], row)
    idx[-1] = binary("add", idx[-1], col)
    return tuple(idx)


def lower_gemm_simt(op: TileOp, ctx):
    a, b, c = op.args
    ta, tb = op.attrs.get("transpose_A"), op.attrs.get("transpose_B")
    m, n = c.extents[-2], c.extents[-1]
    k = a.extents[-2] if ta else a.extents[-1]
    acc = c.buffer.dtype
    i, j, kk = Var("gi"), Var("gj"), Var("gk")
    a_idx = _mat(a, kk, i) if ta else _mat(a, i, kk)
    b_idx = _mat(b, j, kk) if tb else _mat(b, kk, j)
    c_idx = _mat(c, i, j)
    accb = Buffer("acc", (1,), acc, "var")
    zero = (const(0),)
    init = const(0, acc) if op.attrs.get("clear_accum") else BufferLoad(c.buffer, c_idx)
    update = Store(accb, zero, binary("add", BufferLoad(accb, zero),
                                      binary("mul", cast(acc, BufferLoad(a.buffer, a_idx)),
                                             cast(acc, BufferLoad(b.buffer, b_idx)))), span=op.span)
    body = seq([Allocate(accb, init, span=op.span), For(kk, as_expr(0), k, "serial", update, span=op.span),
                Store(c.buffer, c_idx, BufferLoad(accb, zero), span=op.span)])
    return For(i, as_expr(0), m, "parallel", For(j, as_expr(0), n, "parallel", body, span=op.span), span=op.span)


TABLE = [
    Intrinsic("gemm", "cuda.gemm_simt", lower_gemm_simt, priority=5),
]
