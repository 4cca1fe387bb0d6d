"""Kernels off the CUDA backend's matched forms, against torch, in the same run.

    python benchmarks/cuda_offpath.py [--rep 20] [--rows 4096 --cols 8192]

The CUDA plugin's whole-kernel passes (register programs, Hopper pipelines) take kernels of fixed forms;
anything else used to drop to the generic path with every fragment in shared memory. This script times
kernels written as TileLang users write them that those passes do not take: softmax and RMSNorm over
rows of ``--cols`` float16 elements (the conformance catalog's kernels at this size: one row per block, the row a float32 fragment), and a GEMM whose B
rows are 777 float16 elements (not a multiple of 16 bytes). Each row prints the lowering path the kernel
took (``tilecore_cuda.lowering_path``) and where its fragments live (``kernel.meta["attrs"]``), the time,
torch's time for the same result, and the ratio (torch time / ours: higher is better; 1.0 = parity).
Run it with two trees (before / after a change) on the same machine to compare them.
"""
from __future__ import annotations

import argparse
import sys

import tilecore
from _bench import cuda_ms, require_cuda, tile_gemm
from tilecore.errors import TilecoreError
from tilecore_conformance.composite import rmsnorm, softmax


def gemm_777(M, N, K, bm=128, bn=128, bk=32, threads=128, stages=2):
    """The GEMM with B rows of N fp16 elements (N = 777: not a multiple of 16 bytes)."""
    return tile_gemm(M, N, K, bm, bn, bk, threads, stages)


def where_fragments(kernel) -> str:
    lay = kernel.meta.get("attrs", {}).get("fragment_layouts")
    if not lay:
        return "shared (no layout pass)"
    regs = sum(1 for v in lay.values() if not str(v).startswith("shared"))
    return f"{regs}/{len(lay)} in registers"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--gemm", default="4096,777,4096", help="M,N,K of the GEMM with 777-column B")
    ap.add_argument("--rep", type=int, default=20)
    args = ap.parse_args()
    if not require_cuda("cuda_offpath"):
        return 2
    import torch

    from tilecore_cuda import lowering_path

    R, C = args.rows, args.cols
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(R, C, device="cuda", dtype=torch.float16, generator=g)
    M, N, K = (int(v) for v in args.gemm.split(","))
    a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g) / 8
    b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=g) / 8

    def rms_ref(t):
        t = t.float()
        return (t * torch.rsqrt((t * t).mean(1, keepdim=True) + 1e-6)).half()

    cases = [
        (f"softmax {R}x{C}", lambda: softmax("float16", R, C, br=1), (x,), lambda: torch.softmax(x.float(), 1).half()),
        (f"rmsnorm {R}x{C}", lambda: rmsnorm("float16", R, C, br=1), (x,), lambda: rms_ref(x)),
        (f"gemm {M}x{N}x{K} (B rows of {N} fp16)", lambda: gemm_777(M, N, K), (a, b), lambda: a @ b),
    ]
    print(f"{'kernel':40s} {'path':28s} {'fragments':20s} {'ours ms':>9s} {'torch ms':>9s} {'torch/ours':>10s} "
          f"{'max err':>9s}")
    for name, build, inputs, ref in cases:
        try:
            kern = tilecore.compile(build(), out_idx=[-1], target="cuda")
        except TilecoreError as e:
            print(f"{name:40s} refused: {str(e).splitlines()[0]}")
            continue
        out = kern(*inputs)
        err = float((out.float() - ref().float()).abs().max())
        ours = cuda_ms(lambda: kern(*inputs), args.rep)
        theirs = cuda_ms(ref, args.rep)
        print(f"{name:40s} {lowering_path(kern):28s} {where_fragments(kern):20s} {ours:9.3f} {theirs:9.3f} "
              f"{theirs / ours:10.3f} {err:9.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
