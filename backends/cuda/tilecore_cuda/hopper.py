"""Hopper (sm_90a): a ``T.Pipelined`` GEMM main loop as a warp-specialized TMA + WGMMA pipeline.

The pass ``cuda.hopper_gemm_pipeline`` runs at the start of tile lowering, on targets whose
capabilities have ``feature:wgmma``, ``feature:bulk_tensor_copy`` and ``feature:warp_specialization``.
It looks, inside each ``T.Kernel``, for the main loop of a tiled matrix multiply::

    A_s = T.alloc_shared((bM, bK), dt)          # or (bK, bM) with transpose_A: not handled
    B_s = T.alloc_shared((bK, bN), dt)          # or (bN, bK) with transpose_B=True
    C_l = T.alloc_fragment((bM, bN), "float32")
    T.clear(C_l)
    for ko in T.Pipelined(n, num_stages=S):
        T.copy(A[<affine in ko>], A_s)           # global -> shared, in any order
        T.copy(B[<affine in ko>], B_s)
        T.gemm(A_s, B_s, C_l[, transpose_B=True])
    ... C_l used after the loop (e.g. T.copy(C_l, C[...]))

and replaces the clear and the loop by one block-collective statement, ``tc_wgmma_pipeline``
(prelude/tc_hopper.cuh), on a block with one more warpgroup than the kernel asked for:

- the extra warpgroup is the *producer*: one thread issues, per stage, the TMA copies
  (``cp.async.bulk.tensor.2d``, 128-byte swizzle, tensor maps built on the host at launch) that
  complete on the stage's ``full`` mbarrier, after waiting on its ``empty`` mbarrier;
  ``setmaxnreg`` gives its registers to the consumers;
- the kernel's own warpgroups are *consumers*: each owns ``bM / consumers`` rows of the C tile as
  WGMMA accumulators in registers, waits on ``full``, issues ``wgmma.mma_async`` from shared-memory
  descriptors, keeps one WGMMA group in flight and releases the previous stage on ``empty``;
- the accumulators reach memory once, after the loop: straight to global memory when the only use
  of ``C_l`` after the loop is ``T.copy(C_l, C[...])`` (the epilogue is folded into the collective),
  otherwise into ``C_l`` in shared memory for the rest of the kernel.

Where the result goes straight to global memory and a static grid leaves SMs idle, the K loop is split
over several blocks per output tile (:func:`split_k`, docs/decisions.md D27): ``tc_wgmma_splitk``
(prelude/tc_splitk.cuh) runs the pipeline over the block's share of k tiles into a float32 partial in a
workspace the runtime allocates, and the tile's last block sums the partials in split order into C.

``A_s`` and ``B_s`` are replaced by one pipeline buffer (``stages`` copies of both tiles, 1024-byte
aligned for the swizzle, plus the mbarriers). The number of stages is ``num_stages``, lowered until
the block's shared memory fits. Anything that does not match stays as it was (the ``mma.sync`` path
takes the ``T.gemm``); ``TILECORE_DUMP_IR`` shows which happened.
"""
from __future__ import annotations

from tilecore.errors import CompileError
from tilecore.ir import (Allocate, BinOp, Buffer, Cast, Collective, For, KernelLaunch, Region, Seq, TileOp, Var,
                         as_expr, binary, cast, const_value, rewrite, simplify, walk, walk_expr)
from tilecore.passes import tile_pass
from tilecore.passes.core import onchip_limit
from tilecore.passes.splitk import split_k_option
from tilecore.passes.guard import launch_facts

from ._irutil import NoMatch as _NoMatch, full as _full, need as _need, static as _static

WG = 128                       # threads in a warpgroup
SWIZZLE_BYTES = 128            # TMA and WGMMA 128-byte swizzle: one atom row is 128 bytes
MAX_ACC_REGS = 128             # accumulator registers per consumer thread we allow
_DTYPES = {"float16": ("f16", 16), "bfloat16": ("bf16", 16), "float8_e4m3": ("e4m3", 32),
           "float8_e5m2": ("e5m2", 32)}  # dtype -> (ptx type, k per wgmma)
#: CUtensorMapDataType by element type (cuda.h); 8-bit floats travel as bytes
TMAP_DTYPES = {"uint8": 0, "int8": 0, "float8_e4m3": 0, "float8_e5m2": 0, "uint16": 1, "int16": 1, "uint32": 2,
               "int32": 3, "uint64": 4, "int64": 5, "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
#: CUtensorMapSwizzle by panel width in bytes (0: none)
TMAP_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}
_OUT_DTYPES = ("float16", "bfloat16", "float32")
EPI_ROWS, EPI_COLS, EPI_PAIRS = 1, 2, 4  # prelude/tc_hopper.cuh's TC_EPI_* flags
EPI_TMA = 8  # prelude/tc_persistent.cuh's TC_EPI_TMA: the epilogue through shared memory and TMA stores (D38)
EPI_TMA_HALF = 16  # ... TC_EPI_TMA_HALF: through a buffer of half the tile's columns, staged and stored twice


def _uses(stmt, buf: Buffer) -> int:
    """How many tile ops / loads / stores / allocations in ``stmt`` mention ``buf``."""
    n = [0]

    def expr(e):
        if getattr(e, "buffer", None) is buf:
            n[0] += 1

    def visit(s):
        if isinstance(s, TileOp):
            for a in s.args:
                if isinstance(a, Region) and a.buffer is buf:
                    n[0] += 1
                elif not isinstance(a, Region):
                    walk_expr(a, expr)
                else:
                    for e in (*a.starts, *a.extents):
                        walk_expr(e, expr)
            return
        if getattr(s, "buffer", None) is buf and not isinstance(s, Allocate):
            n[0] += 1
        for name in ("value", "cond", "extent", "start", "init"):
            v = getattr(s, name, None)
            if v is not None and not isinstance(v, (Buffer,)) and hasattr(v, "dtype"):
                walk_expr(v, expr)
        for idx in getattr(s, "indices", ()) or ():
            walk_expr(idx, expr)
        if isinstance(s, Collective):
            for a in s.args:
                if isinstance(a, Region) and a.buffer is buf:
                    n[0] += 1

    walk(stmt, visit)
    return n[0]


def _subst(e, var: Var, value):
    """``e`` with ``var`` replaced by ``value`` (index arithmetic only: other nodes must not mention var)."""
    if e is var:
        return value
    if isinstance(e, BinOp):
        return binary(e.op, _subst(e.a, var, value), _subst(e.b, var, value))
    if isinstance(e, Cast):
        return cast(e.dtype, _subst(e.value, var, value))
    found = []
    walk_expr(e, lambda x: found.append(1) if x is var else None)
    _need(not found, "loop variable inside a non-affine index")
    return e


def _affine(e, var: Var, start):
    """(value at the first iteration, constant step per iteration) of index ``e`` over loop ``var``."""
    first = simplify(_subst(e, var, as_expr(start)))
    nxt = simplify(_subst(e, var, binary("add", as_expr(start), 1)))
    step = const_value(simplify(binary("sub", nxt, first)))
    _need(step is not None, "copy start is not affine in the loop variable")
    return first, int(step)


class _Plan:
    """Everything the collective needs, found by :func:`_match`."""


def _match(body: list, k: int, launch: KernelLaunch, ctx):
    """Try the pipelined loop at ``body[k]``; return a plan or raise _NoMatch."""
    loop = body[k]
    inner = loop.body.body if isinstance(loop.body, Seq) else [loop.body]
    _need(len(inner) == 3 and all(isinstance(s, TileOp) for s in inner), "loop body is not two copies and a gemm")
    gemm = inner[-1]
    copies = inner[:2]
    _need(gemm.op == "gemm" and all(c.op == "copy" for c in copies))
    _need(not gemm.attrs.get("clear_accum") and not gemm.attrs.get("transpose_A"), "clear_accum / transpose_A")
    ra, rb, rc = gemm.args
    _need(all(isinstance(r, Region) for r in (ra, rb, rc)))
    a_s, b_s, c_l = ra.buffer, rb.buffer, rc.buffer
    _need(a_s.scope == "shared" and b_s.scope == "shared" and c_l.scope in ("fragment", "shared", "local"))
    _need(a_s is not b_s and all(_full(r) and r.buffer.ndim == 2 for r in (ra, rb, rc)), "whole 2-D buffers")
    dt = str(a_s.dtype)
    _need(dt in _DTYPES and str(b_s.dtype) == dt and str(c_l.dtype) == "float32", "operand dtypes")
    tb = bool(gemm.attrs.get("transpose_B"))
    bm, bk = a_s.static_shape()
    bn = b_s.static_shape()[0] if tb else b_s.static_shape()[1]
    _need((b_s.static_shape()[1] if tb else b_s.static_shape()[0]) == bk and c_l.static_shape() == (bm, bn))
    esize = a_s.dtype.bytes
    atom = SWIZZLE_BYTES // esize                      # elements in one 128-byte swizzle row
    _need(bk % atom == 0, "block_K must be whole 128-byte rows")
    _need(dt in ("float16", "bfloat16") or tb, "8-bit float WGMMA needs B as (N, K): transpose_B=True")
    _need(tb or bn % atom == 0, "block_N must be whole 128-byte rows when B is (K, N)")
    _need(8 <= bn <= 256 and bn % 8 == 0 and bn <= 256, "block_N")
    _need(bm <= 256 and bn <= 256, "TMA boxes are at most 256 rows")
    # copies: one fills A_s, the other B_s, from 2-D global tensors, start affine in the loop variable
    srcs = {}
    for c in copies:
        src, dst = c.args
        _need(isinstance(src, Region) and isinstance(dst, Region) and _full(dst), "copy into a whole shared buffer")
        _need(src.buffer.scope == "global" and src.buffer.ndim == 2 and str(src.buffer.dtype) == dt)
        _need(tuple(_static(x) for x in src.extents) == dst.buffer.static_shape(), "copy extents")
        row = _static(src.buffer.shape[-1])
        _need(row is None or (row * src.buffer.dtype.bytes) % 16 == 0,
              f"rows of {src.buffer.name} are not a multiple of 16 bytes, as TMA needs")
        srcs[dst.buffer] = src
    _need(set(srcs) == {a_s, b_s}, "the copies must fill the gemm's A and B")
    # threads: the kernel's warpgroups become consumers
    threads = 1
    for t in launch.threads:
        threads *= int(const_value(as_expr(t)))
    _need(threads % WG == 0 and len(launch.threads) == 1, "a one-dimensional block of whole warpgroups")
    ncwg = threads // WG
    _need(bm % (64 * ncwg) == 0, "block_M must split into 64-row slices per consumer warpgroup")
    mr = bm // (64 * ncwg)
    _need(mr * bn // 2 <= MAX_ACC_REGS, "too many accumulators per thread; use more threads or a smaller tile")
    _need(threads + WG <= 1024)
    # A_s and B_s appear nowhere else; C_l is cleared right before the loop
    rest = Seq(body[:k] + body[k + 1:])
    _need(_uses(rest, a_s) == 0 and _uses(rest, b_s) == 0, "shared tiles used outside the loop")
    _need(k >= 1 and isinstance(body[k - 1], TileOp) and body[k - 1].op == "fill", "C is not cleared before the loop")
    clear = body[k - 1]
    _need(isinstance(clear.args[0], Region) and clear.args[0].buffer is c_l and _full(clear.args[0])
          and const_value(clear.args[1]) == 0, "C is not cleared before the loop")
    p = _Plan()
    p.loop, p.clear, p.gemm = loop, clear, gemm
    p.a_s, p.b_s, p.c_l, p.dt, p.esize, p.atom, p.tb = a_s, b_s, c_l, dt, esize, atom, tb
    p.bm, p.bn, p.bk, p.ncwg, p.mr, p.threads = bm, bn, bk, ncwg, mr, threads
    p.src_a, p.src_b = srcs[a_s], srcs[b_s]
    # epilogue: fold `T.copy(C_l, C[...])` when it is C_l's only other use
    after = body[k + 1:]
    p.epilogue = None
    for j, s in enumerate(after):
        if _uses(s, c_l):
            if (isinstance(s, TileOp) and s.op == "copy" and s.args[0].buffer is c_l and _full(s.args[0])
                    and isinstance(s.args[1], Region) and s.args[1].buffer.scope == "global"
                    and s.args[1].buffer.ndim == 2 and str(s.args[1].buffer.dtype) in _OUT_DTYPES
                    and tuple(_static(x) for x in s.args[1].extents) == (bm, bn)
                    and _uses(Seq(body[:k - 1] + after[:j] + after[j + 1:]), c_l) == 0):
                p.epilogue = (k + 1 + j, s)
            break
    return p


def _stages(p: _Plan, requested: int, other_bytes: int, limit: int) -> int:
    stage = (p.bm * p.bk + p.bk * p.bn) * p.esize
    c_bytes = 0 if p.epilogue else p.bm * p.bn * 4
    s = max(requested, 2)
    while s >= 2 and other_bytes + c_bytes + pipe_bytes(s, stage) > limit:
        s -= 1
    _need(s >= 2, "not even two stages fit in shared memory")
    return s


def pipe_bytes(stages: int, stage_bytes: int) -> int:
    """Pipeline buffer: 1024 bytes of alignment slack, the stages, two mbarriers per stage."""
    return 1024 + stages * stage_bytes + 16 * stages


def tensor_map(src, box: tuple, swizzle_bytes: int = SWIZZLE_BYTES) -> dict:
    """What the emitter and runtime need for one TMA operand: the global tensor (``src``: it or a region of
    it), its element type, the box (innermost dimension first) and the swizzle (128-byte unless said)."""
    buf = src.buffer if isinstance(src, Region) else src
    return {"buffer": buf, "dtype": TMAP_DTYPES[str(buf.dtype)], "elem_bytes": buf.dtype.bytes, "box": tuple(box),
            "swizzle": TMAP_SWIZZLE[swizzle_bytes]}


#: pass config (default True since D62; D51 added it off): a GEMM this pipeline would run without split-K goes to the
#: core's general path instead (its bulk-store epilogue, in parts where the whole tile does not fit beside the stages
#: (D58), its persistent loop with the uniform warp index and shifts (D62)), measured within 3% of this pipeline at
#: its tiles; False keeps this pipeline. Unset, a GEMM compiled with one of this pipeline's own options (PIPELINE_OWN)
#: keeps it too: those options mean nothing on the general path
GENERAL_PLAIN_GEMM = "tilecore.cuda.general_plain_gemm"
#: this pipeline's own pass configs: asked for, the plain GEMM stays here unless GENERAL_PLAIN_GEMM says otherwise
PIPELINE_OWN = ("tilecore.cuda.persistent", "tilecore.cuda.cluster_multicast", "tilecore.cuda.stage_release",
                "tilecore.cuda.stream_k", "tilecore.cuda.pipeline_profile", "tilecore.cuda.tma_store",
                "tilecore.cuda.keep_epilogue_checks", "tilecore.cuda.split_k", "tilecore.cuda.split_k_reduce")
_UNSET = object()
#: ``tilecore.cuda.general_plain_gemm`` unset: D62's rule ("auto"). The eleventh session's addendum had turned it off
#: (False, the plugin's pipeline) because the routed 128x256x64 GEMM's cold compile doubled (0.83 s of CPU against
#: 0.39 on the CI box); D65 brought it to 1.13-1.16x the plugin's (0.34 s against 0.30, min of 5-7 fresh processes),
#: at the plugin's speed at run time (0.977-1.019x on the bar's twelve rows): routed by default again. 8-bit GEMMs
#: ("auto" routes them since D67) by default too since the thirteenth session: routed 0.981-1.006x the plugin on the
#: twelve e4m3 / e5m2 rows of D67's bar (H200, 9 rounds), the compile 1.04-1.07x the plugin's (D72)
GENERAL_PLAIN_GEMM_DEFAULT = "auto"

#: pass config (D80): the form of the plain 16-bit GEMM this pipeline routes to the core's general path, as the core's
#: pass configs the route sets as the compile's defaults (``PassContext.set_defaults``: a value the config gives wins):
#: "core" (D65: the core's own defaults), "ws" (D76's warp-specialized form, ws-us-doff: a producer warpgroup where the
#: loop is carried across the persistent tile loop, descriptor offsets) or "ws-mc" (D80: the same in block groups of
#: two, the operand the pair's tiles share multicast)
GEMM_ROUTE_FORM = "tilecore.cuda.gemm_route_form"
GEMM_ROUTE_FORMS = {
    "core": {},
    "ws": {"tilecore.warp_specialize": "carried", "tilecore.cuda.uniform_warp_index": True,
           "tilecore.cuda.nonnegative_index_shifts": True, "tilecore.cuda.descriptor_offsets": True},
}
GEMM_ROUTE_FORMS["ws-mc"] = {**GEMM_ROUTE_FORMS["ws"], "tilecore.group_multicast": 2}
GEMM_ROUTE_FORM_DEFAULT = "core"


def route_form(ctx, esize: int) -> list:
    """The notes of the routed plain GEMM's form (:data:`GEMM_ROUTE_FORM`), its pass configs set as the compile's
    defaults (16-bit operands only: the forms were measured there)."""
    form = ctx.option(GEMM_ROUTE_FORM, GEMM_ROUTE_FORM_DEFAULT)
    if form not in GEMM_ROUTE_FORMS:
        raise CompileError(f"pass config {GEMM_ROUTE_FORM}={form!r}: expected one of "
                           f"{', '.join(repr(f) for f in GEMM_ROUTE_FORMS)}")
    if form == "core" or esize != 2:
        return []
    taken = ctx.set_defaults(GEMM_ROUTE_FORMS[form])
    given = [k for k in GEMM_ROUTE_FORMS[form] if k not in taken]
    return [f"cuda.hopper_gemm_pipeline: the routed GEMM's form {form!r} ({GEMM_ROUTE_FORM}): "
            + (", ".join(f"{k}={v!r}" for k, v in taken.items()) or "none")
            + (f" (given by the pass config: {', '.join(given)})" if given else "")]


#: pass config (D69): a GEMM this pipeline would split over K by its rule (D27 / D31) goes to the core's general path
#: with the core's split-K (tilecore.split_k) over the same split count, the partials summed in split order by each
#: tile's last block (the plugin's "global" form, not its cluster sum): True, False, or "auto" (16-bit GEMMs that ask
#: for none of this pipeline's own options; the count lowered to one that divides the k tiles), or "group" (D75: only
#: the split GEMMs the core sums in block groups, each block storing its panels). Default "group" since D75's round 2
#: (H200, the same user tile, the routed kernel against this pipeline's): 1.060x / 1.006x at 64x128 tiles on
#: 128x4096x4096 / 16x8192x8192 (0.992x / 1.094x this pipeline's default tile), the core's group sum 1.037x at
#: 128x128 tiles, 2 splits on 256x4096x4096; 128x64 tiles (one panel: the rank-0 form) 0.938x: not routed. The
#: D69 workspace form (True / "auto") stays below the plugin's cluster sum
GENERAL_SPLIT_K = "tilecore.cuda.general_split_k"
GENERAL_SPLIT_K_DEFAULT = "group"
#: pass config (D78): with "group", also route the rule's 3 (or more) splits where the panels do not divide among them
#: (the plugin's default 128x128 / 64x256 tiles) to the core's sum in cells (16-row bands of wgmma's fragments x one
#: 128-byte panel): True (wherever the core sums them in cells), False, or "auto" (:data:`ROUTE_CELLS`, the default):
#: only where the cells' area lies beside the pipeline's stages and the epilogue's staging tile (:data:`CELLS_AREAS`)
ROUTE_CELLS_OPTION = "tilecore.cuda.general_split_k_cells"
ROUTE_CELLS = "auto"
#: D78 (H200, rounds 1-3, two runs each, the routed kernel against the plugin at the same user tile): the cells' area
#: beside the stages 0.983-0.994x at 16x8192x8192, 1.006-1.021x at 64x8192x8192 (64x256x64/3), 0.992-0.998x at
#: 32x4096x14336 (128x128x64/4): routed. Beside the stages with the staging tile over it ("staging", 128x128x64/5 at
#: 128x4096x4096) 0.964-0.977x over ten measurements of the one kernel (median 0.972; the default-routed row 0.969 /
#: 0.966 in the last round): at the bar's edge on the H200; on an H100 (the lead's merged-tree call, two runs in
#: reversed shape order) 1.020 / 1.033x and the routed kernel 1.031 / 1.020x: routed. Over the stages 0.94x (H200),
#: 0.994-0.998x (H100): not routed
CELLS_AREAS = ("beside", "staging")
#: the cells' bytes one block receives at most where routed (3 splits of 16 cells of 4 KiB: 2 x 6 x 4 KiB)
CELLS_ROUTE_BYTES = 49152


def cells_area(ctx, recv: int, bm: int, bn: int, bk: int, stages: int, esize: int, out_bytes: int) -> str:
    """Where the core's sum in cells puts its receive area of ``recv`` bytes (D78): ``"beside"`` the pipeline's
    ``stages`` and the epilogue's staging tile, beside the stages with the staging tile over it (``"staging"``), or
    over the stages (``"stages"``), as the core decides it (its 2 KiB of slack for barriers)."""
    lim = ctx.capabilities.limit("max_shared_bytes_per_block")
    cap = int(lim[0]) if lim else 0
    ops, staging = stages * (bm * bk + bk * bn) * esize, bm * bn * out_bytes
    if ops + staging + recv + 2048 <= cap:
        return "beside"
    if recv >= staging and ops + recv + 2048 <= cap:
        return "staging"
    return "stages"


#: pass configs (D84): a split GEMM with 8-bit operands (``esize`` 1) / a 32-bit C goes to the core's group sum
#: (panels or cells) under the same rule as the 16-bit ones: True, False, or "auto" (only where the group's receive
#: area lies beside the pipeline's stages: "beside" for the panels, :data:`CELLS_AREAS` for the cells)
ROUTE_8BIT_OPTION = "tilecore.cuda.general_split_k_8bit"
#: D84 round 2 (H200, two runs in reversed shape order, e4m3 into fp16 C, the routed kernel against the plugin at the
#: same tile): 2 splits in panels beside the stages 1.052-1.140x at 128x4096x4096 (128x128x128/4, 64x256x128/3,
#: 64x128x128/4) and 0.999x at 16x8192x8192 (64x128x128/4); at 16x8192x8192 the 128x128x128/4 tile (C's 16 rows an
#: eighth of its 128: the panels exchange every row) 0.958-0.980x and 3 splits in cells (64x256x128/3) 0.968-0.972x.
#: Round 3 (H100): the routed rows 1.010-1.131x; the rows left off 0.983-0.993x (0.992-1.005x the 128-row tiles at
#: M 16 in cells). "auto" for 8-bit operands: the panels form only, beside the stages, where C's rows fill at least
#: :data:`ROUTE_8BIT_ROWS` of the tiles' rows; not the cells
ROUTE_8BIT = "auto"
ROUTE_8BIT_ROWS = 0.25
ROUTE_C32_OPTION = "tilecore.cuda.general_split_k_c32"
#: D84 round 1 (H200, two runs in reversed shape order, the routed kernel against the plugin at the same tile):
#: fp16 into fp32 C, the area beside the stages, 1.036-1.075x (64x128x64/4 in panels) and 1.021-1.027x (128x128x64/3
#: in cells) at 128x4096x4096, 0.988-0.990x (64x128x64/4, 128x128x64/3 in panels) at 16x8192x8192; over the stages
#: 0.977-0.980x (panels, 128x128x64/5 at 16x8192x8192) and 0.930x (cells, /5 at 128x4096x4096): "auto". Round 3
#: (H100): the routed rows 0.993-1.093x; over the stages 0.949-0.957x (panels), 1.000-1.008x (cells, /5)
ROUTE_C32 = "auto"


#: the note's head where a split GEMM stays on this pipeline, followed by split_k_route's reason (D84)
SPLIT_K_KEPT = "cuda.hopper_gemm_pipeline: split-K kept on this pipeline, not the core's group sum: "


def routes_split_k(ctx, esize: int = 2, split=None) -> int:
    """The split count with which a GEMM this pipeline splits over K goes to the core's general path and split-K
    (D69), 0 where it stays here (:func:`split_k_route` gives the reason too)."""
    return split_k_route(ctx, esize, split)[0]


def split_k_route(ctx, esize: int = 2, split=None) -> tuple:
    """``(count, reason)``: the split count with which a GEMM this pipeline splits over K goes to the core's general
    path and split-K (D69), or 0 and why it stays here. ``"group"`` (D75, the default): GEMMs asking for none of this
    pipeline's options, with 16-bit operands and C (8-bit operands with ``tilecore.cuda.general_split_k_8bit``, a
    32-bit C with ``tilecore.cuda.general_split_k_c32``, D84), whose split (``split``: the equal count, the
    accumulator's bytes a block, the tiles, the tile's columns, C's element bytes and, for D78, the rule's count, the
    tile's rows and k step and the loop's stages) the core sums in block groups: "in panels" (2 splits, C's tile of
    two or more 128-byte panels, a block receiving at most the core's measured bound) or, with
    ``tilecore.cuda.general_split_k_cells`` (:data:`ROUTE_CELLS`), "in cells" (the rule's count, uneven where it must
    be, where the panels do not divide among it), every group resident at once. True / "auto": the equal count."""
    v = ctx.option(GENERAL_SPLIT_K, GENERAL_SPLIT_K_DEFAULT)
    if v == "group":
        from tilecore.passes.splitk import GROUP_AUTO_BYTES, groups_at_once

        if split is None:
            return 0, "no static k tile count"
        own = [k for k in PIPELINE_OWN if ctx.option(k, _UNSET) is not _UNSET]
        if own:
            return 0, f"the pipeline's own option {own[0]} is given"
        wide8 = ctx.switch(ROUTE_8BIT_OPTION, ROUTE_8BIT, auto=True, expected="True (8-bit split GEMMs go to the "
                           "core's group sum, D84), \"auto\" (where its receive area lies beside the stages) or False")
        wide32 = ctx.switch(ROUTE_C32_OPTION, ROUTE_C32, auto=True, expected="True (split GEMMs with a 32-bit C go to "
                            "the core's group sum, D84), \"auto\" (where its receive area lies beside the stages) or "
                            "False")
        n, part, tiles, bn, out_bytes = split[:5]
        wide = (wide8 if esize == 1 else True, wide32 if out_bytes == 4 else True)
        beside_only = "auto" in wide  # D84: an 8-bit / 32-bit-C split routed only where its area lies beside
        if esize != 2 and not (esize == 1 and wide8):
            return 0, (f"{8 * esize}-bit operands ({ROUTE_8BIT_OPTION}={wide8!r})" if esize == 1 else
                       f"{8 * esize}-bit operands")
        if out_bytes != 2 and not (out_bytes == 4 and wide32):
            return 0, (f"a {8 * out_bytes}-bit C ({ROUTE_C32_OPTION}={wide32!r})" if out_bytes == 4 else
                       f"a {8 * out_bytes}-bit C")
        # the measured case: 2 splits, each block storing its panels of its tile's two or more 128-byte column
        # panels (the core's sum "in panels"), receiving at most the core's bound from its peer, every group at once
        rule, bm, bk, stages = split[5:9] if len(split) >= 9 else (n, 0, 0, 0)
        m_rows = split[9] if len(split) >= 10 else None  # C's rows where static
        panels = bn * out_bytes // 128 if bn * out_bytes % 128 == 0 else 0
        at_once = groups_at_once(ctx.capabilities)
        if tiles is None:
            return 0, "the tile count is not static"
        if n == 2 and panels >= 2 and panels % n == 0 and part // n <= GROUP_AUTO_BYTES \
                and tiles <= at_once.get(2, 0):
            area = cells_area(ctx, part // n, bm, bn, bk, stages, esize, out_bytes) if beside_only else "beside"
            if area != "beside":
                opt = ROUTE_8BIT_OPTION if wide[0] == "auto" else ROUTE_C32_OPTION
                return 0, (f"the panels' area ({part // n} bytes) fits only over the stages ('auto' routes only "
                           f"where it lies beside them; {opt}=True routes it)")
            if wide[0] == "auto" and (not m_rows or m_rows < ROUTE_8BIT_ROWS * -(-m_rows // bm) * bm):
                return 0, (f"8-bit operands: C's {m_rows or 'dynamic'} rows fill less than {ROUTE_8BIT_ROWS} of the "
                           f"{bm}-row tiles' (the panels exchange every row: measured 0.96-0.98x; "
                           f"{ROUTE_8BIT_OPTION}=True routes it)")
            return 2, ""
        # D78: the rule's count in cells where the panels do not divide among it (as this pipeline's cluster sum,
        # D41: one split fewer where the rule's groups would not all be resident at once)
        cells = (bm // 16) * panels if bm % 16 == 0 else 0
        cells_on = ctx.switch(ROUTE_CELLS_OPTION, ROUTE_CELLS, auto=True,
                              expected="True (3-split GEMMs whose panels do not divide among the splits go to the "
                                       "core's sum in cells, D78), \"auto\" (where the cells' area lies beside the "
                                       "stages: the measured case) or False")
        if n == 2 and (panels < 2 or panels % 2):
            two = f"2 splits of a tile of {panels} 128-byte panel(s) (the panels form needs 2 or more, divided)"
        elif n == 2 and part // n > GROUP_AUTO_BYTES:
            two = f"2 splits receiving {part // n} bytes a block (more than {GROUP_AUTO_BYTES})"
        elif n == 2:
            two = f"{tiles} groups of 2, {at_once.get(2, 0)} resident at once"
        else:
            two = ""
        if not cells_on:
            return 0, two or f"{ROUTE_CELLS_OPTION}=False"
        if not panels:
            return 0, two or f"C's tile rows of {bn * out_bytes} bytes are not whole 128-byte panels"
        why = two
        for m in (rule, rule - 1):
            if m < 3:
                break
            if tiles > at_once.get(m, 0):
                why = f"{tiles} groups of {m}, {at_once.get(m, 0)} resident at once"
                continue
            recv = (m - 1) * -(-cells // m) * 16 * 128 * 4 // out_bytes
            if not panels % m:
                return 0, f"{m} splits divide the tile's {panels} panels (the cells route only where they do not)"
            if cells < m:
                return 0, f"{m} splits of {cells} cells"
            if recv > CELLS_ROUTE_BYTES:
                return 0, f"{m} splits in cells receive {recv} bytes a block (more than {CELLS_ROUTE_BYTES})"
            if wide[0] == "auto":  # D84: 8-bit cells measured 0.968-0.972x the plugin
                return 0, (f"8-bit operands in cells ({m} splits; measured 0.97x the plugin: {ROUTE_8BIT_OPTION}=True "
                           "routes it)")
            if cells_on == "auto" or beside_only:
                area = cells_area(ctx, recv, bm, bn, bk, stages, esize, out_bytes)
                if area not in CELLS_AREAS:
                    opts = [o for o, v in ((ROUTE_CELLS_OPTION, cells_on), (ROUTE_8BIT_OPTION, wide[0]),
                                           (ROUTE_C32_OPTION, wide[1])) if v == "auto"]
                    return 0, (f"the cells' area ({recv} bytes) fits only {area!r}, not one of CELLS_AREAS "
                               f"{CELLS_AREAS} ({' and '.join(o + '=True' for o in opts)} "
                               f"route{'s' if len(opts) == 1 else ''} it)")
            return m, ""
        return 0, why or f"the rule's {rule} split(s)"
    v = ctx.switch(GENERAL_SPLIT_K, GENERAL_SPLIT_K_DEFAULT, auto=True,
                   expected="True (a GEMM split over K by this pipeline's rule goes to the core's general path and "
                            "tilecore.split_k), \"auto\" (16-bit GEMMs that ask for none of the pipeline's own "
                            "options), \"group\" (those the core sums in block groups, D75) or False (this "
                            "pipeline's split-K)")
    n = split[0] if split is not None else 2
    if v == "auto":
        if esize != 2:
            return 0, f"{GENERAL_SPLIT_K}='auto': {8 * esize}-bit operands"
        own = [k for k in PIPELINE_OWN if ctx.option(k, _UNSET) is not _UNSET]
        return (0, f"{GENERAL_SPLIT_K}='auto': the pipeline's own option {own[0]} is given") if own else (n, "")
    return (n, "") if v else (0, f"{GENERAL_SPLIT_K}=False")


def routes_plain_gemm(ctx, esize: int = 2) -> bool:
    """Whether the plain (non-split-K) GEMM goes to the core's general path (``tilecore.cuda.general_plain_gemm``:
    True, False, or ``"auto"``: 16-bit and, since D67 (wgmma's 8-bit m64nNk32 a unit of the core's: B as (N, K) read
    K-major by TMA and descriptor, 0.97-1.02x the plugin on the H200), 8-bit operands (``esize``: bytes an element),
    and not where one of this pipeline's own options is asked for; unset: :data:`GENERAL_PLAIN_GEMM_DEFAULT`)."""
    v = ctx.switch(GENERAL_PLAIN_GEMM, GENERAL_PLAIN_GEMM_DEFAULT, auto=True,
                   expected="True (the plain GEMM on the core's general path), \"auto\" (16- and 8-bit GEMMs that "
                            "ask for none of the pipeline's own options) or False (the plugin's Hopper pipeline); "
                            "unset: \"auto\" (D65, D72)")
    if v == "auto":
        return esize in (1, 2) and not any(ctx.option(k, _UNSET) is not _UNSET for k in PIPELINE_OWN)
    return v


def _lower(launch: KernelLaunch, ctx) -> KernelLaunch:
    body = list(launch.body.body) if isinstance(launch.body, Seq) else [launch.body]
    for k, s in enumerate(body):
        if not (isinstance(s, For) and s.kind == "pipelined"):
            continue
        try:
            p = _match(body, k, launch, ctx)
        except _NoMatch as e:
            ctx.notes.append(f"cuda.hopper_gemm_pipeline: loop over {s.var.name} not pipelined ({e})")
            continue
        limit = onchip_limit(ctx)
        other = 0
        for a in body:
            if isinstance(a, Allocate) and a.buffer not in (p.a_s, p.b_s, p.c_l):
                n = _static(a.buffer.numel())
                other += (n or 0) * a.buffer.dtype.bytes
        requested = int(s.annotations.get("num_stages") or 0) or 3
        try:
            stages = _stages(p, requested, other, limit)
        except _NoMatch as e:
            ctx.notes.append(f"cuda.hopper_gemm_pipeline: loop over {s.var.name} not pipelined ({e})")
            continue
        stage_bytes = (p.bm * p.bk + p.bk * p.bn) * p.esize
        pipe = Buffer(f"pipe_{p.a_s.name}", (pipe_bytes(stages, stage_bytes),), "uint8", "shared")
        a0 = [_affine(e, s.var, s.start) for e in p.src_a.starts]   # (row, col) = (m, k)
        b0 = [_affine(e, s.var, s.start) for e in p.src_b.starts]   # (n, k) if tb else (k, n)
        maps = [tensor_map(p.src_a, (p.atom, p.bm)), tensor_map(p.src_b, (p.atom, p.bn if p.tb else p.bk))]
        if p.epilogue:
            out = p.epilogue[1].args[1]
            shape = out.buffer.shape
            m_valid = simplify(binary("sub", shape[0], out.starts[0]))
            n_valid = simplify(binary("sub", shape[1], out.starts[1]))
            ldc = shape[1]
            target = out
            # tilecore.cuda.keep_epilogue_checks: every check compiled, as before D25 (benchmarks/cold_compile.py)
            epi = 0 if ctx.option("tilecore.cuda.keep_epilogue_checks", False) else \
                epilogue_flags(launch, p, out, m_valid, n_valid, ldc)
        else:
            target = Region(p.c_l, (as_expr(0), as_expr(0)), (as_expr(p.bm), as_expr(p.bn)))
            m_valid, n_valid, ldc = as_expr(p.bm), as_expr(p.bn), as_expr(p.bn)
            epi = 0
        attrs = {"BM": p.bm, "BN": p.bn, "BK": p.bk, "stages": stages, "consumers": p.ncwg, "MR": p.mr,
                 "dtype": p.dt, "b_kmajor": p.tb, "a_step": (a0[0][1], a0[1][1]), "b_step": (b0[0][1], b0[1][1]),
                 "epilogue": "global" if p.epilogue else "shared", "out_dtype": str(target.buffer.dtype),
                 "tensor_maps": maps, "epi": epi}
        core_split = split_k_option(ctx) is not None
        splits, why = (1, None) if core_split else split_k(launch, p, s, stages, ctx)
        if core_split and not routes_plain_gemm(ctx, p.esize):
            raise CompileError("pass config tilecore.split_k (the core's split-K, D69) splits GEMMs on the core's "
                               f"general path, which {GENERAL_PLAIN_GEMM} keeps this GEMM off: set it to True, or "
                               "use tilecore.cuda.split_k (this pipeline's split-K) instead", s.span)
        if core_split:  # D69: the core's split-K on the general path
            ctx.notes.append(f"cuda.hopper_gemm_pipeline: loop over {s.var.name} left to the core's general path "
                             "(tilecore.split_k: the core's split-K)")
            return launch.with_(attrs={**launch.attrs, GENERAL_PLAIN_GEMM: True})
        kt_all = const_value(simplify(as_expr(s.extent)))
        even = next((d for d in range(splits, 1, -1) if kt_all is not None and int(kt_all) % d == 0), 1)
        out_bytes = int(target.buffer.dtype.bytes)
        if splits > 1 and kt_all is not None:
            route, kept = split_k_route(ctx, p.esize, (even, p.bm * p.bn * 4, _tile_count(launch), p.bn, out_bytes,
                                                       splits, p.bm, p.bk, requested, _static(target.buffer.shape[0])))
        else:
            route, kept = 0, "no static k tile count" if splits > 1 else ""
        if route and (even > 1 or route != even):
            # the core's split-K runs equal splits (the largest count <= the rule's dividing the k tiles) or, summed in
            # cells (D78), the rule's count, block z running k tiles [z KT // S, (z + 1) KT // S)
            splits = route
            uneven = {"split_k_uneven": True} if int(kt_all) % splits else {}
            ctx.notes.append(f"cuda.hopper_gemm_pipeline: loop over {s.var.name} left to the core's general path with "
                             f"the core's split-K over {splits} blocks ({GENERAL_SPLIT_K})")
            group = {"split_k_reduce": "auto"} if ctx.option(GENERAL_SPLIT_K, GENERAL_SPLIT_K_DEFAULT) == "group" else {}
            return launch.with_(attrs={**launch.attrs, GENERAL_PLAIN_GEMM: True, "split_k": splits, **group, **uneven})
        if splits == 1 and routes_plain_gemm(ctx, p.esize):  # D51, D62: the plain GEMM to the general path
            ctx.notes.append(f"cuda.hopper_gemm_pipeline: loop over {s.var.name} left to the core's general path "
                             f"({GENERAL_PLAIN_GEMM}; split-K GEMMs stay here)")
            ctx.notes.extend(route_form(ctx, p.esize))
            return launch.with_(attrs={**launch.attrs, GENERAL_PLAIN_GEMM: True})  # the register programs pass it by
        starts = [a0[0][0], a0[1][0], b0[0][0], b0[1][0]]
        k_tiles = simplify(as_expr(s.extent))
        extra = ()
        if splits > 1:  # block z of `splits` runs k tiles [z KT / splits, (z + 1) KT / splits) of its tile
            tiles = _tile_count(launch)
            kt = int(const_value(k_tiles))
            reduce, rwhy, fewer = split_k_reduce(p, splits, stages, stage_bytes, tiles, ctx, s)
            if fewer != splits:  # one split fewer, in clusters that all fit at once (D41)
                sms = int(ctx.capabilities.limit("sm_count")[0])
                why, splits = _split_note(fewer, tiles, kt, f"{tiles} tiles on {sms} SMs; {rwhy}"), fewer
            launch, z, tile = _add_split_dimension(launch, splits)
            kt0 = binary("div", binary("mul", z, kt), splits)
            kt1 = binary("div", binary("mul", binary("add", z, 1), kt), splits)
            steps = [a0[0][1], a0[1][1], b0[0][1], b0[1][1]]
            starts = [simplify(binary("add", x, binary("mul", kt0, st))) if st else x for x, st in zip(starts, steps)]
            k_tiles = simplify(binary("sub", kt1, kt0))
            extra = (tile, z)
            attrs.update(splits=splits, tiles=tiles)
            if reduce == "cluster":  # D41: the tile's blocks are one cluster; no workspace
                attrs["cluster"] = splits
                why = why.replace(SPLIT_K_LAST_BLOCK, SPLIT_K_CLUSTER)
            else:
                why += f"; {rwhy}" if rwhy else ""
                attrs["workspace_bytes"] = splitk_workspace_bytes(tiles, splits, p.bm, p.bn)
        args = (Region(pipe, (as_expr(0),), (pipe.shape[0],)), target, *starts, k_tiles, m_valid, n_valid,
                simplify(as_expr(ldc)), *extra)
        coll = Collective("tc_wgmma_splitk" if splits > 1 else "tc_wgmma_pipeline", args, attrs, span=s.span)
        drop = {k - 1, k} | ({p.epilogue[0]} if p.epilogue else set())
        new = []
        for j, x in enumerate(body):
            if j == k:
                new.append(coll)
            elif j in drop:
                continue
            elif isinstance(x, Allocate) and (x.buffer in (p.a_s, p.b_s) or (p.epilogue and x.buffer is p.c_l)):
                continue
            else:
                new.append(x)
        new.insert(0, Allocate(pipe, span=s.span))
        blocks, pwhy, pingpong = persistent_blocks(launch, p, splits, new, ctx, s)
        extra_attrs = {}
        if pingpong and other + pipe_bytes(stages, stage_bytes) + 16 > limit:
            pingpong = False
            pwhy = pwhy.split("; ping-pong")[0] + "; not ping-pong: no 16 bytes of shared memory left for its barriers"
        if blocks:  # tc_wgmma_persistent (prelude/tc_persistent.cuh): `blocks` blocks loop over the tiles
            args = coll.args
            if pingpong:  # two more mbarriers (each consumer warpgroup's finished main loops) after the stages'
                big = Buffer(pipe.name, (pipe_bytes(stages, stage_bytes) + 16,), "uint8", "shared")
                args = (Region(big, (as_expr(0),), (big.shape[0],)), *args[1:])
                new[0] = Allocate(big, span=s.span)
            at = {**attrs, "hopper_persistent": blocks, "pingpong": pingpong}
            if pingpong:
                at["MR"] = p.bm // 64
            mc, mwhy = cluster_multicast_plan(launch, p, ctx, s, a0, b0, k_tiles)
            if mc:  # D44: clusters of two blocks, the shared operand's map with boxes of half its rows
                at["mcast"] = mc
                maps = list(maps)
                i = 0 if mc["share"] == 1 else 1
                maps[i] = dict(maps[i], box=(maps[i]["box"][0], maps[i]["box"][1] // 2))
                at["tensor_maps"] = maps
            if mwhy:
                pwhy += f"; {mwhy}"
            rel, rwhy = stage_release_plan(ctx, s, bool(mc))
            if rel:  # D49: how the consumers release a stage (tc_mc's REL), where not the default per thread
                at["release"] = rel
            if rwhy:
                pwhy += f"; {rwhy}"
            skm, skwhy = stream_k_plan(ctx, s, blocks, bool(mc), pingpong, launch, k_tiles)
            if skm:  # D53: the last wave's tiles in even k ranges, a fixup through a workspace
                at["stream_k"] = {"mode": skm, "slots": blocks}
                at["workspace_bytes"] = streamk_workspace_bytes(blocks, p.ncwg, p.bm, p.bn)
            if skwhy:
                pwhy += f"; {skwhy}"
            if ctx.option("tilecore.cuda.pipeline_profile", False):  # D49: the wait-time profile (a benchmark's)
                at["profile"] = True
                pwhy += "; pipeline_profile: cycle counts into tc_pipe_prof"
            tma_bytes, twhy, tma_epi = tma_store_plan(launch, p, ctx, s, stages, stage_bytes, other, limit, target,
                                                      pingpong=pingpong)
            if tma_bytes:  # the C buffer after the stages and barriers (tc_persistent.cuh: at bars + 1024)
                big = Buffer(pipe.name, (tma_store_pipe_bytes(stages, stage_bytes, tma_bytes),), "uint8", "shared")
                args = (Region(big, (as_expr(0),), (big.shape[0],)), *args[1:])
                new[0] = Allocate(big, span=s.span)
                # the direct stores' pair alignment (EPI_PAIRS: the launch checks C's address for it) is not needed:
                # the launch checks C's 16-byte alignment for its tensor map, with tma_store's own error
                at["epi"] = (at["epi"] & ~EPI_PAIRS) | tma_epi
                cmap = tensor_map(target, (SWIZZLE_BYTES // target.buffer.dtype.bytes, 64))
                cmap["fix"] = "pass_configs={'tilecore.cuda.tma_store': False}"  # the runtime's error (C's map)
                at["tensor_maps"] = [*maps, cmap]
            if twhy:
                pwhy += f"; {twhy}"
            new[new.index(coll)] = Collective("tc_wgmma_persistent", args, at, span=s.span)
            extra_attrs = {"hopper_persistent": blocks}  # not "persistent": the core's tilecore.persistent (D36)
        else:
            twhy = tma_store_plan(launch, p, ctx, s, stages, stage_bytes, other, limit, target, persistent=False)[1]
            if twhy:
                why = f"{why}; {twhy}" if why else twhy
            if multicast_asked(ctx, s):  # D44's clusters pair the tiles of the persistent grid
                mwhy = (f"not cluster_multicast: its clusters of two take tiles of the persistent grid, and this "
                        f"kernel keeps one block per {'(tile, split)' if splits > 1 else 'tile'}")
                why = f"{why}; {mwhy}" if why else mwhy
        ctx.notes.append(f"cuda.hopper_gemm_pipeline: {p.bm}x{p.bn}x{p.bk} {p.dt}, {stages} stages, "
                         f"{p.ncwg} consumer warpgroup(s) + 1 producer, epilogue to {attrs['epilogue']} memory"
                         + (f"; {why}" if why else "") + (f"; {pwhy}" if pwhy else ""))
        if splits > 1:  # D84: why the split GEMM stays on this pipeline (scripts/wgmma_census.py --split-k)
            ctx.notes.append(f"{SPLIT_K_KEPT}{kept or 'routed count ' + str(route) + ' unused'}")
        return launch.with_(body=Seq(new, span=launch.body.span), threads=(p.threads + WG,),
                            attrs={**launch.attrs, "warp_specialized": True, **extra_attrs})
    return launch


# -- a persistent grid (docs/decisions.md D34) -------------------------------------------------------------

#: blocks per multiprocessor of a persistent GEMM: the pipeline's launch bounds promise ptxas one (it may then
#: use the whole register file: 232 registers a consumer thread after setmaxnreg, or up to 255 with one
#: consumer warpgroup), so one is all that surely fits
PERSISTENT_BLOCKS_PER_SM = 1
#: ``tilecore.cuda.persistent`` unless the kernel says: on since D43 (measured on the H100 in one run, D34: 4096^3
#: fp16 0.88x -> 0.90x cuBLAS, bf16 likewise, 8192^3 +0.5-0.8%, the same bits; ping-pong 13-18% slower, so True)
PERSISTENT_DEFAULT = True


#: ``tilecore.cuda.tma_store`` unless the kernel says: on (D38, measured on the H100 in one run: fp16 4096^3 +9.4%,
#: 0.91x -> 0.99x cuBLAS; bf16 +10.3%; 8192^3 +5-6%; every configuration faster, the same bits)
TMA_STORE_DEFAULT = True
#: bytes between the pipeline's barriers and the C buffer (tc_persistent.cuh: ``cbuf = bars + 1024``; the
#: barriers take 16 a stage and 16 for ping-pong, the buffer keeps the 128-byte swizzle's 1024-byte alignment)
TMA_STORE_GAP = 1024


def tma_store_pipe_bytes(stages: int, stage_bytes: int, c_bytes: int) -> int:
    """The pipeline buffer of a persistent GEMM whose epilogue goes through shared memory: 1024 bytes of
    alignment slack, the stages, the barriers' 1024 bytes, the C buffer."""
    return 1024 + stages * stage_bytes + TMA_STORE_GAP + c_bytes


def tma_store_plan(launch: KernelLaunch, p: _Plan, ctx, loop: For, stages: int, stage_bytes: int, other: int,
                   limit: int, out: Region, persistent: bool = True, pingpong: bool = False) -> tuple:
    """``(c_bytes, note, epi)``: with ``tilecore.cuda.tma_store`` on (the default), the bytes of the shared C buffer of the
    persistent kernel's epilogue through shared memory and TMA stores (tc_persistent.cuh, TC_EPI_TMA) and its EPI
    flags, or 0 with the note that says why the kernel keeps its direct stores (a kernel that is not persistent:
    only when the config was given); off: ``(0, None, 0)``. Where the
    whole C tile does not fit beside the stages but half its columns do (block_N two or more 128-byte boxes), the
    buffer holds half and the tile is staged and stored in two halves (TC_EPI_TMA_HALF; the second half waits for
    the first's stores to have read the buffer). The C tile is staged as 64-row x
    128-byte boxes with the 128-byte swizzle, one TMA store each; TMA writes nothing outside C's shape, so ragged
    tiles need no checks. It needs a persistent grid (the stores of one tile run under the next tile's main loop),
    whole 128-byte boxes across the tile (block_N a multiple of 64 fp16 / 32 fp32 columns), C's rows a multiple
    of 16 bytes (TMA's row stride) and the C tile beside the stages in shared memory."""
    asked = ctx.option("tilecore.cuda.tma_store", None)
    explicit = asked is not None  # the kernel asked (a kernel that is not persistent says why only then)
    asked = TMA_STORE_DEFAULT if asked is None else asked
    if not isinstance(asked, bool):
        raise CompileError(f"pass config tilecore.cuda.tma_store must be True or False, got {asked!r}", loop.span)
    if not asked or (not persistent and not explicit):
        return 0, None, 0
    if not persistent:
        return 0, ("not tma_store: the epilogue through shared memory and TMA stores runs on a persistent grid "
                   "(tilecore.cuda.persistent=True), where the next tile's main loop hides it"), 0
    osize = out.buffer.dtype.bytes
    atom = SWIZZLE_BYTES // osize
    if p.bn % atom:
        return 0, (f"not tma_store: block_N = {p.bn} is not whole 128-byte rows of {out.buffer.dtype} C (a multiple "
                   f"of {atom} columns)"), 0
    ldc = simplify(as_expr(out.buffer.shape[1]))
    if not launch_facts(launch).proves_multiple(simplify(binary("mul", ldc, osize)), 16):
        return 0, (f"not tma_store: the rows of {out.buffer.name} are not provably a multiple of 16 bytes, as a TMA "
                   "store needs"), 0
    rows = 2 * p.bm if pingpong else p.bm  # ping-pong: each consumer warpgroup stages whole tiles of its own
    c_bytes = rows * p.bn * osize
    pipe = tma_store_pipe_bytes(stages, stage_bytes, c_bytes)
    what = f"two {p.bm}x{p.bn} {out.buffer.dtype} C tiles" if pingpong else \
        f"the {p.bm}x{p.bn} {out.buffer.dtype} C tile"
    halves = (p.bn // atom) % 2 == 0  # whole boxes in each half
    if other + pipe > limit and halves and other + tma_store_pipe_bytes(stages, stage_bytes, c_bytes // 2) <= limit:
        return c_bytes // 2, (f"tma_store: the epilogue through {c_bytes // 2048} KB of shared memory in two halves "
                              f"({what} does not fit beside {stages} stages) and {p.bm * p.bn * osize // 8192} TMA "
                              "stores a tile, under the next tile's main loop"), EPI_TMA | EPI_TMA_HALF
    if other + pipe > limit:
        fit = [s for s in range(stages - 1, 1, -1) if other + tma_store_pipe_bytes(s, stage_bytes, c_bytes) <= limit]
        hint = (f"num_stages={fit[0]} makes room" if fit else
                "a smaller block_M x block_N or a 16-bit C makes room")
        return 0, (f"not tma_store: {what} ({c_bytes // 1024} KB){', nor half of it,' if halves else ''} does not fit "
                   f"in shared memory beside {stages} stages ({other + pipe} of {int(limit)} bytes); {hint}"), 0
    return c_bytes, (f"tma_store: the epilogue through {c_bytes // 1024} KB of shared memory and "
                     f"{p.bm * p.bn * osize // 8192} TMA stores a tile, under the next tile's main loop"), EPI_TMA


def persistent_blocks(launch: KernelLaunch, p: _Plan, splits: int, body: list, ctx, loop: For) -> tuple:
    """``(blocks, note, pingpong)``: with ``tilecore.cuda.persistent`` on (True or "pingpong"), the number of
    blocks of the persistent grid (``limits.sm_count`` of the profile x :data:`PERSISTENT_BLOCKS_PER_SM`; the
    launch takes the smaller of it and the tiles) or 0 with the reason the kernel keeps a block per tile (the
    note says it); off: ``(0, None, False)``. A persistent kernel must store its result straight to global
    memory (the epilogue folded into the pipeline), not be split over K, and have nothing else in its body that
    runs per block. ``pingpong``: each of the two consumer warpgroups takes whole tiles in turn (its
    accumulators, BM x BN / 128 a thread, must fit as the pipeline's do)."""
    asked = ctx.option("tilecore.cuda.persistent", PERSISTENT_DEFAULT)
    if not isinstance(asked, bool) and asked != "pingpong":
        raise CompileError(f"pass config tilecore.cuda.persistent must be True, False or \"pingpong\", got {asked!r}",
                           loop.span)
    if not asked:
        return 0, None, False
    if splits > 1:
        return 0, "not persistent: a GEMM split over K keeps one block per (tile, split)", False
    if not p.epilogue:
        return 0, ("not persistent: the accumulator is used after the loop (only a GEMM whose result goes straight "
                   "to global memory with one T.copy runs on a persistent grid)"), False
    if len(launch.grid) > 3:
        return 0, "not persistent: the launch grid has more than three dimensions", False
    others = [x for x in body if not isinstance(x, (Allocate, Collective))]
    if others or sum(isinstance(x, Collective) for x in body) != 1:
        return 0, "not persistent: the kernel does more than the GEMM in each block", False
    lim = ctx.capabilities.limit("sm_count")
    if lim is None:
        return 0, "not persistent: the target's profile has no limits.sm_count", False
    blocks = int(lim[0]) * PERSISTENT_BLOCKS_PER_SM
    note = (f"persistent: at most {blocks} blocks ({int(lim[0])} SMs x {PERSISTENT_BLOCKS_PER_SM}), each looping over "
            "its tiles, the next tile's loads under this tile's epilogue")
    if asked != "pingpong":
        return blocks, note, False
    if p.ncwg != 2:
        return blocks, note + f"; not ping-pong: it needs two consumer warpgroups (threads=256), not {p.ncwg}", False
    if p.bm // 64 * p.bn // 2 > MAX_ACC_REGS:
        return blocks, note + (f"; not ping-pong: a {p.bm}x{p.bn} tile is {p.bm * p.bn // 128} accumulators a thread "
                               f"of one warpgroup, more than {MAX_ACC_REGS} (use block_N = "
                               f"{MAX_ACC_REGS * 128 // p.bm})"), False
    return blocks, note + "; ping-pong: the two consumer warpgroups take whole tiles in turn, one's epilogue under " \
                          "the other's main loop", True


# -- thread-block clusters with TMA multicast (docs/decisions.md D44) ---------------------------------------

#: ``tilecore.cuda.cluster_multicast`` unless the kernel says: off until measured (D44)
CLUSTER_MULTICAST_DEFAULT = False
#: its values: the cluster's shape in output tiles (M x N, as CUTLASS spells cluster shapes) -> the operand the two
#: tiles share and multicast (tc_persistent.cuh's tc_mc<1>: A, tiles side by side in N; tc_mc<2>: B, in M)
CLUSTER_MULTICAST_SHAPES = {"1x2": 1, "2x1": 2}


def _mentions(e, var) -> bool:
    found = []
    walk_expr(as_expr(e), lambda x: found.append(1) if x is var else None)
    return bool(found)


def multicast_asked(ctx, loop: For):
    """``tilecore.cuda.cluster_multicast``'s shape ("1x2" or "2x1"), or None when off; any other value is a
    CompileError at the user's loop."""
    asked = ctx.option("tilecore.cuda.cluster_multicast", CLUSTER_MULTICAST_DEFAULT)
    if asked is False or asked is None or asked == "off":
        return None
    if not isinstance(asked, str) or asked not in CLUSTER_MULTICAST_SHAPES:
        raise CompileError(f"pass config tilecore.cuda.cluster_multicast must be False, \"1x2\" (two tiles side by "
                           f"side in N share A) or \"2x1\" (side by side in M share B), got {asked!r}", loop.span)
    return asked


#: ``tilecore.cuda.stage_release``: how a persistent GEMM's consumers release a pipeline stage (tc_persistent.cuh's
#: TC_REL_*, docs/decisions.md D49) -> its code. "thread": every consumer thread arrives on its block's `empty`
#: barrier (and, in a cluster, each warp's first lane on the partner's); "warp": each consumer warp's first lane
#: arrives once on each block's (8 arrivals a stage a block instead of 256, 16 instead of 264 in a cluster);
#: "d44": "thread" with D44's remote arrival, release at cluster scope (a MEMBAR.ALL.GPU before each), kept to
#: measure against
STAGE_RELEASES = {"thread": 0, "warp": 1, "d44": 2}
#: unset: per warp in clusters (D49's fix of D44's stall, with its remote arrival at CTA scope), per thread without
#: (CUTLASS's count for a block alone; the default kernel's text unchanged)
STAGE_RELEASE_DEFAULT = {True: "warp", False: "thread"}


def stage_release_plan(ctx, loop: For, cluster: bool) -> tuple:
    """``(code, note)``: ``tilecore.cuda.stage_release`` for a persistent GEMM (``cluster``: in clusters of two, D44),
    the code of :data:`STAGE_RELEASES` (0, the per-thread default, leaves the kernel's text as it was) and a note
    when asked for; any other value, or "d44" without a cluster, is a CompileError at the user's loop."""
    asked = ctx.option("tilecore.cuda.stage_release", None)
    if asked is None:
        return STAGE_RELEASES[STAGE_RELEASE_DEFAULT[cluster]], ""
    if asked not in STAGE_RELEASES:
        raise CompileError(f"pass config tilecore.cuda.stage_release must be \"thread\", \"warp\" or \"d44\", got "
                           f"{asked!r}", loop.span)
    if asked == "d44" and not cluster:
        raise CompileError("pass config tilecore.cuda.stage_release=\"d44\" is the remote release of clusters with TMA "
                           "multicast: set tilecore.cuda.cluster_multicast too, or use \"thread\" or \"warp\"",
                           loop.span)
    return STAGE_RELEASES[asked], f"stage_release {asked}"


def cluster_multicast_plan(launch: KernelLaunch, p: _Plan, ctx, loop: For, a0, b0, k_tiles) -> tuple:
    """``(mcast, note)`` for a persistent GEMM: with ``tilecore.cuda.cluster_multicast`` "1x2" or "2x1", the
    collective's ``mcast`` attribute (``share``: 1 for A, 2 for B; ``dim``: the grid dimension whose neighbouring
    blocks pair up; ``shape``) or None with the note that says why the kernel keeps single blocks; off (False, the
    default): ``(None, None)``. Two tiles side by side in N share A's rows; side by side in M, B's columns. It needs
    a target with clusters, a static two-dimensional grid where one block variable moves only the shared operand's
    partner (the shared operand's coordinates and the k tiles do not mention it), and half boxes of whole
    1024-byte swizzle atoms (the shared box's rows a multiple of 16)."""
    asked = multicast_asked(ctx, loop)
    if not asked:
        return None, None
    share = CLUSTER_MULTICAST_SHAPES[asked]
    lim = ctx.capabilities.limit("max_cluster_size")
    if not ctx.capabilities.feature("clusters") or lim is None or int(lim[0]) < 2:
        return None, "not cluster_multicast: the target has no thread-block clusters"
    if len(launch.grid) != 2 or _tile_count(launch) is None:
        return None, ("not cluster_multicast: it pairs the tiles of a static two-dimensional grid "
                      "(T.Kernel(ceildiv(N, block_N), ceildiv(M, block_M)) with static M and N)")
    if share == 1:
        mine, other, name = [e[0] for e in a0], [e[0] for e in b0], "A"
    else:
        mine, other, name = [e[0] for e in b0], [e[0] for e in a0], "B"
    dims = [d for d, v in enumerate(launch.block_vars)
            if not any(_mentions(e, v) for e in mine) and not _mentions(k_tiles, v)
            and any(_mentions(e, v) for e in other)]
    if len(dims) != 1:
        return None, (f"not cluster_multicast {asked}: no block variable moves only {'B' if share == 1 else 'A'} "
                      f"({name}'s coordinates and the k tiles must not mention it)")
    rows = p.bm if share == 1 else (p.bn if p.tb else p.bk)
    if rows % 16:
        return None, (f"not cluster_multicast {asked}: half of {name}'s {rows}-row box is not whole 8-row swizzle "
                      "atoms")
    d = dims[0]
    count = int(const_value(simplify(as_expr(launch.grid[d]))))
    note = (f"cluster_multicast {asked}: clusters of two blocks on tiles side by side in {'N' if share == 1 else 'M'}, "
            f"each loading half of {name}'s box and multicasting it to both")
    if count % 2:
        note += f" ({count} tiles that way: the last of each row's pairs runs its partner's tile and stores nothing)"
    return {"share": share, "dim": d, "shape": asked}, note


# -- stream-K for the persistent grid's last wave (docs/decisions.md D53) -----------------------------------

#: ``tilecore.cuda.stream_k``'s values -> tc_persistent.cuh's TC_SK_*: True: the tiles past the last whole wave and
#: one whole wave more run stream-K, first; "tail": only those past the last whole wave; "stagger": "tail"'s, each
#: block's range between its whole tiles (later blocks earlier: few blocks at once)
STREAM_K_MODES = {True: 1, "tail": 2, "stagger": 3}
#: ``tilecore.cuda.stream_k`` unless the kernel says: off (D53, measured on the H100 in one run: every mode slower
#: than whole tiles at every shape measured, 0.54-0.95x)
STREAM_K_DEFAULT = False
#: what "auto" picks: the measured rule (D53: no shape gained, so whole tiles everywhere)
STREAM_K_AUTO = False


def streamk_workspace_bytes(slots: int, consumers: int, bm: int, bn: int) -> int:
    """Stream-K's global scratch (prelude/tc_persistent.cuh, tc_sk_flag / tc_sk_part): a uint32 flag per (slot,
    consumer warpgroup), padded to 256 bytes, then a float32 BM x BN partial tile per slot (one per block)."""
    return -(-slots * consumers * 4 // COUNTER_ALIGN) * COUNTER_ALIGN + slots * bm * bn * 4


def stream_k_plan(ctx, loop: For, blocks: int, cluster: bool, pingpong: bool, launch: KernelLaunch,
                  k_tiles) -> tuple:
    """``(mode, note)`` for a persistent GEMM: ``tilecore.cuda.stream_k`` (False, True, "auto", "tail" or "stagger"; unset:
    :data:`STREAM_K_DEFAULT`) as tc_persistent.cuh's TC_SK_* (0: off) and what the kernel's note says. Stream-K
    needs every tile to have the same k tiles (the loop's extent free of the block indices), no clusters and no
    ping-pong; where the profile's blocks divide a static tile count (or the tiles fit in one wave) there is no
    tail to balance. The kernel decides again at run time (tc_sk_tiles: the launch's grid)."""
    asked = ctx.option("tilecore.cuda.stream_k", STREAM_K_DEFAULT)
    if asked is None or asked == "off":
        asked = False
    if asked == "on":
        asked = True
    if not (asked is False or asked is True or asked in ("auto", "tail", "stagger")):
        raise CompileError(f"pass config tilecore.cuda.stream_k must be False, True, \"auto\", \"tail\" or "
                           f"\"stagger\", got {asked!r}", loop.span)
    if asked is False:
        return 0, ("stream_k off" if ctx.option("tilecore.cuda.stream_k", None) is not None else "")
    if cluster:
        return 0, "not stream_k: its pieces are a single block's (no clusters of two)"
    if pingpong:
        return 0, "not stream_k: the ping-pong warpgroups take whole tiles"
    if any(_mentions(k_tiles, v) for v in launch.block_vars):
        return 0, "not stream_k: the tiles' k tiles differ (the loop's extent names the block indices)"
    tiles = _tile_count(launch)
    if tiles is not None and (tiles <= blocks or tiles % blocks == 0):
        return 0, (f"not stream_k: {tiles} tiles on {blocks} blocks leave no partial wave")
    if asked == "auto" and not STREAM_K_AUTO:
        return 0, ("not stream_k (auto): no shape measured faster with it on the H100 (D53: 0.54-0.95x of whole tiles); "
                   "True, \"tail\" or \"stagger\" run it")
    mode = STREAM_K_MODES[asked if asked in ("tail", "stagger") else True]
    what = "the partial wave's tiles and one whole wave" if mode == 1 else "the partial wave's tiles"
    where = ", each block's range between its whole tiles (staggered)" if mode == 3 else ""
    waves = f" ({tiles} tiles on {blocks} blocks: {tiles / blocks:.2f} waves)" if tiles is not None else ""
    tag = {1: "", 2: " tail", 3: " stagger"}[mode]
    return mode, (f"stream_k{' auto' if asked == 'auto' else ''}{tag}: {what} in even k ranges over every block"
                  f"{where}{waves}, split tiles summed through a workspace")


# -- split-K (docs/decisions.md D27) ----------------------------------------------------------------------

#: the automatic rule: each split keeps at least this many k tiles per pipeline stage (the fill and drain of
#: the pipeline stay small against the split's main loop) ...
SPLIT_K_TILES_PER_STAGE = 4
#: ... but never needs more than this many: a deeper pipeline fills in one memory latency too, it only keeps
#: more in flight (D31: 5 stages asked for 20 k tiles, which held 128x4096x4096 at 3 splits) ...
SPLIT_K_LEAST_CAP = 16
#: ... a tile is split at most this many ways ...
SPLIT_K_MAX = 16
#: ... and the tile's last block reads at most this many times the operand bytes a split's main loop streams
#: (its tail: the other splits - 1 float32 partials, from L2)
SPLIT_K_TAIL_RATIO = 1
COUNTER_ALIGN = 256  # the arrival counters lead the workspace, padded to this many bytes
MAX_GRID_Z = 65535   # the splits are the grid's z dimension


def splitk_workspace_bytes(tiles: int, splits: int, bm: int, bn: int) -> int:
    """The split kernel's global scratch (prelude/tc_splitk.cuh): one uint32 arrival counter per output tile
    (padded to 256 bytes), then a float32 BM x BN partial tile per (tile, split)."""
    counters = -(-tiles * 4 // COUNTER_ALIGN) * COUNTER_ALIGN
    return counters + tiles * splits * bm * bn * 4


def _tile_count(launch: KernelLaunch):
    n = 1
    for g in launch.grid:
        v = const_value(simplify(as_expr(g)))
        if v is None:
            return None
        n *= int(v)
    return n


def _split_blockers(launch: KernelLaunch, p: _Plan, loop: For) -> str:
    """Why this pipeline's K loop cannot be split over blocks ('' when it can)."""
    if not p.epilogue:
        return "the accumulator is used after the loop (only a GEMM whose result goes straight to global memory " \
               "with one T.copy is split)"
    if _tile_count(launch) is None:
        return "the launch grid is not static"
    if len(launch.grid) > 2:
        return "the launch grid already has three dimensions"
    if const_value(simplify(as_expr(loop.extent))) is None:
        return "the number of k tiles is not static"
    return ""


def split_k(launch: KernelLaunch, p: _Plan, loop: For, stages: int, ctx) -> tuple:
    """``(splits, note)``: over how many blocks each output tile's K loop runs (1: not split) and what the
    kernel's ``hopper_pipelines`` note says about it (None: nothing).

    Automatic (no ``tilecore.cuda.split_k``): only where the grid leaves SMs idle, with ``splits`` the
    largest number such that ``tiles * splits <= SMs`` (``limits.sm_count`` of the target's profile), each
    split keeps at least ``min(SPLIT_K_TILES_PER_STAGE * stages, SPLIT_K_LEAST_CAP)`` k tiles, ``splits <=
    SPLIT_K_MAX``, and the last block's read of the other ``splits - 1`` float32 partials is at most
    ``SPLIT_K_TAIL_RATIO`` times the A and B bytes of one split's k tiles (docs/decisions.md D31).
    ``tilecore.cuda.split_k = n`` asks for ``n`` (1 switches split-K off); an ``n`` the loop cannot take is a
    CompileError at the loop's line."""
    asked = ctx.option("tilecore.cuda.split_k", None)
    if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
        raise CompileError(f"pass config tilecore.cuda.split_k must be a positive integer (1 switches split-K off), "
                           f"got {asked!r}", loop.span)
    if asked == 1:
        return 1, "split-K off (tilecore.cuda.split_k=1)"
    blocked = _split_blockers(launch, p, loop)
    if blocked:
        if asked:
            raise CompileError(f"pass config tilecore.cuda.split_k={asked}: this GEMM's K loop cannot be split over "
                               f"blocks: {blocked}. Remove tilecore.cuda.split_k (or set it to 1) for this kernel",
                               loop.span)
        return 1, None
    tiles, kt = _tile_count(launch), int(const_value(simplify(as_expr(loop.extent))))
    if asked:
        if asked > kt:
            raise CompileError(f"pass config tilecore.cuda.split_k={asked} asks for more splits than the K loop has "
                               f"k tiles ({kt}; every split needs one): use at most tilecore.cuda.split_k={kt}, or "
                               "leave it out for the automatic choice", loop.span)
        if asked > MAX_GRID_Z:
            raise CompileError(f"pass config tilecore.cuda.split_k={asked} is more blocks than a grid's z dimension "
                               f"holds ({MAX_GRID_Z}): use at most tilecore.cuda.split_k={MAX_GRID_Z}", loop.span)
        return asked, _split_note(asked, tiles, kt, "tilecore.cuda.split_k")
    lim = ctx.capabilities.limit("sm_count")
    if lim is None or tiles * 2 > int(lim[0]):
        return 1, None  # the grid fills (or half fills) the SMs: nothing to gain
    sms = int(lim[0])
    least = min(SPLIT_K_TILES_PER_STAGE * stages, SPLIT_K_LEAST_CAP)
    splits = min(sms // tiles, kt // least, SPLIT_K_MAX)
    stage, part = (p.bm + p.bn) * p.bk * p.esize, p.bm * p.bn * 4

    def long_tail(n: int) -> bool:  # the last block's partial reads against one split's A and B bytes
        return (n - 1) * part > SPLIT_K_TAIL_RATIO * -(-kt // n) * stage

    why, more = f"{tiles} tiles on {sms} SMs", splits
    while splits > 2 and long_tail(splits):
        splits -= 1
    if splits < more:
        why += f"; {more} splits would read more partial bytes in the tail than a split's k tiles stream"
    if splits < 2:
        return 1, (f"not split over K: {tiles} tiles on {sms} SMs, but {kt} k tiles are too few for two splits of "
                   f"at least {least} ({SPLIT_K_TILES_PER_STAGE} x {stages} stages"
                   + (f", at most {SPLIT_K_LEAST_CAP})" if least < SPLIT_K_TILES_PER_STAGE * stages else ")"))
    return splits, _split_note(splits, tiles, kt, why)


#: how a split tile's partials are summed unless ``tilecore.cuda.split_k_reduce`` says (docs/decisions.md D41):
#: "cluster" (the tile's blocks are one thread-block cluster and sum through each other's shared memory) where
#: the profile's clusters hold the splits and the pipeline's stages hold the receive area, else "global" (float32
#: partials in a workspace, the tile's last block sums them: D27, D31)
SPLIT_K_REDUCE_DEFAULT = "cluster"
#: ... but by default only where all of the grid's clusters fit on the GPU at once (one wave; a cluster's blocks
#: share a GPC, and the GPCs' sizes vary from chip to chip): the profile's ``execution.cluster.at_once``, clusters of
#: each size that fit at once at one block per SM as measured (cuOccupancyMaxActiveClusters on the H100 for sm_90a,
#: docs/decisions.md D41, D47). Where the rule's split count does not fit, one split fewer in clusters is taken if
#: that fits, else the workspace sum; a profile without the figures keeps the workspace sum, said in the note. The
#: runtime asks the driver again at load and warns where a GPU holds fewer.
def clusters_at_once(caps) -> dict:
    """``{cluster size: clusters resident at once}`` from the profile (``execution.cluster.at_once``; {} if absent)."""
    table = caps.get("execution.cluster.at_once") or {}
    return {int(n): int(v) for n, v in table.items()}


SPLIT_K_LAST_BLOCK = "float32 partials summed in split order by each tile's last block"
SPLIT_K_CLUSTER = ("each tile's blocks one cluster, float32 slices summed in split order through its shared "
                   "memory (DSMEM)")


def splitk_cluster_bytes(splits: int, bm: int, bn: int) -> int:
    """The cluster sum's receive area in each block's pipeline stages (prelude/tc_splitk.cuh, D41): a slot per
    sender of ``ceil(BN / 8 / splits)`` float4 columns per thread of the BM x BN tile's 64-row slices."""
    qs = -(-(bn // 8) // splits)
    return splits * (bm // 64) * qs * 128 * 16


def split_k_reduce(p: _Plan, splits: int, stages: int, stage_bytes: int, tiles: int, ctx, loop: For) -> tuple:
    """``(mode, note, splits)``: how the kernel sums a tile's partials (docs/decisions.md D41), mode ``"cluster"``
    or ``"global"``, and over how many splits (the rule's, or one fewer where only that many fit in clusters).
    ``tilecore.cuda.split_k_reduce`` asks for one; "cluster" needs thread-block clusters of ``splits`` blocks
    (``limits.max_cluster_size`` of the profile, 8 on sm_90a) and the receive area
    (:func:`splitk_cluster_bytes`) within the pipeline's stages. Asked for and impossible: a CompileError at the
    user's loop. Unset: clusters where they fit at once (:func:`clusters_at_once`; with the automatic
    split count, one split fewer if only that fits), else "global" with the note saying why."""
    asked = ctx.option("tilecore.cuda.split_k_reduce", None)
    if asked is not None and asked not in ("cluster", "global"):
        raise CompileError(f"pass config tilecore.cuda.split_k_reduce must be \"cluster\" or \"global\", got "
                           f"{asked!r}", loop.span)
    mode = asked or SPLIT_K_REDUCE_DEFAULT
    if mode == "global":
        return "global", "", splits
    lim = ctx.capabilities.limit("max_cluster_size")

    def blocker(n: int) -> str:
        if not ctx.capabilities.feature("clusters") or lim is None:
            return "the target has no thread-block clusters"
        if n > int(lim[0]):
            return f"{n} splits are more blocks than a cluster holds ({int(lim[0])})"
        if splitk_cluster_bytes(n, p.bm, p.bn) > stages * stage_bytes:
            return (f"the cluster sum's {splitk_cluster_bytes(n, p.bm, p.bn)} bytes do not fit in the pipeline's "
                    f"{stages} stages of {stage_bytes} bytes")
        return ""

    at_once = clusters_at_once(ctx.capabilities)

    def fits(n: int) -> bool:
        return tiles <= at_once.get(n, 0)

    why = blocker(splits)
    if asked:
        if why:
            raise CompileError(f"pass config tilecore.cuda.split_k_reduce=\"cluster\": {why}. Use fewer splits "
                               "(tilecore.cuda.split_k) or tilecore.cuda.split_k_reduce=\"global\"", loop.span)
        return "cluster", "", splits
    if not why and fits(splits):
        return "cluster", "", splits
    if not why:
        held = f"{ctx.capabilities.id} holds {at_once[splits]}" if splits in at_once else \
            f"{ctx.capabilities.id} declares no execution.cluster.at_once for clusters of {splits}"
        why = (f"{tiles} clusters of {splits} blocks may not all fit on the GPU at once ({held}); "
               "tilecore.cuda.split_k_reduce=\"cluster\" asks for them")
    fewer = splits - 1
    if ctx.option("tilecore.cuda.split_k", None) is None and fewer >= 2 and not blocker(fewer) and fits(fewer):
        return "cluster", (f"{splits} splits in clusters would not all fit at once on {ctx.capabilities.id} "
                           f"({at_once.get(splits, 'not measured')} of {splits}), {fewer} do "
                           f"({at_once[fewer]})"), fewer
    return "global", f"partials summed through global memory, not in one cluster per tile: {why}", splits


def _split_note(splits: int, tiles: int, kt: int, why: str) -> str:
    lo, hi = kt // splits, -(-kt // splits)
    per = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"split-K {splits} ({why}): {tiles * splits} blocks, {per} k tiles each, {SPLIT_K_LAST_BLOCK}"


def _add_split_dimension(launch: KernelLaunch, splits: int) -> tuple:
    """``launch`` with a grid dimension of ``splits`` blocks added last (slowest), its block variable, and
    the index of the block's output tile (a bijection of the original grid, ``T.use_swizzle`` or not)."""
    grid, bvars = [as_expr(g) for g in launch.grid], list(launch.block_vars)
    dtype = bvars[0].dtype
    tile = bvars[0]
    if len(grid) == 1:
        grid.append(as_expr(1))
        bvars.append(Var("split_y", dtype))
    else:
        tile = binary("add", binary("mul", bvars[1], grid[0]), bvars[0])
    z = Var("split", dtype)
    return launch.with_(grid=(*grid, as_expr(splits)), block_vars=(*bvars, z)), z, simplify(tile)


def epilogue_flags(launch: KernelLaunch, p: _Plan, out: Region, m_valid, n_valid, ldc) -> int:
    """What holds for every block of ``launch`` when the epilogue stores the tile to ``out`` (the
    TC_EPI_* flags): all of its rows are below ``m_valid`` (ROWS), all of its columns below ``n_valid``
    (COLS), and two-element stores are aligned (PAIRS: ``ldc`` and the tile's offset are even; the
    launch then checks that C's address is 16-byte aligned, as it does for the TMA operands). With
    static shapes that tiles divide (the usual case) the epilogue has no checks left: 728 SASS
    instructions instead of 2520 and 43% less NVRTC time for the 128x256 tile (docs/decisions.md D25)."""
    facts = launch_facts(launch)
    flags = 0
    if facts.proves_nonneg(simplify(binary("sub", m_valid, p.bm))):
        flags |= EPI_ROWS
    if facts.proves_nonneg(simplify(binary("sub", n_valid, p.bn))):
        flags |= EPI_COLS
    offset = binary("add", binary("mul", out.starts[0], ldc), out.starts[1])
    if facts.proves_multiple(simplify(as_expr(ldc)), 2) and facts.proves_multiple(simplify(offset), 2):
        flags |= EPI_PAIRS
    return flags


def rewrite_launches(func, ctx, lower, features=("wgmma", "bulk_tensor_copy", "warp_specialization")):
    """Apply ``lower(launch, ctx)`` (a new launch, or None to keep it) to every ``T.Kernel`` of ``func`` on
    targets with ``features`` (the Hopper ones unless ``tilecore.cuda.disable_wgmma``; none where
    ``tilecore.cuda.register_programs`` is False: the core's general path takes every kernel); what happened goes to
    ``func.attrs["hopper_pipelines"]`` (``kernel.meta["attrs"]``, IR dumps)."""
    caps = ctx.capabilities
    if not all(caps.feature(f) for f in features):
        return func

    def passed_by(why):  # the kernel stays on the core's path; the note says why (once: three passes ask)
        notes = tuple(func.attrs.get("hopper_pipelines", ()))
        return func.with_body(func.body, hopper_pipelines=notes + ((why,) if why not in notes else ()))

    if ctx.option("tilecore.checked", False):  # checked mode checks plain loads and stores: the generic path
        return passed_by("checked mode: generic path")
    if "wgmma" in features and ctx.option("tilecore.cuda.disable_wgmma", False):
        return func
    if ctx.option("tilecore.cuda.register_programs", True) is False:  # every kernel on the core's general path
        return passed_by("tilecore.cuda.register_programs is False: general path")
    before = len(ctx.notes)
    body = rewrite(func.body, lambda s: lower(s, ctx) if isinstance(s, KernelLaunch)
                   and not s.attrs.get(GENERAL_PLAIN_GEMM) else None)
    notes = tuple(func.attrs.get("hopper_pipelines", ())) + tuple(ctx.notes[before:])
    return func.with_body(body, hopper_pipelines=notes)


@tile_pass("cuda.hopper_gemm_pipeline")
def hopper_gemm_pipeline(func, ctx):
    """Pipelined GEMM main loops -> warp-specialized TMA + WGMMA pipelines (sm_90a)."""
    return rewrite_launches(func, ctx, _lower)


# -- code the emitter needs -----------------------------------------------------------------------

def wgmma_template(s: Collective) -> list:
    at = s.attrs
    return [int(s.threads), at["BM"], at["BN"], at["BK"], at["stages"], at["consumers"], at["MR"],
            "true" if at["b_kmajor"] else "false", at["a_step"][0], at["a_step"][1], at["b_step"][0],
            at["b_step"][1], "true" if at["epilogue"] == "global" else "false", at.get("epi", 0),
            _DTYPES[at["dtype"]][1], wgmma_name(at)]


def persistent_template(s: Collective) -> list:
    """tc_wgmma_persistent's explicit template arguments (prelude/tc_persistent.cuh): the pipeline's, less
    TO_GLOBAL (a persistent GEMM stores to global memory), PINGPONG before the WGMMA struct (its clusters, D44:
    an argument, ``tc_mc<share>()``)."""
    head = wgmma_template(s)
    return head[:12] + head[13:-1] + ["true" if s.attrs.get("pingpong") else "false", head[-1]]


def splitk_template(s: Collective) -> list:
    """tc_wgmma_splitk's template arguments (prelude/tc_splitk.cuh): the pipeline's, less TO_GLOBAL (its
    partials go to global memory, C too), plus the splits and the output tiles."""
    head = wgmma_template(s)
    return head[:12] + head[13:] + [s.attrs["splits"], s.attrs["tiles"]] + (["true"] if s.attrs.get("cluster") else [])


def wgmma_name(at: dict) -> str:
    return wgmma_struct(at["dtype"], at["BN"], not at["b_kmajor"])[0]


def wgmma_struct(dtype: str, n: int, trans_b: bool, a_regs: bool = False, trans_a: bool = False) -> tuple:
    """(name, C++ text) of a struct whose ``run`` issues one ``wgmma.mma_async`` m64nNk16 (16-bit) or
    m64nNk32 (8-bit): accumulators in registers (``float (&)[N / 2]``), B from a shared-memory descriptor,
    A from a descriptor or (``a_regs``) from four 32-bit registers of packed 16-bit values; D += A * B.
    ``trans_a`` / ``trans_b``: the operand in shared memory is MN-major (16-bit types only)."""
    ptx, kstep = _DTYPES[dtype]
    name = f"tc_wgmma_{'rs_' if a_regs else ''}{ptx}_n{n}_t{int(trans_b)}{'_ta' if trans_a else ''}"
    regs = n // 2
    dlist = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    if a_regs:
        a_op = "{" + ", ".join(f"%{regs + i}" for i in range(4)) + "}"
        b_op, p_op = f"%{regs + 4}", f"%{regs + 5}"
        sig = "unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned long long b"
        ins = '"r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1)'
        trans = f", {int(trans_b)}"
    else:
        a_op, b_op, p_op = f"%{regs}", f"%{regs + 1}", f"%{regs + 2}"
        sig = "unsigned long long a, unsigned long long b"
        ins = '"l"(a), "l"(b), "r"(1)'
        trans = f", {int(trans_a)}, {int(trans_b)}" if ptx in ("f16", "bf16") else ""
    text = (f"struct {name} {{\n  static __device__ __forceinline__ void run(float (&d)[{regs}], {sig}) {{\n"
            f"    asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, {p_op}, 0;\\n"
            f"wgmma.mma_async.sync.aligned.m64n{n}k{kstep}.f32.{ptx}.{ptx} {{{dlist}}}, {a_op}, {b_op}, "
            f"p, 1, 1{trans};\\n}}\\n\"\n        : {outs}\n        : {ins});\n  }}\n}};\n")
    return name, text


def wgmma_wrappers(collectives) -> str:
    """The WGMMA structs the given collectives use (``attrs["wgmma"]``: (dtype, n, trans_b, a_regs) tuples,
    or a GEMM pipeline's shape), each once."""
    out: dict = {}
    for c in collectives:
        at = c.attrs
        shapes = at.get("wgmma") or [(at["dtype"], at["BN"], not at["b_kmajor"], False)]
        for shape in shapes:
            name, text = wgmma_struct(*shape)
            out.setdefault(name, text)
    return "".join(out.values())
