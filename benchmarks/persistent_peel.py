"""Decision D50: the persistent Hopper GEMM with every k step in its loop (the default) against the form before, its
last k step peeled off the loop (D34 - D48), in one process.

    python benchmarks/persistent_peel.py [--repeat 5] [--rep 20] [--sizes 4096,8192] [--dtypes float16,bfloat16]
                                         [--configs 128:256:64:256:4:8,128:256:64:256:3:8] [--no-gpu]

`tc_persistent.cuh` (the CUDA plugin's persistent GEMM) ran a tile's k steps as a loop over all but the last, then
the last once more after the loop (its own `wgmma.wait_group 0`, both stages released); NVVM and ptxas compiled the
main loop's body three times for it (12 HGMMA in the SASS of the 128x256x64 GEMM). Since D50 every k step is in the
loop, then `wgmma.wait_group 0` and the last stage's release (D48's probe form, the per-tile pipeline's).

The form before is made by rewriting the persistent prelude's text as the CUDA plugin's code generator returns it
(`peel`; nothing else in the plugin changes; where the prelude no longer has the expected text it says so and exits
2; the text before D50 compiles to the same cubin as the tree before). A third form keeps the one loop but leaves
both k loops to NVVM's unrolling (D50 also adds `#pragma unroll 1` to the producer's and the consumers' k loops).
Per form: the compile's CPU time (min / median of ``--repeat`` compiles, tilecore's and NVRTC's caches off,
alternating), the SASS instruction, HGMMA and local-memory (STL/LDL) counts; on a GPU, per size, dtype and
configuration, both forms' TFLOP/s with torch.matmul (cuBLAS) in the same run, whether the two forms' results are
the same bits, and the largest difference from cuBLAS relative to C's largest element.
(benchmarks/cold_compile.py's ``peeled`` variant is the same rewrite in fresh processes.)
``--mainloop``: instead, tc_hopper.cuh's tc_wgmma_mainloop (one block per tile; split-K, the few-tile default) with
its two k loops left to NVVM's unrolling (the default) and not (`#pragma unroll 1`, measured in D50 and not taken):
compile CPU, SASS, us per call, same bits.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: the consumer's k loop before D50 (peeled) and since (in the loop), as tc_persistent.cuh spells them
PEELED = """      /* all k steps but the last keep one group in flight and release the stage before theirs */
      for (int kt = 0; kt < k_tiles - 1; ++kt, ++it) {
        step(it);
        tc_wgmma_wait<1>();
        if (kt > 0) release((it - 1) % STAGES);
      }
      /* the last waits for its own group (the epilogue reads the accumulators: D29's ptxas hazard) and releases
       * both stages at once, so the next tile's loads start under this tile's epilogue */
      if (k_tiles > 0) {
        step(it);
        tc_wgmma_wait<0>();
        if (k_tiles > 1) release((it - 1) % STAGES);
        release(it % STAGES);
        ++it;
      }
"""
IN_LOOP = """      /* every k step keeps one group in flight and releases the stage before its own; one copy of the main loop
       * (a peeled last step made NVVM and ptxas emit it three times, and NVVM unrolled the loop twice:
       * docs/decisions.md D48, D50; CUTLASS's Hopper main loops are not unrolled either) */
#pragma unroll 1
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        step(it);
        tc_wgmma_wait<1>();
        if (kt > 0) release((it - 1) % STAGES);
      }
      /* then the last group, before the epilogue reads the accumulators (D29's ptxas hazard), and its stage, so the
       * next tile's loads start under this tile's epilogue */
      tc_wgmma_wait<0>();
      if (k_tiles > 0) release((it - 1) % STAGES);
"""
#: the producer's k loop: not unrolled since D50
PRODUCER_NO_UNROLL = "#pragma unroll 1 /* one copy of the loads (NVVM unrolled them 4 times: 208 more SASS instructions; D50) */\n"
CONSUMER_NO_UNROLL = "#pragma unroll 1\n      for (int kt = 0; kt < k_tiles; ++kt, ++it) {"
FORMS = ("before D50 (peeled, unrolled)", "one loop, unrolled", "one loop, not unrolled (D50)")
CONFIGS = "128:256:64:256:4:8,128:256:64:256:3:8"


def peel(prelude, form: str = FORMS[0]):
    """``prelude`` (tilecore_cuda.codegen.prelude) returning the persistent GEMM in ``form``: its k loops left to
    NVVM's unrolling, and for FORMS[0] its last k step peeled as well (the text before D50)."""

    def rewritten(*a, **k):
        text = prelude(*a, **k)
        if k.get("persistent") and form != FORMS[2]:
            if text.count(IN_LOOP) != 1 or text.count(PRODUCER_NO_UNROLL) != 1:
                raise SystemExit("persistent_peel.py: tc_persistent.cuh no longer has the k loops this benchmark "
                                 "rewrites; it is out of date")
            text = text.replace(PRODUCER_NO_UNROLL, "")
            if form == FORMS[0]:
                text = text.replace(IN_LOOP, PEELED)
            else:
                text = text.replace(CONSUMER_NO_UNROLL, CONSUMER_NO_UNROLL.split("\n", 1)[1])
        return text

    return rewritten


#: tc_wgmma_mainloop's (per-tile and split-K kernels) two k loops, which NVVM unrolls (D50 measured them not
#: unrolled and kept the unrolling: split-K 0.3-1.9% slower on the H100)
MAINLOOP_K_LOOP = re.compile(r"^(?=[ ]*for \(int kt = 0; kt < \(int\)k_tiles; \+\+kt\) \{)", re.M)
MAINLOOP_FORMS = ("unrolled by NVVM (the default)", "not unrolled (#pragma unroll 1)")


def install_mainloop(form: str) -> None:
    """The code generator's prelude with tc_wgmma_mainloop's k loops as they are (MAINLOOP_FORMS[0]) or with
    ``#pragma unroll 1`` before each (MAINLOOP_FORMS[1])."""
    import tilecore_cuda.codegen as cg

    original = getattr(cg, "_d50_original_prelude", None) or cg.prelude
    cg._d50_original_prelude = original

    def rewritten(*a, **k):
        text = original(*a, **k)
        if len(MAINLOOP_K_LOOP.findall(text)) != 2:
            raise SystemExit("persistent_peel.py: tc_hopper.cuh's tc_wgmma_mainloop no longer has the two k loops "
                             "this benchmark rewrites; it is out of date")
        return MAINLOOP_K_LOOP.sub("#pragma unroll 1\n", text)

    cg.prelude = rewritten if form == MAINLOOP_FORMS[1] else original


def mainloop(args) -> int:
    """--mainloop: tc_wgmma_mainloop's kernels (one block per tile, split-K with its default sum) as they are vs
    their k loops not unrolled."""
    import tilecore
    import torch
    from cuda_gemm import event_ms, has_gpu, matmul, split_k_of

    cases = [("one block per tile", 4096, 4096, 4096, (128, 256, 64, 256, 4, 8), {"tilecore.cuda.persistent": False}),
             ("one block per tile", 8192, 8192, 8192, (128, 256, 64, 256, 4, 8), {"tilecore.cuda.persistent": False}),
             ("split-K (default)", 128, 4096, 4096, (128, 256, 64, 256, 4, 0), {}),
             ("split-K (default)", 16, 8192, 8192, (128, 256, 64, 256, 4, 0), {}),
             ("split-K (default)", 128, 4096, 14336, (128, 256, 64, 256, 4, 0), {})]
    ok, why = (False, "--no-gpu") if args.no_gpu else has_gpu()
    print()
    print("tc_wgmma_mainloop (per-tile and split-K kernels): compile CPU s (min of 3), SASS, and on a GPU us per call")
    print()
    print("| kernel | M x N x K | dtype | splits | " + " | ".join(f"{f}: CPU s / SASS / HGMMA / us" for f in MAINLOOP_FORMS) +
          " | not unrolled / unrolled (time) | same bits | cuBLAS us |")
    print("|---|---|---|---|---|---|---|---|---|")
    bad = 0
    for name, M, N, K, cfg, extra in cases:
        for dtype in [d for d in args.dtypes.split(",") if d]:
            res, outs = {}, {}
            if ok:
                tdt = getattr(torch, dtype)
                torch.manual_seed(0)
                A = torch.randn(M, K, device="cuda", dtype=tdt)
                B = torch.randn(K, N, device="cuda", dtype=tdt)
                ref_us = event_ms(lambda: torch.matmul(A, B), args.rep) * 1e3
            for f in MAINLOOP_FORMS:
                install_mainloop(f)
                cpu = []
                for _ in range(3):
                    t0 = time.process_time()
                    k = tilecore.compile(matmul(M, N, K, *cfg[:5], cfg[5], dtype=dtype), target="cuda:sm_90a",
                                         pass_configs={"tilecore.disable_cache": True,
                                                       "tilecore.extra_flags": ["--no-cache"], **extra})
                    cpu.append(time.process_time() - t0)
                n, h, _ = counts(k)
                us = float("nan")
                if ok:
                    C = torch.empty(M, N, device="cuda", dtype=tdt)
                    us = event_ms(lambda: k(A, B, C), args.rep) * 1e3
                    C.zero_()
                    k(A, B, C)
                    torch.cuda.synchronize()
                    outs[f] = C.clone()
                res[f] = (min(cpu), n, h, us, split_k_of(k))
            same = "n/a" if not ok else ("yes" if torch.equal(outs[MAINLOOP_FORMS[0]], outs[MAINLOOP_FORMS[1]]) else "NO")
            bad += same == "NO"
            b, a = res[MAINLOOP_FORMS[0]], res[MAINLOOP_FORMS[1]]
            print(f"| {name} | {M}x{N}x{K} | {dtype} | {a[4]} | " +
                  " | ".join(f"{r[0]:.3f} / {r[1]} / {r[2]} / {r[3]:.2f}" for r in (b, a)) +
                  f" | {a[3] / b[3]:.3f} | {same} | {ref_us if ok else float('nan'):.2f} |", flush=True)
    install_mainloop(MAINLOOP_FORMS[0])
    return 1 if bad else 0


def install(form: str) -> None:
    import tilecore_cuda.codegen as cg

    original = getattr(cg, "_d50_original_prelude", None) or cg.prelude
    cg._d50_original_prelude = original
    cg.prelude = peel(original, form) if form != FORMS[2] else original


def build(form: str, cfg, size: int, dtype: str = "float16"):
    import tilecore
    from cuda_gemm import matmul

    install(form)
    bm, bn, bk, threads, stages, panel = cfg
    t = time.process_time()
    k = tilecore.compile(matmul(size, size, size, bm, bn, bk, threads, stages, panel, dtype=dtype),
                         target="cuda:sm_90a",
                         pass_configs={"tilecore.disable_cache": True, "tilecore.extra_flags": ["--no-cache"]})
    return k, time.process_time() - t


def counts(k) -> tuple:
    import tilecore_cuda

    try:
        text = tilecore_cuda.CUDABackend().disassemble(k.binary, "cuda:sm_90a")
    except BaseException as e:  # noqa: BLE001 - no cuobjdump: the timings still stand
        return (f"n/a ({type(e).__name__})",) * 3
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("/*") and ";" in ln]
    return (len(lines), sum("HGMMA" in ln for ln in lines),
            sum((" STL" in ln or " LDL" in ln) for ln in lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="compiles per form for the CPU time")
    ap.add_argument("--rep", type=int, default=20, help="launches per timing batch")
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--configs", default=CONFIGS, help="block_M:block_N:block_K:threads:stages:panel,...")
    ap.add_argument("--no-gpu", action="store_true", help="compile times and SASS only")
    ap.add_argument("--mainloop", action="store_true", help="instead: tc_wgmma_mainloop's kernels (one block per "
                    "tile, split-K) with their k loops unrolled by NVVM (the default) and not")
    args = ap.parse_args()
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",") if c]
    import tilecore_cuda.compiler as cc

    if not cc.nvrtc_usable():
        print("persistent_peel.py: NVRTC is not usable here")
        return 3
    if args.mainloop:
        return mainloop(args)
    t_start = time.perf_counter()
    cfg0 = configs[0]
    build(FORMS[2], cfg0, 4096)  # the process's first compile (NVRTC's start-up) is not measured
    cpu = {f: [] for f in FORMS}
    kernels = {}
    for _ in range(args.repeat):
        for f in FORMS:
            k, s = build(f, cfg0, 4096)
            cpu[f].append(s)
            kernels[f] = k
    print(f"persistent GEMM matmul(4096^3, {cfg0}), {cc.toolchain()}, {args.repeat} compiles a form, alternating, "
          "caches off; CPU seconds of tilecore.compile")
    print()
    print("| form | compile CPU s: min / median | build (NVRTC) s: last | SASS instructions | HGMMA | STL/LDL |")
    print("|---|---|---|---|---|---|")
    for f in FORMS:
        n, h, local = counts(kernels[f])
        print(f"| {f} | {min(cpu[f]):.3f} / {statistics.median(cpu[f]):.3f} | "
              f"{kernels[f].compile_times.get('build', float('nan')):.3f} | {n} | {h} | {local} |")
    print(f"(compiles: {time.perf_counter() - t_start:.1f} s)", file=sys.stderr)
    from cuda_gemm import event_ms, has_gpu

    ok, why = (False, "--no-gpu") if args.no_gpu else has_gpu()
    if not ok:
        print(f"\nno GPU run: {why}")
        return 0
    import torch

    print()
    print("| size | dtype | config (bM, bN, bK, threads, stages, panel) | " + " | ".join(f"{f} TFLOP/s" for f in FORMS) +
          " | D50 / before | same bits | max diff vs cuBLAS / max C | cuBLAS TFLOP/s |")
    print("|---|---|---|" + "---|" * len(FORMS) + "---|---|---|---|")
    bad = 0
    for size in [int(s) for s in args.sizes.split(",") if s]:
        for dtype in [d for d in args.dtypes.split(",") if d]:
            tdt = getattr(torch, dtype)
            torch.manual_seed(0)
            A = torch.randn(size, size, device="cuda", dtype=tdt)
            B = torch.randn(size, size, device="cuda", dtype=tdt)
            flop = 2.0 * size ** 3
            ref = torch.matmul(A, B)
            ref_ms = event_ms(lambda: torch.matmul(A, B), args.rep)
            scale = ref.float().abs().max().item()
            for cfg in configs:
                t_row = time.perf_counter()
                outs, tf = {}, {}
                for f in FORMS:
                    k, _ = build(f, cfg, size, dtype)
                    C = torch.empty(size, size, device="cuda", dtype=tdt)
                    tf[f] = flop / (event_ms(lambda: k(A, B, C), args.rep) * 1e-3) / 1e12
                    C.zero_()
                    k(A, B, C)
                    torch.cuda.synchronize()
                    outs[f] = C.clone()
                same = all(torch.equal(outs[FORMS[0]], outs[f]) for f in FORMS[1:])
                err = (outs[FORMS[-1]].float() - ref.float()).abs().max().item() / scale
                bad += (not same) or err > 2e-2
                print(f"| {size} | {dtype} | {cfg} | " + " | ".join(f"{tf[f]:.1f}" for f in FORMS) +
                      f" | {tf[FORMS[-1]] / tf[FORMS[0]]:.3f} | {'yes' if same else 'NO'} | {err:.1e} | "
                      f"{flop / (ref_ms * 1e-3) / 1e12:.1f} |", flush=True)
                print(f"({size} {dtype} {cfg}: {time.perf_counter() - t_row:.1f} s)", file=sys.stderr)
            del A, B, ref
    install(FORMS[2])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
