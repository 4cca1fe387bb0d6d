"""The core's own passes (every target runs them)."""
from __future__ import annotations

from ..errors import CompileError, UnsupportedFeatureError
from ..ir import (Allocate, Assert, Assume, Atomic, Bind, BinOp, BufferLoad, Call, Expr, Region, Select, walk_expr, For, Hint,
                  If, KernelLaunch, Print, Seq, Specialized, Store, TileOp, children, collect, const_value, int_bounds,
                  loop_range,
                  rewrite, simplify, stmt_exprs, walk)
from . import tile_pass


@tile_pass("tilecore.check_structure")
def check_structure(func, ctx):
    """Device code must sit inside ``with T.Kernel(...)``: there is no host code in a kernel. A ``T.assume``
    before a ``T.Kernel`` (a promise about the parameters) moves into the body of every kernel after it."""
    top = func.body.body if isinstance(func.body, Seq) else [func.body]
    launches = 0
    promises: list = []
    out: list = []
    for s in top:
        if isinstance(s, KernelLaunch):
            launches += 1
            out.append(s.with_(body=Seq(promises + [s.body], span=s.body.span)) if promises else s)
        elif isinstance(s, Assume):
            promises.append(s)
        else:
            raise CompileError("statements outside `with T.Kernel(...)` are not supported: put all device "
                               "code in the kernel body", s.span or func.span)
    if not launches:
        raise CompileError(f"kernel {func.name} has no `with T.Kernel(...)` block", func.span)
    return func.with_body(Seq(out, span=getattr(func.body, "span", None))) if promises else func


@tile_pass("tilecore.check_extensions")
def check_extensions(func, ctx):
    """Refuse, at the user's line, a backend extension keyword (``T.copy(..., name=v)``, ``T.Kernel(...,
    name=v)``: plugin API 1.2) that the target's backend does not declare in ``op_extensions``, naming the
    installed backends that do accept it; check the value's type where it is declared."""
    hook = getattr(ctx.backend, "op_extensions", None)
    declared = {(e.op, e.name): e for e in (hook(ctx.target) if hook is not None else [])}

    def check(s):
        if isinstance(s, TileOp):
            op, what = s.op, f"T.{s.op}"
        elif isinstance(s, KernelLaunch):
            op, what = "Kernel", "T.Kernel"
        else:
            return
        for name, value in dict(s.attrs).get("extensions", ()):
            ext = declared.get((op, name))
            if ext is None:
                others = _extension_owners(op, name)
                where = (f"it is an extension of {', '.join(others)}; compile for one of those targets or remove it"
                         if others else "no installed backend declares it (a misspelled keyword?); remove it")
                raise UnsupportedFeatureError(
                    f"{what}(..., {name}={value!r}): target {ctx.target} (backend {ctx.target.backend}) does not "
                    f"accept the keyword argument `{name}` of {what}: {where}", s.span,
                    feature=f"extension:{op}.{name}", target=str(ctx.target))
            if ext.types and not isinstance(value, tuple(ext.types)):
                raise CompileError(f"{what}(..., {name}={value!r}): `{name}` takes "
                                   f"{' or '.join(t.__name__ for t in ext.types)} on {ctx.target} ({ext.doc})", s.span)

    walk(func.body, check)
    return func


def _extension_owners(op: str, name: str) -> list:
    """``backend (targets ...)`` for every installed backend declaring the extension ``op.name``."""
    from ..plugin import get_registry

    out = []
    for backend in get_registry().backends().values():
        hook = getattr(backend, "op_extensions", None)
        try:
            targets = [t for t in backend.targets()
                       if hook is not None and any(e.op == op and e.name == name
                                                   for e in hook(backend.parse_target(t)))]
        except Exception:  # noqa: BLE001 - a broken backend's listing is not this kernel's problem
            continue
        if targets:
            out.append(f"backend {backend.name} ({backend.distribution or backend.name}: {', '.join(targets)})")
    return out


@tile_pass("tilecore.check_static_bounds")
def check_static_bounds(func, ctx):
    """Refuse, at the user's line, an index into an on-chip buffer (shared, fragment, local, var) that is
    out of range for every value its loop and block variables can take (``s[20]`` on a 16-element
    buffer, ``s[i + 16]`` with ``i`` in 0..3, a tile-op region that always runs past the buffer's end).
    Only what is provable is refused: an index that may be in range compiles. Global tensors are not
    checked here (their accesses are guarded, or their shapes are known only at call time)."""
    ranges: dict = {}

    def check(s):
        accesses = []  # (buffer, starts, extents)
        if isinstance(s, (Store, Atomic)):
            accesses.append((s.buffer, s.indices, None))
        for f in getattr(s, "__dataclass_fields__", {}):
            v = getattr(s, f)
            for item in (v if isinstance(v, tuple) else (v,)):
                if isinstance(item, Region):
                    accesses.append((item.buffer, item.starts, item.extents))
                    for e in item.starts + item.extents:
                        walk_expr(e, lambda x: accesses.append((x.buffer, x.indices, None))
                                  if isinstance(x, BufferLoad) else None)
                elif isinstance(item, Expr) and not isinstance(s, (For, KernelLaunch)):
                    walk_expr(item, lambda x: accesses.append((x.buffer, x.indices, None))
                              if isinstance(x, BufferLoad) else None)
        for buf, starts, extents in accesses:
            if buf.scope != "global":
                _check_access(func, s, buf, starts, extents, ranges)

    def visit(s):
        if isinstance(s, For):
            for e in (s.start, s.extent):
                walk_expr(e, lambda x: _check_access(func, s, x.buffer, x.indices, None, ranges)
                          if isinstance(x, BufferLoad) and x.buffer.scope != "global" else None)
            r = loop_range(s.start, s.extent, ranges)
            if r is not None:
                ranges[id(s.var)] = r
        elif isinstance(s, KernelLaunch):
            for v, g in zip(s.block_vars, s.grid):
                r = loop_range(0, g, ranges)
                if r is not None:
                    ranges[id(v)] = r
        elif isinstance(s, Bind):
            r = int_bounds(s.value, ranges)
            if r is not None:
                ranges[id(s.var)] = r
        check(s)
        for c in children(s):
            visit(c)

    visit(func.body)
    return func


def _check_access(func, s, buf, starts, extents, ranges) -> None:
    for d, (start, dim) in enumerate(zip(starts, buf.shape)):
        n, lo_hi = const_value(dim), int_bounds(start, ranges)
        if not isinstance(n, int) or lo_hi is None:
            continue
        ext = int_bounds(extents[d], ranges) if extents is not None else (1, 1)
        if ext is None or ext[0] < 1:
            continue
        lo, hi = lo_hi
        if hi >= 0 and lo + ext[0] <= n:
            continue
        what = f"index {_show(start, lo, hi)}" if extents is None else \
            f"region {_show(start, lo, hi)}:+{_show(extents[d], *ext)}"
        dims = [str(const_value(x) if const_value(x) is not None else x) for x in buf.shape]
        shape = ", ".join(dims) + ("," if len(dims) == 1 else "")
        raise CompileError(
            f"{what} is always out of range for {buf.scope} buffer {buf.name} of shape ({shape}): dimension {d} "
            f"holds indices 0..{n - 1}. Fix the index or enlarge the buffer", s.span or func.span)


def _show(e, lo, hi) -> str:
    text = str(e)
    if lo == hi and text == str(lo):
        return text
    return f"{text} (from {lo} to {hi})" if lo != hi else f"{text} (= {lo})"


def _need(ctx, need: str, what: str, span, func) -> None:
    ok, why = ctx.capabilities.satisfies(need)
    if ok:
        return
    detail = why if ok is False else f"the profile does not declare it ({why})"
    raise UnsupportedFeatureError(
        f"kernel {func.name} uses {what}, which target {ctx.target} (capability profile "
        f"{ctx.capabilities.id}) does not support: {need} — {detail}. Pick a target that has it (see "
        "`tilecore targets show`) or change the kernel", span, feature=need, target=str(ctx.target))


@tile_pass("tilecore.check_capabilities")
def check_capabilities(func, ctx):
    """Refuse, at the user's line, any construct whose capability the target lacks."""
    for need in ctx.option("tilecore.require", ()) or ():
        _need(ctx, need, f"a required capability ({need})", func.span, func)
    for p in func.params:
        if p.buffer is not None:
            _need(ctx, f"dtype:{p.buffer.dtype}:storage", f"a {p.buffer.dtype} tensor ({p.name})", func.span, func)

    def check(s):
        if isinstance(s, Allocate):
            _need(ctx, f"dtype:{s.buffer.dtype}:storage", f"a {s.buffer.dtype} buffer ({s.buffer.name})", s.span, func)
            if s.buffer.scope == "shared":
                _need(ctx, "feature:shared_memory", "T.alloc_shared", s.span, func)
        elif isinstance(s, KernelLaunch):
            n = 1
            for t in s.threads:
                n *= t
            lim = ctx.capabilities.limit("max_threads_per_block")
            if lim is not None and lim[1] == "max" and n > lim[0]:
                raise UnsupportedFeatureError(
                    f"T.Kernel asks for {n} threads per block; target {ctx.target} allows at most {int(lim[0])}",
                    s.span, feature="limit:max_threads_per_block", target=str(ctx.target))
        elif isinstance(s, TileOp) and s.op == "gemm":
            for r in s.args[:2]:
                _need(ctx, f"dtype:{r.buffer.dtype}:mma", f"T.gemm on {r.buffer.dtype} operands", s.span, func)
        elif isinstance(s, (Atomic, TileOp)) and (isinstance(s, Atomic) or s.op == "atomic"):
            buf = s.buffer if isinstance(s, Atomic) else s.args[1].buffer
            _need(ctx, "feature:atomics", "atomic operations", s.span, func)
            _need(ctx, f"dtype:{buf.dtype}:atomic_add", f"atomics on {buf.dtype}", s.span, func)
        elif isinstance(s, Print):
            _need(ctx, "feature:printf", "T.print", s.span, func)
        elif isinstance(s, Assert):
            _need(ctx, "feature:device_assert", "T.device_assert", s.span, func)
        for value in stmt_exprs(s):
            for d in sorted(_arith_dtypes(value)):
                _need(ctx, f"dtype:{d}:arith", f"arithmetic on {d}", s.span, func)
            for e in _find_calls(value, None):
                rounding = dict(e.attrs).get("rounding")
                if rounding not in (None, "rn"):
                    _need(ctx, f"feature:rounding_{rounding}", f"T.{e.name}(rounding={rounding!r})", s.span, func)

    walk(func.body, check)
    return func



def _arith_dtypes(e) -> set:
    """Dtypes in which ``e`` computes (operators and intrinsic calls)."""
    out: set = set()
    walk_expr(e, lambda x: out.add(str(x.dtype)) if isinstance(x, (BinOp, Call, Select)) else None)
    return out


def _find_calls(e, name) -> list:
    """Intrinsic calls in ``e`` named ``name`` (all calls when ``name`` is None)."""
    out: list = []
    walk_expr(e, lambda x: out.append(x) if isinstance(x, Call) and (name is None or x.name == name) else None)
    return out


@tile_pass("tilecore.collect_hints")
def collect_hints(func, ctx):
    """Move ``T.use_swizzle`` / ``T.annotate_layout`` hints into function attributes for backends."""
    hints: list = []

    def take(s):
        if isinstance(s, Hint):
            hints.append({"kind": s.kind, **{k: getattr(v, "name", v) for k, v in s.payload.items()}})
            return Seq([])
        return None

    body = rewrite(func.body, take)
    return func.with_body(body, hints=tuple(tuple(sorted((k, str(v)) for k, v in h.items())) for h in hints))


@tile_pass("tilecore.serialize_pipelined")
def serialize_pipelined(func, ctx):
    """Run ``T.Pipelined`` loops that no backend pass pipelined as ordinary serial loops."""

    def fix(s):
        if isinstance(s, For) and s.kind == "pipelined":
            return s.with_(kind="serial")
        return None

    return func.with_body(rewrite(func.body, fix))


def block_allocations(stmt) -> list:
    """The allocations a block's threads share: those at block level, reached through sequences, serial
    loops and branches but not inside a ``parallel``/``vectorized`` loop (those are private to an
    iteration, i.e. a thread), nor ``register`` buffers (a thread's own), nor inside a block-wide operation
    (which owns its storage). Thread
    distribution (``tilecore.simt_distribute``) hoists exactly these into block memory, and the C
    backend keeps them in the block's frame."""
    out: list = []

    def visit(s):
        if s is None:
            return
        if isinstance(s, Seq):
            for c in s.body:
                visit(c)
        elif isinstance(s, Allocate):
            if s.buffer.scope != "register":  # a fragment in registers: each thread's own array
                out.append(s)
        elif isinstance(s, For) and s.kind not in ("parallel", "vectorized"):
            visit(s.body)
        elif isinstance(s, If):
            visit(s.then)
            visit(s.orelse)
        elif isinstance(s, Specialized):  # (the producer allocates nothing)
            visit(s.consumer)

    visit(stmt)
    return out


def onchip_limit(ctx) -> float:
    """The target's on-chip block memory in bytes (``max_shared_bytes_per_block``), ``inf`` where the
    profile declares none: what a pass that sizes buffers (e.g. pipeline stages) plans against."""
    lim = ctx.capabilities.limit("max_shared_bytes_per_block")
    return float(lim[0]) if lim is not None and lim[1] == "max" else float("inf")


#: every block buffer starts on a 16-byte boundary (the emitters' carve-outs align them so)
BLOCK_ALIGN = 16


@tile_pass("tilecore.plan_memory")
def plan_memory(func, ctx):
    """Count each kernel's on-chip block memory and check it against the target's limit.

    Every buffer the block's threads share counts (:func:`block_allocations`: shared tiles, and the
    fragments and locals allocated at block level, which the generic lowering keeps in block memory),
    each rounded up to 16 bytes, after the backend's passes of the earlier slots (a backend that puts a
    fragment in registers has replaced its allocation by then). Records ``shared_bytes`` (the largest
    kernel's total) in ``func.attrs``."""
    worst = 0
    lim = ctx.capabilities.limit("max_shared_bytes_per_block")
    for launch in collect(func.body, KernelLaunch):
        sized = []
        for a in block_allocations(launch.body):
            n = const_value(simplify(a.buffer.numel()))
            if n is not None:
                sized.append((a.buffer, -(-max(int(n), 1) * a.buffer.dtype.bytes // BLOCK_ALIGN) * BLOCK_ALIGN))
        # a buffer over others dead by then (Allocate.reuses, D75) takes no memory of its own where they hold it
        allocs = {id(a.buffer): a for a in block_allocations(launch.body)}
        by_name = {b.name: n for b, n in sized if not allocs[id(b)].reuses}
        over: dict = {}  # the buffers over each set of dead ones, one after another
        for b, n in sized:
            if allocs[id(b)].reuses:
                over.setdefault(tuple(sorted(allocs[id(b)].reuses)), []).append(n)
        held = {key for key, ns in over.items() if all(r in by_name for r in key) and sum(by_name[r] for r in key) >= sum(ns)}
        sized = [(b, n) for b, n in sized if tuple(sorted(allocs[id(b)].reuses)) not in held]
        total = sum(b for _, b in sized)
        worst = max(worst, total)
        if lim is not None and lim[1] == "max" and total > lim[0]:
            biggest = sorted(sized, key=lambda x: -x[1])
            parts = ", ".join(f"{b.name} {n} B {b.scope}" for b, n in biggest[:6])
            more = f" and {len(biggest) - 6} more" if len(biggest) > 6 else ""
            raise UnsupportedFeatureError(
                f"kernel {func.name} needs {total} bytes of on-chip block memory per block ({parts}{more}); target "
                f"{ctx.target} allows {int(lim[0])} (limit max_shared_bytes_per_block). Use smaller tiles or "
                "fewer stages", launch.span, feature="limit:max_shared_bytes_per_block", target=str(ctx.target))
    return func.with_body(func.body, shared_bytes=worst)


@tile_pass("tilecore.verify_lowered")
def verify_lowered(func, ctx):
    """Codegen sees no tile ops and no hints: every one was lowered by some intrinsic."""

    def check(s):
        if isinstance(s, (TileOp, Hint, Assume)):
            raise CompileError(f"internal: {type(s).__name__} {getattr(s, 'op', getattr(s, 'kind', ''))} "
                               "survived lowering; please report this with TILECORE_DUMP_IR output", s.span)

    walk(func.body, check)
    return func


__all__ = ["check_structure", "check_static_bounds", "check_capabilities", "collect_hints", "serialize_pipelined", "plan_memory",
           "block_allocations", "onchip_limit", "verify_lowered"]
