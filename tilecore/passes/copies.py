"""One asynchronous group for consecutive copies into shared memory (``tilecore.group_async_copies``).

A ``T.copy`` from a global tensor into shared memory outside a pipelined loop is, after tile-op lowering, one
block-wide copy that waits for its own data and ends in a barrier before the next statement runs. A kernel
that opens with several such copies (TileLang's layernorm: the row X, then gamma, then beta) pays one memory
round trip and one barrier per copy, one after the other, before any arithmetic.

This pass (``tile-lowering`` slot, after ``tilecore.stage_pipelined_copies`` and before
``tilecore.lower_tile_ops``), on targets with ``feature:async_copy`` (not in checked mode), finds runs of
two or more consecutive independent copies:

- each a ``T.copy`` from a global tensor into a ``T.alloc_shared`` buffer of the same dtype (any region),
  the buffers all different (two copies into one buffer would race: asynchronous copies land in any
  order), none into a tile a matrix instruction reads by descriptor (``tilecore.lower_tile_ops`` gives
  those a bulk copy or the paneled layout), none the target's intrinsic table gives to a bulk tile copy (an
  implementation that requires ``feature:bulk_tensor_copy``: one thread's copy on a transaction barrier is
  left to the backend);
- consecutive statements of one sequence, not inside a ``T.Pipelined`` loop of two or more stages (the
  planner counts that loop's copy groups; a group of ours would drain its stages);

(D79, ``tilecore.pipeline_lead_copies``: also a lone such copy followed, in the same sequence, by a pipelined loop of
two or more stages: FlashAttention's Q, which then is the core's copy, its tile swizzled like the stages', its wait
and barrier left to the loop's first wait by the planner where that holds)
and lowers them together with the core's generic copy (:func:`~tilecore.passes.lower_tile.lower_copy`),
each nest as :class:`~tilecore.ir.AsyncCopy` runs of the widest aligned width the prover shows
(:func:`~tilecore.passes.pipeline.async_copy_nest`, the target's widths: ``limits.max_async_copy_bytes``,
versioned on dynamic row lengths), then one :class:`~tilecore.ir.AsyncCommit`, one ``AsyncWait(0)`` and one
:class:`~tilecore.ir.Barrier`: every copy is in flight before the first wait. A copy with no aligned run
stays a synchronous store nest inside the group (it lands in program order; the group's barrier publishes
it). The in-bounds predicates the prover shows true where the copy runs (block index ranges, enclosing
conditions, ``T.assume``) are dropped.

Backends spell the statements as they spell pipelined copies, and a backend whose launch checks the
alignment of the tensors that multi-element asynchronous copies read checks these too, as for pipelined
copies. Targets without asynchronous copies keep their copies as they were. Each group adds a line to
``func.attrs["copy_groups"]`` (``kernel.meta["attrs"]["copy_groups"]``), e.g.
``"X_smem, G_smem, B_smem: one async group (16-byte copies)"``.
"""
from __future__ import annotations

from ..ir import (AsyncCommit, AsyncCopy, AsyncWait, Barrier, For, If, KernelLaunch, MatrixOp, Region, Select, Seq, Store, TileOp,
                  collect, const_value, rewrite)
from ..ir.bounds import Facts
from . import tile_pass
from .guard import facts_at
from .pipeline import BULK_FEATURE, STAGE, lead_copies, async_copy_nest, copy_bytes, enabled

#: a run needs at least this many copies (one copy alone keeps the target's own copy: nothing to overlap)
MIN_GROUP = 2


def _groupable(s, paneled: set, ctx):
    """The destination buffer of ``s`` when it is a copy this pass may group, else None."""
    if not (isinstance(s, TileOp) and s.op == "copy" and len(s.args) == 2):
        return None
    src, dst = s.args
    if not (isinstance(src, Region) and isinstance(dst, Region) and src.buffer.scope == "global"
            and dst.buffer.scope == "shared" and src.buffer.dtype == dst.buffer.dtype):
        return None
    if id(dst.buffer) in paneled or id(dst.buffer.base or dst.buffer) in paneled:
        return None
    from .lower_tile import choose

    if BULK_FEATURE in choose(s, ctx).requires:
        return None  # the target's table copies it as a bulk tile copy (one thread, a transaction barrier)
    return dst.buffer.base or dst.buffer


def _drop_proven(nest, facts: Facts):
    """The lowered copy nest with its load predicate dropped where ``facts`` (and the nest's own loop ranges)
    prove it, so the copies carry no test."""
    from .guard import loop_facts

    f, s = facts, nest
    while isinstance(s, For):
        f = loop_facts(s, f)
        s = s.body
        while isinstance(s, Seq) and len(s.body) == 1:
            s = s.body[0]
    if not (isinstance(s, Store) and isinstance(s.value, Select) and const_value(s.value.f) == 0
            and f.proves(s.value.cond)):
        return nest
    new = s.with_(value=s.value.t)
    return rewrite(nest, lambda x: new if x is s else None)


def _pipelined_loop(s) -> bool:
    return isinstance(s, For) and s.kind == "pipelined" and int(s.annotations.get("num_stages", 0) or 0) >= 2


def _widths(new, how) -> str:
    found = sorted({c.elements * c.dst.dtype.bytes for c in collect(new, AsyncCopy)}, reverse=True)
    if not found:
        return "synchronous"
    return "/".join(map(str, found)) + "-byte copies"


@tile_pass("tilecore.group_async_copies")
def group_async_copies(func, ctx):
    """Issue consecutive independent copies into shared memory as one asynchronous group (one wait, one barrier)."""
    if not enabled(ctx):
        return func
    from .lower_tile import lower_copy

    paneled = set()
    for m in collect(func.body, MatrixOp):
        for x in ("a", "b"):
            o = getattr(m, f"{x}_origin")
            if o is not None:
                paneled.add(id(o.buffer))
    widths = copy_bytes(ctx)
    root = func.body
    notes: list = []

    def group(run: list) -> list | None:
        lowered, kinds = [], []
        for c in run:
            facts = facts_at(root, c) or Facts()
            nest = lower_copy(c, ctx)
            if isinstance(nest, For):
                nest = _drop_proven(nest, facts)
                nest, how = async_copy_nest(nest, widths, facts)
            else:
                how = "synchronous"
            lowered.append(nest)
            kinds.append(_widths(nest, how))
        if not any(collect(n, AsyncCopy) for n in lowered):
            return None  # nothing asynchronous: the target's own copies do as well
        span = run[0].span
        names = ", ".join(c.args[1].buffer.name for c in run)
        notes.append(f"{names}: one async group ({'; '.join(dict.fromkeys(kinds))})")
        return lowered + [AsyncCommit(span=span), AsyncWait(0, span=span), Barrier(span=span)]

    def visit(s):
        if isinstance(s, For):
            if s.kind == "pipelined" and int(s.annotations.get("num_stages", 0) or 0) >= 2 or s.annotations.get(STAGE):
                return s  # the planner owns this loop's copy groups
            return s.with_(body=visit(s.body))
        if isinstance(s, Seq):
            return Seq(_seq(list(s.body)), span=s.span)
        if isinstance(s, (If, KernelLaunch)):
            fields = ("then", "orelse") if isinstance(s, If) else ("body",)
            return s.with_(**{f: visit(getattr(s, f)) for f in fields if getattr(s, f) is not None})
        return s

    def _seq(body: list) -> list:
        out: list = []
        i = 0
        while i < len(body):
            run, seen = [], set()
            j = i
            while j < len(body):
                buf = _groupable(body[j], paneled, ctx)
                if buf is None or id(buf) in seen:
                    break
                seen.add(id(buf))
                run.append(body[j])
                j += 1
            if len(run) >= (1 if lead and any(_pipelined_loop(x) for x in body[j:]) else MIN_GROUP):
                grouped = group(run)
                if grouped is not None:
                    out += grouped
                    i = j
                    continue
            out.append(visit(body[i]))
            i += 1
        return out

    # D79 (tilecore.pipeline_lead_copies): a lone copy before a pipelined loop in the same sequence is grouped too (its
    # group's wait and barrier the planner may leave to the loop's first wait)
    lead = bool(lead_copies(ctx))
    body = visit(func.body)
    if not notes:
        return func
    return func.with_body(body, copy_groups=tuple(notes))


__all__ = ["group_async_copies"]

