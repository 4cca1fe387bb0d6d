"""Vector stores of a thread's registers (``tilecore.vectorize_stores``, ``memory`` slot, before the guards).

A fragment in registers is stored element by element by its per-thread program (``tilecore.lower_fragments``):
register ``r`` of the thread goes to the element its layout assigns to ``r``. Where a layout keeps a run of
consecutive elements of a row in consecutive registers (:meth:`~tilecore.layout.FragmentLayout.contiguous_regs`:
2 for the mma.sync / wgmma accumulators, more for a blocked layout), the stores of that run write consecutive
addresses one after the other. This pass folds such a run of ``n`` element stores (n = 2, 4 or 8, at most 16
bytes) into one :class:`~tilecore.ir.VectorStore` when

- the stores are consecutive statements of a per-thread program (only scalar bindings between them), to one
  global tensor, element ``k`` of the run at the first one's last index plus ``k`` (the other indices equal);
- the prover (:class:`~tilecore.ir.bounds.Facts`: the bound scalars, block and thread ranges, enclosing
  conditions and ``T.assume`` promises) shows the first element's flat offset is a multiple of ``n`` (the
  address is aligned to the vector's bytes, the tensor's base being 16-byte aligned: the backend's launch
  checks that where it spells vectors);
- every store of the run happens under the same condition: no condition, the same one, or tail guards
  ``x + k < b`` / ``x + k >= b`` whose ``x`` and ``b`` are proven multiples of ``n`` (then ``x + k < b``
  exactly when ``x < b``, for every ``k < n``).

The same rules fold a block-level copy into global memory (D47): a nest of ``parallel`` loops whose body is one
element store to a global tensor (under the copy's tail guard, or none), its value reading no global memory (the
shared -> global copy of ``T.copy(C_shared, C[...])``, a fill), is rewritten so that each iteration of its
innermost loop stores ``n`` consecutive elements as one vector (that loop's extent divided by ``n``), where the
extent and start are multiples of ``n`` and the run passes the checks above for every iteration. Where the values
are ``n`` consecutive elements of one block buffer (a shared tile, or a fragment the generic lowering keeps in
block memory) of the stored dtype, the first's offset proven a multiple of ``n``, the vector says so
(``vector_load``: the emitter may read them as one access too). A value that reads global memory keeps element
stores (its loads would stay element loads, each thread's ``n`` of them at a stride).

Anything else stays as element stores (a ragged edge whose bound is not a multiple of ``n``, an odd row
length that leaves the offset unaligned, a dynamic shape without ``T.assume``). Runs are taken greedily, the
widest first. The vector keeps the element stores as its ``fallback`` (emitters without a vector spelling
emit those; ``tilecore.guard_accesses`` goes back to them where it cannot prove the whole run in bounds).
The pass runs where the target's emitter says it spells vectors (``vector_stores = True``, the SIMT C++
emitter's default; the shading-language and plain C emitters do not say it), and not in checked mode (each element keeps its own check). ``tilecore.vectorize`` = False in ``pass_configs``
turns it off.
"""
from __future__ import annotations

from ..ir import (Assume, BinOp, Bind, BufferLoad, Call, Cast, Cmp, For, If, KernelLaunch, Logic, MatrixStore, PerThread,
                  Select, Seq, Specialized, Store, Var, VectorStore, as_expr, binary, const_value, is_float, loop_nest,
                  simplify, walk_expr)
from ..ir.bounds import Facts, thread_only
from ..ir.thread_values import thread_values
from . import tile_pass
from .core import block_allocations
from .guard import launch_facts, loop_facts

#: the widest vector access, in bytes
MAX_BYTES = 16
LANES = (8, 4, 2)


def _inline(e, env: dict):
    """``e`` with every bound scalar replaced by its (inlined) value (``e`` itself where it has none: the same
    object, which :func:`_diff` and simplify's memo know again, D65)."""
    if isinstance(e, Var):
        return env.get(id(e), e)
    if isinstance(e, BinOp) and thread_only(e):  # nothing to replace (remembered by identity)
        return e
    if isinstance(e, (BinOp, Cmp)):
        a, b = _inline(e.a, env), _inline(e.b, env)
        if a is e.a and b is e.b:
            return e
        return BinOp(e.op, a, b, e.dtype) if isinstance(e, BinOp) else Cmp(e.op, a, b)
    if isinstance(e, Logic):
        a, b = _inline(e.a, env), _inline(e.b, env) if e.b is not None else None
        return e if a is e.a and b is e.b else Logic(e.op, a, b)
    if isinstance(e, Select):
        c, t, f = _inline(e.cond, env), _inline(e.t, env), _inline(e.f, env)
        return e if c is e.cond and t is e.t and f is e.f else Select(c, t, f)
    if isinstance(e, Cast):
        v = _inline(e.value, env)
        return e if v is e.value else Cast(e.dtype, v)
    if isinstance(e, Call):
        args = tuple(_inline(a, env) for a in e.args)
        return e if all(x is y for x, y in zip(args, e.args)) else Call(e.name, args, e.dtype, e.attrs)
    if isinstance(e, BufferLoad):
        idx = tuple(_inline(i, env) for i in e.indices)
        return e if all(x is y for x, y in zip(idx, e.indices)) else BufferLoad(e.buffer, idx)
    return e


def _multiple(facts: Facts, e, n: int) -> bool:
    """The prover's answer: ``e`` is a multiple of ``n`` (one place, so a mutation test can break it)."""
    return facts.proves_multiple(e, n)


def _diff(a, b):
    """``a - b`` as a constant, or None."""
    (x, i), (y, j) = _offset(a), _offset(b)
    if x is y:  # the same expression plus constants (a fragment's registers: one thread part, D65)
        return i - j
    return const_value(simplify(binary("sub", a, b)))


def _offset(e):
    """``(x, k)`` with ``e`` spelled ``x + k``, ``k`` an integer constant (0 where it has none)."""
    if isinstance(e, BinOp) and e.op == "add" and not is_float(e.dtype):
        k = const_value(e.b)
        if isinstance(k, int):
            return e.a, k
    k = const_value(e)
    if isinstance(k, int):
        return None, k
    return e, 0


def _conjuncts(c) -> list:
    if isinstance(c, Logic) and c.op == "and":
        return _conjuncts(c.a) + _conjuncts(c.b)
    return [c]


def _flat(indices, shape):
    flat, stride = None, None
    for idx, dim in reversed(list(zip(indices, shape))):
        term = idx if stride is None else binary("mul", idx, stride)
        flat = term if flat is None else binary("add", flat, term)
        stride = dim if stride is None else binary("mul", stride, dim)
    return flat


class _Candidate:
    """One element store of a run: the statement (``If(cond, Store)`` or ``Store``), its store, its condition
    and its indices and condition with the bound scalars inlined."""

    def __init__(self, stmt, store: Store, cond, env: dict):
        self.stmt, self.store, self.cond = stmt, store, cond
        self.idx = tuple(_inline(i, env) for i in store.indices)
        self.icond = _inline(cond, env) if cond is not None else None
        # the elements of the stored tensor its value reads (indices inlined)
        root = store.buffer.base or store.buffer
        self.reads: list = []
        walk_expr(store.value, lambda x: self.reads.append(tuple(_inline(i, env) for i in x.indices))
                  if isinstance(x, BufferLoad) and (x.buffer.base or x.buffer) is root else None)


def _candidate(s, env: dict, shared_ok=frozenset()):
    cond = None
    if isinstance(s, If) and s.orelse is None:
        cond, body = s.cond, s.then
        while isinstance(body, Seq) and len(body.body) == 1:
            body = body.body[0]
        s_store = body
    else:
        s_store = s
    if not isinstance(s_store, Store):
        return None
    b = s_store.buffer
    if b.scope != "global" and id(b) not in shared_ok or not b.shape or b.dtype.bytes * 2 > MAX_BYTES:
        return None
    return _Candidate(s, s_store, cond, env)


def _same_cond(first: _Candidate, other: _Candidate, k: int, n: int, facts: Facts) -> bool:
    """``other`` (the run's element ``k``) is stored exactly when ``first`` is."""
    if first.icond is None or other.icond is None:
        return first.icond is None and other.icond is None
    a, b = _conjuncts(first.icond), _conjuncts(other.icond)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if not (isinstance(x, Cmp) and isinstance(y, Cmp) and x.op == y.op):
            if _diff_bool(x, y):
                continue
            return False
        dl, dr = _diff(y.a, x.a), _diff(y.b, x.b)
        if dl == 0 and dr == 0:
            continue
        if x.op not in ("lt", "ge") or dr != 0 or dl is None or not 0 <= dl < n:
            return False
        # x + d < b  <=>  x < b (and the same for >=) when x and b are multiples of n and 0 <= d < n
        if not (_multiple(facts, x.a, n) and _multiple(facts, x.b, n)):
            return False
    return True


def _diff_bool(x, y) -> bool:
    from ..ir import expr_str

    return expr_str(simplify(x)) == expr_str(simplify(y))


def _run_at(cands: list, p: int, facts: Facts):
    """The widest vector run starting at ``cands[p]``: its length (1: none)."""
    first = cands[p]
    buf = first.store.buffer
    for n in LANES:
        if n * buf.dtype.bytes > MAX_BYTES or p + n > len(cands):
            continue
        ok = True
        for k in range(1, n):
            c = cands[k + p]
            if c is None or c.store.buffer is not buf or len(c.idx) != len(first.idx):
                ok = False
                break
            if any(_diff(x, y) != 0 for x, y in zip(c.idx[:-1], first.idx[:-1])) or _diff(c.idx[-1], first.idx[-1]) != k:
                ok = False
                break
            if not _same_cond(first, c, k, n, facts):
                ok = False
                break
        # the vector computes every value before it writes: a value may read the tensor it writes only at its
        # own element (C = C + acc), which no other store of the run writes
        if ok and any(r is None or len(r) != len(c.idx) or any(_diff(x, y) != 0 for x, y in zip(r, c.idx))
                      for c in cands[p:p + n] for r in c.reads):
            ok = False
        if ok and _multiple(facts, _flat(first.idx, buf.shape), n):
            return n
    return 1


def _vectorize_seq(body: list, facts: Facts, shared_ok=frozenset()) -> list:
    """One per-thread statement list with its runs of element stores folded."""
    env: dict = {}
    # group: the statements, with each candidate store's position; binds between stores of a run move before it
    out: list = []
    i = 0
    while i < len(body):
        s = body[i]
        if isinstance(s, Bind) and not is_float(s.var.dtype):
            env[id(s.var)] = _inline(s.value, env)
            facts = facts.with_range(s.var, s.value, s.value)
            out.append(s)
            i += 1
            continue
        if isinstance(s, Assume):
            facts = facts.with_cond(s.cond)
            out.append(s)
            i += 1
            continue
        first = _candidate(s, env, shared_ok)
        if first is None:
            out.append(s)
            i += 1
            continue
        # the following candidates, with only integer binds between them (their facts and values noted)
        cands, binds, j, envj, factsj = [first], [], i + 1, dict(env), facts
        while j < len(body) and len(cands) < LANES[0]:
            t = body[j]
            if isinstance(t, Bind) and not is_float(t.var.dtype):
                envj[id(t.var)] = _inline(t.value, envj)
                factsj = factsj.with_range(t.var, t.value, t.value)
                binds.append(t)
                j += 1
                continue
            c = _candidate(t, envj, shared_ok)
            if c is None:
                break
            cands.append(c)
            j += 1
        n = _run_at(cands, 0, facts.with_cond(first.cond) if first.cond is not None else facts)
        if n == 1:
            out.append(s)
            i += 1
            continue
        # the run: every bind up to its last store first, then one vector store under the first's condition
        last = cands[n - 1].stmt
        k = i + 1
        while body[k] is not last:
            t = body[k]
            if isinstance(t, Bind):
                env[id(t.var)] = _inline(t.value, env)
                facts = facts.with_range(t.var, t.value, t.value)
                out.append(t)
            k += 1
        stores = [c.store for c in cands[:n]]
        vec = VectorStore(first.store.buffer, first.store.indices, tuple(x.value for x in stores),
                          Seq(list(stores), span=first.store.span), span=first.store.span)
        out.append(If(first.cond, vec, span=s.span) if first.cond is not None else vec)
        i = k + 1
    return out


def _reads_global(e) -> bool:
    found: list = []
    walk_expr(e, lambda x: found.append(x) if isinstance(x, BufferLoad) and x.buffer.scope == "global" else None)
    return bool(found)


def _contiguous_load(values, n: int, facts: Facts, dtype, block: set) -> bool:
    """The values are ``n`` consecutive elements of one block buffer (``block``: the launch's
    :func:`~tilecore.passes.core.block_allocations`, each 16-byte aligned, BLOCK_ALIGN) of ``dtype``, the first's
    offset a multiple of ``n``: one aligned read."""
    first = values[0]
    if not (isinstance(first, BufferLoad) and id(first.buffer) in block and first.buffer.base is None
            and first.buffer.dtype == dtype):
        return False
    for k, v in enumerate(values):
        if not (isinstance(v, BufferLoad) and v.buffer is first.buffer):
            return False
        if any(_diff(x, y) != 0 for x, y in zip(v.indices[:-1], first.indices[:-1])) or \
                _diff(v.indices[-1], first.indices[-1]) != k:
            return False
    return _multiple(facts, _flat(first.indices, first.buffer.shape), n)


def _vectorize_nest(loop: For, facts: Facts, block: set):
    """A block-level nest of parallel loops storing one element per iteration to global memory, its innermost
    loop rewritten to store ``n`` consecutive elements per iteration as one vector (module doc); None: as it is."""
    from .pipeline import substitute  # one expression substitution for the core's passes

    loops, inner = loop_nest(loop, ("parallel",))
    last = loops[-1]
    extent, start = const_value(last.extent), const_value(last.start)
    proto = _candidate(inner, {})
    if extent is None or start is None or proto is None or _reads_global(proto.store.value):
        return None
    if proto.cond is not None and _reads_global(proto.cond):
        return None
    outer = facts
    for f in loops[:-1]:
        outer = loop_facts(f, outer)
    dt = proto.store.buffer.dtype
    for n in LANES:
        if n * dt.bytes > MAX_BYTES or extent % n or start % n:
            continue
        jv = Var(f"{last.var.name}_v", last.var.dtype)
        vloop = For(jv, as_expr(0), as_expr(extent // n), "parallel", None, span=last.span)
        fv = loop_facts(vloop, outer)
        base = binary("add", as_expr(start), binary("mul", jv, n))
        stmts = [substitute(inner, {id(last.var): simplify(binary("add", base, k))}) for k in range(n)]
        cands = [_candidate(x, {}) for x in stmts]
        first = cands[0]
        if _run_at(cands, 0, fv.with_cond(first.icond) if first.icond is not None else fv) != n:
            continue
        values = tuple(c.store.value for c in cands)
        inside = fv.with_cond(first.icond) if first.icond is not None else fv
        vec = VectorStore(first.store.buffer, first.store.indices, values,
                          Seq([c.store for c in cands], span=first.store.span), span=first.store.span,
                          vector_load=_contiguous_load(values, n, inside, dt, block))
        body = If(first.cond, vec, span=inner.span) if first.cond is not None else vec
        new = vloop.with_(body=body)
        for f in reversed(loops[:-1]):
            new = f.with_(body=new)
        return new
    return None


class _Pass:
    def __init__(self, shared_ok=frozenset()):
        # shared tiles whose runs are vectorized too: a bulk store's tile (tilecore.bulk_store, D46), row-major or
        # swizzled by 16-byte units without padding, its rows whole 16-byte units: a run of at most 16 bytes whose
        # logical offset is a multiple of its length stays inside one 16-byte unit, which a swizzle moves whole
        self.shared_ok = shared_ok
        self.block: set = set()  # the current launch's block buffers (16-byte aligned)
        self.nested = False  # inside a parallel loop: no nest of its own is folded

    def stmt(self, s, facts: Facts, inside: bool):
        if s is None:
            return None
        if isinstance(s, Seq):
            body, f = [], facts
            for c in s.body:  # each statement knows the binds and promises before it
                body.append(self.stmt(c, f, inside))
                f = _facts_through([c], f)
            if inside:
                body = _vectorize_seq(body, facts, self.shared_ok)
            return Seq(body, span=s.span)
        if isinstance(s, KernelLaunch):
            self.block = {id(a.buffer) for a in block_allocations(s.body)}
            return s.with_(body=self.stmt(s.body, launch_facts(s, facts), inside))
        if isinstance(s, For):
            if s.kind in ("parallel", "vectorized") and not inside:
                vec = _vectorize_nest(s, facts, self.block) if s.kind == "parallel" and not self.nested else None
                if vec is not None:
                    return vec
                outer, self.nested = self.nested, True
                body = self.stmt(s.body, loop_facts(s, facts), inside)
                self.nested = outer
                return s.with_(body=body)
            f = loop_facts(s, facts) if not is_float(s.var.dtype) else facts
            return s.with_(body=self.stmt(s.body, f, inside))
        if isinstance(s, If):
            return s.with_(then=self.stmt(s.then, facts.with_cond(s.cond), inside),
                           orelse=self.stmt(s.orelse, facts.with_cond(s.cond, False), inside))
        if isinstance(s, PerThread):
            body = s.body if isinstance(s.body, Seq) else Seq([s.body], span=s.span)
            return s.with_(body=self.stmt(body, facts, True))
        if isinstance(s, Specialized):
            return s.with_(producer=self.stmt(s.producer, facts, inside), consumer=self.stmt(s.consumer, facts, inside))
        return s


def _facts_through(stmts, facts: Facts) -> Facts:
    for c in stmts:
        if isinstance(c, Bind) and not is_float(c.var.dtype):
            facts = facts.with_range(c.var, c.value, c.value)
        elif isinstance(c, Assume):
            facts = facts.with_cond(c.cond)
    return facts


def _emitter_spells(ctx, what: str) -> bool:
    """The target's emitter opts in to a statement it spells: ``vector_stores = True`` (the SIMT C++ emitter's
    default) for :class:`~tilecore.ir.VectorStore`, ``matrix_stores = True`` for :class:`~tilecore.ir.MatrixStore`;
    other emitters never see them."""
    backend = getattr(ctx, "backend", None)
    if backend is None or not hasattr(backend, "emitter"):
        return False
    return bool(getattr(backend.emitter(ctx.target), what, False))


@tile_pass("tilecore.vectorize_stores")
def vectorize_stores(func, ctx):
    """Fold runs of register stores to consecutive, aligned global addresses into vector stores (module doc)."""
    if not ctx.option("tilecore.vectorize", True) or ctx.option("tilecore.checked", False) or not _emitter_spells(ctx, "vector_stores"):
        return func
    from ..ir import BulkStore, collect

    ok = frozenset(id(b.src) for b in collect(func.body, BulkStore) if not b.layout.pad
                   and (b.layout.cols * b.layout.elem_bytes) % MAX_BYTES == 0)
    return func.with_body(_Pass(ok).stmt(func.body, Facts(), False))




# -- four 8x8 matrices a warp: tilecore.matrix_stores ---------------------------------------------------------

#: threads that store four 8x8 matrices together, and the matrices' shape
GROUP, ATOM = 32, 8


#: threads -> (numpy array of the thread indices, thread_values' memo for it): one matrix_stores run's evaluations
_EVALUATED: dict = {}


def _thread_arrays(threads: int):
    """The thread indices ``0 .. threads - 1`` and the memo of what :func:`thread_values` evaluated at them in this run."""
    hit = _EVALUATED.get(threads)
    if hit is None:
        import numpy as np

        hit = _EVALUATED[threads] = (np.arange(threads, dtype=np.int64), {})
    return hit


def _at_thread(e, new):
    """``e`` with the thread index replaced by ``new``."""
    from ..ir import ThreadIndex

    if isinstance(e, ThreadIndex):
        return new
    if isinstance(e, BinOp):
        return BinOp(e.op, _at_thread(e.a, new), _at_thread(e.b, new), e.dtype)
    if isinstance(e, Cast):
        return Cast(e.dtype, _at_thread(e.value, new))
    return e


def _atoms(group: list, threads: int):
    """``group``: four pair stores' inlined (row, column) indices. Where every thread ``t`` of every 32-thread
    group stores pair ``m`` at row ``R_m + l / 4``, column ``C_m + 2 (l % 4)`` (``l = t % 32``, ``C_m`` a multiple
    of 8: each matrix row inside one 16-byte unit), the offsets ``(R_m - R_0, C_m - C_0)``, the same for every
    group; else None. Evaluated for every thread of the block."""
    import numpy as np

    t, memo = _thread_arrays(threads)
    lane, first = t % GROUP, t - t % GROUP
    offs = []
    r00 = c00 = None
    for idx in group:
        r, c = thread_values(idx[0], t, memo), thread_values(idx[1], t, memo)
        if r is None or c is None:
            return None
        R, C = r[first], c[first]  # the group's lane 0
        if (C % ATOM).any() or (r != R + lane // 4).any() or (c != C + 2 * (lane % 4)).any():
            return None
        if r00 is None:
            r00, c00 = R, C
        dr, dc = R - r00, C - c00
        if (dr != dr[0]).any() or (dc != dc[0]).any():
            return None
        offs.append((int(dr[0]), int(dc[0])))
    return tuple(offs)


def _fit_linear(vals) -> tuple | None:
    """``(a, b)`` with ``vals[g] == a * g + b`` for every ``g``; None where no such integers exist."""
    b = int(vals[0])
    a = int(vals[1]) - b if len(vals) > 1 else 0
    return (a, b) if all(int(v) == a * g + b for g, v in enumerate(vals)) else None


def _lane_address_compact(idx0, offs, threads: int):
    """:func:`_lane_address` as ``a * (t / 32) + b + (l % 8) + x * ((t / 8) % 2) + y * ((t / 16) % 2)`` (row; the
    column without ``l % 8``) where the groups' first rows and columns are linear in the group's index and the four
    matrices' offsets are two bits' worth (D65: the emitted address a few operations of the thread index, where
    the general form composes the layout's coordinates at another thread's index); None where not."""
    import numpy as np

    from ..ir import IntImm, ThreadIndex

    if not threads or threads % GROUP:
        return None
    t, memo = _thread_arrays(threads)
    first = np.arange(0, threads, GROUP, dtype=np.int64)
    tid = ThreadIndex()
    out = []
    for k, x in enumerate(idx0):
        v = thread_values(x, t, memo)
        if v is None:
            return None
        line = _fit_linear(v[first])
        m = [o[k] for o in offs]
        if line is None or m[3] - m[2] != m[1] - m[0]:
            return None
        dt = x.dtype
        key = ("lane", threads, k, str(dt), line[0], line[1] + m[0], m[1] - m[0], m[2] - m[0])
        built = memo.get(key)  # the same form for every store of a run but its constant: built once a form
        if built is None:
            terms = [binary("mul", binary("div", tid, GROUP), IntImm(line[0], dt)), IntImm(line[1] + m[0], dt)]
            if k == 0:
                terms.append(binary("floormod", tid, ATOM))
            terms.append(binary("mul", binary("floormod", binary("div", tid, ATOM), 2), IntImm(m[1] - m[0], dt)))
            terms.append(binary("mul", binary("floormod", binary("div", tid, 2 * ATOM), 2), IntImm(m[2] - m[0], dt)))
            e = terms[0]
            for term in terms[1:]:
                e = binary("add", e, term)
            e = simplify(e)
            built = memo[key] = (e, thread_values(e, t))
        e, got = built
        # the thread's address as the general form gives it: row l % 8 of matrix l / 8 at the group's first pair
        lane = t % GROUP
        want = v[t - lane] + np.array(m, dtype=np.int64)[lane // ATOM] + (lane % ATOM if k == 0 else 0)
        if got is None or (got != want).any():
            return None
        out.append(e)
    return tuple(out)


def _lane_address(idx0, offs):
    """The element whose address thread ``t`` gives: column 0 of row ``l % 8`` of matrix ``l / 8`` (``l = t % 32``),
    from pair 0's indices taken at the thread of the group that holds that row's first pair, ``4 (l % 8)``."""
    from ..ir import IntImm, ThreadIndex

    t = ThreadIndex()
    dt = idx0[0].dtype
    lane = binary("floormod", t, GROUP)
    src = binary("add", binary("mul", binary("floordiv", t, GROUP), GROUP), binary("mul", binary("floormod", lane, ATOM), 4))
    m = binary("floordiv", lane, ATOM)

    def pick(k):
        vals = [o[k] for o in offs]
        e = IntImm(vals[3], dt)
        for j in (2, 1, 0):
            e = Select(Cmp("eq", m, IntImm(j, dt)), IntImm(vals[j], dt), e) if vals[j] != vals[3] else e
        return e

    return tuple(simplify(binary("add", _at_thread(x, src), pick(k))) for k, x in enumerate(idx0))


def _inline_stmt(s, env: dict):
    """A matrix store's fallback (pair stores, their element stores) with the bound scalars inlined."""
    if isinstance(s, Seq):
        return s.with_(body=[_inline_stmt(x, env) for x in s.body])
    if isinstance(s, VectorStore):
        return s.with_(indices=tuple(_inline(i, env) for i in s.indices),
                       values=tuple(_inline(v, env) for v in s.values), fallback=_inline_stmt(s.fallback, env))
    if isinstance(s, Store):
        return s.with_(indices=tuple(_inline(i, env) for i in s.indices), value=_inline(s.value, env))
    from .pipeline import substitute

    return substitute(s, env)


def _drop_dead_binds(body: list) -> list:
    """A per-thread statement list without the integer binds nothing after them reads (a matrix store's fallback
    not counted: its pair stores have the binds inlined), so the emitted source has no dead declarations."""
    from .layout import var_ids

    live: set = set()
    out: list = []
    for s in reversed(body):
        if isinstance(s, Bind) and not is_float(s.var.dtype):
            if id(s.var) not in live:
                continue
            live |= var_ids(s)
        else:
            live |= var_ids(s, skip=("fallback",) if isinstance(s, MatrixStore) else ())
        out.append(s)
    return out[::-1]


class _Matrices:
    def __init__(self, ok: frozenset, compact: bool = True):
        self.ok = ok
        self.count = 0
        self.compact = compact

    def seq(self, body: list, threads: int) -> list:
        env: dict = {}
        out: list = []
        made = False  # a matrix store whose fallback has the binds inlined
        i = 0
        while i < len(body):
            s = body[i]
            if isinstance(s, Bind) and not is_float(s.var.dtype):
                env[id(s.var)] = _inline(s.value, env)
                out.append(s)
                i += 1
                continue
            if not self._pair(s):
                out.append(s)
                i += 1
                continue
            # four pair stores with integer binds between them
            stores, binds, j, envj = [s], [], i + 1, dict(env)
            idx = [tuple(_inline(x, envj) for x in s.indices)]
            while j < len(body) and len(stores) < 4:
                t = body[j]
                if isinstance(t, Bind) and not is_float(t.var.dtype):
                    envj[id(t.var)] = _inline(t.value, envj)
                    binds.append(t)
                elif self._pair(t) and t.buffer is s.buffer:
                    stores.append(t)
                    idx.append(tuple(_inline(x, envj) for x in t.indices))
                else:
                    break
                j += 1
            offs = _atoms(idx, threads) if len(stores) == 4 else None
            if offs is None:
                out.append(s)
                i += 1
                continue
            env = envj
            values = tuple(v for st in stores for v in st.values)
            out += binds
            addr = (self.compact and _lane_address_compact(idx[0], offs, threads)) or _lane_address(idx[0], offs)
            fallback = Seq(list(stores), span=s.span)
            if self.compact:  # the pair stores with the bound scalars inlined: the binds only they read can go (D65)
                fallback = _inline_stmt(fallback, envj)
                made = True
            out.append(MatrixStore(s.buffer, addr, values, fallback, span=s.span))
            self.count += 1
            i = j
        return _drop_dead_binds(out) if made else out

    def _pair(self, s) -> bool:
        return (isinstance(s, VectorStore) and s.lanes == 2 and id(s.buffer) in self.ok and s.buffer.dtype.bytes == 2
                and len(s.indices) == 2)

    def stmt(self, s, threads):
        if s is None:
            return None
        if isinstance(s, Seq):
            return Seq([self.stmt(c, threads) for c in s.body], span=s.span)
        if isinstance(s, KernelLaunch):
            n = 1
            for x in s.threads:
                v = const_value(simplify(x))
                n = n * v if isinstance(v, int) and n is not None else None
            return s.with_(body=self.stmt(s.body, n))
        if isinstance(s, For):
            return s.with_(body=self.stmt(s.body, threads))
        if isinstance(s, If):
            return s.with_(then=self.stmt(s.then, threads), orelse=self.stmt(s.orelse, threads))
        if isinstance(s, Specialized):
            return s.with_(producer=s.producer, consumer=self.stmt(s.consumer, s.consumers))
        if isinstance(s, PerThread) and threads and threads % GROUP == 0:
            body = s.body.body if isinstance(s.body, Seq) else [s.body]
            return s.with_(body=Seq(self.seq(list(body), threads), span=s.span))
        return s


@tile_pass("tilecore.matrix_stores")
def matrix_stores(func, ctx):
    """A bulk store's 16-bit tile written by a group of 32 threads' pairs in four 8x8 matrices: one
    :class:`~tilecore.ir.MatrixStore` each (module doc of :mod:`tilecore.passes.vectorize`, D51)."""
    if (not ctx.option("tilecore.matrix_stores", True) or ctx.option("tilecore.checked", False)
            or not _emitter_spells(ctx, "matrix_stores")):
        return func
    from ..ir import BulkStore, collect

    ok = frozenset(id(b.src) for b in collect(func.body, BulkStore) if b.src.dtype.bytes == 2)
    if not ok:
        return func
    m = _Matrices(ok, ctx.option(MATRIX_STORE_LANES, "compact") != "general")
    _EVALUATED.clear()
    try:
        body = m.stmt(func.body, None)
    finally:
        _EVALUATED.clear()
    return func.with_body(body, matrix_stores=(f"{m.count} matrix stores (4 x 8x8) into the bulk-store tile",)) \
        if m.count else func


#: pass config (D65): "compact" (the default) writes a matrix store's lane address as a few operations of the thread
#: index where the groups' rows and columns are linear in the group's index (:func:`_lane_address_compact`);
#: "general" as before D65: pair 0's coordinates at the thread holding the lane's row, plus a select of the matrix's
#: offset
MATRIX_STORE_LANES = "tilecore.matrix_store_lanes"

__all__ = ["vectorize_stores", "matrix_stores", "MAX_BYTES", "MATRIX_STORE_LANES"]
