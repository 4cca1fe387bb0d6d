"""FlashAttention forward on a CUDA GPU: tilecore against torch SDPA (cuDNN and flash backends), same run.

    python benchmarks/cuda_attention.py [--batch 8 --heads 32 --seq 4096 --dim 128] [--kv-heads 8] [--rep 5]

The kernel is written as TileLang writes it (Q/K/V tiles in shared memory, online softmax with exp2,
two gemms per block). Prints TFLOP/s (4 * b * h * s^2 * d for full attention, half that for causal)
and the ratio to the best torch backend; checks our output against SDPA's before timing. ``--kv-heads``
makes it grouped-query attention (K/V with fewer heads; SDPA with ``enable_gqa=True`` in the same run).
Exits with code 2 and a clear message where no CUDA GPU is present.
"""
from __future__ import annotations

import argparse
import sys
import time

import tilecore
from tilecore_conformance.composite import flash_attention_forward


def flash_fwd(batch, heads, seq, dim, causal, bm=64, bn=64, dtype="float16", threads=128, stages=2, fast=False,
              wgmma=True, kv_heads=None):
    # the conformance catalog's kernel, at the benchmark's sizes
    @tilecore.jit(out_idx=[3], target="cuda",
                  pass_configs={"tilecore.fast_math": fast, "tilecore.cuda.disable_wgmma": not wgmma})
    def build():
        return flash_attention_forward(seq, dim, heads, bm, bn, dtype, causal, batch=batch, threads=threads,
                                       num_stages=stages, kv_heads=kv_heads)

    return build()


def cuda_ms(fn, rep: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rep):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--kv-heads", type=int, default=None, help="K/V heads (grouped-query attention); default: --heads")
    ap.add_argument("--rep", type=int, default=5)
    ap.add_argument("--blocks", default="128x128x256x2,128x128x256x3,128x64x256x2,64x64x128x2",
                    help="our configurations, bm x bn [x threads [x stages]]; the best is shown. On sm_90a a block of "
                         "64 query rows per warpgroup runs as a warp-specialized register program")
    ap.add_argument("--no-wgmma", action="store_true",
                    help="switch the Hopper passes off: measures the sm_80 path (mma.sync register program) here")
    ap.add_argument("--fast-math", action="store_true",
                    help="also time every configuration with tilecore.fast_math (approximate exp2, contraction)")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"cuda_attention: needs torch with CUDA ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("cuda_attention: no CUDA GPU here; run it on a GPU machine (see docs/performance.md)", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table

    b, h, s, d = args.batch, args.heads, args.seq, args.dim
    hk = args.kv_heads or h
    gqa = f" kv-heads {hk}" if hk != h else ""
    table = Table(title=f"FlashAttention forward fp16, b{b} h{h}{gqa} s{s} d{d} on {torch.cuda.get_device_name()}")
    for col in ("causal", "tilecore TFLOP/s", "config", "SDPA cuDNN", "SDPA flash", "ours / best torch", "max err"):
        table.add_column(col, justify="right")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(b, hk, s, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    extra = {"enable_gqa": True} if hk != h else {}
    for causal in (False, True):
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        theirs = {}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra)
                    theirs[name] = flops / cuda_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                                          **extra), args.rep) / 1e9
            except RuntimeError as e:  # a backend torch lacks on this build or device
                theirs[name] = float("nan")
                print(f"SDPA {name}: unavailable ({str(e).splitlines()[0]})", file=sys.stderr)
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, **extra)
        best, best_cfg, errs = 0.0, "-", []
        cfgs = [(c, False) for c in args.blocks.split(",")]
        if args.fast_math:
            cfgs += [(c, True) for c in args.blocks.split(",")]
        for cfg, fast in cfgs:
            bm, bn, *rest = (int(x) for x in cfg.split("x"))
            threads, stages = (rest + [128, 2][len(rest):])[:2]
            cfg = cfg + (" fast-math" if fast else "")
            t0 = time.perf_counter()
            try:
                kern = flash_fwd(b, h, s, d, causal, bm, bn, threads=threads, stages=stages, fast=fast,
                                 wgmma=not args.no_wgmma, kv_heads=hk)
            except tilecore.errors.TilecoreError as e:  # e.g. tiles that do not fit on chip at d256: said, skipped
                print(f"causal={causal} {cfg}: skipped ({type(e).__name__}: {str(e)[:160]})", file=sys.stderr)
                continue
            compile_s = time.perf_counter() - t0
            out = kern(q, k, v)
            errs.append(float((out.float() - ref).abs().max()))
            tf = flops / cuda_ms(lambda: kern(q, k, v), max(1, min(args.rep, 3))) / 1e9
            print(f"causal={causal} {cfg}: {tf:.1f} TFLOP/s, compiled in {compile_s:.2f} s", file=sys.stderr)
            if tf > best:
                best, best_cfg = tf, cfg
        top = max(x for x in theirs.values() if x == x) if any(x == x for x in theirs.values()) else float("nan")
        table.add_row(str(causal), f"{best:.1f}", best_cfg, f"{theirs['cudnn']:.1f}", f"{theirs['flash']:.1f}",
                      f"{best / top:.3f}x", f"{max(errs):.2e}")
    Console(width=140).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
