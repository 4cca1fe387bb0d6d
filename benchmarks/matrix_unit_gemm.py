"""T.gemm on a registered matrix unit through the core model (tilecore.passes.matrix), on a CUDA GPU.

    python benchmarks/matrix_unit_gemm.py [--rep 10] [--shapes 4096x777x4096,4096x4096x4096]

Every kernel is compiled with ``tilecore.cuda.register_programs: False`` (the CUDA plugin's register
programs and Hopper pipelines never take it: the core's general path), three ways:

- ``wgmma unit`` (sm_90a): wgmma.mma_async through the core model, A and B read by descriptor from tiles
  stored in swizzled panels, C in registers in wgmma's accumulator layout (``tilecore.matrix_unit_families:
  ["wgmma"]``; on other GPUs the row says n/a), the stages copied by TMA bulk tile copies on mbarriers where the
  tensor allows, by a producer warpgroup of their own (warp specialization; ``wgmma 1 thread``: thread 0 issues
  them between the block's barriers, ``tilecore.warp_specialize: False``; ``wgmma cp.async``: each thread's
  16-byte cp.async, ``tilecore.bulk_copy: False``; ``wgmma elements``: the epilogue's element stores, without
  the vector stores of D32, ``tilecore.vectorize: False``; ``wgmma persistent``: ``tilecore.persistent: True``, the
  resident blocks loop over the tiles and the next tile's first stages load under this tile's epilogue, D36);
- ``mma.sync unit``: the mma.sync unit (ldmatrix operands from XOR-swizzled tiles);
- ``no unit``: ``tilecore.matrix_unit_gemm: False`` (the CUDA plugin's own tensor-core GEMM, C in shared memory).

and, for reference, the ``default`` compile of the same kernel (whatever path takes it: for the 4096^3 GEMM the
Hopper register program / TMA pipeline where its config fits). Prints the lowering path, C's layout, our time,
torch's (cuBLAS, same run), torch/ours (higher is better) and the max error against a float32 product.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import tilecore  # noqa: E402
from cuda_offpath import cuda_ms, gemm_777  # noqa: E402


#: (block_M, block_N, block_K, threads, num_stages)
CONFIGS = ((128, 128, 32, 128, 2), (128, 128, 64, 128, 3), (128, 256, 64, 256, 3))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rep", type=int, default=10)
    ap.add_argument("--shapes", default="4096x777x4096,4096x4096x4096", help="MxNxK, comma-separated")
    ap.add_argument("--variants", default="", help="only these variants (labels, comma-separated; default: all)")
    ap.add_argument("--configs", default="", help="only these tiles (e.g. 128x256x64, comma-separated; default: all)")
    args = ap.parse_args()
    import torch
    from tilecore_cuda import lowering_path

    if not torch.cuda.is_available():
        print("matrix_unit_gemm: no CUDA GPU here", file=sys.stderr)
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name())
    general = {"tilecore.disable_cache": True, "tilecore.cuda.register_programs": False}
    variants = (("wgmma unit", {**general, "tilecore.matrix_unit_families": ["wgmma"]}),
                ("wgmma elements", {**general, "tilecore.matrix_unit_families": ["wgmma"], "tilecore.vectorize": False}),
                ("wgmma 1 thread", {**general, "tilecore.matrix_unit_families": ["wgmma"], "tilecore.warp_specialize": False}),
                ("wgmma persistent", {**general, "tilecore.matrix_unit_families": ["wgmma"], "tilecore.persistent": True}),
                ("wgmma cp.async", {**general, "tilecore.matrix_unit_families": ["wgmma"], "tilecore.bulk_copy": False}),
                ("mma.sync unit", {**general, "tilecore.matrix_unit_families": ["mma_sync"]}),
                ("no unit", {**general, "tilecore.matrix_unit_gemm": False}),
                ("default", {"tilecore.disable_cache": True}))
    if args.variants:
        keep = [v.strip() for v in args.variants.split(",")]
        variants = tuple(v for v in variants if v[0] in keep)
    configs = CONFIGS
    if args.configs:
        keep = [c.strip() for c in args.configs.split(",")]
        configs = tuple(c for c in CONFIGS if f"{c[0]}x{c[1]}x{c[2]}" in keep)
    for M, N, K in (tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s):
        a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g) / 8
        b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=g) / 8
        ref = a.float() @ b.float()
        theirs = cuda_ms(lambda: a @ b, args.rep)
        for label, cfg in variants:
            for bm, bn, bk, threads, stages in configs:
                name = f"{M}x{N}x{K} {label:15s} {bm}x{bn}x{bk} {threads:3d}t {stages}s"
                try:
                    k = tilecore.compile(gemm_777(M, N, K, bm, bn, bk, threads, stages), out_idx=[-1], target="cuda",
                                         pass_configs=cfg)
                except tilecore.errors.CompileError as exc:
                    print(f"{name} n/a: {str(exc).splitlines()[0][:120]}", flush=True)
                    continue
                err = float((k(a, b).float() - ref).abs().max())
                ours = cuda_ms(lambda: k(a, b), args.rep)
                lay = k.meta["attrs"].get("fragment_layouts", {}).get("C_local", "")
                pers = "persistent " if str(k.meta["attrs"].get("persistent", ("",))[0]).startswith("persistent:") else ""
                print(f"{name} {pers}{lowering_path(k):28s} C: {lay.split('[')[0]:34s} ours {ours:8.3f} ms  torch {theirs:8.3f} ms"
                      f"  torch/ours {theirs / ours:6.3f}  err {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
