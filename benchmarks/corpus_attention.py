"""TileLang's own FlashAttention forward example (tests/tilelang_corpus/attention_mha_fwd_bhsd.py, kernel code as
TileLang wrote it) on a CUDA GPU: the register program it takes since D33 against the core's general path it took
before (``tilecore.cuda.register_programs=False``) and torch SDPA (cuDNN, flash), same run.

    python benchmarks/corpus_attention.py [--batch 8 --heads 32 --seq 4096 --dim 128] [--rep 5] [--causal both|yes|no]

The example's autotune configuration (block_M 128, block_N 128, 2 stages, 256 threads) and its pass config
(``TL_ENABLE_FAST_MATH``: the kernel is always built with fast math). Prints TFLOP/s (4 * b * h * s^2 * d, half
for causal), the ratio to the best SDPA backend and the max error against SDPA's float32 math backend.
Exits with code 2 and a clear message where no CUDA GPU is present.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import tilecore

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from cuda_attention import cuda_ms  # noqa: E402

PATHS = {"register program": {}, "general path": {"tilecore.cuda.register_programs": False}}


def corpus_kernel(b, h, s, d, causal, configs):
    import tilecore_cuda
    from tilelang_corpus.attention_mha_fwd_bhsd import flashattn

    fn = flashattn.jit_fn
    func = fn.get_tir(b, h, s, s, d, causal, block_M=128, block_N=128, num_stages=2, threads=256)
    k = tilecore.compile(func, target="cuda", out_idx=[3], pass_configs={"tilecore.fast_math": True, **configs})
    return k, tilecore_cuda.lowering_path(k)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rep", type=int, default=5)
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"corpus_attention: needs torch with CUDA ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("corpus_attention: no CUDA GPU here; run it on a GPU machine (see docs/performance.md)", file=sys.stderr)
        return 2
    b, h, s, d = args.batch, args.heads, args.seq, args.dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    print(f"TileLang example_mha_fwd_bhsd, fp16 b{b} h{h} s{s} d{d}, fast math, on {torch.cuda.get_device_name()}")
    print(f"{'causal':>6} {'path':>18} {'TFLOP/s':>8} {'cuDNN':>7} {'flash':>7} {'/ best':>7} {'max err':>9} {'compile s':>9}")
    for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]:
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        theirs = {}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    theirs[name] = flops / cuda_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                                   args.rep) / 1e9
            except RuntimeError as e:
                theirs[name] = float("nan")
                print(f"SDPA {name}: unavailable ({str(e).splitlines()[0]})", file=sys.stderr)
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        top = max((x for x in theirs.values() if x == x), default=float("nan"))
        for label, configs in PATHS.items():
            t0 = time.perf_counter()
            kern, path = corpus_kernel(b, h, s, d, causal, configs)
            compile_s = time.perf_counter() - t0
            err = float((kern(q, k, v).float() - ref).abs().max())
            tf = flops / cuda_ms(lambda: kern(q, k, v), args.rep) / 1e9
            print(f"{str(causal):>6} {label:>18} {tf:8.1f} {theirs['cudnn']:7.1f} {theirs['flash']:7.1f} "
                  f"{tf / top:6.3f}x {err:9.2e} {compile_s:9.2f}   ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
