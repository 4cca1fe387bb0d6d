"""TileLang's GQA backward example's forward kernel (tests/tilelang_corpus/attention_gqa_bwd.py ``flashattn_fwd``,
kernel code as TileLang wrote it: 128x64 blocks, two consumer warpgroups, one stage, O and the log2-sum-exp stored,
fast math) on a CUDA GPU: the core's general path (``tilecore.cuda.register_programs=False``), the route's default
and, where the plugin still has it, the WGMMA register program (True), against SDPA cuDNN, same process.

    python benchmarks/corpus_gqa_fwd.py [--batch 8 --heads 32 --groups 8 --seq 4096 --dim 128]
        [--variants general,default,regprog] [--rounds 11] [--inner-rep 10] [--shuffle 86] [--causal both]

Every variant's output (O and lse) is checked against a float64 reference on the first batch entry (the example's
causal mask aligned to the start, ``attention_ref``); then every kernel and cuDNN are timed ``--rounds`` rounds in a
fresh random order each round (``--shuffle SEED``, D81) as the median of ``--inner-rep`` calls between CUDA events.
Prints TFLOP/s medians (4 b h s^2 d, half causal), each variant against cuDNN and against ``general`` of the same
rounds. A variant the plugin refuses is reported and left out. Exits 2 where no CUDA GPU is present, 1 where a
variant's error is above 0.05.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

VARIANTS = {"general": {"tilecore.cuda.register_programs": False}, "default": {},
            "regprog": {"tilecore.cuda.register_programs": True}}


def corpus_kernel(args, causal: bool, configs: dict):
    import tilecore
    from tilelang_corpus.attention_gqa_bwd import flashattn_fwd

    func = flashattn_fwd.get_tir(args.batch, args.heads, args.seq, args.dim, args.dim, causal, 128, 64,
                                        args.groups)
    return tilecore.compile(func, target="cuda", out_idx=[3, 4],
                            pass_configs={"tilecore.fast_math": True, **configs})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--groups", type=int, default=8, help="query heads per KV head (the example's 8)")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--variants", default="general,default", help=f"among {', '.join(VARIANTS)}")
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--inner-rep", type=int, default=10)
    ap.add_argument("--shuffle", type=int, default=86, metavar="SEED")
    args = ap.parse_args()
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {', '.join(bad)}; choose among {', '.join(VARIANTS)}")
    from _bench import require_cuda

    if not require_cuda("corpus_gqa_fwd"):
        return 2
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tilecore
    import tilecore_cuda
    from cuda_attention import cuda_ms
    from tilelang_corpus._driver import attention_lse2, attention_ref

    b, h, s, d, g = args.batch, args.heads, args.seq, args.dim, args.groups
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.float16, generator=gen)
    k, v = (torch.randn(b, s, h // g, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(2))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    dev = torch.cuda.get_device_name()
    print(f"TileLang example_gqa_bwd's flashattn_fwd, fp16 b{b} h{h} kv{h // g} s{s} d{d}, 128x64, fast math, on {dev}")
    timed, errs, paths, failed = {}, {}, {}, 0
    for causal in causals:
        ref_o = attention_ref(q[:1], k[:1], v[:1], causal, "bshd", g)
        ref_l = attention_lse2(q[:1].cpu(), k[:1].cpu(), causal, "bshd", g)
        for var in variants:
            try:
                kern = corpus_kernel(args, causal, VARIANTS[var])
            except tilecore.errors.TilecoreError as e:
                print(f"causal={causal} {var}: not compiled ({type(e).__name__}: {str(e)[:300]})")
                continue
            paths[(causal, var)] = tilecore_cuda.lowering_path(kern)
            o, lse = kern(q, k, v)
            eo = float((o[:1].double() - ref_o).abs().max())
            el = float((lse[:1].double().cpu() - ref_l).abs().max())
            errs[(causal, var)] = (eo, el)
            failed += not (eo < 0.05 and el < 0.05)
            timed[(causal, var)] = (lambda kern=kern: kern(q, k, v))

        def cudnn(causal=causal):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)
        timed[(causal, "cuDNN")] = cudnn
    torch.cuda.synchronize()
    times = {key: [] for key in timed}
    order = list(timed.items())
    shuffler = random.Random(args.shuffle)
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        now = order[:]
        shuffler.shuffle(now)
        for key, fn in now:
            times[key].append(cuda_ms(fn, args.inner_rep))
    print(f"timed {args.rounds} shuffled rounds (seed {args.shuffle}) in {time.perf_counter() - t0:.1f} s")
    print(f"| causal | variant | path | TFLOP/s median (range) | / cuDNN | / general | max err O, lse |")
    print("|---|---|---|---|---|---|---|")
    for causal in causals:
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        med = {var: statistics.median(times[(causal, var)]) for var in [*variants, "cuDNN"] if (causal, var) in times}
        for var, ms in med.items():
            tf = [flops / t / 1e9 for t in times[(causal, var)]]
            gen_ratio = f"{med['general'] / ms:.3f}" if "general" in med else "-"
            err = errs.get((causal, var))
            print(f"| {causal} | {var} | {paths.get((causal, var), 'SDPA cuDNN')} | {statistics.median(tf):.1f} "
                  f"({min(tf):.1f}-{max(tf):.1f}) | {med['cuDNN'] / ms:.3f} | {gen_ratio} | "
                  f"{'-' if err is None else f'{err[0]:.4f}, {err[1]:.4f}'} |")
    if failed:
        print(f"{failed} kernel(s) with an error above 0.05 against float64")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
