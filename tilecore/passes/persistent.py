"""A persistent tile loop: ``tilecore.persistent`` (pass config; default ``"auto"``: GEMMs with the bulk-store epilogue
and a ``T.use_swizzle`` panel over more than one wave, D56), docs/decisions.md D36.

``tilecore.persistent_tiles`` (``pipelining``, before ``tilecore.plan_pipelines``) rewrites a kernel of the form

    with T.Kernel(gx, gy, threads=...) as (bx, by):     # a static grid
        <block-level buffers>
        <setup>                                          # e.g. T.clear(C_local)
        for ko in T.Pipelined(K, num_stages=S): ...      # the one pipelined loop, at the top level
        <epilogue>                                       # e.g. T.copy(C_local, C[by * bm, bx * bn])

into ``P = min(tiles, resident blocks)`` blocks that each walk the tiles ``pid, pid + P, pid + 2P, ...``:

    with T.Kernel(P) as pid:
        <block-level buffers>
        for tile_i in range((tiles - 1 - pid) // P + 1):  # annotated "persistent_tiles"
            t = pid + tile_i * P
            bx, by = <t rasterized as the launch would: x fastest, or T.use_swizzle's panels>
            T.assume(0 <= bx < gx); T.assume(0 <= by < gy)
            <setup>; <the loop>; <epilogue>

The resident blocks are the profile's ``limits.sm_count`` (else ``execution.cores``: the CPU) times the blocks
one multiprocessor holds (its shared memory ``limits.max_shared_bytes_per_sm`` against the kernel's buffers with
the loop's stages, ``limits.max_threads_per_sm`` and ``memory.registers.per_sm`` against the register buffers
plus an allowance; each only where the profile declares it); ``tilecore.persistent=<n>`` (an int) launches
``n`` blocks instead (tests, tuning).

The pipeline planner then carries the loop across tiles (``_Launch.plan`` with ``carry``): its stage index and
barrier parity are a running count ``tile_i * K + ko``, the prologue runs once before the tile loop, and an
iteration's stage ahead past the tile's end is the next tile's first stage (its block indices from ``t + P``;
nothing past this block's last tile), so those copies are in flight during the epilogue.

A kernel that does not fit is left unchanged and ``kernel.meta["attrs"]["persistent"]`` says why.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import (Allocate, Assume, Bind, BinOp, BulkStore, BulkStoreWait, For, KernelLaunch, MatrixOp, Seq, Store, Var, as_expr, binary,
                  collect, compare, const_value, logic_and, rewrite, select, simplify, walk, walk_expr)
from ..codegen.simtcpp import _swizzle_hint  # the hint as the SIMT emitter reads it
from . import tile_pass

OPTION = "tilecore.persistent"
#: how the tile loop computes a T.use_swizzle panel's rows: "constant" (default, D56) or "runtime" (D36's form)
PANEL_ROWS_OPTION = "tilecore.persistent_panel_rows"
#: ``tilecore.persistent="auto"`` (the default, D56): the tile loop only in kernels with a bulk-store epilogue (D51's
#: ``tilecore.bulk_store``) and a ``T.use_swizzle`` panel whose grid is more than one wave of resident blocks (where
#: the H100 measured it faster: +1.3-4.4% at 128x256x64/3 panel 8, fp16/bf16 4096^3/8192^3; without a panel it
#: measured -5.6% to +4.1%); other kernels unchanged, no note
AUTO = "auto"
ANNOTATION = "persistent_tiles"
#: registers a thread needs beyond its register buffers (addresses, loop counters, descriptors): the estimate
#: of the blocks a multiprocessor holds where the profile declares ``memory.registers.per_sm``
REGISTER_ALLOWANCE = 40


@dataclass(eq=False)
class TileWalk:
    """The annotation of a persistent tile loop (what the pipeline planner needs to carry a loop across tiles):
    block ``block`` runs its tiles ``tile = block + i * blocks`` for ``i`` in ``[0, count)``; the original block
    variables are ``indices`` (expressions of ``tile``)."""

    tile: Var
    block: Var
    i: Var
    count: object
    blocks: int
    tiles: int
    block_vars: tuple
    indices: tuple
    grid: tuple

    def at(self, i_expr) -> dict:
        """``id(block variable) -> its value`` in this block's tile number ``i_expr`` (a tile past the block's last
        one included: the planner guards those copies). An index the bounds prover cannot bound from above
        (a quotient) is clamped to the grid, which changes no tile of the grid and keeps the copies' bounds
        proofs (no per-copy predicate where the plain launch had none)."""
        from .pipeline import substitute

        t = simplify(binary("add", self.block, binary("mul", i_expr, self.blocks)))
        out = {}
        for v, e, g in zip(self.block_vars, self.indices, self.grid):
            x = simplify(substitute(e, {id(self.tile): t}))
            if not (isinstance(e, BinOp) and e.op == "floormod"):
                x = binary("min", x, as_expr(g - 1))
            out[id(v)] = x
        return out

    def __repr__(self) -> str:
        return f"persistent({self.blocks} blocks, {self.tiles} tiles)"


def _limit(ctx, name):
    lim = ctx.capabilities.limit(name)
    return int(lim[0]) if lim is not None and lim[1] == "max" else None


def tile_indices(t, grid: list, swizzle, runtime_rows: bool = False):
    """The block indices of linear tile ``t`` (an expression) on ``grid`` (static extents): the first index
    fastest, or with ``T.use_swizzle(panel, order)`` ``panel`` rows of the second index (order "row") or
    ``panel`` columns of the first (order "col") walked before moving on: the order in which the SIMT emitter
    rasterizes a launch's blocks (``SIMTCppEmitter.block_indices``), here as IR over the tile's number.
    ``runtime_rows``: a panel's rows as the run-time ``min(rows left, panel)`` the emitter writes (D36's form,
    pass config ``tilecore.persistent_panel_rows="runtime"``; kept to measure D56 against)."""
    fd = lambda a, b: binary("floordiv", a, b)  # noqa: E731
    fm = lambda a, b: binary("floormod", a, b)  # noqa: E731
    if swizzle and len(grid) in (2, 3) and swizzle[0] > 0:
        panel, order = swizzle
        gx, gy = grid[0], grid[1]
        lin = fm(t, gx * gy) if len(grid) == 3 else t
        gf, gs = (gx, gy) if order == "row" else (gy, gx)
        panel = min(panel, gs)
        pn = panel * gf
        first = binary("mul", fd(lin, pn), panel)
        within = fm(lin, pn)
        if runtime_rows:
            rows = binary("min", binary("sub", as_expr(gs), first), as_expr(panel))
            fast, slow = fd(within, rows), binary("add", first, fm(within, rows))
            xy = [fast, slow] if order == "row" else [slow, fast]
            return [simplify(e) for e in xy] + ([simplify(fd(t, gx * gy))] if len(grid) == 3 else [])
        # a panel's rows: ``panel``, or ``gs % panel`` in the last panel. Both are constants, so the quotients
        # are by constants (no division by a run-time row count, which the pipeline planner would repeat in
        # every k step for the stage ahead: a 64-bit division subroutine per step, docs/decisions.md D56)
        last = gs % panel
        if last == 0:
            fast, slow = fd(within, panel), binary("add", first, fm(within, panel))
        else:
            full = compare("lt", lin, (gs - last) * gf)
            fast = select(full, fd(within, panel), fd(within, last))
            slow = binary("add", first, select(full, fm(within, panel), fm(within, last)))
        xy = [fast, slow] if order == "row" else [slow, fast]
        return [simplify(e) for e in xy] + ([simplify(fd(t, gx * gy))] if len(grid) == 3 else [])
    out, stride = [], 1
    for n, g in enumerate(grid):
        v = fd(t, stride) if stride > 1 else t
        out.append(simplify(fm(v, g) if n < len(grid) - 1 else v))
        stride *= g
    return out


def why_not(launch: KernelLaunch, ctx):
    """Why ``launch`` does not have the persistent form (None: it has), and its pipelined loop."""
    grid = [const_value(simplify(as_expr(g))) for g in launch.grid]
    if any(not isinstance(g, int) for g in grid):
        return "the grid is not static", None
    top = list(launch.body.body) if isinstance(launch.body, Seq) else [launch.body]
    loops = [s for s in top if isinstance(s, For) and s.kind == "pipelined"]
    every: list = []
    walk(launch.body, lambda x: every.append(x) if isinstance(x, For) and x.kind == "pipelined" else None)
    if len(loops) != 1 or len(every) != 1:
        return ("no T.Pipelined loop at the kernel's top level" if not every else
                f"{len(every)} pipelined loops (the form has one, at the kernel's top level)"), None
    loop = loops[0]
    # every tile runs the same loop: its bounds use the kernel's parameters and constants only (not a block index,
    # nor a scalar the block computes, e.g. a causal loop's length)
    block = {id(v) for v in launch.block_vars}
    bound = {id(b.var) for b in collect(launch.body, Bind)} | {id(f.var) for f in collect(launch.body, For)}
    used: list = []
    for e in (loop.start, loop.extent):
        walk_expr(e, lambda x: used.append(x) if isinstance(x, Var) and (id(x) in block or id(x) in bound) else None)
    if used:
        what = "the block index" if id(used[0]) in block else "the scalar"
        return (f"the loop's bounds use {what} {used[0].name}, which differs from tile to tile (every tile must run "
                "the same loop)"), None
    at = next(i for i, s in enumerate(top) if s is loop)
    for s in top:
        if isinstance(s, Allocate) and s.init is not None:
            return f"{s.buffer.name} is initialised once per block (T.alloc_var with an init)", None
    if any(isinstance(s, Allocate) for s in top[at + 1:]):
        return "a buffer is allocated after the loop", None
    setup = [s for s in top[:at] if not isinstance(s, Allocate)]
    # what the loop carries into the epilogue (an accumulator written in the loop and read after it) starts from
    # the setup's T.clear / T.fill on every tile (a fresh block's memory is not what the previous tile left); the
    # tiles the loop fills and reads are refilled in every iteration
    from .pipeline import _touches

    after = Seq(top[at + 1:])
    for a in top:
        b = a.buffer if isinstance(a, Allocate) else None
        if b is None or b.scope == "global":
            continue
        if _writes(loop.body, b) and _touches(after, b) and not any(_writes(s, b) for s in setup):
            return f"{b.name} is accumulated by the loop but not set before it (T.clear)", None
    return None, loop


def _writes(s, buf) -> bool:
    """``s`` writes ``buf``: stores, atomics, a matrix instruction's accumulators, a block-wide call's regions."""
    from ..ir import Atomic, Collective, Region

    found: list = []
    walk(s, lambda x: found.append(1) if isinstance(x, (Store, Atomic)) and x.buffer is buf
         or isinstance(x, MatrixOp) and x.c is buf
         or isinstance(x, Collective) and any(isinstance(r, Region) and r.buffer is buf for r in x.args) else None)
    return bool(found)


def resident_blocks(launch, loop, ctx):
    """``(blocks that run at once, how it was counted, {"units": multiprocessors, "per_unit": blocks on each})``,
    or ``(None, why, {})``."""
    from .pipeline import STAGE, _block_bytes, _round16

    units = _limit(ctx, "sm_count")
    what = "limits.sm_count"
    if units is None:
        cores = ctx.capabilities.get("execution.cores")
        if not isinstance(cores, int) or cores < 1:
            return None, "the profile has neither limits.sm_count nor execution.cores (tilecore.persistent=<blocks>)", {}
        units, what = cores, "execution.cores"
    per = []
    threads = 1
    for t in launch.threads:
        v = const_value(simplify(as_expr(t)))
        threads = threads * v if isinstance(v, int) else None
        if threads is None:
            break
    group = producer_group(ctx)
    if threads and group:  # tilecore.warp_specialize: the planner adds a producer group to the block
        threads += group
    smem = _limit(ctx, "max_shared_bytes_per_sm")
    if smem is not None:
        used = _block_bytes(launch)
        stages = int(loop.annotations.get("num_stages", 0) or 0)
        body = list(loop.body.body) if isinstance(loop.body, Seq) else [loop.body]
        for c in body:
            if isinstance(c, For) and c.annotations.get(STAGE):
                dst = collect(c, Store)
                if dst:
                    b = dst[0].buffer
                    n = const_value(simplify(b.numel()))
                    if isinstance(n, int):
                        used += (max(stages, 1) - 1) * _round16(n * b.dtype.bytes) + 16 * max(stages, 1)
        per.append(("shared memory", smem // max(used, 1)))
    tps = _limit(ctx, "max_threads_per_sm")
    if tps is not None and threads:
        per.append(("threads", tps // threads))
    regs = ctx.capabilities.get("memory.registers.per_sm")
    regs = int(regs) if isinstance(regs, (int, float)) and regs > 0 else None
    if regs is not None and threads:
        words = 0
        for a in collect(launch.body, Allocate):
            if a.buffer.scope == "register":
                n = const_value(simplify(a.buffer.numel()))
                words += (int(n) * a.buffer.dtype.bytes + 3) // 4 if isinstance(n, int) else 0
        need = min((words + REGISTER_ALLOWANCE + 7) // 8 * 8, 255)
        per.append((f"registers, {need} per thread estimated", regs // (need * threads)))
    blocks = min([b for _, b in per], default=1)
    blocks = max(blocks, 1)
    by = ", ".join(f"{b} by {w}" for w, b in per) or "no per-multiprocessor limits declared"
    return units * blocks, f"{units} ({what}) x {blocks} block(s) per unit ({by})", {"units": units, "per_unit": blocks}


def producer_group(ctx) -> int | None:
    """The threads of the producer group a warp-specialized block gets (``tilecore.warp_specialize`` on a target
    with ``feature:warp_specialization`` and ``limits.producer_group_threads``), else None."""
    from .pipeline import WS_FEATURE, bulk_enabled

    lim = ctx.capabilities.limit("producer_group_threads")
    if lim is None or ctx.option("tilecore.warp_specialize", False) is not True or not bulk_enabled(ctx) \
            or ctx.capabilities.satisfies(WS_FEATURE)[0] is not True:
        return None
    return int(lim[0])


def _option(v):
    """``tilecore.persistent`` as False, True or a number of blocks (strings from the command line as well)."""
    if isinstance(v, str):
        w = v.strip().lower()
        v = True if w in ("true", "on", "yes") else False if w in ("false", "off", "no", "") else \
            int(w) if w.isdigit() else AUTO if w == AUTO else v
    if v is None or v is False or (isinstance(v, int) and not isinstance(v, bool) and v == 0):
        return False
    if v is True or v == AUTO or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        return v
    from ..errors import CompileError

    raise CompileError(f"pass config {OPTION}={v!r}: expected True, False, {AUTO!r} or a positive number of blocks "
                       f"(e.g. {OPTION}=True, or {OPTION}=8 to launch 8 blocks)")


@tile_pass("tilecore.persistent_tiles")
def persistent_tiles(func, ctx):
    """With ``tilecore.persistent``: launch the resident blocks only and loop each over the tiles (module doc)."""
    want = _option(ctx.option(OPTION, AUTO))
    if want is False:
        return func
    auto = want == AUTO
    if auto and (_swizzle_hint(func) is None or not collect(func.body, BulkStore)):
        return func  # the default's cheap test first: most kernels have no panel or no bulk store
    if ctx.option("tilecore.checked", False):
        return func if auto else func.with_body(func.body, persistent=("not persistent: checked mode",))
    notes: list = []

    def launch(s):
        if not isinstance(s, KernelLaunch):
            return None
        if auto:  # only a kernel with a bulk-store epilogue and a panel, over more than one wave; nothing noted elsewhere
            why, loop = why_not(s, ctx)
            if why is not None or not collect(s.body, BulkStore):
                return None
            blocks, _how, _assumed = resident_blocks(s, loop, ctx)
            tiles = 1
            for g in s.grid:
                tiles *= int(const_value(simplify(as_expr(g))))
            if blocks is None or blocks >= tiles:
                return None
        why, loop = why_not(s, ctx)
        if why is not None:
            notes.append(f"not persistent: {why}")
            return None
        grid = [int(const_value(simplify(as_expr(g)))) for g in s.grid]
        tiles = 1
        for g in grid:
            tiles *= g
        assumed: dict = {}
        if isinstance(want, bool) or auto:
            blocks, how, assumed = resident_blocks(s, loop, ctx)
            if blocks is None:
                notes.append(f"not persistent: {how}")
                return None
        else:
            blocks, how = int(want), f"{OPTION}={int(want)}"
        if blocks >= tiles:
            notes.append(f"not persistent: {tiles} tile(s) fit in one wave of {blocks} block(s) ({how})")
            return None
        dt = s.block_vars[0].dtype
        pid = Var("tc_pid", dt)
        i = Var("tile_i", dt)
        t = Var("tile", dt)
        top = list(s.body.body) if isinstance(s.body, Seq) else [s.body]
        allocs = [x for x in top if isinstance(x, Allocate)]
        rest = [x for x in top if not isinstance(x, Allocate)]
        # the block's last wait for its bulk stores (tilecore.bulk_store) stays after the tile loop: within it the
        # stores of one tile run on under the next tile's main loop
        tail: list = []
        while rest and isinstance(rest[-1], BulkStoreWait) and not rest[-1].read:
            tail.insert(0, rest.pop())
        swz = _swizzle_hint(func)
        rows_opt = ctx.option(PANEL_ROWS_OPTION, "constant")
        if rows_opt not in ("constant", "runtime"):
            from ..errors import CompileError

            raise CompileError(f"pass config {PANEL_ROWS_OPTION}={rows_opt!r}: expected 'constant' (the default: "
                               "quotients by constants) or 'runtime' (D36's run-time panel rows, to measure against)")
        idx = tile_indices(t, grid, swz, runtime_rows=rows_opt == "runtime")
        head = [Bind(t, simplify(binary("add", pid, binary("mul", i, blocks))), span=s.span)]
        for v, e, g in zip(s.block_vars, idx, grid):
            head.append(Bind(v, e, span=s.span))
            head.append(Assume(logic_and(compare("ge", v, 0), compare("le", v, g - 1)), span=s.span))
        count = simplify(binary("add", binary("floordiv", binary("sub", as_expr(tiles - 1), pid), blocks), 1))
        info = TileWalk(t, pid, i, count, blocks, tiles, tuple(s.block_vars), tuple(idx), tuple(grid))
        tile_loop = For(i, as_expr(0), count, "serial", Seq(head + rest, span=s.span),
                        annotations={ANNOTATION: info}, span=s.span)
        order = f", T.use_swizzle({swz[0]}, {swz[1]!r}) kept" if swz else ""
        notes.append(f"persistent: {blocks} blocks over {tiles} tiles ({how}){order}")
        return s.with_(grid=(as_expr(blocks),), block_vars=(pid,), body=Seq(allocs + [tile_loop] + tail, span=s.body.span),
                       attrs={**s.attrs, "persistent": {"blocks": blocks, "tiles": tiles, **assumed}})

    body = rewrite(func.body, launch)
    return func.with_body(body, persistent=tuple(notes)) if notes else func


__all__ = ["persistent_tiles", "tile_indices", "why_not", "resident_blocks", "ANNOTATION", "OPTION"]
