"""Layout conversion inside a warp: indexed shuffles against a shared-memory round trip, one run (decision D24).

    python benchmarks/conversion_shuffles.py [--target cuda:sm_90a] [--blocks 8192] [--rounds 64] [--rep 20]

Each block of 128 threads loads a 32x32 float32 tile into a fragment laid out as mma.sync's accumulator over
2x2 warps, then ``--rounds`` times computes ``Y = 0.5 X + 1`` into a fragment whose lane bits are rotated by
one (``tests/test_indexed_shuffles.py``'s ``ROTATED``) and ``X = 2 Y - 2`` back: two conversions a round,
every element staying in its warp at 32 xor distances. Compiled twice and timed in turns (best of 3):

- ``tilecore.layout_conversion=True``: one indexed shuffle (``__shfl_sync``) per register and direction;
- ``tilecore.layout_conversion="shared"``: each conversion through a shared tile (barrier, store, barrier,
  load), the only way before D24 (without indexed shuffles the xor plan needs 32 distances).

Both results are checked against numpy. Prints a markdown table row per variant.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import tilecore
import tilecore.language as T

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def kernel(blocks: int, rounds: int):
    from test_indexed_shuffles import MMA, ROTATED, bits_layout

    src, dst = bits_layout(MMA, "mma"), bits_layout(ROTATED, "rotated")

    @T.prim_func
    def relayout(X: T.Tensor((blocks * 32, 32), "float32"), Y: T.Tensor((blocks * 32, 32), "float32")):
        with T.Kernel(blocks, threads=128) as bx:
            X_l = T.alloc_fragment((32, 32), "float32")
            Y_l = T.alloc_fragment((32, 32), "float32")
            T.annotate_layout({X_l: src, Y_l: dst})
            T.copy(X[bx * 32, 0], X_l)
            for _r in T.serial(rounds):
                for i, j in T.Parallel(32, 32):
                    Y_l[i, j] = X_l[i, j] * 0.5 + 1.0
                for i, j in T.Parallel(32, 32):
                    X_l[i, j] = Y_l[i, j] * 2.0 - 2.0
            T.copy(X_l, Y[bx * 32, 0])
    return relayout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cuda:sm_90a")
    ap.add_argument("--blocks", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=64)
    ap.add_argument("--rep", type=int, default=20)
    args = ap.parse_args()
    import torch

    x = torch.randn(args.blocks * 32, 32, device="cuda")
    ref = x.cpu().numpy().astype(np.float64)          # 2 (0.5 x + 1) - 2 = x, rounded at every step
    kernels = {}
    for label, mode in (("indexed shuffles", True), ("shared memory", "shared")):
        k = tilecore.compile(kernel(args.blocks, args.rounds), target=args.target,
                             pass_configs={"tilecore.layout_conversion": mode})
        conv = " ".join(v for v in k.meta["attrs"]["fragment_layouts"].values() if "[converted" in v)
        how = "index" if " by index " in conv else "shared" if " by shared " in conv else "?"
        y = torch.full_like(x, float("nan"))
        k(x, y)
        torch.cuda.synchronize()
        err = float(np.abs(y.cpu().numpy() - ref).max())
        kernels[label] = (k, how, err)
    best: dict = {}
    for _ in range(3):
        for label, (k, _h, _e) in kernels.items():
            ms = k.get_profiler().do_bench(warmup=3, rep=args.rep)
            best[label] = min(best.get(label, ms), ms)
    print(f"{args.target}, {args.blocks} blocks x 128 threads, 32x32 float32 a block, {args.rounds} rounds "
          f"(2 conversions a round); {torch.cuda.get_device_name()}")
    print("| variant | conversion | ms | us per round | max abs error |")
    print("|---|---|---|---|---|")
    for label, (_k, how, err) in kernels.items():
        ms = best[label]
        print(f"| {label} | {how} | {ms:.3f} | {ms * 1e3 / args.rounds:.2f} | {err:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
