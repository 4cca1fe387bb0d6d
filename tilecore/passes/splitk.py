"""Split-K on the core's general path (pass config ``tilecore.split_k``, decision D69).

A plain GEMM kernel (one top-level pipelined k loop whose matrix-unit gemms accumulate into one register fragment,
then the kernel's own epilogue) leaves most processors idle where its grid has few output tiles (an LLM's decode
rows: 128 x 4096 x 4096 is 32 tiles of 128 x 128). This pass splits the k loop over a new last grid dimension of
``S`` blocks per tile: block ``z`` runs k tiles ``[z KT / S, (z + 1) KT / S)`` (``S`` divides ``KT``), then

1. every thread stores its accumulator registers as the block's partial, in register order (register ``r`` of
   thread ``t`` at ``((tile S + z) R + r) T + t``: each register a run of the block's threads, no coordinates),
   and fences them (device scope, release);
2. after a block barrier one thread arrives on the tile's counter (an atomic add that returns the old count,
   device scope, acquire-release) and shares the count through shared memory;
3. the tile's last block (count ``S - 1``) fences (acquire), sums the ``S`` partials in split order ``0 .. S-1``
   into its registers (the same additions in the same order whichever block comes last: the result's bits do not
   depend on the blocks' timing), resets the counter to 0 and runs the kernel's own epilogue unchanged; the
   other blocks end.

The partials and the counters live in the kernel's kept workspaces (``PrimFunc.attrs["kept_workspaces"]``): the
runtime zero-fills them once per device and stream and keeps them, and the last block leaves its counter at 0, so
no call fills them again. No block ever waits for another, so the blocks may run in any order, at once or one
after another (the CPU reference runs them as OpenMP iterations).

``tilecore.split_k``: False / unset / 1 (off), an int ``S`` (``S`` must divide the k loop's trip count), or
``"auto"``: where the grid's tiles fill at most half the target's processors (``limits.sm_count``),
``S = min(SMs // tiles, KT // min(4 stages, 16), 16)`` (the rule of decisions D27 / D31, a GPU plugin's), fewer while the last
block's partial reads outweigh one split's operand bytes, then the largest divisor of ``KT`` not above that (at
least 2). Unset, a backend's pass may ask for ``S`` splits of a launch by its attribute ``split_k``. The target must declare
``features.kept_workspace`` (its code generator keeps workspaces, spells an atomic
that returns its old value and device-scope fences).
"""
from __future__ import annotations

from ..errors import CompileError
from ..ir import (INDEX, AtomicRet, Barrier, Bind, BinOp, Buffer, BufferLoad, BulkFence, BulkStore, Cast,
                  CopyBarrierArrive, CopyBarrierInit, IntImm,
                  CopyBarrierWait, Fence, For, GroupBarrier, If, KernelLaunch,
                  MatrixOp, PeerStore, PerThread, Seq, Store, ThreadIndex, TileOp, Var, Allocate, as_expr, binary, collect,
                  logic_and, select,
                  compare, const_value, rewrite, simplify, walk)
from . import tile_pass

SPLIT_K = "tilecore.split_k"
SPLIT_K_FENCES = "tilecore.split_k_fences"
SPLIT_K_PARTIALS = "tilecore.split_k_partials"
SPLIT_K_REDUCE = "tilecore.split_k_reduce"
SPLIT_K_GROUP_AREA = "tilecore.split_k_group_area"
SPLIT_K_GROUP_SYNC = "tilecore.split_k_group_sync"
SPLIT_K_UNEVEN = "tilecore.split_k_uneven"
SPLIT_K_GROUP_SUM = "tilecore.split_k_group_sum"
AT_ONCE = "would not all be resident at once"
PERSISTENT = "tilecore.persistent"  # (tilecore.passes.persistent.OPTION) off by default where a grid is split
#: D75, measured (H200): the peers' stores completing on rank 0's transaction barrier beat the group barrier after them
#: (16.86 against 17.30 us at 128x4096x4096, 41.20 against 41.33 at 16x8192x8192, 64x128 tiles, 2 splits)
SPLIT_K_GROUP_SYNC_DEFAULT = "copy_barrier"
#: D75, measured (H200): "auto" takes the group where rank 0 receives at most this many bytes in all (the peers'
#: partials, or the slices' sums and its own slice's): 32 KiB (64x128 tiles, 2 splits) ran 2.7 / 0.8 us faster than
#: the workspace sum on the LLM rows, 64 KiB (128x128, 2 splits) 0.4 / 2.2 us slower, the slices at 3 splits (84 KiB)
#: within 0.1 us / 1.2 us faster
GROUP_AUTO_BYTES = 32768
#: D78: the same bound for the sum in cells (each block receives only its own cells: 3 splits of the plugin's 128x128 /
#: 64x256 tiles, 2 x 6 cells of 4 KiB), to be measured against the workspace
CELLS_AUTO_BYTES = 49152
#: the "auto" rule's constants (decisions D27 / D31's rule, as a GPU plugin's split-K takes it)
TILES_PER_STAGE, LEAST_CAP, MAX_SPLITS, TAIL_RATIO = 4, 16, 16, 1
#: the last block's sum is written once per split index (its own partial from its registers) up to this many
#: register additions in all (splits x registers); above it, it loads its own partial back like the others
OWN_VERSIONS_LIMIT = 1024


def split_k_option(ctx):
    """``tilecore.split_k`` read: None (off), an int >= 2 or "auto" (True reads as "auto")."""
    v = ctx.switch(SPLIT_K, False, auto=True, counts=True,
                   expected="False (off), an int >= 2 (that many blocks per output tile) or \"auto\" (split where "
                            "the tiles leave the processors idle)")
    if v is True or v == "auto":
        return "auto"
    return None if v is False or v < 2 else v


def _plan(launch: KernelLaunch):
    """``(index of the pipelined loop in the launch's top level, its accumulator register buffer)`` or a reason."""
    top = launch.body.body if isinstance(launch.body, Seq) else [launch.body]
    loops = [k for k, s in enumerate(top) if isinstance(s, For) and s.kind == "pipelined"]
    if len(loops) != 1:
        return f"{len(loops)} top-level pipelined loops (one is split)"
    loop = top[loops[0]]
    accs = {id(m.c): m.c for m in collect(loop.body, MatrixOp)}
    # a gemm left as a tile op (a target that keeps fragments in block memory: the CPU reference)
    accs.update({id(t.args[2].buffer): t.args[2].buffer for t in collect(loop.body, TileOp) if t.op == "gemm"})
    if len(accs) != 1:
        return f"its pipelined loop runs {'no' if not accs else len(accs)} matrix-unit accumulators (one is split)"
    acc = next(iter(accs.values()))
    if const_value(simplify(as_expr(loop.start))) != 0 or const_value(simplify(as_expr(loop.extent))) is None:
        return "its pipelined loop's trip count is not a constant from 0"
    for g in launch.grid:
        if const_value(simplify(as_expr(g))) is None:
            return "its grid is not static"
    if len(launch.grid) > 2:
        return "its grid has 3 dimensions already (the splits take the third)"
    # the loop's only state carried out of it is the accumulator: any other buffer it writes is a shared stage tile
    # its copies fill (block memory rewritten each iteration)
    other = _loop_writes(loop) - {id(acc)}
    after = Seq(list(top[loops[0] + 1:]))
    carried = [b for b in _buffers(loop) if id(b.base or b) in other and id(b.base or b) in _reads(after)]
    if carried:
        return (f"its pipelined loop also writes {', '.join(sorted({b.name for b in carried}))} (only the gemm's "
                "accumulator is summed over the splits)")
    # the accumulator starts from zero: each split's partial is then its k range's share of the sum
    for st in top[:loops[0]]:
        for w in collect(st, Store):
            if w.buffer is acc and const_value(w.value) != 0:
                return (f"its accumulator {acc.name} starts from a value other than 0 (every split would add it): "
                        "T.clear it before the loop and add the value after")
        for t in collect(st, TileOp):
            if t.op == "fill" and t.args and getattr(t.args[0], "buffer", None) is acc \
                    and const_value(t.args[1] if len(t.args) > 1 else 0) not in (0, 0.0):
                return f"its accumulator {acc.name} is filled with a value other than 0 before the loop"
    return loops[0], acc


def _buffers(s) -> list:
    out: dict = {}

    def see(x):
        for f in ("buffer", "dst", "c"):
            b = getattr(x, f, None)
            if b is not None and hasattr(b, "scope"):
                out[id(b)] = b
        if isinstance(x, TileOp):
            for a in x.args:
                b = getattr(a, "buffer", None)
                if b is not None:
                    out[id(b)] = b

    walk(s, see)
    return list(out.values())


def _reads(s) -> set:
    """Ids of the buffers the statements read (loads in their expressions, tile ops' source regions)."""
    from ..ir import stmt_exprs, walk_expr

    ids: set = set()

    def see(x):
        for e in stmt_exprs(x):
            walk_expr(e, lambda y: ids.add(id(y.buffer.base or y.buffer)) if isinstance(y, BufferLoad) else None)
        if isinstance(x, TileOp):
            for a in x.args[:1] if x.op != "gemm" else x.args[:2]:
                b = getattr(a, "buffer", None)
                if b is not None:
                    ids.add(id(b.base or b))

    walk(s, see)
    return ids


def _loop_writes(loop) -> set:
    """Ids of the buffers the loop's statements write (stores, atomics, copy and gemm destinations)."""
    ids: set = set()

    def see(x):
        if isinstance(x, TileOp):
            if x.op in ("copy", "fill", "gemm", "reduce", "cumsum", "atomic") and len(x.args) >= 2:
                dst = x.args[2] if x.op == "gemm" else x.args[1] if x.op != "fill" else x.args[0]
                b = getattr(dst, "buffer", None)
                if b is not None:
                    ids.add(id(b.base or b))
            return
        for f in ("buffer", "dst", "c"):
            b = getattr(x, f, None)
            if b is not None and hasattr(b, "scope") and not isinstance(x, (BufferLoad,)):
                ids.add(id(b.base or b))

    walk(loop.body, see)
    return ids


def _auto_splits(ctx, tiles: int, kt: int, stages: int, stage_bytes: int, part_bytes: int):
    lim = ctx.capabilities.limit("sm_count")
    if lim is None:
        return 1, "no limits.sm_count in the target's profile"
    sms = int(lim[0])
    if tiles * 2 > sms:
        return 1, f"{tiles} tiles fill more than half of {sms} processors"
    least = min(TILES_PER_STAGE * max(stages, 1), LEAST_CAP)
    s = min(sms // tiles, kt // least, MAX_SPLITS)
    while s > 2 and (s - 1) * part_bytes > TAIL_RATIO * -(-kt // s) * stage_bytes:
        s -= 1
    while s >= 2 and kt % s:
        s -= 1
    if s < 2:
        return 1, f"{kt} k tiles are too few for two splits of at least {least}"
    return s, f"{tiles} tiles on {sms} processors"


def _reduce_option(ctx, launch=None):
    v = ctx.option(SPLIT_K_REDUCE, None)
    if v is None:  # a backend's routing may ask for it on the launch (attrs["split_k_reduce"])
        v = (launch.attrs.get("split_k_reduce") if launch is not None else None) or "workspace"
    if v in (None, "workspace", "global"):
        return "workspace"
    if v in ("group", "auto"):
        return v
    raise CompileError(f"pass config {SPLIT_K_REDUCE}={v!r}: expected \"workspace\" (partials through a kept global "
                       "workspace, the tile's last block sums), \"group\" (the tile's splits one block group, summed "
                       "through block memory) or \"auto\" (the group where every group of the grid is resident at once)")


def groups_at_once(caps) -> dict:
    """``{group size: groups resident at once}`` from the profile (``execution.cluster.at_once``; {} if absent)."""
    table = caps.get("execution.cluster.at_once") or {}
    return {int(k): int(v) for k, v in dict(table).items() if v is not None}


def _group_plan(ctx, reduce_, splits, tiles, recv_bytes, shared_bytes, stage_bytes, rank0_bytes=0,
                bound=GROUP_AUTO_BYTES):
    """``(splits, None)`` where the tile's splits run as one block group (``tilecore.split_k_reduce``), else
    ``(splits, reason)`` (the workspace sum); raises where "group" was asked for and cannot be built."""
    if reduce_ == "workspace":
        return splits, "workspace"
    why = None
    if not ctx.capabilities.get("execution.cluster.supported"):
        why = (f"target {ctx.target} has no block groups whose blocks share block memory "
               "(execution.cluster.supported)")
    else:
        lim = ctx.capabilities.limit("max_cluster_size")
        biggest = int(lim[0]) if lim else 0
        if splits > biggest:
            why = f"{splits} splits exceed the largest block group of {ctx.target} ({biggest}, limits.max_cluster_size)"
        else:
            cap = ctx.capabilities.limit("max_shared_bytes_per_block")
            room = int(cap[0]) if cap else 0
            if recv_bytes > stage_bytes and shared_bytes + recv_bytes > room:
                why = (f"the receive area of {recv_bytes} bytes ({splits - 1} partials) fits neither in the pipelined "
                       f"loop's {stage_bytes} bytes of stages nor beside the block's {shared_bytes} bytes "
                       f"(max_shared_bytes_per_block {room})")
    if why is not None:
        if reduce_ == "group":
            raise CompileError(f"pass config {SPLIT_K_REDUCE}=\"group\": {why}; use \"workspace\"")
        return splits, why
    if reduce_ == "group":
        return splits, None
    if rank0_bytes > bound:
        return splits, (f"a block would receive {rank0_bytes} bytes through block memory, more than the "
                        f"{bound} up to which the group sum measured faster than the workspace "
                        f"({'D78' if bound != GROUP_AUTO_BYTES else 'D75'})")
    at_once = groups_at_once(ctx.capabilities)
    if tiles <= at_once.get(splits, 0):
        return splits, None
    held = (f"{ctx.capabilities.id} holds {at_once[splits]} groups of {splits} at once" if splits in at_once else
            f"{ctx.capabilities.id} declares no execution.cluster.at_once for groups of {splits}")
    return splits, f"{tiles} groups of {splits} {AT_ONCE} ({held})"


@tile_pass("tilecore.split_k")
def split_k(func, ctx):
    """Split a plain GEMM's pipelined k loop over blocks, the tile's last block summing the partials in split order
    (``tilecore.split_k``; D69)."""
    want = split_k_option(ctx)
    launches = collect(func.body, KernelLaunch)
    if want is None:  # a backend's request (a pass of its own chose the split count: launch.attrs["split_k"])
        asked = [int(x.attrs["split_k"]) for x in launches if int(x.attrs.get("split_k") or 1) > 1]
        if not asked:
            return func
        want = asked[0]
        from_backend = True
    else:
        from_backend = False
    if len(launches) != 1:
        if want == "auto":
            return func
        raise CompileError(f"pass config {SPLIT_K}={want}: kernel {func.name} has {len(launches)} T.Kernel launches "
                           "(split-K takes a kernel of one)", func.span)
    launch = launches[0]
    plan = _plan(launch)
    if isinstance(plan, str):
        if want == "auto":
            ctx.notes.append(f"tilecore.split_k: not split: {plan}")
            return func
        raise CompileError(f"pass config {SPLIT_K}={want}: kernel {func.name} cannot be split over K: {plan}",
                           launch.span)
    if not ctx.capabilities.feature("kept_workspace") and _reduce_option(ctx, launch) == "workspace":
        if want == "auto":
            return func
        raise CompileError(f"pass config {SPLIT_K}={want}: target {ctx.target} keeps no workspace across calls "
                           "(features.kept_workspace), which split-K's partials and counters need", launch.span)
    k, acc = plan
    top = list(launch.body.body if isinstance(launch.body, Seq) else [launch.body])
    loop = top[k]
    kt = int(const_value(simplify(as_expr(loop.extent))))
    grid = [int(const_value(simplify(as_expr(g)))) for g in launch.grid]
    tiles = 1
    for g in grid:
        tiles *= g
    threads = 1
    for t in launch.threads:
        threads *= int(const_value(simplify(as_expr(t))))
    regs = int(const_value(simplify(acc.numel())))
    registers = acc.scope == "register"  # a fragment in each thread's registers, else a block buffer
    if not registers:
        threads = 1
    if want == "auto":
        stages = int(loop.annotations.get("num_stages") or 1)
        stage_bytes = sum(int(const_value(simplify(a.buffer.numel())) or 0) * a.buffer.dtype.bytes
                          for a in top if isinstance(a, Allocate) and a.buffer.scope == "shared")
        splits, why = _auto_splits(ctx, tiles, kt, stages, max(stage_bytes, 1), threads * regs * acc.dtype.bytes)
        if splits < 2:
            ctx.notes.append(f"tilecore.split_k: not split: {why}")
            return func
    else:
        splits, why = want, "the backend's request" if from_backend else SPLIT_K
        if kt % splits and not ctx.option(SPLIT_K_UNEVEN, bool(from_backend and launch.attrs.get("split_k_uneven"))):
            divs = [d for d in range(2, kt + 1) if kt % d == 0 and d <= 64]
            raise CompileError(f"pass config {SPLIT_K}={splits}: the k loop's {kt} iterations do not divide into "
                               f"{splits} equal splits; use one of {divs[:12]} (or {SPLIT_K_UNEVEN}=True: block z "
                               f"runs k tiles [z KT // S, (z + 1) KT // S))", loop.span)
    per = kt // splits
    # tilecore.split_k_reduce: the tile's splits one block group, summed through block memory (D75), or the workspace
    reduce_ = _reduce_option(ctx, launch)
    group_why, form = "workspace", "rank0"
    if reduce_ != "workspace":
        if not registers and ctx.capabilities.get("execution.cluster.supported"):
            group_why = "the accumulator is a block buffer, not registers"
            if reduce_ == "group":
                raise CompileError(f"pass config {SPLIT_K_REDUCE}=\"group\": target {ctx.target} keeps the "
                                   "accumulator in block memory; the group sum exchanges registers", launch.span)
        elif not registers:
            splits, group_why = _group_plan(ctx, reduce_, splits, tiles, 0, 0, 0)  # names the missing capability
        else:
            stages = int(loop.annotations.get("num_stages") or 1)
            dead = _stage_buffers(top, loop, acc)
            stage_bytes = stages * sum(_nbytes(b) for b in dead)
            shared_bytes = stage_bytes + sum(_nbytes(a.buffer) for a in top if isinstance(a, Allocate)
                                             and a.buffer.scope == "shared" and a.buffer not in dead)
            cap = ctx.capabilities.limit("max_shared_bytes_per_block")

            def plan(n):
                f = _group_form(ctx, n, regs, top[k + 1:], acc, threads)
                part = regs * threads * acc.dtype.bytes
                if isinstance(f, tuple):  # panels: each block receives its panels' groups from every peer
                    recv = (n - 1) * max(len(o) for o in f[1]) * threads * 4 * acc.dtype.bytes
                elif isinstance(f, _Cells):  # cells: each block receives its cells from every peer
                    recv = (n - 1) * f.most(n) * f.cell_bytes(acc.dtype.bytes)
                else:
                    recv = _slices_bytes(n, regs, threads, acc) if f == "slices" else (n - 1) * part
                # rank 0 receives all of its area: the peers' partials, or a slice from each and the others' sums
                why_not = _group_plan(ctx, reduce_, n, tiles, recv, shared_bytes + 2048, stage_bytes, recv,
                                      CELLS_AUTO_BYTES if isinstance(f, _Cells) else GROUP_AUTO_BYTES)[1]
                beside = bool(cap) and shared_bytes + 2048 + recv <= int(cap[0])
                # D78: the cells' area beside the stages with the epilogue's staging tile over it (written after the
                # block's sum has read the area), where the area does not fit beside them otherwise
                stg = _staging(top, k, f) if isinstance(f, _Cells) and not beside else None
                if stg is not None and recv >= _nbytes(stg) and shared_bytes - _nbytes(stg) + 2048 + recv <= int(cap[0]):
                    beside = "staging"
                return f, why_not, beside

            form, group_why, beside = plan(splits)
            # the plugin's rule (D41): where the compiler chose the count and its groups do not all fit at once, one
            # split fewer in groups if those do (the k tiles then split unevenly where they must)
            if group_why and AT_ONCE in group_why and reduce_ == "auto" and (want == "auto" or from_backend) \
                    and splits > 2:
                f2, why2, beside2 = plan(splits - 1)
                if why2 is None:
                    splits, per, form, group_why, beside = splits - 1, kt // (splits - 1), f2, None, beside2
    # the grid: the splits as the last dimension (a 1-D grid gets a unit second one)
    bvars = list(launch.block_vars)
    gexprs = [as_expr(g) for g in launch.grid]
    tile = bvars[0]
    if len(gexprs) == 1:
        gexprs.append(as_expr(1))
        bvars.append(Var("split_y", bvars[0].dtype))
    else:
        tile = binary("add", binary("mul", bvars[1], as_expr(grid[0])), bvars[0])
    z = Var("split", bvars[0].dtype)
    from .pipeline import substitute

    ko = loop.var
    inner = Var(ko.name, ko.dtype)
    if kt % splits:  # tilecore.split_k_uneven: block z runs k tiles [z KT // S, (z + 1) KT // S) (D75)
        k0 = binary("floordiv", binary("mul", z, as_expr(kt)), as_expr(splits))
        k1 = binary("floordiv", binary("mul", binary("add", z, as_expr(1)), as_expr(kt)), as_expr(splits))
        body = substitute(loop.body, {id(ko): binary("add", inner, k0)})
        loop = loop.with_(var=inner, extent=binary("sub", k1, k0), body=body)
    else:
        body = substitute(loop.body, {id(ko): binary("add", inner, binary("mul", z, as_expr(per)))})
        loop = loop.with_(var=inner, extent=as_expr(per), body=body)
    if group_why is None and isinstance(form, _Cells):
        own = beside and ctx.option(SPLIT_K_GROUP_AREA, "auto") != "stages"
        return _group_cells(func, ctx, launch, top, k, loop, acc, splits, per, kt, regs, threads, z, gexprs, bvars,
                            ko, [] if own else _stage_buffers(top, top[k], acc), reduce_, form,
                            own and beside == "staging")
    if group_why is None and (form == "slices" or isinstance(form, tuple)):
        return _group_slices(func, ctx, launch, top, k, loop, acc, splits, per, kt, regs, threads, z, gexprs, bvars,
                             ko, [] if beside and ctx.option(SPLIT_K_GROUP_AREA, "auto") != "stages" else
                             _stage_buffers(top, top[k], acc), reduce_, form if isinstance(form, tuple) else None)
    if group_why is None:
        return _group_sum(func, ctx, launch, top, k, loop, acc, splits, per, kt, regs, threads, tile, z, gexprs, bvars,
                          ko, [] if beside and ctx.option(SPLIT_K_GROUP_AREA, "auto") != "stages" else
                          _stage_buffers(top, top[k], acc), reduce_)
    if not ctx.capabilities.feature("kept_workspace"):  # "auto" where the group does not apply either
        if want == "auto":
            return func
        raise CompileError(f"pass config {SPLIT_K}={want}: target {ctx.target} keeps no workspace across calls "
                           f"(features.kept_workspace), which split-K's partials and counters need, and the group sum "
                           f"does not apply ({group_why})", launch.span)
    if reduce_ != "workspace":
        ctx.notes.append(f"tilecore.split_k_reduce={reduce_}: the workspace sum: {group_why}")
    # the kept workspaces: float partials in register order, an int32 arrival counter per tile
    parts = Buffer("tc_splitk_parts", (tiles * splits * regs * threads,), acc.dtype, "global")
    counts = Buffer("tc_splitk_count", (tiles,), "int32", "global")
    last = Buffer("tc_splitk_last", (1,), "int32", "shared")
    tid = ThreadIndex(INDEX) if registers else as_expr(0)
    span = loop.span

    # tilecore.split_k_partials: "vector" (the default): register r of thread t in a group of 4 consecutive floats,
    # (((tile S + z) R/4 + r/4) T + t) 4 + r%4: a warp's 4 registers one 512-byte run (16-byte accesses), and the last
    # block adds its own registers in its split's place; "scalar": register r of thread t at ((tile S + z) R + r) T
    # + t (a warp's register one 128-byte run), the last block reading back its own partial too
    form = ctx.option(SPLIT_K_PARTIALS, "vector")
    if form not in ("vector", "scalar"):
        raise CompileError(f"pass config {SPLIT_K_PARTIALS}={form!r}: expected \"vector\" or \"scalar\"")
    vec = 4 if form == "vector" and registers and regs % 4 == 0 else 1
    # the last block's own partial from its registers: the sum written once per split index (each version's loads
    # unconditional, so the vector loads stay whole), where those versions stay small
    own = form == "vector" and registers and splits * regs <= OWN_VERSIONS_LIMIT

    def at(split, r):
        base = binary("add", binary("mul", tile, as_expr(splits)), split)
        if vec == 1:
            return binary("add", binary("mul", binary("add", binary("mul", base, as_expr(regs)), r), as_expr(threads)),
                          tid)
        g, lane = int(const_value(r)) // vec, int(const_value(r)) % vec
        run = binary("add", binary("mul", base, as_expr(regs // vec)), as_expr(g))
        return binary("add", binary("mul", binary("add", binary("mul", run, as_expr(threads)), tid), as_expr(vec)),
                      as_expr(lane))

    def elem(r):  # element r of the accumulator (register r, or the block buffer's r-th in row-major order)
        if registers:
            return (as_expr(r),)
        idx, rest = [], r
        for d in reversed(acc.shape):
            idx.append(binary("floormod", rest, d) if idx or len(acc.shape) > 1 else rest)
            rest = binary("floordiv", rest, d)
        return tuple(reversed(idx))

    # every thread's own fences (tilecore.split_k_fences); without them (the default) the arrival's acquire-release
    # atomic orders the block's partial stores, which the barrier before it makes the arriving thread's (and its
    # acquire the reads after the barrier behind it): the pattern of a release by one thread after a block barrier
    fences = bool(ctx.option(SPLIT_K_FENCES, False))
    release = [Fence(scope="device", order="release", span=span)] if fences else []
    if registers:
        partial = PerThread(Seq([*(Store(parts, (at(z, as_expr(r)),), BufferLoad(acc, elem(r)), span=span)
                                   for r in range(regs)), *release]),
                            attrs={"split_k": "partial"}, span=span)
    else:
        e = Var("e", INDEX)
        partial = Seq([For(e, as_expr(0), as_expr(regs), "parallel",
                           Store(parts, (at(z, e),), BufferLoad(acc, elem(e)), span=span), span=span), *release])
    arrive = Store(last, (as_expr(0),), AtomicRet("add", counts, (tile,), as_expr(1, "int32"), "acq_rel", "device"),
                   span=span)

    def total(r, mine=None):
        def part(s):  # split s's partial: loaded, or the block's own registers where s is its split (``mine``)
            return BufferLoad(acc, elem(r)) if s == mine else BufferLoad(parts, (at(as_expr(s), r),))

        t = part(0)
        for s in range(1, splits):
            t = binary("add", t, part(s))
        return t

    sums = [Fence(scope="device", order="acquire", span=span)] if fences else []
    if own:
        version = None
        for mine in reversed(range(splits)):
            body = Seq([Store(acc, elem(r), total(as_expr(r), mine), span=span) for r in range(regs)])
            version = body if version is None else If(compare("eq", z, as_expr(mine)), body, version, span=span)
        sums.append(version)
    elif registers:
        sums += [Store(acc, elem(r), total(as_expr(r)), span=span) for r in range(regs)]
    else:
        e = Var("e", INDEX)
        sums.append(For(e, as_expr(0), as_expr(regs), "parallel", Store(acc, elem(e), total(e), span=span), span=span))
    sum_stmt = PerThread(Seq(sums), attrs={"split_k": "sum in split order"}, span=span) if registers else Seq(sums)
    reset = Store(counts, (tile,), as_expr(0, "int32"), span=span)
    rest = top[k + 1:]
    is_last = compare("eq", BufferLoad(last, (as_expr(0),)), as_expr(splits - 1, "int32"))
    tail = If(is_last, Seq([sum_stmt, reset, *rest]), None, span=span)
    new_top = [Allocate(last, span=span), *top[:k], loop, partial, Barrier(span=span), arrive, Barrier(span=span), tail]
    launch2 = launch.with_(grid=(*gexprs, as_expr(splits)), block_vars=(*bvars, z), body=Seq(new_top))
    body = rewrite(func.body, lambda x: launch2 if isinstance(x, KernelLaunch) else None)
    kept = tuple(func.attrs.get("kept_workspaces", ())) + (parts, counts)
    note = (f"tilecore.split_k: k loop over {ko.name} split over {splits} blocks a tile ({why}; {_per_text(per, kt, splits)} of {kt} k tiles "
            f"each), {acc.dtype} partials of {regs} registers x {threads} threads summed in split order by each "
            "tile's last block" + (f" (tilecore.split_k_reduce={reduce_}: not in a block group: {group_why})"
                                   if reduce_ != "workspace" else ""))
    ctx.notes.append(note)
    ctx.set_defaults({PERSISTENT: False})  # a split grid is one wave of (tile, split) blocks
    return func.with_body(body, kept_workspaces=kept, split_k=(note,))


def _per_text(per: int, kt: int, splits: int) -> str:
    return str(per) if kt % splits == 0 else f"{per}-{per + 1}"


def _staging(top, k, cells):
    """The block buffer the epilogue's bulk store reads (its staging tile), where the launch's top level allocates it
    before the main loop and nothing before the epilogue uses it; else None."""
    src = cells.store.src
    if not any(isinstance(a, Allocate) and a.buffer is src for a in top[:k]) or id(src) in _reads(top[k]) \
            or id(src) in _loop_writes(top[k]):
        return None
    return src


def _nbytes(b) -> int:
    return int(const_value(simplify(b.numel())) or 0) * b.dtype.bytes


def _stage_buffers(top, loop, acc) -> list:
    """The block buffers of the launch's top level that only the pipelined loop uses (its stage tiles): dead after it."""
    writes = _loop_writes(loop) - {id(acc)}
    k = top.index(loop)
    after = _reads(Seq(list(top[k + 1:])))
    return [a.buffer for a in top[:k] if isinstance(a, Allocate) and a.buffer.scope == "shared"
            and id(a.buffer) in writes and id(a.buffer) not in after]


def _group_sum(func, ctx, launch, top, k, loop, acc, splits, per, kt, regs, threads, tile, z, gexprs, bvars, ko, dead,
               reduce_):
    """The tile's ``splits`` blocks one block group (``launch.attrs["block_group"]``, D75): after the main loop the
    blocks of ranks 1 .. S-1 store their accumulator registers into rank 0's receive area (block memory, float4
    groups in the vector partials' order), a group barrier, and rank 0 sums them in split order (its own registers
    first: the workspace form's additions, the same bits) and runs the kernel's epilogue; the others end."""
    span = loop.span
    vec = 4 if regs % 4 == 0 else 1
    recv = Buffer("tc_group_recv", ((splits - 1) * regs * threads,), acc.dtype, "shared")
    recv_bytes = _nbytes(recv)
    stage_bytes = int(loop.annotations.get("num_stages") or 1) * sum(_nbytes(b) for b in dead)
    # tilecore.split_k_group_area: "auto" (default): the receive area beside the block's buffers where it fits there
    # (free from the start: no barrier after the main loop, only the wait of an arrival at the top), else over the
    # pipelined loop's stages (every block past its main loop first); "stages": over the stages wherever they hold it
    reuse = tuple(b.name for b in dead) if dead and recv_bytes <= stage_bytes else ()
    tid = ThreadIndex(INDEX)

    def slot(j, r):  # block j's (1 .. S-1) register r in rank 0's receive area
        g, lane = r // vec, r % vec
        run = binary("add", binary("mul", as_expr(j - 1), as_expr(regs // vec)), as_expr(g))
        return binary("add", binary("mul", binary("add", binary("mul", run, as_expr(threads)), tid), as_expr(vec)),
                      as_expr(lane))

    # tilecore.split_k_group_sync: "barrier" (default): a group barrier after the stores (arrive with release: each
    # sending thread's stores complete first); "copy_barrier": the stores complete on a transaction barrier in rank 0's
    # block memory announced for all their bytes, rank 0 waits for it alone (no release, no second group barrier;
    # a receive area of its own only, on targets with transaction barriers: features.bulk_tensor_copy)
    sync = ctx.option(SPLIT_K_GROUP_SYNC, SPLIT_K_GROUP_SYNC_DEFAULT)
    if sync not in ("barrier", "copy_barrier"):
        raise CompileError(f"pass config {SPLIT_K_GROUP_SYNC}={sync!r}: expected \"barrier\" or \"copy_barrier\"")
    full = None
    if sync == "copy_barrier" and not reuse and ctx.capabilities.feature("bulk_tensor_copy"):
        full = Buffer("tc_group_full", (1,), "uint64", "shared")
    # every other rank: its registers into rank 0's area at its own slot, in float4 groups
    sends = []
    for j in range(1, splits):
        stores = [PeerStore(recv, (slot(j, r),), tuple(BufferLoad(acc, (as_expr(r + q),)) for q in range(vec)),
                            as_expr(0), full, as_expr(0) if full is not None else None, span=span)
                  for r in range(0, regs, vec)]
        sends.append((j, Seq(stores)))
    version = None
    for j, body in reversed(sends):
        version = body if version is None else If(compare("eq", z, as_expr(j)), body, version, span=span)
    send = PerThread(version, attrs={"split_k": "group send"}, span=span)
    # rank 0: its own registers, then splits 1 .. S-1 from its receive area, in split order
    sums = []
    for r in range(regs):
        t = BufferLoad(acc, (as_expr(r),))
        for j in range(1, splits):
            t = binary("add", t, BufferLoad(recv, (slot(j, r),)))
        sums.append(Store(acc, (as_expr(r),), t, span=span))
    reduce_stmt = PerThread(Seq(sums), attrs={"split_k": "group sum in split order"}, span=span)
    head, rest, last_alloc = _split_top(top, k)
    start, after_loop = _group_sync(reuse, span, full)
    if full is not None:  # rank 0's barrier initialised and announced (all the peers' bytes) before the blocks meet
        zero = as_expr(0)
        start.append(If(compare("eq", z, zero), CopyBarrierArrive(full, zero, recv_bytes, span=span), None,
                        span=span))
        tail = [If(compare("ne", z, zero), send, None, span=span),
                If(compare("eq", z, zero), Seq([CopyBarrierWait(full, zero, zero, span=span), reduce_stmt, *rest]),
                   None, span=span)]
    else:
        tail = [If(compare("ne", z, as_expr(0)), send, None, span=span),
                GroupBarrier("arrive", "release", span=span), GroupBarrier("wait", "acquire", span=span),
                If(compare("eq", z, as_expr(0)), Seq([reduce_stmt, *rest]), None, span=span)]
    new_top = [Allocate(recv, reuses=reuse, span=span), *head[:last_alloc], *start, *head[last_alloc:], loop,
               *after_loop, *tail]
    note = (f"tilecore.split_k: k loop over {ko.name} split over {splits} blocks a tile ({_per_text(per, kt, splits)} of {kt} k tiles each), "
            f"one block group a tile (tilecore.split_k_reduce={reduce_}): {acc.dtype} partials of {regs} registers x "
            f"{threads} threads stored into rank 0's block memory "
            f"({'over its stages' if reuse else 'a receive area of its own'}, {recv_bytes} bytes"
            f"{', the stores completing on its transaction barrier' if full is not None else ''}) and summed there "
            "in split order")
    return _finish_group(func, ctx, launch, gexprs, bvars, z, splits, new_top, note)


def _finish_group(func, ctx, launch, gexprs, bvars, z, splits, new_top, note):
    """The group sums' common end: the launch with the splits as its last grid dimension, one block group a tile
    (``attrs["block_group"]``), its body ``new_top``; the note recorded; persistent launches off by default (a split
    grid is one wave of (tile, split) blocks)."""
    attrs = dict(launch.attrs)
    attrs["block_group"] = tuple([1] * len(gexprs) + [splits])
    attrs["block_group_by"] = SPLIT_K_REDUCE  # the option that made the group (a backend's warnings name it, D84)
    launch2 = launch.with_(grid=(*gexprs, as_expr(splits)), block_vars=(*bvars, z), body=Seq(new_top), attrs=attrs)
    body = rewrite(func.body, lambda x: launch2 if isinstance(x, KernelLaunch) else None)
    ctx.notes.append(note)
    ctx.set_defaults({PERSISTENT: False})
    return func.with_body(body, split_k=(note,))


def _eval_int(e, t, env):
    """An integer index expression over the thread index ``t`` (a numpy array of every thread's), or None."""
    import numpy as np

    if isinstance(e, IntImm):
        return e.value
    if isinstance(e, ThreadIndex):
        return t
    if isinstance(e, Var):
        return env.get(id(e))
    if isinstance(e, Cast):
        return _eval_int(e.value, t, env)
    if not isinstance(e, BinOp):
        return None
    a, b = _eval_int(e.a, t, env), _eval_int(e.b, t, env)
    if a is None or b is None:
        return None
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    ops = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "floordiv": lambda: a // b,
           "floormod": lambda: np.mod(a, b), "min": lambda: np.minimum(a, b), "max": lambda: np.maximum(a, b),
           "div": lambda: np.where((a < 0) ^ (b < 0), -(np.abs(a) // np.abs(b)), a // b),
           "shl": lambda: a << b, "shr": lambda: a >> b, "bitand": lambda: a & b, "bitor": lambda: a | b,
           "xor": lambda: a ^ b}
    if e.op not in ops or (e.op in ("floordiv", "floormod", "div") and (b == 0).any()):
        return None
    return ops[e.op]()


def _split_top(top: list, k: int) -> tuple:
    """``(head, rest, last_alloc)`` of a kernel's top-level statements around its main loop ``top[k]``: what comes
    before and after it, and the position in ``head`` just past its last allocation (where the group's start goes)."""
    head = top[:k]
    allocs = [i for i, s in enumerate(head) if isinstance(s, Allocate)]
    return head, top[k + 1:], (max(allocs) + 1) if allocs else 0


def _group_sync(reuse, span, bars=None) -> tuple:
    """``(start, after_loop)``: the block group's synchronisation around the main loop. With ``bars``, the block's
    transaction barrier is allocated and initialised first. Where the receive area lies over the stages (``reuse``),
    every block is past its main loop (its bulk copies' reads of the stages ordered before the ordinary stores) before
    anyone stores into another's; an area of its own is free from the start: the blocks say they have started at the
    top and wait for each other only before the first store into another's memory."""
    start = [] if bars is None else [Allocate(bars, span=span), Barrier(span=span), CopyBarrierInit(bars, 1, span=span),
                                     Barrier(span=span)]
    if reuse:
        return start, [BulkFence(span=span), GroupBarrier("arrive", "release", span=span),
                       GroupBarrier("wait", "acquire", span=span)]
    start.append(GroupBarrier("arrive", "relaxed", span=span))
    return start, [GroupBarrier("wait", "acquire", span=span)]


def _epilogue_map(rest, acc, regs: int, threads: int):
    """``(bulk store, rows, cols)`` where the epilogue is the bulk-store form (the accumulator's registers written
    into the staging tile of one paneled bulk store, nothing else in it reading the accumulator): ``rows[r]`` /
    ``cols[r]`` the sets of (thread, row) / (thread, column) pairs register ``r`` lands at, as numpy arrays over the
    threads (found by evaluating the staging stores' indices for every thread: no layout is assumed); else a reason."""
    import numpy as np

    stores = [x for st in rest for x in collect(st, BulkStore)]
    if len(stores) != 1 or stores[0].panels is not None or stores[0].cells is not None:
        return "the epilogue is not one bulk tile store"
    bs = stores[0]
    if not getattr(bs.layout, "panel_elems", 0):
        return "its bulk store's tile is not in panels"
    t = np.arange(threads, dtype=np.int64)
    rows: dict = {}
    cols: dict = {}
    for pt in [x for st in rest for x in collect(st, PerThread)]:
        env: dict = {}

        def visit(x):
            if isinstance(x, Seq):
                for c in x.body:
                    if visit(c) is False:
                        return False
                return None
            if isinstance(x, Bind):
                env[id(x.var)] = _eval_int(x.value, t, env)
                return None
            if isinstance(x, Store) and x.buffer is bs.src:
                loads = []
                from ..ir import walk_expr
                walk_expr(x.value, lambda y: loads.append(y) if isinstance(y, BufferLoad) else None)
                r = const_value(loads[0].indices[0]) if len(loads) == 1 and loads[0].buffer is acc else None
                col = _eval_int(x.indices[-1], t, env)
                row = _eval_int(x.indices[-2], t, env) if len(x.indices) >= 2 else None
                if r is None or col is None:
                    return False
                cols.setdefault(int(r), []).append(np.broadcast_to(np.asarray(col), t.shape))
                rows.setdefault(int(r), []).append(None if row is None else np.broadcast_to(np.asarray(row), t.shape))
                return None
            return None if not collect(x, Store) or not any(w.buffer is bs.src for w in collect(x, Store)) else False

        if visit(pt.body) is False:
            return "the epilogue's stores into its staging tile are not one register each at a computable column"
    if sorted(cols) != list(range(regs)):
        return "the epilogue's staging stores do not write every accumulator register"
    # every block runs the epilogue with only its own part's registers summed: nothing else may read the accumulator
    from ..ir import stmt_exprs, walk_expr

    reads = []
    for st in rest:
        walk(st, lambda x: [walk_expr(e, lambda y: reads.append(x) if isinstance(y, BufferLoad) and y.buffer is acc
                                      else None) for e in stmt_exprs(x)])
    if any(not (isinstance(x, Store) and x.buffer is bs.src) for x in reads):
        return "the epilogue reads the accumulator elsewhere than into its bulk store's staging tile"
    return bs, rows, cols


def _panel_plan(rest, acc, splits: int, regs: int, threads: int):
    """``(bulk store, [float4 groups block o owns], panels a block)`` where the epilogue is the bulk-store form
    (:func:`_epilogue_map`) and every group of 4 registers lands, for every thread, in one column panel, the panels
    dividing among the splits; else a reason (a string)."""
    import numpy as np

    m = _epilogue_map(rest, acc, regs, threads)
    if isinstance(m, str):
        return m
    bs, _, cols = m
    lay = bs.layout
    npanels = int(lay.cols // lay.panel_elems)
    if npanels < splits or npanels % splits:
        return f"its bulk store's {npanels} panel(s) do not divide among {splits} splits"
    per = npanels // splits
    owned: list = [[] for _ in range(splits)]
    for g in range(regs // 4):
        ps = set(np.concatenate([c // lay.panel_elems for q in range(4) for c in cols[4 * g + q]]).tolist())
        if len(ps) != 1:
            return f"registers {4 * g}..{4 * g + 3} land in more than one panel"
        owned[next(iter(ps)) // per].append(g)
    if any(not og for og in owned):
        return "a split would own no registers"
    return bs, owned, per


class _Cells:
    """The sum "in cells" (D78): the bulk store's tile cut into cells of ``rows`` rows by one column panel, numbered
    panel-major (cell ``c``: panel ``c // bands``, rows ``(c % bands) rows ..``); block ``o`` of ``S`` owns cells
    ``[o C // S, (o + 1) C // S)`` (``C`` cells). Each cell is held by the ``tc`` threads of one aligned run, each
    holding the same ``gc`` float4 register groups of it: thread ``t``'s group ``g`` lies in cell
    ``panel[g] bands + base[g] + step[g] (t // tc)``, at position ``pos[g]`` of the ``gc``."""

    def __init__(self, store, rows, bands, npanels, tc, gc, panel, base, step, pos):
        self.store, self.rows, self.bands, self.npanels = store, rows, bands, npanels
        self.tc, self.gc, self.panel, self.base, self.step, self.pos = tc, gc, panel, base, step, pos
        self.count = bands * npanels

    def first(self, o, splits):
        """The first cell block ``o`` owns (an int or an expression of the block's rank)."""
        return binary("floordiv", binary("mul", o, as_expr(self.count)), as_expr(splits)) \
            if not isinstance(o, int) else o * self.count // splits

    def most(self, splits) -> int:
        return max((o + 1) * self.count // splits - o * self.count // splits for o in range(splits))

    def cell_bytes(self, bpe) -> int:
        return self.gc * self.tc * 4 * bpe


def _cell_plan(rest, acc, splits: int, regs: int, threads: int):
    """A :class:`_Cells` where the epilogue is the bulk-store form and its tile cuts into cells (rows in runs of a
    multiple of 8 rows, the panels' swizzle period, holding every register group whole) that its threads hold in
    aligned runs, at least one cell a split; else a reason (a string)."""
    import numpy as np

    m = _epilogue_map(rest, acc, regs, threads)
    if isinstance(m, str):
        return m
    bs, rows, cols = m
    lay = bs.layout
    if any(x is None for r in range(regs) for x in rows[r]):
        return "the epilogue's staging stores have no computable row"
    ngroups = regs // 4
    tile_rows, npanels = int(lay.rows), int(lay.cols // lay.panel_elems)

    def span(g, unit):  # each thread's cell-row band of group g (or None where its registers straddle two)
        bands = [x // unit for q in range(4) for x in rows[4 * g + q]]
        if any((b != bands[0]).any() for b in bands):
            return None
        ps = [x // lay.panel_elems for q in range(4) for x in cols[4 * g + q]]
        if any((p != ps[0]).any() for p in ps) or (ps[0] != ps[0][0]).any():
            return None  # a group in one panel, the same for every thread
        return bands[0], int(ps[0][0])

    unit = next((u for u in range(8, tile_rows + 1, 8) if tile_rows % u == 0
                 and all(span(g, u) is not None for g in range(ngroups))), None)
    if unit is None:
        return "no run of rows (a multiple of 8) holds every register group whole"
    bands = tile_rows // unit
    if bands * npanels < splits:
        return f"{bands * npanels} cells of {unit} rows are fewer than {splits} splits"
    info = [span(g, unit) for g in range(ngroups)]
    t = np.arange(threads, dtype=np.int64)
    # the threads holding a cell: an aligned run of tc threads (tc the same for every cell)
    holders: dict = {}
    for g, (band, p) in enumerate(info):
        for th in t:
            holders.setdefault((p, int(band[th])), set()).add(int(th))
    sizes = {len(h) for h in holders.values()}
    if len(sizes) != 1 or len(holders) != bands * npanels:
        return "the cells are not held by runs of threads of one size"
    tc = sizes.pop()
    if any(min(h) % tc or max(h) - min(h) + 1 != tc for h in holders.values()):
        return "a cell's threads are not one aligned run"
    base, step, pos, gc = [], [], [], None
    classes: dict = {}
    for g, (band, p) in enumerate(info):
        b0 = int(band[0])
        st = int(band[tc] - b0) if threads > tc else 0
        if ((band - b0) != st * (t // tc)).any():
            return "a register group's cell is not affine in the thread's run"
        base.append(b0)
        step.append(st)
        key = (p, b0, st)
        pos.append(len(classes.setdefault(key, [])))
        classes[key].append(g)
    sizes = {len(v) for v in classes.values()}
    if len(sizes) != 1:
        return "the cells hold unequal numbers of register groups"
    gc = sizes.pop()
    if gc * tc * 4 != unit * lay.panel_elems:
        return "the cells' register groups do not cover them"
    # every (thread, group) at its own place: (cell, position pos[g] tc + t % tc) one to one
    seen = set()
    for g in range(ngroups):
        cell = info[g][1] * bands + base[g] + step[g] * (t // tc)
        seen.update(zip(cell.tolist(), (pos[g] * tc + t % tc).tolist()))
    if len(seen) != ngroups * threads:
        return "two register groups would share a place in a cell"
    return _Cells(bs, unit, bands, npanels, tc, gc, [p for _, p in info], base, step, pos)


def _group_form(ctx, splits: int, regs: int, rest=None, acc=None, threads=0):
    """``tilecore.split_k_group_sum``: "rank0" (every peer's whole partial into rank 0), "slices" (each block sums a
    slice of the registers, then rank 0 gathers the sums: 2 (S-1)/S of a partial into rank 0 instead of S - 1
    partials), "panels" (D75: each block sums and bulk-stores whole column panels of the tile, the panels dividing
    among the splits), "cells" (D78: each block sums and bulk-stores a run of cells of rows x one panel: any count
    up to the cells), "auto" (default): panels where they divide, else cells, else slices from 3 splits where the
    target has transaction barriers, else rank 0. Returns the panels' tuple, a :class:`_Cells` or the form's name."""
    v = ctx.option(SPLIT_K_GROUP_SUM, "auto")
    if v not in ("auto", "rank0", "slices", "panels", "cells"):
        raise CompileError(f"pass config {SPLIT_K_GROUP_SUM}={v!r}: expected \"auto\", \"rank0\", \"slices\", "
                           "\"panels\" or \"cells\"")
    can = bool(ctx.capabilities.feature("bulk_tensor_copy")) and regs % 4 == 0 and regs // 4 >= splits
    need = (f"needs transaction barriers (features.bulk_tensor_copy) and at least {splits} groups of 4 registers a "
            f"thread ({regs})")
    if v in ("auto", "panels", "cells") and can and rest is not None:
        why = None
        if v in ("auto", "panels"):
            plan = _panel_plan(rest, acc, splits, regs, threads)
            if not isinstance(plan, str):
                return plan
            why = plan
        if v in ("auto", "cells"):
            plan = _cell_plan(rest, acc, splits, regs, threads)
            if not isinstance(plan, str):
                return plan
            why = plan
        if v != "auto":
            raise CompileError(f"pass config {SPLIT_K_GROUP_SUM}=\"{v}\": {why}")
    if v in ("panels", "cells", "slices") and not (can and rest is not None):
        raise CompileError(f"pass config {SPLIT_K_GROUP_SUM}=\"{v}\": {need}")
    if v == "auto":
        return "slices" if can and splits >= 3 else "rank0"
    return v


def _slice_groups(splits: int, regs: int) -> list:
    """``[(first group, groups)]`` of 4 registers each block owns (contiguous, balanced)."""
    g = regs // 4
    bounds = [i * g // splits for i in range(splits + 1)]
    return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(splits)]


def _slices_bytes(splits, regs, threads, acc) -> int:
    most = max(n for _, n in _slice_groups(splits, regs))
    return 2 * (splits - 1) * most * threads * 4 * acc.dtype.bytes


def _group_slices(func, ctx, launch, top, k, loop, acc, splits, per, kt, regs, threads, z, gexprs, bvars, ko, dead,
                  reduce_, panels=None):
    """The tile's splits one block group, each block summing a slice of the accumulator registers (D75,
    ``tilecore.split_k_group_sum="slices"``): block ``o`` owns the float4 groups ``_slice_groups(S)[o]``; after the
    main loop every block stores the groups each other block owns into that block's first area (at its own slot), the
    stores completing on that block's first transaction barrier; each block waits for its own, sums its groups in
    split order 0 .. S-1 (its own registers in its place: the workspace form's additions, the same bits), and blocks
    1 .. S-1 store their sums into rank 0's second area, completing on rank 0's second barrier; rank 0 waits, takes
    them into its registers and runs the kernel's epilogue. Each barrier is initialised and announced for exactly the
    bytes it receives before the group's blocks meet (an arrival, relaxed, at the top)."""
    span, zero = loop.span, as_expr(0)
    # the float4 groups each block owns: contiguous slices, or (panels) the groups of its bulk-store panels
    owned = panels[1] if panels is not None else [list(range(g0, g0 + n)) for g0, n in _slice_groups(splits, regs)]
    slices = [(og, len(og)) for og in owned]
    most = max(n for _, n in slices)
    unit = most * threads * 4  # floats of one slot
    area1 = Buffer("tc_group_slices", ((splits - 1) * unit,), acc.dtype, "shared")
    area2 = Buffer("tc_group_sums", ((splits - 1) * unit,), acc.dtype, "shared")
    bars = Buffer("tc_group_full", (2,), "uint64", "shared")
    stage_bytes = int(loop.annotations.get("num_stages") or 1) * sum(_nbytes(b) for b in dead)
    total = _nbytes(area1) + (_nbytes(area2) if panels is None else 0)
    reuse = tuple(b.name for b in dead) if dead and total <= stage_bytes else ()
    tid = ThreadIndex(INDEX)
    bpe = acc.dtype.bytes

    def at(slot, g, lane):  # the slot's group g (0 .. most-1) of this thread
        run = binary("add", binary("mul", as_expr(slot), as_expr(most)), as_expr(g))
        return binary("add", binary("mul", binary("add", binary("mul", run, as_expr(threads)), tid), as_expr(4)),
                      as_expr(lane))

    def slot_of(sender, owner):  # the sender's slot in the owner's area (its own slot left out)
        return sender if sender < owner else sender - 1

    def reg(r):
        return BufferLoad(acc, (as_expr(r),))

    def by_rank(make, first=0):  # one version per rank (the registers are named statically)
        version = None
        for j in reversed(range(first, splits)):
            body = make(j)
            version = body if version is None else If(compare("eq", z, as_expr(j)), body, version, span=span)
        return version

    # phase 1: the groups other blocks own, into their first areas
    def send1(me):
        out = []
        for o, (og, n) in enumerate(slices):
            if o == me:
                continue
            for g in range(n):
                r = 4 * og[g]
                out.append(PeerStore(area1, (at(slot_of(me, o), g, 0),), tuple(reg(r + q) for q in range(4)),
                                     as_expr(o), bars, zero, span=span))
        return Seq(out)

    # each block's own slice summed in split order
    def sum1(me):
        og, n = slices[me]
        out = []
        for g in range(n):
            for lane in range(4):
                r = 4 * og[g] + lane
                t = None
                for j in range(splits):
                    v = reg(r) if j == me else BufferLoad(area1, (at(slot_of(j, me), g, lane),))
                    t = v if t is None else binary("add", t, v)
                out.append(Store(acc, (as_expr(r),), t, span=span))
        return Seq(out)

    # phase 2: blocks 1 .. S-1 send their sums to rank 0; rank 0 takes them
    def send2(me):
        og, n = slices[me]
        return Seq([PeerStore(area2, (at(me - 1, g, 0),), tuple(reg(4 * og[g] + q) for q in range(4)), zero,
                              bars, as_expr(1), span=span) for g in range(n)])

    take = Seq([Store(acc, (as_expr(4 * og[g] + lane),), BufferLoad(area2, (at(o - 1, g, lane),)), span=span)
                for o, (og, n) in enumerate(slices) if o > 0 for g in range(n) for lane in range(4)])

    def expect1(me):  # the bytes block ``me`` receives in phase 1
        return CopyBarrierArrive(bars, zero, (splits - 1) * slices[me][1] * threads * 4 * bpe, span=span)

    head, rest, last_alloc = _split_top(top, k)
    got2 = sum(n for _, n in slices[1:]) * threads * 4 * bpe
    start, after_loop = _group_sync(reuse, span, bars)
    start.append(by_rank(expect1))
    if panels is None:
        start.append(If(compare("eq", z, zero), CopyBarrierArrive(bars, as_expr(1), got2, span=span), None, span=span))
    tail = [PerThread(by_rank(send1), attrs={"split_k": "group slices send"}, span=span),
            CopyBarrierWait(bars, zero, zero, span=span),
            PerThread(by_rank(sum1), attrs={"split_k": "group slice sum in split order"}, span=span)]
    if panels is not None:  # every block runs the epilogue, its bulk store only of the panels whose sums it owns
        store, count = panels[0], panels[2]
        first = binary("mul", z, as_expr(count))
        tail += rewrite(Seq(list(rest)), lambda x: x.with_(panels=(first, count)) if x is store else None).body
    else:
        tail += [
            If(compare("ne", z, zero), PerThread(by_rank(send2, 1), attrs={"split_k": "group sums send"}, span=span),
               None, span=span),
            If(compare("eq", z, zero), Seq([CopyBarrierWait(bars, as_expr(1), zero, span=span),
                                            PerThread(take, attrs={"split_k": "group sums taken"}, span=span), *rest]),
               None, span=span)]
    areas = [area1] if panels is not None else [area1, area2]
    new_top = [*(Allocate(a, reuses=reuse, span=span) for a in areas),
               *head[:last_alloc], *start, *head[last_alloc:], loop, *after_loop, *tail]
    gathers = "each block bulk-stores the panels it summed" if panels is not None else "rank 0 gathers the sums"
    note = (f"tilecore.split_k: k loop over {ko.name} split over {splits} blocks a tile ({_per_text(per, kt, splits)} "
            f"of {kt} k tiles each), one block group a tile (tilecore.split_k_reduce={reduce_}), summed in "
            f"{'panels' if panels is not None else 'slices'}: "
            f"each block sums {'/'.join(str(4 * n) for _, n in slices)} of {regs} {acc.dtype} registers x {threads} "
            f"threads in split order from its peers' stores, {gathers} "
            f"({'over its stages' if reuse else 'areas of their own'}, {total} bytes; the stores completing on "
            "transaction barriers)")
    return _finish_group(func, ctx, launch, gexprs, bvars, z, splits, new_top, note)


def _group_cells(func, ctx, launch, top, k, loop, acc, splits, per, kt, regs, threads, z, gexprs, bvars, ko, dead,
                 reduce_, cells: _Cells, over_staging: bool = False):
    """The tile's splits one block group, each block summing and storing a run of the bulk store's cells (D78,
    ``tilecore.split_k_group_sum="cells"``; :class:`_Cells`): block ``o`` owns cells ``[o C // S, (o + 1) C // S)``;
    after the main loop every thread stores each of its float4 register groups that lies in another block's cell
    into that block's area (at the sender's slot, the cell's place in the owner's run, the group's place in the
    cell), completing on the owner's transaction barrier (announced at the top for exactly the bytes it receives);
    each block waits for its own, sums the groups of its cells in split order 0 .. S-1 (its own registers in its
    place: the workspace form's additions, the same bits) and runs the kernel's epilogue, its bulk store limited to
    its cells. Any split count up to the cells (where the panels do not divide among the splits, D75's "panels"
    does not apply: 3 splits of two or four panels). ``over_staging``: the area beside the stages with the epilogue's
    staging tile over it (``Allocate.reuses``: the staging tile is first written after the epilogue's barrier that
    follows the block's last read of the area, and its peers' stores have all landed by then)."""
    span, zero = loop.span, as_expr(0)
    most, count = cells.most(splits), cells.count
    cell_f4 = cells.gc * cells.tc  # float4 groups of one cell
    area = Buffer("tc_group_cells", ((splits - 1) * most * cell_f4 * 4,), acc.dtype, "shared")
    bars = Buffer("tc_group_full", (1,), "uint64", "shared")
    stage_bytes = int(loop.annotations.get("num_stages") or 1) * sum(_nbytes(b) for b in dead)
    total = _nbytes(area)
    reuse = tuple(b.name for b in dead) if dead and total <= stage_bytes else ()
    tid = ThreadIndex(INDEX)
    bpe = acc.dtype.bytes
    run = binary("floordiv", tid, as_expr(cells.tc))
    lane_t = binary("floormod", tid, as_expr(cells.tc))

    # the cells whose rows lie past C's last row (a tile that overhangs it: 16 rows of a 64-row tile) or, D84, whose
    # panel lies past C's last column (a ragged N: the last tile's second panel of 900 columns) are neither sent nor
    # summed, and the owner's barrier expects only its live cells' bytes (a static C whose rows / columns the tiles
    # divide: every cell live that way, nothing checked)
    store = cells.store
    row0, mrows = simplify(as_expr(store.starts[-2])), simplify(as_expr(store.dst.shape[-2]))
    col0, ncols = simplify(as_expr(store.starts[-1])), simplify(as_expr(store.dst.shape[-1]))
    tile_rows, pw = cells.rows * cells.bands, int(store.layout.panel_elems)
    every_row = const_value(mrows) is not None and int(const_value(mrows)) % tile_rows == 0
    every_col = const_value(ncols) is not None and int(const_value(ncols)) % (pw * cells.npanels) == 0

    def live(c):  # cell c's first row and first column inside C (None: always)
        cond = None
        if not every_row:
            band = binary("floormod", c, as_expr(cells.bands)) if not isinstance(c, int) else c % cells.bands
            cond = compare("lt", binary("add", row0, binary("mul", as_expr(band), as_expr(cells.rows))), mrows)
        if not every_col:
            panel = binary("floordiv", c, as_expr(cells.bands)) if not isinstance(c, int) else c // cells.bands
            at = compare("lt", binary("add", col0, binary("mul", as_expr(panel), as_expr(pw))), ncols)
            cond = at if cond is None else logic_and(cond, at)
        return cond

    def both(a, b):
        return b if a is None else a if b is None else logic_and(a, b)

    def cell_of(g):  # the cell of this thread's group g
        c = as_expr(cells.panel[g] * cells.bands + cells.base[g])
        return c if cells.step[g] == 0 else binary("add", c, binary("mul", run, as_expr(cells.step[g])))

    def owner_of(c):  # the block owning cell c: the o with o C // S <= c < (o + 1) C // S
        return binary("floordiv", binary("sub", binary("mul", binary("add", c, as_expr(1)), as_expr(splits)),
                                         as_expr(1)), as_expr(count))

    def place(slot, local, g, lane):  # the float in an owner's area: sender slot, its cell, the group, this thread
        at = binary("add", binary("mul", slot, as_expr(most)), local)
        at = binary("add", binary("mul", at, as_expr(cells.gc)), as_expr(cells.pos[g]))
        at = binary("add", binary("mul", at, as_expr(cells.tc)), lane_t)
        return binary("add", binary("mul", at, as_expr(4)), as_expr(lane))

    def reg(r):
        return BufferLoad(acc, (as_expr(r),))

    def by_rank(make):  # one version per rank (the registers and the split order named statically)
        version = None
        for j in reversed(range(splits)):
            body = make(j)
            version = body if version is None else If(compare("eq", z, as_expr(j)), body, version, span=span)
        return version

    ngroups = regs // 4

    def send(me):  # every group in another block's cell, into that block's area at this block's slot
        out = []
        for g in range(ngroups):
            c = cell_of(g)
            o = owner_of(c)
            slot = select(compare("lt", as_expr(me), o), as_expr(me), as_expr(me - 1))
            local = binary("sub", c, cells.first(o, splits))
            st = PeerStore(area, (place(slot, local, g, 0),), tuple(reg(4 * g + q) for q in range(4)), o, bars, zero,
                           span=span)
            cond = None if const_value(simplify(o)) is not None else compare("ne", o, as_expr(me))
            if cond is None and int(const_value(simplify(o))) == me:
                continue
            cond = both(cond, live(c))
            out.append(st if cond is None else If(cond, st, None, span=span))
        return Seq(out)

    def sum_(me):  # the groups of this block's cells, in split order, its own registers at its index
        f0, f1 = cells.first(me, splits), cells.first(me + 1, splits)
        out = []
        for g in range(ngroups):
            c = cell_of(g)
            local = binary("sub", c, as_expr(f0))
            stores = []
            for lane in range(4):
                r = 4 * g + lane
                t = None
                for j in range(splits):
                    v = reg(r) if j == me else BufferLoad(area, (place(as_expr(j if j < me else j - 1), local, g,
                                                                       lane),))
                    t = v if t is None else binary("add", t, v)
                stores.append(Store(acc, (as_expr(r),), t, span=span))
            mine = both(logic_and(compare("ge", c, as_expr(f0)), compare("lt", c, as_expr(f1))), live(c))
            known = const_value(simplify(mine))
            if known is None:
                out.append(If(mine, Seq(stores), None, span=span))
            elif known:
                out.extend(stores)
        return Seq(out)

    def expect(me):  # the bytes block ``me`` receives: its live cells from every peer (one arrival in any case)
        f0, f1 = cells.first(me, splits), cells.first(me + 1, splits)
        if every_row and every_col:
            return CopyBarrierArrive(bars, zero, (splits - 1) * (f1 - f0) * cell_f4 * 4 * bpe, span=span)
        n = None
        for c in range(f0, f1):
            x = select(live(c), as_expr(1), as_expr(0))
            n = x if n is None else binary("add", n, x)
        version = None
        for m in range(f1 - f0 + 1):  # a version a count of live cells: the barrier's bytes static in each
            body = CopyBarrierArrive(bars, zero, (splits - 1) * m * cell_f4 * 4 * bpe, span=span)
            version = body if version is None else If(compare("eq", n, as_expr(m)), body, version, span=span)
        return version

    head, rest, last_alloc = _split_top(top, k)
    start, after_loop = _group_sync(reuse, span, bars)
    start.append(by_rank(expect))
    first, end = cells.first(z, splits), cells.first(binary("add", z, as_expr(1)), splits)
    tail = [PerThread(by_rank(send), attrs={"split_k": "group cells send"}, span=span),
            CopyBarrierWait(bars, zero, zero, span=span),
            PerThread(by_rank(sum_), attrs={"split_k": "group cell sum in split order"}, span=span),
            *rewrite(Seq(list(rest)), lambda x: x.with_(cells=(first, end, cells.rows)) if x is store else None).body]
    if over_staging:
        head = [a.with_(reuses=(area.name,)) if isinstance(a, Allocate) and a.buffer is store.src else a for a in head]
        tail.insert(3, Barrier(span=span))  # every thread's reads of the area before the staging tile's first write
    new_top = [Allocate(area, reuses=reuse, span=span), *head[:last_alloc], *start, *head[last_alloc:], loop,
               *after_loop, *tail]
    runs = "/".join(str(cells.first(o + 1, splits) - cells.first(o, splits)) for o in range(splits))
    note = (f"tilecore.split_k: k loop over {ko.name} split over {splits} blocks a tile ({_per_text(per, kt, splits)} "
            f"of {kt} k tiles each), one block group a tile (tilecore.split_k_reduce={reduce_}), summed in cells: "
            f"the tile's {count} cells of {cells.rows} rows x one panel owned {runs}, each block summing its cells' "
            f"{acc.dtype} register groups in split order from its peers' stores and bulk-storing them "
            f"({'over its stages' if reuse else 'an area of its own'}, {total} bytes"
            f"{', the staging tile over it' if over_staging else ''}; the stores completing on transaction barriers)")
    return _finish_group(func, ctx, launch, gexprs, bvars, z, splits, new_top, note)
