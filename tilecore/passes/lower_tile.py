"""Tile-op lowering through the target's intrinsic table.

For each tile op the pass takes the highest-priority :class:`~tilecore.plugin.Intrinsic` whose needs the
target's capabilities satisfy. The core contributes a generic, always-correct implementation of every
op (plain loops; ``parallel`` loops where iterations are independent) at priority 0, so a new backend
runs everything on day one and replaces ops one at a time with faster intrinsics.
"""
from __future__ import annotations

from ..errors import CompileError
from ..ir import (Allocate, Atomic, Buffer, BufferLoad, Collective, For, If, IntImm, MatrixOp, Region, Store, TileOp,
                  Var, as_expr, collect,
                  binary, cast, compare, const, const_value, logic_and, maximum, minimum, rewrite, select, seq)
from ..ir import Call as _Call
from ..plugin.api import Intrinsic
from . import tile_pass


# -- helpers ------------------------------------------------------------------------------------

def _nonunit(extents) -> list:
    return [d for d, e in enumerate(extents) if const_value(e) != 1]


def _nest(extents, kind, make_body, span, names="ijklmn"):
    """Loops over ``extents`` (one var each); ``make_body(vars)`` builds the innermost statement."""
    vs = [Var(names[k % len(names)]) for k in range(len(extents))]  # the emitter makes names unique
    body = make_body(vs)
    for v, e in reversed(list(zip(vs, extents))):
        body = For(v, as_expr(0), as_expr(e), kind, body, span=span)
    return body


def _in_bounds(buffer: Buffer, indices) -> object:
    """The condition that ``indices`` are inside ``buffer`` (True when provable statically)."""
    cond = IntImm(1, "bool")
    for idx, dim in zip(indices, buffer.shape):
        cond = logic_and(cond, compare("lt", idx, dim))  # folds: provably in bounds -> True, out -> False
    return cond


def _guarded(buffer: Buffer, indices, stmt, span, extra=None):
    """``stmt`` under the bounds check of a global buffer (and ``extra``, a further condition)."""
    cond = _in_bounds(buffer, indices) if buffer.scope == "global" else IntImm(1, "bool")
    if extra is not None:
        cond = logic_and(cond, extra)
    v = const_value(cond)
    if v is None:
        return If(cond, stmt, span=span)
    return stmt if v else seq([])


def _region_index(r: Region, loop_vars, dims) -> tuple:
    idx = list(r.starts)
    for v, d in zip(loop_vars, dims):
        idx[d] = binary("add", idx[d], v)
    return tuple(idx)


def _load_or_zero(r: Region, idx):
    load = BufferLoad(r.buffer, idx)
    if r.buffer.scope != "global":
        return load
    cond = _in_bounds(r.buffer, idx)
    return load if const_value(cond) else select(cond, load, const(0, r.buffer.dtype))


# -- generic implementations --------------------------------------------------------------------

def lower_copy(op: TileOp, ctx):
    src, dst = op.args
    sd, dd = _nonunit(src.extents), _nonunit(dst.extents)
    if len(sd) != len(dd):
        raise CompileError(f"T.copy: cannot match the shapes of {src.buffer.name} and {dst.buffer.name} "
                           "(symbolic extents that might be 1); use explicit slices of equal rank", op.span)
    extents = [dst.extents[d] for d in dd]

    def body(vs):
        si, di = _region_index(src, vs, sd), _region_index(dst, vs, dd)
        if dst.buffer.scope == "global" and src.buffer.scope == "global":
            # global to global: elements outside either tensor are not copied
            value = cast(dst.buffer.dtype, BufferLoad(src.buffer, si))
            return _guarded(dst.buffer, di, Store(dst.buffer, di, value, span=op.span), op.span,
                            extra=_in_bounds(src.buffer, si))
        value = cast(dst.buffer.dtype, _load_or_zero(src, si))
        return _guarded(dst.buffer, di, Store(dst.buffer, di, value, span=op.span), op.span)

    return _nest(extents, "parallel", body, op.span) if extents else body([])


def lower_fill(op: TileOp, ctx):
    r, value = op.args
    dims = _nonunit(r.extents)

    def body(vs):
        idx = _region_index(r, vs, dims)
        return _guarded(r.buffer, idx, Store(r.buffer, idx, value, span=op.span), op.span)

    return _nest([r.extents[d] for d in dims], "parallel", body, op.span)


def matrix_index(r: Region, row, col):
    """Indices of element (row, col) of the matrix a region views (its last two dimensions)."""
    idx = list(r.starts)
    idx[-2] = binary("add", idx[-2], row)
    idx[-1] = binary("add", idx[-1], col)
    return tuple(idx)


def lower_gemm(op: TileOp, ctx):
    a, b, c = op.args
    ta, tb = op.attrs.get("transpose_A"), op.attrs.get("transpose_B")
    m, n = c.extents[-2], c.extents[-1]
    k = a.extents[-2] if ta else a.extents[-1]
    acc = c.buffer.dtype
    i, kk, j = Var("gi"), Var("gk"), Var("gj")
    av = Var("ga", acc)
    a_idx = matrix_index(a, kk, i) if ta else matrix_index(a, i, kk)
    b_idx = matrix_index(b, j, kk) if tb else matrix_index(b, kk, j)
    c_idx = matrix_index(c, i, j)
    from ..ir import Bind

    update = Store(c.buffer, c_idx, binary("add", BufferLoad(c.buffer, c_idx),
                                           binary("mul", av, cast(acc, BufferLoad(b.buffer, b_idx)))), span=op.span)
    inner = For(j, as_expr(0), n, "parallel", update, span=op.span)
    kloop = For(kk, as_expr(0), k, "serial", seq([Bind(av, cast(acc, BufferLoad(a.buffer, a_idx)), span=op.span),
                                                 inner]), span=op.span)
    body = For(i, as_expr(0), m, "serial", kloop, span=op.span)
    if op.attrs.get("clear_accum"):
        body = seq([lower_fill(TileOp("fill", (c, const(0, acc)), span=op.span), ctx), body])
    return body


_REDUCE_INIT = {"sum": 0.0, "abssum": 0.0, "absmax": 0.0}


def _reduce_init(kind: str, dtype):
    from ..ir import max_value, min_value

    if kind == "max":
        v = min_value(dtype)
    elif kind == "min":
        v = max_value(dtype)
    else:
        v = 0
    return const(v, dtype)


def _combine(kind: str, acc, x):
    if kind in ("abssum", "absmax"):
        x = _Call("abs", (x,), x.dtype)
    if kind in ("sum", "abssum"):
        return binary("add", acc, x)
    if kind in ("max", "absmax"):
        return maximum(acc, x)
    return minimum(acc, x)


def lower_reduce(op: TileOp, ctx):
    src, dst = op.args
    kind, dim, clear = op.attrs["kind"], op.attrs["dim"], op.attrs["clear"]
    dtype = dst.buffer.dtype
    kept = [d for d in range(len(src.extents)) if d != dim]
    ddims = _nonunit(dst.extents)
    kept_nonunit = [d for d in kept if const_value(src.extents[d]) != 1]
    if len(kept_nonunit) != len(ddims):
        raise CompileError(f"T.reduce_{kind}: cannot match {src.buffer.name} to {dst.buffer.name}", op.span)

    def body(vs):
        acc = Buffer("acc", (1,), dtype, "var")
        di = _region_index(dst, vs, ddims)
        r = Var("r")
        src_idx = list(_region_index(src, vs, kept_nonunit))
        src_idx[dim] = binary("add", src_idx[dim], r)
        x = cast(dtype, BufferLoad(src.buffer, tuple(src_idx)))
        zero = (const(0),)
        init = _reduce_init(kind, dtype) if clear else BufferLoad(dst.buffer, di)
        # a global source region may run past the tensor (a ragged tile): skip those elements
        update = _guarded(src.buffer, src_idx, Store(acc, zero, _combine(kind, BufferLoad(acc, zero), x),
                                                     span=op.span), op.span)
        loop = For(r, as_expr(0), src.extents[dim], "serial", update, span=op.span)
        return _guarded(dst.buffer, di, seq([Allocate(acc, init, span=op.span), loop,
                                             Store(dst.buffer, di, BufferLoad(acc, zero), span=op.span)]), op.span)

    return _nest([src.extents[d] for d in kept_nonunit], "parallel", body, op.span)


def lower_cumsum(op: TileOp, ctx):
    src, dst = op.args
    dim, reverse = op.attrs["dim"], op.attrs["reverse"]
    dtype = dst.buffer.dtype
    snon, dnon = _nonunit(src.extents), _nonunit(dst.extents)
    if len(snon) != len(dnon):
        raise CompileError(f"T.cumsum: cannot match the shapes of {src.buffer.name} and {dst.buffer.name} "
                           "(symbolic extents that might be 1); use explicit slices of equal rank", op.span)
    # `dim` counts the source's dims; the destination may have other unit dims (a row into a 1-D tile)
    ddim = dnon[snon.index(dim)] if dim in snon else None
    others = [d for d in snon if d != dim]
    dothers = [d for d in dnon if d != ddim]
    n = src.extents[dim]

    def body(vs):
        acc = Buffer("acc", (1,), dtype, "var")
        r = Var("r")
        pos = binary("sub", binary("sub", n, 1), r) if reverse else r
        si = list(_region_index(src, vs, others))
        si[dim] = binary("add", si[dim], pos)
        di = list(_region_index(dst, vs, dothers))
        if ddim is not None:
            di[ddim] = binary("add", di[ddim], pos)
        zero = (const(0),)
        step = seq([Store(acc, zero, binary("add", BufferLoad(acc, zero), cast(dtype, _load_or_zero(src, tuple(si)))),
                          span=op.span),
                    _guarded(dst.buffer, tuple(di), Store(dst.buffer, tuple(di), BufferLoad(acc, zero), span=op.span),
                             op.span)])
        return seq([Allocate(acc, const(0, dtype), span=op.span), For(r, as_expr(0), n, "serial", step, span=op.span)])

    return _nest([src.extents[d] for d in others], "parallel", body, op.span)


def lower_atomic(op: TileOp, ctx):
    value, dst = op.args
    vd, dd = _nonunit(value.extents), _nonunit(dst.extents)

    def body(vs):
        vi, di = _region_index(value, vs, vd), _region_index(dst, vs, dd)
        stmt = Atomic(op.attrs["kind"], dst.buffer, di, cast(dst.buffer.dtype, BufferLoad(value.buffer, vi)), span=op.span)
        return _guarded(dst.buffer, di, _guarded(value.buffer, vi, stmt, op.span), op.span)

    return _nest([dst.extents[d] for d in dd], "parallel", body, op.span)


GENERIC = [
    Intrinsic("copy", "generic.copy", lower_copy),
    Intrinsic("fill", "generic.fill", lower_fill),
    Intrinsic("gemm", "generic.gemm", lower_gemm),
    Intrinsic("reduce", "generic.reduce", lower_reduce),
    Intrinsic("cumsum", "generic.cumsum", lower_cumsum),
    Intrinsic("atomic", "generic.atomic", lower_atomic),
]


def choose(op: TileOp, ctx) -> Intrinsic:
    best = None
    # checked mode checks plain loads and stores: every op takes the core's generic implementation
    table = GENERIC if ctx.option("tilecore.checked", False) else list(ctx.intrinsics) + GENERIC
    for intr in table:
        if intr.op != op.op:
            continue
        if not all(ctx.capabilities.satisfies(need)[0] for need in intr.requires):
            continue
        if intr.applies is not None and not intr.applies(op, ctx):
            continue
        if best is None or intr.priority > best.priority:
            best = intr
    if best is None:  # unreachable while GENERIC covers every op
        raise CompileError(f"no implementation of T.{op.op} for target {ctx.target}", op.span)
    return best


@tile_pass("tilecore.lower_tile_ops")
def lower_tile_ops(func, ctx):
    """Replace every tile op with the statement its chosen intrinsic produces. A shared tile that a matrix
    instruction reads by descriptor (a :class:`~tilecore.ir.MatrixOp` origin: the memory slot stores it in
    swizzled panels) is never handed to a block-wide library call, which addresses its regions row-major:
    an op whose chosen intrinsic would do that takes the core's generic lowering (elements go through the
    tile's layout); a copy from a global tensor into such a tile is one bulk tile copy waited for on a
    transaction barrier where the target has them (``pipeline.bulk_copy_and_wait``), else asynchronous runs."""
    chosen: list = []
    paneled = {id(o.buffer): m.attrs[f"{x}_layout"] for m in collect(func.body, MatrixOp) for x in ("a", "b")
               if (o := getattr(m, f"{x}_origin")) is not None}

    def addresses_paneled(stmt) -> bool:
        return any(isinstance(a, Region) and id(a.buffer) in paneled
                   for c in collect(stmt, Collective) for a in c.args)

    def lower(s):
        if isinstance(s, TileOp):
            intr = choose(s, ctx)
            out = intr.lower(s, ctx)
            if paneled and intr not in GENERIC and addresses_paneled(seq(out) if isinstance(out, list) else out):
                intr = next(g for g in GENERIC if g.op == s.op)
                out = intr.lower(s, ctx)
                if s.op == "copy" and ctx.capabilities.satisfies("feature:async_copy")[0] is True:
                    from .pipeline import bulk_copy_and_wait, copy_and_wait, copy_bytes

                    dst = s.args[1].buffer if isinstance(s.args[1], Region) else None
                    bulk = bulk_copy_and_wait(out, paneled.get(id(dst)), ctx) if dst is not None else None
                    out = bulk if bulk is not None else copy_and_wait(out, copy_bytes(ctx))
            chosen.append(f"{s.op}:{intr.name}")
            return out
        return None

    body = rewrite(func.body, lower)
    return func.with_body(body, intrinsics=tuple(sorted(set(chosen))))
