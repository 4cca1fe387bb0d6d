"""FlashAttention on sm_90a's general path (D77-D86): the route's default and the general path's options against SDPA
cuDNN, every form in one process, with issue 17's bars (the WGMMA register program, D77-D83's reference, retired in
D86).

    python benchmarks/fa_route.py [--rounds 11] [--inner-rep 10] [--forms d64,d128,d128x176,gqa,d256,d128x64]
        [--batch 8 --heads 32 --seq 4096] [--variants default,general] [--workers 8]

The kernel is the conformance catalog's FlashAttention forward (``flash_attention_forward``, TileLang's form), fp16,
at each form's block (``FORMS``: d64 / d128 / GQA with 8 KV heads at 128x128, d128 at 128x176 (issue 17's exact row),
d256 at 128x64, d128 at 64x64 with one consumer warpgroup; d64 / d256 at 64x64, d64 at 128x176 and GQA at 128x64 (the
TileLang GQA backward example's forward block, D86) when asked), causal and not, the exact build and fast math.
Variants (``VARIANTS``): ``default`` = the route as it compiles by default, ``general`` =
``tilecore.cuda.register_programs=False`` (the core's general path with the core's own defaults: the same kernel but
where the route sets a form's defaults, D82's d256 at 64x64), and the general path's options of D81-D83. Every kernel
is compiled first (worker processes fill the kernel cache, then this process loads them), checked against SDPA
cuDNN's output, then every kernel and cuDNN (one per shape and mask) are timed in turn ``--rounds`` rounds, the order
reversed every other round or shuffled (``--shuffle``; each time the median of ``--inner-rep`` calls between CUDA
events); the table gives medians and ranges, each against cuDNN of the same rounds, ``default / general``, the path
the default route takes, and issue 17's bar: d128 non-causal at least 680 TFLOP/s with fast math and 560 in the exact
build, causal at least 0.95x cuDNN (the bar's rows; d64, d256, GQA and 64x64 carry none). D77-D83 compared the
general path with the WGMMA register program here (``regprog``), retired in D86.
Exits with code 2 and a clear message where no CUDA GPU is present.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

#: name -> (head dimension, KV heads or None, block rows, key block, threads)
FORMS = {"d64": (64, None, 128, 128, 256), "d128": (128, None, 128, 128, 256), "d128x176": (128, None, 128, 176, 256),
         "gqa": (128, 8, 128, 128, 256), "d256": (256, None, 128, 64, 256), "d128x64": (128, None, 64, 64, 128),
         "d64x64": (64, None, 64, 64, 128), "d256x64": (256, None, 64, 64, 128), "d64x176": (64, None, 128, 176, 256),
         "gqax64": (128, 8, 128, 64, 256)}
#: the forms timed when --forms is not given (the issue's rows at their blocks, and one consumer warpgroup at d128)
DEFAULT_FORMS = ("d64", "d128", "d128x176", "gqa", "d256", "d128x64")
#: (D86: the WGMMA register program, the variant ``regprog`` of D77-D83's rounds, is retired; ``default`` and
#: ``general`` are compared with cuDNN; the other variants are the general path's options, against ``general``)
VARIANTS = {"general": {"tilecore.cuda.register_programs": False}, "default": {},
            # D81 (d64 with two consumer warpgroups): the general path with descriptor offsets (the gemms of ping-pong's
            # turn issued back to back: at d64 P @ V's m64n64 instructions are as short as the descriptor arithmetic
            # between them), without them (the form's kernel before D81), with 32-bit loop counters too, and the causal
            # form's masked iterations in a loop of their own with offsets (D74's "loops")
            "desc": {"tilecore.cuda.register_programs": False, "tilecore.cuda.descriptor_offsets": True},
            "nodesc": {"tilecore.cuda.register_programs": False, "tilecore.cuda.descriptor_offsets": False},
            "descn": {"tilecore.cuda.register_programs": False, "tilecore.cuda.descriptor_offsets": True,
                      "tilecore.cuda.narrow_loop_counters": True},
            "loops_desc": {"tilecore.cuda.register_programs": False, "tilecore.cuda.descriptor_offsets": True,
                           "tilecore.pipeline_mask_unswitch": "loops"},
            # D81: D74's masked loop without the fact of its variable's bound (its mask's edge tests kept: before D81)
            "nobound": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_masked_loop_bound": False},
            # D82: the general path with a producer warpgroup issuing the bulk copies (tilecore.warp_specialize=True;
            # "auto" specializes only two consumer warpgroups): one consumer warpgroup at 64x64 as the register program
            "ws": {"tilecore.cuda.register_programs": False, "tilecore.warp_specialize": True},
            # D82: and O by bulk tile stores (the route's defaults for d256 at 64x64)
            "wsb": {"tilecore.cuda.register_programs": False, "tilecore.warp_specialize": True,
                    "tilecore.bulk_store": True},
            # D82: and the block's exit waits only for the bulk stores' reads of block memory
            "wsbr": {"tilecore.cuda.register_programs": False, "tilecore.warp_specialize": True,
                     "tilecore.bulk_store": True, "tilecore.bulk_store_exit_wait": "read"},
            # D83 (d128's exact build at 128x176): the general path's kernel again (a noise estimate: the same kernel
            # timed as a second row); P @ V's descriptors as offsets (tilecore.cuda.descriptor_offsets "registers"),
            # alone and with the masked iterations in a loop of their own (D74's "loops"); D74's loops + offsets
            "general2": {"tilecore.cuda.register_programs": False},
            # D83's defaults at d128 exact 128x176 off: D77's kernel there (D70's one loop, no descriptor offsets)
            "d77": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_mask_unswitch": True,
                    "tilecore.cuda.descriptor_offsets": False},
            "regs": {"tilecore.cuda.register_programs": False, "tilecore.cuda.descriptor_offsets": "registers"},
            "loops_regs": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_mask_unswitch": "loops",
                           "tilecore.cuda.descriptor_offsets": "registers"},
            # D83 round 2: O by direct stores (tilecore.bulk_store_attention False: at 128x176 the bulk store's staging
            # tile does not fit beside the stages whole, so O goes out in two halves, each written, fenced and stored
            # behind a barrier of both consumer warpgroups), alone and with loops_regs
            "direct": {"tilecore.cuda.register_programs": False, "tilecore.bulk_store_attention": False},
            "loops_regs_direct": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_mask_unswitch": "loops",
                                  "tilecore.cuda.descriptor_offsets": "registers",
                                  "tilecore.bulk_store_attention": False},
            # D83: O's staging tile over Q's, dead after the loop (tilecore.bulk_store_reuse): the whole tile at once,
            # three barriers instead of five, 214 KB instead of 230 at 128x176; with loops_regs
            "reuse": {"tilecore.cuda.register_programs": False, "tilecore.bulk_store_reuse": True},
            "loops_regs_reuse": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_mask_unswitch": "loops",
                                 "tilecore.cuda.descriptor_offsets": "registers", "tilecore.bulk_store_reuse": True},
            # D87 (exact causal): the default route with the blocks in grid order (D54's heaviest first off), with
            # sections of 16 / 4 heads; the masked iterations in a loop of their own (D74) with D81's bound
            "hf_off": {"tilecore.heaviest_first": False}, "hf16": {"tilecore.heaviest_first": 16},
            "hf4": {"tilecore.heaviest_first": 4}, "loops": {"tilecore.pipeline_mask_unswitch": "loops"},
            "default2": {},
            # D87 round 2: O's rescale in the next turn (tilecore.pipeline_scale_in_turn), the row maximum as four
            # partial chains in the exact build too (tilecore.reduce_chains=4), both
            "sit": {"tilecore.pipeline_scale_in_turn": True}, "ch4": {"tilecore.reduce_chains": 4},
            "sit_ch4": {"tilecore.pipeline_scale_in_turn": True, "tilecore.reduce_chains": 4},
            # and P @ V's descriptor offsets (D83's "registers") / every gemm's (True)
            "rsc": {"tilecore.pipeline_scale_in_turn": True, "tilecore.reduce_chains": 4,
                    "tilecore.cuda.descriptor_offsets": "registers"},
            "dsc": {"tilecore.pipeline_scale_in_turn": True, "tilecore.reduce_chains": 4,
                    "tilecore.cuda.descriptor_offsets": True}}
TARGET = "cuda:sm_90a"
#: issue 17's absolute bars (TFLOP/s) for d128's non-causal rows, by build; causal rows: 0.95x cuDNN
BAR_TFLOPS = {True: 680.0, False: 560.0}
BAR_CAUSAL = 0.95


def build_func(args, form: str, causal: bool):
    from tilecore_conformance.composite import flash_attention_forward

    d, kv, bm, bn, threads = FORMS[form]
    return flash_attention_forward(args.seq, d, args.heads, bm, bn, "float16", causal, batch=args.batch,
                                   threads=threads, num_stages=2, kv_heads=kv)


def configs(variant: str, fast: bool) -> dict:
    return {"tilecore.fast_math": fast, **VARIANTS[variant]}


def _precompile(job):
    """A worker: compile one kernel into the kernel cache (NVRTC, no GPU); returns (job, seconds, error)."""
    args, form, causal, fast, variant = job
    t = time.perf_counter()
    try:
        import tilecore

        tilecore.compile(build_func(args, form, causal), target=TARGET, out_idx=[3], pass_configs=configs(variant, fast))
        return job, time.perf_counter() - t, None
    except Exception as e:  # noqa: BLE001 - reported; this process compiles it again and says why
        return job, time.perf_counter() - t, f"{type(e).__name__}: {str(e)[:200]}"


def default_path(args, form: str, causal: bool, fast: bool) -> str:
    """The path the default route takes for the row (lowering only)."""
    import tilecore_cuda
    from tilecore.compiler import lower

    attrs = lower(build_func(args, form, causal), TARGET, {"tilecore.fast_math": fast})[2].attrs

    class _K:
        meta = {"attrs": attrs}

    path = tilecore_cuda.lowering_path(_K)
    return "general" if path == "generic" else path


def _path_job(job):
    """A worker: ((form, causal, fast), the default route's path)."""
    args, form, causal, fast = job
    try:
        return (form, causal, fast), default_path(args, form, causal, fast)
    except Exception as e:  # noqa: BLE001 - shown in the table
        return (form, causal, fast), f"error: {type(e).__name__}"


def bar_of(form: str, causal: bool, fast: bool):
    """("tflops", value) / ("cudnn", ratio) / None: issue 17's bar for the row."""
    if form not in ("d128", "d128x176"):
        return None
    return ("cudnn", BAR_CAUSAL) if causal else ("tflops", BAR_TFLOPS[fast])


def meets(bar, tf: float, cudnn: float) -> bool:
    kind, v = bar
    return tf >= v if kind == "tflops" else tf >= v * cudnn


def report(args, rows, variants, times, paths, errs, device: str) -> None:
    """The table (and the rule's summary) from ``times`` (milliseconds by key: ``("cuDNN", d, kv, causal)`` or
    ``(form, causal, fast, variant)``), ``paths`` (the default route's path by row) and ``errs`` (max errors)."""
    b, h, s = args.batch, args.heads, args.seq

    def tflops(key, d, causal):
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        ts = [flops / t / 1e9 for t in times[key]]
        return statistics.median(ts), min(ts), max(ts)

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"FlashAttention forward fp16 b{b} h{h} s{s} on {device}: the general "
                        f"path (D86: the WGMMA register program retired), SDPA cuDNN; {args.rounds} interleaved rounds "
                        "(medians)")
    both = "default" in variants and "general" in variants
    for col in ("form", "block", "causal", "build", *[f"{v} TFLOP/s (range)" for v in variants], "cuDNN",
                *[f"{v} / cuDNN" for v in variants], *(["default / general"] if both else []), "default route",
                "issue 17 bar", "max err"):
        table.add_column(col, justify="right")
    for f, c, x in rows:
        d, kv, bm, bn, _ = FORMS[f]
        cud = tflops(("cuDNN", d, kv, c), d, c)[0]
        tf = {v: tflops((f, c, x, v), d, c) for v in variants if (f, c, x, v) in times}
        bar = bar_of(f, c, x)
        bar_text = "-"
        main_v = "default" if "default" in tf else ("general" if "general" in tf else None)
        if bar is not None and main_v is not None:
            want = f">= {bar[1]:.0f}" if bar[0] == "tflops" else f">= {bar[1]}x cuDNN"
            bar_text = f"{want}: {main_v} {'met' if meets(bar, tf[main_v][0], cud) else 'NOT met'}"
        dg = (f"{tf['default'][0] / tf['general'][0]:.3f}x" if "default" in tf and "general" in tf else "-")
        table.add_row(f, f"{bm}x{bn}", "causal" if c else "-", "fast" if x else "exact",
                      *[f"{tf[v][0]:.1f} ({tf[v][1]:.0f}-{tf[v][2]:.0f})" if v in tf else "-" for v in variants],
                      f"{cud:.1f}", *[f"{tf[v][0] / cud:.3f}x" if v in tf else "-" for v in variants],
                      *([dg] if both else []), paths[(f, c, x)], bar_text,
                      " ".join(f"{errs[(f, c, x, v)]:.1e}" for v in variants if v in tf))
        extra = [v for v in tf if v not in ("general", "default")]
        print(f"{f} {bm}x{bn} causal={c} fast={x}: " + ", ".join(f"{v} {tf[v][0]:.1f}" for v in tf)
              + f", cuDNN {cud:.1f}; " + ", ".join(f"{v}/cuDNN {tf[v][0] / cud:.3f}" for v in tf)
              + (f", default/general {dg}" if "default" in tf and "general" in tf else "")
              + "".join(f", {v}/general {tf[v][0] / tf['general'][0]:.3f}" for v in extra if "general" in tf)
              + f" (default route: {paths[(f, c, x)]}); bar {bar_text}", file=sys.stderr)
    Console(width=250).print(table)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--forms", default=",".join(DEFAULT_FORMS), help=f"comma-separated among {', '.join(FORMS)}")
    ap.add_argument("--variants", default="default,general", help=f"comma-separated among {', '.join(VARIANTS)}")
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--builds", default="exact,fast", help="exact, fast or both (comma-separated)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--inner-rep", type=int, default=10)
    ap.add_argument("--reverse", action="store_true",
                    help="time the kernels in the reverse order (the first round starts from the last row; D81: a "
                         "second process with this flag for both orders)")
    ap.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                    help="a fresh random order every round (seeded) instead of the order and its reverse: D81 found the "
                         "kernel timed right after the cuDNN block (the first of the order) 3-10%% slow in every round")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                    help="processes compiling into the kernel cache first (0: compile here, one by one)")
    args = ap.parse_args()
    forms = args.forms.split(",")
    variants = args.variants.split(",")
    builds = args.builds.split(",")
    if "regprog" in variants:
        ap.error("variant regprog: the WGMMA register program is retired (docs/decisions.md D86): every form runs on "
                 "the general path; compare default / general (and the general path's options) with cuDNN")
    bad = [f for f in forms if f not in FORMS] + [v for v in variants if v not in VARIANTS] + \
        [b for b in builds if b not in ("exact", "fast")]
    if bad:
        ap.error(f"unknown {', '.join(bad)}; forms: {', '.join(FORMS)}; variants: {', '.join(VARIANTS)}; "
                 "builds: exact, fast")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _bench import require_cuda

    if not require_cuda("fa_route"):
        return 2
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tilecore

    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    fasts = [b == "fast" for b in builds]
    rows = [(f, c, x) for f in forms for c in causals for x in fasts]
    jobs = [(args, f, c, x, v) for f, c, x in rows for v in variants]
    t0 = time.perf_counter()
    paths = {}
    if args.workers > 0:
        with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
            found = pool.map(_path_job, [(args, *r) for r in rows])
            for job, sec, err in pool.map(_precompile, jobs):
                if err:
                    print(f"precompile {job[1:]}: {err}", file=sys.stderr)
            paths = dict(found)
    print(f"precompiled {len(jobs)} kernels in {time.perf_counter() - t0:.1f} s ({args.workers} workers)",
          file=sys.stderr)
    b, h, s = args.batch, args.heads, args.seq
    g = torch.Generator(device="cuda").manual_seed(0)
    tensors = {}
    for f in forms:
        d, kv = FORMS[f][:2]
        if (d, kv) not in tensors:
            q = torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=g)
            k, v = (torch.randn(b, kv or h, s, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
            tensors[(d, kv)] = (q, k, v)

    def sdpa(d, kv, causal):
        q, k, v = tensors[(d, kv)]
        extra = {"enable_gqa": True} if kv else {}
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra)

    timed, refs, outs = {}, {}, {}
    for f, c, x in rows:
        d, kv = FORMS[f][:2]
        if (d, kv, c) not in refs:
            fn = sdpa(d, kv, c)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                outs[(d, kv, c)] = fn()

            def ref(fn=fn):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return fn()
            refs[(d, kv, c)] = ref
            timed[("cuDNN", d, kv, c)] = ref
    hits = 0
    errs = {}
    for f, c, x in rows:
        d, kv = FORMS[f][:2]
        q, k, v = tensors[(d, kv)]
        if (f, c, x) not in paths:
            paths[(f, c, x)] = default_path(args, f, c, x)
        for var in variants:
            try:
                kern = tilecore.compile(build_func(args, f, c), target=TARGET, out_idx=[3],
                                        pass_configs=configs(var, x))
            except tilecore.errors.TilecoreError as e:
                print(f"{f} causal={c} fast={x} {var}: not compiled ({type(e).__name__}: {str(e)[:200]})",
                      file=sys.stderr)
                continue
            hits += bool(kern.meta.get("from_cache"))
            out = kern(q, k, v)
            errs[(f, c, x, var)] = float((out.float() - outs[(d, kv, c)].float()).abs().max())
            timed[(f, c, x, var)] = (lambda kern=kern, q=q, k=k, v=v: kern(q, k, v))
    torch.cuda.synchronize()
    print(f"all kernels ready at {time.perf_counter() - t0:.1f} s ({hits} of {len(jobs)} from the cache)", file=sys.stderr)
    from cuda_attention import cuda_ms

    order = list(timed.items())[::-1] if args.reverse else list(timed.items())
    times = {key: [] for key in timed}
    import random

    shuffler = random.Random(args.shuffle) if args.shuffle is not None else None
    for r in range(args.rounds):
        if shuffler is not None:
            now = order[:]
            shuffler.shuffle(now)
        else:
            now = order if r % 2 == 0 else order[::-1]
        for key, fn in now:
            times[key].append(cuda_ms(fn, args.inner_rep))
    print(f"timed {args.rounds} rounds at {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    report(args, rows, variants, times, paths, errs, torch.cuda.get_device_name())
    bad_err = [k for k, e in errs.items() if not e < 0.05]
    if bad_err:
        print(f"max error against cuDNN above 0.05: {bad_err}")
    missing = len(jobs) - len(errs)
    if missing:
        print(f"{missing} kernels not compiled (above)")
    return 1 if bad_err or missing else 0


if __name__ == "__main__":
    sys.exit(main())
