"""Thread distribution for targets that run a block on many threads (single-instruction, many-threads).

After tile-op lowering a kernel body is a block-level program: its statements run in program order,
once per block (the CPU backend runs exactly that). A target whose block is a group of threads needs
the same meaning spread over ``prod(threads)`` threads. ``tilecore.simt_distribute`` does that in
the IR, with two vendor-neutral nodes (:class:`~tilecore.ir.ThreadIndex`, :class:`~tilecore.ir.Barrier`):

- every block-local buffer allocated at block level (not inside a parallel loop) is hoisted to the
  top of the kernel body: an emitter places the kernel's top-level allocations in on-chip block
  memory shared by the threads; allocations inside parallel loops stay private to a thread;
- each block-level nest of ``parallel`` (or ``vectorized``) loops is flattened and distributed:
  ``for it: idx = it * nthreads + tid; if idx < total: i = idx / (..) % .., j = ..; body``, followed
  by a barrier;
- uniform serial loops and branches stay (every thread runs them) and their bodies are handled the
  same way; a bound or condition that reads memory is bound to a scalar first, then a barrier;
- a :class:`~tilecore.ir.PerThread` (a fragment lowering's per-thread program over registers) runs on
  every thread as it is; a barrier comes before it when it reads block or global memory and after it when
  it touches such memory at all (a later statement may overwrite what it read, or read what it wrote);
  one that only computes on registers needs none. ``register`` buffers are hoisted with the others but
  stay private to each thread (an emitter declares them as the thread's arrays);
- a :class:`~tilecore.ir.Collective` (an operation the whole block performs together, e.g. a backend's
  block-wide matrix multiply) runs on every thread, with ``threads`` set to their number, between two
  barriers (the callee may read what came before; what it writes is visible after);
- an :class:`~tilecore.ir.AsyncCopy` stays where it is inside its distributed nest (every thread issues
  its own copies) and a nest of nothing but async copies gets no barrier after it (the copies land at a
  later :class:`~tilecore.ir.AsyncWait`, which the planner follows with a barrier); AsyncCommit and
  AsyncWait run on every thread;
- a :class:`~tilecore.ir.BulkCopy`, :class:`~tilecore.ir.CopyBarrierArrive` or
  :class:`~tilecore.ir.CopyBarrierInit` runs on thread 0 with no barrier after it (bulk copies land on a
  transaction barrier; an init is followed by the planner's barrier), consecutive ones under one test;
  a :class:`~tilecore.ir.CopyBarrierWait` or :class:`~tilecore.ir.StageRelease` runs on every thread (a wait
  marked ``issuer`` on thread 0 with the bulk copies it precedes, D62);
- a :class:`~tilecore.ir.BulkStore` runs on thread 0 like a bulk copy; a :class:`~tilecore.ir.BulkStoreWait`
  runs on thread 0 (the thread that issued the stores), followed by a barrier; a :class:`~tilecore.ir.BulkFence`
  runs on every thread, followed by a barrier (a barrier right before it is dropped: the one after it orders
  the same writes);
- a :class:`~tilecore.ir.Specialized` block distributes its consumer program over its consumer threads
  (whose barriers become barriers of those threads only) and keeps its producer program as it is (one
  thread runs it);
- block-level statements that write memory (Store, Atomic, Print, unknown leaves) run on thread 0,
  followed by a barrier; Binds, Asserts, Break and Continue run on every thread (they are uniform);
  a Bind that reads memory is followed by a barrier (a later write must not race the read); a Bind of an atomic
  that returns the old value (D69) runs once per block, as on the CPU: thread 0 stores it to a shared slot, a
  barrier, every thread binds the slot's value.

Backends add it to the ``before-codegen`` slot (position ``before``). It records ``simt_threads``
(the flat thread count of the last launch) in ``func.attrs``.
"""
from __future__ import annotations

import math

from ..errors import CompileError
from ..ir import (Allocate, Assert, AsyncCommit, AtomicRet, Buffer, AsyncCopy, AsyncWait, Atomic, Barrier, Bind, Break, BufferLoad,
                  BulkCopy, BulkFence, BulkStore, BulkStoreWait, GroupBarrier, Cmp, Collective, Continue, CopyBarrierArrive, CopyBarrierInit, CopyBarrierWait, MatrixSync, Specialized,
                  StageRelease, For, If, IntImm, KernelLaunch, PerThread, Print, Seq, Store, ThreadIndex,
                  Var, as_expr, binary, collect, compare, const, const_value, loop_nest, rewrite, seq, stmt_exprs, walk,
                  walk_expr)
from ..ir import BinOp
from ..ir.bounds import thread_only
from . import tile_pass

_DISTRIBUTED = ("parallel", "vectorized")
#: statements one thread issues for the block, with no barrier after them
_ELECTED = (BulkCopy, CopyBarrierArrive, CopyBarrierInit, BulkStore)


def _elected(s) -> bool:
    """Run by the thread that issues the bulk copies: those, their barriers' arrivals and inits, a wait of the
    issuing thread alone (D62's release barriers)."""
    return isinstance(s, _ELECTED) or (isinstance(s, CopyBarrierWait) and getattr(s, "issuer", False))


def _has_atomic(e) -> bool:
    found = []
    walk_expr(e, lambda x: found.append(1) if isinstance(x, AtomicRet) else None)
    return bool(found)


def _loads_memory(e) -> bool:
    found = []
    walk_expr(e, lambda x: found.append(1) if isinstance(x, BufferLoad) else None)
    return bool(found)


def _memory_use(body, bulk_only=frozenset()) -> tuple:
    """(reads, writes) of memory that other threads see (not the thread's registers or the arrays its
    program declares, nor tiles only bulk copies write: each thread waits for those itself)."""
    private = {id(a.buffer) for a in collect(body, Allocate)} | set(bulk_only)
    reads, writes = [], []

    def mem(b):
        return b.scope not in ("register", "var") and id(b) not in private

    def look(s):
        for e in stmt_exprs(s):
            if isinstance(e, BinOp) and thread_only(e):  # no load in it (known by identity: D65)
                continue
            walk_expr(e, lambda x: reads.append(1) if isinstance(x, BufferLoad) and mem(x.buffer) else None)
        if isinstance(s, (Store, Atomic)) and mem(s.buffer) or isinstance(s, (Print, Collective)):
            writes.append(1)

    walk(body, look)
    return bool(reads), bool(writes)



def _prod(values):
    out = const(1)
    for v in values:
        out = binary("mul", out, v)
    return out


def _coordinate(it, tid, n: int, total, stride, extent, outer: bool, single: bool):
    """The coordinate ``idx / stride % extent`` of the flat element ``idx = it * n + tid`` (``0 <= tid < n``,
    ``0 <= idx < total``) written in ``it`` and ``tid`` directly where the division splits between them
    (the stride a multiple of ``n``, or ``n`` a multiple of the stride) and the remainder is dropped where
    the quotient cannot reach ``extent``: ``i = it``, ``j = tid`` for a 32x128 tile over 128 threads, where
    the general form divides ``idx`` at run time for every element. None: the general form."""
    if not all(isinstance(x, int) and x > 0 for x in (total, stride, extent)):
        return None
    trips = -(-total // n)
    if single:  # idx = tid
        top = (total - 1) // stride
        q = tid if stride == 1 else binary("div", tid, stride)
    elif stride % n == 0:
        k = stride // n
        top = (trips - 1) // k
        q = it if k == 1 else binary("div", it, k)
    elif n % stride == 0:
        k = n // stride
        top = (total - 1) // stride
        t = tid if stride == 1 else binary("div", tid, stride)
        if k % extent == 0:  # it * k is a multiple of the extent: only the thread's part remains
            top, q = min(top, k - 1), t
        else:
            q = binary("add", binary("mul", it, k), t)
    else:
        return None
    if outer or top < extent:
        return q
    return binary("sub", q, binary("mul", binary("div", q, extent), extent))


def _writes_of(body) -> list:
    """Ids of the buffers each writing statement of ``body`` other than a bulk copy writes (one per write)."""
    written: list = []

    def look(x):
        if isinstance(x, (Store, Atomic)):
            written.append(id(x.buffer))
        elif isinstance(x, AsyncCopy):
            written.append(id(x.dst))
        elif isinstance(x, Collective):
            written.extend(id(a.buffer) for a in x.args if hasattr(a, "buffer"))

    walk(body, look)
    return written


def _bulk_only(body) -> frozenset:
    """Ids of the tiles that only bulk copies write (threads see them after their own CopyBarrierWait; the
    planner orders their refills after every reader: a barrier, or the consumers' StageRelease)."""
    filled = {id(c.dst) for c in collect(body, BulkCopy)}
    return frozenset(filled - set(_writes_of(body)))


def _branch_bulk_only(s, root) -> frozenset:
    """Ids of the tiles only bulk copies write within the ``then`` branch of ``s`` (an ``if`` inside ``root``)
    whose every other write is in its ``else`` branch: a loop versioned on a launch-time test (bulk copies
    where it holds, per-thread copies otherwise, into the same tiles) meets at no barrier in its bulk branch."""
    filled = {id(c.dst) for c in collect(s.then, BulkCopy)}
    if not filled or s.orelse is None:
        return frozenset()
    everywhere, other = _writes_of(root), _writes_of(s.orelse)
    return frozenset(t for t in filled if everywhere.count(t) == other.count(t))


def _only_async_copies(s) -> bool:
    """``s`` writes memory only through asynchronous copies (and has at least one)."""
    leaves: list = []
    walk(s, lambda x: leaves.append(x) if not isinstance(x, (Seq, For, If, Bind)) else None)
    return bool(leaves) and all(isinstance(x, AsyncCopy) for x in leaves)


def _on_thread0(stmt):
    return If(compare("eq", ThreadIndex(), const(0)), stmt, span=stmt.span)


def _issuer_test(s) -> bool:
    """``if thread == c`` around statements a planner gave to thread ``c`` (tilecore.pipeline_issue_thread, D62): the
    bulk copies inside it stay on that thread, not wrapped again for thread 0."""
    c = s.cond
    return (isinstance(s, If) and s.orelse is None and isinstance(c, Cmp) and c.op == "eq"
            and isinstance(c.a, ThreadIndex) and isinstance(const_value(c.b), int))


def _thread0(stmt):
    return [_on_thread0(stmt), Barrier(span=stmt.span)]


class _Distributor:
    def __init__(self, nthreads: int, bulk_only=frozenset(), root=None):
        self.n = nthreads
        self.hoisted: list = []
        self.bulk_only = bulk_only
        self.root = root  # the launch's body (tiles bulk-only within one branch of an if: _branch_bulk_only)
        self.elected = False  # inside an `if thread == c` of a planner's (D62): elected statements as they are

    # -- block level ------------------------------------------------------------------------------
    def block(self, s) -> list:
        if s is None:
            return []
        if isinstance(s, Seq):
            out: list = []
            run: list = []
            for c in s.body + [None]:
                if _elected(c):
                    run.append(c)
                    continue
                if run:
                    out.append(seq(run) if self.elected else _on_thread0(seq(run)))
                    run = []
                out += self.block(c)
            return out
        if _elected(s):
            return [s if self.elected else _on_thread0(s)]
        if isinstance(s, Allocate):
            self.hoisted.append(Allocate(s.buffer, reuses=s.reuses, span=s.span))
            if s.init is None:
                return []
            idx = tuple(const(0) for _ in s.buffer.shape)
            return _thread0(Store(s.buffer, idx, s.init, span=s.span))
        if isinstance(s, For):
            if s.kind in _DISTRIBUTED:
                if _only_async_copies(s):
                    return [self.distribute(s)]
                return [self.distribute(s), Barrier(span=s.span)]
            pre: list = []
            start, extent = s.start, s.extent
            if _loads_memory(start) or _loads_memory(extent):
                vs, ve = Var(f"{s.var.name}_lo", start.dtype), Var(f"{s.var.name}_n", extent.dtype)
                pre = [Bind(vs, start, span=s.span), Bind(ve, extent, span=s.span), Barrier(span=s.span)]
                start, extent = vs, ve
            body = seq(self.block(s.body)) if s.body is not None else None
            return pre + [s.with_(start=start, extent=extent, body=body if body is not None else Seq([]))]
        if isinstance(s, If):
            pre = []
            cond = s.cond
            if _loads_memory(cond):
                c = Var("cond", "bool")
                pre = [Bind(c, cond, span=s.span), Barrier(span=s.span)]
                cond = c
            outer, elected = self.bulk_only, self.elected
            self.bulk_only = outer | (_branch_bulk_only(s, self.root) if self.root is not None else frozenset())
            self.elected = elected or _issuer_test(s)
            then = seq(self.block(s.then))
            self.bulk_only, self.elected = outer, elected
            orelse = seq(self.block(s.orelse)) if s.orelse is not None else None
            return pre + [s.with_(cond=cond, then=then if then is not None else Seq([]), orelse=orelse)]
        if isinstance(s, Bind):
            if _has_atomic(s.value):  # D69: once per block, as the CPU reference runs it: thread 0 updates and
                slot = Buffer(f"{s.var.name}_slot", (1,), s.var.dtype, "shared")  # shares the old value
                self.hoisted.append(Allocate(slot, span=s.span))
                return [*_thread0(Store(slot, (const(0),), s.value, span=s.span)),
                        Bind(s.var, BufferLoad(slot, (const(0),)), span=s.span), Barrier(span=s.span)]
            return [s, Barrier(span=s.span)] if _loads_memory(s.value) else [s]
        if isinstance(s, Assert):
            return [s, Barrier(span=s.span)]
        if isinstance(s, (Break, Continue, Barrier, GroupBarrier, AsyncCommit, AsyncWait, CopyBarrierWait, StageRelease)):
            return [s]
        if isinstance(s, BulkStoreWait):  # the thread that issued the stores waits; then no thread writes the tile
            return _thread0(s)  # before it has been read
        if isinstance(s, BulkFence):  # each thread its own writes, then the threads meet before the store is issued
            return [s, Barrier(span=s.span)]
        if isinstance(s, Specialized):  # the consumers share the work (and their own barriers); the producer's
            inner = _Distributor(s.consumers, self.bulk_only, self.root)  # one thread runs its program as it is
            inner.hoisted = self.hoisted
            consumer = rewrite(seq(inner.block(s.consumer)) or Seq([]), lambda x: Barrier(s.consumers, span=x.span)
                               if isinstance(x, Barrier) and not x.threads else None)
            return [s.with_(consumer=consumer)]
        if isinstance(s, Collective):
            return [Barrier(span=s.span), s.with_(threads=self.n), Barrier(span=s.span)]
        if isinstance(s, PerThread):
            reads, writes = _memory_use(s.body, self.bulk_only)
            if not reads:  # nothing another thread wrote: a matrix unit's gemm needs no meeting either
                s = rewrite(s, lambda x: x.with_(meet=False) if isinstance(x, MatrixSync) and x.phase == "begin"
                            else None)
            return ([Barrier(span=s.span)] if reads else []) + [s] + \
                ([Barrier(span=s.span)] if reads or writes else [])
        if isinstance(s, KernelLaunch):
            raise CompileError("T.Kernel inside T.Kernel is not supported", s.span)
        # Store, Atomic, Print and any other leaf with side effects: one thread does it
        return _thread0(s)

    # -- a nest of parallel loops -------------------------------------------------------------------
    def distribute(self, loop: For):
        loops, inner = loop_nest(loop, _DISTRIBUTED)

        def no_collective(x):
            if isinstance(x, Collective):
                raise CompileError(f"{x.name}: a block-wide operation cannot run inside a T.Parallel loop", x.span)

        walk(inner, no_collective)
        extents = [f.extent for f in loops]
        total = _prod(extents)
        idx = Var("idx")
        binds = []
        tot = const_value(total)
        n = self.n
        tid = ThreadIndex()
        it = Var("it")
        single = tot is not None and tot <= n
        for d, f in enumerate(loops):
            stride = _prod(extents[d + 1:])
            q = _coordinate(it, tid, n, tot, const_value(stride), const_value(f.extent), d == 0, single)
            if q is None:
                q = binary("div", idx, stride)
                if d > 0:
                    q = binary("sub", q, binary("mul", binary("div", q, f.extent), f.extent))
            binds.append(Bind(f.var, binary("add", f.start, q) if const_value(f.start) != 0 else q, span=f.span))
        body = seq(binds + [inner])
        if tot is not None and tot % n != 0 or tot is None:
            body = If(compare("lt", idx, total), body, span=loop.span)
        if single:
            return seq([Bind(idx, tid, span=loop.span), body])
        trips = binary("floordiv", binary("add", total, n - 1), n)
        step = seq([Bind(idx, binary("add", binary("mul", it, n), tid), span=loop.span), body])
        return For(it, as_expr(0), trips, "serial", step, span=loop.span)


def _drop_double_barriers(s):
    def fix(x):
        if isinstance(x, Seq):
            out: list = []
            for c in x.body:
                if isinstance(c, Barrier) and out and isinstance(out[-1], Barrier):
                    continue
                # a barrier right before a bulk fence: the barrier after the fence orders the same writes
                if isinstance(c, BulkFence) and out and isinstance(out[-1], Barrier):
                    out.pop()
                out.append(c)
            if len(out) != len(x.body):
                return Seq(out, span=x.span)
        return None

    return rewrite(s, fix)


def distribute_launch(launch: KernelLaunch) -> KernelLaunch:
    n = int(math.prod(int(const_value(t) if not isinstance(t, int) else t) for t in launch.threads) or 1)
    d = _Distributor(n, _bulk_only(launch.body), launch.body)
    body = d.block(launch.body)
    new = Seq(d.hoisted + body, span=launch.body.span)
    return launch.with_(body=_drop_double_barriers(new), attrs={**launch.attrs, "simt_threads": n})


@tile_pass("tilecore.simt_distribute")
def simt_distribute(func, ctx):
    """Map each block's program onto its threads (parallel loops distributed, barriers inserted)."""
    found = []

    def fix(s):
        if isinstance(s, KernelLaunch):
            new = distribute_launch(s)
            found.append(new.attrs["simt_threads"])
            return new
        return None

    body = rewrite(func.body, fix)
    return func.with_body(body, simt_threads=found[-1] if found else 0)


__all__ = ["simt_distribute", "distribute_launch"]

_ = (IntImm, Atomic, Print)  # statement kinds named in the docstring; they take the thread-0 path
