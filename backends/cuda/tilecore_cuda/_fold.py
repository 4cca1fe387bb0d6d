"""Register programs' epilogue through shared memory, folded (docs/decisions.md D33).

TileLang's FlashAttention examples end ``T.copy(acc_o, O_shared)`` then ``T.copy(O_shared, Output[...])``; the
register programs (regprog.py) store a fragment to global memory from registers, so a shared tile that only
relays a fragment is folded into that store before their analysis runs.
"""
from __future__ import annotations

from tilecore.ir import Allocate, Region, TileOp
from tilecore.passes.relay import may_write as _writes, mentions_buffer as _mentions  # the core's walks (D63)

from ._irutil import full


def fold_epilogue_tiles(body: list) -> tuple:
    """A shared tile that only relays a fragment to global memory, folded into the fragment's store.

    TileLang's FlashAttention examples end ``T.copy(acc_o, O_shared)`` then ``T.copy(O_shared, Output[...])``.
    Where a block-level shared tile is written by exactly one statement, a whole ``T.copy`` from a fragment
    of its shape, and every other statement naming it is a whole ``T.copy`` of it into global memory after
    that write, with nothing in between writing the fragment, the tile holds nothing the fragment does not:
    each copy out of it becomes a copy straight from the fragment (the register program's fragment-to-global
    store), rounded through the tile's dtype (``attrs["via"]``, what the round trip did), and the tile, its
    allocation and the copy into it are dropped. Returns ``(body, names of the folded tiles)``; a body with
    no such tile comes back unchanged (the analysis then says what it refuses)."""
    folded = []
    for a in [s for s in body if isinstance(s, Allocate) and s.buffer.scope == "shared"]:
        t = a.buffer
        users = [k for k, s in enumerate(body) if not isinstance(s, Allocate) and _mentions(s, t)]
        writes = [k for k in users if isinstance(body[k], TileOp) and body[k].op == "copy"
                  and isinstance(body[k].args[1], Region) and body[k].args[1].buffer is t]
        if len(writes) != 1:
            continue
        w = writes[0]
        src, dst = body[w].args
        if not (isinstance(src, Region) and src.buffer.scope == "fragment" and full(src) and full(dst)
                and src.buffer.static_shape() == t.static_shape() and str(t.dtype) in ("float32", "float16", "bfloat16")):
            continue
        reads = [k for k in users if k != w]
        if not reads or not all(k > w and isinstance(body[k], TileOp) and body[k].op == "copy"
                                and isinstance(body[k].args[0], Region) and body[k].args[0].buffer is t
                                and full(body[k].args[0]) and isinstance(body[k].args[1], Region)
                                and body[k].args[1].buffer.scope == "global" for k in reads):
            continue
        if any(_writes(body[k], src.buffer) for k in range(w + 1, max(reads))):
            continue
        for k in reads:
            r = body[k]
            body[k] = TileOp("copy", (src, r.args[1]), {**r.attrs, "via": str(t.dtype)}, span=r.span)
        body = [s for k, s in enumerate(body) if k != w and s is not a]
        folded.append(t.name)
    return body, folded
