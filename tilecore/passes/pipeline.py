"""Software pipelining of ``T.Pipelined`` loops with asynchronous copies (targets with ``feature:async_copy``).

Two core passes, both no-ops on targets that do not declare ``feature:async_copy`` (their pipelined
loops stay serial: ``tilecore.serialize_pipelined``) and in checked mode:

``tilecore.stage_pipelined_copies`` (``tile-lowering``, after the backends' passes, before the tile ops
are lowered): in a ``T.Pipelined(n, num_stages=S)`` loop with ``S >= 2``, the copies that open the body
(``T.copy`` from a global tensor into a whole ``T.alloc_shared`` buffer of the same dtype) are the
pipeline's stages. They are lowered here by the core's generic copy (a nest of parallel loops over
``Store(shared, BufferLoad(global))``) whose outer loop is annotated ``pipeline_stage``, so the planner
finds them whatever the target's intrinsic table would have picked.

``tilecore.plan_pipelines`` (``pipelining``): for each such loop,

- checks what makes the transformation exact: every staged buffer is allocated at block level, used only
  inside the loop and filled whole by its copy at the top of each iteration (so nothing it holds lives
  from one iteration to the next); the rest of the body does not write the copies' sources and has no
  ``break`` / ``continue`` of the loop;
- plans the stages against the shared-memory limit (``limits.max_shared_bytes_per_block``), counting
  every block-level buffer as the generic path places them all on chip: the most stages ``<= S`` whose
  buffers fit; one stage means the loop stays serial, and the reason is recorded;
- gives each staged buffer a leading stage dimension (``A_s[ko % S, ...]`` everywhere in the loop);
- turns each copy nest into :class:`~tilecore.ir.AsyncCopy` statements: runs of 16, 8 or 4 bytes along
  the innermost loop where both addresses are provably aligned (row lengths and starts multiples of the
  run, by the prover's divisibility: :meth:`~tilecore.ir.bounds.Facts.divisor`, with the facts where the
  loop sits) and the in-bounds predicate is the same for the whole run, else one element per copy when an
  element is 4, 8 or 16 bytes, else the copy stays a synchronous store (still multi-buffered). Where a
  wider run needs only a dynamic row length ``n`` to be a multiple of it, the nest is versioned:
  ``if n % k == 0`` the wide copies, else the narrower ones (docs/decisions.md D20);
- schedules: a prologue issues stages ``0 .. S-2`` (each closed by an :class:`~tilecore.ir.AsyncCommit`,
  empty past the loop's end); iteration ``k`` waits until at most ``S-2`` groups are pending
  (:class:`~tilecore.ir.AsyncWait`: stage ``k`` has landed for this thread), a barrier (for every thread),
  issues stage ``k + S - 1`` into the buffer iteration ``k - 1`` read (the barrier also proves every
  thread is done with it) and commits, then computes on buffer ``k % S``.

Inside a persistent tile loop (``tilecore.persistent``, :mod:`tilecore.passes.persistent`) the loop is carried
across the tiles: the stage index and barrier parity come from a running count over the block's tiles, the
prologue runs once before the tile loop, and a stage ahead past a tile's end is the next tile's first stage,
addressed with that tile's block indices (docs/decisions.md D36).

Each planned loop adds a line to ``func.attrs["pipelines"]`` (``kernel.meta["attrs"]["pipelines"]``),
e.g. ``"loop ko: 3 stages, 2 tiles x 3 buffers, 24 KiB; A_s: async 16-byte copies, ..."``.
"""
from __future__ import annotations

from ..ir import (Allocate, AsyncCommit, AsyncCopy, AsyncWait, Atomic, Barrier, BinOp, Break, BufferLoad,
                  Buffer, BulkCopy, Call, Cast, Cmp, Collective, Continue, CopyBarrierArrive, CopyBarrierInit,
                  CopyBarrierWait, Expr, For, If, IntImm, KernelLaunch, Logic, MatrixOp, MatrixSync, Assert, Assume, Bind,
                  GroupBarrier, Specialized, StageRelease, Turn,
                  PerThread, Print, Region, ThreadIndex,
                  Select, Seq, Stmt, Store, TileOp, Var, as_expr, binary, compare, const_value, rewrite, seq, simplify,
                  logic_and, select, walk, walk_expr, collect)
from ..ir import ShuffleIndex, ShuffleXor  # map_expr rebuilds the shuffles of register exchanges
from ..ir.visit import stmt_exprs
from ..ir.bounds import Facts, thread_only
from ..ir.printer import expr_str
from . import overlap, tile_pass

FEATURE = "feature:async_copy"
WS_FEATURE = "feature:warp_specialization"
#: the hardware copies a whole tile (a box of a tensor) as one operation that completes on a transaction barrier
BULK_FEATURE = "feature:bulk_tensor_copy"
#: pass config: a loop whose copies lack only launch-time facts for bulk copies (a dynamic row length) is
#: versioned on them (default on; off keeps the per-thread copies alone)
VERSION_OPTION = "tilecore.bulk_copy_versioned"
#: pass config: where a carried persistent loop's stage ahead takes its tile's block indices from: "per_step" (the
#: tile of the running count, computed in every k step) or "per_tile" (the next tile's bound once per tile, each k
#: step selecting; D56); "auto" (the default, D58): "per_tile" where the block's register arrays take at most
#: PER_TILE_MAX_WORDS 4-byte words a thread, else "per_step"
NEXT_INDICES_OPTION = "tilecore.persistent_next_indices"
#: D58, measured twice each (H100 and H200): "per_tile" +2.7% to +8.8% with a 128x128 float accumulator over 256
#: threads (64 words a thread), 0.1% to 4.5% behind "per_step" in most rows at 128x256 (128 words)
PER_TILE_MAX_WORDS = 64


def next_indices(ctx, launch) -> str:
    """``tilecore.persistent_next_indices`` for this kernel: "per_step" or "per_tile" (D56, D58)."""
    v = ctx.option(NEXT_INDICES_OPTION, "auto")
    if v in ("per_step", "per_tile"):
        return v
    if v not in (None, "auto"):
        from ..errors import CompileError

        raise CompileError(f"pass config {NEXT_INDICES_OPTION}={v!r}: expected 'per_step', 'per_tile' or 'auto' (the "
                           f"default: per_tile where the block's register arrays take at most {PER_TILE_MAX_WORDS} "
                           "words a thread)")
    words = 0
    for a in collect(launch.body, Allocate):
        n = const_value(simplify(a.buffer.numel())) if a.buffer.scope == "register" else None
        if isinstance(n, int):
            words += (n * a.buffer.dtype.bytes + 3) // 4
    return "per_tile" if words <= PER_TILE_MAX_WORDS else "per_step"
#: elements a bulk copy's box may have along one dimension
MAX_BOX = 256
#: bytes one asynchronous copy may move, widest first
COPY_BYTES = (16, 8, 4)
STAGE = "pipeline_stage"
#: pass config: a loop whose gemm runs on past each iteration and whose count is not a constant gets no drain after
#: it (its last iteration waits for its own gemm); with one, a vendor assembler serialized the matrix unit where the prover removes
#: the `count > 0` test around it (a causal loop of `bx + 1` iterations; D55)
NO_DRAIN = "tilecore.pipeline_no_drain"
#: pass config: with bulk copies issued by one thread, the block barrier and the stage ahead's issue right after the
#: body's first gemm that waits for every earlier one, a group read only before that point a whole pipeline ahead
#: (FlashAttention's K 2 stages ahead with 2 buffers, V issued half an iteration earlier; D55)
EARLY_ISSUE = "tilecore.pipeline_early_issue"
#: D61: "auto" (the occupancy rule below) or True (a loop's later copies staged wherever they fit)
STAGE_LATE = "tilecore.pipeline_stage_late"
#: pass config: with warp specialization and two consumer groups (warpgroups), they take turns issuing their gemms,
#: so one group's run on the matrix unit while the other computes between them (FA3's ping-pong; D55)
PINGPONG = "tilecore.pingpong"
#: pass config: with bulk copies issued by one thread and the gemm's wait deferred, no block barrier in the loop: every
#: thread releases the stage the previous iteration's gemm read on that stage's own barrier, the issuing thread waits
#: for the release before refilling it (D62)
RELEASE_STAGES = "tilecore.pipeline_release_stages"
#: pass config: the thread that issues the steady loop's stage ahead where one thread issues the bulk copies and no
#: producer group does (default 0; D62: e.g. a lane of the last warp, off the first warpgroup's path)
ISSUE_THREAD = "tilecore.pipeline_issue_thread"
#: the annotation of a persistent tile loop (tilecore.passes.persistent)
PERSISTENT = "persistent_tiles"
#: pass config (D71): where a pipelined loop's later copies (FlashAttention's V) wait and, unstaged, where they are
#: issued, in loops of per-thread asynchronous copies whose matrix work completes within the iteration. False (the
#: default): D68's (staged: issued with the stage ahead, waited for where they stand; unstaged: issued and waited
#: for where they stand); True: staged, waited for with the leading copies at the top of the iteration (one wait,
#: one block barrier an iteration); unstaged (one buffer), issued at the top of the iteration right after the
#: barrier that frees the buffer, committed before the stage ahead, and waited for (it alone) where it stood;
#: "joint": as True, the unstaged copy's wait also waits for the stage ahead (one wait an iteration)
#: pass config (D81): True (the default): D74's loop of the masked iterations starts with the fact that its variable is
#: below the loop's end (:class:`Assume`, no code), so the prover folds the mask's tests it implies; False: D74's form
MASKED_LOOP_BOUND = "tilecore.pipeline_masked_loop_bound"
LATE_COPY = "tilecore.pipeline_late_copy"
LATE_COPY_VALUES = (False, True, "joint")
#: pass config (D80): False (the default) or 2: a warp-specialized loop carried across a persistent tile loop runs in
#: block groups of that many consecutive blocks (``KernelLaunch.attrs["block_group"]``) where their tiles, walked in
#: step, read the same box of a staged operand at every stage (the planner evaluates the walk): each block issues its
#: part of that box's panels into every block of the group (``BulkCopy.multicast``) and releases each stage in every
#: block (``StageRelease.group``); the operand's reads from global memory and L2 halve (the vendor library's form, D76)
GROUP_MULTICAST = "tilecore.group_multicast"
#: the capability a target declares for copies that land in every block of a group
MULTICAST_FEATURE = "execution.cluster.multicast_copy"
#: pass config (D79): where tilecore.pipeline_late_copy waits for a loop's staged later copies with the leading ones
#: at the top of the iteration (per-thread asynchronous copies), the stage ahead's copies of both are issued under one
#: test and committed as one group (False, the default: a group each, D71's)
JOIN_GROUPS = "tilecore.pipeline_join_groups"
#: pass config (D79): a copy into block memory before a pipelined loop of per-thread asynchronous copies (FlashAttention's
#: Q) issued as its own commit group without a wait of its own: the loop's first wait (the stages' groups committed
#: after it) and barrier land it. tilecore.group_async_copies takes the lone copy; the planner drops the group's wait
#: and barrier where nothing between them and the loop touches block memory and the loop runs at least once
LEAD_COPIES = "tilecore.pipeline_lead_copies"


def lead_copies(ctx):
    """tilecore.pipeline_lead_copies: False, True or "grouped" (the lone copy grouped by the core, its wait kept)."""
    v = ctx.option(LEAD_COPIES, False)
    if v in (None, False, "false", "False", "off"):
        return False
    if v in (True, "true", "True", "on"):
        return True
    if v == "grouped":
        return "grouped"
    from ..errors import CompileError

    raise CompileError(f"pass config {LEAD_COPIES}={v!r}: expected False (the default), True (the copy before the "
                       "pipelined loop landed by the loop's first wait, D79) or 'grouped' (issued by the core as its "
                       "own group, its wait and barrier kept)")


def enabled(ctx) -> bool:
    return ctx.capabilities.satisfies(FEATURE)[0] is True and not ctx.option("tilecore.checked", False)


def bulk_enabled(ctx) -> bool:
    """The target copies whole tiles (``feature:bulk_tensor_copy``) and ``tilecore.bulk_copy`` is not off."""
    return ctx.capabilities.satisfies(BULK_FEATURE)[0] is True and ctx.option("tilecore.bulk_copy", True) is not False


# -- tile-lowering: the copies that are stages ---------------------------------------------------------

def _whole(r) -> bool:
    shape = r.buffer.static_shape()
    return (shape is not None and all(const_value(simplify(x)) == 0 for x in r.starts)
            and tuple(const_value(simplify(x)) for x in r.extents) == tuple(shape))


def _stage_copy(s) -> bool:
    if not (isinstance(s, TileOp) and s.op == "copy" and len(s.args) == 2):
        return False
    src, dst = s.args
    return (isinstance(src, Region) and isinstance(dst, Region) and src.buffer.scope == "global"
            and dst.buffer.scope == "shared" and src.buffer.dtype == dst.buffer.dtype and _whole(dst))


@tile_pass("tilecore.stage_pipelined_copies")
def stage_pipelined_copies(func, ctx):
    """Lower the copies that open a ``T.Pipelined`` body generically, marked as pipeline stages."""
    if not enabled(ctx):
        return func
    from .lower_tile import lower_copy

    def fix(s):
        if not (isinstance(s, For) and s.kind == "pipelined" and int(s.annotations.get("num_stages", 0) or 0) >= 2):
            return None
        body = list(s.body.body) if isinstance(s.body, Seq) else [s.body]
        n = 0
        while n < len(body) and _stage_copy(body[n]):
            nest = lower_copy(body[n], ctx)
            if not isinstance(nest, For):
                break
            body[n] = nest.with_(annotations={**nest.annotations, STAGE: True})
            n += 1
        if n:  # copies further down whose source depends on the loop variable only (FlashAttention's V)
            bound = {id(x.var) for x in _all_stmts(s.body) if isinstance(x, For)}
            for i in range(n, len(body)):
                c = body[i]
                if not _stage_copy(c) or not _invariant(c.args[0].starts, bound) \
                        or any(_touches(b, c.args[1].buffer) for b in body[:i]):
                    continue
                nest = lower_copy(c, ctx)
                if isinstance(nest, For):
                    body[i] = nest.with_(annotations={**nest.annotations, STAGE: True})
        return s.with_(body=Seq(body, span=s.body.span)) if n else None

    return func.with_body(rewrite(func.body, fix))


def _invariant(exprs, bound) -> bool:
    """No expression of ``exprs`` loads memory or uses a variable the loop body binds (``bound``: ids)."""
    bad: list = []
    for e in exprs:
        walk_expr(e, lambda x: bad.append(1) if isinstance(x, BufferLoad) or isinstance(x, Var) and id(x) in bound
                  else None)
    return not bad


# -- expression and statement rewriting ----------------------------------------------------------------

def map_expr(e, fn):
    """``e`` rebuilt bottom-up, each sub-expression ``x`` replaced by ``fn(x)`` where that is not None."""
    if not isinstance(e, Expr):
        return e
    if isinstance(e, BinOp):
        new = binary(e.op, map_expr(e.a, fn), map_expr(e.b, fn))
    elif isinstance(e, Cmp):
        new = compare(e.op, map_expr(e.a, fn), map_expr(e.b, fn))
    elif isinstance(e, Logic):
        new = Logic(e.op, map_expr(e.a, fn), map_expr(e.b, fn) if e.b is not None else None)
    elif isinstance(e, Select):
        new = Select(map_expr(e.cond, fn), map_expr(e.t, fn), map_expr(e.f, fn))
    elif isinstance(e, Cast):
        new = Cast(e.dtype, map_expr(e.value, fn))
    elif isinstance(e, Call):
        new = Call(e.name, tuple(map_expr(a, fn) for a in e.args), e.dtype, e.attrs)
    elif isinstance(e, BufferLoad):
        new = BufferLoad(e.buffer, tuple(map_expr(i, fn) for i in e.indices))
    elif isinstance(e, ShuffleXor):
        new = ShuffleXor(map_expr(e.value, fn), e.mask, e.width)
    elif isinstance(e, ShuffleIndex):
        new = ShuffleIndex(map_expr(e.value, fn), map_expr(e.lane, fn), e.width)
    else:
        new = e
    out = fn(new)
    return new if out is None else out


def _map_item(v, fn, region_fn):
    if isinstance(v, Region):
        r = Region(v.buffer, tuple(map_expr(x, fn) for x in v.starts), tuple(map_expr(x, fn) for x in v.extents))
        return region_fn(r) if region_fn else r
    if isinstance(v, Expr):
        return map_expr(v, fn)
    if isinstance(v, tuple):
        return tuple(_map_item(x, fn, region_fn) for x in v)
    return v


def map_stmt(s, fn, region_fn=None, store_fn=None):
    """``s`` with ``fn`` applied to every expression of every statement (see :func:`map_expr`), ``region_fn``
    to every region, and ``store_fn(buffer, indices) -> (buffer, indices)`` to every stored location."""

    def one(x):
        if isinstance(x, (Seq, KernelLaunch)):
            return None
        changes = {}
        for f in x.__dataclass_fields__:
            if f in ("span", "body", "then", "orelse"):
                continue
            v = getattr(x, f)
            new = _map_item(v, fn, region_fn)
            if new is not v:
                changes[f] = new
        if store_fn is not None and isinstance(x, (Store, Atomic)):
            b, idx = store_fn(x.buffer, changes.get("indices", x.indices))
            changes["buffer"], changes["indices"] = b, idx
        return x.with_(**changes) if changes else None

    return rewrite(s, one)


def substitute(s, table: dict):
    """``s`` (a statement or expression) with the variables in ``table`` (``id(var) -> expr``) replaced."""
    fn = lambda x: table.get(id(x)) if isinstance(x, Var) else None  # noqa: E731
    return map_expr(s, fn) if isinstance(s, Expr) else map_stmt(s, fn)


def _fresh_loops(s):
    """``s`` with every loop variable it declares replaced by a new one (a nest emitted twice)."""
    table: dict = {}
    walk(s, lambda x: table.setdefault(id(x.var), Var(x.var.name, x.var.dtype)) if isinstance(x, For) else None)

    def rename(x):
        return x.with_(var=table[id(x.var)]) if isinstance(x, For) and id(x.var) in table else None

    return rewrite(substitute(s, table), rename)


def _multi_buffer(s, table: dict, stage):
    """``s`` with each buffer ``b`` in ``table`` (``id(b) -> staged b``) indexed as ``staged[stage, ...]``."""

    def load(x):
        if isinstance(x, BufferLoad) and id(x.buffer) in table:
            return BufferLoad(table[id(x.buffer)], (stage,) + x.indices)
        return None

    def region(r):
        if id(r.buffer) in table:
            return Region(table[id(r.buffer)], (stage,) + r.starts, (as_expr(1),) + r.extents)
        return r

    def store(b, idx):
        return (table[id(b)], (stage,) + tuple(idx)) if id(b) in table else (b, idx)

    def copies(x):
        if isinstance(x, AsyncCopy) and id(x.dst) in table:
            return x.with_(dst=table[id(x.dst)], dst_indices=(stage,) + x.dst_indices)
        return None

    return rewrite(map_stmt(s, load, region, store), copies)


# -- asynchronous copies ---------------------------------------------------------------------------------

def _flat(buf: Buffer, idx):
    """The row-major element offset of ``idx`` in ``buf`` (symbolic dimensions give symbolic strides)."""
    flat, stride = as_expr(0), as_expr(1)
    for i, d in reversed(list(zip(idx, buf.shape))):
        flat = binary("add", flat, binary("mul", i, stride))
        stride = binary("mul", stride, d)
    return flat


def _uses(e, var) -> bool:
    found: list = []
    walk_expr(e, lambda x: found.append(1) if x is var else None)
    return bool(found)


def _offset_by(e, var):
    """``base`` when ``e`` is ``base + var`` (or ``var``) with ``base`` free of ``var``, else None."""
    if e is var:
        return as_expr(0)
    if isinstance(e, BinOp) and e.op == "add":
        if e.b is var and not _uses(e.a, var):
            return e.a
        if e.a is var and not _uses(e.b, var):
            return e.b
    return None


def _copy_parts(nest):
    """(loops, Store, global load, predicate or None) of a lowered copy nest, or None."""
    loops, s = [], nest
    while isinstance(s, For) and s.kind in ("parallel", "vectorized"):
        loops.append(s)
        s = s.body
        while isinstance(s, Seq) and len(s.body) == 1:
            s = s.body[0]
    if not isinstance(s, Store):
        return None
    v, pred = s.value, None
    if isinstance(v, Select) and const_value(v.f) == 0:
        pred, v = v.cond, v.t
    if not (isinstance(v, BufferLoad) and v.buffer.scope == "global" and v.buffer.dtype == s.buffer.dtype):
        return None
    return loops, s, v, pred


def _run_fits(loops, store, load, elems: int, facts: Facts) -> bool:
    """The innermost loop can move ``elems`` consecutive elements per copy, both addresses aligned to it, as
    far as ``facts`` show (divisibility of offsets and row lengths: :meth:`~tilecore.ir.bounds.Facts.divisor`)."""
    if elems == 1:
        return True
    if not loops:
        return False
    j = loops[-1]
    ext = const_value(simplify(j.extent))
    if const_value(j.start) != 0 or not isinstance(ext, int) or ext % elems:
        return False
    for buf, idx in ((store.buffer, store.indices), (load.buffer, load.indices)):
        if not facts.proves_multiple(buf.shape[-1], elems):
            return False  # (a whole row is whole runs, so the in-bounds predicate is one for a run)
        if _offset_by(idx[-1], j.var) is None or any(_uses(i, j.var) for i in idx[:-1]):
            return False
        if not facts.proves_multiple(_flat(buf, tuple(idx[:-1]) + (_offset_by(idx[-1], j.var),)), elems):
            return False
    return True


def _row_lengths(store, load) -> list:
    """The symbolic dimensions (each a shape variable) that fix the two buffers' strides and row lengths."""
    out: list = []
    for buf in (store.buffer, load.buffer):
        for d in (buf.shape[1:] if len(buf.shape) > 1 else buf.shape):
            d = simplify(as_expr(d))
            if isinstance(d, Var) and all(d is not x for x in out):
                out.append(d)
    return out


def copy_bytes(ctx) -> tuple:
    """The widths one asynchronous copy may have on this target: :data:`COPY_BYTES` up to the profile's
    ``limits.max_async_copy_bytes`` (kind ``max``) where it declares one (hardware whose copies are
    narrower than 16 bytes)."""
    lim = ctx.capabilities.limit("max_async_copy_bytes") if ctx is not None else None
    if lim is None or lim[1] != "max":
        return COPY_BYTES
    return tuple(n for n in COPY_BYTES if n <= int(lim[0]))


def _as_runs(loops, store, load, pred, elems: int):
    """The copy nest rewritten as :class:`~tilecore.ir.AsyncCopy` statements of ``elems`` elements each."""
    dst_idx, src_idx = store.indices, load.indices
    pred = pred if pred is not None else IntImm(1, "bool")
    inner = None
    if elems > 1:
        j = loops[-1]
        jv = Var(j.var.name, j.var.dtype)
        table = {id(j.var): binary("mul", jv, elems)}
        dst_idx, src_idx = (tuple(substitute(i, table) for i in dst_idx),
                            tuple(substitute(i, table) for i in src_idx))
        pred = substitute(pred, table)
        inner = j.with_(var=jv, extent=as_expr(const_value(simplify(j.extent)) // elems))
    body = AsyncCopy(store.buffer, tuple(dst_idx), load.buffer, tuple(src_idx), elems, pred, span=store.span)
    outer = loops[:-1] if inner is not None else loops
    if inner is not None:
        body = inner.with_(body=body)
    for f in reversed(outer):
        body = f.with_(body=body)
    return body


def async_copy_nest(nest, widths: tuple = COPY_BYTES, facts: Facts | None = None):
    """The copy nest as asynchronous copies of one of ``widths`` bytes (widest first): ``(new nest, bytes
    per copy)``, or ``(nest, reason)``. ``facts``: what holds where the nest runs (enclosing conditions,
    ``T.assume``).

    Where a wider run is proven only once a dynamic row length ``n`` is known to be a multiple of the run
    (``n % k == 0``), the nest is versioned: ``if n % k == 0`` (block-uniform: ``n`` is a shape) the wide
    copies, else the copies proven without it. Both branches are exact; the test costs one integer
    operation per issued stage."""
    facts = facts or Facts()
    parts = _copy_parts(nest)
    if parts is None:
        return nest, "not a plain element copy"
    loops, store, load, pred = parts
    es = store.buffer.dtype.bytes
    fitting = [n for n in widths if n % es == 0]
    plain = next((n for n in fitting if _run_fits(loops, store, load, n // es, facts)), None)
    if plain is not None:
        base, how = _as_runs(loops, store, load, pred, plain // es), plain
    else:
        base, how = nest, f"synchronous ({es}-byte elements, no aligned run of {'/'.join(map(str, widths))} bytes)"
    for nbytes in fitting:
        if plain is not None and nbytes <= plain:
            break
        elems = nbytes // es
        need = [d for d in _row_lengths(store, load) if not facts.proves_multiple(d, elems)]
        if not need:
            continue
        cond = None
        for d in need:
            c = compare("eq", binary("floormod", d, elems), 0)
            cond = c if cond is None else logic_and(cond, c)
        if _run_fits(loops, store, load, elems, facts.with_cond(cond)):
            return If(cond, _as_runs(loops, store, load, pred, elems), base, span=store.span), nbytes
    return base, how


def copy_and_wait(nest, widths: tuple = COPY_BYTES):
    """A copy nest as asynchronous copies of aligned runs (:func:`async_copy_nest`), committed and waited for
    where it stands; the nest itself where no run is proven aligned."""
    runs, _how = async_copy_nest(nest, widths)
    if not collect(runs, AsyncCopy):
        return nest
    return seq([runs, AsyncCommit(span=nest.span), AsyncWait(0, span=nest.span)])


def bulk_copy_and_wait(nest, layout, ctx):
    """A lowered copy nest into a paneled tile as one bulk tile copy (per panel) on a transaction barrier of its
    own, waited for where it stands; None where the target has no bulk copies (``tilecore.bulk_copy`` off
    included) or the copy has no bulk form (:func:`_bulk_form`). A barrier comes first (no thread still reads
    the tile or waits on the barrier: the statement may run again in a loop), then one thread initialises the
    barrier, a barrier, and that thread announces and issues the copy, which every thread waits for."""
    if not bulk_enabled(ctx):
        return None
    form = _bulk_form(nest, layout, Facts())
    if isinstance(form, str):
        return None
    src, starts, box, lay = form
    dst = _copy_parts(nest)[1].buffer
    bar = Buffer(f"{dst.name}_full", (1,), "uint64", "shared")
    zero, span = as_expr(0), nest.span
    nbytes = _round16(max(const_value(simplify(dst.numel())), 1) * dst.dtype.bytes)
    return seq([Allocate(bar, span=span), Barrier(span=span), CopyBarrierInit(bar, 1, span=span), Barrier(span=span),
                CopyBarrierArrive(bar, zero, nbytes, span=span),
                BulkCopy(dst, (), src, starts, box, lay, bar, zero, span=span),
                CopyBarrierWait(bar, zero, zero, span=span)])


def describe_copy(new, how) -> str:
    """How :func:`async_copy_nest` copies, for the planner's note."""
    if isinstance(new, If):
        tests = " and ".join(f"{c.a.a.name} % {const_value(c.a.b)} == 0" for c in _conjuncts(new.cond))
        return f"async {how}-byte copies where {tests}, else {_copy_kind(new.orelse)}"
    return f"async {how}-byte copies" if isinstance(how, int) else how


def _copy_kind(s) -> str:
    """How a (lowered) copy nest copies: the width of its AsyncCopy statements, or synchronously."""
    found: list = []
    walk(s, lambda x: found.append(x.elements * x.dst.dtype.bytes) if isinstance(x, AsyncCopy) else None)
    return f"async {found[0]}-byte copies" if found else "synchronous copies"


def _conjuncts(c) -> list:
    if isinstance(c, Logic) and c.op == "and":
        return _conjuncts(c.a) + _conjuncts(c.b)
    return [c]


# -- bulk tile copies ------------------------------------------------------------------------------------

def _bulk_form(nest, layout, facts: Facts):
    """``(src, starts, box, layout)`` when the lowered copy nest (``stage_pipelined_copies``: ``dst[i, j] =
    src[.., s0 + i, .., s1 + j]``, 0 outside ``src``) can be one bulk copy per panel of the paneled
    ``layout``, else a string saying why not. A bulk copy writes a box of the tensor in the layout's panels
    and reads 0 outside the tensor, as the nest does; its tensor's rows must be whole 16-byte units (the
    facts prove the row length a multiple of them) and a box has at most :data:`MAX_BOX` rows."""
    if layout is None or not layout.panels:
        return "its tile is not stored in panels"
    parts = _copy_parts(nest)
    if parts is None:
        return "not a plain element copy"
    loops, store, load, _pred = parts
    src, es = load.buffer, load.buffer.dtype.bytes
    if len(loops) != 2 or len(store.indices) != 2 or any(store.indices[d] is not loops[d].var for d in (0, 1)) \
            or any(const_value(f.start) != 0 for f in loops) \
            or tuple(const_value(simplify(f.extent)) for f in loops) != (layout.rows, layout.cols):
        return "the copy is not a whole two-dimensional tile"
    if src.base is not None:
        return f"{src.name} is a view of another tensor"
    starts, box, used = [], [], []
    for e in load.indices:
        hit = [(d, _offset_by(e, f.var)) for d, f in enumerate(loops) if _uses(e, f.var)]
        if not hit:
            starts.append(e)
            box.append(1)
        elif len(hit) == 1 and hit[0][1] is not None:
            starts.append(hit[0][1])
            box.append((layout.rows, layout.cols)[hit[0][0]])
            used.append(hit[0][0])
        else:
            return f"an index of {src.name} is not its start plus one tile coordinate"
    if used != [0, 1] or box[-1] != layout.cols:
        return f"the tile's columns are not {src.name}'s contiguous dimension"
    if layout.rows > MAX_BOX:
        return f"{layout.rows} rows (a box has at most {MAX_BOX})"
    if len(src.shape) > 5:
        return f"{src.name} has more than 5 dimensions"
    unit = 16 // es if es < 16 else 1
    if len(src.shape) > 1 and not facts.proves_multiple(src.shape[-1], unit):
        # what a launch-time test would need: the row length a multiple of the unit and every size positive
        # (a tensor the hardware is told about has no empty dimension); the planner may version on it
        why = f"{src.name}'s rows are not proven whole 16-byte units"
        row = simplify(compare("eq", binary("floormod", src.shape[-1], unit), 0))
        if const_value(row) is not None:  # a static row length that is not: no launch can change that
            return why
        tests = [row] + [compare("gt", d, 0) for d in src.shape
                         if const_value(d) is None and not facts.proves(compare("gt", d, 0))]
        return _Unproven(why, tests)
    return src, tuple(starts), tuple(box), layout


class _Unproven(str):
    """Why a copy has no bulk form where the only thing missing is a fact a launch-time test can check:
    ``tests``, conditions over the kernel's integer arguments (its tensor's row length a multiple of 16 bytes,
    its sizes positive) under which it has one."""

    def __new__(cls, why: str, tests: list):
        obj = super().__new__(cls, why)
        obj.tests = tests
        return obj


# -- the planner -----------------------------------------------------------------------------------------

def _round16(n: int) -> int:
    return (n + 15) // 16 * 16


def _block_bytes(launch) -> int:
    """Bytes of the block-level (not per-iteration) buffers of a launch with a static size."""
    total = 0

    def visit(s, private):
        nonlocal total
        if isinstance(s, Allocate) and not private and not s.reuses:  # one over dead buffers takes none (D75)
            n = const_value(simplify(s.buffer.numel()))
            if isinstance(n, int):
                total += _round16(max(n, 1) * s.buffer.dtype.bytes)
        inner = private or (isinstance(s, For) and s.kind in ("parallel", "vectorized"))
        for c in (s.body if isinstance(s, Seq) else [getattr(s, f) for f in ("body", "then", "orelse")
                                                       if getattr(s, f, None) is not None]):
            visit(c, inner)

    visit(launch.body, False)
    return total


def _touches(s, buf) -> bool:
    """``s`` reads or writes ``buf`` (loads, stores, regions, async copies)."""
    found: list = []

    def expr(e):
        if isinstance(e, BinOp) and thread_only(e):  # no load in it (known by identity: D65)
            return
        walk_expr(e, lambda x: found.append(1) if isinstance(x, BufferLoad) and x.buffer is buf else None)

    def stmt(x):
        if isinstance(x, (Store, Atomic)) and x.buffer is buf or isinstance(x, AsyncCopy) and buf in (x.dst, x.src):
            found.append(1)
        for f in getattr(x, "__dataclass_fields__", {}):
            v = getattr(x, f)
            for item in (v if isinstance(v, tuple) else (v,)):
                if isinstance(item, Region):
                    found.append(1) if item.buffer is buf else [expr(e) for e in item.starts + item.extents]
                elif isinstance(item, Expr):
                    expr(item)

    walk(s, stmt)
    return bool(found)


def _touched(s) -> set:
    """The ids of the buffers ``s`` reads or writes: ``id(buf) in _touched(s)`` is ``_touches(s, buf)`` for every
    buffer at once."""
    ids: set = set()

    def expr(e):
        if isinstance(e, BinOp) and thread_only(e):  # no load in it
            return
        walk_expr(e, lambda x: ids.add(id(x.buffer)) if isinstance(x, BufferLoad) else None)

    def stmt(x):
        if isinstance(x, (Store, Atomic)):
            ids.add(id(x.buffer))
        if isinstance(x, AsyncCopy):
            ids.update((id(x.dst), id(x.src)))
        for f in getattr(x, "__dataclass_fields__", {}):
            v = getattr(x, f)
            for item in (v if isinstance(v, tuple) else (v,)):
                if isinstance(item, Region):
                    ids.add(id(item.buffer))
                    for e in item.starts + item.extents:
                        expr(e)
                elif isinstance(item, Expr):
                    expr(item)

    walk(s, stmt)
    return ids


def schedule(stmts) -> str:
    """A loop body's copy schedule in one line (D71, the planner's note with tilecore.pipeline_late_copy): its
    top-level statements in order as ``wait(n)`` (an AsyncWait), ``barrier``, ``copy X`` (asynchronous copies into
    X), ``commit``, ``gemm`` (matrix work), ``...`` (anything else); consecutive ``gemm`` / ``...`` once."""
    out: list = []

    def visit(x):
        if isinstance(x, Seq):
            for c in x.body:
                visit(c)
        elif isinstance(x, AsyncWait):
            out.append(f"wait({x.pending})")
        elif isinstance(x, Barrier):
            out.append("barrier")
        elif isinstance(x, AsyncCommit):
            out.append("commit")
        elif collect(x, AsyncCopy):
            out.append("copy " + ", ".join(dict.fromkeys(c.dst.name for c in collect(x, AsyncCopy))))
        elif collect(x, MatrixOp):
            if not out or out[-1] != "gemm":
                out.append("gemm")
        elif not out or out[-1] != "...":
            out.append("...")

    for x in stmts:
        visit(x)
    return " ; ".join(out)


def _why_not_hoisted(body: list, i: int, waited) -> str | None:
    """Why the unstaged later copy ``body[i]`` (``waited``: :func:`copy_and_wait`'s form of it) cannot be issued at
    the top of the iteration (tilecore.pipeline_late_copy, D71); None: it can. Its runs must be asynchronous, and
    nothing before it in the body may bind a name its addresses or predicates use, write a buffer it reads or touch
    the buffer it fills."""
    items = waited.body if isinstance(waited, Seq) else []
    if len(items) != 3 or not isinstance(items[1], AsyncCommit) or not isinstance(items[2], AsyncWait) \
            or not collect(items[0], AsyncCopy):
        return "a synchronous copy (no aligned run)"
    before = seq(body[:i]) if i else Seq([])
    bound = {id(b.var) for b in collect(before, Bind)} | {id(f.var) for f in collect(before, For)}
    used: list = []
    loaded: list = []
    for x in _all_stmts(items[0]):
        for e in stmt_exprs(x):
            walk_expr(e, lambda v: used.append(v) if isinstance(v, Var) and id(v) in bound else
                      loaded.append(v.buffer) if isinstance(v, BufferLoad) else None)
    if used:
        return f"its addresses use {used[0].name}, which the body computes before it"
    copies = collect(items[0], AsyncCopy)
    for b in loaded + [c.src for c in copies]:
        if _writes(before, b):
            return f"the body writes {b.name} before it"
    if any(_touches(before, c.dst) for c in copies):
        return f"the body touches {copies[0].dst.name} before it"
    return None


def _writes(s, buf) -> bool:
    found: list = []
    walk(s, lambda x: found.append(1) if isinstance(x, (Store, Atomic)) and x.buffer is buf
         or isinstance(x, Collective) and any(isinstance(a, Region) and a.buffer is buf for a in x.args) else None)
    return bool(found)


def _exits(s) -> bool:
    """``s`` has a break / continue of the enclosing loop (not of a loop inside ``s``)."""
    if isinstance(s, (Break, Continue)):
        return True
    if isinstance(s, For):
        return False
    if isinstance(s, Seq):
        return any(_exits(c) for c in s.body)
    if isinstance(s, If):
        return _exits(s.then) or (s.orelse is not None and _exits(s.orelse))
    return False


def _all_stmts(s) -> list:
    out: list = []
    walk(s, out.append)
    return out


def _loads_memory(e) -> bool:
    found: list = []
    walk_expr(e, lambda x: found.append(1) if isinstance(x, BufferLoad) else None)
    return bool(found)


class _Launch:
    def __init__(self, launch, ctx):
        self.launch = launch
        self.ctx = ctx
        self.used = _block_bytes(launch)
        lim = ctx.capabilities.limit("max_shared_bytes_per_block")
        self.limit = int(lim[0]) if lim is not None and lim[1] == "max" else None
        lim = ctx.capabilities.limit("max_shared_bytes_per_sm")
        self.per_sm = int(lim[0]) if lim is not None and lim[1] == "max" else None
        # blocks per SM that the threads allow (shared memory only decides below that)
        lim = ctx.capabilities.limit("max_threads_per_sm")
        threads = const_value(simplify(launch.threads[0])) if getattr(launch, "threads", None) else None
        self.thread_blocks = int(lim[0]) // int(threads) if lim is not None and lim[1] == "max" and threads else None
        self.widths = copy_bytes(ctx)
        # bulk tile copies: where the hardware has them, into tiles a matrix instruction reads in panels (the
        # layout a bulk copy writes); tilecore.bulk_copy=False keeps the per-thread copies
        self.bulk = bulk_enabled(ctx)
        self.paneled = {id(o.buffer): m.attrs[f"{x}_layout"] for m in collect(launch.body, MatrixOp)
                        for x in ("a", "b") if (o := getattr(m, f"{x}_origin")) is not None}
        # warp specialization (tilecore.warp_specialize=True): one more group of threads (the profile's
        # producer_group_threads) issues the bulk copies of the launch's pipelined loop. Off by default: on an
        # H200 it lost to thread 0 issuing them (4096^3 fp16 128x256x64: 0.248 vs 0.233 ms; 128x128x32: 0.794 vs
        # 0.330, the producer's registers halve the resident blocks), docs/decisions.md D29
        lim = ctx.capabilities.limit("producer_group_threads")
        self.group = int(lim[0]) if lim is not None else None
        can_specialize = self.bulk and ctx.capabilities.satisfies(WS_FEATURE)[0] is True and self.group is not None
        self.specialize = can_specialize and ctx.option("tilecore.warp_specialize", False) is True
        # D80: "carried": only a loop carried across a persistent tile loop (the measured GEMM form: D76, D80)
        self.specialize_carried = can_specialize and ctx.option("tilecore.warp_specialize", False) == "carried"
        # D59: "auto" (the default): a loop the overlap rotates (FlashAttention: two gemms, the last reading
        # registers the threads write) is specialized, with ping-pong, where its consumers are two groups of the
        # producer group's size (H100/H200: 464.5 -> 597.4 TFLOP/s at 128x128 exact); other loops as False
        self.specialize_auto = can_specialize and ctx.option("tilecore.warp_specialize", "auto") == "auto"
        self.consumers = int(threads) if threads and len(launch.threads) == 1 else None
        # D55: with warp specialization, the two consumer groups take turns issuing their gemms (tilecore.pingpong;
        # off by default, as warp specialization is: H100, FlashAttention 128x128 401 -> 435 TFLOP/s with it, the
        # thread-0 issue with the early issue 460)
        self.pingpong = ctx.option(PINGPONG, False) is True
        self.pingpong_auto = ctx.option(PINGPONG, "auto") == "auto"  # D59: with an automatic specialization
        # D55: a bulk-copied loop's block barrier and stage issue right after the body's first complete gemm
        # (tilecore.pipeline_early_issue; on by default: H100, FlashAttention on the general path 405 -> 460 TFLOP/s;
        # with warp specialization: each copy group's own release there)
        self.early = ctx.option(EARLY_ISSUE, True) is not False
        # a loop whose count is not a constant gets no drain after it (tilecore.pipeline_no_drain, D55): by default
        # where the prover shows the count positive (its `count > 0` test is proven away: the causal loop, whose
        # wgmma ptxas serialized: H100 297 -> 339 TFLOP/s); True: wherever the count is not a constant; False: never
        self.no_drain = ctx.option(NO_DRAIN, None)  # None: where the prover shows the count positive
        # D59: the last gemm one iteration late, beside the next first gemm (tilecore.pipeline_overlap; off)
        self.overlap = ctx.option(overlap.OPTION, True) is not False
        # D62: in the thread-0 form of a loop whose gemm's wait is deferred, per-stage release barriers instead of
        # the block barrier before the stage ahead's issue (tilecore.pipeline_release_stages; off)
        self.release_stages = ctx.option(RELEASE_STAGES, False) is True and self.consumers is not None
        # D62: the thread that issues the steady loop's stage ahead in the thread-0 forms (tilecore.pipeline_issue_thread)
        self.issue_thread = ctx.option(ISSUE_THREAD, 0) or 0
        if not isinstance(self.issue_thread, int) or isinstance(self.issue_thread, bool) or self.issue_thread < 0 \
                or (self.consumers is not None and self.issue_thread >= self.consumers):
            from ..errors import CompileError

            raise CompileError(f"pass config {ISSUE_THREAD}={self.issue_thread!r}: expected a thread of the block, "
                               f"0 to {(self.consumers or 1) - 1}")
        # D59: in a rotated loop the split mask after the first gemm (on by default: H200, causal +4.3%)
        self.mask_after = ctx.option(overlap.MASK_AFTER, True) is not False
        # D87: O's rescale in the next iteration's turn, right before the rotated gemm that adds to O (off)
        self.scale_in_turn = ctx.switch(overlap.SCALE_IN_TURN, overlap.SCALE_IN_TURN_DEFAULT, auto=True,
                                        expected="True, False or \"auto\" (the default: the exact build where the "
                                                 "first gemm's accumulator holds 88 elements a thread or more)")
        # D70: that mask's branch around the whole iteration (after the stage waits), not around the mask alone
        unswitch = ctx.option(overlap.MASK_UNSWITCH, overlap.MASK_UNSWITCH_DEFAULT)
        if not (unswitch is True or unswitch is False or unswitch in ("auto", "loops")):
            from ..errors import CompileError

            raise CompileError(f"pass config {overlap.MASK_UNSWITCH}={unswitch!r}: expected True, False, \"auto\" or "
                               "\"loops\"")
        # D81: the masked loop's body (D74's second loop) starts with the fact that its variable is below the loop's end
        # (an Assume: no code), so the guard's prover folds the mask's edge tests it implies (`k * bn + j < seq` at
        # causal d64 128x128: 128 comparisons a masked iteration; its loop 986 -> 752 instructions)
        self.masked_loop_bound = ctx.switch(MASKED_LOOP_BOUND, True, expected="True (the default) or False")
        # "auto": wherever it applies (a warp-specialized rotated loop with the split mask after its first gemm:
        # FlashAttention's two-consumer form, causal or ragged)
        self.mask_unswitch = unswitch is True or unswitch in ("auto", "loops")
        # D74: "loops": the two forms of the iteration as two loops, the unmasked iterations (k < E) then the masked
        # ones, where the mask's condition is `k < E` with E free of k (else as True). "auto" (the default): two
        # loops under fast math or where the last gemm's accumulator holds 128 elements a thread or more
        # (FlashAttention's O at d256), D70's one loop otherwise (measured, H200, two runs: fast math's causal rows +1.5 to +3%, d256's exact
        # causal +3 to +4%; d128's exact causal -1.4 to -2.7%, ncu at locked clocks -4.6% with descriptor offsets)
        self.mask_loops = unswitch
        self.fast_math = bool(ctx.option("tilecore.fast_math", False))
        self.max_threads = ctx.capabilities.limit("max_threads_per_block")
        # D71: the later copies' issue and wait (tilecore.pipeline_late_copy; False: D68's)
        self.late_copy = ctx.option(LATE_COPY, False)
        if self.late_copy is None:
            self.late_copy = False
        if self.late_copy not in LATE_COPY_VALUES or (self.late_copy == 1 and self.late_copy is not True) \
                or (self.late_copy == 0 and self.late_copy is not False):
            from ..errors import CompileError

            raise CompileError(f"pass config {LATE_COPY}={self.late_copy!r}: expected False (the default), True or "
                               "'joint'")
        self.join_groups = ctx.switch(JOIN_GROUPS, False, expected=(
            "True (a staged later copy waited for at the top committed with the leading copies as one group, D79) or "
            "False (the default)"))
        self.producer = None  # (barrier inits, producer loop, the loop it feeds) once a loop is specialized
        # D80: tilecore.group_multicast (False or a group size); self.group_size: the group planned (1: none)
        mc = ctx.option(GROUP_MULTICAST, False)
        if mc is None:
            mc = False
        if not (mc is False or (isinstance(mc, int) and not isinstance(mc, bool) and mc == 2)):
            from ..errors import CompileError

            raise CompileError(f"pass config {GROUP_MULTICAST}={mc!r}: expected False (the default) or 2 (groups of "
                               "two blocks sharing a staged operand's copies)")
        self.multicast = mc
        self.group_size = 1
        self.notes: list = []
        self.staged: dict = {}  # id(buffer) -> staged buffer, for the Allocates
        # a persistent tile loop (tilecore.persistent, passes/persistent.py) around the loop being planned:
        # its TileWalk; the loop's prologue then runs once before the tile loop (self.hoisted)
        self.carry = None
        self.why_carry = "no tile loop"
        self.hoisted: list = []
        self.barriers: list = []  # transaction barriers of bulk copies, allocated at the launch's top

    def why_not_specialized(self, loop: For, forms) -> str | None:
        """Why the loop's stages cannot be issued by a producer group of their own (None: they can)."""
        if self.producer is not None:
            return "another loop of the kernel has the producer"
        if self.consumers is None or self.consumers % self.group:
            return f"the block is not a one-dimensional multiple of {self.group} threads"
        top = list(self.launch.body.body) if isinstance(self.launch.body, Seq) else [self.launch.body]
        carried = self.carry is not None and self.why_carry is None
        if not carried and not any(x is loop for x in top):
            return "the loop is not at the top level of the kernel"
        if self.max_threads is not None and self.consumers + self.group > int(self.max_threads[0]):
            return f"{self.consumers} + {self.group} threads exceed the block's limit"
        for kind, what in ((Collective, "a block-wide library call"), (Assert, "a device assertion"),
                           (Print, "a print")):
            if collect(self.launch.body, kind):
                return f"the kernel has {what} (every thread would have to take part)"
        if carried:  # the producer walks the block's tiles itself: the copies' addresses of the running count
            # (TileWalk.at: block indices of the tile, the loop variable; why_not_carried allowed nothing else)
            self.producer_binds = []
            return None
        # the producer computes the copies' addresses from the block indices, the kernel's scalars, the loop's
        # own variable and the pure bindings before the loop
        before = top[:next(i for i, x in enumerate(top) if x is loop)]
        known = {id(b.var) for b in before if isinstance(b, Bind) and not _loads_memory(b.value)}
        bound = {id(b.var) for b in collect(self.launch.body, Bind)} | {id(f.var) for f in collect(self.launch.body, For)}
        exprs = [loop.start, loop.extent] + [e for f in forms for e in f[1]]
        used: list = []
        for e in exprs:
            walk_expr(e, lambda x: used.append(x) if isinstance(x, Var) and id(x) in bound and x is not loop.var
                      and id(x) not in known else None)
        if used:
            return f"the copies' addresses use {used[0].name}, which the kernel computes"
        self.producer_binds = [b for b in before if isinstance(b, Bind) and id(b.var) in known]
        return None

    def why_not_carried(self, loop: For, copies, carry) -> str | None:
        """Why the loop's stages cannot be issued across the tiles of ``carry`` (None: they can): their
        addresses may use the loop variable, the block indices, the copies' own loops and the kernel's
        parameters only (the next tile's and the prologue's copies are issued where nothing else is bound)."""
        own = {id(loop.var)} | {id(v) for v in carry.block_vars}
        for c in copies:
            walk(c, lambda x: own.add(id(x.var)) if isinstance(x, For) else None)
        bound = {id(b.var) for b in collect(self.launch.body, Bind)} | \
            {id(f.var) for f in collect(self.launch.body, For)}
        used: list = []
        for c in copies:
            for x in _all_stmts(c):
                for e in stmt_exprs(x):
                    walk_expr(e, lambda v: used.append(v) if isinstance(v, Var) and id(v) in bound
                              and id(v) not in own else None)
        if used:
            return f"the copies' addresses use {used[0].name}, which the tile computes"
        if _loads_memory(loop.extent) or _loads_memory(loop.start):
            return "the loop's bounds read memory"
        for e in (loop.start, loop.extent):  # (tilecore.persistent_tiles takes only such loops)
            walk_expr(e, lambda v: used.append(v) if isinstance(v, Var) and id(v) in bound else None)
        if used:
            return f"the loop's bounds use {used[0].name}, which the tile computes"
        return None

    def plan(self, loop: For):
        """The loop's replacement (None: leave it to serialization) and a note. Copies further down the body
        that stage_pipelined_copies marked (their source depends on the loop variable only) are staged too,
        unless their buffers would leave two or fewer resident blocks per SM where there were more (shared
        memory per SM, threads per SM); then, and where
        the loop is not pipelined, each becomes asynchronous copies waited for where it stands."""
        body = list(loop.body.body) if isinstance(loop.body, Seq) else [loop.body]
        n = 0
        while n < len(body) and isinstance(body[n], For) and body[n].annotations.get(STAGE):
            n += 1
        late = [i for i in range(n, len(body)) if isinstance(body[i], For) and body[i].annotations.get(STAGE)]
        if not late:
            return self._plan(loop, stage_late=False)
        new, note = self._plan(loop, stage_late=True)
        if new is not None:
            return new, note
        fallback = list(body)
        hoist, unhoisted = {}, []
        for i in late:
            fallback[i] = copy_and_wait(body[i], self.widths)
            if self.late_copy:
                why = _why_not_hoisted(body, i, fallback[i])
                if why is None:
                    hoist[i] = fallback[i]
                else:
                    unhoisted.append(f"{_copy_parts(body[i])[1].buffer.name}: {why}")
        plain = loop.with_(body=Seq(fallback, span=loop.body.span))
        new, again = self._plan(plain, stage_late=False, orig=loop, hoist=hoist)
        if unhoisted:
            again += f"; not issued at the top of the iteration ({'; '.join(unhoisted)})"
        if note.startswith("occupancy:"):
            again += f" ({note[len('occupancy: '):]})"
        return (new if new is not None else plain), again

    def on_issuer(self, stmts: list) -> list:
        """The steady loop's stage-ahead issue on thread ``tilecore.pipeline_issue_thread`` (D62; 0, the default: as
        it is, thread distribution gives bulk copies to thread 0)."""
        t = self.issue_thread
        if not t:
            return stmts
        return [If(compare("eq", ThreadIndex(), as_expr(t)), seq(stmts), span=stmts[0].span if stmts else None)]

    def multicast_plan(self, carry, forms, bufs, split) -> tuple:
        """D80: ``(set of copy indices the group multicasts, None)`` or ``(None, why not)`` for
        ``tilecore.group_multicast`` on a warp-specialized loop carried across the persistent tile loop ``carry``.
        Blocks ``g b .. g b + g - 1`` form a group; they walk their tiles in step (the same count: ``tiles`` and the
        block count multiples of ``g``) and at every step run tiles ``t .. t + g - 1`` (``t`` a multiple of ``g``). A
        copy is shared where the block indices its starts use are equal over each such run of tiles (evaluated for
        every tile of the walk) and its panels divide among the group's blocks."""
        g = self.multicast
        caps = self.ctx.capabilities
        if caps.get("execution.cluster.supported") is not True or caps.get(MULTICAST_FEATURE) is not True:
            return None, f"the target has no copies into every block of a group ({MULTICAST_FEATURE})"
        lim = caps.limit("max_cluster_size")
        if lim is not None and g > int(lim[0]):
            return None, f"groups of {g} exceed the target's {int(lim[0])}"
        if split is not None:
            return None, "the loop's stages are released in groups (one release barrier a stage only)"
        if carry is None:
            return None, "the loop is not carried across a persistent tile loop"
        if carry.blocks % g or carry.tiles % g:
            return None, (f"{carry.blocks} blocks over {carry.tiles} tiles: both must be multiples of {g} (the "
                          "group's blocks walk their tiles in step)")
        at_once = {int(k): v for k, v in dict(caps.get("execution.cluster.at_once") or {}).items() if v is not None}
        if g in at_once and carry.blocks // g > int(at_once[g]):
            return None, f"{carry.blocks // g} groups of {g}, {int(at_once[g])} resident at once on the target"
        vals = _walk_values(carry)
        if vals is None:
            return None, "the tile walk's block indices could not be evaluated"
        same = {id(v) for n, v in enumerate(carry.block_vars)
                if all(len({vals[t + r][n] for r in range(g)}) == 1 for t in range(0, carry.tiles, g))}
        shared, why = set(), []
        for j, (src, starts, box, lay) in enumerate(forms):
            used = set()
            for e in starts:
                walk_expr(e, lambda x: used.add(id(x)) if isinstance(x, Var) else None)
            moving = [v.name for v in carry.block_vars if id(v) in used and id(v) not in same]
            panels = lay.cols // lay.panel_elems if getattr(lay, "panels", False) else 1
            if moving:
                why.append(f"{bufs[j].name}: its box moves with {moving[0]} within a group")
            elif panels % g:
                why.append(f"{bufs[j].name}: {panels} panel(s) do not divide among {g} blocks")
            else:
                shared.add(j)
        if not shared:
            return None, "no staged copy is shared by a group's tiles (" + "; ".join(why) + ")"
        return shared, None

    #: D74: "auto"'s size of the last gemm's accumulator (elements a thread: FlashAttention's O, 128 at d256 with two
    #: consumer warpgroups, 64 at d128) from which the masked iterations get a loop of their own in the exact build too
    LOOPS_MIN_ACC = 128
    #: D83: and where the first gemm's accumulator holds this many elements a thread or more beside a last one of 64
    #: or more (d128 at 128x176: S 88, O 64; with "registers"' descriptor offsets, no spill)
    LOOPS_MIN_FIRST = 88

    def two_loops(self, rot) -> bool:
        """tilecore.pipeline_mask_unswitch: the masked iterations in a loop of their own (D74)."""
        if self.mask_loops == "loops":
            return True
        if self.mask_loops != "auto":
            return False
        n, first = 1, 1
        for x in rot["last_acc"].shape:
            c = const_value(x)
            if not isinstance(c, int):
                return self.fast_math
            n *= c
        for x in rot["first_acc"].shape:
            c = const_value(x)
            first = first * c if isinstance(c, int) and first else 0
        return self.fast_math or n >= self.LOOPS_MIN_ACC or (n >= 64 and first >= self.LOOPS_MIN_FIRST)

    def scales_in_turn(self, rot) -> bool:
        """tilecore.pipeline_scale_in_turn for the rotated loop ``rot`` (D87): "auto" in the exact build where D83's
        two loops' form is (the first gemm's accumulator LOOPS_MIN_FIRST elements a thread or more beside a last one of
        64 or more: d128 at 128x176, measured +3.5% non-causal, +1% causal); not at 128x128 (-1 to -3%) nor under fast
        math (-3% at 128x128)."""
        if self.scale_in_turn != "auto":
            return bool(self.scale_in_turn)
        if self.fast_math:
            return False
        n, first = 1, 1
        for x in rot["last_acc"].shape:
            c = const_value(x)
            n = n * c if isinstance(c, int) and n else 0
        for x in rot["first_acc"].shape:
            c = const_value(x)
            first = first * c if isinstance(c, int) and first else 0
        return n >= 64 and first >= self.LOOPS_MIN_FIRST

    def turn_groups(self):
        """``(group_threads, groups)`` where tilecore.pingpong is on and a warp-specialized block's consumers are
        two groups of the producer group's size (two 128-thread groups where the profile says so); else None."""
        if not self.pingpong or not self.specialize or not self.group or not self.consumers:
            return None
        if self.consumers != 2 * self.group:
            return None
        return (self.group, 2)

    def early_split(self, deferred, staged, members, why_carry):
        """:func:`_early_split` where tilecore.pipeline_early_issue is on and the loop is not carried across a
        persistent tile loop (its stages run on across the tiles: the prologue's extra stage would be the next
        tile's)."""
        if not self.early or why_carry is None:
            return None
        return _early_split(deferred, staged, members)

    def why_not_versioned(self) -> str | None:
        """Why a loop whose copies lack only a launch-time fact for bulk copies is not versioned on it."""
        if self.ctx.option(VERSION_OPTION, True) is False:
            return f"{VERSION_OPTION} is off"
        if self.carry is not None:
            return "the loop is carried across a persistent tile loop"
        if self.specialize:
            return "warp specialization was asked"
        return None

    def _versioned(self, loop: For, stage_late: bool, orig, facts: Facts, forms):
        """The loop twice under one launch-time test (``(replacement, note)``): bulk tile copies where every
        staged tensor's rows are whole 16-byte units and its sizes positive (the facts the prover lacked, now
        a condition over the kernel's integer arguments, which each bulk copy carries as ``when`` for the
        backend's launcher), the per-thread copies otherwise; both branches share the staged buffers and the
        stage count. None where either plan fails (the caller plans without versioning)."""
        tests, seen = [], set()
        for f in forms:
            for t in getattr(f, "tests", ()):
                if expr_str(t) not in seen:
                    seen.add(expr_str(t))
                    tests.append(t)
        cond = tests[0]
        for t in tests[1:]:
            cond = logic_and(cond, t)
        saved = (self.used, list(self.barriers), dict(self.staged))

        def restore():
            self.used, self.barriers, self.staged = saved[0], saved[1], saved[2]

        then, note_t = self._plan(loop, stage_late, orig, facts=facts.with_cond(cond), when=cond, version=False)
        if then is None or not collect(then, BulkCopy):
            restore()
            return None
        stages, used_then = self._last_stages, self.used
        self.used = saved[0]
        shared = {k: v for k, v in self.staged.items() if saved[2].get(k) is not v}
        orelse, note_e = self._plan(loop, stage_late, orig, facts=facts, stages_asked=stages, staged_as=shared,
                                    version=False)
        if orelse is None or self._last_stages != stages:
            restore()
            return None
        self.used = max(used_then, self.used)
        rest = note_e.split(": ", 1)[1] if ": " in note_e else note_e
        note = f"{note_t}; versioned at launch: where {expr_str(cond)} does not hold, {rest}"
        return If(cond, then, orelse, span=loop.span), note

    def _plan(self, loop: For, stage_late: bool, orig: For | None = None, facts: Facts | None = None,
              when=None, stages_asked: int | None = None, staged_as: dict | None = None, version: bool = True,
              hoist: dict | None = None):
        """``hoist`` (D71, tilecore.pipeline_late_copy): body index -> an unstaged later copy as ``copy_and_wait``
        gave it, to be issued at the top of the iteration where the plan allows (else left where it stands)."""
        name = loop.var.name
        body = list(loop.body.body) if isinstance(loop.body, Seq) else [loop.body]
        n = 0
        while n < len(body) and isinstance(body[n], For) and body[n].annotations.get(STAGE):
            n += 1
        # copies further down the body (stage_pipelined_copies marked them: their source depends on the loop
        # variable only) are issued with the stage ahead too, as a second commit group, and waited for where
        # they stood
        late_at = [i for i in range(n, len(body)) if stage_late and isinstance(body[i], For)
                   and body[i].annotations.get(STAGE)]
        late_waits = {i: AsyncWait(0, span=body[i].span) for i in late_at}
        copies = body[:n] + [body[i] for i in late_at]
        rest_items = []
        for i in range(n, len(body)):
            rest_items += [late_waits[i], Barrier(span=body[i].span)] if i in late_waits else [body[i]]
        rest = seq(rest_items) if rest_items else Seq([])
        if not body[:n]:
            return None, f"loop {name}: serialized (its body does not start with a T.copy from a global tensor " \
                         "into a whole shared buffer)"
        want = int(loop.annotations.get("num_stages", 0) or 0)
        parts = [_copy_parts(c) for c in copies]
        why = None
        if any(p is None for p in parts):
            why = "a staged copy is not a plain element copy"
        bufs = [p[1].buffer for p in parts] if why is None else []
        allocs = {id(a.buffer): a for a in collect_allocs(self.launch.body)}
        if why is None and len({id(b) for b in bufs}) != len(bufs):
            why = "two copies fill the same shared buffer"
        outside = None  # the buffers the launch touches outside the loop: one walk for every staged buffer (D65)
        for b in bufs:
            if why is None and id(b) not in allocs:
                why = f"{b.name} is not allocated at block level"
            elif why is None:
                if outside is None:
                    outside = _touched(_without(self.launch.body, orig or loop))
                if id(b) in outside:
                    why = f"{b.name} is used outside the loop"
        for p in parts if why is None else []:
            if _touches(rest, p[2].buffer) and _writes(rest, p[2].buffer):
                why = f"the loop body writes {p[2].buffer.name}, which a staged copy reads"
        if why is None and any(isinstance(x, Print) and x.buffer is not None and any(x.buffer is b for b in bufs)
                               for x in _all_stmts(rest)):
            why = "the loop body prints a staged buffer"
        if why is None and _exits(rest):
            why = "the loop body has a break or continue"
        if why is None and (_loads_memory(loop.start) or _loads_memory(loop.extent)):
            why = "the loop bounds read memory"
        if why is not None:
            return None, f"loop {name}: serialized ({why})"
        from .guard import facts_at

        if facts is None:
            facts = facts_at(self.launch, orig or loop) or Facts()
        # every staged tile filled by bulk copies, or none (one way of waiting per loop)
        forms = [_bulk_form(c, self.paneled.get(id(p[1].buffer)), facts) for c, p in zip(copies, parts)] \
            if self.bulk else []
        bulk = bool(forms) and all(isinstance(f, tuple) for f in forms)
        # only launch-time facts missing (a dynamic row length): the loop versioned, bulk copies where they hold
        why_unversioned = None
        if version and forms and not bulk and all(isinstance(f, (tuple, _Unproven)) for f in forms):
            why_unversioned = self.why_not_versioned()
            if why_unversioned is None:
                done = self._versioned(loop, stage_late, orig, facts, forms)
                if done is not None:
                    return done
                why_unversioned = "a branch could not be planned"
        groups_n = 2 if late_at else 1
        tile_bytes = [_round16(max(const_value(simplify(b.numel())), 1) * b.dtype.bytes) for b in bufs]

        def barrier_bytes(stages):  # one 8-byte transaction barrier per stage and group (D62: and a release barrier)
            return (groups_n + (self.release_stages and not self.specialize)) * _round16(8 * stages) if bulk else 0

        stages = stages_asked or want
        while stages >= 2 and self.limit is not None and \
                self.used + barrier_bytes(stages) + sum(_round16(stages * t) - t for t in tile_bytes) > self.limit:
            stages -= 1
        if stages < 2:
            need = self.used + sum(_round16(2 * t) - t for t in tile_bytes)
            return None, (f"loop {name}: serialized ({len(bufs)} tiles x 2 buffers need {need} bytes of on-chip "
                          f"memory with the kernel's other buffers; target allows {self.limit})")
        extra = sum(_round16(stages * t) - t for t in tile_bytes)
        late_rule = self.ctx.option(STAGE_LATE, "auto")
        # D66: "auto" stages them regardless where the block is two consumer groups of the producer group's size that
        # the automatic specialization would take (FlashAttention's two-consumer form: its rotation and ping-pong's
        # turns need the late copies staged; the register program runs that form one block an SM: d64 128x176 on
        # the general path 227 TFLOP/s unstaged against the register program's 414, H200); "occupancy": D61's rule
        # for every loop
        two_consumers = (late_rule == "auto" and bulk and self.specialize_auto and self.overlap
                         and self.group is not None and self.consumers == 2 * self.group)
        if late_at and self.per_sm and late_rule is not True and not two_consumers:
            lead_extra = sum(_round16(stages * t) - t for t in tile_bytes[:n])
            def blocks(used):
                return min(self.per_sm // max(used, 1), self.thread_blocks or 1 << 30)

            # measured (H200, FlashAttention 64x64 d128 on wgmma): 3 -> 2 blocks cost 10% (403 -> 362 TFLOP/s);
            # 128x128 at one block either way gained (343 -> 371)
            if blocks(self.used + extra) < blocks(self.used + lead_extra) and blocks(self.used + extra) <= 2:
                late_names = ", ".join(b.name for b in bufs[n:])
                return None, (f"occupancy: staging {late_names} would leave {blocks(self.used + extra)} resident "
                              f"block(s) per SM instead of {blocks(self.used + lead_extra)}")
        self.used += extra + barrier_bytes(stages)
        table = {}
        for b in bufs:
            staged = (staged_as or {}).get(id(b)) or Buffer(b.name, (stages,) + tuple(b.shape), b.dtype, b.scope)
            table[id(b)] = staged
            self.staged[id(b)] = staged
        issue_kinds = []
        async_copies = []
        for j, c in enumerate(copies):
            if bulk:
                new, how = c, "bulk tile copies"
                lay = forms[j][3]
                kind = (f"{bufs[j].name} bulk tile copies ({lay.cols // lay.panel_elems} x {lay.swizzle_bytes}-byte "
                        "panel(s))")
            else:
                new, how = async_copy_nest(c, self.widths, facts)
                kind = f"{bufs[j].name} {describe_copy(new, how)}"
            async_copies.append(new)
            issue_kinds.append(kind + ((" (issued with the stage ahead, waited for with the leading copies at the top "
                                        "of the iteration)" if self.late_copy and not bulk else
                                        " (issued with the stage ahead, waited for where it stands)") if j >= n else ""))
        k, start, extent = loop.var, loop.start, loop.extent
        rot = None  # D59: the rotated body's pieces (tilecore.pipeline_overlap)
        fission = None  # D74: (E, the second loop's variable, its body): the masked iterations in a loop of their own
        groups = [async_copies[:n]] + ([async_copies[n:]] if late_at else [])
        if late_at and self.join_groups and self.late_copy and not bulk and not hoist:
            # D79 (tilecore.pipeline_join_groups): the staged later copies, waited for with the leading ones at the
            # top (D71), issued and committed with them as one group: one test, one commit an iteration
            groups = [async_copies]
            issue_kinds.append("the stage ahead's copies one commit group")
        it = simplify(binary("sub", k, start))
        local = it  # the iteration within this tile (the k-loop's own count)
        carry = self.carry
        why_carry = self.why_not_carried(loop, copies, carry) if carry is not None else "no tile loop"
        self.why_carry = why_carry
        if why_carry is None:
            # across a persistent tile loop: one running count of stages over this block's tiles (stage index and
            # barrier parity carry on), the stage ahead past a tile's end is the next tile's first stage
            it = simplify(binary("add", binary("mul", carry.i, extent), local))
            total = simplify(binary("mul", carry.count, extent))
        else:
            total = extent
        if bulk:
            # one transaction barrier per stage and group: iteration it waits on barrier it % stages for the
            # phase of parity (it / stages) % 2; one thread announces the stage's bytes and issues its copies
            bars = [Buffer(f"{bufs[0].name}_full", (stages,), "uint64", "shared")] + \
                ([Buffer(f"{bufs[n].name}_full", (stages,), "uint64", "shared")] if late_at else [])
            self.barriers += bars
            members = [list(range(n))] + ([list(range(n, len(copies)))] if late_at else [])
            slot_it = simplify(binary("floormod", it, stages))
            parity_it = simplify(binary("floormod", binary("floordiv", it, stages), 2))
            waits = [CopyBarrierWait(b, slot_it, parity_it, span=loop.span) for b in bars]
            rest_items = []
            for i in range(n, len(body)):
                rest_items += [waits[1]] if i in late_waits else [body[i]]
            rest = seq(rest_items) if rest_items else Seq([])

        # the stage ahead's block indices per tile, not per k step (tilecore.persistent_next_indices="per_tile",
        # D56): with S - 1 <= K the stage ahead is this tile's or the next one's, so the next tile's indices are bound
        # once before the k loop and each k step selects between them and this tile's
        next_binds, next_vars = [], {}
        if why_carry is None and bulk and next_indices(self.ctx, self.launch) == "per_tile" \
                and isinstance(const_value(extent), int) and stages - 1 <= const_value(extent):
            nxt = carry.at(simplify(binary("add", carry.i, 1)))
            for v in carry.block_vars:
                nv = Var(f"{v.name}_next", v.dtype)
                next_binds.append(Bind(nv, nxt[id(v)], span=loop.span))
                next_vars[id(v)] = nv

        def stage(it, ahead=False):
            """(the loop variable's value, the buffer) of stage ``it`` (iteration offset from the loop start; with a
            carried tile loop the running count: iteration ``it % extent`` of this block's tile ``it / extent``,
            whose block indices replace the kernel's; ``ahead``: ``it`` is the stage ahead of the steady loop's
            iteration, whose tile's indices may be selected from this tile's and the next one's)."""
            if why_carry is None and ahead and next_vars:
                a = simplify(binary("add", local, stages - 1))
                inside = compare("lt", a, extent)
                at = {id(v): select(inside, v, next_vars[id(v)]) for v in carry.block_vars}
                at[id(k)] = simplify(binary("add", start, select(inside, a, simplify(binary("sub", a, extent)))))
            elif why_carry is None:
                at = carry.at(simplify(binary("floordiv", it, extent)))
                at[id(k)] = simplify(binary("add", start, binary("floormod", it, extent)))
            else:
                at = {id(k): simplify(binary("add", start, it))}
            slot = simplify(binary("floormod", it, stages)) if not isinstance(const_value(it), int) \
                else as_expr(const_value(it) % stages)
            return at, slot

        mc_shared: set = set()  # D80: the copies a block group multicasts (tilecore.group_multicast)
        why_mc = None

        def issue_bulk(it, g, guard=True, ahead=False):
            """Stage ``it`` of group ``g`` as bulk copies on the group's barrier (nothing past the loop's end)."""
            at, slot = stage(it, ahead)
            nbytes = sum(tile_bytes[j] for j in members[g])
            out = [CopyBarrierArrive(bars[g], slot, nbytes, span=loop.span)]
            for j in members[g]:
                src, starts, box, lay = forms[j]
                out.append(BulkCopy(table[id(bufs[j])], (slot,), src, tuple(simplify(substitute(e, at)) for e in starts),
                                    box, lay, bars[g], slot, when=when, span=copies[j].span,
                                    multicast=self.group_size if j in mc_shared else 1))
            return [_if(compare("lt", it, total), seq(out), loop.span)] if guard else out

        def issue(it, group):
            """Stage ``it`` (iteration offset from the loop start) of ``group`` into buffer ``it % stages``."""
            at, slot = stage(it)
            return [_multi_buffer(_fresh_loops(substitute(c, at)), table, slot) for c in group]

        def issue_all(it, ahead=False):
            """Each group's copies of stage ``it``, each group one commit (also where ``it`` is past the end)."""
            out = []
            for g, group in enumerate(groups):
                if bulk:
                    out += issue_bulk(it, g, ahead=ahead)
                    continue
                out += [_if(compare("lt", it, total), seq(issue(it, group)), loop.span), AsyncCommit(span=loop.span)]
            return out

        inits = [CopyBarrierInit(b, 1, span=loop.span) for b in bars] if bulk else []
        prologue = inits + [Barrier(span=loop.span)] if bulk else []
        for s in range(stages - 1):
            prologue += issue_all(as_expr(s))
        ahead = simplify(binary("add", it, stages - 1))
        # D71 (tilecore.pipeline_late_copy), per-thread copies only: a staged later group waited for with the leading
        # ones at the top of the iteration (`joined`), an unstaged later copy issued at the top (`hoisted`)
        late_mode = self.late_copy if not bulk else False
        joined = bool(late_mode and late_at)
        hoisted, hoist_waits = [], []
        slot_now = simplify(binary("floormod", it, stages))
        if joined:
            rest = seq([body[i] for i in range(n, len(body)) if i not in late_waits]) \
                if len(body) > n + len(late_waits) else Seq([])
        consume = _multi_buffer(rest, table, slot_now)
        if late_mode and hoist:
            items = []
            for i in range(n, len(body)):
                if i in hoist:
                    hoist_waits.append(AsyncWait(0, span=body[i].span))
                    items += [hoist_waits[-1], Barrier(span=body[i].span)]
                else:
                    items.append(body[i])
            hoisted = [x for i in sorted(hoist) for x in hoist[i].body[:-1]]  # each copy's runs and its commit
            plain_consume, consume = consume, _multi_buffer(seq(items), table, slot_now)
        # issuing the stage ahead after the gemm shortens its lead by one gemm: worth it from 3 stages, or where
        # a copy is synchronous (its loads then overlap the unit's work). H200, 4096^3 fp16 on wgmma: 128x256x64
        # with 3 stages 0.349 -> 0.277 ms, 128x128x32 with 2 stages 0.433 -> 0.483; the 4096x777 GEMM (B copied
        # synchronously) with 2 stages 0.406 -> 0.319 (decision D26)
        # bulk copies: always (one thread issues the stage ahead while the unit runs)
        synchronous = not bulk and any(not collect(c, AsyncCopy) for c in async_copies)
        last = compare("eq", local, simplify(binary("sub", extent, 1)))  # per tile: D29's hazard holds per tile
        deferred = _defer_matrix_wait(consume, last) if stages >= 3 or synchronous or bulk else None
        why_not_hoisted = "the stages are bulk tile copies" if hoist and bulk else None
        if hoisted and deferred is not None:  # the matrix unit runs on past the iteration: the buffer is not free
            why_not_hoisted = "the gemm runs on past the iteration"
            hoisted, hoist_waits, consume = [], [], plain_consume
            deferred = _defer_matrix_wait(consume, last)
        after = []
        # commit groups are issued in stage order, one per group of copies: before the body uses stage it's
        # leading tiles every group after them may still be pending, before a late tile every group after it
        g = len(groups)
        first = (g - 1) + g * (stages - 2)  # stage it's late group, then the groups of stages it+1 .. it+stages-2
        auto_ws = (bulk and not self.specialize and self.specialize_auto and self.overlap and late_at
                   and deferred is not None and self.consumers is not None and self.group is not None
                   and self.consumers == 2 * self.group and why_carry is not None
                   and overlap.rotatable(deferred[0]))
        if auto_ws:  # D59: FlashAttention's form specialized with ping-pong by default
            self.specialize, pingpong_before = True, self.pingpong
            self.pingpong = self.pingpong or self.pingpong_auto
        carried_ws = bulk and not self.specialize and self.specialize_carried and why_carry is None
        if carried_ws:  # D80: tilecore.warp_specialize="carried" and the loop is carried across the tile loop
            self.specialize = True
        why_ws = self.why_not_specialized(orig or loop, forms) if bulk and self.specialize else "not asked"
        if auto_ws and why_ws is not None:  # not possible here: as without the option
            self.specialize, self.pingpong, why_ws = False, pingpong_before, "not asked"
        if carried_ws and why_ws is not None:
            self.specialize = False
        if why_ws is None:
            # a producer thread of its own issues every stage, once the consumers released the stage's buffer
            # (StageRelease on the stage's `empty` barrier: every consumer thread arrives when done reading it)
            empty = Buffer(f"{bufs[0].name}_empty", (stages,), "uint64", "shared")
            self.barriers.append(empty)
            split = self.early_split(deferred, [table[id(bufs[j])] for j in range(len(bufs))], members, why_carry) \
                if len(groups) > 1 else None
            empties = [empty]
            if self.multicast:  # D80: the group's blocks share a staged operand's copies
                shared, why_mc = self.multicast_plan(carry if why_carry is None else None, forms, bufs, split)
                if shared:
                    mc_shared, self.group_size = shared, self.multicast

            def release(index):  # a stage released in this block, or in every block of the group (D80)
                return StageRelease(empty, index, group=self.group_size, span=loop.span)

            if split is not None:
                # D55 (tilecore.pipeline_early_issue with warp specialization): one `empty` barrier per copy group,
                # every group released right after the body's first gemm that waits for every earlier one: a group
                # nothing after that point reads (K) releases this iteration's stage, the others (V, read by the
                # previous iteration's P @ V, which that wait finished) the previous one; the producer waits for
                # each group's own release, so K is refilled while P @ V still runs
                pre, post, early = split
                empties = [empty] + [Buffer(f"{bufs[members[gi][0]].name}_empty", (stages,), "uint64", "shared")
                                     for gi in range(1, len(groups))]
                self.barriers += empties[1:]
                consume, drain = deferred
                prev = simplify(binary("floormod", binary("sub", it, 1), stages))
                releases = [StageRelease(empties[gi], slot_it, span=loop.span) if gi in early else
                            _if(compare("gt", it, 0), StageRelease(empties[gi], prev, span=loop.span), loop.span)
                            for gi in range(len(groups))]
                steady = [waits[0], seq(pre + releases + post)]
                after = [drain]
                issue_kinds.append("each group's stage released after the first gemm's wait")
                rot = overlap.parts(pre, post, waits[1]) if self.overlap and len(groups) == 2 and early == [0] \
                    and why_carry is not None else None
                if rot is not None:
                    # D59 (tilecore.pipeline_overlap) with warp specialization: as without it (below), each stage
                    # released once the gemm that read it was waited for (K after the first gemm's wait, V after
                    # the wait for both); with ping-pong one turn for the two gemms issued together
                    turns = self.turn_groups()
                    spelling = collect(pre[-1], MatrixSync)[0].spelling
                    prev_k = {id(k): simplify(binary("sub", k, 1))}
                    first = overlap.with_turn(overlap.commit_only(pre[-1]), turns, True, False)
                    last_prev = overlap.with_turn(_fresh_loops(substitute(overlap.commit_only(rot["gemm"]), prev_k)),
                                                  turns, False, True)
                    pin = overlap.pin(spelling, rot["reads"], loop.span)
                    init, masked = pre[:-1], []
                    ma = overlap.masks_after(pre[:-1], rot["first_acc"]) if self.mask_after else None
                    if ma is not None:  # D59: the split mask after the first gemm, its accumulators cleared
                        init, masked = ma[0], [ma[1]]
                    # D87: O's rescale (the late statements on the last gemm's accumulators alone) right before the
                    # rotated gemm that adds to O, inside the turn: in the peel's place, in each iteration and before
                    # the gemm after the loop
                    sc = overlap.scale_split(rot, [pin, post[-2], first] + init) if self.scales_in_turn(rot) else None
                    late, scaled = (rot["late"], []) if sc is None else (sc[1], sc[0])

                    def iteration(mask):
                        return seq([substitute(post[-2], prev_k)] + init + [first]
                                   + [_fresh_loops(x) for x in scaled] + [
                            last_prev, overlap.wait(spelling, rot["first_acc"], 1, loop.span),
                            StageRelease(empties[0], slot_it, span=loop.span)] + mask + rot["early"]
                            + [overlap.wait(spelling, rot["last_acc"], 0, loop.span),
                               StageRelease(empties[1], prev, span=loop.span)] + late + [pin])

                    bound = _below(masked[0].cond, k) if ma is not None and self.two_loops(rot) else None
                    if bound is not None:
                        # D74: the unmasked iterations (k < E) in one loop, the masked ones in a second: each loop's
                        # body one straight run (the register program's two loops; D70's unswitched iteration in one
                        # loop gave the assembler two copies of the body to allocate at once)
                        steady = [waits[0], iteration([])]
                        k2 = Var(k.name, k.dtype)
                        fission = (bound, k2, [waits[0], _fresh_loops(iteration([masked[0].orelse]))])
                        issue_kinds.append("the iterations split on the mask's condition into two loops (unmasked, "
                                           "then masked)")
                    elif ma is not None and self.mask_unswitch:
                        # D70: `if k < E: the iteration else: the iteration with the mask after the first gemm's
                        # wait`: each path one run from the gemms' issue on (the mask's branch no longer splits
                        # the statements beside the last gemm from its issue)
                        steady = [waits[0], If(masked[0].cond, iteration([]),
                                               _fresh_loops(iteration([masked[0].orelse])), span=loop.span)]
                        issue_kinds.append("the iteration unswitched on its split mask")
                    else:
                        steady = [waits[0], iteration(masked)]
                    peel = ([waits[0]] + init + [overlap.with_turn(pre[-1], turns, True, True),
                                                  StageRelease(empties[0], slot_it, span=loop.span)]
                            + masked + rot["early"] + late + [pin])
                    peeled = _fresh_loops(substitute(seq(peel), {id(k): start}))
                    last_k = {id(k): simplify(binary("sub", binary("add", start, extent), 1))}
                    after = [substitute(post[-2], last_k)] + [_fresh_loops(x) for x in scaled] + [
                             overlap.with_turn(_fresh_loops(substitute(overlap.waits_for_itself(rot["gemm"]), last_k)),
                                               turns, True, True)]
                    issue_kinds[-1] = ("each group's stage released after the wait for the gemm that read it; the "
                                       "last gemm one iteration late, beside the next first gemm and the statements "
                                       "it does not touch")
                    if self.scales_in_turn(rot):
                        issue_kinds.append("the last gemm's accumulator scaled in the next turn, right before the "
                                           "gemm that adds to it" if sc else "the last gemm's accumulator scaled "
                                           "where it was (no late statement names it alone, or one shares a buffer "
                                           "with what it would move past)")
            elif deferred is None:
                steady = [waits[0], consume, release(slot_it)]
            else:  # the previous iteration's gemm has finished reading its stage at the deferred wait
                consume, drain = deferred
                # (it - 1) % S as (it + S - 1) % S, nonnegative (D62: a backend that spells remainders of nonnegative
                # values as masks then masks it, not a 64-bit signed remainder: 12 instructions a k step on the
                # measured target); released where it > 0, where both are the same stage
                prev = simplify(binary("floormod", binary("add", it, stages - 1), stages))
                if self.ctx.option("tilecore.release_last_stage", True) is False:  # D46: the next tile releases it
                    steady = [waits[0], consume, _if(compare("gt", it, 0), release(prev),
                                                     loop.span)]
                else:
                    # a tile's last iteration waits for every group (`last`): its own stage is read too and is
                    # released there, so the producer refills it with the next tile's stage under this tile's
                    # epilogue (the plugin's pipeline does the same); the next tile's first iteration then has no
                    # stage before its own to release (D56)
                    steady = [waits[0], consume,
                              _if(compare("gt", local, 0), release(prev), loop.span),
                              _if(last, release(slot_it), loop.span)]
                after = [drain]
            turns = self.turn_groups()
            if turns is not None and rot is None:  # D55, tilecore.pingpong: the groups take turns issuing gemms
                steady[1] = _take_turns(steady[1], *turns)
            j = Var(f"{name}_stage", k.dtype)
            slot_j = simplify(binary("floormod", j, stages))
            def refill(bar):
                return _if(compare("ge", j, stages), CopyBarrierWait(
                    bar, slot_j, simplify(binary("floormod", binary("add", binary("floordiv", j, stages), 1), 2)),
                    span=loop.span), loop.span)

            if len(empties) == 1:
                issue_j = [refill(empty)] + [x for g in range(len(groups)) for x in issue_bulk(j, g, guard=False)]
            else:  # each group waits for its own release
                issue_j = [x for g in range(len(groups)) for x in [refill(empties[g])] + issue_bulk(j, g, guard=False)]
            # across a persistent tile loop the producer runs every stage of the block's tiles (the running count
            # j: tile j / K, iteration j % K), so it runs ahead into the next tile's stages while the consumers
            # finish this one; the consumers' waits and releases use the same running count
            producer = For(j, as_expr(0), total, "serial", seq(issue_j), span=loop.span)
            self.producer = (inits + [CopyBarrierInit(e, self.consumers * self.group_size, span=loop.span)
                                      for e in empties], producer, orig or loop)
            prologue = []
        elif bulk and (split := self.early_split(deferred, [table[id(bufs[j])] for j in range(len(bufs))], members,
                                                  why_carry)) is not None:
            # D55, tilecore.pipeline_early_issue: the barrier and the issue right after the body's first gemm that
            # waits for every earlier one (FlashAttention's S = Q K^T, which also finishes the previous P @ V): every
            # thread is then done with the previous iteration's buffers, and a group nothing after that point reads
            # (K) is done with this iteration's too, so it is issued a whole pipeline ahead (stage it + S into the
            # buffer it just read); the others (V) one stage less, into the previous iteration's buffer
            pre, post, early = split
            consume, drain = deferred
            ahead_early = simplify(binary("add", it, stages))
            issues = [x for gi in range(len(groups)) for x in issue_bulk(ahead_early if gi in early else ahead, gi)]
            steady = [waits[0]] + pre + [Barrier(span=loop.span)] + issues + post
            after = [drain]
            prologue += [x for gi in early for x in issue_bulk(as_expr(stages - 1), gi)]
            issue_kinds.append(f"issued after the first gemm's wait ({', '.join(bufs[members[gi][0]].name for gi in early)}"
                               f" {stages} stages ahead)")
            rot = overlap.parts(pre, post, waits[1]) if self.overlap and len(groups) == 2 and early == [0] else None
            if rot is not None:
                # D59 (tilecore.pipeline_overlap): iteration k issues its first gemm, then iteration k - 1's last
                # one (its late stage waited for first), waits for the first only, runs the statements the last
                # gemm does not touch beside it, waits for both, then the rest; iteration 0 peeled (no last gemm
                # before it), the last iteration's last gemm after the loop. The late group's stage j is issued
                # in iteration j - (S - 2) (its buffer's previous stage was read by the gemm iteration j - S + 1
                # issued and waited for), K as before, S stages ahead
                prev_k = {id(k): simplify(binary("sub", k, 1))}
                spelling = collect(pre[-1], MatrixSync)[0].spelling
                first = overlap.commit_only(pre[-1])
                last_prev = _fresh_loops(substitute(overlap.commit_only(rot["gemm"]), prev_k))
                late_wait = substitute(post[-2], prev_k)  # the late group's wait (parts: right before the gemm)
                late_ahead = simplify(binary("add", it, stages - 2))
                issues = issue_bulk(ahead_early, 0) + issue_bulk(late_ahead, 1)
                init, masked = pre[:-1], []
                ma = overlap.masks_after(pre[:-1], rot["first_acc"]) if self.mask_after else None
                if ma is not None:  # D59: the split mask after the first gemm, its accumulators cleared
                    init, masked = ma[0], [ma[1]]
                steady = ([waits[0], late_wait] + init + [first, last_prev,
                                                          overlap.wait(spelling, rot["first_acc"], 1, loop.span),
                                                          Barrier(span=loop.span)] + issues + masked + rot["early"]
                          + [overlap.wait(spelling, rot["last_acc"], 0, loop.span)] + rot["late"]
                          + [overlap.pin(spelling, rot["reads"], loop.span)])
                peel = ([waits[0]] + init + [pre[-1], Barrier(span=loop.span)] + issues + masked + rot["early"]
                        + rot["late"] + [overlap.pin(spelling, rot["reads"], loop.span)])
                peeled = _fresh_loops(substitute(seq(peel), {id(k): start}))
                last_k = {id(k): simplify(binary("sub", binary("add", start, extent), 1))}
                after = [substitute(post[-2], last_k),
                         _fresh_loops(substitute(overlap.waits_for_itself(rot["gemm"]), last_k))]
                prologue = inits + [Barrier(span=loop.span)]
                prologue += [x for s_ in range(stages) for x in issue_bulk(as_expr(s_), 0)]
                prologue += [x for s_ in range(stages - 2) for x in issue_bulk(as_expr(s_), 1)]
                issue_kinds[-1] = (f"issued after the first gemm's wait ({bufs[members[0][0]].name} {stages} stages "
                                   f"ahead, {bufs[members[1][0]].name} {stages - 2}); the last gemm one iteration "
                                   "late, beside the next first gemm and the statements it does not touch")
        elif bulk:  # each thread waits for the stage itself; the barrier before the issue: no thread still reads
            # the buffer it overwrites (the previous iteration's)
            if deferred is None:
                steady = [waits[0], Barrier(span=loop.span)] + issue_all(ahead, True) + [consume]
            elif self.release_stages:
                # D62 (tilecore.pipeline_release_stages): no block barrier in the loop. Every thread releases the
                # stage the previous iteration's gemm read once its deferred wait has finished it (a tile's last
                # iteration, which waits for every group, its own too: as the warp-specialized consumers do), and
                # the issuing thread alone waits for that release before refilling the stage; the other threads
                # go on to their next stage's wait
                consume, drain = deferred
                empty = Buffer(f"{bufs[0].name}_empty", (stages,), "uint64", "shared")
                self.barriers.append(empty)  # (its bytes counted with the stages': barrier_bytes)
                prologue.insert(len(inits), CopyBarrierInit(empty, self.consumers, span=loop.span))
                prev = simplify(binary("floormod", binary("add", it, stages - 1), stages))  # (it - 1) % S, it > 0
                # the stage ahead's previous use was released in phase ahead / S - 1 of its barrier: the wait for
                # the parity of that phase returns at once on a fresh barrier (before its first phase), so the
                # pipeline's first stages need no test
                refill = CopyBarrierWait(empty, simplify(binary("floormod", ahead, stages)),
                                         simplify(binary("floormod", binary("add", binary("floordiv", ahead, stages), 1), 2)),
                                         issuer=True, span=loop.span)
                issues = []
                for gi in range(len(groups)):
                    issues.append(_if(compare("lt", ahead, total),
                                      seq([refill] + issue_bulk(ahead, gi, guard=False, ahead=True)), loop.span))
                steady = [waits[0], consume,
                          _if(compare("gt", local, 0), StageRelease(empty, prev, span=loop.span), loop.span),
                          _if(last, StageRelease(empty, slot_it, span=loop.span), loop.span)] + self.on_issuer(issues)
                after = [drain]
                issue_kinds.append("each stage released by every thread on its own barrier, which the issuing "
                                   "thread waits for before refilling it (no block barrier)")
            else:
                consume, drain = deferred
                steady = [waits[0], consume, Barrier(span=loop.span)] + self.on_issuer(issue_all(ahead, True))
                after = [drain]
        elif deferred is None and hoisted:
            # D71: the unstaged later copies (one buffer each, read by the previous iteration's matrix work, which the
            # barrier has finished) issued right after the barrier, each its own commit group before the stage
            # ahead's; each waited for where it stood with the groups committed after it still pending ("joint":
            # none), a barrier publishing it. Every iteration commits m + g groups, the prologue's stages as many
            # (m empty ones each), so stage it's leading copies are done with (m + g) (S - 2) groups pending
            m = len(hoist_waits)
            if stages > 2:
                prologue = [x for s_ in range(stages - 1) for x in [AsyncCommit(span=loop.span)] * m
                            + issue_all(as_expr(s_))]
            top = (m + g) * (stages - 2)
            steady = ([AsyncWait(top, span=loop.span), Barrier(span=loop.span)]
                      + [_multi_buffer(x, table, slot_now) for x in hoisted] + issue_all(ahead)
                      + [_replace(consume, {id(w): AsyncWait(0 if late_mode == "joint" else m - 1 - j + g, span=w.span)
                                            for j, w in enumerate(hoist_waits)})])
            names = ", ".join(collect(hoist[i], AsyncCopy)[0].dst.name for i in sorted(hoist))
            issue_kinds.append(f"{names} (one buffer) issued at the top of the iteration after the barrier that frees "
                               "it, before the stage ahead, waited for where it stands"
                               + (" with every group (one wait an iteration)" if late_mode == "joint" else
                                  " (the stage ahead still in flight)"))
        elif deferred is None:
            top = g * (stages - 2) if joined else first
            steady = [AsyncWait(top, span=loop.span), Barrier(span=loop.span)] + issue_all(ahead) + [consume]
            late_pending = g * (stages - 1)
        else:
            # the body ends with a gemm on an asynchronous matrix unit: issue it first and keep it running while
            # the stage ahead is copied; the copies overwrite the stage of the previous iteration's gemm, which
            # the deferred wait (one group left pending) and the barrier after it have finished
            consume, drain = deferred
            top = g * (stages - 2) if joined else first
            steady = [AsyncWait(top, span=loop.span), Barrier(span=loop.span), consume,
                      Barrier(span=loop.span)] + issue_all(ahead)
            after = [drain]
            late_pending = g * (stages - 2)
        if late_waits and not bulk:
            steady = [_replace(x, {id(w): AsyncWait(late_pending, span=w.span) for w in late_waits.values()})
                      for x in steady]
        new_loop = loop.with_(kind="serial", body=seq(steady), annotations={**loop.annotations, "num_stages": stages})
        if rot is not None:  # D59: iteration 0 peeled before the loop
            new_loop = new_loop.with_(start=simplify(binary("add", start, 1)), extent=simplify(binary("sub", extent, 1)))
        if fission is not None:  # D74: [start + 1, min(E, end)) unmasked, then [max(E, start + 1), end) masked
            bound, k2, masked_steady = fission
            lo, end = new_loop.start, simplify(binary("add", start, extent))
            mid_a = simplify(binary("min", bound, end))
            mid_b = simplify(binary("max", bound, lo))
            new_loop = [new_loop.with_(extent=simplify(binary("max", binary("sub", mid_a, lo), 0))),
                        new_loop.with_(var=k2, start=mid_b, extent=simplify(binary("max", binary("sub", end, mid_b), 0)),
                                       body=seq(([Assume(compare("lt", k2, end))] if self.masked_loop_bound else [])
                                                + [substitute(seq(masked_steady), {id(k): k2})]))]
        kib = sum(_round16(stages * t) for t in tile_bytes) / 1024
        reduced = f" (of {want} asked: on-chip memory limit {self.limit} bytes)" if stages < want else ""
        copy_notes = next((f"; no bulk copies: {bufs[j].name}: {f}" for j, f in enumerate(forms)
                             if isinstance(f, str)), "")
        if why_unversioned is not None:
            copy_notes += f" (not versioned at launch: {why_unversioned})"
        if why_not_hoisted is not None:
            copy_notes += f"; {LATE_COPY}: the later copies not issued at the top of the iteration ({why_not_hoisted})"
        if why_carry is None and why_ws is None:
            copy_notes += (f"; carried across the persistent tile loop {carry.i.name}: the producer walks the block's "
                           "tiles and runs ahead into the next tile's stages")
        elif why_carry is None:
            copy_notes += (f"; carried across the persistent tile loop {carry.i.name}: one prologue, the next tile's "
                           f"first {stages - 1} stage(s) issued in this tile's last iterations")
        elif carry is not None:
            copy_notes += f"; not carried across the persistent tile loop ({why_carry}): each tile fills its pipeline"
        if why_ws is None:
            copy_notes += (f"; warp-specialized: a producer group of {self.group} threads issues the stages, "
                             f"the kernel's {self.consumers} threads consume them")
        if why_ws is None and mc_shared:
            names = ", ".join(bufs[j].name for j in sorted(mc_shared))
            copy_notes += (f"; {GROUP_MULTICAST}: block groups of {self.group_size} consecutive blocks, their tiles "
                           f"walked in step share {names}: each block issues 1/{self.group_size} of its panels into "
                           "every block of the group and releases each stage in every block")
        elif self.multicast and why_mc is not None:
            copy_notes += f"; not {GROUP_MULTICAST}: {why_mc}"
        elif self.multicast:
            copy_notes += (f"; not {GROUP_MULTICAST}: the loop is not warp-specialized"
                           + (f" ({why_ws})" if why_ws not in (None, "not asked") else ""))
        if why_ws is None and self.turn_groups() is not None:
            turns = [PerThread(Turn(p, *self.turn_groups(), span=loop.span), span=loop.span) for p in ("init", "fini")]
            copy_notes += (f"; ping-pong: the {self.turn_groups()[1]} consumer groups take turns issuing their gemms "
                           "(one group's are issued while the other computes)")
        elif bulk and self.specialize and why_ws is not None:
            copy_notes += f"; not warp-specialized: {why_ws}"
        if self.late_copy and not bulk and (hoisted or joined):  # D71: the planned iteration, for the IR dump
            copy_notes += f"; iteration: {schedule(steady)}"
        note = (f"loop {name}: {stages} stages{reduced}, {len(bufs)} tiles x {stages} buffers, {kib:g} KiB; "
                + ", ".join(issue_kinds) + ("; the gemm's matrix unit runs on while the stage ahead is copied"
                                            if after else "") + copy_notes)
        loops = new_loop if isinstance(new_loop, list) else [new_loop]
        if len(loops) > 1:  # D74: a loop of no iterations left out (the mask's E at the loop's end: no masked ones)
            loops = [x for x in loops if const_value(x.extent) != 0] or loops[:1]
        body = loops + after
        if rot is not None:  # D59: the peeled iteration, the loop, the last gemm of the last iteration
            body = [_if(simplify(compare("gt", extent, 0)), seq([peeled] + loops + after), loop.span)]
        elif after:
            # a trip count that may be 0 (dynamic): the loop and its drain under one test. Otherwise the drain's
            # wait is reached with the accumulators' zeroing as their last definition on one path and an
            # asynchronous group's on the other, and a vendor's assembler serializes every asynchronous matrix
            # instruction of the kernel (ptxas 13.0 on the catalog's dynamic-shape GEMM, sm_90a: "wgmma
            # serialized due to non wgmma instructions defining accumulator registers"; a static count: none)
            positive = self.no_drain is None and facts.proves(compare("gt", extent, 0))
            if (self.no_drain is True or positive) and const_value(simplify(extent)) is None:
                # a count that is not a constant (a causal loop's `bx + 1`, which the prover shows positive, so the
                # test above is proven away later): the assembler sees a path around the loop to the drain and
                # serializes the matrix unit all the same. No drain: the loop's last iteration waits for its own
                # gemm (_defer_matrix_wait), nothing is left in flight past it (tilecore.pipeline_no_drain, D55)
                body = [new_loop]
            else:
                body = [_if(simplify(compare("gt", extent, 0)), seq(body), loop.span)]
        if why_ws is None and self.turn_groups() is not None:  # the first turn given, the last taken back
            body = [turns[0]] + body + [turns[1]]
        self._last_stages = stages
        if why_carry is None:  # the prologue once, before the persistent tile loop
            self.hoisted = prologue
            return seq(next_binds + body), note
        return seq(prologue + body), note


def _take_turns(consume, group_threads: int, groups: int):
    """``consume`` with each gemm's issue inside a turn (tilecore.pipeline's ping-pong): the turn taken after the gemm's
    opening synchronization (which may meet the other consumers: never while holding the turn) and passed right after
    its instructions are committed; a gemm that waited for itself commits, passes, then waits (overlap.with_turn,
    which the rotated loop of D59 uses too)."""
    return overlap.with_turn(consume, (group_threads, groups), True, True)


def _early_split(deferred, staged: list, members: list):
    """``(pre, post, early groups)`` for tilecore.pipeline_early_issue: the deferred body split after its first
    top-level statement whose last matrix synchronization waits for every earlier gemm (nothing left pending)
    with statements after it; ``early``: the copy groups whose staged buffers nothing after that point touches.
    None where the body has no such point."""
    if deferred is None:
        return None
    consume = deferred[0]
    items = list(consume.body) if isinstance(consume, Seq) else [consume]
    for i, x in enumerate(items[:-1]):
        syncs = collect(x, MatrixSync)
        if not syncs:
            continue
        if syncs[-1].phase not in ("end", "wait") or syncs[-1].pending:
            return None  # the first gemm leaves work in flight: no point where every gemm is done
        if any(isinstance(y, (AsyncCopy, BulkCopy)) for y in _all_stmts(seq(items[:i + 1]))):
            return None
        post = seq(items[i + 1:])
        early = [g for g, js in enumerate(members) if not any(_touches(post, staged[j]) for j in js)]
        return items[:i + 1], items[i + 1:], early
    return None


def _defer_matrix_wait(body, last=None):
    """``(body', drain)`` where ``body`` ends with the closing :class:`MatrixSync` of a gemm on an asynchronous
    matrix unit (the last statement, through sequences and per-thread programs): in ``body'`` it leaves one
    group of the unit's instructions pending (the next iteration's wait finishes it), and ``drain`` waits for
    everything after the loop. None where the body does anything after its gemm.

    With ``last`` (the condition of the loop's last iteration) that iteration waits for everything itself:
    no group stays in flight across the loop's exit. A vendor's assembler was seen scheduling reads of the
    accumulators after the loop above the drain's wait (docs/decisions.md D29: 3% of a GEMM's result wrong);
    the drain then has nothing left to wait for."""
    path = []
    s = body
    while True:
        if isinstance(s, Seq) and s.body:
            path.append(s)
            s = s.body[-1]
        elif isinstance(s, PerThread):
            path.append(s)
            s = s.body
        else:
            break
    if not isinstance(s, MatrixSync) or s.phase != "end" or s.pending:
        return None
    if _touched_before_wait(body, s.acc):  # the next iteration would read accumulators still being written
        return None
    new = s.with_(pending=1)
    if last is not None:  # (the commit stays unconditional: ptxas keeps it on the gemm's last instruction)
        new = Seq([new, If(last, MatrixSync(s.spelling, "wait", s.acc, span=s.span), span=s.span)], span=s.span)
    for parent in reversed(path):
        new = Seq(parent.body[:-1] + [new], span=parent.span) if isinstance(parent, Seq) else parent.with_(body=new)
    drain = PerThread(MatrixSync(s.spelling, "wait", s.acc, span=s.span), span=s.span)
    return new, drain


def _touched_before_wait(body, acc) -> bool:
    """Whether a statement of ``body``, in program order before its first wait for the matrix unit (a
    :class:`MatrixSync` closing with nothing left pending: it waits for every earlier gemm too), reads or
    writes the register buffer ``acc``."""
    order: list = []
    walk(body, order.append)
    for x in order:
        if isinstance(x, MatrixSync):
            if x.phase in ("end", "wait") and not x.pending:
                return False
            continue
        if isinstance(x, Store) and x.buffer is acc:
            return True
        if any(_loads_buffer(e, acc) for e in stmt_exprs(x)):
            return True
    return False


def _loads_buffer(e, buf) -> bool:
    found: list = []
    walk_expr(e, lambda x: found.append(1) if isinstance(x, BufferLoad) and x.buffer is buf else None)
    return bool(found)


def _below(cond, k):
    """``E`` where ``cond`` is ``k < E`` (``E > k``) with ``E`` free of ``k``; else None (D74's two loops)."""
    from ..ir import free_vars

    def bare(x):
        return x.value if isinstance(x, Cast) else x

    if not isinstance(cond, Cmp) or cond.op not in ("lt", "gt"):
        return None
    v, e = (cond.a, cond.b) if cond.op == "lt" else (cond.b, cond.a)
    if bare(v) is not k or any(x is k for x in free_vars(e)):
        return None
    return e


def _if(cond, then, span):
    v = const_value(cond)
    if v is not None:
        return then if v else Seq([])
    return If(cond, then, span=span)


def collect_allocs(s) -> list:
    """Allocates of ``s`` outside parallel loops (block-level buffers)."""
    out: list = []

    def visit(x):
        if isinstance(x, Allocate):
            out.append(x)
        if isinstance(x, For) and x.kind in ("parallel", "vectorized"):
            return
        for c in (x.body if isinstance(x, Seq) else [getattr(x, f) for f in ("body", "then", "orelse")
                                                       if getattr(x, f, None) is not None]):
            visit(c)

    visit(s)
    return out


def _replace(s, table: dict):
    """``s`` with each statement whose id is in ``table`` replaced by its entry (top-down: what a
    replaced statement holds is not visited)."""
    if s is None:
        return None
    if id(s) in table:
        return table[id(s)]
    if isinstance(s, Seq):
        return Seq([_replace(c, table) for c in s.body], span=s.span)
    changes = {f: _replace(getattr(s, f), table) for f in ("body", "then", "orelse")
               if isinstance(getattr(s, f, None), Stmt)}
    return s.with_(**changes) if changes else s


def _without(s, loop):
    """``s`` with ``loop`` left out (to look at what lies outside it)."""
    return _replace(s, {id(loop): Seq([])})


@tile_pass("tilecore.plan_pipelines")
def plan_pipelines(func, ctx):
    """Multi-buffer the staged copies of ``T.Pipelined`` loops and issue them ahead as asynchronous copies."""
    if not enabled(ctx):
        return func
    notes: list = []

    def launch(s):
        if not isinstance(s, KernelLaunch):
            return None
        st = _Launch(s, ctx)
        inner: set = set()
        walk(s.body, lambda x: walk(x.body, lambda y: inner.add(id(y)))
             if isinstance(x, For) and x.kind in ("parallel", "vectorized") else None)
        loops = [x for x in _pipelined(s.body) if id(x) not in inner and int(x.annotations.get("num_stages", 0) or 0) >= 2]
        # a persistent tile loop (tilecore.persistent_tiles) holding a pipelined loop at its top level
        tiles = {}
        for t in collect(s.body, For):
            info = t.annotations.get(PERSISTENT)
            for x in (t.body.body if isinstance(t.body, Seq) else [t.body]) if info is not None else []:
                if isinstance(x, For) and x.kind == "pipelined":
                    tiles[id(x)] = (t, info)
        done: dict = {}
        for loop in loops:
            if id(loop) in inner:
                notes.append(f"loop {loop.var.name}: serialized (inside a pipelined loop)")
                continue
            tile = tiles.get(id(loop))
            st.carry, st.hoisted = (tile[1] if tile else None), []
            new, note = st.plan(loop)
            st.carry = None
            notes.append(note)
            if new is not None and tile is not None and st.hoisted:
                t = tile[0]  # the prologue once, before the tile loop
                done[id(t)] = seq(st.hoisted + [t.with_(body=_replace(t.body, {id(loop): new}))])
                walk(loop.body, lambda y: inner.add(id(y)))
            elif new is not None:
                done[id(loop)] = new
                walk(loop.body, lambda y: inner.add(id(y)))
        if not done:
            return None
        if lead_copies(ctx) is True:
            body0 = _lead_groups(s, done, ctx)
            if body0 is not s.body:
                s = s.with_(body=body0)
        body = _replace(s.body, done)
        body = rewrite(body, lambda x: Allocate(st.staged[id(x.buffer)], x.init, span=x.span)
                       if isinstance(x, Allocate) and id(x.buffer) in st.staged else None)
        allocs = [Allocate(b, span=s.span) for b in st.barriers]
        if st.producer is not None:  # the block's last group produces, the kernel's own threads consume
            inits, producer, loop = st.producer
            grouped = st.group_size > 1
            # D80: in block groups, every block's barriers initialised before any peer copies or arrives into it,
            # and no block ends while a peer may still do so (a group barrier after the init and at the end)
            body = seq(allocs + inits + [Barrier(span=loop.span)]
                       + ([GroupBarrier("sync", span=loop.span)] if grouped else [])
                       + [Specialized(seq(st.producer_binds + [producer]), body, st.consumers, span=loop.span)]
                       + ([GroupBarrier("sync", span=loop.span)] if grouped else []))
            attrs = {**s.attrs, "warp_specialized": True, "producer_threads": st.group}
            if grouped:
                attrs["block_group"] = (st.group_size,) + (1,) * (len(s.grid) - 1)
                attrs["block_group_by"] = "tilecore.group_multicast"  # the option that made the group (D84)
            return s.with_(body=body, threads=(st.consumers + st.group,), attrs=attrs)
        if allocs:
            body = seq(allocs + [body])
        return s.with_(body=body)

    body = rewrite(func.body, launch)
    return func.with_body(body, pipelines=tuple(notes)) if notes else func


def _eval_int(e, env: dict):
    """The integer value of index expression ``e`` with ``env`` (id(Var) -> int); None where it is not one."""
    if isinstance(e, IntImm):
        return int(e.value)
    if isinstance(e, Var):
        return env.get(id(e))
    if isinstance(e, Select):
        c = _eval_int(e.cond, env)
        return None if c is None else _eval_int(e.t if c else e.f, env)
    if isinstance(e, Cmp):
        a, b = _eval_int(e.a, env), _eval_int(e.b, env)
        ops = {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b} \
            if a is not None and b is not None else {}
        return int(ops[e.op]) if e.op in ops else None
    if isinstance(e, BinOp):
        a, b = _eval_int(e.a, env), _eval_int(e.b, env)
        if a is None or b is None:
            return None
        op = e.op
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "mul":
            return a * b
        if op == "floordiv":
            return a // b if b else None
        if op == "floormod":
            return a % b if b else None
        if op == "min":
            return min(a, b)
        if op == "max":
            return max(a, b)
    return None


def _walk_values(carry) -> list | None:
    """D80: the block indices of every tile of a persistent walk (``[tile] -> tuple``); None where one is not an
    integer expression of the tile's number."""
    out = []
    for t in range(carry.tiles):
        env = {id(carry.tile): t}
        row = tuple(_eval_int(e, env) for e in carry.indices)
        if any(v is None for v in row):
            return None
        out.append(row)
    return out


def _lead_groups(launch, done: dict, ctx):
    """D79 (tilecore.pipeline_lead_copies): the launch's body with the wait and barrier of a copy group right before a
    planned loop dropped, where the loop's first statements are a wait for the copy groups and a barrier (per-thread
    copies: the group, committed before the loop's prologue, is older than every group that wait may leave pending),
    the loop runs at least once, and nothing between the group and the loop touches block memory."""
    from .guard import facts_at

    shared = {id(a.buffer) for a in collect_allocs(launch.body) if a.buffer.scope == "shared"}

    def waits_first(new, var) -> bool:
        items = new.body if isinstance(new, Seq) else [new]
        if collect(new, BulkCopy) or collect(new, Specialized):
            return False
        loops = [x for x in items if isinstance(x, For) and x.var is var]
        if not loops:
            return False
        first = loops[0].body.body if isinstance(loops[0].body, Seq) else [loops[0].body]
        return len(first) >= 2 and isinstance(first[0], AsyncWait) and isinstance(first[1], Barrier)

    def fold(items: list) -> list:
        items = list(items)
        for i, item in enumerate(items):
            if id(item) not in done or not isinstance(item, For) or not waits_first(done[id(item)], item.var):
                continue
            facts = facts_at(launch, item)
            if facts is None or not facts.proves(compare("gt", item.extent, 0)):
                continue
            j = i - 1
            while j >= 2 and not (isinstance(items[j], Barrier) and isinstance(items[j - 1], AsyncWait)
                                  and items[j - 1].pending == 0 and isinstance(items[j - 2], AsyncCommit)):
                if _touched(items[j]) & shared or collect(items[j], Barrier) or collect(items[j], AsyncWait):
                    j = -1
                    break
                j -= 1
            if j >= 2:
                items[j - 1] = items[j] = None
        return [y for y in items if y is not None]

    def down(x):  # top-down, as _replace: the planned loops are found by identity
        if x is None or id(x) in done:
            return x
        if isinstance(x, Seq):
            return Seq([down(c) for c in fold(x.body)], span=x.span)
        changes = {f: down(getattr(x, f)) for f in ("body", "then", "orelse") if isinstance(getattr(x, f, None), Stmt)}
        return x.with_(**changes) if changes else x

    return down(launch.body)


def _pipelined(s) -> list:
    out: list = []
    walk(s, lambda x: out.append(x) if isinstance(x, For) and x.kind == "pipelined" else None)
    return out


__all__ = ["stage_pipelined_copies", "plan_pipelines", "async_copy_nest", "describe_copy", "map_expr", "map_stmt", "substitute"]
