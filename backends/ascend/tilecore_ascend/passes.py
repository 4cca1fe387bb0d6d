"""The Ascend passes: on-chip memory planning and pipe synchronization.

``ascend.plan_onchip`` (slot ``memory``) places every on-chip tile of a kernel in UB, 32-byte aligned, in
allocation order, and refuses a kernel whose tiles exceed ``limit:max_ub_bytes`` at the user's line,
naming the largest buffers. (Tiles are placed in L1/L0 only by the cube lowering, which does not exist
yet: ``dtype:*:mma`` is false in the profiles.)

``ascend.insert_sync`` (slot ``before-codegen``) walks the lowered kernel in program order and gives every
statement its pipe: the AscendC leaves of :mod:`.ops` say theirs, every other statement (element loads
and stores, loop bounds, conditions) runs on the scalar pipe S. For each on-chip buffer it remembers the
pipes that last wrote and read it; a statement that reads after a write of another pipe (RAW), or
writes after another pipe's read or write (WAR, WAW), gets ``SetFlag<SRC_DST>`` + ``WaitFlag<SRC_DST>``
right before it, unless a sync of that pipe pair already lies between the two. Vector instructions that
depend on an earlier vector instruction get ``PipeBarrier<PIPE_V>``. Loops are walked with the state
merged from before the loop and after one iteration, so the next iteration's hazards are synchronized
too; a hazard only against the previous iteration (a DMA refilling a tile the vector unit or the cube
read: V->MTE2, MTE1->MTE2, M->MTE1) gets a loop-carried flag per buffer, set after the body statement
holding the last access and waited before the next iteration's first conflicting one, so the pipes
overlap (with ``ascend.double_buffer``, the DMA of tile k+1 runs during the compute of tile k).
Event IDs: every flag gets one from the pool of its ``HardEvent`` (``limit:event_ids_per_hard_event``,
8 on Atlas A2/A3), free again after its last wait; loop-carried flags hold theirs across the loop and
take at most all but one ID of an event (the rest are synced in place).
"""
from __future__ import annotations

from tilecore.errors import CompileError, UnsupportedFeatureError
from tilecore.ir import (Allocate, BufferLoad, For, If, KernelLaunch, Seq, Store, collect, const_value, simplify,
                         stmt_exprs, walk, walk_expr)
from tilecore.passes import tile_pass

from .ops import AscendOp, Sync

ONCHIP = ("shared", "fragment")


def onchip_allocations(body) -> list:
    """Every on-chip tile allocated in ``body`` (any depth), in program order, each once."""
    out, seen = [], set()
    for a in collect(body, Allocate):
        if a.buffer.scope in ONCHIP and id(a.buffer) not in seen:
            seen.add(id(a.buffer))
            out.append(a)
    return out


#: alignment of a tile's start in each scope (ub and l1 32 B, l0a/l0b one 512-byte fractal, l0c 64 B)
ALIGN = {"ub": 32, "l1": 32, "l0a": 512, "l0b": 512, "l0c": 64}
SCOPES = ("ub", "l1", "l0a", "l0b", "l0c")


def plan_scopes(body) -> dict:
    """``scope -> [(allocation, byte offset, bytes)]``: every on-chip tile in its scope (the cube lowering's
    L1/L0 tiles, UB for the rest), each aligned for its scope, in allocation order."""
    from .cube import placement

    where = placement(body)
    out = {s: [] for s in SCOPES}
    ends = {s: 0 for s in SCOPES}
    for a in onchip_allocations(body):
        scope = where.get(id(a.buffer), "ub")
        n = const_value(simplify(a.buffer.numel()))
        if n is None:
            raise UnsupportedFeatureError(f"on-chip tile {a.buffer.name} has a symbolic size; Ascend tiles are "
                                          "static", a.span, feature="limit:max_ub_bytes")
        size = max(int(n), 1) * a.buffer.dtype.bytes
        off = -(-ends[scope] // ALIGN[scope]) * ALIGN[scope]
        out[scope].append((a, off, size))
        ends[scope] = off + size
    return out


def plan_ub(body) -> list:
    return plan_scopes(body)["ub"]


@tile_pass("ascend.plan_onchip")
def plan_onchip(func, ctx):
    worst = 0
    for launch in collect(func.body, KernelLaunch):
        for scope, plan in plan_scopes(launch.body).items():
            lim = ctx.capabilities.limit(f"max_{scope}_bytes")
            total = max((off + size for _, off, size in plan), default=0)
            worst = max(worst, total) if scope == "ub" else worst
            if lim is not None and total > lim[0]:
                big = sorted(plan, key=lambda p: -p[2])[:4]
                parts = ", ".join(f"{a.buffer.name} {size} B (line {a.span.line if a.span else '?'})" for a, _, size in big)
                raise UnsupportedFeatureError(
                    f"kernel {func.name} needs {total} bytes of {scope.upper()} per block ({parts}); target "
                    f"{ctx.target} has {int(lim[0])} (limit max_{scope}_bytes). Use smaller tiles", launch.span,
                    feature=f"limit:max_{scope}_bytes", target=str(ctx.target))
    return func.with_body(func.body, ub_bytes=worst)


# -- sync insertion -----------------------------------------------------------------------------------

#: event IDs per HardEvent when the profile does not say (Atlas A2/A3: 0-7)
DEFAULT_EVENT_IDS = 8


class _State:
    def __init__(self):
        self.acc: dict = {}      # id(buffer) -> (writes {pipe: t}, reads {pipe: t})
        self.synced: dict = {}   # (src, dst) -> t of the last sync: accesses before it are ordered
        self.carried: dict = {}  # (src, dst, id(buffer)) -> t: src's accesses of that buffer before t are ordered
        self.now = 0
        self.pool = DEFAULT_EVENT_IDS  # event IDs per HardEvent
        self.chains: dict = {}   # (src, dst) -> loop-carried flags pending around the statement being walked

    def copy(self) -> "_State":
        s = _State()
        s.acc = {k: (dict(w), dict(r)) for k, (w, r) in self.acc.items()}
        s.synced, s.carried, s.now = dict(self.synced), dict(self.carried), self.now
        s.pool, s.chains = self.pool, dict(self.chains)
        return s

    def merge(self, other: "_State") -> "_State":
        """Either path may have run: every access of both, only the syncs both made."""
        s = self.copy()
        for k, (w, r) in other.acc.items():
            mw, mr = s.acc.setdefault(k, ({}, {}))
            for d, src in ((mw, w), (mr, r)):
                for p, t in src.items():
                    d[p] = max(d.get(p, -1), t)
        s.synced = {k: min(v, other.synced[k]) for k, v in self.synced.items() if k in other.synced}
        s.carried = {k: min(v, other.carried[k]) for k, v in self.carried.items() if k in other.carried}
        s.now = max(self.now, other.now)
        return s

    def ordered(self, src: str, dst: str, buf) -> int:
        """Accesses of ``buf`` by ``src`` before this time are ordered before ``dst``'s next instruction."""
        return max(self.synced.get((src, dst), -1), self.carried.get((src, dst, id(buf)), -1))


def _scalar_access(stmts) -> tuple:
    reads, writes = [], []

    def see(e):
        if isinstance(e, BufferLoad) and e.buffer.scope in ONCHIP:
            reads.append(e.buffer)

    def visit(s):
        if isinstance(s, Store) and s.buffer.scope in ONCHIP:
            writes.append(s.buffer)
        for e in stmt_exprs(s):
            walk_expr(e, see)

    for s in stmts:
        walk(s, visit)
    return reads, writes


def _expr_reads(exprs) -> list:
    out = []
    for e in exprs:
        walk_expr(e, lambda x: out.append(x.buffer) if isinstance(x, BufferLoad) and x.buffer.scope in ONCHIP else None)
    return out


def _accesses(body) -> list:
    """``(pipe, reads, writes)`` of every statement in ``body``, scalar code included."""
    out = []

    def visit(s):
        if isinstance(s, AscendOp):
            out.append(("S", _expr_reads(stmt_exprs(s)), []))
            out.append((s.pipe(), s.reads(), s.writes()))
        elif not isinstance(s, (Seq, For, If, KernelLaunch, Allocate)):
            out.append(("S", *_scalar_access([s])))
        elif isinstance(s, (For, If)):
            out.append(("S", _expr_reads(stmt_exprs(s)), []))

    walk(body, visit)
    return out


def _has_op(s) -> bool:
    return bool(collect(s, AscendOp))


def _hazards(st: _State, pipe: str, reads, writes):
    """``(src, buffer, t)``: each earlier access of another pipe (V after V too) that ``pipe`` reading
    ``reads`` and writing ``writes`` must be ordered after, ``t`` the newest such access's time."""
    for b in list(reads) + list(writes):
        w, _ = st.acc.get(id(b), ({}, {}))
        for p, t in w.items():
            if (p != pipe or pipe == "V") and t >= st.ordered(p, pipe, b):
                yield p, b, t
    for b in writes:
        _, r = st.acc.get(id(b), ({}, {}))
        for p, t in r.items():
            if p != pipe and t >= st.ordered(p, pipe, b):
                yield p, b, t


def _needs(st: _State, pipe: str, reads, writes) -> set:
    return {(p, pipe) for p, _, _ in _hazards(st, pipe, reads, writes)}


def _emit_syncs(st: _State, need, span) -> list:
    out = []
    for src, dst in sorted(need):
        if src == dst:
            out.append(Sync("barrier", src, dst, span=span))
        else:
            key = object()
            out += [Sync("set", src, dst, key=key, span=span), Sync("wait", src, dst, key=key, span=span)]
        st.synced[(src, dst)] = st.now
        st.now += 1
    return out


def _sync(st: _State, pipe: str, reads, writes, span) -> list:
    out = _emit_syncs(st, _needs(st, pipe, reads, writes), span)
    t = st.now
    st.now += 1
    for b in reads:
        st.acc.setdefault(id(b), ({}, {}))[1][pipe] = t
    for b in writes:  # earlier writers stay: a write may cover only part of the tile (a partial DMA)
        w, _ = st.acc.get(id(b), ({}, {}))
        st.acc[id(b)] = ({**w, pipe: t}, {})
    return out


def _flat(s) -> list:
    if isinstance(s, Seq):
        return [x for c in s.body for x in _flat(c)]
    return [s]


def _loop(s: For, st: _State) -> list:
    """A loop with AscendC instructions. Hazards against the code before it are synced once, before it.
    A hazard against the previous iteration only (a DMA refilling a tile a compute pipe read last time:
    V->MTE2, MTE1->MTE2, M->MTE1), between two pipes other than S, gets a loop-carried flag of its own,
    per buffer: ``SetFlag`` before the loop, ``WaitFlag`` before the body statement that needs it,
    ``SetFlag`` after the body statement holding the last access it waits for, ``WaitFlag`` after the loop.
    The producing pipe's later work is not waited for, so a double-buffered loop overlaps its pipes.
    Every other hazard gets its flag right before the statement."""
    out = _sync(st, "S", _expr_reads([s.start, s.extent]), [], s.span)  # the bounds are scalars
    need = set()
    for p, r, w in _accesses(s.body):
        need |= _needs(st, p, r, w)
    out += _emit_syncs(st, need, s.span)
    dry_start = st.now
    dry = st.copy()
    _walk([s.body], dry)  # one iteration: what the next one finds in the buffers
    cur = st.merge(dry)
    iter_start = cur.now
    stmts = _flat(s.body)
    last = {}  # (pipe, id(buffer)) -> index of the last top-level statement of the body that touches it
    for i, x in enumerate(stmts):
        for p, r, w in _accesses(x):
            for b in list(r) + list(w):
                last[(p, id(b))] = i
    chains, after, body = {}, {}, []
    for i, x in enumerate(stmts):
        for p, r, w in _accesses(x):
            if p == "S":
                continue
            newest = {}
            for src, b, t in _hazards(cur, p, r, w):
                k = (src, p, id(b))
                newest[k] = max(newest.get(k, -1), t)
            for (src, dst, bid), t in newest.items():
                k = (src, dst, bid)
                if src in ("S", dst) or k in chains or not dry_start <= t < iter_start:
                    continue  # same pipe, scalar unit, or a hazard inside this iteration: synced in place
                if cur.chains.get((src, dst), 0) >= cur.pool - 1:
                    continue  # keep one ID of the event for the flags synced in place: this one is too
                cur.chains[(src, dst)] = cur.chains.get((src, dst), 0) + 1
                key = object()
                chains[k] = key
                body.append(Sync("wait", src, dst, key=key, last=False, span=x.span))
                cur.carried[k] = iter_start
                after.setdefault(max(i, last[(src, bid)]), []).append(Sync("set", src, dst, key=key, span=x.span))
        body += _walk([x], cur)
        body += after.get(i, [])
    st.__dict__.update(cur.__dict__)
    for (src, dst, _) in chains:
        st.chains[(src, dst)] -= 1
    for k in chains:  # after the loop's last WaitFlag every access of the chain's buffer is ordered
        st.carried[k] = st.now
    st.now += 1
    pro = [Sync("set", src, dst, key=key, span=s.span) for (src, dst, _), key in chains.items()]
    epi = [Sync("wait", src, dst, key=key, span=s.span) for (src, dst, _), key in chains.items()]
    return out + pro + [s.with_(body=Seq(body))] + epi


def _walk(stmts, st: _State) -> list:
    out = []
    for s in stmts:
        if isinstance(s, Seq):
            out += _walk(s.body, st)
        elif isinstance(s, KernelLaunch):
            fresh = _State()
            fresh.pool = st.pool
            out.append(s.with_(body=Seq(_walk([s.body], fresh))))
        elif isinstance(s, AscendOp):
            scalars = _expr_reads(stmt_exprs(s))  # operands the scalar unit reads to issue it (GetValue)
            if scalars:
                out += _sync(st, "S", scalars, [], s.span)
            out += _sync(st, s.pipe(), s.reads(), s.writes(), s.span) + [s]
        elif isinstance(s, For) and _has_op(s.body):
            out += _loop(s, st)
        elif isinstance(s, If) and _has_op(s):
            out += _sync(st, "S", _expr_reads([s.cond]), [], s.span)
            a = st.copy()
            then = _walk([s.then], a)
            b = st.copy()
            orelse = _walk([s.orelse], b) if s.orelse is not None else None
            merged = a.merge(b)
            st.__dict__.update(merged.__dict__)
            out.append(s.with_(then=Seq(then), orelse=None if orelse is None else Seq(orelse)))
        elif isinstance(s, Allocate) and s.buffer.scope in ONCHIP:
            out.append(s)
        else:  # scalar code, a whole loop nest of it at once
            reads, writes = _scalar_access([s])
            out += _sync(st, "S", reads, writes, s.span) + [s]
    return out


def assign_event_ids(body, pool: int, target=None):
    """Give every flag an event ID of its ``HardEvent``: the lowest free one at its first ``SetFlag``,
    free again after its ``last`` ``WaitFlag``. Checks that each flag is set and waited equally often on
    every path (loop bodies and branches balanced on their own) and refuses a kernel that would need more
    than ``pool`` IDs of one event at once (``limit:event_ids_per_hard_event``)."""
    live: dict = {}    # (src, dst) -> {id: key}
    ids: dict = {}     # id(key) -> event id
    bal: dict = {}     # id(key) -> sets - waits in the current statement list

    def visit(s):
        if isinstance(s, Sync) and s.kind != "barrier":
            ev, k = (s.src, s.dst), id(s.key)
            if s.kind == "set" and k not in ids:
                taken = live.setdefault(ev, {})
                free = next((i for i in range(pool) if i not in taken), None)
                if free is None:
                    lines = sorted({x.span.line for x in taken.values() if getattr(x, "span", None)})
                    raise UnsupportedFeatureError(
                        f"the kernel needs more than {pool} event IDs of HardEvent::{s.src}_{s.dst} at once "
                        f"(flags pending from lines {lines}); the target has {pool} "
                        "(limit event_ids_per_hard_event). Use fewer buffers in one T.Pipelined loop",
                        s.span, feature="limit:event_ids_per_hard_event", target=target)
                taken[free] = s
                ids[k] = free
            if k not in ids:
                raise CompileError(f"tilecore-ascend bug: WaitFlag<{s.src}_{s.dst}> before its SetFlag", s.span)
            bal[k] = bal.get(k, 0) + (1 if s.kind == "set" else -1)
            if bal[k] not in (0, 1):
                raise CompileError(f"tilecore-ascend bug: HardEvent::{s.src}_{s.dst} set twice or waited unset", s.span)
            out = s.with_(event=ids[k])
            if s.kind == "wait" and s.last:
                live[ev].pop(ids[k], None)
            return out
        if isinstance(s, (For, If)):  # a body or branch leaves each of its flags as it found it
            before = dict(bal)
            new = s.with_(body=walk_list(s.body)) if isinstance(s, For) else \
                s.with_(then=walk_list(s.then), orelse=None if s.orelse is None else walk_list(s.orelse))
            for k, v in bal.items():
                if v != before.get(k, 0):
                    raise CompileError("tilecore-ascend bug: a flag set in a loop or branch is not waited in it", s.span)
            return new
        if isinstance(s, KernelLaunch):
            return s.with_(body=walk_list(s.body))
        if isinstance(s, Seq):
            return walk_list(s)
        return s

    def walk_list(s):
        if isinstance(s, Seq):
            return s.with_(body=[visit(x) for x in s.body])
        return visit(s)

    out = walk_list(body)
    open_ = [k for k, v in bal.items() if v]
    if open_:
        raise CompileError("tilecore-ascend bug: a SetFlag is never waited")
    return out


@tile_pass("ascend.insert_sync")
def insert_sync(func, ctx):
    lim = ctx.capabilities.limit("event_ids_per_hard_event")
    pool = int(lim[0]) if lim is not None else DEFAULT_EVENT_IDS
    st = _State()
    st.pool = pool
    body = assign_event_ids(Seq(_walk([func.body], st)), pool, str(ctx.target))
    return func.with_body(body)
