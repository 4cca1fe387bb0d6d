"""CPU GEMM: tilecore's CPU backend against numpy's matmul (BLAS), in the same run.

    python benchmarks/cpu_gemm.py [--sizes 512,1024] [--rep 5]

Prints time and GFLOP/s for both and the ratio (tilecore / numpy time; lower is better). numpy
computes float16 products by converting to float32 internally (no fp16 BLAS), so fp16 rows compare
against numpy on float32 copies of the inputs, timed without the conversion.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from rich.console import Console
from rich.table import Table

import tilecore
import tilecore.language as T


@tilecore.jit(out_idx=[-1], target="cpu")
def matmul(M, N, K, bm=64, bn=64, bk=32, dtype="float32", accum="float32"):
    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), accum)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])
    return gemm


def bench(fn, rep: int) -> float:
    fn()
    times = []
    for _ in range(rep):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,512,1024")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--rep", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    table = Table(title="tilecore CPU GEMM vs numpy matmul (same run)")
    for col in ("M=N=K", "dtype", "tilecore ms", "numpy ms", "tilecore GFLOP/s", "numpy GFLOP/s", "time ratio"):
        table.add_column(col, justify="right")
    for n in (int(s) for s in args.sizes.split(",")):
        for dtype in args.dtypes.split(","):
            a = rng.standard_normal((n, n)).astype(dtype)
            b = rng.standard_normal((n, n)).astype(dtype)
            t = time.perf_counter()
            k = matmul(n, n, n, dtype=dtype)
            compile_s = time.perf_counter() - t
            c = k(a, b)
            a32, b32 = a.astype(np.float32), b.astype(np.float32)
            ref = a32.astype(np.float64) @ b32.astype(np.float64)
            err = float(np.max(np.abs(c.astype(np.float64) - ref)) / max(1.0, float(np.max(np.abs(ref)))))
            ours = bench(lambda: k(a, b), args.rep)
            theirs = bench(lambda: a32 @ b32, args.rep)
            flops = 2.0 * n ** 3
            table.add_row(str(n), dtype, f"{ours * 1e3:.2f}", f"{theirs * 1e3:.2f}", f"{flops / ours / 1e9:.1f}",
                          f"{flops / theirs / 1e9:.1f}", f"{ours / theirs:.2f}x")
            if err > (2e-2 if dtype == "float16" else 1e-4):
                raise SystemExit(f"wrong result at n={n} {dtype}: relative error {err:.3g}")
            Console().print(f"[dim]n={n} {dtype}: compiled in {compile_s:.2f} s, max relative error {err:.2e}[/]")
    Console().print(table)


if __name__ == "__main__":
    main()
