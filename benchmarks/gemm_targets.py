"""One GEMM kernel on every installed GPU-class target, next to torch.matmul, in the same run.

    python benchmarks/gemm_targets.py [--targets webgpu,cuda] [--size 2048] [--dtype float32] [--rep 10]

The README-style kernel (shared tiles, a float32 fragment, T.Pipelined over K) is compiled for each
target; its time comes from the kernel's profiler (device timestamps where the runtime has them), so
host transfers are not counted. torch.matmul runs on the CUDA device when there is one. Targets whose
probe is not `ok` are listed with their status instead of a number.
"""
from __future__ import annotations

import argparse
import sys

import tilecore
import tilecore.language as T


def matmul(n, dtype, bm=64, bn=64, bk=32):
    @T.prim_func
    def gemm(A: T.Tensor((n, n), dtype), B: T.Tensor((n, n), dtype), C: T.Tensor((n, n), dtype)):
        with T.Kernel(T.ceildiv(n, bn), T.ceildiv(n, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(n, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])

    return gemm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="webgpu,cuda")
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rep", type=int, default=10)
    args = ap.parse_args()
    n, flops = args.size, 2.0 * args.size ** 3
    rows = []
    for spec in args.targets.split(","):
        try:
            kern = tilecore.compile(matmul(n, args.dtype), target=spec, out_idx=[-1])
            ms = kern.get_profiler().do_bench(warmup=2, rep=args.rep)
            rows.append((spec, f"{flops / ms / 1e9:.3g}", kern.runtime.mode()))
        except Exception as e:  # noqa: BLE001
            rows.append((spec, "-", f"{type(e).__name__}: {str(e).splitlines()[0]}"))
    try:
        import torch

        if torch.cuda.is_available():
            dt = getattr(torch, args.dtype)
            a = torch.randn(n, n, device="cuda", dtype=dt)
            b = torch.randn(n, n, device="cuda", dtype=dt)
            torch.matmul(a, b)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(args.rep):
                torch.matmul(a, b)
            e.record()
            e.synchronize()
            rows.append(("torch.matmul (cuda)", f"{flops / (s.elapsed_time(e) / args.rep) / 1e9:.3g}", "device"))
    except ImportError:
        pass
    print(f"| target | TFLOP/s ({args.dtype} {n}^3) | mode / note |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
