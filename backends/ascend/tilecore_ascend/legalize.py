"""``ascend.place_shared`` (slot ``legalize``, before the core's checks): ``T.alloc_shared`` tiles become
block tiles of the same shape and dtype (scope ``fragment``), which the backend places in UB, or in L1 when
the cube consumes them (``ascend.plan_onchip``).

An AI Core has no memory shared by threads (the profiles say ``features.shared_memory: false``, so the core
would refuse ``T.alloc_shared``); a TileLang kernel's shared tiles are its on-chip staging tiles, which is
what UB and L1 are (tilelang-ascend maps ``shared``/``shared.dyn`` the same way). The function is rebuilt
with new buffers, never changed in place: the same ``PrimFunc`` still compiles for other targets.
"""
from __future__ import annotations

import dataclasses

from tilecore.ir import Allocate, Buffer, BufferLoad, Expr, Region, Stmt, collect, rewrite
from tilecore.passes import tile_pass
from tilecore.passes.pipeline import map_expr


def _expr(e, m):
    return map_expr(e, lambda x: BufferLoad(m[id(x.buffer)], x.indices)
                    if isinstance(x, BufferLoad) and id(x.buffer) in m else None)


def _value(v, m):
    if isinstance(v, Buffer):
        return m.get(id(v), v)
    if isinstance(v, Region):
        return Region(m.get(id(v.buffer), v.buffer), tuple(_expr(e, m) for e in v.starts),
                      tuple(_expr(e, m) for e in v.extents))
    if isinstance(v, Expr):
        return _expr(v, m)
    if isinstance(v, tuple):
        return tuple(_value(x, m) for x in v)
    return v


@tile_pass("ascend.place_shared")
def place_shared(func, ctx):
    shared = [a.buffer for a in collect(func.body, Allocate) if a.buffer.scope == "shared"]
    if not shared:
        return func
    m = {id(b): Buffer(b.name, b.shape, b.dtype, "fragment") for b in shared}

    def fix(s):
        changes = {f.name: _value(getattr(s, f.name), m) for f in dataclasses.fields(s)
                   if f.name != "span" and not isinstance(getattr(s, f.name), Stmt)}
        return s.with_(**changes)

    return func.with_body(rewrite(func.body, fix))
