"""Split-K GEMM for shapes with few output tiles (issue 17's LLM rows 128x4096x4096 and 16x8192x8192), written
as a TileLang user writes it, against the plain kernel and cuBLAS in the same run.

    python benchmarks/cuda_gemm_splitk.py [--shapes 128x4096x4096,16x8192x8192] [--rep 20]

With M = 128 a 4096-wide output has 32 tiles of 128x128 for 132 SMs: most of the GPU idles. The split-K
kernel adds a grid dimension of ``splits``: block ``bz`` runs the pipelined K loop over its ``K / splits``
share and adds its tile into a float32 C with ``T.atomic_add`` (C zeroed first: the timed call includes the
``zero_()``). The plain kernel is ``cuda_gemm.matmul`` (float16 C) at the small-M configurations, unsplit
(``tilecore.cuda.split_k=1``) and as the compiler splits it over K on its own (D27); torch.matmul
(cuBLAS, float16 C) is the reference. TFLOP/s count 2*M*N*K; ratio = ours / torch. Each result is checked
against a float32 product. Without a GPU it compiles one kernel of each kind and exits with status 3.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tilecore
import tilecore.language as T

sys.path.insert(0, str(Path(__file__).parent))
from cuda_gemm import NO_GPU_EXIT, SMALL_M_CONFIGS, event_ms, has_gpu, matmul  # noqa: E402

#: (block_M, block_N, block_K, threads, stages, splits)
SPLIT_CONFIGS = [(64, 128, 64, 128, 4, 2), (64, 128, 64, 128, 4, 4), (64, 64, 64, 128, 4, 4),
                 (128, 128, 64, 128, 3, 4), (128, 128, 64, 128, 3, 8), (64, 128, 64, 128, 3, 8)]


def matmul_splitk(M, N, K, bm, bn, bk, threads=128, stages=3, splits=4, dtype="float16"):
    """C (float32, zeroed by the caller) += A @ B, the K loop split over ``splits`` blocks per output tile."""
    k_tiles = T.ceildiv(K, bk * splits)  # k tiles per split

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), splits, threads=threads) as (bx, by, bz):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(k_tiles, num_stages=stages):
                T.copy(A[by * bm, (bz * k_tiles + ko) * bk], A_s)
                T.copy(B[(bz * k_tiles + ko) * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.atomic_add(C[by * bm, bx * bn], C_l)

    return gemm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="128x4096x4096,16x8192x8192")
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--target", default="cuda")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    ok, why = has_gpu()
    if not ok:
        M, N, K = shapes[0]
        for fn in (matmul(M, N, K, *SMALL_M_CONFIGS[0]), matmul_splitk(M, N, K, *SPLIT_CONFIGS[0][:5],
                                                                       splits=SPLIT_CONFIGS[0][5])):
            k = tilecore.compile(fn, target="cuda:sm_90a")
            print(f"compiled {k.name if hasattr(k, 'name') else 'kernel'} for cuda:sm_90a ({len(k.get_kernel_source())} "
                  f"bytes of CUDA); {why}")
        return NO_GPU_EXIT
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name())
    print("| shape | kernel | config (bM,bN,bK,threads,stages[,splits]) | tilecore TFLOP/s | torch TFLOP/s | ratio | max err |")
    print("|---|---|---|---|---|---|---|")
    for M, N, K in shapes:
        a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g) / 8
        b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=g) / 8
        ref = a.float() @ b.float()
        flop = 2.0 * M * N * K
        theirs = flop / event_ms(lambda: a @ b, args.rep) / 1e9
        best = {}
        # the plain kernel as before (tilecore.cuda.split_k=1), and as the compiler splits it (D27)
        for kind, cfgs in (("plain", {"tilecore.cuda.split_k": 1}), ("plain, compiler split-K", {})):
            for cfg in SMALL_M_CONFIGS:
                k = tilecore.compile(matmul(M, N, K, *cfg), target=args.target, out_idx=[-1], pass_configs=cfgs)
                err = float((k(a, b).float() - ref).abs().max())
                tf = flop / event_ms(lambda: k(a, b), args.rep) / 1e9
                if tf > best.get(kind, (0,))[0]:
                    best[kind] = (tf, cfg, err)
        c = torch.zeros(M, N, device="cuda", dtype=torch.float32)
        for cfg in SPLIT_CONFIGS:
            k = tilecore.compile(matmul_splitk(M, N, K, *cfg[:5], splits=cfg[5]), target=args.target)

            def run():
                c.zero_()
                k(a, b, c)

            run()
            err = float((c - ref).abs().max())
            tf = flop / event_ms(run, args.rep) / 1e9
            if tf > best.get("split-K", (0,))[0]:
                best["split-K"] = (tf, cfg, err)
        for kind, (tf, cfg, err) in best.items():
            print(f"| {M}x{N}x{K} | {kind} | {cfg} | {tf:.1f} | {theirs:.1f} | {tf / theirs:.2f}x | {err:.1e} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
