"""The pass pipeline: one ordered list of named slots that backends fill.

Slots, in order (a kernel moves from tile ops over regions to scalar loops ready for codegen):

``legalize``        check the kernel against the target's capabilities and the tile ops' contracts
``layout``          decide layouts (fragments over threads and registers, swizzles); collect layout and
                    scheduling hints; with ``tilecore.heaviest_first``, order the blocks heaviest first where a
                    loop's trip count grows with a block index (``tilecore.order_blocks``,
                    ``tilecore.passes.blockorder``)
``tile-lowering``   with ``tilecore.bulk_store`` (by default in kernels with one top-level pipelined loop where
                    the target has bulk tile copies), stage a fragment's store to a global tile through a shared tile
                    and one bulk tile store (``tilecore.stage_bulk_stores``, ``tilecore.passes.bulkstore``; after the
                    backends' passes, which keep the kernels they take); put fragments that got a layout in registers (per-thread programs); where the target declares
                    ``feature:async_copy``, issue consecutive independent copies into shared memory as one
                    asynchronous group (``tilecore.group_async_copies``: one wait, one barrier); then replace
                    each tile op with the implementation the target's intrinsic table picks
``pipelining``      with ``tilecore.persistent``, loop the resident blocks over the tiles
                    (``tilecore.persistent_tiles``, ``tilecore.passes.persistent``); software-pipeline
                    ``T.Pipelined`` loops: where the target declares ``feature:async_copy``,
                    ``tilecore.plan_pipelines`` multi-buffers the shared tiles its leading copies fill and
                    issues those copies stages ahead as ``AsyncCopy`` / ``AsyncCommit`` / ``AsyncWait``
                    statements, planned against the shared-memory limit (``tilecore.passes.pipeline``);
                    a backend may pipeline a loop itself before that; every loop left is serialized
``memory``          plan on-chip memory (the swizzle of matrix-unit operand tiles) and check it against the
                    target's limits; guard memory accesses
                    not proven in bounds (all of them in checked mode); write a bulk store's 16-bit tile as
                    four 8x8 matrices a 32-thread group where the emitter spells it (``tilecore.matrix_stores``)
``before-codegen``  final clean-up and verification

A backend adds passes to a slot, before or after the core's own; it never copies the list.
``TILECORE_DUMP_IR=<dir>`` writes the IR after every pass.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

SLOTS = ("legalize", "layout", "tile-lowering", "pipelining", "memory", "before-codegen")


class PassConfigKey:
    """Keys accepted in ``pass_configs``. ``tl.*`` keys from TileLang are accepted and ignored."""

    FAST_MATH = "tilecore.fast_math"           #: bool: allow contraction and approximate math (default off)
    DISABLE_CACHE = "tilecore.disable_cache"   #: bool: neither read nor write the kernel cache
    DEBUG = "tilecore.debug"                   #: bool: compile device code with debug info
    EXTRA_FLAGS = "tilecore.extra_flags"       #: list[str]: extra flags for the backend's compiler
    REQUIRE = "tilecore.require"               #: list[str]: capability needs the target must satisfy
    CHECKED = "tilecore.checked"               #: bool: check every memory access at run time (also TILECORE_CHECKED=1)
    MATRIX_UNIT_GEMM = "tilecore.matrix_unit_gemm"  #: bool: T.gemm on a registered matrix unit where one runs it (default True; False: never)
    PRUNE_BARRIERS = "tilecore.prune_barriers"  #: bool: block barriers that order no conflicting accesses to shared or global memory (before and after them, asynchronous copies landing at their waits) are removed after the backend's thread distribution (default False; D63)
    FOLD_RELAY_TILES = "tilecore.fold_relay_tiles"  #: bool: a shared tile that only relays a fragment to global memory (written once by a whole copy from the fragment, read only by whole copies to global) becomes direct copies from the fragment (default False; D63)
    CAPABILITY_OVERLAY = "tilecore.capability_overlay"  #: dict: capability values (nested or dotted keys) merged over the target's profile for this compile: features, limits, matrix units (e.g. a smaller device's paths planned on a bigger one of the same backend, D63)
    MATRIX_UNIT_FAMILIES = "tilecore.matrix_unit_families"  #: list[str]: only these matrix unit families (default: every one the target's profile lists)
    SWIZZLE_OPERAND_TILES = "tilecore.swizzle_operand_tiles"  #: bool: store matrix-unit operand tiles XOR-swizzled (default True)
    BULK_COPY = "tilecore.bulk_copy"  #: bool: stage pipelined copies by bulk tile copies where the target has them (default True; False: per-thread asynchronous copies)
    BULK_COPY_VERSIONED = "tilecore.bulk_copy_versioned"  #: bool: a pipelined loop whose copies lack only launch-time facts for bulk tile copies (a dynamic row length) is versioned on them, bulk copies where they hold (default True; False: per-thread copies only; D40)
    WARP_SPECIALIZE = "tilecore.warp_specialize"  #: bool or "auto": a producer group of its own issues a pipelined loop's bulk copies where the target has warp specialization (True: every such loop; False: none, thread 0 issues them between the block's barriers; "auto", the default: only a loop tilecore.pipeline_overlap rotates (FlashAttention's form) whose consumers are two groups of the producer group's size, with tilecore.pingpong; other loops as False; D59; "carried": only a loop carried across a persistent tile loop, D80)
    VECTORIZE = "tilecore.vectorize"  #: bool: store runs of a thread's registers to consecutive aligned addresses as one vector access (default True; D32)
    BULK_STORE = "tilecore.bulk_store"  #: bool: store a fragment to a global tile through a shared tile and one asynchronous bulk tile store where the target has bulk tile copies, waited for before the tile is written again (default: on in kernels with one top-level pipelined loop where the target has bulk tile copies and its code generator spells bulk stores; False: off; D46, D51)
    BULK_STORE_ATTENTION = "tilecore.bulk_store_attention"  #: bool: by default the bulk store (tilecore.bulk_store) also takes FlashAttention's output in its two-consumer-group form (one pipelined loop of two gemms, the second reading a fragment, a block of two producer-group sizes: what the general path rotates with ping-pong; default True, D61: +0.5 to +10% on causal, fast-math and d256 rows; False: that form's direct stores)
    BULK_STORE_EXIT_WAIT = "tilecore.bulk_store_exit_wait"  #: str: the kernel's last wait for its bulk stores: "done" (default: their writes complete) or "read" (their reads of block memory only; D82)
    BULK_STORE_REUSE = "tilecore.bulk_store_reuse"  #: bool or "auto": the bulk store's staging tile over a shared tile of the same shape and type written only before the kernel's pipelined loop and not named after it (FlashAttention's Q: dead once the loop ends), the whole tile at once where its own would not fit beside the stages ("auto": only there; default False; D83)
    BULK_STORE_PARTS = "tilecore.bulk_store_parts"  #: int: the bulk store's tile in that many parts of its columns through a staging tile of one part, each part stored before the next is written (default unset: the whole tile where it fits beside the pipelined loop's stages, else the fewest parts (2, 4, 8) that fit; 1: never in parts, the direct stores where the whole does not fit; D58)
    MATRIX_STORES = "tilecore.matrix_stores"  #: bool: a bulk store's 16-bit tile written as four 8x8 matrices a 32-thread group where the thread's pairs form them and the emitter spells it (default True; D51)
    MATRIX_STORE_LANES = "tilecore.matrix_store_lanes"  #: "compact" (default) or "general": a matrix store's lane address as a few operations of the thread index where the groups' rows and columns are linear in the group's index, or (before D65) pair 0's coordinates at the thread holding the lane's row plus a select of the matrix's offset
    PERSISTENT = "tilecore.persistent"  #: bool or int: launch the resident blocks only, each looping over the tiles, a pipelined loop carried across them (default "auto": kernels with the bulk-store epilogue and a T.use_swizzle panel over more than one wave, D56; False: none; True: every kernel of the form; an int: that many blocks; D36; D51 measured it with the bulk store: slower than the bulk store alone)
    PERSISTENT_PANEL_ROWS = "tilecore.persistent_panel_rows"  #: "constant" (default) or "runtime": how the persistent tile loop computes a T.use_swizzle panel's rows ("runtime": D36's min(rows left, panel), a run-time divisor in every k step's stage-ahead indices; kept to measure D56 against)
    PERSISTENT_NEXT_INDICES = "tilecore.persistent_next_indices"  #: "auto" (default: "per_tile" where the block's register arrays take at most 64 words a thread, else "per_step"; D58), "per_step" or "per_tile": where a carried persistent loop's stage ahead (thread 0's copies between the block's barriers) takes its tile's block indices from: the running count's tile, computed in every k step, or the next tile's bound once per tile and selected (D56)
    RELEASE_LAST_STAGE = "tilecore.release_last_stage"  #: bool: a warp-specialized tile's consumers release its last stage in its last iteration, after the wait for every matrix group (default True; False: in the next tile's first iteration, D46's; D56)
    HEAVIEST_FIRST = "tilecore.heaviest_first"  #: bool or int: where a block's loop trip counts grow with one block index (causal attention), start the heaviest blocks first, longest first in sections of that many rows of the other axes (True, the default: the smallest power of two of rows holding limits.sm_count blocks; False: grid order; D54)
    PIPELINE_NO_DRAIN = "tilecore.pipeline_no_drain"  #: bool: a pipelined loop whose gemm runs on past each iteration and whose count is not a constant has no drain after it, its last iteration waits (a vendor assembler serialized the matrix unit where the prover removes the loop's `count > 0` test; default None: where the prover shows the count positive; True: wherever the count is not a constant; False: never; D55)
    PIPELINE_EARLY_ISSUE = "tilecore.pipeline_early_issue"  #: bool: with bulk copies issued by one thread, the block barrier and the stage ahead's issue right after the loop body's first gemm that waits for every earlier one; a copy group nothing after that point reads is issued a whole pipeline ahead; with warp specialization each copy group is released there on its own barrier (default True; D55)
    GROUP_MULTICAST = "tilecore.group_multicast"  #: False or 2: a warp-specialized loop carried across a persistent tile loop in block groups of 2 consecutive blocks, the staged operand their tiles share copied once into both (multicast) and each stage released in both (default False; D80)
    PIPELINE_RELEASE_STAGES = "tilecore.pipeline_release_stages"  #: bool: with bulk copies issued by one thread and the gemm's wait deferred, no block barrier in the pipelined loop: every thread releases the stage the previous gemm read on that stage's own barrier and the issuing thread waits for the release before refilling it (default False; D62)
    PIPELINE_ISSUE_THREAD = "tilecore.pipeline_issue_thread"  #: int: where one thread issues a pipelined loop's bulk copies and no producer group does, the thread that issues the steady loop's stage ahead (default 0; D62)
    PRUNE_CONDITION_BINDS = "tilecore.prune_condition_binds"  #: bool: a named boolean (a mask's `valid = k * bn + j < seq`) drops the comparisons the prover shows, as branch conditions do (default True; D55)
    PRUNE_FALSE_COMPARISONS = "tilecore.prune_false_comparisons"  #: bool: a condition's integer comparisons the prover shows false fold to false, as those it shows true fold to true (a select on one folds: TileLang's non-causal mask `k * bn + j >= seq` where bn divides seq; default False, a backend may set it for a form it routes; D73)
    STORE_CAST_ONCE = "tilecore.store_cast_once"  #: bool: a C-family store of a value cast to the stored 16-bit type converts once, not through a rounding round trip (same bits; default True; D55)
    PIPELINE_OVERLAP = "tilecore.pipeline_overlap"  #: bool: with the early issue, a loop body of two gemms whose last one reads registers the threads write between them (FlashAttention) is rotated: iteration 0 peeled, iteration k issues its first gemm and iteration k - 1's last together (one ping-pong turn), runs the statements the last one does not touch beside it, the last iteration's last gemm after the loop (FA3's intra-warpgroup overlap; the same bits; default True where it applies; D59)
    PIPELINE_MASK_AFTER_GEMM = "tilecore.pipeline_mask_after_gemm"  #: bool: in a loop tilecore.pipeline_overlap rotates, a split masked iteration's mask of the first gemm's accumulators (`if k < E: acc = 0 else acc = select(mask, 0, -inf)`) becomes `acc = 0` before the gemm and `if k >= E: acc = select(mask, acc, -inf)` after its wait (the zeros fold into the first matrix instruction; the same bits for finite scores; default True where it applies: H200 causal +4.3%; D59)
    PIPELINE_MASK_UNSWITCH = "tilecore.pipeline_mask_unswitch"  #: bool: in a warp-specialized loop tilecore.pipeline_overlap rotates, with tilecore.pipeline_mask_after_gemm's split mask, the iteration's body after the stage waits is emitted twice under the mask's condition (`if k < E: body else: body with the mask after the first gemm's wait`), so neither path has a branch between the gemms' issue and the statements beside the last gemm (an assembler may schedule the wait for that gemm right after a branch, leaving nothing beside it); the same bits; default "auto" (on wherever it applies; False: D59's form); D70. "loops" (D74): the unmasked iterations (k < E) and the masked ones as two loops, each body one straight run; "auto" takes it under fast math and where the last gemm's accumulator holds 128 elements a thread or more (d256), True is D70's one loop everywhere
    PIPELINE_SCALE_IN_TURN = "tilecore.pipeline_scale_in_turn"  #: bool: in a loop tilecore.pipeline_overlap rotates with ping-pong's turns, the late statements that scale only the last gemm's accumulators (FlashAttention's O *= alpha, after the wait for every gemm) run one iteration later, in the turn, between the first gemm's issue and the rotated last gemm that adds to them (and before the gemm after the loop), where the issuing warps have free slots, instead of after the exponentials; the same operations in the same order on every buffer (the same bits); default "auto": in the exact build where the first gemm's accumulator holds 88 elements a thread or more beside a last one of 64 or more (d128 at 128x176, D83's two loops' form; not at 128x128 nor under tilecore.fast_math, where it measured slower); D87
    PIPELINE_MASKED_LOOP_BOUND = "tilecore.pipeline_masked_loop_bound"  #: bool: where tilecore.pipeline_mask_unswitch puts the masked iterations in a loop of their own ("loops", D74), that loop's body starts with the fact that its variable is below the loop's end (an assumption: no code), so the prover folds the mask's comparisons it implies (a causal mask's `k * bn + j < seq` edge test); the same bits; default True (D81); False: D74's form
    REDUCE_CHAINS = "tilecore.reduce_chains"  #: int or "auto": a fragment's per-thread row reduction of kind max / min / absmax as that many interleaved partial chains combined as a tree (the same result, a shorter dependency chain: a 32-element row 8 + 2 deep as four); default "fast" since D70 (1 before: one chain); "auto": 4 where a row holds 16 elements a thread or more in FlashAttention's two-consumer form (bulkstore.attention_form), one chain elsewhere; "fast": "auto" under tilecore.fast_math, one chain otherwise; D66; D70: "fast" by default (fast math's softmax beside P @ V: the assembler waited for P @ V after the first shuffle of a one-chain row maximum; the exact build's causal rows lost 2-3% with chains)
    PIPELINE_STAGE_LATE = "tilecore.pipeline_stage_late"  #: "auto" (default) or True: a pipelined loop's copies further down its body (FlashAttention's V) are staged unless their buffers would leave two or fewer resident blocks per SM where there were more (shared memory and threads per SM; "auto"); True: staged wherever they fit (the rotation of tilecore.pipeline_overlap needs them staged; D61); D66: "auto" stages them regardless in a block of two consumer groups of the producer group's size that warp_specialize="auto" takes (FlashAttention's two-consumer form: d64 128x176 ran unrotated at 0.55x the register program); "occupancy": D61's rule for every loop
    PIPELINE_LATE_COPY = "tilecore.pipeline_late_copy"  #: False (default), True or "joint": in a pipelined loop of per-thread asynchronous copies whose matrix work completes within the iteration, where its later copies (FlashAttention's V) wait and, unstaged, where they are issued. False: D68's (staged: issued with the stage ahead, waited for where they stand; unstaged: issued and waited for where they stand); True: staged, waited for with the leading copies at the top of the iteration (one wait, one block barrier an iteration); unstaged (one buffer), issued at the top of the iteration right after the barrier that frees the buffer, committed before the stage ahead, waited for (it alone) where it stood; "joint": as True, the unstaged copy's wait also waits for the stage ahead (one wait an iteration); D71
    PIPELINE_JOIN_GROUPS = "tilecore.pipeline_join_groups"  #: bool: where tilecore.pipeline_late_copy waits for a pipelined loop's staged later copies (FlashAttention's V) with the leading ones at the top of the iteration (per-thread asynchronous copies), the stage ahead's copies of both are issued under one test and committed as one group (default False: one group each, D71's; D79)
    PIPELINE_LEAD_COPIES = "tilecore.pipeline_lead_copies"  #: False, True or "grouped": a copy into block memory before a pipelined loop of per-thread asynchronous copies (FlashAttention's Q) is issued as its own commit group (tilecore.group_async_copies takes the lone copy) and its wait and barrier dropped: the loop's first wait and barrier land it (where nothing between touches block memory and the loop runs at least once; "grouped": the lone copy grouped, its wait and barrier kept; default False; D79)
    PINGPONG = "tilecore.pingpong"  #: bool or "auto": with tilecore.warp_specialize and two consumer warpgroups, they take turns issuing their gemms (one group's gemms run while the other computes; "auto", the default: where tilecore.warp_specialize="auto" specialized the loop, D59; else as False; D55)
    SPLIT_MASKED_ITERATIONS = "tilecore.split_masked_iterations"  #: bool: a pipelined loop's T.Parallel masks on its variable that provably hold for its leading iterations (causal attention off the diagonal) are left out there: `if k < E` the nest without them (default True; D55)
    SPLIT_K = "tilecore.split_k"  #: False (default), an int >= 2 or "auto": a plain GEMM's pipelined k loop split over that many blocks a tile (a new last grid dimension), each block's accumulator registers stored as a partial in a kept workspace, the tile's last block (an arrival counter) summing them in split order before the kernel's epilogue (the same bits every run); "auto": where the tiles fill at most half the processors (D69)
    SPLIT_K_FENCES = "tilecore.split_k_fences"  #: bool: with tilecore.split_k, every thread fences its partial stores (device scope, release) before the block barrier and the arrival, and fences (acquire) before the last block's sum (default False: the arrival's acquire-release atomic, run by one thread between two block barriers, orders them; D69)
    SPLIT_K_PARTIALS = "tilecore.split_k_partials"  #: "vector" (default) or "scalar": how tilecore.split_k's partials lie: "vector", a thread's registers in groups of 4 consecutive floats, a warp's group one 512-byte run (16-byte stores and loads), the last block adding its own registers in its split's place; "scalar": each register a 128-byte run of a warp, the last block reading its own partial back (D69's first measured form)
    SPLIT_K_REDUCE = "tilecore.split_k_reduce"  #: "workspace" (default), "group" or "auto": how tilecore.split_k sums a tile's partials: "workspace", through the kept global workspace, the tile's last block (D69); "group", the tile's splits one block group (a capability: execution.cluster.supported, limits.max_cluster_size) whose ranks 1..S-1 store their registers into rank 0's block memory (over the pipelined loop's stages where they hold it), rank 0 summing in split order (the workspace form's bits) before the kernel's epilogue; "auto": the group where every group of the grid is resident at once (execution.cluster.at_once) and the receive area fits, else the workspace (D75)
    SPLIT_K_UNEVEN = "tilecore.split_k_uneven"  #: bool: tilecore.split_k may take a count that does not divide the k loop's trip count: block z runs k tiles [z KT // S, (z + 1) KT // S) (a run-time trip count; default False: equal splits only, a CompileError naming the divisors; D75)
    SPLIT_K_GROUP_AREA = "tilecore.split_k_group_area"  #: "auto" (default) or "stages": where tilecore.split_k_reduce="group" puts rank 0's receive area: "auto", beside the block's buffers where the block memory holds it (free from the start: the blocks arrive, relaxed, at the top and wait before the first store into rank 0's; no barrier after the main loop), else over the pipelined loop's stages (a proxy fence and a group barrier after the main loop first); "stages": over the stages wherever they hold it (D75)
    SPLIT_K_GROUP_SYNC = "tilecore.split_k_group_sync"  #: "copy_barrier" (default since D75's round 1) or "barrier": how rank 0 of the rank-0 group sum learns its peers' partials landed: "copy_barrier", their stores complete on a transaction barrier in rank 0's block memory announced for all their bytes (no release, no second group barrier; a receive area of its own, targets with features.bulk_tensor_copy); "barrier", a group barrier after their stores (arrive with release) (D75)
    SPLIT_K_GROUP_SUM = "tilecore.split_k_group_sum"  #: "auto" (default), "rank0", "slices", "panels" or "cells": how tilecore.split_k_reduce="group" sums: "rank0", every peer stores its whole partial into rank 0, which sums and runs the epilogue; "slices", each block sums 1/S of the registers from its peers' stores (on its transaction barrier), then blocks 1..S-1 store their sums into rank 0; "panels", where the epilogue is one bulk store of a paneled tile whose panels divide among the splits, each block sums its panels' registers and bulk-stores its panels (no gather); "cells" (D78), the same with the tile cut into cells of rows x one panel, each block owning a run of them (any split count up to the cells: 3 splits of two or four panels); "auto": panels where they apply, else cells, else slices from 3 splits where the target has transaction barriers (features.bulk_tensor_copy), else rank0 (D75, D78)
    UNIFORM_FRAGMENTS = "tilecore.uniform_fragments"  #: bool (default True): a fragment of at most 16 elements that block-level statements read or write at constant indices (a loop bound, `lse[0] = ...`, a single-element T.fill), and a fragment a T.Parallel nest writes without the nest's loop variables of extent 1, go to registers (every thread holds the whole small fragment); False: they stay in shared memory as before D88
    LAYOUT_CONVERSION = "tilecore.layout_conversion"  #: True (default): convert a fragment between disagreeing layouts in registers; "shared": always through shared memory; False: keep one in shared memory

    # TileLang's names (tilelang.PassConfigKey), so ported code runs. Those with a tilecore meaning are
    # mapped by TILELANG_EQUIVALENTS; the others are accepted and change nothing (docs/tilelang-compat.md).
    TL_ENABLE_FAST_MATH = "tl.enable_fast_math"
    TL_DEVICE_COMPILE_FLAGS = "tl.device_compile_flags"
    TL_DISABLE_WARP_SPECIALIZED = "tl.disable_warp_specialized"
    TL_DISABLE_TMA_LOWER = "tl.disable_tma_lower"
    TL_DISABLE_WGMMA = "tl.disable_wgmma"
    TL_ENABLE_ASYNC_COPY = "tl.enable_async_copy"
    TL_DISABLE_SAFE_MEMORY_ACCESS = "tl.disable_safe_memory_legalize"
    TL_DISABLE_VECTORIZE_256 = "tl.disable_vectorize_256"
    TL_DISABLE_THREAD_STORAGE_SYNC = "tl.disable_thread_storage_sync"
    TL_DISABLE_DATA_RACE_CHECK = "tl.disable_data_race_check"
    TL_DISABLE_OUT_OF_BOUND_WARNING = "tl.disable_out_of_bound_warning"
    TL_DISABLE_SHARED_MEMORY_REUSE = "tl.disable_shared_memory_reuse"
    TL_ENABLE_AGGRESSIVE_SHARED_MEMORY_MERGE = "tl.enable_aggressive_shared_memory_merge"
    TL_PTXAS_REGISTER_USAGE_LEVEL = "tl.ptxas_register_usage_level"
    TL_CONFIG_INDEX_BITWIDTH = "tl.config_index_bitwidth"
    TL_ENABLE_DUMP_IR = "tl.enable_dump_ir"
    TL_DUMP_IR_DIR = "tl.dump_ir_path"
    TL_FORCE_LET_INLINE = "tl.force_let_inline"
    TL_DISABLE_LOOP_UNSWITCHING = "tl.disable_loop_unswitching"
    TL_LAYOUT_VISUALIZATION_ENABLE = "tl.layout_visualization_enable"
    TIR_DISABLE_VECTORIZE = "tirx.disable_vectorize"
    TIR_DISABLE_CSE = "tirx.disable_cse_tir"
    TIR_ENABLE_DEBUG = "tirx.enable_debug"
    TIR_MERGE_STATIC_SMEM = "tirx.merge_static_smem"

    @classmethod
    def all(cls) -> dict:
        """tilecore's own keys."""
        return {k: v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str) and v.startswith("tilecore.")}


#: TileLang pass-config keys that have a tilecore equivalent (the rest are accepted and ignored)
TILELANG_EQUIVALENTS = {
    PassConfigKey.TL_ENABLE_FAST_MATH: PassConfigKey.FAST_MATH,
    PassConfigKey.TL_DEVICE_COMPILE_FLAGS: PassConfigKey.EXTRA_FLAGS,
    PassConfigKey.TIR_ENABLE_DEBUG: PassConfigKey.DEBUG,
}


@dataclass(frozen=True)
class Pass:
    """A named IR transformation ``fn(func, ctx) -> func``; ``name`` appears in IR dumps."""

    name: str
    fn: Callable
    doc: str = ""

    def __call__(self, func, ctx):
        return self.fn(func, ctx)


def tile_pass(name: str) -> Callable:
    """Decorator: ``@tile_pass("vendor.do_thing")`` turns ``fn(func, ctx)`` into a :class:`Pass`."""

    def wrap(fn):
        return Pass(name, fn, (fn.__doc__ or "").strip())

    return wrap


@dataclass
class PassContext:
    """What a pass may consult: the target, its capabilities, options, the intrinsic table and the matrix units."""

    target: Any
    backend: Any
    capabilities: Any
    config: dict = field(default_factory=dict)
    intrinsics: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    #: the target's matrix units that its capability profile lists (:func:`tilecore.layout.units_for`)
    matrix_units: list = field(default_factory=list)
    #: pass-config defaults a pass set for the rest of this compile (D73: a backend's defaults for the form of kernel
    #: it routed to the general path): :meth:`option` reads them only where the compile's own config does not name
    #: the key, so a value the user gives wins either way
    defaults: dict = field(default_factory=dict)

    def option(self, key: str, default=None):
        if key in self.config:
            return self.config[key]
        return self.defaults.get(key, default)

    def set_defaults(self, values: dict) -> dict:
        """Defaults for the rest of this compile (:attr:`defaults`); returns those that take effect (the keys the
        compile's config does not name)."""
        taken = {k: v for k, v in values.items() if k not in self.config}
        self.defaults.update(taken)
        return taken

    def switch(self, key: str, default=False, *, auto: bool = False, counts: bool = False, expected: str = ""):
        """A switch-like pass config read one way for every pass: True for True / "true" / "True" / "on" / 1, False
        for False / None / "false" / "False" / "off" / 0; "auto" where ``auto``; an int >= 0 as itself where
        ``counts`` (then 0 and 1 are ints, not switches). Anything else is a CompileError naming the option, the
        value and ``expected`` (what the option takes)."""
        v = self.option(key, default)  # the compile's config, then the defaults a pass set (D73)
        return parse_switch(key, v, auto=auto, counts=counts, expected=expected)


_ON = ("true", "True", "on")
_OFF = ("false", "False", "off")


def parse_switch(key: str, v, *, auto: bool = False, counts: bool = False, expected: str = ""):
    """:meth:`PassContext.switch` of a value already read (a pass that reads its option through its own default)."""
    if isinstance(v, bool):
        return v
    if v is None:
        return False
    if isinstance(v, str):
        if v in _ON:
            return True
        if v in _OFF:
            return False
        if auto and v == "auto":
            return "auto"
    elif isinstance(v, int):
        if counts and v >= 0:
            return v
        if not counts and v in (0, 1):
            return bool(v)
    from ..errors import CompileError

    raise CompileError(f"pass config {key}={v!r}: expected {expected or 'True or False'}")


class Pipeline:
    def __init__(self, core: dict | None = None):
        self.slots: dict = {s: {"before": [], "core": list((core or {}).get(s, [])), "after": []} for s in SLOTS}

    def add(self, slot: str, p: Pass, position: str = "before") -> None:
        if slot not in self.slots:
            raise ValueError(f"unknown pipeline slot {slot!r}; slots: {', '.join(SLOTS)}")
        if position not in ("before", "after"):
            raise ValueError(f"pass position must be 'before' or 'after' the core passes, got {position!r}")
        if not isinstance(p, Pass):
            p = Pass(getattr(p, "name", getattr(p, "__name__", "plugin_pass")), p)
        self.slots[slot][position].append(p)

    def passes(self) -> list:
        """``(slot, Pass)`` in execution order."""
        out = []
        for s in SLOTS:
            parts = self.slots[s]
            out += [(s, p) for p in parts["before"] + parts["core"] + parts["after"]]
        return out

    def describe(self) -> str:
        return "\n".join(f"{slot:15s} {p.name}" for slot, p in self.passes())

    def run(self, func, ctx: PassContext, dump_dir: str | None = None):
        dump = Path(dump_dir) / _safe(func.name) if dump_dir else None
        if dump:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / "00_input.ir").write_text(func.script())
        for n, (slot, p) in enumerate(self.passes(), start=1):
            func = p(func, ctx)
            if dump:
                (dump / f"{n:02d}_{slot}.{_safe(p.name)}.ir").write_text(func.script())
        return func


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def dump_dir_from_env() -> str | None:
    return os.environ.get("TILECORE_DUMP_IR") or None


def core_pipeline() -> Pipeline:
    from . import barriers, blockorder, bulkstore, copies, masksplit, core, guard, layout, lower_tile, matrix, persistent, pipeline, relay, splitk, vectorize

    return Pipeline({
        "legalize": [core.check_structure, core.check_extensions, core.check_static_bounds,
                     core.check_capabilities],
        "layout": [relay.fold_relay_tiles, layout.infer_layouts, core.collect_hints, blockorder.order_blocks],
        "tile-lowering": [masksplit.split_masked_iterations, bulkstore.stage_bulk_stores, layout.lower_fragments, splitk.split_k, pipeline.stage_pipelined_copies, copies.group_async_copies,
                          lower_tile.lower_tile_ops],
        "pipelining": [persistent.persistent_tiles, pipeline.plan_pipelines, core.serialize_pipelined],
        "memory": [matrix.swizzle_operand_tiles, core.plan_memory, vectorize.vectorize_stores, guard.guard_accesses,
                   vectorize.matrix_stores],
        "before-codegen": [barriers.prune_barriers, core.verify_lowered],
    })
