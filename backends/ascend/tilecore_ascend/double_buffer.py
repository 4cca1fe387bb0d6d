"""``T.Pipelined(num_stages >= 2)`` as double buffering (``ascend.double_buffer``, slot ``pipelining``).

A pipelined loop whose body refills on-chip tiles from global memory (MTE2: ``DataCopyPad`` into UB,
``Nd2Nz`` into L1) gets a second copy of each such tile and is unrolled by two: the even iteration uses the
tiles (ping), the odd one their copies (pong); an odd trip count guards the pong half. Nothing else is
written here: ``ascend.insert_sync`` then finds that the refill of the pong tile only has to wait for the
compute pipe's reads of the pong tile one trip earlier, and gives each tile its own loop-carried flag
(``WaitFlag<V_MTE2>(ping)`` / ``(pong)``, each with its own event ID), so the DMA of tile k+1 runs while
the vector unit (or MTE1 and the cube) works on tile k.

A tile is staged when the loop body is its only user and the body's first statement that touches it only
writes it (its contents never live from one trip to the next). A loop whose doubled tiles would not fit
their scope (``limit:max_<scope>_bytes``) stays serial (tiles are taken one by one, each while its copy
still fits); ``num_stages`` above 2 is taken as 2.
"""
from __future__ import annotations

from tilecore.ir.bounds import Facts, nonneg_forms
from tilecore.ir import (Allocate, Buffer, BufferLoad, For, If, KernelLaunch, Seq, Var, as_expr, binary, collect,
                         compare, const_value, rewrite, seq, simplify, walk)
from tilecore.passes import tile_pass
from tilecore.passes.pipeline import map_stmt, substitute

from .ops import AscendOp

MTE2_FILLS = ("CopyIn", "CopyNd2Nz", "InitL1")


def _touches(s, buf) -> tuple:
    """``(reads, writes)``: whether ``s`` (any depth) reads / writes ``buf``."""
    from .passes import _accesses

    r = w = False
    for _, reads, writes in _accesses(s):
        r = r or any(b is buf for b in reads)
        w = w or any(b is buf for b in writes)
    return r, w


def _stage_tiles(loop: For, launch_body) -> list:
    body = loop.body.body if isinstance(loop.body, Seq) else [loop.body]
    cands = []
    for op in collect(loop.body, AscendOp):
        if type(op).__name__ in MTE2_FILLS and op.dst.scope in ("shared", "fragment") and op.dst not in cands:
            cands.append(op.dst)
    inside = {id(x) for x in collect(loop, AscendOp)}
    out = []
    for b in cands:
        first = next((x for x in body if any(_touches(x, b))), None)
        if first is None or _touches(first, b) != (False, True):
            continue  # read before it is refilled: its contents live across trips
        outside = [op for op in collect(launch_body, AscendOp) if id(op) not in inside and any(_touches(op, b))]
        if outside or _used_outside_by_scalars(launch_body, loop, b):
            continue
        out.append(b)
    return out


def _used_outside_by_scalars(launch_body, loop, b) -> bool:
    """Whether a statement outside ``loop`` that is not an AscendC instruction reads or writes ``b``."""
    from .passes import _scalar_access

    found = []

    def visit(s):
        if s is loop or isinstance(s, (AscendOp, Seq, KernelLaunch, For, If, Allocate)):
            return
        r, w = _scalar_access([s])
        if any(x is b for x in r + w):
            found.append(s)

    def walk_outside(s):
        if s is None or s is loop:
            return
        visit(s)
        if isinstance(s, Seq):
            for c in s.body:
                walk_outside(c)
        elif isinstance(s, For):
            walk_outside(s.body)
        elif isinstance(s, If):
            walk_outside(s.then)
            walk_outside(s.orelse)
        elif isinstance(s, KernelLaunch):
            walk_outside(s.body)

    walk_outside(launch_body)
    return bool(found)


def _rename(s, table: dict):
    """``s`` with every buffer in ``table`` (``id(old) -> new``) replaced, in instructions, loads and stores."""

    def load(x):
        return BufferLoad(table[id(x.buffer)], x.indices) if isinstance(x, BufferLoad) and id(x.buffer) in table else None

    def store(b, idx):
        return (table.get(id(b), b), idx)

    def item(v):
        if isinstance(v, Buffer):
            return table.get(id(v), v)
        if isinstance(v, tuple):
            return tuple(item(x) for x in v)
        return v

    def ops(x):
        if not isinstance(x, AscendOp):
            return None
        changes = {f: item(getattr(x, f)) for f in x.__dataclass_fields__ if f != "span"}
        return x.with_(**changes)

    return rewrite(map_stmt(s, load, None, store), ops)


def _fresh_loops(s):
    table: dict = {}
    walk(s, lambda x: table.setdefault(id(x.var), Var(x.var.name, x.var.dtype)) if isinstance(x, For) else None)
    if not table:
        return s

    def rename(x):
        return x.with_(var=table[id(x.var)]) if isinstance(x, For) and id(x.var) in table else None

    return rewrite(substitute(s, table), rename)


def _fits(launch_body, ctx) -> bool:
    from .passes import plan_scopes

    for scope, plan in plan_scopes(launch_body).items():
        lim = ctx.capabilities.limit(f"max_{scope}_bytes")
        if lim is not None and max((o + n for _, o, n in plan), default=0) > lim[0]:
            return False
    return True


def _double(loop: For, tiles: list) -> tuple:
    """The loop unrolled by two over ping/pong tiles, and ``{id(tile): pong}``."""
    pong = {id(b): Buffer(b.name + "_pong", b.shape, b.dtype, b.scope) for b in tiles}
    k2 = Var(loop.var.name + "_2", loop.var.dtype)
    base = binary("add", loop.start, binary("mul", k2, as_expr(2, loop.var.dtype)))
    nxt = binary("add", base, as_expr(1, loop.var.dtype))
    even = substitute(loop.body, {id(loop.var): base})
    odd = _fresh_loops(_rename(substitute(loop.body, {id(loop.var): nxt}), pong))
    n = loop.extent
    trips = simplify(binary("floordiv", binary("add", n, as_expr(1, n.dtype)), as_expr(2, n.dtype)))
    nv = const_value(simplify(n))
    if nv is None or nv % 2:
        odd = If(compare("lt", binary("add", binary("mul", k2, as_expr(2, loop.var.dtype)), as_expr(1, loop.var.dtype)), n),
                 odd, span=loop.span)
    ann = {**loop.annotations, "ascend_double_buffered": tuple(sorted(b.name for b in tiles))}
    new = For(k2, as_expr(0, loop.var.dtype), trips, "serial", seq([even, odd]), ann, span=loop.span)
    return new, pong


def _prune(s, facts):
    """``s`` without the ``if`` statements that cannot run (a partial-tile guard whose tile is never partial,
    given the ranges of the loop and block indices): their instructions would only add syncs."""
    if isinstance(s, Seq):
        return s.with_(body=[_prune(c, facts) for c in s.body])
    if isinstance(s, For):
        hi = simplify(binary("sub", binary("add", s.start, s.extent), as_expr(1, s.extent.dtype)))
        return s.with_(body=_prune(s.body, facts.with_range(s.var, s.start, hi)))
    if isinstance(s, If):
        never = nonneg_forms(s.cond, False, exact=True)
        if s.orelse is None and never is not None and all(facts.proves_nonneg(g) for g in never):
            return Seq([], span=s.span)
        return s.with_(then=_prune(s.then, facts.with_cond(s.cond)),
                       orelse=None if s.orelse is None else _prune(s.orelse, facts.with_cond(s.cond, False)))
    return s


@tile_pass("ascend.double_buffer")
def double_buffer(func, ctx):
    launches = collect(func.body, KernelLaunch)
    if len(launches) != 1:
        return func
    launch = launches[0]
    facts = Facts()
    for v, g in zip(launch.block_vars, launch.grid):
        facts = facts.with_range(v, as_expr(0, v.dtype), simplify(binary("sub", g, as_expr(1, g.dtype))))
    body = _prune(launch.body, facts)
    done = []
    for loop in collect(body, For):
        if loop.kind != "pipelined" or int(loop.annotations.get("num_stages", 0) or 0) < 2:
            continue
        if not collect(loop.body, AscendOp):
            continue
        chosen, best = [], None
        for tile in _stage_tiles(loop, body):  # each tile gets its second copy if that still fits its scope
            trial = _with_pong(body, loop, chosen + [tile])
            if _fits(trial, ctx):
                chosen, best = chosen + [tile], trial
        if not chosen:
            continue  # no tile has room for a second copy: this loop stays serial
        body = best
        done += [b.name for b in chosen]
    new_launch = launch.with_(body=body)
    if func.body is launch:
        fbody = new_launch
    elif isinstance(func.body, Seq) and any(x is launch for x in func.body.body):
        fbody = func.body.with_(body=[new_launch if x is launch else x for x in func.body.body])
    else:
        return func
    return func.with_body(fbody, ascend_double_buffered=tuple(done)) if done else func.with_body(fbody)


def _with_pong(body, loop, tiles):
    new, pong = _double(loop, tiles)

    def fix(s):
        if s is loop:
            return new
        if isinstance(s, Allocate) and id(s.buffer) in pong:
            return [s, Allocate(pong[id(s.buffer)], span=s.span)]
        return None

    return _rewrite_identity(body, fix)


def _rewrite_identity(s, fn):
    """Like ``rewrite`` but ``fn`` sees the original statements (so it can match them by identity), top-down."""
    out = fn(s)
    if out is not None:
        return seq(out) if isinstance(out, list) else out
    if isinstance(s, Seq):
        return s.with_(body=[_rewrite_identity(c, fn) for c in s.body])
    if isinstance(s, For):
        return s.with_(body=_rewrite_identity(s.body, fn))
    if isinstance(s, If):
        return s.with_(then=_rewrite_identity(s.then, fn),
                       orelse=None if s.orelse is None else _rewrite_identity(s.orelse, fn))
    if isinstance(s, KernelLaunch):
        return s.with_(body=_rewrite_identity(s.body, fn))
    return s
