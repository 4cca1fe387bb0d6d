"""What several benchmarks share: the tile GEMM kernels written as TileLang users write them, CUDA event timing and
the "no GPU here" exit.

Benchmarks import it as ``from _bench import ...`` (they run as scripts from the repository root, so this folder is
on ``sys.path``). Keep kernels here only when two scripts time the same one; a kernel one script owns stays there.
"""
from __future__ import annotations

import statistics
import sys

import tilecore.language as T


def tile_gemm(M, N, K, bm=128, bn=128, bk=32, threads=256, stages=3, *, dtype="float16", transpose_b=False,
              bias=False, relu=False, via_shared=False, panel=0, accum="float32", out_dtype=None):
    """C = A @ B (``transpose_b``: B stored (N, K), C = A @ B^T), one (bm, bn) tile of C a block, the k loop
    ``T.Pipelined`` with ``stages`` stages: the README GEMM. ``panel``: ``T.use_swizzle(panel)`` when not 0 (block
    rasterization for L2 reuse); ``accum``: the accumulator's type; ``out_dtype``: C's (default ``dtype``).
    Epilogues on the accumulator: ``bias`` adds a float32 ``Bias`` of N elements (an extra argument after B),
    ``relu`` clamps at 0; ``via_shared`` copies C through a shared tile (TileLang's usual epilogue) instead of from
    the fragment."""
    out_dtype = out_dtype or dtype
    b_shape, b_tile = ((N, K), (bn, bk)) if transpose_b else ((K, N), (bk, bn))

    @T.macro
    def body(A, B, Bias, C):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            if panel:
                T.use_swizzle(panel)
            A_shared = T.alloc_shared((bm, bk), dtype)
            B_shared = T.alloc_shared(b_tile, dtype)
            C_local = T.alloc_fragment((bm, bn), accum)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, ko * bk], A_shared)
                if transpose_b:
                    T.copy(B[bx * bn, ko * bk], B_shared)
                else:
                    T.copy(B[ko * bk, bx * bn], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=transpose_b)
            if bias and relu:
                for i, j in T.Parallel(bm, bn):
                    C_local[i, j] = T.max(C_local[i, j] + Bias[bx * bn + j], 0)
            elif bias:
                for i, j in T.Parallel(bm, bn):
                    C_local[i, j] = C_local[i, j] + Bias[bx * bn + j]
            elif relu:
                for i, j in T.Parallel(bm, bn):
                    C_local[i, j] = T.max(C_local[i, j], 0)
            if via_shared:
                C_shared = T.alloc_shared((bm, bn), out_dtype)
                T.copy(C_local, C_shared)
                T.copy(C_shared, C[by * bm, bx * bn])
            else:
                T.copy(C_local, C[by * bm, bx * bn])

    if bias:
        @T.prim_func
        def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor(b_shape, dtype), Bias: T.Tensor((N,), "float32"),
                 C: T.Tensor((M, N), out_dtype)):
            body(A, B, Bias, C)
    else:
        @T.prim_func
        def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((M, N), out_dtype)):
            body(A, B, None, C)
    return gemm


def cuda_ms(fn, rep: int, batches: int = 5) -> float:
    """Milliseconds a call of ``fn``: the median over ``batches`` batches of ``rep`` back-to-back calls between two
    CUDA events (one warm-up call first)."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(rep):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / rep)
    return statistics.median(times)


def require_cuda(script: str) -> bool:
    """True where torch sees a CUDA GPU; otherwise says why on stderr (the caller exits 2)."""
    try:
        import torch
    except ImportError as e:
        print(f"{script}: needs torch with CUDA ({e})", file=sys.stderr)
        return False
    if not torch.cuda.is_available():
        print(f"{script}: no CUDA GPU here; run it on a GPU machine (docs/performance.md)", file=sys.stderr)
        return False
    return True
