"""Layout inference and fragments in registers, for targets whose blocks run on threads.

``tilecore.infer_layouts`` (``layout`` slot) decides, for every block-level ``T.alloc_fragment`` of a
kernel, a :class:`~tilecore.layout.FragmentLayout` over the block's threads, or keeps the fragment in
shared memory for a stated reason; ``tilecore.lower_fragments`` (``tile-lowering`` slot, before the
generic tile-op lowering and after a backend's whole-kernel passes) decides again on what those passes
left and rewrites every statement that touches a fragment in registers into a
:class:`~tilecore.ir.PerThread` over the thread's registers. Both record the result in
``func.attrs["fragment_layouts"]`` (buffer name -> layout, or ``"shared: <reason>"``).

The rules (docs/layout.md, "Layout inference"):

- a ``T.gemm`` accumulator takes the layout of the target's matrix unit
  (:func:`tilecore.passes.matrix.plan_gemm`); without one, the core's :func:`~tilecore.layout.blocked`
  layout and an owner-computes GEMM (each register sums ``A[i, k] * B[k, j]`` over ``k``). A gemm whose
  best intrinsic needs a hardware feature (a matrix unit that reads C in shared memory) keeps C there;
- a reduction's result takes the projection of its source's layout (the threads sharing a row hold it),
  decided right after the gemms, before fills that initialise it (a fill of a fragment nothing has laid
  out waits for the layout the rest gives it);
- a whole, untransposed A of a gemm on a matrix unit may stay in registers in the unit's A order;
- ``T.Parallel`` nests (and ``T.copy`` / ``T.fill`` / ``T.atomic_*``, lowered to nests first) take the
  layout of a fragment indexed by all the nest's loop variables; every other fragment in the nest must be
  indexed by loop variables exactly and be owned where the nest's element is (checked by enumeration);
  a fragment indexed by fewer variables gets the projection, a nest with none of those extends a
  projected layout along the missing dimension;
- a nest whose loops carry the ``fold_branches`` annotation (a bulk store's tile in parts, D58) has its branches on
  the loop variables alone resolved per register where the register's coordinates decide them;
- anything else that touches a fragment (a scalar index, a transposed read, a partial region, an
  operand of a gemm, a cumsum, a backend's block-wide operation) keeps it in shared memory.
"""
from __future__ import annotations

import itertools
import math

from ..ir import (Allocate, Atomic, AtomicRet, Barrier, BinOp, Bind, Buffer, BufferLoad, Call, Cast, Cmp, Collective,
                  Expr, For, Hint, If, IntImm, KernelLaunch, Logic, PerThread, Print, Region, Select, Seq, ShuffleIndex,
                  ShuffleWidth, ShuffleXor, Store, ThreadIndex, TileOp, Var, as_expr, binary, cast, compare, const,
                  const_value, logic_and, loop_nest, rewrite, seq, simplify, walk, walk_expr)
from ..ir.bounds import Facts
from ..layout import FragmentLayout, blocked
from . import tile_pass

#: a T.Parallel loop annotation: branches of the nest on its loop variables alone are resolved per register where
#: the register's coordinates decide them (D58: a bulk store's tile in parts)
FOLD_BRANCHES = "fold_branches"
#: the most registers per thread a fragment may take before it stays in shared memory
MAX_REGS = 256
_NEST = ("parallel", "vectorized")


class _Shared(Exception):
    def __init__(self, buf, why: str):
        super().__init__(why)
        self.buf, self.why = buf, why


# -- when the pass runs --------------------------------------------------------------------------------

def runs_on_threads(ctx) -> bool:
    """The target runs a block on many threads: its backend distributes blocks with
    ``tilecore.simt_distribute`` (the CPU runs a block as one program and keeps fragments as arrays)."""
    backend = getattr(ctx, "backend", None)
    if backend is None or not hasattr(backend, "passes"):
        return False
    try:
        specs = backend.passes(ctx.target)
    except Exception:  # noqa: BLE001 - a backend without passes for this target
        return False
    return any(getattr(s.pass_, "name", "") == "tilecore.simt_distribute" for s in specs)


def _threads(launch: KernelLaunch):
    n = 1
    for t in launch.threads:
        v = t if isinstance(t, int) else const_value(as_expr(t))
        if v is None:
            return None
        n *= int(v)
    return n


def _shape(buf):
    s = buf.static_shape()
    return tuple(int(x) for x in s) if s is not None else None


def _full(region) -> bool:
    shape = _shape(region.buffer)
    return (shape is not None and all(const_value(s) == 0 for s in region.starts)
            and tuple(const_value(e) for e in region.extents) == shape)


# -- nests ---------------------------------------------------------------------------------------------

def _nest_of(loop: For):
    """(loops, inner body) of a chain of parallel loops."""
    return loop_nest(loop, _NEST)


def _accesses(stmt, frags) -> list:
    """``(buffer, indices, written)`` of every access to a buffer in ``frags`` under ``stmt``."""
    out: list = []

    def ex(e):
        walk_expr(e, lambda x: out.append((x.buffer, x.indices, False))
                  if isinstance(x, BufferLoad) and id(x.buffer) in frags else None)

    def st(s):
        if isinstance(s, (Store, Atomic)):
            if id(s.buffer) in frags:
                out.append((s.buffer, s.indices, True))
            for i in s.indices:
                ex(i)
            ex(s.value)
        elif isinstance(s, For):
            ex(s.start)
            ex(s.extent)
        elif isinstance(s, If):
            ex(s.cond)
        elif isinstance(s, (Bind,)):
            ex(s.value)
        elif isinstance(s, Allocate) and s.init is not None:
            ex(s.init)
        elif isinstance(s, Print):
            if s.buffer is not None and id(s.buffer) in frags:
                out.append((s.buffer, None, False))
            ex(s.value)
        elif isinstance(s, Collective):
            for a in s.args:
                if getattr(a, "buffer", None) is not None and id(a.buffer) in frags:
                    out.append((a.buffer, None, True))
        elif isinstance(s, TileOp):
            for a in s.args:
                if getattr(a, "buffer", None) is not None and id(a.buffer) in frags:
                    out.append((a.buffer, None, True))
        elif hasattr(s, "__dataclass_fields__") and not isinstance(s, (Seq, KernelLaunch, PerThread, Barrier)):
            for f in s.__dataclass_fields__:
                v = getattr(s, f)
                if isinstance(v, Expr):
                    ex(v)

    walk(stmt, st)
    return out


def _perm(indices, loop_vars, shape):
    """For each index, the position of the loop variable it is; a dimension of extent 1 indexed by 0 is left
    out (None where an index is anything else)."""
    out, unit = [], []
    for d, i in enumerate(indices):
        i = simplify(i)
        if shape[d] == 1 and const_value(i) == 0:
            unit.append(d)
            continue
        pos = next((k for k, v in enumerate(loop_vars) if i is v), None)
        if pos is None or pos in out:
            return None
        out.append(pos)
    return tuple(out), tuple(unit)


def _squeeze(lay: FragmentLayout, unit) -> FragmentLayout:
    """``lay`` without its dimensions of extent 1 listed in ``unit``."""
    if not unit:
        return lay
    keep = [d for d in range(len(lay.shape)) if d not in unit]
    return FragmentLayout([lay.shape[d] for d in keep], [lay.dims[d] for d in keep], lay.replicate, lay.name)


def _unsqueeze(lay: FragmentLayout, unit) -> FragmentLayout:
    if not unit:
        return lay
    from ..layout import Digit

    shape, dims, it = [], [], iter(range(len(lay.shape)))
    for d in range(len(lay.shape) + len(unit)):
        if d in unit:
            shape.append(1)
            dims.append([Digit("reg", 1, 1)])
        else:
            k = next(it)
            shape.append(lay.shape[k])
            dims.append(lay.dims[k])
    return FragmentLayout(shape, dims, lay.replicate, lay.name)


def _sub_layout(D: FragmentLayout, perm) -> FragmentLayout:
    """The layout ``D`` (over the nest's loop variables) induces on a fragment indexed by ``perm``."""
    dropped = sorted(set(range(len(D.shape))) - set(perm), reverse=True)
    lay = D
    keep = list(range(len(D.shape)))
    for d in dropped:
        lay = lay.project(d)
        keep.remove(d)
    order = [keep.index(p) for p in perm]
    return lay.transpose(order, name="fragment") if order != list(range(len(order))) else lay


def _extend(P: FragmentLayout, perm, extents) -> FragmentLayout | None:
    """A layout over the nest's loop variables whose projection onto ``perm`` is ``P``: each missing
    dimension takes ``P``'s replication digits (the threads that hold the same element of ``P``), then
    registers."""
    reps = sorted(P.replicate, key=lambda d: d.stride)
    rstride = P.regs
    dims: list = [None] * len(extents)
    for k, p in enumerate(perm):
        dims[p] = list(P.dims[k])
    for p, n in enumerate(extents):
        if dims[p] is not None:
            continue
        ds, left = [], n
        while reps and left % reps[0].extent == 0:
            d = reps.pop(0)
            ds.append(d)
            left //= d.extent
        if left > 1:
            from ..layout import Digit

            ds.append(Digit("reg", left, rstride))
            rstride *= left
        dims[p] = ds or [("reg", 1, 1)]
    try:
        return FragmentLayout(extents, dims, reps, "nest")
    except ValueError:
        return None


_OWN_CACHE: dict = {}


def _reg_map(D: FragmentLayout, F: FragmentLayout, perm) -> list | None:
    """For each register of ``D``, the register of ``F`` that holds the fragment element (indexed by
    ``perm``) of the same thread: None where some thread does not hold it.

    Slot by slot over ``threads x regs`` (32768 slots for a 128x256 accumulator): done with numpy
    tables, not per-slot calls (0.2 s of a cold compile before)."""
    import numpy as np

    key = (D, F, perm)
    if key in _OWN_CACHE:
        return _OWN_CACHE[key]
    res = None
    if D.threads == F.threads and not F.opaque:
        coords = D.element_table()[:, :, list(perm)]          # (threads, regs, ndim) in F's dimensions
        base, freg = F.locate_table(coords)                  # F's first replica's thread and register
        held = np.isin(np.arange(D.threads)[:, None] - base, F.replica_offsets())
        # every thread holds the element of each of its registers, in the same register of F
        if held.all() and (freg == freg[:1]).all():
            res = [int(x) for x in freg[0]] if D.threads else []
    _OWN_CACHE[key] = res
    return res


# -- inference -----------------------------------------------------------------------------------------

def _feeds_only_through_shared(conv) -> bool:
    """Whether a matrix unit's register operand should stay in shared memory rather than take ``conv``: a
    shared round trip, or indexed shuffles averaging more than one per register (the round trip costs a
    store and a load per register, and the unit's own operand load does the load half in wider pieces)."""
    return conv.kind == "shared" or (conv.kind == "index" and conv.indexed() + conv.shuffles() > conv.dst.regs)


def shuffle_width(ctx, threads: int, masks=(), dynamic: bool = False):
    """The lanes an xor shuffle reaches on the target (its ``execution.simd_width`` where it declares
    ``features.subgroup_ops`` and the block is whole groups of them), or 0: no shuffles. A profile whose
    width is known only at run time (``simd_width: dynamic``) gives ``"dynamic"`` where the caller can
    take it (``dynamic``: the reductions' two-path combine), else 0 (layout conversions)."""
    caps = getattr(ctx, "capabilities", None)
    if caps is None or not caps.feature("subgroup_ops"):
        return 0
    width = caps.get("execution.simd_width", 1) or 1
    if width == "dynamic":
        return width if dynamic else 0
    width = int(width)
    if width < 2 or (masks and max(masks) >= width) or threads % width:
        return 0
    return width


class Plan:
    """Layouts of one launch's fragments: ``layouts[id(buf)]`` or ``shared[id(buf)]`` (the reason)."""

    def __init__(self, threads: int, ctx):
        self.threads, self.ctx = threads, ctx
        self.frags: dict = {}    # id -> buffer
        self.layouts: dict = {}
        self.shared: dict = {}
        self.gemm_plans: dict = {}
        self.operands: set = set()  # ids of fragments laid out as a matrix unit's A operand in registers
        self.conversions: dict = {}  # id -> [what was converted, and how]
        #: tilecore.layout_conversion: True (convert where layouts disagree), "shared" (always through shared
        #: memory), False (keep one of the fragments in shared memory instead)
        self.convert = ctx.option("tilecore.layout_conversion", True) if hasattr(ctx, "option") else True
        if self.convert not in (True, False, "shared"):
            from ..errors import CompileError

            raise CompileError(f"pass config tilecore.layout_conversion is {self.convert!r}: use True (convert "
                               "between layouts), 'shared' (every conversion through shared memory) or False")
        #: tilecore.uniform_fragments (D88): small fragments block-level statements access, held whole by every thread
        self.uniform = ctx.option("tilecore.uniform_fragments", True) if hasattr(ctx, "option") else True
        self.width = shuffle_width(ctx, threads) if self.convert is True else 0
        caps = getattr(ctx, "capabilities", None)
        #: indexed shuffles (a source lane per thread) where the profile declares them besides xor shuffles
        self.indexed = bool(self.width and caps is not None and caps.feature("shuffle_index"))

    def conversion(self, src: FragmentLayout, dst: FragmentLayout):
        """The exchange that moves a fragment from ``src`` to ``dst`` on this block's threads."""
        from ..layout import plan_conversion

        return plan_conversion(src, dst, self.width, self.indexed)

    def note_conversion(self, buf, src, dst, where: str):
        text = f"{where}: {src!r} -> {dst!r} by {self.conversion(src, dst).describe()}"
        lst = self.conversions.setdefault(id(buf), [])
        if text not in lst:
            lst.append(text)

    def live(self, buf) -> bool:
        return id(buf) in self.frags and id(buf) not in self.shared

    def set(self, buf, lay, why_not: str):
        if lay is None:
            raise _Shared(buf, why_not)
        if lay.regs > MAX_REGS:
            raise _Shared(buf, f"needs {lay.regs} registers per thread (more than {MAX_REGS})")
        self.layouts[id(buf)] = lay
        return lay

    def layout(self, buf):
        lay = self.layouts.get(id(buf))
        if lay is None:
            shape = _shape(buf)
            lay = self.set(buf, blocked(shape, self.threads) if shape else None,
                           "no blocked layout for its shape over the block's threads (1-D and 2-D static shapes "
                           "whose extents divide)")
        return lay


def _expand(op: TileOp, ctx):
    """The generic lowering of a copy / fill / atomic (a nest of parallel loops)."""
    from . import lower_tile

    return {"copy": lower_tile.lower_copy, "fill": lower_tile.lower_fill,
            "atomic": lower_tile.lower_atomic}[op.op](op, ctx)


def _hardware_gemm(op, ctx):
    """The name of the intrinsic that would run this gemm on a matrix unit reading C in memory, if any."""
    from .lower_tile import choose

    try:
        intr = choose(op, ctx)
    except Exception:  # noqa: BLE001
        return None
    return intr.name if any(str(r).startswith("feature:") for r in intr.requires) else None


def _opaque_unit(op, ctx):
    """The spelling of a matrix unit of the target with opaque layouts that multiplies ``op``'s operand
    dtypes into its accumulator's, if any (the gemm's hardware intrinsic then keeps the accumulator in the
    unit's registers only inside the op, and in shared memory around it)."""
    a, c = op.args[0].buffer, op.args[2].buffer
    for u in ctx.matrix_units:
        if u.c.opaque and a.dtype in u.a_dtypes and c.dtype == u.acc_dtype:
            return u.spelling
    return None


def _block_stmts(body):
    """Block-level statements (recursing into serial loops and branches, not into nests), in order."""
    if body is None:
        return
    if isinstance(body, Seq):
        for c in body.body:
            yield from _block_stmts(c)
    elif isinstance(body, For) and body.kind not in _NEST:
        yield body
        yield from _block_stmts(body.body)
    elif isinstance(body, If):
        yield body
        yield from _block_stmts(body.then)
        yield from _block_stmts(body.orelse)
    else:
        yield body


def _nest_domain(plan: Plan, loops, inner, assign: bool):
    """The layout over a nest's loop variables, and ``(buffer, perm, reg map)`` of its fragment accesses;
    None when it touches no fragment in registers. Raises _Shared on a conflict."""
    accs = [(b, idx, w) for b, idx, w in _accesses(inner, plan.frags) if plan.live(b)]
    if plan.uniform:
        # an element at constant indices (``s[2]``, not a unit dimension's 0): read from the copy every thread holds
        vs0 = [f.var for f in loops]
        const = [a for a in accs if _uniform_read(a[1], vs0, a[0])]
        for b, idx, w in const:
            if w:
                raise _Shared(b, "written at constant indices in a T.Parallel nest (every iteration writes the same "
                                 "element): write it at block level, outside the nest")
            if assign:
                _need_uniform(plan, b, idx, f"in a T.Parallel nest at {_where(loops[0])}")
        accs = [a for a in accs if not any(a is c for c in const)]
    for f in loops:  # fragments in the loops' own bounds
        for b, _i, _w in _accesses(Seq([Bind(Var("x"), f.start), Bind(Var("x"), f.extent)]), plan.frags):
            if plan.live(b):
                raise _Shared(b, "read in a T.Parallel loop bound")
    if not accs:
        return None
    ext = [const_value(f.extent) for f in loops]
    if any(e is None for e in ext) or any(const_value(f.start) != 0 for f in loops):
        raise _Shared(accs[0][0], "accessed in a T.Parallel nest with symbolic bounds")
    vs = [f.var for f in loops]
    found = []
    for b, idx, w in accs:
        got = _perm(idx, vs, _shape(b)) if idx is not None else None
        if got is None:
            raise _Shared(b, "indexed by something other than the T.Parallel loop variables")
        perm, unit = got
        if tuple(ext[p] for p in perm) != tuple(n for d, n in enumerate(_shape(b)) if d not in unit):
            raise _Shared(b, f"a T.Parallel nest over {tuple(ext)} covers only part of it")
        if w and len(perm) < len(vs) and not plan.uniform:
            raise _Shared(b, "written in a T.Parallel nest over more loop variables than it has dimensions")
        many = [vs[k].name for k in range(len(vs)) if k not in perm and ext[k] != 1]
        if w and many:
            # a loop variable of extent 1 the fragment is not indexed by is no loop: each element has one writer
            raise _Shared(b, "written in a T.Parallel nest over more loop variables than it has dimensions (loop "
                             f"variable(s) {', '.join(many)} "
                             "of extent above 1 write each of its elements several times: a reduction over them; "
                             "write it with T.reduce_* over a fragment indexed by every loop variable instead)")
        found.append((b, perm, unit))
    # the nest's layout: a fragment indexed by every loop variable that has a layout, else one without
    # (fragments laid out as a matrix unit's register operand come last: they follow, not lead)
    full = sorted([(b, p, u) for b, p, u in found if len(p) == len(vs)], key=lambda f: id(f[0]) in plan.operands)
    D = None
    for b, p, u in full:
        if id(b) in plan.layouts:
            D = _squeeze(plan.layouts[id(b)], u).transpose([p.index(k) for k in range(len(vs))], name="nest")
            break
    if D is None:
        part = [(b, p, u) for b, p, u in found if id(b) in plan.layouts]
        if part and not full:
            b, p, u = part[0]
            D = _extend(_squeeze(plan.layouts[id(b)], u), p, ext)
        if D is None:
            D = blocked(ext, plan.threads)
            if D is None:
                raise _Shared(found[0][0], f"no blocked layout for a T.Parallel nest over {tuple(ext)}")
    out = []
    for b, p, u in found:
        if id(b) not in plan.layouts:
            if not assign:
                raise _Shared(b, "internal: no layout")
            plan.set(b, _unsqueeze(_sub_layout(D, p), u), "")
        m = _reg_map(D, _squeeze(plan.layouts[id(b)], u), p)
        conv = None
        if m is None and plan.convert and len({pp for bb, pp, _u in found if bb is b}) == 1 \
                and not plan.layouts[id(b)].opaque:
            # the fragment keeps its layout; the nest works on a register copy in the layout the nest needs,
            # converted from it before (and back after, where the nest writes it)
            want = _unsqueeze(_sub_layout(D, p), u)
            want = FragmentLayout(want.shape, want.dims, want.replicate, f"{b.name}@nest")
            m = _reg_map(D, _squeeze(want, u), p)
            if m is not None and id(b) in plan.operands and plan.convert is True \
                    and _feeds_only_through_shared(plan.conversion(want, plan.layouts[id(b)])):
                # a matrix unit's register operand that only shared memory can feed stays there: the unit's
                # own operand load (cooperative where the backend spells one) is the load half of that round
                # trip, better than a load per register (or several indexed shuffles per register)
                raise _Shared(b, "the A operand of a matrix-unit T.gemm that the T.Parallel nest or T.copy over "
                                 f"{tuple(ext)} producing it can feed only through shared memory (its elements "
                                 "are held beyond a few shuffles of the threads that need them): kept there, loaded "
                                 "by the unit's operand load "
                                 "(tilecore.layout_conversion='shared' converts it into registers instead)")
            if m is not None:
                conv = want
                if assign:
                    where = f"a T.Parallel nest or T.copy over {tuple(ext)} at {_where(loops[0])}"
                    if any(not w2 for b2, _i, w2 in accs if b2 is b) or _branches(inner):
                        plan.note_conversion(b, plan.layouts[id(b)], want, f"{where} (reads it)")
                    if any(w2 for b2, _i, w2 in accs if b2 is b):
                        plan.note_conversion(b, want, plan.layouts[id(b)], f"{where} (writes it)")
        if m is None:
            # a register operand of a matrix unit that its producer's layout cannot feed goes back to shared
            # memory, not the producer
            op = next((x for x, _p, _u in found if id(x) in plan.operands), None)
            raise _Shared(op if op is not None else b,
                          f"its layout does not hold, on each thread, the elements a T.Parallel nest over "
                          f"{tuple(ext)} reads there (e.g. a transposed read)")
        out.append((b, p, m, conv))
    return D, out


def _uniform_read(idx, loop_vars, b) -> bool:
    """An access inside a nest at constant indices that the nest's rules do not cover (not a unit dimension's 0)."""
    return _const_index(idx) and _perm(idx, loop_vars, _shape(b)) is None


def _branches(stmt) -> bool:
    """A branch inside a nest: a write may skip elements, so the nest's copy of a converted fragment starts
    from the fragment's values."""
    return any(isinstance(x, If) for x in _all_stmts(stmt))


def _where(stmt) -> str:
    span = getattr(stmt, "span", None)
    line = getattr(span, "line", None) if span is not None else None
    return f"line {line}" if line else "block level"


#: the most elements a fragment accessed element by element at block level (outside T.Parallel nests and tile ops)
#: may have: every thread then holds all of them (D88)
UNIFORM_MAX = 16


def uniform(shape, threads: int, name: str = "uniform") -> FragmentLayout:
    """Every thread holds every element (row-major registers): the layout of a fragment a block-level statement
    reads or writes element by element (``lse[0] = ...``, a loop bound ``end[0]``). Block-level statements are
    uniform (every thread computes the same value: simt_distribute), so each thread updates its own copy."""
    from ..layout import Digit

    dims, stride = [], 1
    for n in reversed(tuple(shape)):
        dims.append([Digit("reg", n, stride)])
        stride *= n
    return FragmentLayout(shape, list(reversed(dims)), [Digit("thread", threads, 1)] if threads > 1 else [], name)


def _is_uniform(lay: FragmentLayout) -> bool:
    """Every thread holds every element of ``lay``: no coordinate uses a thread digit."""
    return not lay.opaque and all(d.space == "reg" or d.extent == 1 for ds in lay.dims for d in ds)


def _region_exprs(s) -> list:
    """The start and extent expressions of the regions a tile op names (the loads of ``T.copy(A[k0[0], 0], ...)``)."""
    out = []
    for a in getattr(s, "args", ()) if isinstance(s, TileOp) else ():
        if isinstance(a, Region):
            out += [as_expr(x) for x in tuple(a.starts) + tuple(a.extents)]
        elif isinstance(a, Expr):
            out.append(a)
    return out


def _block_accesses(s, frags) -> list:
    """``(buffer, indices, written)`` of the fragment accesses a block-level statement makes itself: its own
    expressions (a loop's bounds, a branch's condition, a bind's value, a store), not its children's."""
    if isinstance(s, For):
        own = Seq([Bind(Var("x"), s.start), Bind(Var("x"), s.extent)])
    elif isinstance(s, If):
        own = Bind(Var("x"), s.cond)
    elif isinstance(s, TileOp):
        own = Seq([Bind(Var("x"), e) for e in _region_exprs(s)])
    else:
        own = s
    return _accesses(own, frags)


def _exprs_in(e) -> list:
    out: list = []
    walk_expr(e, out.append)
    return out


def _block_level(plan: Plan, s, what: str):
    """Fragments accessed by a block-level statement ``s`` itself: each index a constant, each fragment small
    enough that every thread holds it (the uniform layout, unless one that puts every element on every thread is
    there already). Raises _Shared with what the user could write instead."""
    for b, idx, w in _block_accesses(s, plan.frags):
        if not plan.live(b):
            continue
        if w and isinstance(s, Store) and any(isinstance(x, AtomicRet) for x in _exprs_in(s.value)):
            raise _Shared(b, f"set at block level ({what}) to the old value an atomic returns, which one thread "
                             "of the block fetches")
        if idx is None or not plan.uniform:
            raise _Shared(b, f"accessed outside T.Parallel nests and tile ops ({what} at block level)")
        _need_uniform(plan, b, idx, f"at block level ({what})")


def _const_index(idx) -> bool:
    return idx is not None and all(const_value(simplify(i)) is not None for i in idx)


def _need_uniform(plan: Plan, b, idx, what: str):
    """``b[idx]`` read or written ``what`` (not by a nest's loop variables): every thread must hold the element,
    so the whole (small) fragment on every thread, at constant indices."""
    consts = [const_value(simplify(i)) for i in idx]
    if any(c is None for c in consts):
        from ..ir.printer import expr_str

        dyn = ", ".join(expr_str(i) for i, c in zip(idx, consts) if c is None)
        raise _Shared(b, f"indexed {what} by the run-time value {dyn}: registers cannot be "
                         "indexed at run time (every thread would hold the whole fragment and pick from it in "
                         "local memory), so it stays in shared memory, which serves this access as well; to "
                         "free it, read the element where it is needed straight from global memory, or keep "
                         "it in a T.alloc_shared tile")
    lay = plan.layouts.get(id(b))
    if lay is None:
        shape = _shape(b)
        n = math.prod(shape) if shape else None
        if n is None or n > UNIFORM_MAX:
            raise _Shared(b, f"accessed element by element {what} and has "
                             f"{n if n is not None else 'a symbolic number of'} elements (every thread would hold "
                             f"all of them; at most {UNIFORM_MAX}): access it in a T.Parallel nest, or keep "
                             "scalars in a fragment of shape (1,)")
        plan.set(b, uniform(shape, plan.threads), "")
    elif not _is_uniform(lay):
        raise _Shared(b, f"accessed element by element {what}, while another statement lays "
                         f"it out over the threads as {lay!r} (a thread does not hold every element)")


#: why a fragment a tile op without a register lowering uses stays in shared memory (what the user may write instead)
USED_BY = {"cumsum": "used by T.cumsum, which has no register lowering (a prefix sum along a dimension that crosses "
                     "threads: it runs on the fragment in shared memory, as on a T.alloc_shared tile); a fragment "
                     "the scan does not touch stays in registers"}


def _infer_once(plan: Plan, body, annotations: dict):
    ctx = plan.ctx
    from .matrix import plan_gemm

    stmts = list(_block_stmts(body))
    for name, lay in annotations.items():
        for b in plan.frags.values():
            if b.name == name and plan.live(b) and isinstance(lay, FragmentLayout):
                if lay.threads != plan.threads or lay.shape != _shape(b):
                    raise _Shared(b, f"T.annotate_layout gives {lay!r}, which does not cover its shape over "
                                     f"{plan.threads} threads")
                plan.set(b, lay, "")
    # gemm accumulators first: the matrix unit decides
    for s in stmts:
        if isinstance(s, TileOp) and s.op == "gemm":
            a, b, c = s.args
            if plan.live(b.buffer):
                raise _Shared(b.buffer, "the B operand of a T.gemm (every thread of a column would need the whole "
                                        "column)")
            if not plan.live(c.buffer):
                if plan.live(a.buffer):
                    raise _Shared(a.buffer, "the A operand of a T.gemm whose accumulator is not in registers")
                continue
            if not _full(c) or len(_shape(c.buffer)) != 2:
                raise _Shared(c.buffer, "the accumulator of a T.gemm on part of it")
            gp = plan_gemm(s, plan.threads, ctx)
            if plan.live(a.buffer):
                # A from registers: only on a matrix unit, whole and untransposed, in the layout the unit's
                # plan gives its A operand (a T.copy into it converts per thread where the elements agree)
                if gp is None or s.attrs.get("transpose_A") or not _full(a) or len(_shape(a.buffer)) != 2:
                    raise _Shared(a.buffer, "a T.gemm operand (every thread of a row would need the whole row; "
                                            "only a matrix unit's untransposed A may come from registers)")
                want = gp.attrs["a_layout"]
                have = plan.layouts.get(id(a.buffer))
                if have is not None and have != want:
                    raise _Shared(a.buffer, f"the A operand of a matrix-unit T.gemm in {have!r}, not the unit's {want!r}")
                plan.set(a.buffer, want, "")
                plan.operands.add(id(a.buffer))
            if gp is not None:
                plan.gemm_plans[id(s)] = gp
                if id(c.buffer) in plan.layouts and plan.layouts[id(c.buffer)] != gp.c_layout:
                    raise _Shared(c.buffer, f"its annotated layout differs from the matrix unit's {gp.c_layout!r}")
                plan.set(c.buffer, gp.c_layout, "")
                continue
            hw = _hardware_gemm(s, ctx)
            if hw is not None:
                opaque = _opaque_unit(s, ctx)
                if opaque is not None:  # a fragment whose element placement the hardware hides
                    raise _Shared(c.buffer, f"T.gemm runs on {hw}: the accumulator is {opaque}'s opaque fragment "
                                            "(the hardware hides which thread holds an element), kept in shared "
                                            "memory where its elements are accessed")
                raise _Shared(c.buffer, f"T.gemm runs on {hw}, which reads the accumulator in shared memory (no "
                                        "matrix-unit layout registered for it)")
            plan.layout(c.buffer)
    deferred: list = []  # fills of fragments nothing had laid out when they came
    # then the results of reducing them (a row statistic takes the projection of the accumulator's layout
    # before a fill or copy that comes earlier in the program could give it another)
    for s in stmts:
        if isinstance(s, TileOp) and s.op == "reduce":
            src, dst = s.args
            if plan.live(src.buffer) and plan.live(dst.buffer) and id(src.buffer) in plan.layouts \
                    and id(dst.buffer) not in plan.layouts and _full(src) and _full(dst):
                L = plan.layouts[id(src.buffer)]
                if L.reduce_masks(s.attrs["dim"]) is not None:
                    P = _result_layout(L, s.attrs["dim"], _shape(dst.buffer))
                    if P.shape == _shape(dst.buffer):
                        plan.set(dst.buffer, P, "")
    for s in stmts:
        if isinstance(s, TileOp):
            if s.op == "gemm":
                continue
            if s.op == "reduce":
                src, dst = s.args
                if plan.live(src.buffer):
                    if not _full(src):
                        raise _Shared(src.buffer, "reduced over part of it")
                    L = plan.layout(src.buffer)
                    if L.reduce_masks(s.attrs["dim"]) is None:
                        raise _Shared(src.buffer, "reduced across threads whose pattern is not an xor butterfly")
                    if plan.live(dst.buffer):
                        P = _result_layout(L, s.attrs["dim"], _shape(dst.buffer))
                        if not _full(dst) or P.shape != _shape(dst.buffer):
                            raise _Shared(dst.buffer, "the result of a reduction whose shape is not the source's "
                                                      "other dimensions")
                        have = plan.layouts.get(id(dst.buffer))
                        if have is not None and have != P and plan.convert and not have.opaque:
                            # reduce into registers laid out as the projection, then convert into the result's
                            # layout (and from it first, where the reduction combines with the old value)
                            where = f"the T.reduce_{s.attrs['kind']} of {src.buffer.name} at {_where(s)}"
                            if not s.attrs["clear"]:
                                plan.note_conversion(dst.buffer, have, P, f"{where} (its old value)")
                            plan.note_conversion(dst.buffer, P, have, f"{where} (the result)")
                            continue
                        if id(dst.buffer) in plan.layouts and plan.layouts[id(dst.buffer)] != P:
                            raise _Shared(dst.buffer, f"the result of a reduction of {src.buffer.name}, whose "
                                                      f"layout projects to {P!r}, not its {plan.layouts[id(dst.buffer)]!r}")
                        plan.set(dst.buffer, P, "")
                elif plan.live(dst.buffer):
                    if not _full(dst):
                        raise _Shared(dst.buffer, "the result of a reduction into part of it")
                    plan.layout(dst.buffer)
                continue
            if s.op in ("copy", "fill", "atomic"):
                if any(plan.live(getattr(a, "buffer", None)) for a in s.args if getattr(a, "buffer", None)):
                    loops, inner = _nest_of(_expand(s, ctx))
                    if not loops:  # one element: a block-level store (D88)
                        if not plan.uniform:
                            live = [a.buffer for a in s.args if getattr(a, "buffer", None) and plan.live(a.buffer)]
                            raise _Shared(live[0], f"T.{s.op} of a single element")
                        _block_level(plan, s, f"T.{s.op}")
                        for x in _block_stmts(inner):
                            _block_level(plan, x, f"T.{s.op} of a single element")
                        continue
                    if s.op == "fill" and id(s.args[0].buffer) not in plan.layouts:
                        # a fill reads nothing: it takes the layout later statements give the buffer
                        # (initialising a row statistic must not decide it before the reduction that makes it)
                        deferred.append((loops, inner))
                        continue
                    _nest_domain(plan, loops, inner, True)
                else:
                    _block_level(plan, s, f"the region of a T.{s.op}")
                continue
            for a in s.args:
                if getattr(a, "buffer", None) is not None and plan.live(a.buffer):
                    raise _Shared(a.buffer, USED_BY.get(s.op, f"used by T.{s.op}"))
            _block_level(plan, s, f"the region of a T.{s.op}")
            continue
        if isinstance(s, For) and s.kind in _NEST:
            loops, inner = _nest_of(s)
            _nest_domain(plan, loops, inner, True)
            continue
        if isinstance(s, Allocate) and id(s.buffer) in plan.frags:
            continue
        if isinstance(s, Collective):
            for b, _i, _w in _accesses(s, plan.frags):
                if plan.live(b):
                    raise _Shared(b, f"accessed outside T.Parallel nests and tile ops (the block-wide operation "
                                     f"{s.name} at block level)")
            continue
        _block_level(plan, s, type(s).__name__)
    for loops, inner in deferred:
        _nest_domain(plan, loops, inner, True)
    for b in plan.frags.values():
        if plan.live(b):
            plan.layout(b)


def infer_launch(launch: KernelLaunch, ctx, annotations: dict | None = None) -> Plan | None:
    threads = _threads(launch)
    if not threads or threads < 2:
        return None
    plan = Plan(threads, ctx)
    for s in _block_stmts(launch.body):
        if isinstance(s, Allocate) and s.buffer.scope == "fragment":
            plan.frags[id(s.buffer)] = s.buffer
    if not plan.frags:
        return None
    while True:
        plan.layouts, plan.gemm_plans, plan.operands, plan.conversions = {}, {}, set(), {}
        try:
            _infer_once(plan, launch.body, annotations or {})
            return plan
        except _Shared as e:
            plan.shared[id(e.buf)] = e.why


def _record(plans) -> dict:
    out: dict = {}
    for plan in plans:
        for k, b in plan.frags.items():
            name, n = b.name, 1
            while name in out:
                name, n = f"{b.name}_{n}", n + 1
            out[name] = f"shared: {plan.shared[k]}" if k in plan.shared else repr(plan.layouts[k])
            if k not in plan.shared and plan.conversions.get(k):
                out[name] += f" [converted for {'; for '.join(plan.conversions[k])}]"
    return out


@tile_pass("tilecore.infer_layouts")
def infer_layouts(func, ctx):
    """Choose each fragment's layout over the block's threads (or say why it stays in shared memory)."""
    if not runs_on_threads(ctx):
        return func
    annotations: dict = {}
    for h in [x for x in _all_stmts(func.body) if isinstance(x, Hint) and x.kind == "annotate_layout"]:
        annotations.update(h.payload)
    ctx.fragment_annotations = annotations
    plans = [p for p in (infer_launch(s, ctx, annotations) for s in _all_stmts(func.body)
                         if isinstance(s, KernelLaunch)) if p is not None]
    if not plans:
        return func
    return func.with_body(func.body, fragment_layouts=_record(plans))


def _all_stmts(body) -> list:
    out: list = []
    walk(body, out.append)
    return out


# -- lowering ------------------------------------------------------------------------------------------

def _register_coords(lay: FragmentLayout, tid):
    """``r -> (coordinates, offsets)``: the coordinates of register ``r`` of the thread ``tid`` in ``lay``,
    exactly ``simplify(c)`` of ``lay.coords_expr(tid, r)``'s, and the register's constant offsets. Each is the
    thread's part, simplified once for the layout, plus the register's constant (D65: one simplification a
    dimension, not one a register and dimension: 768 of them in a 128x256 accumulator's three nests)."""
    thread = [simplify(c) for c in lay.coords_expr(tid, 0)]  # register 0: every register digit 0

    def at(r: int):
        fixed = lay.reg_offsets(r)
        out = []
        for c, k in zip(thread, fixed):
            v = const_value(c)
            out.append(c if k == 0 else IntImm(v + k, c.dtype) if v is not None else BinOp("add", c, IntImm(k, c.dtype), c.dtype))
        return tuple(out), fixed

    return at


def var_ids(s, skip: tuple = ()) -> set:
    """The ids of the variables a statement tree mentions (in any expression of it or of its children), not looking
    into the child statements named in ``skip`` (e.g. ``("fallback",)``)."""
    ids: set = set()

    def note(x):
        if isinstance(x, Var):
            ids.add(id(x))

    def scan(v):  # expressions also in tuples, lists, dicts (attributes) and buffers' shapes
        if isinstance(v, Expr):
            walk_expr(v, note)
        elif isinstance(v, (tuple, list)):
            for x in v:
                scan(x)
        elif isinstance(v, dict):
            for x in v.values():
                scan(x)
        elif isinstance(v, Buffer):
            scan(v.shape)

    def stmt(t):
        for f in getattr(t, "__dataclass_fields__", ()):
            if f not in ("span", "body", "then", "orelse", "fallback", "producer", "consumer"):
                scan(getattr(t, f))
            elif f not in skip and f != "span":
                sub = getattr(t, f)
                if sub is not None and not isinstance(sub, list):
                    visit(sub)
        if isinstance(t, Seq):
            for c in t.body:
                visit(c)

    def visit(t):
        stmt(t)

    visit(s)
    return ids


def _replica0(lay: FragmentLayout):
    """The condition that this thread is the first replica of ``lay`` (None when nothing is replicated)."""
    cond = None
    for d in lay.replicate:
        if d.extent == 1:
            continue
        v = binary("floormod", binary("div", ThreadIndex(), d.stride), d.extent)
        c = compare("eq", v, const(0))
        cond = c if cond is None else logic_and(cond, c)
    return cond


class _Subst:
    """Rebuild a statement with loop variables replaced, fragment accesses turned into register
    accesses, and every variable or buffer it declares renamed (each register's copy is its own)."""

    def __init__(self, vmap: dict, regs: dict, guard=None, fold=None):
        self.vmap = dict(vmap)      # id(var) -> expr
        self.used: set = set()      # ids of the variables of vmap substituted somewhere (D65: the binds kept)
        self.regs = regs            # id(buffer) -> (register buffer, reg index)
        self.bmap: dict = {}        # id(buffer) -> renamed buffer
        self.guard = guard
        # (id(loop var) -> this register's coordinate, facts of the block's threads): a branch on the nest's loop
        # variables alone that the facts decide for this register is resolved here (D58)
        self.fold = fold

    def decide(self, cond):
        """True / False where this register's coordinates decide ``cond`` (None: not decided, or no folding)."""
        if self.fold is None:
            return None
        coords, facts, decided, offsets = self.fold
        free = decided.get(("free", id(cond)))  # the condition's variables, looked up once a nest
        if free is None or free[0] is not cond:
            found: list = []
            walk_expr(cond, lambda x: found.append(x) if isinstance(x, (Var, BufferLoad, Call, ThreadIndex)) else None)
            ok = found and all(isinstance(x, Var) and id(x) in coords for x in found)
            free = decided[("free", id(cond))] = (cond, tuple(dict.fromkeys(id(x) for x in found)) if ok else None)
        if free[1] is None:
            return None
        # registers whose coordinates in the condition's variables differ by the same constants decide alike
        key = (id(cond),) + tuple(offsets[v] for v in free[1])
        if key in decided:
            return decided[key]
        out = _decide_ranges(cond, coords, facts, decided)
        if out is NotImplemented:
            c = _Subst(coords, {}).e(cond)
            out = True if facts.proves(c) else False if _refutes(facts, c) else None
        decided[key] = out
        return out

    def e(self, x):
        if isinstance(x, Var):
            out = self.vmap.get(id(x), x)
            if out is not x:
                self.used.add(id(x))
            return out
        if isinstance(x, BufferLoad):
            r = self.regs.get(id(x.buffer))
            if r is not None:
                return BufferLoad(r[0], (const(r[1]),))
            return BufferLoad(self.bmap.get(id(x.buffer), x.buffer), tuple(self.e(i) for i in x.indices))
        if isinstance(x, BinOp):
            return BinOp(x.op, self.e(x.a), self.e(x.b), x.dtype)
        if isinstance(x, Cmp):
            return Cmp(x.op, self.e(x.a), self.e(x.b))
        if isinstance(x, Logic):
            return Logic(x.op, self.e(x.a), self.e(x.b) if x.b is not None else None)
        if isinstance(x, Select):
            return Select(self.e(x.cond), self.e(x.t), self.e(x.f))
        if isinstance(x, Cast):
            return Cast(x.dtype, self.e(x.value))
        if isinstance(x, Call):
            return Call(x.name, tuple(self.e(a) for a in x.args), x.dtype, x.attrs)
        if isinstance(x, ShuffleXor):
            return ShuffleXor(self.e(x.value), x.mask, x.width)
        if isinstance(x, ShuffleIndex):
            return ShuffleIndex(self.e(x.value), self.e(x.lane), x.width)
        return x

    def fresh(self, v: Var) -> Var:
        n = Var(v.name, v.dtype)
        self.vmap[id(v)] = n
        return n

    def s(self, x):
        if x is None:
            return None
        if isinstance(x, Seq):
            return Seq([self.s(c) for c in x.body], span=x.span)
        if isinstance(x, Bind):
            value = self.e(x.value)
            return Bind(self.fresh(x.var), value, span=x.span)
        if isinstance(x, For):
            start, extent = self.e(x.start), self.e(x.extent)
            return x.with_(var=self.fresh(x.var), start=start, extent=extent, body=self.s(x.body))
        if isinstance(x, If):
            v = self.decide(x.cond)
            if v is not None:
                kept = x.then if v else x.orelse
                return self.s(kept) if kept is not None else Seq([], span=x.span)
            return x.with_(cond=self.e(x.cond), then=self.s(x.then), orelse=self.s(x.orelse))
        if isinstance(x, Allocate):
            b = Buffer(x.buffer.name, x.buffer.shape, x.buffer.dtype, x.buffer.scope)
            self.bmap[id(x.buffer)] = b
            return x.with_(buffer=b, init=self.e(x.init) if x.init is not None else None)
        if isinstance(x, (Store, Atomic)):
            r = self.regs.get(id(x.buffer))
            if r is not None:
                value = self.e(x.value)
                if isinstance(x, Atomic):
                    from .lower_tile import _combine

                    value = _combine({"add": "sum"}.get(x.op, x.op), BufferLoad(r[0], (const(r[1]),)), value)
                return Store(r[0], (const(r[1]),), value, span=x.span)
            buf = self.bmap.get(id(x.buffer), x.buffer)
            out = x.with_(buffer=buf, indices=tuple(self.e(i) for i in x.indices), value=self.e(x.value))
            private = id(x.buffer) in self.bmap or buf.scope == "register"
            return If(self.guard, out, span=x.span) if self.guard is not None and not private else out
        if isinstance(x, Print):
            out = x.with_(value=self.e(x.value) if x.value is not None else None)
            return If(self.guard, out, span=x.span) if self.guard is not None else out
        if isinstance(x, Assert_):
            return x.with_(cond=self.e(x.cond), values=tuple(self.e(v) for v in x.values))
        return x


from ..ir import Assert as Assert_  # noqa: E402

_HOLDS = {"lt": lambda lo, hi, n: (hi < n, lo >= n), "le": lambda lo, hi, n: (hi <= n, lo > n),
          "gt": lambda lo, hi, n: (lo > n, hi <= n), "ge": lambda lo, hi, n: (lo >= n, hi < n)}
_MIRROR = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _decide_ranges(cond, coords: dict, facts, memo: dict):
    """``decide`` for comparisons of a nest variable with a constant joined by ``and``: True / False / None as the
    prover answers them (its bounds of ``x + k`` are the bounds of ``x`` plus ``k``: the thread part's, asked once a
    nest and kept in ``memo``; D65), NotImplemented for any other form (the prover decides those)."""
    if isinstance(cond, Logic) and cond.op == "and":
        a = _decide_ranges(cond.a, coords, facts, memo)
        if a is NotImplemented or a is False:
            return a
        b = _decide_ranges(cond.b, coords, facts, memo)
        if b is NotImplemented or b is False:
            return b
        return True if a and b else None
    if not isinstance(cond, Cmp) or cond.op not in _HOLDS:
        return NotImplemented
    op, x, n = cond.op, cond.a, const_value(cond.b)
    if not isinstance(n, int):
        op, x, n = _MIRROR[cond.op], cond.b, const_value(cond.a)
    if not (isinstance(x, Var) and id(x) in coords and isinstance(n, int)):
        return NotImplemented
    c = coords[id(x)]
    k = const_value(c.b) if isinstance(c, BinOp) and c.op == "add" else None
    t, k = (c.a, k) if isinstance(k, int) else (c, 0)
    key = ("range", id(t))
    if key not in memo:
        lo, hi = facts.bound(t, False), facts.bound(t, True)
        lo, hi = (const_value(lo) if lo is not None else None), (const_value(hi) if hi is not None else None)
        memo[key] = (t, lo, hi) if isinstance(lo, int) and isinstance(hi, int) else (t, None, None)
    _t, lo, hi = memo[key]
    if lo is None:
        return NotImplemented
    yes, no = _HOLDS[op](lo + k, hi + k, n)
    return True if yes else False if no else None

_FLIP = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}


def _refutes(facts, cond) -> bool:
    """The facts show ``cond`` (comparisons joined by ``and``) false: one conjunct's opposite holds."""
    if isinstance(cond, Logic) and cond.op == "and":
        return _refutes(facts, cond.a) or _refutes(facts, cond.b)
    return isinstance(cond, Cmp) and cond.op in _FLIP and facts.proves(Cmp(_FLIP[cond.op], cond.a, cond.b))


class _Uniform(_Subst):
    """Block-level statements over fragments every thread holds whole (D88): a load of an element at constant
    indices reads the thread's register; a store or atomic into one updates it (every thread does: block-level
    values are uniform)."""

    def __init__(self, lw, loop_vars=None):
        super().__init__({}, {})
        self.lw = lw
        self.loop_vars = loop_vars  # in a nest: only the loads its rules do not cover (_uniform_read)

    def at(self, buf, indices):
        lay = self.lw.plan.layouts[id(buf)]
        _threads, r = lay.locate(tuple(const_value(simplify(i)) for i in indices))
        return self.lw.regbuf[id(buf)], r

    def e(self, x):
        if isinstance(x, BufferLoad) and id(x.buffer) in self.lw.uniform and (
                self.loop_vars is None or _uniform_read(x.indices, self.loop_vars, x.buffer)):
            buf, r = self.at(x.buffer, x.indices)
            return BufferLoad(buf, (const(r),))
        if isinstance(x, AtomicRet):
            return AtomicRet(x.op, x.buffer, tuple(self.e(i) for i in x.indices), self.e(x.value), x.order, x.scope)
        return super().e(x)

    def s(self, x):
        if isinstance(x, (Store, Atomic)) and id(x.buffer) in self.lw.uniform:
            buf, r = self.at(x.buffer, x.indices)
            self.regs = {id(x.buffer): (buf, r)}
            out = super().s(x)
            self.regs = {}
            return PerThread(out, {"layout": repr(self.lw.plan.layouts[id(x.buffer)])}, span=x.span)
        return super().s(x)

    def own(self, x):
        """``x`` with the uniform fragments' loads in its own expressions (not its children's) read from
        registers: a loop's bounds, a branch's condition, a tile op's regions."""
        from ..ir.visit import _CHILDREN

        skip = set(_CHILDREN.get(type(x), ())) | {"span"}
        changes = {}
        for f in getattr(x, "__dataclass_fields__", ()):
            if f in skip:
                continue
            v = getattr(x, f)
            nv = self.value(v)
            if nv is not v:
                changes[f] = nv
        return x.with_(**changes) if changes else x

    def value(self, v):
        if isinstance(v, Expr):
            return self.e(v)
        if isinstance(v, Region):
            return Region(v.buffer, tuple(self.value(as_expr(a)) for a in v.starts),
                          tuple(self.value(as_expr(a)) for a in v.extents))
        if isinstance(v, tuple):
            return tuple(self.value(a) for a in v)
        return v


class _Lowerer:
    def __init__(self, plan: Plan, ctx):
        self.plan, self.ctx = plan, ctx
        self.regbuf: dict = {}   # id(fragment) -> register buffer
        for k, lay in plan.layouts.items():
            b = plan.frags[k]
            self.regbuf[k] = Buffer(b.name, (lay.regs,), b.dtype, "register")
        #: fragments every thread holds whole, which block-level statements may read and write (D88)
        self.uniform = {k for k, lay in plan.layouts.items() if _is_uniform(lay) and k not in plan.operands}

    def uniform_reads(self, s, loops, inner):
        """The nest ``s`` with its reads of uniform fragments at constant indices (``s[2]``) from registers."""
        if not self.uniform:
            return s, loops, inner
        vs = [f.var for f in loops]
        if not any(id(b) in self.uniform and _uniform_read(i, vs, b) for b, i, _w in _accesses(inner, self.plan.frags)):
            return s, loops, inner
        u = _Uniform(self, vs)
        s = rewrite(s, lambda x: None if isinstance(x, Seq) else u.own(x))
        loops, inner = _nest_of(s)
        return s, loops, inner

    def at_block(self, s):
        """A block-level statement (or the header of a loop, branch or tile op) with its accesses to uniform
        fragments in registers; ``s`` itself where it makes none."""
        if not self.uniform or not any(id(b) in self.uniform for b, _i, _w in _block_accesses(s, self.plan.frags)):
            return s
        u = _Uniform(self)
        if isinstance(s, (Store, Atomic)):
            return u.s(s)
        return u.own(s)

    def reg(self, buf):
        return self.regbuf.get(id(buf))

    def touches(self, s) -> bool:
        return any(id(b) in self.regbuf for b, _i, _w in _accesses(s, self.plan.frags))

    # a T.Parallel nest over fragments in registers
    def nest(self, loops, inner, span):
        dom = _nest_domain(self.plan, loops, inner, False)
        D, found = dom
        guard = _replica0(D)
        body, pre, post, shared = [], [], [], []
        tid = ThreadIndex()
        use = {id(b): self.regbuf[id(b)] for b, _p, _m, conv in found if conv is None}
        if any(conv is not None for *_x, conv in found):
            acc = _accesses(inner, self.plan.frags)
            branches = _branches(inner)
            tiles: dict = {}
            for b, _p, _m, conv in found:
                if conv is None or id(b) in use:
                    continue
                tmp = Buffer(f"{b.name}_cv", (conv.regs,), b.dtype, "register")
                use[id(b)] = tmp
                src = self.plan.layouts[id(b)]
                pre.append(Allocate(tmp, span=span))
                written = any(w and x is b for x, _i, w in acc)
                read = any(not w and x is b for x, _i, w in acc)
                if read or branches:  # a write-only nest without branches overwrites every element
                    more, sh = self.convert(self.regbuf[id(b)], src, tmp, conv, span, tiles)
                    pre += more
                    shared += sh
                if written:
                    more, sh = self.convert(tmp, conv, self.regbuf[id(b)], src, span, tiles)
                    post += more
                    shared += sh
        # branches on the nest's loop variables alone resolved per register where the coordinates decide them: only in
        # nests marked so (tilecore.stage_bulk_stores' parts of a tile, D58), other kernels' sources unchanged
        facts = Facts().with_threads(self.plan.threads) if any(
            f.annotations.get(FOLD_BRANCHES) for f in loops) else None
        coords_of = _register_coords(D, tid)
        decided: dict = {}  # (id(cond), this register's coordinates) -> decide's answer, shared by the registers
        for r in range(D.regs):
            coords, fixed = coords_of(r)
            vmap, binds = {}, []
            for f, c in zip(loops, coords):
                v = Var(f.var.name, f.var.dtype)
                binds.append(Bind(v, c, span=span))
                vmap[id(f.var)] = v
            regs = {id(b): (use[id(b)], m[r]) for b, _p, m, _c in found}
            fold = ({id(f.var): c for f, c in zip(loops, coords)}, facts, decided,
                    {id(f.var): k for f, k in zip(loops, fixed)}) if facts is not None else None
            sub = _Subst(vmap, regs, guard, fold)
            done = sub.s(inner)
            if fold is not None and isinstance(done, Seq) and not done.body:
                continue  # every branch of this register resolved to nothing
            # a coordinate the register's statements do not read (its loop variable substituted nowhere) is not
            # bound (D65)
            body += [b for f, b in zip(loops, binds) if id(f.var) in sub.used] + [done]
        out = PerThread(seq(pre + body + post), {"layout": repr(D)}, span=span)
        return seq(shared + [out]) if shared else out

    def _exchange(self, conv, src_buf, dst_buf, span):
        """Register moves and xor shuffles of a :class:`~tilecore.layout.Conversion` (docs/layout.md): for
        each destination register and each of its xor distances ``m``, every thread sends the source
        register its partner ``thread ^ m`` needs (a select over the registers it may be, where that
        differs between threads); then each thread keeps the value of its own distance. Every shuffle is
        evaluated by every thread (bound to a variable before any select). Registers an ``index`` plan
        gathers by indexed shuffles go through :meth:`_gather_indexed`."""
        holder, sreg = conv.tables()
        tid = ThreadIndex()
        out = []
        for r, ms in enumerate(conv.masks):
            if conv.sources and conv.sources[r]:
                out += self._gather_indexed(conv, r, src_buf, dst_buf, span)
                continue
            vals = {}
            for m in ms:
                partner = binary("xor", tid, m) if m else tid
                need = sorted({int(x) for x in sreg[[u ^ m for u in range(conv.dst.threads)], r]})
                sent = BufferLoad(src_buf, (const(need[-1]),))
                if len(need) > 1:
                    _t, reg_e = conv.slot_exprs(partner, r)
                    for k in reversed(need[:-1]):
                        sent = Select(compare("eq", reg_e, const(k)), BufferLoad(src_buf, (const(k),)), sent)
                v = Var(f"xc{m}", src_buf.dtype)
                if m:  # shuffles move 32-bit words (every target's spelling takes them): narrower values widen
                    wide = _shuffle_dtype(src_buf.dtype)
                    x = ShuffleXor(cast(wide, sent) if wide != src_buf.dtype else sent, m, conv.width)
                    sent = cast(src_buf.dtype, x) if wide != src_buf.dtype else x
                out.append(Bind(v, sent, span=span))
                vals[m] = v
            val = vals[ms[-1]]
            if len(ms) > 1:
                hold, _r = conv.slot_exprs(tid, r)
                dist = simplify(binary("xor", tid, hold))
                for m in reversed(ms[:-1]):
                    val = Select(compare("eq", dist, const(m)), vals[m], val)
            out.append(Store(dst_buf, (const(r),), val, span=span))
        return out

    def _gather_indexed(self, conv, r, src_buf, dst_buf, span):
        """Destination register ``r`` of an ``index`` plan: for each source register ``k`` it reads, one
        indexed shuffle (every thread sends its register ``k``, each reads the lane holding its element:
        :meth:`~tilecore.layout.Conversion.lane_expr`), bound to a variable so every thread evaluates every
        shuffle; then each thread keeps the value of its own source register (a select where that differs
        between threads)."""
        tid = ThreadIndex()
        lane = conv.lane_expr(tid, r)
        ks = conv.sources[r]
        wide = _shuffle_dtype(src_buf.dtype)
        out, vals = [], []
        for k in ks:
            sent = BufferLoad(src_buf, (const(k),))
            x = ShuffleIndex(cast(wide, sent) if wide != src_buf.dtype else sent, lane, conv.width)
            v = Var(f"xi{k}", src_buf.dtype)
            out.append(Bind(v, cast(src_buf.dtype, x) if wide != src_buf.dtype else x, span=span))
            vals.append(v)
        val = vals[-1]
        if len(ks) > 1:
            _t, reg_e = conv.slot_exprs(tid, r)
            for k, v in zip(reversed(ks[:-1]), reversed(vals[:-1])):
                val = Select(compare("eq", reg_e, const(k)), v, val)
        out.append(Store(dst_buf, (const(r),), val, span=span))
        return out

    def convert(self, src_buf, src: FragmentLayout, dst_buf, dst: FragmentLayout, span, tiles=None):
        """Statements (inside a PerThread) that fill ``dst_buf``'s registers, laid out by ``dst``, with the
        elements ``src_buf`` holds in ``src``; and the block-level allocations they need. Register moves, xor
        and indexed shuffles where :func:`~tilecore.layout.plan_conversion` finds them, else a round trip
        through a shared tile of the fragment's shape (row-major): a barrier (earlier readers of the tile are done),
        every first replica stores its registers, a barrier, every thread loads its new registers. ``tiles``
        (shape, dtype -> shared buffer) lets the conversions around one statement share one tile."""
        conv = self.plan.conversion(src, dst) if self.plan.convert is True else None
        if conv is not None and conv.kind != "shared":
            return self._exchange(conv, src_buf, dst_buf, span), []
        n = math.prod(src.shape)
        tiles = {} if tiles is None else tiles
        new = (n, dst_buf.dtype) not in tiles
        if new:
            tiles[(n, dst_buf.dtype)] = Buffer(f"{dst_buf.name}_xchg", (n,), dst_buf.dtype, "shared")
        scratch = tiles[(n, dst_buf.dtype)]
        tid = ThreadIndex()

        def offset(coords):
            off, place = const(0), 1
            for c, e in reversed(list(zip(coords, src.shape))):
                off = binary("add", off, binary("mul", c, place))
                place *= e
            return simplify(off)

        out = [Barrier(span=span)]
        guard = _replica0(src)
        for r in range(src.regs):
            st = Store(scratch, (offset(src.coords_expr(tid, r)),), BufferLoad(src_buf, (const(r),)), span=span)
            out.append(If(guard, st, span=span) if guard is not None else st)
        out.append(Barrier(span=span))
        for r in range(dst.regs):
            out.append(Store(dst_buf, (const(r),), BufferLoad(scratch, (offset(dst.coords_expr(tid, r)),)), span=span))
        return out, [Allocate(scratch, span=span)] if new else []

    def gemm(self, op):
        a, b, c = op.args
        gp = self.plan.gemm_plans.get(id(op))
        L = self.plan.layouts[id(c.buffer)]
        C = self.regbuf[id(c.buffer)]
        if gp is not None:
            from .matrix import lower_gemm

            registers = {id(self.plan.frags[k]): (self.regbuf[k], self.plan.layouts[k]) for k in self.regbuf}
            return PerThread(seq(lower_gemm(op, gp, registers, self.ctx)), {"layout": repr(L), "gemm": gp.unit.name
                                                                             if hasattr(gp.unit, "name") else "unit"},
                             span=op.span)
        from .lower_tile import matrix_index

        ta, tb = op.attrs.get("transpose_A"), op.attrs.get("transpose_B")
        kext = a.extents[-2] if ta else a.extents[-1]
        acc = c.buffer.dtype
        tid = ThreadIndex()
        rows, cols, binds = {}, {}, []
        for r in range(L.regs):
            fi, fj = L.element(0, r)  # the register part of the coordinates (thread 0 holds offset 0)
            ci, cj = L.coords_expr(tid, r)
            if fi not in rows:
                rows[fi] = Var("gi")
                binds.append(Bind(rows[fi], simplify(ci), span=op.span))
            if fj not in cols:
                cols[fj] = Var("gj")
                binds.append(Bind(cols[fj], simplify(cj), span=op.span))
        kk = Var("gk")
        av = {fi: Var("ga", acc) for fi in rows}
        bv = {fj: Var("gb", acc) for fj in cols}
        step = [Bind(av[fi], cast(acc, BufferLoad(a.buffer, matrix_index(a, kk, v) if ta else matrix_index(a, v, kk))),
                     span=op.span) for fi, v in rows.items()]
        step += [Bind(bv[fj], cast(acc, BufferLoad(b.buffer, matrix_index(b, v, kk) if tb else matrix_index(b, kk, v))),
                      span=op.span) for fj, v in cols.items()]
        for r in range(L.regs):
            fi, fj = L.element(0, r)
            cur = BufferLoad(C, (const(r),))
            step.append(Store(C, (const(r),), binary("add", cur, binary("mul", av[fi], bv[fj])), span=op.span))
        pre = []
        if op.attrs.get("clear_accum"):
            pre = [Store(C, (const(r),), const(0, acc), span=op.span) for r in range(L.regs)]
        loop = For(kk, as_expr(0), kext, "serial", seq(step), span=op.span)
        return PerThread(seq(pre + binds + [loop]), {"layout": repr(L), "gemm": "owner-computes"}, span=op.span)

    def reduce(self, op):
        from .lower_tile import _combine, _nonunit, _reduce_init

        src, dst = op.args
        kind, dim, clear = op.attrs["kind"], op.attrs["dim"], op.attrs["clear"]
        dtype = dst.buffer.dtype
        L = self.plan.layouts[id(src.buffer)]
        S = self.regbuf[id(src.buffer)]
        P = _result_layout(L, dim, _shape(dst.buffer))
        D = self.regbuf.get(id(dst.buffer))
        tid = ThreadIndex()
        part = Buffer("part", (P.regs,), dtype, "register")
        ident = _reduce_init(kind, dtype)
        merge = {"abssum": "sum", "absmax": "max"}.get(kind, kind)
        out = [Allocate(part, span=op.span)]
        back, xchg = [], []
        have = self.plan.layouts.get(id(dst.buffer))
        if D is not None and have != P:
            # the result is computed in the projection's layout and converted into the fragment's
            tmp = Buffer(f"{dst.buffer.name}_cv", (P.regs,), D.dtype, "register")
            out.append(Allocate(tmp, span=op.span))
            tiles: dict = {}
            if not clear:
                more, sh = self.convert(D, have, tmp, P, op.span, tiles)
                out += more
                xchg += sh
            back, sh = self.convert(tmp, P, D, have, op.span, tiles)
            xchg += sh
            D = tmp
        groups: dict = {}
        for r in sorted(range(L.regs), key=lambda r: L.element(0, r)[dim]):
            groups.setdefault(P.reg_of(L, r, dropped=dim), []).append(r)
        chains = self._reduce_chains(kind, max((len(g) for g in groups.values()), default=0))
        if chains > 1:  # D66: each group's elements as interleaved partial chains, then a tree of their results
            chain = Buffer("part_c", (P.regs * chains,), dtype, "register")
            out.append(Allocate(chain, span=op.span))
        for q in range(P.regs):  # one combine per statement: emitters print each expression once
            if chains > 1:
                out += self._chained(kind, part, chain, q, chains, groups.get(q, []), S, ident, dtype, op.span)
                continue
            out.append(Store(part, (const(q),), ident, span=op.span))
            for r in groups.get(q, []):
                cur = BufferLoad(part, (const(q),))
                out.append(Store(part, (const(q),), _combine(kind, cur, cast(dtype, BufferLoad(S, (const(r),)))),
                                 span=op.span))
        masks = L.reduce_masks(dim)
        pre = []
        if masks:
            pre, more = self._row_combine(L, dim, P, part, merge, ident, masks, self._lockstep_width(), op.span)
            out += more
        ddims = _nonunit(dst.extents)
        guard = _replica0(P) if D is None else None
        for q in range(P.regs):
            coords = P.coords_expr(tid, q)
            if D is not None:
                old, ref = BufferLoad(D, (const(q),)), (D, (const(q),))
            else:
                idx = list(dst.starts)
                for d, c in zip(ddims, coords):
                    idx[d] = binary("add", idx[d], c)
                idx = tuple(simplify(i) for i in idx)
                old, ref = BufferLoad(dst.buffer, idx), (dst.buffer, idx)
            val = BufferLoad(part, (const(q),))
            if not clear:
                val = _combine(merge, old, val)
            st = Store(ref[0], ref[1], cast(ref[0].dtype, val), span=op.span)
            out.append(If(guard, st, span=op.span) if guard is not None else st)
        out += back
        return pre + xchg + [PerThread(seq(out), {"layout": repr(L), "reduce": kind}, span=op.span)]

    #: pass config (D66): a fragment's per-thread row reduction of kind max / min / absmax as that many interleaved
    #: partial chains of each row's elements, their results combined as a tree (the dependency depth of a 32-element
    #: row: 32 as one chain, 8 + 2 as four); the same result (max and min do not round; NaN propagates whichever the
    #: order). An int >= 1 (1: one chain) or "auto" (4 where a row holds 16 elements a thread or more in FlashAttention's
    #: form, bulkstore.attention_form; one chain elsewhere), "fast" ("auto" under fast math, else one chain). Default:
    #: REDUCE_CHAINS_DEFAULT ("fast" since D70)
    REDUCE_CHAINS_OPTION = "tilecore.reduce_chains"
    #: D70: "fast" by default (one chain before): "auto" under tilecore.fast_math, one chain otherwise. Fast math's
    #: rows +2 to +9% with the unswitched iteration (H200, H100: a one-chain row maximum let the assembler wait for
    #: P @ V after its first shuffle: 54 instructions beside P @ V against the register program's 108); the exact
    #: build's causal rows -2 to -3% with chains in two runs: one chain there
    REDUCE_CHAINS_DEFAULT = "fast"

    def _reduce_chains(self, kind: str, n: int) -> int:
        v = self.ctx.option(self.REDUCE_CHAINS_OPTION, self.REDUCE_CHAINS_DEFAULT) if hasattr(self.ctx, "option") else 1
        if kind not in ("max", "min", "absmax") or n < 4:
            return 1
        if v == "fast":  # D70: "auto" under fast math, one chain otherwise
            v = "auto" if self.ctx.option("tilecore.fast_math", False) else 1
        if v == "auto":
            from .bulkstore import attention_form

            launch = getattr(self, "launch", None)
            v = 4 if n >= 16 and launch is not None and attention_form(launch, self.ctx) else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            from ..errors import CompileError

            raise CompileError(f"{self.REDUCE_CHAINS_OPTION}: an int >= 1, \"auto\" or \"fast\", not {v!r}")
        return max(1, min(v, n // 2))

    @staticmethod
    def _chained(kind, part, chain, q, chains, regs, S, ident, dtype, span) -> list:
        """``part[q]`` = the reduction of ``S[regs]`` as ``chains`` partial chains (element i in chain i % chains,
        each starting at its first element: the identity combined with it is that element for a max or min that
        propagates NaN or compares, and for fmaxf / fminf differs only where every element of a chain is NaN: fast
        math), then pairwise combines of the chains' results."""
        from .lower_tile import _combine

        merge = {"absmax": "max"}.get(kind, kind)
        base = q * chains
        out = []
        for i, r in enumerate(regs):
            at = (const(base + i % chains),)
            x = cast(dtype, BufferLoad(S, (const(r),)))
            if i < chains and kind != "absmax":  # max(identity, x) is x (a NaN x: NaN either way but for fmaxf)
                out.append(Store(chain, at, x, span=span))
                continue
            out.append(Store(chain, at, _combine(kind, ident if i < chains else BufferLoad(chain, at), x), span=span))
        live = list(range(chains))
        while len(live) > 1:
            nxt = []
            for a, b in zip(live[0::2], live[1::2]):
                at = (const(base + a),)
                out.append(Store(chain, at, _combine(merge, BufferLoad(chain, at), BufferLoad(chain, (const(base + b),))),
                                 span=span))
                nxt.append(a)
            if len(live) % 2:
                nxt.append(live[-1])
            live = nxt
        out.append(Store(part, (const(q),), BufferLoad(chain, (const(base),)), span=span))
        return out

    def _lockstep_width(self):
        """The lanes that run in lockstep and exchange by shuffles: the target's static width (an int; 1 where
        it has no shuffles or the block is not whole groups of them), or ``ShuffleWidth()`` where the profile
        says the width is known only at run time (``simd_width: dynamic``, uniform over the block)."""
        width = shuffle_width(self.ctx, self.plan.threads, dynamic=True)
        if width == "dynamic":
            return ShuffleWidth()
        return width if width >= 2 else 1

    @staticmethod
    def _shuffles(P, part, merge, masks, width, span) -> list:
        from .lower_tile import _combine

        out = []
        for m in masks:
            for q in range(P.regs):
                cur = BufferLoad(part, (const(q),))
                out.append(Store(part, (const(q),), _combine(merge, cur, ShuffleXor(cur, m, width)), span=span))
        return out

    def _row_combine(self, L, dim, P, part, merge, ident, masks, width, span):
        """Combine a row's partials over the row's threads, ``masks`` its butterfly (distinct powers of two,
        ``reduce_masks``), ``width`` the lockstep width (:meth:`_lockstep_width`: an int, or an expression
        known at run time). One body for both: the masks below ``width`` as xor shuffles, then, where some mask
        reaches ``width``, the shared-memory combine over the row's threads whose offset is a multiple of
        ``width`` (each holds its group's total). With an int every test folds: the shuffles of the masks
        below it (their width operand the group's width), the shared-memory combine only where the row
        crosses groups (a row over several warps: D37), over every thread of the row where ``width`` is 1
        (no shuffles). With an expression each test stays an ``if`` (uniform over the block: D21's two
        paths), a shuffle's width operand ``2 * mask`` (a segment the mask stays in, whatever ``width``
        is); ``width = 1`` then runs the shared-memory path alone, ``width`` above every mask the shuffles
        alone. ``(allocations, statements)``."""
        static = isinstance(width, int)
        out: list = []
        for m in masks:
            out += _when(compare("lt", const(m), width),
                         self._shuffles(P, part, merge, (m,), width if static else 2 * m, span), span)
        across = compare("le", width, const(max(masks)))
        if const_value(across) == 0:
            return [], out
        pre, combine = self._scratch_combine(L, dim, P, part, merge, ident, span, width=width)
        return pre, out + _when(across, combine, span)

    def _scratch_combine(self, L, dim, P, part, merge, ident, span, width=1):
        """Combine a row's partials through shared memory: every thread writes its partials, a barrier, then
        each combines those of the threads of its row, in the same order on every thread. With ``width`` (an
        int or an expression: groups of that many threads have already combined by shuffles) only the threads
        at offsets that are multiples of it join in. No barrier before the writes or after the reads: the
        caller's per-thread program reads shared memory, so thread distribution (``tilecore.simt_distribute``,
        the only way fragments reach registers: :func:`runs_on_threads`) puts a barrier before it and after it;
        the scratch is the reduction's own, so nothing else reads or writes it in between."""
        from .lower_tile import _combine

        n = self.plan.threads
        scratch = Buffer("red_scratch", (n * P.regs,), part.dtype, "shared")
        tid = ThreadIndex()
        digs = [d for d in L.dims[dim] if d.space == "thread" and d.extent > 1]
        base = tid
        for d in digs:
            base = binary("sub", base, binary("mul", binary("floormod", binary("div", tid, d.stride), d.extent),
                                              d.stride))
        b = Var("row0")
        out = [Store(scratch, (binary("add", binary("mul", tid, P.regs), q),), BufferLoad(part, (const(q),)),
                     span=span) for q in range(P.regs)]
        out += [Barrier(span=span), Bind(b, base, span=span)]
        for q in range(P.regs):
            out.append(Store(part, (const(q),), ident, span=span))
            for vals in itertools.product(*(range(d.extent) for d in digs)):
                off = sum(v * d.stride for v, d in zip(vals, digs))
                cur = BufferLoad(part, (const(q),))
                x = BufferLoad(scratch, (binary("add", binary("mul", binary("add", b, off), P.regs), q),))
                st = Store(part, (const(q),), _combine(merge, cur, x), span=span)
                # a thread whose group total is its lowest's: offsets below the width's multiples drop out
                out += _when(compare("le", width, const(off & -off)), [st], span) if off else [st]
        return [Allocate(scratch, span=span)], out

    # the block-level program
    def block(self, s):
        if s is None:
            return None
        if isinstance(s, Seq):
            return seq([self.block(c) for c in s.body]) or Seq([])
        if isinstance(s, Allocate) and id(s.buffer) in self.regbuf:
            return Allocate(self.regbuf[id(s.buffer)], span=s.span)
        if isinstance(s, For) and s.kind in _NEST:
            loops, inner = _nest_of(s)
            s, loops, inner = self.uniform_reads(s, loops, inner)
            if self.touches(inner):
                return self.nest(loops, inner, s.span)
            return s
        if isinstance(s, For):
            return self.at_block(s).with_(body=self.block(s.body))
        if isinstance(s, If):
            return self.at_block(s).with_(then=self.block(s.then), orelse=self.block(s.orelse))
        if isinstance(s, TileOp):
            s = self.at_block(s)
            live = [a.buffer for a in s.args if getattr(a, "buffer", None) is not None and id(a.buffer) in self.regbuf]
            if not live:
                return s
            if s.op == "gemm":
                return self.gemm(s)
            if s.op == "reduce":
                if id(s.args[0].buffer) in self.regbuf:
                    return seq(self.reduce(s))
                loops, inner = _nest_of(_reduce_nest(s, self.ctx))
                return self.nest(loops, inner, s.span)
            loops, inner = _nest_of(_expand(s, self.ctx))
            if not loops:  # a single element (D88)
                return self.block(inner)
            _s, loops, inner = self.uniform_reads(loops[0], loops, inner)
            return self.nest(loops, inner, s.span)
        return self.at_block(s)


def _when(cond, stmts: list, span) -> list:
    """``stmts`` under ``cond``: as they are where it folds to true, nothing where false, else one ``if``."""
    v = const_value(simplify(cond))
    if v is not None:
        return list(stmts) if v else []
    return [If(cond, seq(stmts), span=span)] if stmts else []


def _shuffle_dtype(dtype: str) -> str:
    """The type a value of ``dtype`` crosses a shuffle in (narrow floats as float32, narrow ints as int32)."""
    from ..ir.dtypes import canonical, is_float

    if canonical(dtype).bits >= 32:
        return dtype
    return "float32" if is_float(dtype) else "int32"


def _result_layout(L: FragmentLayout, dim: int, dst_shape) -> FragmentLayout:
    """The layout of a reduction's result: the projection (a 1-D source reduces into a 1-element fragment)."""
    P = L.project(dim, name="fragment")
    if P.shape == () and dst_shape == (1,):
        from ..layout import Digit

        P = FragmentLayout((1,), [[Digit("reg", 1, 1)]], P.replicate, "fragment")
    return P


def _reduce_nest(op, ctx):
    from .lower_tile import lower_reduce

    return lower_reduce(op, ctx)


@tile_pass("tilecore.lower_fragments")
def lower_fragments(func, ctx):
    """Fragments with a layout become per-thread registers; the statements over them, PerThread programs."""
    if not runs_on_threads(ctx):
        return func
    annotations = getattr(ctx, "fragment_annotations", {})
    plans = []

    def fix(s):
        if not isinstance(s, KernelLaunch):
            return None
        plan = infer_launch(s, ctx, annotations)
        if plan is None:
            return None
        plans.append(plan)
        if not plan.layouts:
            return None
        lw = _Lowerer(plan, ctx)
        lw.launch = s
        return s.with_(body=lw.block(s.body))

    body = rewrite(func.body, fix)
    if not plans:
        return func
    return func.with_body(body, fragment_layouts=_record(plans))


__all__ = ["infer_layouts", "lower_fragments", "infer_launch", "runs_on_threads", "MAX_REGS"]

_ = (math, IntImm)
