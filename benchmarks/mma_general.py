"""The sm_80 register program (``cuda.register_program``: mma.sync + cp.async) against the core's general path,
on the kernels issue 11 names (decision D63), torch in the same process.

    python benchmarks/mma_general.py [--rep 20] [--variants regprog,general] [--only gemm_epi,fa,...]

There is no sm_80 GPU: on the H100 every kernel is built for ``cuda`` (sm_90a) with
``tilecore.cuda.disable_wgmma=True`` and ``tilecore.capability_overlay`` = the sm_80 profile's features, matrix
units and shared-memory limits (``SM80``), which leaves the mma.sync + cp.async paths an sm_80 target runs
(disable_wgmma alone keeps wgmma, TMA and warp specialization on the general path). Variants (pass configs on top
of that):

- ``regprog``: the defaults (the mma.sync register program where it takes the kernel);
- ``general``: ``tilecore.cuda.register_programs=False`` (every kernel on the core's general path);
- ``general-d62``: the general path as it was before D63 (no barrier pruning, k steps rolled);
- ``default``: the plugin's defaults with no extra config (D63: the GEMM form on the general path; D73:
  FlashAttention's form there at 128 rows or head dimension 128 with the form's defaults, 64 rows at d64 on the
  register program; ``tilecore.cuda.mma_general_forms``);
- further rows name D63's options (``VARIANTS`` below).

Kernels (``--only``): ``gemm_epi`` (4096^3 fp16, bias + ReLU on the accumulator, 128x128x32, 256 threads, 3
stages; ``gemm_epi_64`` at 64x128x64 with 128 threads, ``gemm_epi_256`` at 256x128x32 with 512 threads),
``gemm_nt`` (bfloat16, B stored (N, K), no epilogue, 128x128x32), ``gemm_relay`` (C through a shared tile, 128x128x32), ``fa`` / ``fa_causal`` (TileLang's example_mha_fwd_bhsd at its own configuration: 128x128, 2 stages, 256
threads, fast math; b8 h32 s4096 d128, ``--fa`` for others; ``fa64`` / ``fa64_causal`` at 64x64 with 128 threads), ``softmax`` / ``rmsnorm`` (the catalog's, 4096x8192 fp16, a row per
block), ``gemm777`` (4096x777x4096 fp16, B rows of 777 elements, 128x128x32, 256 threads, 2 stages).

Each row: the path the kernel took (``tilecore_cuda.lowering_path``), milliseconds (median of 5 batches of
``--rep`` calls), TFLOP/s or GB/s, the ratio torch time / ours (higher is better) and the max error against torch;
then, per kernel, general / regprog (>= 0.97 is D63's bar for routing the form to the general path). Exit 2 without
a CUDA GPU.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tilecore
from _bench import cuda_ms, require_cuda, tile_gemm

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "conformance"))

#: the sm_80 profile's features, matrix units and shared-memory limits over the H100's (``cuda:sm_90a``): the
#: general path then plans what it plans on an A100 (mma.sync, cp.async, no TMA, no warp specialization, 163 KiB a
#: block); ``tilecore.cuda.disable_wgmma`` alone leaves the general path wgmma, TMA and the H100's 227 KiB (D63)
SM80 = {"features.wgmma": False, "features.bulk_tensor_copy": False, "features.clusters": False,
        "features.warp_specialization": False,
        "matrix_units": [{"family": "mma_sync", "a_dtypes": ["float16", "bfloat16"], "acc_dtype": "float32",
                          "m": 16, "n": 8, "k": 16},
                         {"family": "mma_sync", "a_dtypes": ["float64"], "acc_dtype": "float64", "m": 16, "n": 8,
                          "k": 16}],
        "limits.max_shared_bytes_per_block.value": 166912, "limits.max_shared_bytes_per_sm.value": 167936,
        "memory.shared.max_bytes_per_block": 166912, "memory.shared.max_bytes_per_sm": 167936}
BASE = {"tilecore.cuda.disable_wgmma": True, "tilecore.capability_overlay": SM80}
#: sm_86's (and sm_89's) block memory over the same features (99 KiB a block, 100 KiB an SM: D79's --profile sm86)
SM86 = {**SM80, "limits.max_shared_bytes_per_block.value": 101376, "limits.max_shared_bytes_per_sm.value": 102400,
        "memory.shared.max_bytes_per_block": 101376, "memory.shared.max_bytes_per_sm": 102400}
GENERAL = {"tilecore.cuda.register_programs": False}
#: D55's options of the general path, on by default only where the target has bulk tile copies (sm_90a)
D55 = {"tilecore.store_cast_once": True, "tilecore.prune_condition_binds": True,
       "tilecore.split_masked_iterations": True}
RELAY = {"tilecore.fold_relay_tiles": True}
PRUNE = {"tilecore.prune_barriers": True}
#: index arithmetic of values the loops show nonnegative as shifts and masks (D59's option; D68 on mma.sync)
NN = "tilecore.cuda.nonnegative_index_shifts"
#: two B operand loads of one k step as one ldmatrix .x4 (D68)
PAIRS = "tilecore.cuda.ldmatrix_pairs"
#: the later copies' issue and wait (D71)
LATE = "tilecore.pipeline_late_copy"
#: a condition's comparisons the prover shows false folded (D73)
PRUNE_FALSE = "tilecore.prune_false_comparisons"
#: the stage ahead's staged copies one commit group; the copy before the loop landed by the loop's first wait (D79)
JOIN = "tilecore.pipeline_join_groups"
LEAD = "tilecore.pipeline_lead_copies"
VARIANTS = {
    "regprog": {"tilecore.cuda.register_programs": True},
    "general": GENERAL,  # with this plugin's defaults (D63: pruned barriers, a one-gemm launch's k steps unrolled)
    "general-d62": {**GENERAL, "tilecore.prune_barriers": False, "tilecore.cuda.unroll_matrix_steps": False},
    "default": {},
    # D63's options on the general path (each row: the general path plus the options named)
    "unroll": {**GENERAL, "tilecore.cuda.unroll_matrix_steps": True},
    "relay": {**GENERAL, **RELAY},
    "prune": {**GENERAL, **PRUNE},
    "unroll+prune": {**GENERAL, **PRUNE, "tilecore.cuda.unroll_matrix_steps": True},
    "lean": {**GENERAL, **RELAY, **PRUNE, **D55},  # everything but the unrolled k steps
    "all_regs": {**GENERAL, **RELAY, **PRUNE, **D55, "tilecore.cuda.unroll_matrix_steps": "registers"},
    "all": {**GENERAL, **RELAY, **PRUNE, **D55, "tilecore.cuda.unroll_matrix_steps": True},
    # D68: the general path before D68's defaults (the ldmatrix addresses' 64-bit floor divisions, B by .x2), with
    # the index shifts but B still by .x2; D55's options, the relay fold (FlashAttention's V staged) on the defaults
    "general-d63": {**GENERAL, NN: False, PAIRS: False},
    "general-x2": {**GENERAL, PAIRS: False},
    "d55": {**GENERAL, **D55},
    "fold": {**GENERAL, **RELAY},  # FlashAttention's O_shared folded: V gets a second stage at 163 KiB
    # D71 (tilecore.pipeline_late_copy): V (unstaged: one buffer) issued at the top of the iteration after the barrier
    # that frees it, waited for (it alone) before P @ V; staged (d64 64x64, or with the fold): waited for with K at
    # the top (one wait, one barrier an iteration, the register program's schedule); "joint": V's wait also waits
    # for K's stage ahead
    "late": {**GENERAL, LATE: True},
    "late-joint": {**GENERAL, LATE: "joint"},
    "fold-late": {**GENERAL, **RELAY, LATE: True},
    "late-d55": {**GENERAL, **D55, LATE: True},
    # V staged wherever it fits (tilecore.pipeline_stage_late=True: 128x128 d64 and 64x64 d128, which D61's occupancy
    # rule leaves unstaged on sm_80's 164 KiB; 128x128 d128 does not fit) and waited for at the top with K
    "late-staged": {**GENERAL, LATE: True, "tilecore.pipeline_stage_late": True},
    "lean-late": {**GENERAL, **RELAY, **PRUNE, **D55, LATE: True},  # D68's best d64 rows (lean) with the late copy
    # D73: the route by form (the "default" row: FlashAttention's form on the general path at 128 rows or head
    # dimension 128, with the late copy and D55's options as the form's defaults, i.e. late-d55, at 128 rows also the
    # false comparisons folded, i.e. late-d55-false; 64 rows at d64 on the register program); D68's general path with every one of those options off as given; every shape of the form
    # routed (64x64 d64 too, with the form's defaults)
    "general-d68": {**GENERAL, LATE: False, **{k: False for k in D55}},
    "attention-all": {"tilecore.cuda.mma_general_forms": ["gemm", "attention"]},
    # the conditions' comparisons the prover shows false folded (the non-causal mask's edge test, 64 selects a thread
    # and iteration at 128x128), on the routed default and with every shape routed
    "default-false": {PRUNE_FALSE: True},  # since D73 round 2 the default at 128 rows
    "default-nofalse": {PRUNE_FALSE: False},  # D73 round 1's default
    "late-d55-false": {**GENERAL, **D55, LATE: True, PRUNE_FALSE: True},
    "attention-all-false": {"tilecore.cuda.mma_general_forms": ["gemm", "attention"], PRUNE_FALSE: True},
    # D79: 64x64 d64 on the general path (every shape routed, the form's defaults) with the stage ahead's K and V one
    # commit group (join), the Q copy before the loop issued by the core as its own group (its tile swizzled like the
    # staged ones) with its wait and barrier kept (lead-grouped) or left to the loop's first wait (lead), and both (d79)
    "join": {"tilecore.cuda.mma_general_forms": ["gemm", "attention"], JOIN: True},
    "lead-grouped": {"tilecore.cuda.mma_general_forms": ["gemm", "attention"], LEAD: "grouped"},
    "lead": {"tilecore.cuda.mma_general_forms": ["gemm", "attention"], LEAD: True},
    "d79": {"tilecore.cuda.mma_general_forms": ["gemm", "attention"], JOIN: True, LEAD: True},
    # O_shared folded (D63's relay fold: O stored from registers; block memory 40 KiB, 125 / 128 registers: 4 blocks an
    # SM on an A100's 164 KiB too)
    "d79-fold": {"tilecore.cuda.mma_general_forms": ["gemm", "attention"], JOIN: True, LEAD: True, **RELAY},
    # the routed default (D73) with Q issued by the core and landed by the loop's first wait (its tile swizzled)
    "default-lead": {LEAD: True},
    # D82: the route's defaults at every shape with O's relay tile folded (O stored from registers: at 64 rows d256
    # V then gets its second stage in sm_80's 163 KiB, and ptxas holds the kernel in 255 registers without spills)
    "attention-all-fold": {"tilecore.cuda.mma_general_forms": ["gemm", "attention"], **RELAY},
    # with 32-bit loop counters (D66's CUDA option; 126 registers non-causal: 4 blocks an SM where block memory allows)
    "d79-narrow": {"tilecore.cuda.mma_general_forms": ["gemm", "attention"], JOIN: True, LEAD: True,
                   "tilecore.cuda.narrow_loop_counters": True},
}


def gemm_epi(M, N, K, bm=128, bn=128, bk=32, threads=256, stages=3):
    """TileLang's quickstart GEMM (ReLU on the accumulator) with a bias: C = relu(A @ B + bias)."""
    return tile_gemm(M, N, K, bm, bn, bk, threads, stages, bias=True, relu=True)


def gemm_relay(M, N, K, bm=128, bn=128, bk=32, threads=256, stages=3):
    """TileLang's usual epilogue: C through a shared tile (``T.copy(C_local, C_shared)``, then to global memory)."""
    return tile_gemm(M, N, K, bm, bn, bk, threads, stages, via_shared=True)


def gemm_nt(M, N, K, bm=128, bn=128, bk=32, threads=256, stages=3, dtype="bfloat16"):
    """C = A @ B^T with B stored (N, K) (the catalog's "nt" GEMM), bfloat16, no epilogue."""
    return tile_gemm(M, N, K, bm, bn, bk, threads, stages, dtype=dtype, transpose_b=True)


def gemm_777(M, N, K, bm=128, bn=128, bk=32, threads=256, stages=2):
    """benchmarks/cuda_offpath.py's GEMM (B rows of N fp16: not a multiple of 16 bytes) at 256 threads."""
    return tile_gemm(M, N, K, bm, bn, bk, threads, stages)


def flash(b, h, s, d, causal, bm=128, bn=128, threads=256):
    from tilelang_corpus.attention_mha_fwd_bhsd import flashattn

    return flashattn.jit_fn.get_tir(b, h, s, s, d, causal, block_M=bm, block_N=bn, num_stages=2, threads=threads)


def bflash(b, h, s, d, causal, bm=128, bn=128, threads=256, dtype="bfloat16", row_policy=True):
    """The catalog's FlashAttention forward (tilecore_conformance.composite; O stored from the registers, no relay
    tile), 2 stages, in ``dtype``: the bf16 rows (TileLang's example is fp16 only). ``row_policy``: both gemms with
    ``T.GemmWarpPolicy.FullRow`` as TileLang's examples (every warp holds whole rows of S, so P stays in registers on
    the general path); False: the catalog's own kernel (no policy: at 64 rows / 4 warps or 128 rows / 8 warps the
    core splits S's columns between warps, and the general path keeps P in block memory)."""
    import tilecore.language as T
    from tilecore_conformance.composite import flash_attention_forward

    return flash_attention_forward(s, d, h, bm, bn, dtype, causal, batch=b, threads=threads, num_stages=2,
                                   policy=T.GemmWarpPolicy.FullRow if row_policy else None)


def softmax_k(R, C):
    from tilecore_conformance.composite import softmax

    return softmax("float16", R, C, br=1)


def rmsnorm_k(R, C):
    from tilecore_conformance.composite import rmsnorm

    return rmsnorm("float16", R, C, br=1)


# name -> (builder, extra pass configs of the kernel itself, output index)
KERNELS = {
    "gemm_epi": (lambda a: gemm_epi(*a.gemm), {}, [-1]),
    # the register program's other block shapes (64 rows a warpgroup): one warpgroup, and four
    "gemm_epi_64": (lambda a: gemm_epi(*a.gemm, bm=64, bn=128, bk=64, threads=128, stages=3), {}, [-1]),
    "gemm_epi_256": (lambda a: gemm_epi(*a.gemm, bm=256, bn=128, bk=32, threads=512, stages=3), {}, [-1]),
    "gemm_nt": (lambda a: gemm_nt(*a.gemm), {}, [-1]),
    "gemm_relay": (lambda a: gemm_relay(*a.gemm), {}, [-1]),
    "fa": (lambda a: flash(*a.fa, False), {"tilecore.fast_math": True}, [3]),
    "fa_causal": (lambda a: flash(*a.fa, True), {"tilecore.fast_math": True}, [3]),
    # the same kernel at 64x64 with one warpgroup (the register program's other FlashAttention shape)
    "fa64": (lambda a: flash(*a.fa, False, 64, 64, 128), {"tilecore.fast_math": True}, [3]),
    "fa64_causal": (lambda a: flash(*a.fa, True, 64, 64, 128), {"tilecore.fast_math": True}, [3]),
    "softmax": (lambda a: softmax_k(*a.rows), {}, [-1]),
    "rmsnorm": (lambda a: rmsnorm_k(*a.rows), {}, [-1]),
    "gemm777": (lambda a: gemm_777(*a.gemm777), {}, [-1]),
}

#: D85's FlashAttention rows (sm_86 / sm_89's profile, ``--profile sm86``), apart from D63's inventory (``KERNELS``,
#: which scripts/mma_census.py and test_mma_general's every-kernel tests walk)
KERNELS_D85 = {
    # 128 rows, 32 keys a block: a 128-row d128 form whose tiles fit 99 KiB on both paths (TileLang's 128x128 does not)
    "fa_n32": (lambda a: flash(*a.fa, False, 128, 32, 256), {"tilecore.fast_math": True}, [3]),
    "fa_n32_causal": (lambda a: flash(*a.fa, True, 128, 32, 256), {"tilecore.fast_math": True}, [3]),
    # the catalog's kernel (O stored from the registers) in bfloat16 with TileLang's warp policy (FullRow): 128x128 /
    # 256 threads and 64x64 / 128 threads
    "bfa": (lambda a: bflash(*a.fa, False), {"tilecore.fast_math": True}, [3]),
    "bfa_causal": (lambda a: bflash(*a.fa, True), {"tilecore.fast_math": True}, [3]),
    "bfa64": (lambda a: bflash(*a.fa, False, 64, 64, 128), {"tilecore.fast_math": True}, [3]),
    "bfa64_causal": (lambda a: bflash(*a.fa, True, 64, 64, 128), {"tilecore.fast_math": True}, [3]),
    # the catalog's own kernel (no warp policy: P in block memory on the general path; D85 round 1's bfa64 / cfa64),
    # 64x64 / 128 threads, fp16 (the catalog's attention/*/float16/warpgroup_tile form) and bf16
    "cat64": (lambda a: bflash(*a.fa, False, 64, 64, 128, "float16", False), {"tilecore.fast_math": True}, [3]),
    "cat64_causal": (lambda a: bflash(*a.fa, True, 64, 64, 128, "float16", False), {"tilecore.fast_math": True}, [3]),
    "bcat64": (lambda a: bflash(*a.fa, False, 64, 64, 128, "bfloat16", False), {"tilecore.fast_math": True}, [3]),
    "bcat64_causal": (lambda a: bflash(*a.fa, True, 64, 64, 128, "bfloat16", False), {"tilecore.fast_math": True},
                      [3]),
}
ALL_KERNELS = {**KERNELS, **KERNELS_D85}


def census_kernels():
    """(name, prim func builder) at small sizes, for scripts/mma_census.py (no GPU)."""
    class A:
        gemm = (512, 512, 512)
        fa = (1, 2, 512, 128)
        rows = (256, 8192)
        gemm777 = (512, 777, 512)
    return [(f"mma_general/{n}", (lambda b=b: b(A))) for n, (b, _, _) in KERNELS.items()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--variants", default="regprog,general")
    ap.add_argument("--only", default=",".join(KERNELS), help="kernels, among " + ", ".join(ALL_KERNELS))
    ap.add_argument("--gemm", default="4096,4096,4096")
    ap.add_argument("--gemm777", default="4096,777,4096")
    ap.add_argument("--fa", default="8,32,4096,128", help="batch,heads,seq,dim")
    ap.add_argument("--rows", default="4096,8192")
    ap.add_argument("--exact", action="store_true",
                    help="FlashAttention in the exact build (without the kernels' own tilecore.fast_math)")
    ap.add_argument("--profile", default="sm80", choices=("sm80", "sm86"),
                    help="the capability overlay: sm_80's block memory (163 KiB a block) or sm_86's / sm_89's (99 KiB; "
                         "with --carveout 43 the H100 / H200 keeps 100 KiB an SM)")
    ap.add_argument("--carveout", type=int, default=0,
                    help="percent of the SM's block memory each kernel prefers (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_"
                         "MEMORY_CARVEOUT; 71 on an H100 / H200: 164 KiB an SM, an A100's, so blocks an SM are "
                         "an A100's; 0: the driver's default)")
    ap.add_argument("--orders", type=int, default=1, choices=(1, 2),
                    help="2: every kernel's variants timed in the order given, then again in reverse (compiled once)")
    args = ap.parse_args()
    for k in ("gemm", "gemm777", "fa", "rows"):
        setattr(args, k, tuple(int(v) for v in getattr(args, k).split(",")))
    if not require_cuda("mma_general"):
        return 2
    import torch
    import torch.nn.functional as F
    from tilecore_cuda import lowering_path

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"mma_general: unknown variants {unknown}; known: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    dev = dict(device="cuda", dtype=torch.float16)

    def rnd(*shape, scale=1.0, dtype=torch.float16):
        return (torch.randn(*shape, device="cuda", dtype=torch.float32, generator=g) * scale).to(dtype)

    def inputs(name):
        if name.startswith("gemm_epi"):
            M, N, K = args.gemm
            a, b, bias = rnd(M, K, scale=0.125), rnd(K, N, scale=0.125), rnd(N, dtype=torch.float32)
            return (a, b, bias), (lambda: torch.relu(torch.addmm(bias.half(), a, b))), 2 * M * N * K, "flop"
        if name == "gemm_relay":
            M, N, K = args.gemm
            a, b = rnd(M, K, scale=0.125), rnd(K, N, scale=0.125)
            return (a, b), (lambda: a @ b), 2 * M * N * K, "flop"
        if name == "gemm_nt":
            M, N, K = args.gemm
            a, b = rnd(M, K, scale=0.125, dtype=torch.bfloat16), rnd(N, K, scale=0.125, dtype=torch.bfloat16)
            return (a, b), (lambda: a @ b.t()), 2 * M * N * K, "flop"
        if name.startswith(("fa", "bfa", "cat", "bcat")):
            bb, h, s, d = args.fa
            q, k, v = (rnd(bb, h, s, d, dtype=torch.bfloat16 if name.startswith(("bfa", "bcat")) else torch.float16)
                       for _ in range(3))
            causal = name.endswith("causal")
            flops = 4 * bb * h * s * s * d // (2 if causal else 1)
            return (q, k, v), (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)), flops, "flop"
        if name == "softmax":
            R, C = args.rows
            x = rnd(R, C)
            return (x,), (lambda: torch.softmax(x, 1)), 2 * R * C * 2, "byte"
        if name == "rmsnorm":
            R, C = args.rows
            x = rnd(R, C)

            def ref():
                t = x.float()
                return (t * torch.rsqrt((t * t).mean(1, keepdim=True) + 1e-6)).half()
            return (x,), ref, 2 * R * C * 2, "byte"
        M, N, K = args.gemm777
        a, b = rnd(M, K, scale=0.125), rnd(K, N, scale=0.125)
        return (a, b), (lambda: a @ b), 2 * M * N * K, "flop"

    print(f"{torch.cuda.get_device_name()}; every kernel built with tilecore.cuda.disable_wgmma=True (the sm_80 paths"
          + (", sm_86's block memory" if args.profile == "sm86" else "") + ")"
          + ("; FlashAttention in the exact build" if args.exact else ""))
    print(f"{'kernel':10s} {'variant':14s} {'path':28s} {'ms':>9s} {'rate':>12s} {'torch ms':>9s} {'torch/ours':>10s} "
          f"{'max err':>9s} {'blocks/SM':>9s}" + (f" (carveout {args.carveout}%)" if args.carveout else ""))

    def blocks_per_sm(kern) -> str:
        """The kernel's resident blocks an SM (the driver's occupancy query; with --carveout, that preference set
        first), or '?'."""
        import ctypes

        try:
            return _blocks(kern, ctypes)
        except Exception:  # noqa: BLE001 - a diagnostic column: never the benchmark's failure
            return "?"

    def _blocks(kern, ctypes) -> str:
        prog = getattr(kern, "_program", None)
        funcs = list(getattr(prog, "funcs", {}).values())
        if not funcs:
            return "?"
        fn, lib = funcs[0][1], prog.lib
        if args.carveout:
            lib.cuFuncSetAttribute(fn, 9, ctypes.c_int(args.carveout))  # PREFERRED_SHARED_MEMORY_CARVEOUT
        n = ctypes.c_int(0)
        q = getattr(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor", None)
        if q is None or q(ctypes.byref(n), fn, ctypes.c_int(int(prog.threads)),
                                 ctypes.c_size_t(int(getattr(prog, "dyn_shared", 0) or 0))) != 0:
            return "?"
        return str(n.value)
    summary = []
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        build, own, out_idx = ALL_KERNELS[name]
        if args.exact:
            own = {k: v for k, v in own.items() if k != "tilecore.fast_math"}
        ins, ref, work, unit = inputs(name)
        expect = ref()
        t_ref = cuda_ms(ref, args.rep)
        kerns = {}
        for var in variants:
            base = BASE if args.profile == "sm80" else {**BASE, "tilecore.capability_overlay": SM86}
            cfg = {**base, **own, **VARIANTS[var]}
            try:
                kerns[var] = tilecore.compile(build(args), out_idx=out_idx, target="cuda", pass_configs=cfg)
            except Exception as e:  # noqa: BLE001 - a refused row is printed, the rest go on
                print(f"{name:10s} {var:14s} refused: {type(e).__name__}: {str(e).splitlines()[0][:90]}", flush=True)
        for order in range(args.orders):
            times = {}
            for var in (variants if order == 0 else variants[::-1]):
                if var not in kerns:
                    continue
                kern = kerns[var]
                out = kern(*ins)
                occ = blocks_per_sm(kern)
                err = float((out.float() - expect.float()).abs().max())
                t = cuda_ms(lambda: kern(*ins), args.rep)
                times[var] = t
                rate = f"{work / t / 1e9:7.1f} TF/s" if unit == "flop" else f"{work / t / 1e6:7.1f} GB/s"
                tag = var if args.orders == 1 else f"{var}{'' if order == 0 else ' (rev)'}"
                print(f"{name:10s} {tag:14s} {lowering_path(kern):28s} {t:9.4f} {rate:>12s} {t_ref:9.4f} "
                      f"{t_ref / t:10.3f} {err:9.2e} {occ:>9s}", flush=True)
            if "regprog" in times:
                label = name if args.orders == 1 else f"{name}{'' if order == 0 else ' rev'}"
                summary.append((label, {v: times["regprog"] / times[v] for v in variants if v in times}))
    if summary:
        print("\nspeed relative to the regprog row (regprog time / variant time; >= 0.97: D63's bar):")
        for name, rel in summary:
            print(f"  {name:14s} " + "  ".join(f"{v} {r:.3f}" for v, r in rel.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
