"""A pipelined loop's leading iterations without the masks that provably hold in them (decision D55).

``tilecore.split_masked_iterations`` (``tile-lowering`` slot, first: after a backend's whole-kernel passes, which
keep the kernels they take, before the fragments are put in registers). Causal attention masks every score of
every iteration::

    for k in T.Pipelined(T.ceildiv((bx + 1) * bm, bn), num_stages=2):
        ...
        for i, j in T.Parallel(bm, bn):
            acc_s[i, j] = T.if_then_else(bx * bm + i >= k * bn + j, 0, -T.infinity("float32"))

though only the blocks on the diagonal need it. For each ``T.Parallel`` nest at the top of the loop body whose
stores hold ``T.if_then_else`` masks on the loop variable ``k``, a conjunct of a mask condition that is an
integer comparison linear in ``k``, ``g = c k + rest >= 0`` with ``c < 0``, holds for every element of the nest
while ``k <= floor(min(rest) / -c)``, ``min(rest)`` being the prover's lower bound over the nest's variables
(:meth:`tilecore.ir.bounds.Facts.bound`): a block-level expression ``E`` (causal: ``floor((bx bm - bn + 1) / bn)
+ 1``). The nest becomes ``if k < E: <the nest without those conjuncts> else: <the nest>``: the same values
where the condition holds (exact), and in the leading iterations no compare or select per element. Conjuncts
increasing in ``k``, or not linear in it, stay in both. Found from the predicate, never from a name. A plugin's
whole-kernel register programs split their loop the same way (decision D30); this is the core's general path.

Pass config ``tilecore.split_masked_iterations``: by default on targets of the class the H100 measured it on
(``feature:bulk_tensor_copy``; D55: causal attention on the general path 363 -> 394 TFLOP/s); True on any target;
False keeps the nests as written.
"""
from __future__ import annotations

from ..ir import (Bind, For, If, Logic, Select, Seq, Store, binary, compare, const_value, logic_and, rewrite,
                  simplify, walk, walk_expr)
from ..ir.bounds import Facts, nonneg_forms
from . import tile_pass
from .pipeline import map_expr, substitute

OPTION = "tilecore.split_masked_iterations"
#: D55's defaults are on where they were measured: targets that copy whole tiles on transaction barriers (the
#: H100's class); elsewhere they are asked for with True
MEASURED_FEATURE = "feature:bulk_tensor_copy"


def measured_class(ctx) -> bool:
    """The target is of the class D55 measured (``feature:bulk_tensor_copy``)."""
    caps = getattr(ctx, "capabilities", None)
    return caps is not None and caps.satisfies(MEASURED_FEATURE)[0] is True


def mentions(e, var) -> bool:
    found: list = []
    walk_expr(e, lambda x: found.append(1) if x is var else None)
    return bool(found)


def mask_nest(s, outer: dict):
    """(a ``T.Parallel`` nest's loop variables with inclusive ranges, its binds by id with the values of ``outer``
    (the loop body's binds before it) substituted, its stores)."""
    ranges, binds, stores = [], dict(outer), []

    def visit(x):
        if isinstance(x, For):
            ranges.append((x.var, x.start, binary("sub", binary("add", x.start, x.extent), 1)))
        elif isinstance(x, Bind):
            binds[id(x.var)] = substitute(x.value, binds)
        elif isinstance(x, Store):
            stores.append(x)

    walk(s, visit)
    return ranges, binds, stores


def mask_end(cond, k, ranges):
    """An exclusive bound ``E`` on ``k`` (free of the nest's variables) below which ``cond`` holds for every
    element of the nest; None where ``cond`` is not a conjunction of integer comparisons, linear in ``k``, that
    hold up to some iteration."""
    forms = nonneg_forms(cond, True, exact=True)
    if not forms:
        return None
    inner = Facts()
    for v, lo, hi in ranges:
        inner = inner.with_range(v, lo, hi)
    ends = []
    for g in forms:  # g >= 0 with g = c k + rest
        g = simplify(g)
        c = const_value(simplify(binary("sub", substitute(g, {id(k): binary("add", k, 1)}), g)))
        if not isinstance(c, int) or c > 0:
            return None
        rest = simplify(binary("sub", g, binary("mul", k, c))) if c else g
        if mentions(rest, k):
            return None
        low = inner.bound(rest, False)
        if low is None or any(mentions(low, v) for v, _, _ in ranges):
            return None
        if c == 0:
            if not (isinstance(const_value(low), int) and const_value(low) >= 0):
                return None
            continue
        ends.append(simplify(binary("add", binary("floordiv", low, -c), 1)))  # c k + low >= 0 for k <= low / -c
    if not ends:
        return None
    end = ends[0]
    for e in ends[1:]:
        end = binary("min", end, e)
    return end


def conjuncts(c) -> list:
    if isinstance(c, Logic) and c.op == "and":
        return conjuncts(c.a) + conjuncts(c.b)
    return [c]


def mask_parts(cond, k, ranges) -> tuple:
    """(the ends of the conjuncts of ``cond`` that hold up to some iteration, the other conjuncts)."""
    ends, kept = [], []
    for c in conjuncts(cond):
        e = mask_end(c, k, ranges) if mentions(c, k) else None
        (kept if e is None else ends).append(c if e is None else e)
    return ends, kept


def unmask(value, k, ranges, binds, ends: list | None = None):
    """``value`` with each mask's conjuncts that hold up to some iteration left out (their ends added to
    ``ends`` where given; the mask replaced by its true side where none is left); ``value`` itself where there
    are none."""
    hit: list = []

    def fn(x):
        if not isinstance(x, Select):
            return None
        found, kept = mask_parts(substitute(x.cond, binds), k, ranges)
        if not found:
            return None
        hit.append(x)
        if ends is not None:
            ends.extend(found)
        if not kept:
            return x.t
        out = kept[0]
        for c in kept[1:]:
            out = logic_and(out, c)
        return Select(out, x.t, x.f)

    new = map_expr(value, fn)
    return new if hit else value


def split_loop_body(loop: For):
    """``(new loop, E)`` with the masked nests of ``loop``'s body under ``if k < E``, or None."""
    k = loop.var
    body = list(loop.body.body) if isinstance(loop.body, Seq) else [loop.body]
    outer: dict = {}
    ends: list = []
    parts = []
    for x in body:
        if isinstance(x, Bind):
            outer[id(x.var)] = substitute(x.value, outer)
        if isinstance(x, For) and x.kind == "parallel":
            ranges, binds, _ = mask_nest(x, outer)
            here: list = []
            hit: list = []

            def one(st, ranges=ranges, binds=binds, here=here, hit=hit):
                if isinstance(st, Store):
                    v = unmask(st.value, k, ranges, binds, here)
                    if v is not st.value:
                        hit.append(st)
                        return st.with_(value=v)
                return None

            new = rewrite(x, one)
            if hit:
                ends.extend(here)
                parts.append((x, new))
                continue
        parts.append((x, None))
    if not ends:
        return None
    end = ends[0]
    for e in ends[1:]:
        end = binary("min", end, e)
    end = simplify(end)
    cond = compare("lt", k, end)
    out = [x if new is None else If(cond, new, x, span=x.span) for x, new in parts]
    return loop.with_(body=Seq(out, span=loop.body.span)), end


@tile_pass("tilecore.split_masked_iterations")
def split_masked_iterations(func, ctx):
    """Masks on a pipelined loop's variable that hold for its leading iterations: those run without them."""
    want = ctx.option(OPTION, None)
    if want is False or (want is None and not measured_class(ctx)):
        return func
    notes: list = []

    def fix(s):
        if not (isinstance(s, For) and s.kind == "pipelined"):
            return None
        done = split_loop_body(s)
        if done is None:
            return None
        from ..ir.printer import expr_str

        notes.append(f"loop {s.var.name}: the iterations {s.var.name} < {expr_str(done[1])} run without the masks "
                     "that hold in them")
        return done[0]

    body = rewrite(func.body, fix)
    if not notes:
        return func
    return func.with_body(body, masked_split=tuple(notes))


__all__ = ["split_masked_iterations", "split_loop_body", "OPTION", "mask_nest", "mask_end", "mask_parts", "unmask", "conjuncts", "mentions"]
