"""Bounds guards on memory accesses, and the checked mode (``tilecore.guard_accesses``).

Safe mode (always on): a load or store of a *global* tensor whose indices cannot be proven inside
the tensor is guarded, as TileLang's ``legalize_safe_memory_access`` does: a store (or atomic) runs
only when every index ``d`` satisfies ``0 <= index_d < shape_d``; a load outside gives the dtype's
zero. A bound is proven (and its check left out) from static shapes and the ranges of loop
variables, block indices and bound scalars, and from the conditions of enclosing ``if`` statements
and ``T.if_then_else`` (see :mod:`tilecore.ir.bounds`). The same prover drops the comparisons of
existing ``if`` / ``T.if_then_else`` conditions (e.g. the tail guards of ``T.copy``) that always hold.

Checked mode (``tilecore.checked``, or ``TILECORE_CHECKED=1``): every access, of every scope, not
proven in bounds is preceded by an :class:`~tilecore.ir.Assert` that carries the indices and the
shape as ``values``, so the launch fails naming the buffer, the index and the user's line; the
access itself is also guarded, so a target whose failed assertion does not stop the thread does
not touch memory outside the buffer either.
"""
from __future__ import annotations

from ..ir import (Allocate, Assert, Assume, AsyncCopy, Specialized, Atomic, BinOp, Bind, BufferLoad, Call, Cast, Cmp, Expr, For, If,
                  KernelLaunch, Logic, PerThread, Print, Select, Seq, Store, VectorStore, as_expr, binary, compare, const, const_value, expr_str,
                  is_float, logic_and, simplify,
                  logic_not, logic_or)
from ..errors import MAX_FAULT_VALUES
from ..ir.bounds import Facts, thread_only
from . import tile_pass

#: index values plus shape values a checked-mode assertion reports (a buffer of up to 8 dimensions)
MAX_VALUES = MAX_FAULT_VALUES


def _bound_conds(buffer, indices, facts: Facts) -> list:
    """The comparisons ``0 <= idx`` / ``idx < dim`` that ``facts`` do not prove."""
    out = []
    for idx, dim in zip(indices, buffer.shape):
        for c in (compare("ge", idx, 0), compare("lt", idx, dim)):
            v = const_value(c)
            if v is None and not facts.proves(c):
                out.append(c)
            elif v is not None and not v:
                out.append(c)  # surely out of range: keep the (false) check
    return out


def _all(conds: list):
    out = as_expr(1, "bool")
    for c in conds:
        out = logic_and(out, c)
    return out


class _Guard:
    def __init__(self, checked: bool, prune_binds: bool = False, prune_false: bool = False):
        self.checked = checked
        self.prune_binds = prune_binds
        self.prune_false = prune_false

    def guarded(self, buffer) -> bool:
        return self.checked or buffer.scope == "global"

    # -- expressions: returns the new expression; checked-mode assertions go to `asserts` -----------
    def expr(self, e, facts: Facts, asserts: list, path, span):
        if not isinstance(e, Expr) or isinstance(e, BinOp) and thread_only(e):  # nothing to guard (D65)
            return e
        if isinstance(e, BufferLoad):
            idx = tuple(self.expr(i, facts, asserts, path, span) for i in e.indices)
            load = BufferLoad(e.buffer, idx) if any(a is not b for a, b in zip(idx, e.indices)) else e
            if not self.guarded(e.buffer):
                return load
            conds = _bound_conds(e.buffer, idx, facts)
            if not conds:
                return load
            self.report(asserts, "load", e.buffer, idx, conds, path, span)
            return Select(_all(conds), load, const(0, e.buffer.dtype))
        if isinstance(e, Select):
            c = self.cond(e.cond, facts, asserts, path, span)
            if const_value(c) is not None:
                return self.expr(e.t if const_value(c) else e.f, facts, asserts, path, span)
            t = self.expr(e.t, facts.with_cond(c), asserts, logic_and(path, c), span)
            f = self.expr(e.f, facts.with_cond(c, False), asserts, logic_and(path, logic_not(c)), span)
            return e if c is e.cond and t is e.t and f is e.f else Select(c, t, f)
        if isinstance(e, Logic) and e.op in ("and", "or"):
            a = self.expr(e.a, facts, asserts, path, span)
            holds = e.op == "and"  # `b` is evaluated only when `a` is true (and) / false (or)
            on_b = a if holds else logic_not(a)
            b = self.expr(e.b, facts.with_cond(a, holds), asserts, logic_and(path, on_b), span)
            return e if a is e.a and b is e.b else (logic_and if holds else logic_or)(a, b)
        if isinstance(e, (BinOp, Cmp, Logic)):
            a = self.expr(e.a, facts, asserts, path, span)
            b = self.expr(e.b, facts, asserts, path, span) if e.b is not None else None
            if a is e.a and b is e.b:
                return e
            if isinstance(e, BinOp):
                return BinOp(e.op, a, b, e.dtype)
            return Cmp(e.op, a, b) if isinstance(e, Cmp) else Logic(e.op, a, b)
        if isinstance(e, Cast):
            v = self.expr(e.value, facts, asserts, path, span)
            return e if v is e.value else Cast(e.dtype, v)
        if isinstance(e, Call):
            args = tuple(self.expr(a, facts, asserts, path, span) for a in e.args)
            return e if all(a is b for a, b in zip(args, e.args)) else Call(e.name, args, e.dtype, e.attrs)
        return e

    def cond(self, c, facts: Facts, asserts: list, path, span):
        """A branch condition with its loads guarded and the comparisons ``facts`` prove dropped."""
        c = self.expr(c, facts, asserts, path, span)
        return _prune(c, facts, self.prune_false)

    def report(self, asserts: list, what: str, buffer, idx, conds, path, span) -> None:
        if not self.checked or asserts is None:
            return
        ok = _all(conds)
        if const_value(path) != 1:
            ok = logic_or(logic_not(path), ok)
        n = len(idx)
        vals = (tuple(idx) + tuple(buffer.shape))[:MAX_VALUES]
        shown = min(n, MAX_VALUES)
        places = ", ".join(f"{{{k}}}" for k in range(shown))
        dims = ", ".join(f"{{{shown + k}}}" for k in range(min(n, MAX_VALUES - shown)))
        asserts.append(Assert(ok, f"checked mode: out-of-bounds {what} {buffer.name}[{places}]: {buffer.scope} "
                                  f"buffer {buffer.name} has shape ({dims}{',' if n == 1 else ''})", values=vals, span=span))

    # -- statements -----------------------------------------------------------------------------------
    def stmt(self, s, facts: Facts):
        if s is None:
            return None
        if isinstance(s, Seq):
            out = []
            for c in s.body:
                out.append(self.stmt(c, facts))
                if isinstance(c, Bind) and not is_float(c.var.dtype):  # later statements know its value
                    facts = facts.with_range(c.var, c.value, c.value)
                elif isinstance(c, Assume):  # and what the author promised
                    facts = facts.with_cond(c.cond)
            return Seq(out, span=s.span)
        if isinstance(s, KernelLaunch):
            return s.with_(body=self.stmt(s.body, launch_facts(s, facts)))
        asserts: list = []
        path = as_expr(1, "bool")
        if isinstance(s, For):
            start = self.expr(s.start, facts, asserts, path, s.span)
            extent = self.expr(s.extent, facts, asserts, path, s.span)
            out = s.with_(start=start, extent=extent)
            out = out.with_(body=self.stmt(s.body, loop_facts(out, facts) if not is_float(s.var.dtype) else facts))
        elif isinstance(s, If):
            c = self.cond(s.cond, facts, asserts, path, s.span)
            then = self.stmt(s.then, facts.with_cond(c))
            orelse = self.stmt(s.orelse, facts.with_cond(c, False))
            v = const_value(c)
            if v is not None:
                out = then if v else (orelse if orelse is not None else Seq([]))
            else:
                out = s.with_(cond=c, then=then, orelse=orelse)
        elif isinstance(s, (Store, Atomic)):
            idx = tuple(self.expr(i, facts, asserts, path, s.span) for i in s.indices)
            conds = _bound_conds(s.buffer, idx, facts) if self.guarded(s.buffer) else []
            if conds:
                self.report(asserts, "store" if isinstance(s, Store) else "atomic update", s.buffer, idx, conds,
                            path, s.span)
            # the value is computed only when the store happens
            value = self.expr(s.value, facts.with_cond(_all(conds)), asserts, logic_and(path, _all(conds)), s.span)
            out = s.with_(indices=idx, value=value)
            if conds:
                out = If(_all(conds), out, span=s.span)
        elif isinstance(s, VectorStore):
            # one access: kept where every element is proven inside the tensor, else its element stores
            # (each guarded on its own, as before tilecore.vectorize_stores)
            idx = tuple(self.expr(i, facts, asserts, path, s.span) for i in s.indices)
            # an access this pass does not guard (a shared tile's, outside checked mode) keeps its vector: its element
            # stores would not be guarded either (D65: the proofs were a fifth of the general GEMM's passes)
            if self.checked or self.guarded(s.buffer):
                last = idx[:-1] + (binary("add", idx[-1], s.lanes - 1),)
                # the last element is inside where the first is and both its index and the extent are multiples of
                # the run (x < b with x, b multiples of n: x + n - 1 < b)
                whole = facts.proves_multiple(idx[-1], s.lanes) and facts.proves_multiple(s.buffer.shape[-1], s.lanes)
                if self.checked or _bound_conds(s.buffer, idx, facts) or \
                        (not whole and _bound_conds(s.buffer, last, facts)):
                    return self.stmt(s.fallback, facts)
            values = tuple(self.expr(v, facts, asserts, path, s.span) for v in s.values)
            out = s.with_(indices=idx, values=values, fallback=self.stmt(s.fallback, facts))
        elif isinstance(s, PerThread):
            out = s.with_(body=self.stmt(s.body, facts))
        elif isinstance(s, Specialized):
            # the consumers are the block's first s.consumers threads (their thread index is below it)
            out = s.with_(producer=self.stmt(s.producer, facts),
                          consumer=self.stmt(s.consumer, facts.with_threads(s.consumers)))
        elif isinstance(s, AsyncCopy):
            # the source run's first and last elements must be inside the tensor, else the copy zero-fills;
            # a run starts at a multiple of its length, so in a last dimension of whole runs the first decides
            src = tuple(self.expr(i, facts, asserts, path, s.span) for i in s.src_indices)
            s = s.with_(pred=self.cond(s.pred, facts, asserts, path, s.span))
            inside = facts.with_cond(s.pred)
            conds = _bound_conds(s.src, src, inside)
            if s.elements > 1 and not inside.proves_multiple(s.src.shape[-1], s.elements):
                last = src[:-1] + (binary("add", src[-1], s.elements - 1),)
                conds += _bound_conds(s.src, last, inside)
            out = s.with_(src_indices=src, pred=logic_and(s.pred, _all(conds)) if conds else s.pred)
        elif isinstance(s, Bind) and s.var.dtype == "bool" and self.prune_binds:
            # a named condition (a mask's `valid = k * bn + j < seq`) drops the comparisons the facts prove, as a
            # branch's condition does: a select on it then folds (D55: the general path's FlashAttention kept
            # the edge test of every score, and the accumulators' initial values were moved in, not folded)
            out = s.with_(value=self.cond(s.value, facts, asserts, path, s.span))
        elif isinstance(s, Bind):
            out = s.with_(value=self.expr(s.value, facts, asserts, path, s.span))
        elif isinstance(s, Allocate) and s.init is not None:
            out = s.with_(init=self.expr(s.init, facts, asserts, path, s.span))
        elif isinstance(s, Assert):
            out = s.with_(cond=self.expr(s.cond, facts, asserts, path, s.span))
        elif isinstance(s, Assume):  # a promise, no code; checked mode checks it
            out = (Assert(s.cond, f"T.assume({expr_str(s.cond)}) does not hold", span=s.span) if self.checked
                   else Seq([]))
        elif isinstance(s, Print) and s.value is not None:
            out = s.with_(value=self.expr(s.value, facts, asserts, path, s.span))
        else:
            out = s  # Collectives, barriers, async commit/wait, break/continue: a backend's or nothing to check
        return Seq(asserts + [out], span=s.span) if asserts else out


def launch_facts(launch: KernelLaunch, facts: Facts | None = None) -> Facts:
    """``facts`` plus the ranges of ``launch``'s block indices (``[0, grid - 1]``) and of the thread index
    (``[0, threads - 1]``, where the block's size is static)."""
    facts = facts or Facts()
    for v, g in zip(launch.block_vars, launch.grid):
        facts = facts.with_range(v, as_expr(0), binary("sub", as_expr(g), 1))
    n = 1
    for t in getattr(launch, "threads", None) or ():
        t = const_value(simplify(as_expr(t)))
        n = n * t if isinstance(t, int) and n is not None else None
    return facts.with_threads(n) if n else facts


def loop_facts(loop: For, facts: Facts) -> Facts:
    """``facts`` plus the range of ``loop``'s variable."""
    return facts.with_range(loop.var, loop.start, binary("sub", binary("add", loop.start, loop.extent), 1))


def facts_at(root, target, facts: Facts | None = None) -> Facts | None:
    """What holds where statement ``target`` (found by identity inside ``root``) runs: the ranges of the
    enclosing loops and block indices, the conditions of enclosing ``if`` statements and the values of the
    scalars bound before it, and the ``T.assume`` promises made before it. None when ``target`` is not inside
    ``root``."""
    facts = facts or Facts()
    if root is target:
        return facts
    if isinstance(root, Seq):
        for c in root.body:
            found = facts_at(c, target, facts)
            if found is not None:
                return found
            if isinstance(c, Bind) and not is_float(c.var.dtype):
                facts = facts.with_range(c.var, c.value, c.value)
            elif isinstance(c, Assume):
                facts = facts.with_cond(c.cond)
        return None
    if isinstance(root, KernelLaunch):
        return facts_at(root.body, target, launch_facts(root, facts))
    if isinstance(root, For):
        return facts_at(root.body, target, loop_facts(root, facts) if not is_float(root.var.dtype) else facts)
    if isinstance(root, If):
        found = facts_at(root.then, target, facts.with_cond(root.cond))
        if found is None and root.orelse is not None:
            found = facts_at(root.orelse, target, facts.with_cond(root.cond, False))
        return found
    body = getattr(root, "body", None)
    return facts_at(body, target, facts) if body is not None else None


def guard_stmt(s, facts: Facts | None = None, checked: bool = False):
    """``s`` with its accesses guarded as the pass does, for a backend pass that takes statements out of
    the pipeline before ``tilecore.guard_accesses`` runs (``facts``: what holds where ``s`` sits)."""
    return _Guard(checked).stmt(s, facts or Facts())


#: an integer comparison's negation (``not (a >= b)`` is ``a < b``)
_NEGATED = {"ge": "lt", "gt": "le", "le": "gt", "lt": "ge"}


def _prune(c, facts: Facts, false: bool = False):
    """``c`` without the conjuncts that ``facts`` prove; ``false`` (``tilecore.prune_false_comparisons``): an
    integer comparison whose negation ``facts`` prove is false (a conjunction with it false)."""
    if isinstance(c, Logic) and c.op == "and":
        return logic_and(_prune(c.a, facts, false), _prune(c.b, facts, false))
    if isinstance(c, Cmp) and not is_float(c.a.dtype):
        if facts.proves(c):
            return as_expr(1, "bool")
        if false and c.op in _NEGATED and facts.proves(compare(_NEGATED[c.op], c.a, c.b)):
            return as_expr(0, "bool")
    return c


@tile_pass("tilecore.guard_accesses")
def guard_accesses(func, ctx):
    """Guard global accesses not proven in bounds; in checked mode, check every access (see module doc)."""
    checked = bool(ctx.option("tilecore.checked", False))
    want = ctx.option(PRUNE_BINDS, None)
    from .masksplit import measured_class

    prune = want is True or (want is None and measured_class(ctx))
    false = ctx.switch(PRUNE_FALSE, False, expected="True or False (the default)")
    return func.with_body(_Guard(checked, prune, false).stmt(func.body, Facts()), checked=checked)


#: pass config: a named condition (``valid = k * bn + j < seq``) drops the comparisons the facts prove, as branch
#: conditions do (D55; default: on targets of the class it was measured on, ``feature:bulk_tensor_copy``; True: any
#: target; False keeps the bind as written)
PRUNE_BINDS = "tilecore.prune_condition_binds"
#: pass config (D73): False (the default): a condition keeps the comparisons the prover shows false; True: they fold
#: to false, as those it shows true fold to true (a select on a proven-false test folds to its other value: TileLang's
#: non-causal mask ``T.if_then_else(k * bn + j >= seq, -inf, 0)`` where ``bn`` divides ``seq``)
PRUNE_FALSE = "tilecore.prune_false_comparisons"


__all__ = ["facts_at", "guard_accesses", "guard_stmt", "launch_facts", "loop_facts", "MAX_VALUES"]
