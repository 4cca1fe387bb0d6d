"""Shared tiles that only relay a fragment to global memory, folded (``tilecore.fold_relay_tiles``, D63).

TileLang's kernels often end ``T.copy(acc, C_shared)`` then ``T.copy(C_shared, C[...])`` (FlashAttention's
``O_shared``). On a target whose stores are per thread (no bulk tile store to feed), the tile costs on-chip memory
and a round trip: FlashAttention 128x128 d128 on a 163 KiB target cannot stage V beside it (Q, K and V twice and
the relay tile need 192 KiB; without the tile 160). This pass (``layout`` slot, first, before layout inference)
finds, at a kernel's top level, a shared tile that

- is written by exactly one statement, a whole ``T.copy`` from a fragment of its shape,
- is otherwise only read, each time by a whole ``T.copy`` of it into a global region, after that write,
- whose fragment nothing writes between the write and the last read,
- and whose dtype is the fragment's or every destination's (the round trip then rounds as the direct copy does:
  the same bits),

and replaces each copy out of it by a copy straight from the fragment, dropping the tile, its allocation and the
copy into it. The folded tiles' names go to ``func.attrs["relay_tiles"]``. Off by default
(``tilecore.fold_relay_tiles``; True folds on any target); a backend's defaults may ask for it.
"""
from __future__ import annotations

from ..ir import Allocate, Atomic, Buffer, BufferLoad, Expr, KernelLaunch, Region, Seq, Store, TileOp, as_expr, \
    const_value, rewrite, simplify, walk, walk_expr
from . import tile_pass

OPTION = "tilecore.fold_relay_tiles"


def _whole(r) -> bool:
    if not isinstance(r, Region):
        return False
    shape = r.buffer.static_shape()
    return (shape is not None and all(const_value(simplify(as_expr(x))) == 0 for x in r.starts)
            and tuple(const_value(simplify(as_expr(x))) for x in r.extents) == tuple(shape))


def mentions_buffer(s, buf) -> bool:
    """Whether statement ``s`` (nested statements included) names ``buf``: as a region, a store's target, a load or
    an allocation."""
    hit: list = []

    def expr(x):
        if isinstance(x, BufferLoad) and x.buffer is buf:
            hit.append(x)

    def visit(n):
        for f in getattr(n, "__dataclass_fields__", {}):
            v = getattr(n, f)
            for item in (v if isinstance(v, tuple) else (v,)):
                if isinstance(item, Region):
                    if item.buffer is buf:
                        hit.append(item)
                    for e in (*item.starts, *item.extents):
                        walk_expr(as_expr(e), expr)
                elif isinstance(item, Buffer) and item is buf:
                    hit.append(item)
                elif isinstance(item, Expr):
                    walk_expr(item, expr)

    walk(s, visit)
    return bool(hit)


def may_write(s, buf) -> bool:
    """``s`` may write ``buf``: a tile op's destination (or any region of an op not known to only read it), a
    store or an atomic."""
    dst = {"copy": (1,), "fill": (0,), "reduce": (1,), "gemm": (2,)}
    hit: list = []

    def visit(n):
        if isinstance(n, TileOp):
            idx = dst.get(n.op, range(len(n.args)))
            if any(i < len(n.args) and isinstance(n.args[i], Region) and n.args[i].buffer is buf for i in idx):
                hit.append(n)
        elif isinstance(n, (Store, Atomic)) and n.buffer is buf:
            hit.append(n)

    walk(s, visit)
    return bool(hit)


def _is_copy(s) -> bool:
    return isinstance(s, TileOp) and s.op == "copy" and len(s.args) == 2 and all(isinstance(a, Region) for a in s.args)


def fold(body: list) -> tuple:
    """``(body, folded tile names)`` for a kernel's top-level statements (see the module docstring)."""
    folded = []
    for a in [s for s in body if isinstance(s, Allocate) and s.buffer.scope == "shared"]:
        t = a.buffer
        if t.static_shape() is None or a.init is not None:
            continue
        users = [k for k, s in enumerate(body) if s is not a and mentions_buffer(s, t)]
        writes = [k for k in users if may_write(body[k], t)]
        if len(writes) != 1 or not _is_copy(body[writes[0]]):
            continue
        w = writes[0]
        src, dst = body[w].args
        if not (src.buffer.scope == "fragment" and dst.buffer is t and _whole(src) and _whole(dst)
                and src.buffer.static_shape() == t.static_shape()):
            continue
        reads = [k for k in users if k != w]
        if not reads or not all(k > w and _is_copy(body[k]) and body[k].args[0].buffer is t and _whole(body[k].args[0])
                                and body[k].args[1].buffer.scope == "global" for k in reads):
            continue
        if any(t.dtype != src.buffer.dtype and t.dtype != body[k].args[1].buffer.dtype for k in reads):
            continue  # the round trip would round differently from the direct copy
        if any(may_write(body[k], src.buffer) for k in range(w + 1, max(reads))):
            continue
        for k in reads:
            r = body[k]
            body[k] = TileOp("copy", (src, r.args[1]), dict(r.attrs), span=r.span)
        body = [s for k, s in enumerate(body) if k != w and s is not a]
        folded.append(t.name)
    return body, folded


@tile_pass("tilecore.fold_relay_tiles")
def fold_relay_tiles(func, ctx):
    """Shared tiles that only relay a fragment to global memory become direct copies (module docstring)."""
    if ctx.option(OPTION, False) is not True:
        return func
    names: list = []

    def fix(s):
        if not isinstance(s, KernelLaunch):
            return None
        body = list(s.body.body) if isinstance(s.body, Seq) else [s.body]
        new, folded = fold(body)
        if not folded:
            return None
        names.extend(folded)
        return s.with_(body=Seq(new, span=s.body.span))

    body = rewrite(func.body, fix)
    if not names:
        return func
    return func.with_body(body, relay_tiles=tuple(names))
