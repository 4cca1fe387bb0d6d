"""Issue 11's leftovers (docs/decisions.md D47), before and after in one process, torch beside.

    python benchmarks/cuda_tidy.py [--rep 20] [--size 4096]

1. ``execution.cluster.at_once``: for the split-K GEMM's cluster kernels (128x4096x4096 at 128x128x64, 3 stages,
   clusters of 2, 3, 4 and 8 blocks) the driver's cuOccupancyMaxActiveClusters beside the profile's figure (the
   capability data must match this GPU, or say it was measured elsewhere).
2. Vector stores of shared -> global copies: a tile copy through shared memory (B = A, 128 x 128 fp16 tiles, the
   shared -> global half is the changed one) and a GEMM whose epilogue goes through shared memory, on the core's
   general path: ``tilecore.vectorize=False`` (element copies, before) against the default (16-byte copies), torch's
   copy / matmul beside.
3. 64-byte-swizzle tiles in the register programs: a GEMM at block_K = 32 (fp16, 64-byte rows of A's tile) on the
   general path it took before (``tilecore.cuda.register_programs=False``) against the Hopper register program it
   takes now (TMA + WGMMA in the 64-byte mode), and the sm_80 register program on this GPU
   (``tilecore.cuda.disable_wgmma``), cuBLAS (torch.matmul) beside.

Each row: milliseconds (median of 5 batches of ``--rep`` calls), the ratio to torch (torch time / ours: higher is
better), and whether the result matches torch's. Exit 2 without a CUDA GPU.
"""
from __future__ import annotations

import argparse
import ctypes
import sys

import tilecore
import tilecore.language as T
from _bench import cuda_ms, require_cuda, tile_gemm


def staged_copy(M, N, bm=128, bn=128, threads=256):
    @T.prim_func
    def copy(A: T.Tensor((M, N), "float16"), B: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            s = T.alloc_shared((bm, bn), "float16")
            T.copy(A[by * bm, bx * bn], s)
            T.copy(s, B[by * bm, bx * bn])
    return copy


def gemm(M, N, K, bm, bn, bk, threads, stages, via_shared=False):
    return tile_gemm(M, N, K, bm, bn, bk, threads, stages, via_shared=via_shared)


def row(name: str, t: float, ref: float, ok: bool, extra: str = "") -> None:
    print(f"{name:58s} {t:8.4f} ms  x{ref / t:5.2f} torch  {'ok' if ok else 'WRONG'}  {extra}", flush=True)


def clusters_at_once() -> None:
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import torch
    from cuda_gemm_splitk import max_active_clusters

    from tilecore.plugin import capability_registry

    table = capability_registry().resolve("cuda/sm_90a").get("execution.cluster.at_once") or {}
    print("# 1. clusters of the split-K GEMM (128x4096x4096, 128x128x64, 3 stages) resident at once")
    a = torch.randn(128, 4096, device="cuda").half()
    b = torch.randn(4096, 4096, device="cuda").half()
    for n in (2, 3, 4, 8):
        k = tilecore.compile(gemm(128, 4096, 4096, 128, 128, 64, 256, 3), target="cuda",
                             pass_configs={"tilecore.cuda.split_k": n, "tilecore.cuda.split_k_reduce": "cluster",
                                           "tilecore.cuda.persistent": False})
        c = torch.empty(128, 4096, device="cuda").half()
        k(a, b, c)
        torch.cuda.synchronize()
        got = max_active_clusters(k)
        print(f"clusters of {n}: driver {got}, profile {table.get(str(n))}, dynamic shared "
              f"{k.source.meta.get('dynamic_shared_bytes')} B, {'match' if got == table.get(str(n)) else 'DIFFER'}",
              flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args()
    if not require_cuda("cuda_tidy"):
        return 2
    import torch

    from tilecore_cuda import lowering_path

    print(torch.cuda.get_device_name(), flush=True)
    try:
        clusters_at_once()
    except (OSError, AttributeError, ctypes.ArgumentError) as e:
        print(f"clusters: not measured ({e})")
    S = args.size
    general = {"tilecore.cuda.register_programs": False}

    print("# 2. shared -> global copies: element (tilecore.vectorize=False) vs 16-byte")
    a = torch.randn(2 * S, 2 * S, device="cuda").half()
    out = torch.empty_like(a)
    t_ref = cuda_ms(lambda: out.copy_(a), args.rep)
    gb = 2 * a.numel() * 2 / 1e9
    print(f"{'torch copy_ ' + str(tuple(a.shape)):58s} {t_ref:8.4f} ms  {gb / t_ref * 1e3:7.0f} GB/s", flush=True)
    for label, cfg in (("before: element stores", {"tilecore.vectorize": False}), ("after: 16-byte", {})):
        k = tilecore.compile(staged_copy(2 * S, 2 * S), target="cuda", pass_configs=cfg)
        b = torch.zeros_like(a)
        k(a, b)
        t = cuda_ms(lambda: k(a, b), args.rep)
        row(f"copy through shared, {label}", t, t_ref, bool(torch.equal(a, b)), f"{gb / t * 1e3:7.0f} GB/s")

    A = torch.randn(S, S, device="cuda").half()
    B = torch.randn(S, S, device="cuda").half()
    ref = A @ B
    t_mm = cuda_ms(lambda: torch.matmul(A, B), args.rep)
    print(f"{'torch.matmul ' + str(S) + '^3 fp16 (cuBLAS)':58s} {t_mm:8.4f} ms", flush=True)

    def run_gemm(name, fn, cfg):
        k = tilecore.compile(fn, target="cuda", pass_configs=cfg)
        C = torch.empty(S, S, device="cuda").half()
        k(A, B, C)
        ok = bool(torch.allclose(C.float(), ref.float(), atol=0.5, rtol=2e-2))
        row(name, cuda_ms(lambda: k(A, B, C), args.rep), t_mm, ok, lowering_path(k))

    for label, cfg in (("before: element copy", {"tilecore.vectorize": False}), ("after: 16-byte", {})):
        run_gemm(f"GEMM 128x256x64 epilogue via shared, general, {label}", gemm(S, S, S, 128, 256, 64, 256, 3, True),
                 {**general, **cfg})

    print("# 3. block_K = 32 (64-byte rows of A's tile): general path (before) vs register programs (after)")
    for bm, bn, threads, stages in ((128, 128, 256, 4), (128, 256, 256, 3), (64, 128, 128, 4)):
        fn = gemm(S, S, S, bm, bn, 32, threads, stages)
        tag = f"{bm}x{bn}x32 {threads}t {stages}st"
        run_gemm(f"GEMM {tag}, before: general path", fn, general)
        run_gemm(f"GEMM {tag}, after: Hopper register program", fn, {})
        run_gemm(f"GEMM {tag}, after: sm_80 register program", fn, {"tilecore.cuda.disable_wgmma": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
