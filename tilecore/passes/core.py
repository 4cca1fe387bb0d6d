"""The core's own passes (every target runs them)."""
from __future__ import annotations

from ..errors import CompileError, UnsupportedFeatureError
from ..ir import (Allocate, Assert, Atomic, BinOp, Call, Expr, Select, walk_expr, For, Hint, KernelLaunch, Print,
                  Seq, Store, TileOp, collect, const_value, rewrite, walk)
from . import tile_pass


@tile_pass("tilecore.check_structure")
def check_structure(func, ctx):
    """Device code must sit inside ``with T.Kernel(...)``: there is no host code in a kernel."""
    top = func.body.body if isinstance(func.body, Seq) else [func.body]
    launches = 0
    for s in top:
        if isinstance(s, KernelLaunch):
            launches += 1
        else:
            raise CompileError("statements outside `with T.Kernel(...)` are not supported: put all device "
                               "code in the kernel body", s.span or func.span)
    if not launches:
        raise CompileError(f"kernel {func.name} has no `with T.Kernel(...)` block", func.span)
    return func


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
        for value in _stmt_exprs(s):
            for d in sorted(_arith_dtypes(value)):
                _need(ctx, f"dtype:{d}:arith", f"arithmetic on {d}", s.span, func)
            for e in _find_calls(value, None):
                rounding = dict(e.attrs).get("rounding")
                if rounding not in (None, "rn"):
                    _need(ctx, f"feature:rounding_{rounding}", f"T.{e.name}(rounding={rounding!r})", s.span, func)

    walk(func.body, check)
    return func


def _stmt_exprs(s) -> list:
    """The expressions a statement holds directly (not those of nested statements)."""
    out = []
    for f in getattr(s, "__dataclass_fields__", {}):
        v = getattr(s, f)
        for item in (v if isinstance(v, tuple) else (v,)):
            if isinstance(item, Expr):
                out.append(item)
    return out


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


@tile_pass("tilecore.plan_memory")
def plan_memory(func, ctx):
    """Sum each kernel's static on-chip allocations and check them against the target's limit."""
    worst = 0
    for launch in collect(func.body, KernelLaunch):
        total = 0
        for a in collect(launch.body, Allocate):
            if a.buffer.scope != "shared":
                continue
            n = const_value(a.buffer.numel())
            if n is not None:
                total += n * a.buffer.dtype.bytes
        worst = max(worst, total)
        lim = ctx.capabilities.limit("max_shared_bytes_per_block")
        if lim is not None and lim[1] == "max" and total > lim[0]:
            raise UnsupportedFeatureError(
                f"kernel {func.name} allocates {total} bytes of shared memory per block; target {ctx.target} "
                f"allows {int(lim[0])} (limit max_shared_bytes_per_block). Use smaller tiles or fewer stages",
                launch.span, feature="limit:max_shared_bytes_per_block", target=str(ctx.target))
    return func.with_body(func.body, shared_bytes=worst)


@tile_pass("tilecore.verify_lowered")
def verify_lowered(func, ctx):
    """Codegen sees no tile ops and no hints: every one was lowered by some intrinsic."""

    def check(s):
        if isinstance(s, (TileOp, Hint)):
            raise CompileError(f"internal: {type(s).__name__} {getattr(s, 'op', getattr(s, 'kind', ''))} "
                               "survived lowering; please report this with TILECORE_DUMP_IR output", s.span)

    walk(func.body, check)
    return func


__all__ = ["check_structure", "check_capabilities", "collect_hints", "serialize_pipelined", "plan_memory",
           "verify_lowered"]
