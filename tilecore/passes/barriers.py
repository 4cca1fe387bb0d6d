"""Block barriers that order nothing, removed (``tilecore.prune_barriers``, D63).

``tilecore.simt_distribute`` puts a barrier before a per-thread program that reads block or global memory and
after one that touches it, and the pipeline planner one after each wait for asynchronous copies. In a pipelined
loop that gives three to five barriers an iteration where one or two order anything: the copies into the stage
ahead are issued between two of them, a gemm that only reads its stage sits between two more. This pass (the
``before-codegen`` slot, after the backend's distribution) removes a barrier where no access before it and an access
after it, from different threads, could conflict:

- the accesses that matter are to memory the block's threads share: global tensors and the buffers allocated at the
  kernel's top level (``register`` buffers and anything allocated deeper are a thread's own);
- a barrier's *before* part runs back to the previous barrier of its statement list, its *after* part on to the
  next; in a uniform loop's body they wrap around (the end of one iteration meets the start of the next) and go on
  into the statements around the loop, up to a barrier there; where a part reaches the edge of any other list (a
  branch) the barrier stays; at the kernel's top level the kernel's start and end are edges without accesses;
- two parts conflict where one writes a buffer the other reads or writes (buffers, not elements: conservative);
- asynchronous copies: a copy's write lands at the wait that retires it, which a barrier before the copy's readers
  then publishes, so an issued copy counts as a write only in an *after* part (it must not overwrite what threads
  before the barrier still read) and a wait as a write of every copied-into buffer only in a *before* part;
- a block-wide library call (``Collective``) may read and write any of them (its own scratch included);
- a kernel with statements this analysis does not model (bulk copies and their transaction barriers, matrix-unit
  synchronization, warp-specialized or turn-taking blocks, barriers of part of the block) keeps every barrier.

Barriers are tried in program order; each removal merges two parts, which later tests see whole. The count removed
goes to ``func.attrs["pruned_barriers"]``. Off by default (``tilecore.prune_barriers``: True on any target).
"""
from __future__ import annotations

from ..ir import (AsyncCopy, AsyncWait, Atomic, Barrier, BufferLoad, BulkCopy, BulkFence, BulkStore, BulkStoreWait,
                  Collective, CopyBarrierArrive, CopyBarrierInit, CopyBarrierWait, For, If, KernelLaunch, MatrixOp,
                  MatrixStore, MatrixSync, PerThread, Print, Seq, Specialized, StageRelease, Store, Turn,
                  VectorStore, rewrite, walk, walk_expr)
from ..ir.stmt import Allocate
from ..ir.visit import stmt_exprs
from . import tile_pass

OPTION = "tilecore.prune_barriers"

_UNMODELED = (BulkCopy, BulkFence, BulkStore, BulkStoreWait, CopyBarrierArrive, CopyBarrierInit,
              CopyBarrierWait, MatrixSync, Specialized, StageRelease, Turn)
#: a statement that may touch any shared buffer (a block-wide library call: its own scratch, its own barriers)
ALL = -1


class _Skip(Exception):
    pass


class _Kernel:
    def __init__(self, launch: KernelLaunch):
        body = launch.body.body if isinstance(launch.body, Seq) else [launch.body]
        top = {id(s.buffer) for s in body if isinstance(s, Allocate) and s.buffer.scope != "register"}
        nested = set()

        def look(x):
            if isinstance(x, _UNMODELED) or isinstance(x, Barrier) and x.threads:
                raise _Skip(type(x).__name__)
            if isinstance(x, MatrixOp) and (x.a_origin is not None or x.b_origin is not None):
                raise _Skip("a matrix unit reading block memory")
            if isinstance(x, Allocate) and id(x.buffer) not in top:
                nested.add(id(x.buffer))

        walk(launch.body, look)
        self.private = nested | {id(s.buffer) for s in body if isinstance(s, Allocate) and s.buffer.scope == "register"}
        self.copied = {id(c.dst) for c in _collect(launch.body, AsyncCopy)}
        self.memo: dict = {}

    def shared(self, buf) -> bool:
        return id(buf) not in self.private

    def use(self, s, side: str) -> tuple:
        """``(reads, writes)``: ids of shared buffers statement ``s`` (nested statements included) reads and
        writes, as seen from the ``side`` ("before" / "after") of a barrier."""
        key = (id(s), side)
        hit = self.memo.get(key)
        if hit is not None and hit[0] is s:  # (the statement kept with its sets: an id is never a reused one)
            return hit[1]
        reads, writes = set(), set()

        def expr(e):
            walk_expr(e, lambda x: reads.add(id(x.buffer)) if isinstance(x, BufferLoad) and self.shared(x.buffer)
                      else None)

        def look(x):
            for e in stmt_exprs(x):
                expr(e)
            if isinstance(x, AsyncCopy):
                if self.shared(x.src):
                    reads.add(id(x.src))
                if side == "after" and self.shared(x.dst):
                    writes.add(id(x.dst))
            elif isinstance(x, AsyncWait):
                if side == "before":
                    writes.update(self.copied)
            elif isinstance(x, (Store, Atomic, VectorStore, MatrixStore)):
                if self.shared(x.buffer):
                    writes.add(id(x.buffer))
                    if isinstance(x, Atomic):
                        reads.add(id(x.buffer))
            elif isinstance(x, Print) and x.buffer is not None and self.shared(x.buffer):
                reads.add(id(x.buffer))
            elif isinstance(x, Collective):
                reads.add(ALL)
                writes.add(ALL)

        walk(s, look)
        self.memo[key] = (s, (reads, writes))
        return reads, writes


def _collect(s, kind) -> list:
    out: list = []
    walk(s, lambda x: out.append(x) if isinstance(x, kind) else None)
    return out


def _union(kern, stmts, side) -> tuple:
    r, w = set(), set()
    for s in stmts:
        a, b = kern.use(s, side)
        r |= a
        w |= b
    return r, w


def _meet(x: set, y: set) -> bool:
    return bool(x & y) or (ALL in x and bool(y)) or (ALL in y and bool(x))


def _conflict(before, after) -> bool:
    (rb, wb), (ra, wa) = before, after
    return _meet(wb, ra | wa) or _meet(rb, wa)


class _Pruner:
    def __init__(self, kern: _Kernel):
        self.kern = kern
        self.removed = 0

    def seq(self, items: list, loop_ctx) -> list:
        """``items`` (a statement list) with its prunable barriers removed; nested lists first. ``loop_ctx``:
        None for a list whose edges end the search (a branch), "top" for the kernel's top level, or
        ``(parent items, index of the loop in them, parent's context)`` for a uniform loop's body."""
        items = [self.stmt(s) for s in items]
        k = 0
        while k < len(items):
            if isinstance(items[k], Barrier) and self.prunable(items, k, loop_ctx):
                items = items[:k] + items[k + 1:]
                self.removed += 1
                continue
            k += 1
        return items

    def stmt(self, s):
        if isinstance(s, Seq):
            return Seq(self.seq(list(s.body), None), span=s.span)
        if isinstance(s, For) and _collect(s.body, Barrier):
            body = list(s.body.body) if isinstance(s.body, Seq) else [s.body]
            # the body's parts may wrap around and reach past the loop (prunable() finds the loop's parent list in
            # self.parents)
            return s.with_(body=Seq(self.seq(body, ("loop", s)), span=s.body.span))
        if isinstance(s, If) and _collect(s, Barrier):
            then = self.seq(list(s.then.body) if isinstance(s.then, Seq) else [s.then], None)
            orelse = None if s.orelse is None else \
                self.seq(list(s.orelse.body) if isinstance(s.orelse, Seq) else [s.orelse], None)
            return s.with_(then=Seq(then, span=s.then.span),
                           orelse=None if orelse is None else Seq(orelse, span=s.orelse.span))
        return s

    # -- the parts around a barrier ------------------------------------------------------------------
    def prunable(self, items, k, ctx) -> bool:
        before = self.part(items, k, -1, ctx)
        after = self.part(items, k, +1, ctx)
        if before is None or after is None:
            return False
        return not _conflict(_union(self.kern, before, "before"), _union(self.kern, after, "after"))

    def part(self, items, k, step, ctx):
        """The statements from barrier ``k`` of ``items`` to the next barrier in direction ``step``, wrapping
        around a loop's body and continuing around the loop; None where an edge of a branch is reached."""
        out, hit = _to_barrier(items, k + step, step)
        if hit or ctx == "top":
            return out
        if not (isinstance(ctx, tuple) and ctx[0] == "loop"):
            return None
        # a loop body: wrap around to the other end of the body (the next / previous iteration), up to barrier k
        # itself at the latest
        wrapped, _ = _to_barrier(items, 0 if step > 0 else len(items) - 1, step)
        out += wrapped
        # the loop also exits (or was entered) there: on around the loop
        more = self.around(ctx[1], step)
        return None if more is None else out + more

    def around(self, loop, step):
        """The statements next to ``loop`` in its parent list, in direction ``step``, up to a barrier (the loop
        also exits or is entered there); None where the parent is unknown or a branch edge is reached."""
        where = self.parents.get(id(loop))
        if where is None:
            return None
        items, idx, ctx = where
        out, hit = _to_barrier(items, idx + step, step)
        return out if hit or ctx == "top" else None


def _to_barrier(items, j, step) -> tuple:
    """The statements of ``items`` from index ``j`` in direction ``step`` up to the first barrier, and whether a
    barrier (rather than the list's end) stopped the walk."""
    out = []
    while 0 <= j < len(items):
        if isinstance(items[j], Barrier):
            return out, True
        out.append(items[j])
        j += step
    return out, False


def _parents(items, ctx, table):
    for i, s in enumerate(items):
        if isinstance(s, For):
            table[id(s)] = (items, i, ctx)


def prune_launch(launch: KernelLaunch) -> tuple:
    """``(launch, barriers removed)``; the launch unchanged (0) where the analysis does not model it."""
    try:
        kern = _Kernel(launch)
    except _Skip:
        return launch, 0
    p = _Pruner(kern)
    body = list(launch.body.body) if isinstance(launch.body, Seq) else [launch.body]
    p.parents = {}
    # parents are recorded for loops at the top level and (recursively) inside loop bodies; a loop inside a branch
    # finds no parent and keeps the barriers whose parts reach past it
    def record(items, ctx):
        _parents(items, ctx, p.parents)
        for s in items:
            if isinstance(s, For) and _collect(s.body, Barrier):
                inner = list(s.body.body) if isinstance(s.body, Seq) else [s.body]
                record(inner, ("loop", s))

    record(body, "top")
    new = p.seq(body, "top")
    if not p.removed:
        return launch, 0
    return launch.with_(body=Seq(new, span=launch.body.span)), p.removed


@tile_pass("tilecore.prune_barriers")
def prune_barriers(func, ctx):
    """Remove the block barriers that order no conflicting accesses (module docstring)."""
    if ctx.option(OPTION, False) is not True:
        return func
    return prune_function(func)


def prune_function(func):
    """``func`` with every launch's barriers pruned (:func:`prune_launch`); ``attrs["pruned_barriers"]`` counts them.
    Backends that turn the pruning on by default (where they measured it) call this."""
    total = [0]

    def fix(s):
        if not isinstance(s, KernelLaunch):
            return None
        new, n = prune_launch(s)
        total[0] += n
        return new if n else None

    body = rewrite(func.body, fix)
    return func.with_body(body, pruned_barriers=total[0]) if total[0] else func
