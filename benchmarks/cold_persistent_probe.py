"""A measurement for decision D48, not a change: the persistent Hopper GEMM with its last k step inside the k loop.

    python benchmarks/cold_persistent_probe.py [--rep 20] [--sizes 4096,8192] [--repeat 5]

`tc_persistent.cuh` (the CUDA plugin's persistent GEMM, D34/D43) runs a tile's k steps as a loop over all but the
last, then the last step once more after the loop (its own `wgmma.wait_group 0` and both stages released). NVVM and
ptxas compile the main loop's body three times for it (12 HGMMA in the SASS of the 128x256x64 GEMM, against 8 for
one block per tile), and that third copy is a fifth of NVRTC's time (D48: 443 -> 351 ms of CPU on the 2-core dev
machine). The other form, the per-tile pipeline's (`tc_hopper.cuh`): every k step in the loop, then
`wgmma.wait_group 0` and the last stage released after it. The two forms differ in the main loop's SASS only in
register numbers and in where the descriptor arithmetic is scheduled (D48), so what they do to throughput can only be
measured.

This script builds the default GEMM both ways in one process: the second form by rewriting the persistent prelude's
text as the CUDA plugin's code generator returns it (nothing in the plugin changes; where the prelude no longer has
the expected text it says so and exits 2). It prints, per form: NVRTC's CPU time (median of ``--repeat``
compiles, NVRTC's cache off, alternating), the SASS instruction and HGMMA counts, and on a GPU the TFLOP/s of each
configuration at each size with torch.matmul (cuBLAS) in the same run, and whether the two forms' results are the
same bits.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_gemm import event_ms, has_gpu, matmul  # noqa: E402

PEELED = """      /* all k steps but the last keep one group in flight and release the stage before theirs */
      for (int kt = 0; kt < k_tiles - 1; ++kt, ++it) {
        step(it);
        tc_wgmma_wait<1>();
        if (kt > 0) tc_mbar_arrive(bars + 8 * (STAGES + (it - 1) % STAGES));
      }
      /* the last waits for its own group (the epilogue reads the accumulators: D29's ptxas hazard) and releases
       * both stages at once, so the next tile's loads start under this tile's epilogue */
      if (k_tiles > 0) {
        step(it);
        tc_wgmma_wait<0>();
        if (k_tiles > 1) tc_mbar_arrive(bars + 8 * (STAGES + (it - 1) % STAGES));
        tc_mbar_arrive(bars + 8 * (STAGES + it % STAGES));
        ++it;
      }
"""
IN_LOOP = """      /* every k step keeps one group in flight and releases the stage before its own (D48's probe) */
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        step(it);
        tc_wgmma_wait<1>();
        if (kt > 0) tc_mbar_arrive(bars + 8 * (STAGES + (it - 1) % STAGES));
      }
      /* then the last group, before the epilogue reads the accumulators (D29's ptxas hazard), and its stage */
      tc_wgmma_wait<0>();
      if (k_tiles > 0) tc_mbar_arrive(bars + 8 * (STAGES + (it - 1) % STAGES));
"""
# the same two forms as the cluster-multicast tree spells the stage release (release(stage), D48 / mcast's change)
FORMS_TEXT = [(PEELED, IN_LOOP),
              (PEELED.replace("tc_mbar_arrive(bars + 8 * (STAGES + (it - 1) % STAGES))", "release((it - 1) % STAGES)")
                     .replace("tc_mbar_arrive(bars + 8 * (STAGES + it % STAGES))", "release(it % STAGES)"),
               IN_LOOP.replace("tc_mbar_arrive(bars + 8 * (STAGES + (it - 1) % STAGES))", "release((it - 1) % STAGES)"))]
CONFIGS = [(128, 256, 64, 256, 4, 0), (128, 256, 64, 256, 3, 8), (128, 256, 64, 256, 4, 8)]
FORMS = ("as is", "last step in the loop")


def install(form: str) -> None:
    """Make the CUDA plugin's code generator return the persistent prelude in ``form``."""
    import tilecore_cuda.codegen as cg

    original = getattr(cg, "_d48_original_prelude", None) or cg.prelude
    cg._d48_original_prelude = original
    if form == FORMS[0]:
        cg.prelude = original
        return

    def prelude(*a, **k):
        text = original(*a, **k)
        if k.get("persistent"):
            for peeled, in_loop in FORMS_TEXT:
                if peeled in text:
                    return text.replace(peeled, in_loop)
            raise SystemExit("cold_persistent_probe.py: tc_persistent.cuh no longer has the peeled last k step "
                             "this probe rewrites; the probe is out of date")
        return text

    cg.prelude = prelude


def build(form: str, cfg, size: int):
    import tilecore

    install(form)
    M = N = K = size
    bm, bn, bk, threads, stages, panel = cfg
    t = time.process_time()
    k = tilecore.compile(matmul(M, N, K, bm, bn, bk, threads, stages, panel), target="cuda:sm_90a",
                         pass_configs={"tilecore.disable_cache": True, "tilecore.extra_flags": ["--no-cache"]})
    return k, time.process_time() - t


def counts(k) -> tuple:
    import tilecore_cuda

    try:
        text = tilecore_cuda.CUDABackend().disassemble(k.binary, "cuda:sm_90a")
    except BaseException as e:  # noqa: BLE001 - no cuobjdump: the timings still stand
        return f"n/a ({type(e).__name__})", "n/a"
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("/*") and ";" in ln]
    return len(lines), sum("HGMMA" in ln for ln in lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="compiles per form for the NVRTC time")
    ap.add_argument("--rep", type=int, default=20, help="launches per timing batch")
    ap.add_argument("--sizes", default="4096,8192")
    args = ap.parse_args()
    import tilecore_cuda.compiler as cc

    if not cc.nvrtc_usable():
        print("cold_persistent_probe.py: NVRTC is not usable here")
        return 3
    build(FORMS[0], CONFIGS[0], 4096)  # NVRTC's first compile of the process (its start-up) is not measured
    cpu = {f: [] for f in FORMS}
    kernels = {}
    for _ in range(args.repeat):
        for f in FORMS:
            k, s = build(f, CONFIGS[0], 4096)
            cpu[f].append(s)
            kernels[f] = k
    print(f"persistent GEMM matmul(4096^3, 128x256x64, 256 threads, 4 stages), {cc.toolchain()}, "
          f"{args.repeat} compiles a form, alternating")
    print()
    print("| form | compile CPU s: min / median | build (NVRTC) s: median | SASS instructions | HGMMA |")
    print("|---|---|---|---|---|")
    for f in FORMS:
        n, h = counts(kernels[f])
        print(f"| {f} | {min(cpu[f]):.3f} / {statistics.median(cpu[f]):.3f} | "
              f"{kernels[f].compile_times.get('build', float('nan')):.3f} | {n} | {h} |")
    ok, why = has_gpu()
    if not ok:
        print(f"\nno GPU run: {why}")
        return 0
    import torch

    print()
    print("| size | config (bM, bN, bK, threads, stages, panel) | as is TFLOP/s | last step in the loop TFLOP/s | "
          "ratio | same bits | cuBLAS TFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for size in [int(s) for s in args.sizes.split(",") if s]:
        torch.manual_seed(0)
        A = torch.randn(size, size, device="cuda", dtype=torch.float16)
        B = torch.randn(size, size, device="cuda", dtype=torch.float16)
        flop = 2.0 * size ** 3
        ref_ms = event_ms(lambda: torch.matmul(A, B), args.rep)
        for cfg in CONFIGS:
            outs, tf = {}, {}
            for f in FORMS:
                k, _ = build(f, cfg, size)
                C = torch.empty(size, size, device="cuda", dtype=torch.float16)
                tf[f] = flop / (event_ms(lambda: k(A, B, C), args.rep) * 1e-3) / 1e12
                k(A, B, C)
                torch.cuda.synchronize()
                outs[f] = C.clone()
            same = torch.equal(outs[FORMS[0]], outs[FORMS[1]])
            print(f"| {size} | {cfg} | {tf[FORMS[0]]:.1f} | {tf[FORMS[1]]:.1f} | {tf[FORMS[1]] / tf[FORMS[0]]:.3f} | "
                  f"{'yes' if same else 'NO'} | {flop / (ref_ms * 1e-3) / 1e12:.1f} |")
    install(FORMS[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
