"""Split-K on the core's general path (``tilecore.split_k``, D69) against the CUDA plugin's split-K and cuBLAS.

    python benchmarks/general_splitk.py [--shapes 128x4096x4096,16x8192x8192] [--rounds 8] [--batch 10]

For every shape, in one process, the README GEMM (``cuda_gemm.matmul``, fp16, C fp16) compiled as:

- ``plugin``: no pass configs: the plugin's pipeline with its split-K rule (D27/D31) and the cluster sum (D41)
  where the clusters fit at once (the default the routing bar compares against);
- ``plugin-global``: ``tilecore.cuda.split_k_reduce="global"``: the plugin's workspace sum (the tile's last block);
- ``plugin-1``: ``tilecore.cuda.split_k=1`` (not split);
- ``general-1``: the core's general path, not split (``general_plain_gemm=True``, ``tilecore.cuda.split_k=1``);
- ``general-S``: the core's general path with ``tilecore.split_k=S`` (S: the plugin's split count for that tile,
  and ``--splits``), and ``general-auto`` (``tilecore.split_k="auto"``);

each at the tiles of ``--tiles`` (BMxBNxBK/threads/stages), the plugin at its own tile rule's tiles. torch.matmul
(cuBLAS) in the same run is the reference. Times: CUDA events around each call, ``--batch`` calls a batch issued
while the GPU sleeps (the host's launch path is slower than these ~20 us kernels), variants interleaved round by
round, the median of every call. Every result is checked against a float64 product (the bound of an fp16 output
of a float32 sum), and each general split-K kernel's C is compared bit for bit across two calls (the split-order
sum's determinism). Prints ratios to cuBLAS and to ``plugin``. Without a GPU: compiles one kernel, exits 3.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import tilecore

sys.path.insert(0, str(Path(__file__).parent))
from cuda_gemm import NO_GPU_EXIT, has_gpu, matmul, split_k_of  # noqa: E402

TILES = "128x128x64/256/4,64x128x64/128/4,64x256x64/128/3"
SHAPES = "128x4096x4096,16x8192x8192,256x4096x4096,64x8192x4096,32x4096x14336"
PLUGIN_TILES = {"128x4096x4096": (128, 128, 64, 256, 5), "16x8192x8192": (64, 256, 64, 128, 3)}
GENERAL = {"tilecore.cuda.general_plain_gemm": True}
#: the plugin's own split-K, also where D75 routes a split GEMM to the core's group sum by default
PLUGIN = {"tilecore.cuda.general_split_k": False}


def parse_tile(t: str) -> tuple:
    a, th, st = t.split("/")
    bm, bn, bk = (int(x) for x in a.split("x"))
    return bm, bn, bk, int(th), int(st)


def shape_rows(M: int, N: int, K: int, dtype: str = "float16", out_dtype: str = "float16"):
    """The inputs and the reference of one shape, and a function adding a compiled variant: ``(variants, add,
    ref, bound)``. A, B random (8-bit: B given as (N, K), the layout 8-bit WGMMA needs); ``variants`` starts with the
    reference (``cublas``: torch.matmul, C in the operands' type; 8-bit: torch._scaled_mm with unit scales, fp16 C);
    ``add(label, tile=(bm, bn, bk, threads, stages), cfg=pass configs)`` compiles the README GEMM for ``target="cuda"``
    with C in ``out_dtype`` and adds it (a variant that does not compile is reported and None returned); ``ref`` the
    float64 product, ``bound`` the float32 sums' bound with one rounding to C (8-bit: plus the 8-bit wgmma's
    accumulation, 3e-3 of max |ref| a 1024 of K, as tests/test_general_fp8.py)."""
    import torch

    tt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float8_e4m3": torch.float8_e4m3fn}
    eight = dtype.startswith("float8")
    if eight:  # randn in float32, then to 8 bits (torch draws no float8 directly)
        A, B = (torch.randn(*s, device="cuda").to(tt[dtype]) for s in ((M, K), (N, K)))
    else:
        A, B = (torch.randn(*s, device="cuda", dtype=tt[dtype]) for s in ((M, K), (K, N)))
    ref = A.double() @ (B.double().t() if eight else B.double())
    ulp = {"float16": 2 ** -10, "bfloat16": 2 ** -7, "float32": 2 ** -20}[out_dtype]
    bound = (K ** 0.5) * 2e-3 * 4 + ref.abs() * ulp  # float32 sums, one rounding to C
    if eight:  # the 8-bit wgmma's accumulation is not float32's (tests/test_general_fp8.py's bound, D67)
        bound = bound + (3e-3 * max(1.0, K / 1024)) * ref.abs().max()
    if eight:
        one = torch.ones((), device="cuda")
        variants: dict = {"cublas": (lambda: torch._scaled_mm(A, B.t(), scale_a=one, scale_b=one,
                                                              out_dtype=torch.float16), None)}
    else:
        variants = {"cublas": (lambda: torch.matmul(A, B), None)}

    def add(label, tile=None, cfg=None):
        bm, bn, bk, th, st = tile
        try:
            k = tilecore.compile(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st, dtype=dtype,
                                        out_dtype=out_dtype, b_transposed=eight), target="cuda", pass_configs=cfg or {})
        except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
            print(f"  {label}: not compiled: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            return None
        C = torch.empty(M, N, device="cuda", dtype=tt[out_dtype])
        variants[label] = (lambda k=k, C=C: k(A, B, C), (k, C))
        return k

    return variants, add, ref, bound


def check_and_time(variants: dict, ref, bound, pairs=(), rounds: int = 8, batch: int = 10,
                   sleep_cycles: int = 4_000_000, both_orders: bool = False):
    """Check, then time ``variants`` (``{label: (call, (kernel, C) or None)}``; None: the reference, not checked):
    each checked C within ``bound`` of the float64 ``ref`` and bit for bit across two calls (failing variants are
    reported and dropped); each ``(a, b)`` of ``pairs`` the same bits. Then ``rounds`` rounds of ``batch`` calls a
    variant, each batch issued while the GPU sleeps, interleaved round by round (``both_orders``: the order reversed
    every other round). Returns ``({label: median us}, failures)``."""
    import torch

    failures = 0
    outs = {}
    for label, (fn, held) in list(variants.items()):
        if held is None:
            continue
        fn()
        torch.cuda.synchronize()
        first = held[1].clone()
        err = (first.double() - ref).abs()
        bad = bool((err > bound).any())
        fn()
        torch.cuda.synchronize()
        same = bool(torch.equal(first, held[1]))
        outs[label] = first
        if bad or not same:
            failures += 1
            print(f"  {label}: FAILED: max err {err.max().item():.4g} (bound {bound.max().item():.3g}), "
                  f"bit-identical across two calls: {same}")
            del variants[label]
    for g, w in pairs:
        if g in outs and w in outs:
            same = bool(torch.equal(outs[g], outs[w]))
            print(f"  {g}: the same bits as {w}: {same}")
            failures += 0 if same else 1
    times = {label: [] for label in variants}
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
    for fn, _ in variants.values():
        fn()
    torch.cuda.synchronize()
    order = list(variants.items())
    for rnd in range(rounds):
        for label, (fn, _) in (order[::-1] if both_orders and rnd % 2 else order):
            if hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(sleep_cycles)
            for s, e in zip(starts, ends):
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            times[label] += [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return {label: statistics.median(ts) for label, ts in times.items()}, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--tiles", default=TILES)
    ap.add_argument("--splits", default="", help="extra split counts for the general path, e.g. 2,4,8")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--sleep-cycles", type=int, default=4_000_000)
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]
    tiles = [parse_tile(t) for t in args.tiles.split(",") if t]
    if not has_gpu()[0]:
        M, N, K = shapes[0]
        bm, bn, bk, th, st = tiles[0]
        k = tilecore.compile(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st),
                             target="cuda:sm_90a", pass_configs={**GENERAL, "tilecore.split_k": 4})
        print("no GPU: compiled", k.meta.get("attrs", {}).get("split_k"))
        return NO_GPU_EXIT
    import torch

    torch.manual_seed(0)
    failures = 0
    for M, N, K in shapes:
        name = f"{M}x{N}x{K}"
        variants, add, ref, bound = shape_rows(M, N, K)

        pt = PLUGIN_TILES.get(name, (128, 128, 64, 256, 4))
        kp = add("plugin", tile=pt, cfg=PLUGIN)
        sp = split_k_of(kp) if kp is not None else 1
        add("plugin-global", tile=pt, cfg={"tilecore.cuda.split_k_reduce": "global"})
        add("plugin-1", tile=pt, cfg={"tilecore.cuda.split_k": 1})
        # the routing under test: the plugin's rule's split count on the general path (tilecore.cuda.general_split_k)
        add("routed (general, plugin tile)", tile=pt, cfg={"tilecore.cuda.general_split_k": True})
        add("routed, scalar partials (round 1)", tile=pt, cfg={"tilecore.cuda.general_split_k": True,
                                                               "tilecore.split_k_partials": "scalar"})
        extra = [int(s) for s in args.splits.split(",") if s]
        for t in tiles:
            tn = f"{t[0]}x{t[1]}x{t[2]}/{t[4]}"
            add(f"general-1 {tn}", tile=t, cfg={**GENERAL, "tilecore.cuda.split_k": 1})
            kt = -(-K // t[2])
            for s in sorted({sp, *extra} - {1}):
                if kt % s == 0:
                    add(f"general-{s} {tn}", tile=t, cfg={**GENERAL, "tilecore.split_k": s})
            k = add(f"general-auto {tn}", tile=t, cfg={**GENERAL, "tilecore.split_k": "auto"})
            if k is not None:
                note = (k.meta.get("attrs", {}).get("split_k") or ("not split",))[0]
                print(f"  general-auto {tn}: {note[:160]}")
        print(f"\n{name}: plugin tile {pt[0]}x{pt[1]}x{pt[2]}/{pt[4]}, plugin split-K {sp}")
        med, bad = check_and_time(variants, ref, bound, rounds=args.rounds, batch=args.batch,
                                  sleep_cycles=args.sleep_cycles)
        failures += bad
        cub, plug = med["cublas"], med.get("plugin")
        print(f"{'variant':34s} {'us':>8s} {'x cuBLAS':>9s} {'x plugin':>9s}")
        for label, us in med.items():
            rp = f"{plug / us:9.3f}" if plug else f"{'-':>9s}"
            print(f"{label:34s} {us:8.2f} {cub / us:9.3f} {rp}")
        sys.stdout.flush()
    print(f"\n{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
