"""T.gemm on a registered matrix unit through the core model (tilecore.passes.matrix), on a CUDA GPU.

    python benchmarks/matrix_unit_gemm.py [--rep 10]

For GEMMs the CUDA plugin's register programs do not take (B rows of 777 float16, not a multiple of 16
bytes; 4096^3 at tiles the Hopper passes refuse), compiled three ways: the default (the target's mma.sync
unit through the core model: C in registers in the unit's layout, ldmatrix operands from XOR-swizzled
tiles, MatrixOps), the same with row-major tiles (``tilecore.swizzle_operand_tiles: False``) and
``tilecore.matrix_unit_gemm: False`` (the CUDA plugin's own tensor-core GEMM, ``cuda.gemm_mma``: ldmatrix
operands, C in shared memory), the default before the unit's operand loads had a spelling.
Prints the lowering path, C's layout, our time, torch's, torch/ours (higher is better) and the max error.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import tilecore  # noqa: E402
from cuda_offpath import cuda_ms, gemm_777  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rep", type=int, default=10)
    args = ap.parse_args()
    import torch
    from tilecore_cuda import lowering_path

    if not torch.cuda.is_available():
        print("matrix_unit_gemm: no CUDA GPU here", file=sys.stderr)
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name())
    for M, N, K in ((4096, 777, 4096), (4096, 4096, 4096)):
        a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g) / 8
        b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=g) / 8
        ref = a.float() @ b.float()
        for label, extra in (("default (unit)", {}), ("unit, plain tiles", {"tilecore.swizzle_operand_tiles": False}),
                             ("no unit", {"tilecore.matrix_unit_gemm": False})):
            cfg = {"tilecore.disable_cache": True, **extra}
            for bm, bn, bk in ((128, 128, 32), (64, 64, 32)):
                k = tilecore.compile(gemm_777(M, N, K, bm, bn, bk, 128), out_idx=[-1], target="cuda", pass_configs=cfg)
                err = float((k(a, b).float() - ref).abs().max())
                ours, theirs = cuda_ms(lambda: k(a, b), args.rep), cuda_ms(lambda: a @ b, args.rep)
                lay = k.meta["attrs"].get("fragment_layouts", {}).get("C_local", "")
                print(f"{M}x{N}x{K} {label:14s} {bm}x{bn}x{bk} {lowering_path(k):28s} C: {lay.split('[')[0]:40s} "
                      f"ours {ours:8.3f} ms  torch {theirs:8.3f} ms  torch/ours {theirs / ours:6.3f}  err {err:.1e}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
