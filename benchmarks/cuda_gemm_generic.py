"""CUDA GEMM off the matched forms (B with 777 columns): the core's pipeline planner before and after.

    python benchmarks/cuda_gemm_generic.py [--sizes 4096] [--n 777] [--dtypes float16,float32] [--rep 20] [--check]

A B whose rows are not a multiple of 16 bytes keeps the kernel off the CUDA plugin's register programs and
Hopper pipelines (``tilecore_cuda.lowering_path(kernel) == "generic"``): the core's lowering, spread over the
threads, with tensor-core ``T.gemm`` where the dtype has it. Each row is the README GEMM (M x K times
K x N, float32 accumulator) at one block configuration and ``num_stages``:

- ``stages = 1`` is *before*: the planner leaves a one-stage loop alone, so the copies take
  ``cuda.copy_async`` (copy, commit, wait, barrier) and the loop is serial: the same CUDA source the
  generic path produced for any ``num_stages`` before ``tilecore.plan_pipelines``;
- ``stages >= 2`` is *after*: multi-buffered shared tiles, copies issued ``stages - 1`` iterations ahead
  (``kernel.meta["attrs"]["pipelines"]`` is printed: with float16, B's 1554-byte rows leave its copy
  synchronous; with float32, B takes 4-byte cp.async).

TFLOP/s count 2*M*N*K; torch.matmul (cuBLAS; TF32 allowed for float32 only with --tf32) in the same run,
ratio = ours / torch. Without a GPU it prints the plans and exits with status 3.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tilecore

sys.path.insert(0, str(Path(__file__).parent))
from cuda_gemm import NO_GPU_EXIT, event_ms, has_gpu, matmul  # noqa: E402

#: (block_M, block_N, block_K, threads)
CONFIGS = [(128, 64, 32, 128), (64, 64, 32, 128), (128, 128, 32, 256)]
STAGES = (1, 2, 3, 4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096", help="M = K values")
    ap.add_argument("--n", type=int, default=777, help="columns of B (not a multiple of 8: off the matched forms)")
    ap.add_argument("--dtypes", default="float16,float32")
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--check", action="store_true", help="compare each result with torch.matmul")
    ap.add_argument("--tf32", action="store_true", help="let torch.matmul use TF32 for float32")
    args = ap.parse_args()
    ok, why = has_gpu()
    target = args.target if ok else "cuda:sm_90a"
    import tilecore_cuda

    rows = []
    for dtype in args.dtypes.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            M = K = size
            N = args.n
            if ok:
                import torch

                torch.backends.cuda.matmul.allow_tf32 = args.tf32
                tdt = getattr(torch, dtype)
                a = torch.randn(M, K, device="cuda", dtype=tdt)
                b = torch.randn(K, N, device="cuda", dtype=tdt)
                c = torch.empty(M, N, device="cuda", dtype=tdt)
                ms_t = event_ms(lambda: torch.matmul(a, b), args.rep)
                tf_t = 2.0 * M * N * K / ms_t / 1e9
            for cfg in CONFIGS:
                for stages in STAGES:
                    k = tilecore.compile(matmul(M, N, K, *cfg, num_stages=stages, dtype=dtype), target=target)
                    path = tilecore_cuda.lowering_path(k)
                    plan = "; ".join(k.meta["attrs"].get("pipelines", ())) or "serial loop, cuda.copy_async copies"
                    if not ok:
                        print(f"{dtype} {M}x{N}x{K} {cfg} stages={stages} [{path}]: {plan}")
                        continue
                    ms = event_ms(lambda: k(a, b, c), args.rep)
                    tf = 2.0 * M * N * K / ms / 1e9
                    err = ""
                    if args.check:
                        ref = torch.matmul(a.float(), b.float())
                        err = f" max|err| {(c.float() - ref).abs().max().item():.3g}"
                    print(f"{dtype} {M}x{N}x{K} {cfg} stages={stages} [{path}] {ms:.3f} ms {tf:.1f} TFLOP/s{err}: {plan}")
                    rows.append((dtype, f"{M}x{N}x{K}", cfg, stages, tf, tf_t))
    if not ok:
        print(f"cuda_gemm_generic.py: no GPU to measure on ({why}); the plans above are for cuda:sm_90a.")
        return NO_GPU_EXIT
    print("\n| dtype | MxNxK | bM,bN,bK,threads | stages | tilecore TFLOP/s | torch.matmul TFLOP/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for dtype, shape, cfg, stages, tf, tf_t in rows:
        label = f"{stages} (before)" if stages == 1 else str(stages)
        print(f"| {dtype} | {shape} | {','.join(map(str, cfg))} | {label} | {tf:.1f} | {tf_t:.1f} | {tf / tf_t:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
