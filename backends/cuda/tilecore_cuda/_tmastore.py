"""The register programs' output tile through shared memory and a TMA store (``tilecore.cuda.attention_tma_store``,
docs/decisions.md D45), FA3's epilogue. Found by form, never by name:

- the block's last 2-D fragment-to-global ``T.copy`` after the loop (FlashAttention's ``T.copy(acc_o, O[...])``,
  or TileLang's folded ``O_shared`` pair), into a 16-bit tensor whose rows are a static multiple of 16 bytes;
- a tile loaded once before the loop whose only reader is the A operand of the gemms (Q in ``S = Q K^T``), with
  the block's rows and the output's bytes a row. A WGMMA reads A from shared memory a consumer's own 64 rows at a
  time, so once the consumer's last gemm on it is done (its WGMMAs are all waited for before the epilogue), its 64
  rows of that tile are its own: it writes its rows of the output there (``stmatrix``, 128-byte swizzle, the TMA
  box's layout), fences them to the async proxy, syncs its own 128 threads on a named barrier, and one thread
  stores each 64-column box with ``cp.async.bulk.tensor`` (the tensor map clips rows and columns past the
  tensor's edge, as the direct stores' bounds tests do) and waits until the stores have read shared memory.

The values are rounded as the direct stores round them (``__floats2half2_rn`` / ``__floats2bfloat162_rn``): the
same bits. Where the form is missing, today's direct stores stay and a note says why.
"""
from __future__ import annotations

from tilecore.ir import Region, TileOp

from ._irutil import NoMatch as _No, need as _need, nonunit, static as _s
from .hopper import tensor_map

#: on (D45, H100 in one run: fast 128 x 128 674.4 -> 690.6 TFLOP/s, causal fast 583.2 -> 616.1, exact 128 x 176
#: 607.5 -> 617.2, causal exact 502.1 -> 515.9)
ATTENTION_TMA_STORE_DEFAULT = True
#: named barriers of the epilogue: EPI_BAR + consumer (the ping-pong turns use 2..7, D28)
EPI_BAR = 8
_16BIT = ("float16", "bfloat16")


def _uses(s, tile) -> list:
    """``(statement, argument position)`` for each region of ``tile`` a tile op names, in ``s`` and below."""
    from tilecore.ir import walk

    out = []

    def visit(n):
        if isinstance(n, TileOp):
            for k, a in enumerate(n.args):
                if isinstance(a, Region) and a.buffer is tile:
                    out.append((n, k))

    walk(s, visit)
    return out


def plan_store(plan: dict, ctx, name: str) -> None:
    """Sets ``plan["tma_store"]`` to ``{"stmt": id of the copy, "tile": the once-loaded tile it goes through,
    "map": the index of its tensor map}`` (the map appended to ``plan["tensor_maps"]``), or None with a note."""
    plan["tma_store"] = None
    asked = ctx.option("tilecore.cuda.attention_tma_store", None)  # given by the user (a fallback is then noted)
    if not (ATTENTION_TMA_STORE_DEFAULT if asked is None else asked):
        return
    try:
        _need(plan["mode"] == "wgmma", "no TMA on the mma.sync path")
        frags = plan["frags"]
        stores = [s for s in plan["post"] if isinstance(s, TileOp) and s.op == "copy"
                  and s.args[0].buffer in frags and frags[s.args[0].buffer] == 2 and s.args[1].buffer.scope == "global"]
        _need(stores, "no 2-D fragment stored to global memory after the loop")
        _need(len(stores) == 1, f"{len(stores)} 2-D fragments stored after the loop (one goes through shared memory)")
        s = stores[0]
        src, dst = s.args
        g = dst.buffer
        _need(str(g.dtype) in _16BIT, f"{g.name} is {g.dtype}: the epilogue through shared memory stores 16-bit tensors")
        via = s.attrs.get("via")
        _need(not via or via == str(g.dtype), f"the folded shared tile's {via} rounding before {g.dtype}")
        n = src.buffer.static_shape()[1]
        row = _s(g.shape[-1])
        _need(row is not None and (row * g.dtype.bytes) % 16 == 0,
              f"rows of {g.name} are not a static multiple of 16 bytes, as a TMA store needs")
        _need(g.ndim <= 5, "TMA stores tensors of at most 5 dimensions")
        ext = [_s(e) for e in dst.extents]
        _need(all(e is not None for e in ext), "the store's extents are not static")
        need_bytes = n * g.dtype.bytes
        tile = None
        for t in plan["once"]:
            info = plan["shared"][t]
            if info["rows"] != plan["bm"] or info["cols"] * info["esize"] != need_bytes:
                continue
            uses = [u for x in plan["pre"] + plan["body"] + plan["post"] for u in _uses(x, t)]
            if all(st.op == "gemm" and k == 0 for st, k in uses if st is not plan["copies"][t]):
                tile = t
                break
        _need(tile is not None, f"no tile loaded once that only the gemms read as A, with {plan['bm']} rows of "
                                f"{need_bytes} bytes (its rows of each consumer are free after its last gemm)")
        rd = nonunit(dst.extents)[0]
        atom = 128 // g.dtype.bytes
        box = [atom] + [64 if d == rd else ext[d] for d in reversed(range(g.ndim - 1))]
        m = {**tensor_map(dst, box), "tile": ("tma_store", id(s)),
             "fix": "pass_configs={'tilecore.cuda.attention_tma_store': False}"}
        plan["tensor_maps"] = list(plan["tensor_maps"]) + [m]
        plan["tma_store"] = {"stmt": id(s), "tile": tile, "map": ("tma_store", id(s)), "row_dim": rd, "atom": atom}
        ctx.notes.append(f"{name}: {src.buffer.name} stored through shared memory ({tile.name}'s rows of each consumer, "
                         f"free after its last gemm) and TMA stores of 64 x {atom} boxes")
    except _No as e:
        if asked is not None or plan["mode"] == "wgmma":  # (the mma.sync path has no TMA: noted only if asked)
            ctx.notes.append(f"{name}: no TMA store epilogue ({e}); direct stores from registers")


def emit_store(emit, s) -> None:
    """The epilogue of ``s`` (``plan_store`` chose it) on ``emit`` (regprog._Emit): stmatrix into the consumer's rows
    of the tile, a fence to the async proxy, the consumer's named barrier, one thread's TMA stores."""
    em, st, p = emit.em, emit.st, emit.p
    ts = p["tma_store"]
    src, dst = s.args
    g = dst.buffer
    f = em.name(st, src.buffer)
    n = src.buffer.static_shape()[1]
    rows = p["shared"][ts["tile"]]["rows"]
    atom, rd = ts["atom"], ts["row_dim"]
    pack = "tc_pack_h2" if str(g.dtype) == "float16" else "tc_pack_bf2"
    tmap = emit.map_of[ts["map"]]
    coords = [em.expr(st, x) for x in reversed(dst.starts)]  # innermost first
    rpos = g.ndim - 1 - rd

    def body():
        emit.line(f"const unsigned tc_o = {emit.tile_addr(ts['tile'])} + (unsigned)tc_c * {64 * 128}u;")
        emit.line("#pragma unroll")

        def quad():  # four 8 x 8 matrices: column blocks tc_j, tc_j + 1 x rows +0, +8 of the warp's 16
            emit.line("const int tc_m = tc_l / 8, tc_jj = tc_j + tc_m / 2;")
            emit.line("const int tc_rr = (tc_t / 32) * 16 + 8 * (tc_m % 2) + tc_l % 8;")
            emit.line(f"tc_rp_stmatrix_x4(tc_o + (unsigned)(tc_jj / 8) * {rows * 128}u + (unsigned)tc_rr * 128u + "
                      "(unsigned)(((tc_jj % 8) ^ (tc_rr % 8)) * 16),")
            emit.line(f"    {pack}({f}[4 * tc_j], {f}[4 * tc_j + 1]), {pack}({f}[4 * tc_j + 2], {f}[4 * tc_j + 3]),")
            emit.line(f"    {pack}({f}[4 * tc_j + 4], {f}[4 * tc_j + 5]), {pack}({f}[4 * tc_j + 6], {f}[4 * tc_j + 7]));")

        emit.block(f"for (int tc_j = 0; tc_j < {n // 8}; tc_j += 2)", quad)
        emit.line("tc_fence_proxy_async();  /* the rows written, to the TMA unit's proxy */")
        emit.line(f"tc_rp_wg_sync({EPI_BAR} + tc_c);  /* this consumer's rows are all written */")

        def issue():
            for a in range(n // atom):
                c = list(coords)
                c[0] = f"(int)({c[0]}) + {a * atom}"
                c[rpos] = f"(int)({c[rpos]}) + tc_c * 64"
                c = [x if k in (0, rpos) else f"(int)({x})" for k, x in enumerate(c)]
                emit.line(f"tc_tma_store_{g.ndim}d(&{tmap}, tc_o + {a * rows * 128}u, {', '.join(c)});")
            emit.line("tc_bulk_commit();")
            emit.line("tc_bulk_wait_read<0>();  /* shared memory read before the block exits */")

        emit.block("if (tc_t == 0)", issue)

    emit.block("", body)


#: prelude for kernels that call them (codegen.py includes it where ``tc_rp_stmatrix_x4(`` appears)
PRELUDE = "prelude/tc_rp_store.cuh"
