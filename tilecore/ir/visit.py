"""Walking and rewriting statement trees.

``walk(stmt, fn)`` calls ``fn`` on every statement, parents first. ``rewrite(stmt, fn)`` rebuilds the
tree bottom-up: ``fn`` gets each statement with its children already rewritten and returns a
replacement (a statement, a list of statements, or ``None`` to keep it).
"""
from __future__ import annotations

from typing import Callable

from .buffer import Buffer, Region
from .expr import BufferLoad, Expr, walk_expr
from .stmt import For, If, KernelLaunch, MatrixLoad, MatrixStore, PerThread, Seq, Specialized, Stmt, VectorStore, seq

_CHILDREN = {For: ("body",), If: ("then", "orelse"), KernelLaunch: ("body",), PerThread: ("body",),
             MatrixLoad: ("fallback",), Specialized: ("producer", "consumer"),
             VectorStore: ("fallback",), MatrixStore: ("fallback",)}


def children(s: Stmt) -> list:
    if isinstance(s, Seq):
        return list(s.body)
    return [getattr(s, f) for f in _CHILDREN.get(type(s), ()) if getattr(s, f) is not None]


def walk(s: Stmt | None, fn: Callable[[Stmt], None]) -> None:
    if s is None:
        return
    fn(s)
    for c in children(s):
        walk(c, fn)


def collect(s: Stmt, kind) -> list:
    out: list = []
    walk(s, lambda x: out.append(x) if isinstance(x, kind) else None)
    return out


def rewrite(s: Stmt | None, fn: Callable[[Stmt], object]) -> Stmt | None:
    if s is None:
        return None
    if isinstance(s, Seq):
        new = seq([rewrite(c, fn) for c in s.body])
        new = new if isinstance(new, Seq) else Seq([new], span=s.span) if new is not None else Seq([])
    else:
        fields = _CHILDREN.get(type(s), ())
        changes = {f: rewrite(getattr(s, f), fn) for f in fields}
        new = s.with_(**changes) if fields else s
    out = fn(new)
    if out is None:
        return new
    return seq(out) if isinstance(out, list) else out


def stmt_exprs(s: Stmt) -> list:
    """The expressions a statement holds directly (in its fields or their tuples), not those of nested
    statements."""
    out = []
    for f in getattr(s, "__dataclass_fields__", {}):
        v = getattr(s, f)
        for item in (v if isinstance(v, tuple) else (v,)):
            if isinstance(item, Expr):
                out.append(item)
    return out


def buffers_named(s: Stmt, regions: bool = False) -> set:
    """ids of the buffers the statement ``s`` and everything under it read or write: the loads in their expressions
    and the statements' buffer fields (stores, allocations, matrix operands, copies); with ``regions`` also the
    buffers of their :class:`Region` fields."""
    out: set = set()

    def load(x):
        if isinstance(x, BufferLoad):
            out.add(id(x.buffer))

    def stmt(x):
        for name in getattr(x, "__dataclass_fields__", {}):
            v = getattr(x, name)
            for item in (v if isinstance(v, tuple) else (v,)):
                if isinstance(item, Buffer):
                    out.add(id(item))
                elif regions and isinstance(item, Region):
                    out.add(id(item.buffer))
        for e in stmt_exprs(x):
            walk_expr(e, load)

    walk(s, stmt)
    return out


def loop_nest(loop: For, kinds) -> tuple:
    """``(loops, inner)``: the chain of perfectly nested loops of ``kinds`` that starts at ``loop`` (single-
    statement sequences between them skipped), and the statement inside the innermost."""
    loops: list = []
    s = loop
    while isinstance(s, For) and s.kind in kinds:
        loops.append(s)
        b = s.body
        while isinstance(b, Seq) and len(b.body) == 1:
            b = b.body[0]
        s = b
    return loops, s
