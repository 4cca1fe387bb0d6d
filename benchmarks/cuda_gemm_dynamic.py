"""The catalog's dynamic-shape GEMM (``T.dynamic`` M, N, K; float32 C) against the same kernel at static sizes and cuBLAS, same run.

    python benchmarks/cuda_gemm_dynamic.py [--size 4096] [--configs 128x128x32x256x3,...]
        [--rep 20] [--export DIR | --load DIR] [--no-odd] [--no-host]

Rows per configuration: the kernel at static sizes; the dynamic kernel (its pipelined loop versioned at launch,
D40: TMA bulk copies where K and N are multiples of 8, the per-thread cp.async version otherwise); the same
dynamic kernel compiled with ``tilecore.bulk_copy_versioned=False`` (the cp.async version alone, what the tree
before D40 ran); and at K = size - 1 (odd: the launch takes the cp.async version, A copied element by element),
with cuBLAS at that shape. Then the host time per launch of the dynamic kernel at a tiny shape (64^3: the
bulk version, its two tensor maps cached; 64x64x63: the cp.async version, zeros passed for them) beside the
static kernel's, measured as benchmarks/host_costs.py does (back-to-back calls, best of 5 loops of 500).

The default configurations have 64-byte tile rows (block_K 32), so the dynamic kernels take the core's general path
(at 128-byte rows the CUDA plugin's Hopper pipeline takes them, dynamic or not); the static kernel is compiled for
the same path (``tilecore.cuda.register_programs=False``), and once more as it compiles by default since D47 (the
register program, its A tile in the 64-byte swizzle).

A dynamic trip count used to make ptxas serialize every wgmma of the core's general path on sm_90a (the loop
could run 0 times; fixed by putting the loop and its drain under one ``trips > 0`` test, see the ptxas notes of
plugin API 1.7). ``--export DIR`` writes the dynamic kernels compiled by this tree (``kernel.export``) without a
GPU; ``--load DIR`` times such files (e.g. compiled by an older tree) as a "loaded" row beside this tree's own.
Exits with status 3 where no CUDA GPU is present (after --export, which needs none).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tilecore

sys.path.insert(0, str(Path(__file__).parent))
from cuda_gemm import event_ms, has_gpu, matmul  # noqa: E402


#: the static kernel on the path the dynamic ones take (the register programs take static block_K = 32 kernels, D47)
GENERAL = {"tilecore.cuda.register_programs": False}


def dynamic_matmul(bm, bn, bk, threads, stages):
    """The catalog's dynamic-shape GEMM (float16 in, float32 C) at this tile."""
    from tilecore_conformance.catalog import _dynamic_gemm_kernel

    return _dynamic_gemm_kernel("float16", "float32", False, False, 0, 0, 0, tile=(bm, bn, bk, threads), stages=stages)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--configs", default="128x128x32x256x3,128x256x32x256x3,64x64x32x128x3",
                    help="bm x bn x bk x threads x stages, comma-separated")
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--export", metavar="DIR", help="write this tree's dynamic kernels here (no GPU needed)")
    ap.add_argument("--load", metavar="DIR", help="also time the kernels --export wrote there (another tree's)")
    ap.add_argument("--no-odd", action="store_true", help="skip the odd-K rows")
    ap.add_argument("--no-host", action="store_true", help="skip the host time per launch")
    args = ap.parse_args()
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    ok, why = has_gpu()
    target = "cuda" if ok else "cuda:sm_90a"
    if args.export:
        out = Path(args.export)
        out.mkdir(parents=True, exist_ok=True)
        for cfg in configs:
            kernel = tilecore.compile(dynamic_matmul(*cfg), target=target, pass_configs={"tilecore.disable_cache": True})
            print("exported", kernel.export(out / ("gemm_dynamic_" + "x".join(map(str, cfg)) + ".tck")))
    if not ok:
        print(f"cuda_gemm_dynamic: {why}; nothing timed", file=sys.stderr)
        return 3
    import torch

    s = args.size
    a, b = (torch.randn(s, s, device="cuda", dtype=torch.float16) for _ in range(2))
    c = torch.empty(s, s, device="cuda", dtype=torch.float32)
    ref = a.float() @ b.float()
    tf = lambda ms: 2.0 * s ** 3 / ms / 1e9  # noqa: E731
    torch_ms = event_ms(lambda: torch.matmul(a, b), args.rep)
    print(f"| config | kernel | TFLOP/s | / cuBLAS ({tf(torch_ms):.1f}) | ptxas | max err |")
    print("|---|---|---|---|---|---|")
    odd = None
    if not args.no_odd:  # K = s - 1: A's rows are 2 (s - 1) bytes, not whole 16-byte units
        a_o, b_o = a[:, :s - 1].contiguous(), b[:s - 1].contiguous()
        ref_o = a_o.float() @ b_o.float()
        odd_ms = event_ms(lambda: torch.matmul(a_o, b_o), args.rep)
        odd = (a_o, b_o, ref_o, odd_ms)
    off = {"tilecore.bulk_copy_versioned": False}
    first = None
    for cfg in configs:
        kernels = {"static": tilecore.compile(matmul(s, s, s, *cfg, out_dtype="float32"), target=target,
                                              pass_configs=GENERAL),
                   "static, register program (the default since D47)":
                       tilecore.compile(matmul(s, s, s, *cfg, out_dtype="float32"), target=target),
                   "dynamic": tilecore.compile(dynamic_matmul(*cfg), target=target),
                   "dynamic, cp.async only (versioning off)": tilecore.compile(dynamic_matmul(*cfg), target=target,
                                                                               pass_configs=off)}
        first = first or kernels
        if args.load:
            f = Path(args.load) / ("gemm_dynamic_" + "x".join(map(str, cfg)) + ".tck")
            if f.exists():
                kernels["dynamic, loaded"] = tilecore.load_kernel(f)
        for name, kernel in kernels.items():
            kernel(a, b, c)
            err = float((c.float() - ref).abs().max())
            ms = event_ms(lambda: kernel(a, b, c), args.rep)
            notes = kernel.meta["source"]["meta"].get("ptxas", {}).get("performance_loss", ["-"])
            print(f"| {'x'.join(map(str, cfg))} | {name} | {tf(ms):.1f} | {torch_ms / ms:.2f}x | {notes[0][:60]} | "
                  f"{err:.2e} |")
        if odd is not None:
            a_o, b_o, ref_o, odd_ms = odd
            kernel = kernels["dynamic"]
            kernel(a_o, b_o, c)
            err = float((c.float() - ref_o).abs().max())
            ms = event_ms(lambda: kernel(a_o, b_o, c), args.rep)
            tfo = lambda ms: 2.0 * s * s * (s - 1) / ms / 1e9  # noqa: E731
            print(f"| {'x'.join(map(str, cfg))} | dynamic, K = {s - 1} (cp.async version) | {tfo(ms):.1f} | "
                  f"{odd_ms / ms:.2f}x of cuBLAS at K = {s - 1} ({tfo(odd_ms):.1f}) | - | {err:.2e} |")
    if not args.no_host and first is not None:
        host_rows(first, torch)
    return 0


def host_rows(kernels, torch, launches=500):
    """Host time per launch at tiny shapes (the GPU's work smaller than the host's), compiled launcher on."""
    import time

    def host_us(fn):
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(launches):
                fn()
            best = min(best, (time.perf_counter() - t0) / launches * 1e6)
            torch.cuda.synchronize()
        return best

    print("\n| launch (64 x 64 output) | host us per launch |\n|---|---|")
    static = tilecore.compile(matmul(64, 64, 64, 128, 128, 32, 256, 3, out_dtype="float32"), target="cuda",
                              pass_configs=GENERAL)
    for name, kernel, k in (("static 64^3 (TMA, maps cached)", static, 64),
                            ("dynamic 64^3 (TMA version, maps cached)", kernels["dynamic"], 64),
                            ("dynamic 64x64x63 (cp.async version, zeros passed)", kernels["dynamic"], 63),
                            ("dynamic 64^3, versioning off (cp.async, no maps)",
                             kernels["dynamic, cp.async only (versioning off)"], 64)):
        a = torch.randn(64, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, 64, device="cuda", dtype=torch.float16)
        c = torch.empty(64, 64, device="cuda", dtype=torch.float32)
        print(f"| {name} | {host_us(lambda: kernel(a, b, c)):.2f} |")
    x = torch.randn(4096, device="cuda")
    print(f"| torch.add, 4096 elements | {host_us(lambda: torch.add(x, x, out=x)):.2f} |")


if __name__ == "__main__":
    sys.exit(main())
