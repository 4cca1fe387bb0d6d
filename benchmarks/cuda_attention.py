"""FlashAttention forward on a CUDA GPU: tilecore against torch SDPA (cuDNN and flash backends), same run.

    python benchmarks/cuda_attention.py [--batch 8 --heads 32 --seq 4096 --dim 128] [--kv-heads 8] [--rep 5]
        [--schedules off,pingpong,overlap,both] [--softmax off,fold,split,both] [--exp exp2,exp]
        [--lean off,pack,exp2,rescale,pack+rescale,all] [--epilogue direct,tma] [--causal both|yes|no]
        [--pass-config KEY=VALUE ...]

The kernel is written as TileLang writes it (Q/K/V tiles in shared memory, online softmax with exp2,
two gemms per block). Prints TFLOP/s (4 * b * h * s^2 * d for full attention, half that for causal)
and the ratio to the best torch backend; checks our output against SDPA's before timing. ``--kv-heads``
makes it grouped-query attention (K/V with fewer heads; SDPA with ``enable_gqa=True`` in the same run).
``--schedules`` times the same kernels with FA3's schedules off and on (docs/decisions.md D28: ``pingpong``,
``overlap`` = ``tilecore.cuda.intra_wg_overlap``, ``both``), one row each, against the same SDPA numbers.
``--softmax`` does the same for the softmax path (D30: ``fold`` = ``tilecore.cuda.fold_softmax_scale``, ``split``
= ``tilecore.cuda.split_masked_loop``), and ``--exp`` times the kernel with its softmax written with ``T.exp2``
(the catalog's form) and/or ``T.exp((s - m) * scale)``. ``--lean`` does the same for D35's instruction savings
(``pack`` = ``tilecore.cuda.pack_direct``, ``exp2`` = ``tilecore.cuda.exp2_range_check``, ``rescale`` =
``tilecore.cuda.skip_unit_rescale``, ``pack+rescale``, ``all``; D39, each with the rest at the defaults: ``chain`` /
``tree`` = ``tilecore.cuda.tree_reduce`` off / on (on: the default), ``beside`` = ``tilecore.cuda.softmax_beside_pv`` (128-wide blocks), ``regs24`` =
``tilecore.cuda.producer_registers=24``, ``beside+tree``, ``rowsum`` = ``tilecore.cuda.row_sum_per_thread`` (fast
math), ``d39`` = beside + tree + rowsum). A block whose key width does not divide ``--seq`` (128x176 at
4096) runs its last K/V block ragged: TMA zero-fills the rows past the sequence and the kernel's
``k * bn + j < seq`` mask gives their scores -inf, in the last iteration only (D30's split).
D54: ``--lean args`` / ``rows`` = ``tilecore.cuda.exp2_range_check`` True / ``"rows"`` (the defaults otherwise).
D60: ``--lean polyN`` = ``tilecore.cuda.exp2_poly`` N (N 8-column groups of each row a thread holds with exp2 on
the FMA pipe), ``lateG`` = ``exp2_range_check="late"`` with ``exp2_late_group`` G, ``div`` =
``tilecore.cuda.row_division`` (the epilogue's O / l with div.rn's fast path, its reciprocal once a row; the default
since D60's round 3), ``nodiv`` the option off (before).
D45: ``--lean late`` = ``tilecore.cuda.rescale_under_qk`` (O's rescale after the next S = Q K^T is issued);
``--epilogue`` ``direct`` (each thread stores its fragment), ``tma`` (``tilecore.cuda.attention_tma_store``: O
through shared memory and TMA stores, FA3's epilogue), ``persist`` / ``persist+tma``
(``tilecore.cuda.attention_persistent``: a persistent grid, the next tile's loads under this one's end), one row
each; ``--combos SCHEDULE/EPILOGUE/LEAN,...`` times exactly those combinations instead of every combination of the
three lists (``--combos overlap/direct/default,both/direct/default``: ping-pong off and on).
D54: ``--order`` times the same kernels with the blocks in grid order and heaviest first (``tilecore.heaviest_first``:
``grid`` = False, ``reverse`` = 1 (the query blocks descending inside each head), ``auto`` = True (longest first in
sections of heads), ``sN`` = sections of N heads), one row each; ``--inner-rep`` sets the timed calls a configuration
(the median; default: ``--rep``, at most 3).
Exits with code 2 and a clear message where no CUDA GPU is present.
"""
from __future__ import annotations

import argparse
import ast
import sys
import time

import tilecore
from tilecore_conformance.composite import flash_attention_forward


#: FA3's schedules of the register programs (D28), by the name --schedules takes
SCHEDULES = {"off": {"tilecore.cuda.pingpong": False, "tilecore.cuda.intra_wg_overlap": False},
             "pingpong": {"tilecore.cuda.pingpong": True, "tilecore.cuda.intra_wg_overlap": False},
             "overlap": {"tilecore.cuda.pingpong": False, "tilecore.cuda.intra_wg_overlap": True},
             "both": {"tilecore.cuda.pingpong": True, "tilecore.cuda.intra_wg_overlap": True},
             "default": {}}
#: the softmax path (D30), by the name --softmax takes
SOFTMAX = {"off": {"tilecore.cuda.fold_softmax_scale": False, "tilecore.cuda.split_masked_loop": False},
           "fold": {"tilecore.cuda.fold_softmax_scale": True, "tilecore.cuda.split_masked_loop": False},
           "split": {"tilecore.cuda.fold_softmax_scale": False, "tilecore.cuda.split_masked_loop": True},
           "both": {"tilecore.cuda.fold_softmax_scale": True, "tilecore.cuda.split_masked_loop": True},
           "default": {}}
#: D35's instruction savings, by the name --lean takes
_LEAN_OFF = {"tilecore.cuda.pack_direct": False, "tilecore.cuda.exp2_range_check": False,
             "tilecore.cuda.skip_unit_rescale": False}
LEAN = {"off": _LEAN_OFF, "pack": {**_LEAN_OFF, "tilecore.cuda.pack_direct": True},
        "exp2": {**_LEAN_OFF, "tilecore.cuda.exp2_range_check": True},
        "rescale": {**_LEAN_OFF, "tilecore.cuda.skip_unit_rescale": True},
        "pack+rescale": {**_LEAN_OFF, "tilecore.cuda.pack_direct": True, "tilecore.cuda.skip_unit_rescale": True},
        "all": {k: True for k in _LEAN_OFF}, "default": {},
        # D39, each against the defaults: the row maximum as partial chains; the softmax beside P @ V (128-wide
        # blocks at d128; with FA3's 24 / 240 register split); that split alone; both
        "chain": {"tilecore.cuda.tree_reduce": False}, "tree": {"tilecore.cuda.tree_reduce": True},
        "beside": {"tilecore.cuda.softmax_beside_pv": True},
        "regs24": {"tilecore.cuda.producer_registers": 24},
        "beside+tree": {"tilecore.cuda.softmax_beside_pv": True, "tilecore.cuda.tree_reduce": True},
        "rowsum": {"tilecore.cuda.row_sum_per_thread": True},
        "d39": {"tilecore.cuda.softmax_beside_pv": True, "tilecore.cuda.tree_reduce": True,
                "tilecore.cuda.row_sum_per_thread": True},
        # D45: O's rescale after the next S = Q K^T is issued (FA3's order)
        "late": {"tilecore.cuda.rescale_under_qk": True},
        # D60, each against the defaults: n 8-column groups of each row a thread holds with exp2 on the FMA pipe
        # (tc_ex2_poly); each exp2 tested beside its MUFU.EX2, exp2f redone after a vote over g groups
        **{f"poly{n}": {"tilecore.cuda.exp2_poly": n} for n in (1, 2, 3, 4)},
        **{f"late{g}": {"tilecore.cuda.exp2_range_check": "late", "tilecore.cuda.exp2_late_group": g} for g in (2, 4, 8)},
        "div": {"tilecore.cuda.row_division": True},  # D60: O / l with div.rn's fast path once a row (the default)
        "nodiv": {"tilecore.cuda.row_division": False},  # D60: O / l as 64 IEEE divisions a thread (before)
        **{f"late{g}poly{n}": {"tilecore.cuda.exp2_range_check": "late", "tilecore.cuda.exp2_late_group": g,
                               "tilecore.cuda.exp2_poly": n} for g in (2, 4, 8) for n in (1, 2)},
        # D54, each against the defaults: D35's exp2 range check on the computed arguments; the bound from each
        # row's smallest score, beside the row maximum, with the branch around the rest of the softmax
        "args": {"tilecore.cuda.exp2_range_check": True}, "rows": {"tilecore.cuda.exp2_range_check": "rows"}}

#: the order of the blocks (D54), by the name --order takes; "sN": sections of N rows
ORDER = {"default": {}, "grid": {"tilecore.heaviest_first": False}, "reverse": {"tilecore.heaviest_first": 1},
         "auto": {"tilecore.heaviest_first": True}}


def order_config(name: str) -> dict | None:
    if name in ORDER:
        return ORDER[name]
    if name.startswith("s") and name[1:].isdigit() and int(name[1:]) >= 1:
        return {"tilecore.heaviest_first": int(name[1:])}
    return None


#: the output's epilogue (D45), by the name --epilogue takes
EPILOGUE = {"direct": {"tilecore.cuda.attention_tma_store": False}, "tma": {"tilecore.cuda.attention_tma_store": True},
            "default": {},
            # D45: the persistent grid (tilecore.cuda.attention_persistent), with the direct or the TMA-store epilogue
            "persist": {"tilecore.cuda.attention_persistent": True, "tilecore.cuda.attention_tma_store": False},
            "persist+tma": {"tilecore.cuda.attention_persistent": True, "tilecore.cuda.attention_tma_store": True}}

#: D55: the core's general path (tilecore.cuda.register_programs=False) with its FlashAttention options, by the name
#: --general takes, one row each (cumulative from base: each adds to the one before; several are on by default since
#: the device measured them, so base turns every one off, D59's too); "default": the general path as it compiles by
#: default;
#: "regprog": the register program (the plugin's path, tilecore.cuda.register_programs=True) in the same run
_GEN = {"tilecore.cuda.register_programs": False}
_OFF = {**_GEN, "tilecore.pipeline_no_drain": False, "tilecore.prune_condition_binds": False,
        "tilecore.store_cast_once": False, "tilecore.cuda.uniform_warp_index": False,
        "tilecore.split_masked_iterations": False, "tilecore.pipeline_early_issue": False,
        # D59's defaults (FlashAttention's form: the producer warpgroup with ping-pong, the rotated body, P pinned)
        "tilecore.warp_specialize": False, "tilecore.pingpong": False, "tilecore.pipeline_overlap": False,
        "tilecore.cuda.fence_register_operands": False, "tilecore.pipeline_mask_after_gemm": False,
        "tilecore.cuda.nonnegative_index_shifts": False}
_NODRAIN = {**_OFF, "tilecore.pipeline_no_drain": True}
_LEAN = {**_NODRAIN, "tilecore.prune_condition_binds": True, "tilecore.store_cast_once": True,
         "tilecore.cuda.uniform_warp_index": True}
_SPLIT = {**_LEAN, "tilecore.split_masked_iterations": True}
_EARLY = {**_SPLIT, "tilecore.pipeline_early_issue": True}
GENERAL = {"regprog": {"tilecore.cuda.register_programs": True}, "default": _GEN, "base": _OFF,
           # D61: the general path's epilogue O / l as 64 IEEE divisions a thread (before D61's row division); the
           # route "auto" (the forms the general path serves at parity go to it); the general path without ping-pong's
           # turns (the producer warpgroup kept: the register program's fast-math schedule), and with thread 0 issuing
           "nodiv": {**_GEN, "tilecore.cuda.row_division": False},
           "auto": {"tilecore.cuda.register_programs": "auto"},
           "nopp": {**_GEN, "tilecore.pingpong": False},
           "thread0": {**_GEN, "tilecore.pingpong": False, "tilecore.warp_specialize": False},
           # D61: V staged regardless of the occupancy rule (so the rotation applies: d64 at 128x128, 64x64 at d128)
           "stage": {**_GEN, "tilecore.pipeline_stage_late": True},
           # D61: with one consumer warpgroup (64-row blocks), the producer warpgroup asked for (ws1; the register
           # program's shape: "auto" specializes two consumer groups only), and with V staged too (stage_ws)
           "ws1": {**_GEN, "tilecore.warp_specialize": True},
           "stage_ws": {**_GEN, "tilecore.pipeline_stage_late": True, "tilecore.warp_specialize": True},
           # D61: under fast math a float max / min as a compare and a select (tc_max: before D61), not fmaxf's FMNMX
           "tcmax": {**_GEN, "tilecore.cuda.fast_minmax": False},
           # D61: D59's descriptor offsets (each wgmma descriptor of an unrolled k loop as the first step's plus a
           # constant; fewer uniform instructions: d256 128x64 causal 738 -> 680 an iteration), on the general default;
           # and with ping-pong's turns off (the register program's fast-math schedule)
           "gdesc": {**_GEN, "tilecore.cuda.descriptor_offsets": True},
           "gdesc_nopp": {**_GEN, "tilecore.cuda.descriptor_offsets": True, "tilecore.pingpong": False},
           # D61: O through a shared tile and bulk tile stores (tilecore.bulk_store asked for: the core's epilogue of D46 /
           # D58 on O[b, h, rows, :], the register program's D45 epilogue), alone and with the descriptor offsets
           "bulk": {**_GEN, "tilecore.bulk_store": True},
           # D61 round 3: the default (O by bulk stores in FlashAttention's two-consumer form) off: the direct stores
           "direct": {**_GEN, "tilecore.bulk_store_attention": False},
           "bulk_desc": {**_GEN, "tilecore.bulk_store": True, "tilecore.cuda.descriptor_offsets": True},
           # D66: the main loop's bookkeeping at the register program's (descriptor offsets as one 64-bit add each,
           # gdesc above; 32-bit loop counters, narrow) and the row maximum as four partial chains and a tree
           # (tilecore.reduce_chains, chains: depth 35 -> 12 at 128x128); all three (d66), and without ping-pong's
           # turns (d66_nopp: the register program's fast-math schedule)
           "narrow": {**_GEN, "tilecore.cuda.narrow_loop_counters": True},
           "chains": {**_GEN, "tilecore.reduce_chains": 4},
           "d66": {**_GEN, "tilecore.cuda.descriptor_offsets": True, "tilecore.cuda.narrow_loop_counters": True,
                   "tilecore.reduce_chains": 4},
           # D66 round 2: descriptor offsets with each of the other two (gn: + narrow counters, gc: + chains); D61's
           # occupancy rule for the late copies (d61stage: before D66's staging of the two-consumer form, d64 128x176)
           # D66 round 3: descriptor offsets by default where a wgmma k loop has 16 steps (d256): nodesc = before
           "nodesc": {**_GEN, "tilecore.cuda.descriptor_offsets": False},
           "gn": {**_GEN, "tilecore.cuda.descriptor_offsets": True, "tilecore.cuda.narrow_loop_counters": True},
           "gc": {**_GEN, "tilecore.cuda.descriptor_offsets": True, "tilecore.reduce_chains": 4},
           "d61stage": {**_GEN, "tilecore.pipeline_stage_late": "occupancy"},
           "d66_nopp": {**_GEN, "tilecore.cuda.descriptor_offsets": True, "tilecore.cuda.narrow_loop_counters": True,
                        "tilecore.reduce_chains": 4, "tilecore.pingpong": False},
           # D70: the split mask before the first gemm (D59's mask after it off: no branch between the gemms' issue
           # and the softmax beside P @ V, the causal mask's branch before the turn); the iteration unswitched on the
           # mask's condition (each path one run from the issue on: the wait for P @ V no longer right after the
           # mask's branch); with D66's four chains of the row maximum (fast math's window too), and descriptor offsets
           # (the gemms issued back to back inside the turn, as the register program's: round 1's profile, uniform
           # instructions 19% of the samples against 5-7%); chains and offsets without it; with D66's options
           "maskpre": {**_GEN, "tilecore.pipeline_mask_after_gemm": False},
           "unswitch": {**_GEN, "tilecore.pipeline_mask_unswitch": True},
           # D70's defaults (unswitch and chains "auto") off: the general path before D70
           "before": {**_GEN, "tilecore.pipeline_mask_unswitch": False, "tilecore.reduce_chains": 1},
           "unswitch_c": {**_GEN, "tilecore.pipeline_mask_unswitch": True, "tilecore.reduce_chains": 4},
           "unswitch_cd": {**_GEN, "tilecore.pipeline_mask_unswitch": True, "tilecore.reduce_chains": 4,
                           "tilecore.cuda.descriptor_offsets": True},
           "cd": {**_GEN, "tilecore.reduce_chains": 4, "tilecore.cuda.descriptor_offsets": True},
           "unswitch_d66": {**_GEN, "tilecore.pipeline_mask_unswitch": True, "tilecore.cuda.descriptor_offsets": True,
                            "tilecore.cuda.narrow_loop_counters": True, "tilecore.reduce_chains": 4},
           # D74: descriptor offsets where the gemms' carried fragments fit (tilecore.cuda.descriptor_offsets "fit": S + O +
           # P at most 176 words a thread: d128 128x128, d256, d64; not 128x176, where the unswitched iteration spills
           # with them); with ping-pong's turns off too (the register program's fast-math schedule: fit_nopp), and the
           # turns off alone on the defaults (nopp above)
           "fit": {**_GEN, "tilecore.cuda.descriptor_offsets": "fit"},
           "fit_nopp": {**_GEN, "tilecore.cuda.descriptor_offsets": "fit", "tilecore.pingpong": False},
           # D74: fit with D66's 32-bit loop counters (fewer uniform instructions on the unmasked path: 86 -> 76 at
           # d128 causal 128x128; the register program 52)
           "fitn": {**_GEN, "tilecore.cuda.descriptor_offsets": "fit", "tilecore.cuda.narrow_loop_counters": True},
           "nopp_n": {**_GEN, "tilecore.pingpong": False, "tilecore.cuda.narrow_loop_counters": True},
           # D74: the unmasked and the masked iterations in two loops (tilecore.pipeline_mask_unswitch "loops": each
           # body one straight run, the register program's form; D70's unswitched iteration kept both copies in one
           # loop and ptxas stepped the unmasked copy's descriptors in 3-4 uniform instructions each): alone, with
           # fit (d128 causal 128x128: the loop 931 instructions, 52 uniform; the register program 930 / 52), with
           # fit and 32-bit counters, with offsets everywhere (128x176: 4 bytes spilled), fit without the turns
           "loops": {**_GEN, "tilecore.pipeline_mask_unswitch": "loops"},
           "loops_fit": {**_GEN, "tilecore.pipeline_mask_unswitch": "loops", "tilecore.cuda.descriptor_offsets": "fit"},
           "loops_fitn": {**_GEN, "tilecore.pipeline_mask_unswitch": "loops", "tilecore.cuda.descriptor_offsets": "fit",
                          "tilecore.cuda.narrow_loop_counters": True},
           "loops_desc": {**_GEN, "tilecore.pipeline_mask_unswitch": "loops", "tilecore.cuda.descriptor_offsets": True},
           "loops_n": {**_GEN, "tilecore.pipeline_mask_unswitch": "loops", "tilecore.cuda.narrow_loop_counters": True},
           # D74's default ("auto": two loops under fast math and at d256, D70's one loop in d128 / d64's exact build)
           # against D70's (True: one loop everywhere); the default with 32-bit loop counters (default_n)
           "d70": {**_GEN, "tilecore.pipeline_mask_unswitch": True},
           "default_n": {**_GEN, "tilecore.cuda.narrow_loop_counters": True},
           # D81: D74's masked loop without the fact of its variable's bound (the mask's edge tests kept: before D81)
           "nobound": {**_GEN, "tilecore.pipeline_masked_loop_bound": False},
           "loops_fit_nopp": {**_GEN, "tilecore.pipeline_mask_unswitch": "loops", "tilecore.cuda.descriptor_offsets": "fit",
                              "tilecore.pingpong": False},
           # D59: the general path's defaults before D59 (D55's), the new ones off
           "d55": {**_GEN, "tilecore.warp_specialize": False, "tilecore.pingpong": False,
                   "tilecore.pipeline_overlap": False, "tilecore.cuda.fence_register_operands": False,
                   "tilecore.cuda.uniform_warp_index": False},
           # D59 round 2's defaults (before the mask after the first gemm and the shifts became defaults, round 3)
           "d59r2": {**_GEN, "tilecore.pipeline_mask_after_gemm": False, "tilecore.cuda.nonnegative_index_shifts": False}, "nodrain": _NODRAIN, "lean": _LEAN, "split": _SPLIT,
           "early": _EARLY,
           # the producer warpgroup (D29) with each copy group released after S = Q K^T's wait (the early issue's
           # form there), then with the two consumer warpgroups' turns; pp_late: the turns with one release at the end
           "ws": {**_EARLY, "tilecore.warp_specialize": True},
           "pingpong": {**_EARLY, "tilecore.warp_specialize": True, "tilecore.pingpong": True},
           "pp_late": {**_SPLIT, "tilecore.warp_specialize": True, "tilecore.pingpong": True},
           # D59: P @ V's A registers pinned before its wgmma.fence (one wgmma group, not a fence per instruction),
           # on early (the defaults and the uniform warp index), then with the producer warpgroup and ping-pong
           "fence": {**_EARLY, "tilecore.cuda.fence_register_operands": True},
           "ws_fence": {**_EARLY, "tilecore.warp_specialize": True, "tilecore.cuda.fence_register_operands": True},
           "pp_fence": {**_EARLY, "tilecore.warp_specialize": True, "tilecore.pingpong": True,
                        "tilecore.cuda.fence_register_operands": True},
           # D59: the body rotated (tilecore.pipeline_overlap: iteration k's S = Q K^T and iteration k - 1's P @ V
           # issued together, one turn for both with ping-pong) on fence, pp_fence and ws + fence
           "overlap": {**_EARLY, "tilecore.cuda.fence_register_operands": True, "tilecore.pipeline_overlap": True},
           "ws_overlap": {**_EARLY, "tilecore.warp_specialize": True, "tilecore.cuda.fence_register_operands": True,
                          "tilecore.pipeline_overlap": True},
           "pp_overlap": {**_EARLY, "tilecore.warp_specialize": True, "tilecore.pingpong": True,
                          "tilecore.cuda.fence_register_operands": True, "tilecore.pipeline_overlap": True},
           # D59: + each wgmma descriptor of an unrolled k loop as the first step's plus a constant
           "desc": {**_EARLY, "tilecore.cuda.fence_register_operands": True, "tilecore.pipeline_overlap": True,
                    "tilecore.cuda.descriptor_offsets": True},
           "pp_desc": {**_EARLY, "tilecore.warp_specialize": True, "tilecore.pingpong": True,
                       "tilecore.cuda.fence_register_operands": True, "tilecore.pipeline_overlap": True,
                       "tilecore.cuda.descriptor_offsets": True},
           # D59 round 3, on round 2's defaults: the split mask after S = Q K^T (causal), the shifts, both (round 3's
           # defaults since), and both with descriptor offsets
           "mask": {**_GEN, "tilecore.pipeline_mask_after_gemm": True, "tilecore.cuda.nonnegative_index_shifts": False},
           "shifts": {**_GEN, "tilecore.pipeline_mask_after_gemm": False, "tilecore.cuda.nonnegative_index_shifts": True},
           "mask_shifts": {**_GEN, "tilecore.pipeline_mask_after_gemm": True,
                           "tilecore.cuda.nonnegative_index_shifts": True},
           "all": {**_GEN, "tilecore.pipeline_mask_after_gemm": True, "tilecore.cuda.descriptor_offsets": True,
                   "tilecore.cuda.nonnegative_index_shifts": True},
           # D59: + a stage's slot and parity as a mask and a shift (the loop's variable is nonnegative)
           "pp_all": {**_EARLY, "tilecore.warp_specialize": True, "tilecore.pingpong": True,
                      "tilecore.cuda.fence_register_operands": True, "tilecore.pipeline_overlap": True,
                      "tilecore.cuda.descriptor_offsets": True, "tilecore.cuda.nonnegative_index_shifts": True}}


def flash_fwd(batch, heads, seq, dim, causal, bm=64, bn=64, dtype="float16", threads=128, stages=2, fast=False,
              wgmma=True, kv_heads=None, configs=None, exp="exp2"):
    # the conformance catalog's kernel, at the benchmark's sizes
    @tilecore.jit(out_idx=[3], target="cuda",
                  pass_configs={"tilecore.fast_math": fast, "tilecore.cuda.disable_wgmma": not wgmma, **(configs or {})})
    def build():
        return flash_attention_forward(seq, dim, heads, bm, bn, dtype, causal, batch=batch, threads=threads,
                                       num_stages=stages, kv_heads=kv_heads, exp=exp)

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


def interleaved(args, table, causal, rows, flops, q, k, v, ref, hk, inner, cudnn, sdpa_kernel, backend, extra):
    """D70: every row's kernel (one per block) compiled first, then timed in turn with SDPA cuDNN, ``--interleave``
    rounds, the order reversed every other round (the H200 slowed row after row inside a process: D66's round 2)."""
    import statistics

    b, h, s, d = args.batch, args.heads, args.seq, args.dim
    kernels = []
    for (schedule, softmax, form, lean, epi, fast, gv), order in rows:
        for cfg in args.blocks.split(","):
            bm, bn, *rest = (int(x) for x in cfg.split("x"))
            threads, stages = (rest + [128, 2][len(rest):])[:2]
            label = cfg + (" fast-math" if fast else "")
            try:
                kern = flash_fwd(b, h, s, d, causal, bm, bn, threads=threads, stages=stages, fast=fast,
                                 wgmma=not args.no_wgmma, kv_heads=hk, exp=form,
                                 configs={**SCHEDULES[schedule], **SOFTMAX[softmax], **LEAN[lean], **EPILOGUE[epi],
                                          **order_config(order), **extra, **(GENERAL[gv] if gv else {})})
            except tilecore.errors.TilecoreError as e:
                print(f"causal={causal} {gv or '-'} {label}: skipped ({type(e).__name__}: {str(e)[:160]})",
                      file=sys.stderr)
                continue
            out = kern(q, k, v)
            err = float((out.float() - ref).abs().max())
            kernels.append(((gv or "-", label), (lambda kern=kern: kern(q, k, v)), err))
    times = {key: [] for key, _, _ in kernels}
    times[("cuDNN", "-")] = []
    order = [(key, fn) for key, fn, _ in kernels]

    def ref_fn():
        with sdpa_kernel(backend):
            return cudnn()

    try:
        ref_fn()
        order.append((("cuDNN", "-"), ref_fn))
    except RuntimeError as e:
        print(f"SDPA cudnn: unavailable ({str(e).splitlines()[0]})", file=sys.stderr)
    for r in range(args.interleave):
        for key, fn in (order if r % 2 == 0 else order[::-1]):
            times[key].append(flops / cuda_ms(fn, inner) / 1e9)
    med = {key: statistics.median(t) for key, t in times.items() if t}
    ref_tf = med.get(("cuDNN", "-"), float("nan"))
    for (gv, label), _, err in kernels:
        t = times[(gv, label)]
        rp = med.get(("regprog", label))
        print(f"causal={causal} {gv} {label}: {med[(gv, label)]:.1f} TFLOP/s ({min(t):.1f}-{max(t):.1f})"
              + (f", {med[(gv, label)] / rp:.3f}x the register program" if rp else ""), file=sys.stderr)
        table.add_row(str(causal), gv, label, f"{med[(gv, label)]:.1f}", f"{min(t):.0f}-{max(t):.0f}",
                      f"{med[(gv, label)] / rp:.3f}x" if rp else "-", f"{ref_tf:.1f}", f"{med[(gv, label)] / ref_tf:.3f}x",
                      f"{err:.2e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--kv-heads", type=int, default=None, help="K/V heads (grouped-query attention); default: --heads")
    ap.add_argument("--rep", type=int, default=5)
    ap.add_argument("--blocks", default="128x176x256x2,128x128x256x2,128x128x256x3,128x64x256x2,64x64x128x2",
                    help="our configurations, bm x bn [x threads [x stages]]; the best is shown. On sm_90a a block of "
                         "64 query rows per warpgroup runs as a warp-specialized register program")
    ap.add_argument("--no-wgmma", action="store_true",
                    help="switch the Hopper passes off: measures the sm_80 path (mma.sync register program) here")
    ap.add_argument("--fast-math", action="store_true",
                    help="also time every configuration with tilecore.fast_math (approximate exp2, contraction)")
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True,
                    help="time the exact build (--no-exact with --fast-math: fast math only)")
    ap.add_argument("--schedules", default="default",
                    help=f"comma-separated, one row each: {', '.join(SCHEDULES)} (default: the compiler's defaults)")
    ap.add_argument("--softmax", default="default",
                    help=f"comma-separated, one row each: {', '.join(SOFTMAX)} (default: the compiler's defaults)")
    ap.add_argument("--exp", default="exp2", help="comma-separated softmax forms, one row each: exp2 (the catalog's "
                                                  "T.exp2(s * c - m * c)), exp (T.exp((s - m) * scale))")
    ap.add_argument("--lean", default="default",
                    help=f"comma-separated, one row each: {', '.join(LEAN)} (default: the compiler's defaults)")
    ap.add_argument("--epilogue", default="default",
                    help=f"comma-separated, one row each: {', '.join(EPILOGUE)} (default: the compiler's default)")
    ap.add_argument("--combos", default=None,
                    help="comma-separated SCHEDULE/EPILOGUE/LEAN triples, one row each (instead of every combination)")
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--order", default="default",
                    help="comma-separated block orders, one row each (D54): default, grid, reverse, auto, sN (sections "
                         "of N heads)")
    ap.add_argument("--inner-rep", type=int, default=None,
                    help="timed calls a configuration (the median; default: --rep, at most 3)")
    ap.add_argument("--general", default=None,
                    help=f"comma-separated, one row each (D55): {', '.join(GENERAL)}: the core's general path with its "
                         "FlashAttention options, cumulative; regprog: the register program")
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                    help="D70: compile every row's kernel first, then time them (and SDPA cuDNN) in turn ROUNDS "
                         "rounds, the order reversed every other round; one row per block (not the best of "
                         "--blocks): the median of the rounds, its range, the ratio to the register program's row "
                         "(--general regprog) of the same block and to cuDNN")
    ap.add_argument("--pass-config", action="append", default=[], metavar="KEY=VALUE",
                    help="a pass config for every kernel (repeat it); VALUE is parsed as Python (True, 3) or kept a string")
    args = ap.parse_args()
    if not (args.exact or args.fast_math):
        ap.error("--no-exact leaves nothing to time without --fast-math")
    schedules = args.schedules.split(",")
    unknown = [x for x in schedules if x not in SCHEDULES]
    if unknown:
        ap.error(f"--schedules: unknown {', '.join(unknown)}; known: {', '.join(SCHEDULES)}")
    softmaxes, exps, leans = args.softmax.split(","), args.exp.split(","), args.lean.split(",")
    epilogues = args.epilogue.split(",")
    unknown = [x for x in softmaxes if x not in SOFTMAX] + [x for x in exps if x not in ("exp2", "exp")] + \
        [x for x in leans if x not in LEAN] + [x for x in epilogues if x not in EPILOGUE]
    if unknown:
        ap.error(f"--softmax / --exp / --lean / --epilogue: unknown {', '.join(unknown)}; known: {', '.join(SOFTMAX)} / "
                 f"exp2, exp / {', '.join(LEAN)} / {', '.join(EPILOGUE)}")
    inner = max(1, args.inner_rep if args.inner_rep is not None else min(args.rep, 3))
    orders = args.order.split(",")
    bad = [o for o in orders if order_config(o) is None]
    if bad:
        ap.error(f"--order: unknown {', '.join(bad)}; known: {', '.join(ORDER)}, sN (N >= 1)")
    generals = args.general.split(",") if args.general else [None]
    unknown = [x for x in generals if x is not None and x not in GENERAL]
    if unknown:
        ap.error(f"--general: unknown {', '.join(unknown)}; known: {', '.join(GENERAL)}")
    # D86: the WGMMA register program (sm_90a) and the options only it read are retired: say so before compiling
    from tilecore_cuda.regprog import RETIRED_OPTIONS

    asked = [(f"--schedules {x}", SCHEDULES[x]) for x in schedules] + [(f"--lean {x}", LEAN[x]) for x in leans] + \
        [(f"--epilogue {x}", EPILOGUE[x]) for x in epilogues]
    retired = sorted({name for name, cfg in asked if any(k in RETIRED_OPTIONS for k in cfg)})
    if "regprog" in generals and not args.no_wgmma:
        retired.append("--general regprog (on sm_90a; with --no-wgmma it is the mma.sync program)")
    if retired:
        ap.error(f"{', '.join(retired)}: the WGMMA register program and the options only it read were retired in D86 "
                 "(docs/decisions.md): FlashAttention runs on the core's general path on sm_90a; compare --general "
                 "default / its options with cuDNN, or benchmarks/fa_route.py")
    combos = None
    if args.combos:
        combos = [tuple(c.split("/")) for c in args.combos.split(",")]
        bad = [c for c in combos if len(c) != 3 or c[0] not in SCHEDULES or c[1] not in EPILOGUE or c[2] not in LEAN]
        if bad:
            ap.error(f"--combos: {', '.join('/'.join(c) for c in bad)}: SCHEDULE/EPILOGUE/LEAN from {', '.join(SCHEDULES)} / "
                     f"{', '.join(EPILOGUE)} / {', '.join(LEAN)}")
    extra = {}
    for kv in args.pass_config:
        key, _, value = kv.partition("=")
        try:
            extra[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            extra[key] = value
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
    if args.interleave:
        table = Table(title=f"FlashAttention forward fp16, b{b} h{h}{gqa} s{s} d{d} on {torch.cuda.get_device_name()}, "
                            f"{args.interleave} interleaved rounds (medians)")
        for col in ("causal", "general", "config", "TFLOP/s", "range", "/ regprog", "cuDNN", "/ cuDNN", "max err"):
            table.add_column(col, justify="right")
    for col in (() if args.interleave else (
            "causal", "order", "general", "schedule", "softmax", "exp", "lean", "epilogue", "tilecore TFLOP/s", "config",
            "SDPA cuDNN", "SDPA flash", "ours / best torch",
            "max err")):
        table.add_column(col, justify="right")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(b, hk, s, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    gqa_args = {"enable_gqa": True} if hk != h else {}
    for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]:
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        theirs = {}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa_args)
                    theirs[name] = flops / cuda_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                                          **gqa_args), args.rep) / 1e9
            except RuntimeError as e:  # a backend torch lacks on this build or device
                theirs[name] = float("nan")
                print(f"SDPA {name}: unavailable ({str(e).splitlines()[0]})", file=sys.stderr)
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, **gqa_args)
        top = max(x for x in theirs.values() if x == x) if any(x == x for x in theirs.values()) else float("nan")
        maths = ([False] if args.exact else []) + ([True] if args.fast_math else [])
        rows = ([(a, x, e, n, o, f) for a in schedules for x in softmaxes for e in exps for n in leans for o in epilogues
                 for f in maths] if combos is None else
                [(a, x, e, n, o, f) for a, o, n in combos for x in softmaxes for e in exps for f in maths])
        rows = [r + (gv,) for gv in generals for r in rows]
        rows = [(r, order) for r in rows for order in orders]
        if args.interleave:
            interleaved(args, table, causal, rows, flops, q, k, v, ref, hk, inner,
                        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa_args), sdpa_kernel,
                        SDPBackend.CUDNN_ATTENTION, extra)
            continue
        for (schedule, softmax, form, lean, epi, fast, gv), order in rows:
            best, best_cfg, errs = 0.0, "-", []
            for cfg in args.blocks.split(","):
                bm, bn, *rest = (int(x) for x in cfg.split("x"))
                threads, stages = (rest + [128, 2][len(rest):])[:2]
                cfg = cfg + (" fast-math" if fast else "")
                t0 = time.perf_counter()
                try:
                    kern = flash_fwd(b, h, s, d, causal, bm, bn, threads=threads, stages=stages, fast=fast,
                                     wgmma=not args.no_wgmma, kv_heads=hk, exp=form,
                                     configs={**SCHEDULES[schedule], **SOFTMAX[softmax], **LEAN[lean], **EPILOGUE[epi],
                                              **order_config(order), **extra, **(GENERAL[gv] if gv else {})})
                except tilecore.errors.TilecoreError as e:  # e.g. tiles that do not fit on chip at d256
                    print(f"causal={causal} {order} {gv or '-'} {schedule} {softmax} {form} {lean} {epi} {cfg}: skipped ({type(e).__name__}: {str(e)[:160]})",
                          file=sys.stderr)
                    continue
                compile_s = time.perf_counter() - t0
                out = kern(q, k, v)
                errs.append(float((out.float() - ref).abs().max()))
                tf = flops / cuda_ms(lambda: kern(q, k, v), inner) / 1e9
                print(f"causal={causal} {order} {gv or '-'} {schedule} {softmax} {form} {lean} {epi} {cfg}: {tf:.1f} TFLOP/s, compiled in {compile_s:.2f} s",
                      file=sys.stderr)
                if tf > best:
                    best, best_cfg = tf, cfg
            table.add_row(str(causal), order, gv or "-", schedule, softmax, form, lean, epi, f"{best:.1f}", best_cfg, f"{theirs['cudnn']:.1f}",
                          f"{theirs['flash']:.1f}", f"{best / top:.3f}x", f"{max(errs) if errs else float('nan'):.2e}")
    Console(width=170).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
