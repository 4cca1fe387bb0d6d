"""The epilogue's store of a register fragment as one bulk tile store: ``tilecore.bulk_store`` (pass config),
docs/decisions.md D46; on by default (D51) in kernels with one pipelined loop at the kernel's top level (the form
``tilecore.persistent`` takes; the GEMM's) and (D61, ``tilecore.bulk_store_attention``) in FlashAttention's form on
two consumer groups (:func:`attention_form`), where the target has bulk tile copies and its code generator spells
bulk stores.

``tilecore.stage_bulk_stores`` (``tile-lowering`` slot, after the backends' passes there, which keep the kernels
they take, and before the fragments are lowered) rewrites a kernel-level copy of a whole
two-dimensional fragment into a tile of a global tensor,

    T.copy(C_l, C[r0, c0])

on a target with ``feature:bulk_tensor_copy``, into

    C_l_st = T.alloc_shared((bm, bn), C.dtype)       # at the kernel's top, in a paneled (swizzled) layout
    ...
    T.bulk_store_wait(pending=0, read)               # the issuing thread: the previous store has read C_l_st
    T.copy(C_l, C_l_st)                              # every thread its own elements (converted to C's type)
    T.bulk_fence()                                   # each thread's writes, to the bulk-copy engine
    T.bulk_store(C[r0, c0], C_l_st, box=(bm, bn))    # one thread, one store per panel, one group
    ...
    T.bulk_store_wait(pending=0)                     # once, at the kernel's end

Thread distribution puts the barriers in (after the wait, after the fence) and issues the wait and the store on
one thread. Nothing waits for the store after it is issued: the next write of the shared tile waits for it to
have been read, so under a persistent tile loop (``tilecore.persistent``) the store runs while the next tile's
main loop does. The bulk store writes nothing outside ``C`` (ragged tiles need no checks). The shared tile's
layout is the widest swizzled panel (128, 64 or 32 bytes) whose width divides a tile row, recorded on the
statement; ``tilecore.swizzle_operand_tiles`` stores the tile in it and a backend spells the store per panel.

Where the whole tile does not fit beside the pipelined loop's stages in shared memory, the tile is stored in parts
of its columns (decision D58; ``tilecore.bulk_store_parts``): the fewest of 2, 4, 8 parts, each whole panels of its
own layout, whose one staging tile fits. Each part repeats the protocol above (wait until the last store has read
the staging tile, write, fence, store at the part's columns); its writes are a ``T.Parallel`` nest over the whole
fragment whose store is guarded by the part's columns, marked ``fold_branches`` so ``tilecore.lower_fragments``
resolves the guard per register (a thread writes its registers of that part only: half its matrix stores for a
128x256 16-bit tile in halves).

Left as it is, with ``kernel.meta["attrs"]["bulk_store"]`` saying why: a copy that is not a whole 2-D fragment
into a 2-D tile of a tensor's last two dimensions (one element of each dimension before them, D61; a view, another
shape), C's rows not proven whole 16-byte units, a tile row not a
multiple of 32 bytes, rows not a multiple of 8 or more than 256, and a tile whose parts do not fit beside the
pipelined loop's stages in shared memory either (the note names the ``num_stages`` that makes room: the stages asked
for are never reduced for it); the whole kernel where the target has no bulk tile copies or its emitter spells no
bulk store (``stmt_BulkStore``, ``stmt_BulkStoreWait``, ``stmt_BulkFence``).
"""
from __future__ import annotations

from ..ir import (Allocate, Buffer, BulkFence, BulkStore, BulkStoreWait, For, KernelLaunch, Region, Seq, TileOp,
                  as_expr, binary, collect, const_value, rewrite, simplify)
from ..ir.bounds import Facts
from ..ir.visit import buffers_named
from . import parse_switch, tile_pass

OPTION = "tilecore.bulk_store"
#: D61: False leaves FlashAttention's form (attention_form) out of the default (its direct stores, before D61)
ATTENTION_OPTION = "tilecore.bulk_store_attention"
#: the most parts of its columns a tile is stored in where the whole does not fit beside the stages (D58)
PARTS_OPTION = "tilecore.bulk_store_parts"
#: D83: the staging tile over a shared tile of the same shape and type that is written only before the kernel's
#: pipelined loop and not named after it (FlashAttention's Q, dead once the loop ends): no memory of its own. True:
#: wherever there is one; "auto": only where the whole tile would not fit beside the stages (its parts otherwise);
#: False: never
REUSE_OPTION = "tilecore.bulk_store_reuse"
REUSE_DEFAULT = False
#: the most parts the default splits a tile into
MAX_PARTS = 8
#: D82: the wait for the kernel's bulk stores before it ends: "done" (the default: the stores' writes complete) or
#: "read" (only their reads of block memory: the block may exit and its memory be reused while the writes land, as
#: a kernel's global writes do by its end)
EXIT_WAIT_OPTION = "tilecore.bulk_store_exit_wait"
EXIT_WAIT_VALUES = ("done", "read")
#: rows a bulk store's box may have
MAX_BOX = 256
#: panel widths in bytes, widest first
PANELS = (128, 64, 32)


def _static(e):
    v = const_value(simplify(as_expr(e)))
    return v if isinstance(v, int) else None


def _whole(r: Region) -> bool:
    shape = r.buffer.static_shape()
    return (shape is not None and all(_static(s) == 0 for s in r.starts)
            and tuple(_static(x) for x in r.extents) == tuple(shape))


def why_not(s, ctx):
    """Why the statement ``s`` (a copy) is not a bulk store (None: it is), and ``(fragment, C region, layout)``."""
    src, dst = s.args
    frag, out = src.buffer, dst.buffer
    if len(frag.shape) != 2 or not _whole(src):
        return f"{frag.name} is not a whole two-dimensional fragment", None
    # a tile of the last two dimensions; in front of them one element of each (FlashAttention's O[b, h, rows, :], D61)
    lead = tuple(dst.extents[:-2])
    if len(out.shape) < 2 or len(dst.extents) != len(out.shape) or any(_static(e) != 1 for e in lead) \
            or any(_static(e) != _static(f) for e, f in zip(dst.extents[-2:], frag.shape)):
        return (f"the copy into {out.name} is not a {frag.shape[0]}x{frag.shape[1]} tile of its last two "
                "dimensions"), None
    if out.base is not None:
        return f"{out.name} is a view of another tensor", None
    es = out.dtype.bytes
    if 16 % es:
        return f"{out.name}'s {es}-byte elements", None
    if not Facts().proves_multiple(out.shape[-1], 16 // es):
        return f"{out.name}'s rows are not proven whole 16-byte units", None
    rows, cols = (_static(x) for x in frag.shape)
    if rows % 8 or rows > MAX_BOX:
        return f"{rows} rows (a bulk store takes multiples of 8, at most {MAX_BOX})", None
    if tile_layout(rows, cols, es) is None:
        return f"a tile row of {cols * es} bytes is not whole {PANELS[-1]}-byte panels", None
    return None, (frag, dst, tile_layout(rows, cols, es))


def tile_layout(rows: int, cols: int, es: int):
    """The shared tile's layout: the widest swizzled panel (128, 64 or 32 bytes) whose width divides a row
    (None: none does)."""
    from ..layout import SharedLayout

    panel = next((p for p in PANELS if (cols * es) % p == 0 and p // es <= MAX_BOX), None)
    return None if panel is None else SharedLayout(rows, cols, es, swizzle_bytes=panel, panels=True)


def _split(lay, parts: int):
    """The layout of one of ``parts`` parts of the tile's columns (None: a part is not whole panels of its own)."""
    if parts < 2 or lay.cols % parts:
        return None
    sub = tile_layout(lay.rows, lay.cols // parts, lay.elem_bytes)
    return sub if sub is not None and (sub.cols * sub.elem_bytes) % sub.swizzle_bytes == 0 else None


def _parts(lay, room: int):
    """The fewest parts (2, 4, ... up to ``MAX_PARTS``) of the tile's columns whose staging tile fits in ``room``
    bytes: ``(parts, the part's layout)``, or None."""
    parts = 2
    while parts <= MAX_PARTS:
        sub = _split(lay, parts)
        if sub is not None and sub.size * sub.elem_bytes <= room:
            return parts, sub
        parts *= 2
    return None


def _part_copy(x, tile, part: int, width: int):
    """Columns ``[part * width, (part + 1) * width)`` of the copy ``x``'s whole fragment into the staging tile: a
    nest over the whole fragment (layout inference keeps the fragment's own layout: every index a loop variable)
    whose element store is guarded by its column; a thread's registers have static columns, so the guard folds
    away where the fragment's columns are known per register."""
    from ..ir import If, Store, Var, binary, cast, compare, logic_and
    from ..ir import BufferLoad as Load

    frag = x.args[0].buffer
    rows, cols = (_static(d) for d in frag.shape)
    i, j = Var("bs_i"), Var("bs_j")
    lo, hi = part * width, (part + 1) * width
    value = cast(tile.dtype, Load(frag, (i, j)))
    store = Store(tile, (i, binary("sub", j, as_expr(lo)) if lo else j), value, span=x.span)
    cond = logic_and(compare("ge", j, as_expr(lo)), compare("lt", j, as_expr(hi)))
    from .layout import FOLD_BRANCHES

    mark = {FOLD_BRANCHES: True}
    inner = For(j, as_expr(0), as_expr(cols), "parallel", If(cond, store, None, span=x.span), mark, span=x.span)
    return For(i, as_expr(0), as_expr(rows), "parallel", inner, dict(mark), span=x.span)


def dead_tile(top: list, at: int, frag, dtype):
    """D83: a shared tile the bulk store at ``top[at]`` may stage its fragment in: allocated at the kernel's top
    level, of the fragment's shape and the output's type, written only by whole copies before the one pipelined
    loop, not written in it and named by nothing after it but the copy at ``at`` (FlashAttention's Q); None where
    there is none."""
    loops = [k for k, x in enumerate(top) if isinstance(x, For) and x.kind == "pipelined"]
    if len(loops) != 1 or loops[0] > at:
        return None
    loop = loops[0]
    shape = tuple(_static(d) for d in frag.shape)
    for a in top[:loop]:
        if not isinstance(a, Allocate) or a.buffer.scope != "shared" or a.buffer.dtype != dtype \
                or a.buffer.static_shape() is None or tuple(a.buffer.static_shape()) != shape:
            continue
        b = a.buffer
        if any(id(b) in buffers_named(x, regions=True) for k, x in enumerate(top) if k > loop and k != at):
            continue
        before = [x for x in top[:loop] if x is not a and id(b) in buffers_named(x, regions=True)]
        if not before or not all(isinstance(x, TileOp) and x.op == "copy" and x.args[1].buffer is b
                                 and _whole(x.args[1]) and x.args[0].buffer is not b for x in before):
            continue
        written = [x for x in collect(top[loop].body, TileOp) if x.op == "copy" and x.args[1].buffer is b]
        if written:
            continue
        return b
    return None


def _staged_bytes(launch) -> tuple:
    """(bytes of the block's shared buffers with the pipelined loops' stages, the stage bytes of one step, stages)."""
    total = stage = 0
    stages = 1
    shared = {id(a.buffer): a.buffer for a in collect(launch.body, Allocate) if a.buffer.scope == "shared"}
    staged: dict = {}
    for f in collect(launch.body, For):
        n = int(f.annotations.get("num_stages", 0) or 0) if f.kind == "pipelined" else 0
        if n >= 2:
            for op in collect(f.body, TileOp):
                if op.op == "copy" and len(op.args) == 2 and isinstance(op.args[1], Region) \
                        and id(op.args[1].buffer) in shared:
                    staged[id(op.args[1].buffer)] = n
    for k, b in shared.items():
        n = _static(b.numel()) or 0
        size = (n * b.dtype.bytes + 1023) // 1024 * 1024
        total += size * staged.get(k, 1)
        if k in staged:
            stage += size
            stages = max(stages, staged[k])
    return total, stage, stages


#: the default's second form (D61): FlashAttention's loop on two groups of the producer group's size
ATTENTION_FORM_DEFAULT = True


def attention_form(launch: KernelLaunch, ctx) -> bool:
    """FlashAttention's form, which the general path rotates and specializes with ping-pong (D59): one pipelined
    loop at the kernel's top level whose body has exactly two ``T.gemm``, the second's A operand a fragment (P,
    written by the threads between them), on a block of two groups of the target's producer group size (the
    consumers of ping-pong's turns). By default (D61) its output copy is a bulk store too: the register programs'
    epilogue through shared memory and bulk tile stores (D45), measured on the general path +0.5 to +10% (causal,
    fast math, d256)."""
    lim = ctx.capabilities.limit("producer_group_threads")
    threads = const_value(simplify(launch.threads[0])) if getattr(launch, "threads", None) else None
    if lim is None or not isinstance(threads, int) or len(launch.threads) != 1 or threads != 2 * int(lim[0]):
        return False
    top = list(launch.body.body) if isinstance(launch.body, Seq) else [launch.body]
    loops = [x for x in top if isinstance(x, For) and x.kind == "pipelined"]
    if len(loops) != 1 or sum(f.kind == "pipelined" for f in collect(launch.body, For)) != 1:
        return False
    gemms = [x for x in collect(loops[0].body, TileOp) if x.op == "gemm"]
    return len(gemms) == 2 and isinstance(gemms[1].args[0], Region) and gemms[1].args[0].buffer.scope == "fragment"


def _spells_bulk_stores(ctx) -> bool:
    """The target's emitter spells the three statements (a profile may declare bulk tile copies for loads only)."""
    backend = getattr(ctx, "backend", None)
    if backend is None or not hasattr(backend, "emitter"):
        return False
    emitter = backend.emitter(ctx.target)
    return all(callable(getattr(emitter, f"stmt_{n}", None)) for n in ("BulkStore", "BulkStoreWait", "BulkFence"))


def _option(v):
    """``tilecore.bulk_store`` as True (asked for), False (off) or None (the default: on in kernels of the persistent form
    where the target declares bulk tile copies and its code generator spells bulk stores, D51)."""
    if v is None or v == "auto":
        return None
    return parse_switch(OPTION, v, expected="True or False (or leave it unset: on where the target has bulk tile "
                                            "copies)")


def _parts_option(v):
    """``tilecore.bulk_store_parts``: None (the default: the whole tile where it fits beside the stages, else the
    fewest parts that fit), 1 (never in parts: where the whole does not fit, the direct stores, as before D58) or a
    number of parts (2, 4, 8) to store every tile in."""
    if v is None or v == "auto":
        return None
    if isinstance(v, str) and v.isdigit():
        v = int(v)
    if isinstance(v, int) and not isinstance(v, bool) and v in (1, 2, 4, 8):
        return v
    from ..errors import CompileError

    raise CompileError(f"pass config {PARTS_OPTION}={v!r}: expected 1 (never in parts), 2, 4 or 8 (that many parts of "
                       "the tile's columns), or leave it unset (parts only where the whole tile does not fit)")


@tile_pass("tilecore.stage_bulk_stores")
def stage_bulk_stores(func, ctx):
    """With ``tilecore.bulk_store``: a kernel-level copy of a fragment to a global tile through a shared tile and
    one bulk store (module doc)."""
    want = _option(ctx.option(OPTION, None))
    if want is False:
        return func
    exit_wait = ctx.option(EXIT_WAIT_OPTION, "done")
    if exit_wait not in EXIT_WAIT_VALUES:
        from ..errors import CompileError

        raise CompileError(f"pass config {EXIT_WAIT_OPTION}={exit_wait!r}: expected one of "
                           f"{', '.join(map(repr, EXIT_WAIT_VALUES))}")
    exit_read = exit_wait == "read"
    from .pipeline import bulk_enabled

    # the default (no pass config): on where the target has what it takes, silent where it has not (D51)
    asked = want is True
    if ctx.option("tilecore.checked", False):
        return func.with_body(func.body, bulk_store=("not a bulk store: checked mode",)) if asked else func
    if not bulk_enabled(ctx):
        return func.with_body(func.body, bulk_store=(
            "not a bulk store: the target has no bulk tile copies (feature:bulk_tensor_copy), or tilecore.bulk_copy "
            "is off",)) if asked else func
    if not _spells_bulk_stores(ctx):
        return func.with_body(func.body, bulk_store=(
            "not a bulk store: the target's code generator spells no bulk tile store (stmt_BulkStore, "
            "stmt_BulkStoreWait, stmt_BulkFence: plugin API 1.9)",)) if asked else func
    notes: list = []
    ask_parts = _parts_option(ctx.option(PARTS_OPTION, None))
    reuse = ctx.option(REUSE_OPTION, REUSE_DEFAULT)
    if reuse != "auto":
        reuse = parse_switch(REUSE_OPTION, reuse, expected="True, False or \"auto\" (where the whole tile would not "
                                                          "fit beside the stages)") is True
    lim = ctx.capabilities.limit("max_shared_bytes_per_block")
    limit = int(lim[0]) if lim is not None and lim[1] == "max" else None

    from .persistent import why_not as not_persistent

    def launch(s):
        if not isinstance(s, KernelLaunch):
            return None
        # by default only a kernel of the persistent form (one top-level pipelined loop: the GEMM's), where it was
        # measured: +3-10% over the element/pair stores on the H100, without the persistent loop (D51)
        if not asked and not_persistent(s, ctx)[0] is not None and not (
                ctx.option(ATTENTION_OPTION, ATTENTION_FORM_DEFAULT) is not False and attention_form(s, ctx)):
            return None
        top = list(s.body.body) if isinstance(s.body, Seq) else [s.body]
        new_top, allocs, done = [], [], 0
        used, stage, stages = _staged_bytes(s)
        for at, x in enumerate(top):
            if not (isinstance(x, TileOp) and x.op == "copy" and len(x.args) == 2
                    and all(isinstance(a, Region) for a in x.args)
                    and x.args[0].buffer.scope == "fragment" and x.args[1].buffer.scope == "global"):
                new_top.append(x)
                continue
            why, form = why_not(x, ctx)
            parts = 1
            # D83: staged in a tile dead by then (not under a persistent tile loop, which loads it again)
            home = dead_tile(top, at, form[0], x.args[1].buffer.dtype) if (
                why is None and reuse and ask_parts is None and not ctx.option("tilecore.persistent", None)) else None
            if home is not None and reuse == "auto" and (limit is None or form[2].size * form[2].elem_bytes
                                                         <= limit - used - 1024):
                home = None  # "auto": the whole tile fits beside the stages as it is
            if why is None and home is not None:
                frag, dst, lay = form
                need = 0
            elif why is None:
                frag, dst, lay = form
                need = lay.size * lay.elem_bytes
                room = None if limit is None else limit - used - 1024
                if isinstance(ask_parts, int) and ask_parts > 1:  # asked for: that many parts, where they fit
                    sub = _split(lay, ask_parts)
                    if sub is None:
                        why = (f"{PARTS_OPTION}={ask_parts}: {lay.cols} columns are not {ask_parts} parts of whole "
                               f"{PANELS[-1]}-byte panels")
                    else:
                        parts, lay = ask_parts, sub
                        need = lay.size * lay.elem_bytes
                if why is None and room is not None and need > room:
                    # the tile in parts through a staging tile that fits beside the stages (D58): each part
                    # written, fenced and stored in turn, the next part waiting for the last to be read
                    split = _parts(form[2], room) if ask_parts is None else None
                    if split is not None:
                        parts, lay = split
                        need = lay.size * lay.elem_bytes
                    else:
                        fit = stages
                        while fit > 1 and used - (stages - fit) * stage + need + 1024 > limit:
                            fit -= 1
                        why = (f"its {need // 1024} KiB shared tile does not fit beside the {stages} stages (limit "
                               f"{limit} bytes)" + (f"; num_stages={fit} makes room" if 1 < fit < stages else "")
                               + (f" ({PARTS_OPTION}={ask_parts})" if ask_parts is not None else ""))
            if why is not None:
                notes.append(f"not a bulk store: {x.args[1].buffer.name}: {why}")
                new_top.append(x)
                continue
            used += need
            tile = Buffer(f"{frag.name}_st", (lay.rows, lay.cols), dst.buffer.dtype, "shared")
            # D83: over the dead tile (Allocate.reuses, D75: first written after the epilogue's barrier, every read of
            # the dead tile, a matrix operand's, waited for before it)
            allocs.append(Allocate(tile, reuses=(home.name,) if home is not None else (), span=x.span))
            if parts == 1:
                whole = Region(tile, (as_expr(0), as_expr(0)), tuple(as_expr(d) for d in frag.shape))
                new_top += [BulkStoreWait(0, True, span=x.span), x.with_(args=(x.args[0], whole)),
                            BulkFence(span=x.span),
                            BulkStore(dst.buffer, tuple(dst.starts), tuple(_static(d) for d in frag.shape), tile, lay,
                                      span=x.span)]
            else:
                c0 = dst.starts[-1]
                for h in range(parts):
                    start = tuple(dst.starts[:-1]) + (simplify(binary("add", c0, as_expr(h * lay.cols))),)
                    new_top += [BulkStoreWait(0, True, span=x.span), _part_copy(x, tile, h, lay.cols),
                                BulkFence(span=x.span),
                                BulkStore(dst.buffer, start, (lay.rows, lay.cols), tile, lay, span=x.span)]
            done += 1
            notes.append(f"bulk store: {frag.name} -> {dst.buffer.name} through {tile.name} "
                         f"({lay.rows}x{lay.cols}, {lay.cols // lay.panel_elems} x {lay.swizzle_bytes}-byte panel(s))"
                         + (f", in {parts} parts of the tile's columns, each stored before the next is written ("
                            + (f"{PARTS_OPTION}={ask_parts}" if ask_parts else
                               f"the whole {frag.shape[0]}x{frag.shape[1]} tile does not fit beside the {stages} "
                               "stages") + ")" if parts > 1 else "")
                         + (f" (over {home.name}, dead after the pipelined loop: {REUSE_OPTION})"
                            if home is not None else "")
                         + ", waited for before the tile is written again")
        if not done:
            return None
        # the tiles at the kernel's top (tilecore.persistent keeps allocations there); one wait at the end
        lead = 0
        while lead < len(new_top) and isinstance(new_top[lead], Allocate):
            lead += 1
        body = new_top[:lead] + allocs + new_top[lead:] + [BulkStoreWait(0, exit_read, span=s.span)]
        return s.with_(body=Seq(body, span=s.body.span))

    body = rewrite(func.body, launch)
    return func.with_body(body, bulk_store=tuple(notes)) if notes else func


__all__ = ["stage_bulk_stores", "why_not", "tile_layout", "attention_form", "dead_tile", "OPTION", "PARTS_OPTION",
           "ATTENTION_OPTION", "REUSE_OPTION"]
