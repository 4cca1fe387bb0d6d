"""T.gemm on a registered matrix unit, with the accumulator in registers (the core's side of
:class:`tilecore.layout.MatrixUnit`).

Contract used by the layout pass (tilecore/passes/layout.py):

- :func:`plan_gemm` is asked, for each ``T.gemm`` whose C is a fragment (and whose A and B are in shared
  memory, or fragments the layout pass keeps there: it never passes an operand held in registers), whether one of the target's matrix
  units (``ctx.matrix_units``) can run it over the block's ``threads``; it returns a
  :class:`GemmPlan` whose ``c_layout`` (the unit's accumulator layout tiled over the block's groups and
  registers) becomes C's layout, or None (C then takes the core's blocked layout and the generic
  register GEMM, or the backend's own GEMM intrinsic); the reason is appended to ``ctx.notes`` as
  ``"tilecore.matrix: ..."``. The pass config ``tilecore.matrix_unit_gemm=False`` keeps every gemm off the
  units (decision D13 has the history: the backend's own GEMM went first until operand loads had a spelling).
- :func:`lower_gemm` turns the op into the statements each thread runs (placed inside a
  :class:`~tilecore.ir.PerThread` by the caller): operand loads into ``register`` buffers by the unit's A and
  B layouts, and one :class:`~tilecore.ir.MatrixOp` per unit instruction. ``registers`` maps each fragment
  in registers (by ``id(buffer)``) to ``(register buffer, layout)``.

The plan: the block's ``threads / unit.group`` groups are arranged ``wm x wn`` over C's rows and columns
(group ``g`` takes atom row ``g % wm`` and atom column ``g / wm``, then every ``wm``-th and ``wn``-th atom),
and each thread holds ``mt x nt`` atoms in its registers: atom ``(mi, ni)`` is registers
``(mi + mt ni) c.regs ..`` of C, rows ``unit.m (g % wm + wm mi) ..``, columns ``unit.n (g / wm + wn ni) ..``.
For each step of ``unit.k`` along K, every thread loads its A registers (one set per atom row) and B
registers (one per atom column) from shared memory at the coordinates the unit's layouts give for its lane
(a :class:`~tilecore.ir.MatrixLoad` per atom: the backend may spell it as one cooperative load, e.g.
ldmatrix, or vector reads, else its fallback stores each register), then issues the ``mt x nt``
instructions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import CompileError
from ..ir import (Allocate, AsyncCopy, Buffer, BufferLoad, BulkStore, Collective, For, KernelLaunch, MatrixLoad, MatrixOp,
                  MatrixSync, Region, Store, TileOp, collect, rewrite, walk, ThreadIndex, Var, as_expr, binary, const,
                  const_value, seq)
from ..layout import FragmentLayout, MatrixUnit, SharedLayout
from . import tile_pass



def mark_block_threads(func):
    """Record the block's thread count on each ``T.gemm`` (``attrs["block_threads"]``), for backends whose
    intrinsic tables decide by it (a matrix instruction needs whole warps, simdgroups or waves). The plugins run
    it as a pass of their own before the pass that reads it."""

    def launch(s):
        if not isinstance(s, KernelLaunch):
            return None
        n = 1
        for t in s.threads:
            n *= int(const_value(as_expr(t)) if not isinstance(t, int) else t)

        def mark(x):
            if isinstance(x, TileOp) and x.op == "gemm":
                return x.with_(attrs={**x.attrs, "block_threads": n})
            return None

        return s.with_(body=rewrite(s.body, mark))

    return func.with_body(rewrite(func.body, launch))

@dataclass
class GemmPlan:
    unit: MatrixUnit
    c_layout: FragmentLayout
    attrs: dict = field(default_factory=dict)


_ON_CHIP = ("shared", "fragment")
#: T.GemmWarpPolicy as the DSL records it (the enum's value or its name)
_POLICY = {"1": "row", "GemmWarpPolicy.FullRow": "row"}


def _static(exprs) -> tuple | None:
    vals = tuple(const_value(as_expr(e)) for e in exprs)
    return None if any(v is None for v in vals) else tuple(int(v) for v in vals)


def _why_not(op, threads: int, ctx):
    """``(unit, (wm, wn), (M, N, K))`` for ``op``, or a string saying why no unit runs it."""
    a, b, c = op.args
    # a fragment operand here is one the layout pass keeps in shared memory (it refuses operands in registers)
    if a.buffer.scope not in _ON_CHIP or b.buffer.scope not in _ON_CHIP:
        return f"A and B must be in shared memory (A is {a.buffer.scope}, B is {b.buffer.scope})"
    if c.buffer.scope != "fragment" or len(c.extents) != 2 or _static(c.starts) != (0, 0) \
            or _static(c.extents) != _static(c.buffer.shape):
        return "C must be a whole 2-D fragment"
    ta, tb = bool(op.attrs.get("transpose_A")), bool(op.attrs.get("transpose_B"))
    ext_a, ext_b, ext_c = _static(a.extents[-2:]), _static(b.extents[-2:]), _static(c.extents)
    if ext_a is None or ext_b is None or ext_c is None:
        return "the tile shapes are not constants"
    (m, n), k = ext_c, (ext_a[0] if ta else ext_a[1])
    if a.buffer.dtype != b.buffer.dtype:
        return f"A and B have different dtypes ({a.buffer.dtype}, {b.buffer.dtype})"
    why, found = [], []
    for u in ctx.matrix_units:
        if u.c.opaque:
            # a fragment whose placement the hardware hides: not this lowering's form (the backend's gemm
            # intrinsic runs it, the accumulator in memory)
            why.append(f"{u.spelling}'s accumulator is an opaque fragment")
            continue
        name = u.spelling
        shared = _operand_forms(u, ((a, ta), (b, tb)), ctx)
        if isinstance(shared, str):
            why.append(shared)
            continue
        if a.buffer.dtype not in u.a_dtypes or c.buffer.dtype != u.acc_dtype:
            why.append(f"{name} multiplies {'/'.join(u.a_dtypes)} into {u.acc_dtype}")
            continue
        if threads % u.group:
            why.append(f"{name} runs on groups of {u.group} threads, the block has {threads}")
            continue
        if m % u.m or n % u.n or k % u.k:
            why.append(f"{name} needs M, N, K multiples of {u.m}, {u.n}, {u.k} (the gemm is {m}x{n}x{k})")
            continue
        groups = threads // u.group
        fits = [(wm, groups // wm) for wm in range(1, groups + 1)
                if groups % wm == 0 and (m // u.m) % wm == 0 and (n // u.n) % (groups // wm) == 0]
        if not fits:
            why.append(f"{name}: {groups} groups of {u.group} threads do not divide {m // u.m}x{n // u.n} atoms")
            continue
        # T.GemmWarpPolicy.FullRow: every group down the rows (each holds whole rows of C, as an operand taken
        # from registers needs). Otherwise (FullCol too: groups across the columns would split every row
        # reduction between groups) the squarest tile per group; on a tie groups go down the rows
        policy = _POLICY.get(str(op.attrs.get("policy")))
        chosen = [f for f in fits if policy != "row" or f[1] == 1] or fits
        wm, wn = min(chosen, key=lambda f: (m // f[0] + n // f[1], -f[0]))
        found.append((u, (wm, wn), shared))
    if not found:
        return "; ".join(why) or "the target has no matrix unit with register operands"
    # the unit that issues the fewest instructions (a larger atom), the target's order on a tie
    u, groups, shared = min(found, key=lambda f: (m * n * k) // (f[0].m * f[0].n * f[0].k * threads // f[0].group))
    return u, groups, (m, n, k), shared


def _operand_forms(u: MatrixUnit, operands, ctx):
    """``{operand: SharedLayout}`` for the operands (``(region, stored transposed)`` of A and B) ``u``'s
    instruction reads from their shared tiles itself, or a string saying why ``u`` cannot take the gemm: an
    operand it can only read itself whose tile it cannot read."""
    shared = {}
    for x, (r, trans), extent in zip("ab", operands, (u.m, u.n)):
        form = _shared_form(u, x, r, trans, extent, ctx)
        if isinstance(form, SharedLayout):
            shared[x] = form
        elif getattr(u, x).opaque or "register" not in _sources(u, x):
            return f"{u.spelling} reads {x.upper()} from shared memory itself: {form}"
    return shared


def _sources(u: MatrixUnit, x: str) -> tuple:
    """Where ``u``'s instruction takes operand ``x`` from: ``register`` (loaded by the threads, by the unit's
    layout) and/or ``shared`` (read from a shared tile by the instruction: ``attrs["operand_sources"]``)."""
    return tuple(u.attrs.get("operand_sources", {}).get(x, ("register",)))


def _shared_form(u: MatrixUnit, x: str, r: Region, trans: bool, extent: int, ctx):
    """The paneled :class:`SharedLayout` in which ``u``'s instruction reads operand ``x`` (region ``r``,
    stored transposed or not) from shared memory, or a string saying why it cannot. The unit lists the panel
    widths it reads (``attrs["shared_swizzles"]``, bytes); an operand stored with its M/N dimension
    contiguous ("MN-major": A transposed, B not) needs the instruction's ``extent`` along it to be whole
    panels; a unit with ``attrs["k_major_only"]`` reads no MN-major operand."""
    if "shared" not in _sources(u, x):
        return "the unit loads it into registers"
    buf = r.buffer
    if buf.scope != "shared" or buf.base is not None:
        return f"{buf.name} is not a shared tile of its own ({buf.scope})"
    if ctx.option("tilecore.swizzle_operand_tiles", True) is False:
        return "pass config tilecore.swizzle_operand_tiles is False (the instruction reads swizzled tiles)"
    shape = buf.static_shape()
    if shape is None or len(shape) < 2 or _static(r.starts[-2:]) != (0, 0) or _static(r.extents[-2:]) != tuple(shape[-2:]):
        return f"the gemm does not read the whole {buf.name} tile"
    rows, cols = shape[-2:]
    e = buf.dtype.bytes
    if rows % 8 or 16 % e:
        return f"{buf.name} has {rows} rows (whole groups of 8 are read)"
    mn_major = trans if x == "a" else not trans
    if mn_major and u.attrs.get("k_major_only"):  # (a unit with no transposed form, e.g. for 8-bit types)
        return (f"{buf.name} is stored with its {'M' if x == 'a' else 'N'} dimension contiguous; {u.spelling} reads "
                f"{x.upper()} with K contiguous only" + (" (give B as (N, K) with transpose_B)" if x == "b" else ""))
    for span in sorted(u.attrs.get("shared_swizzles", ()), reverse=True):
        if (cols * e) % span == 0 and (not mn_major or (extent * e) % span == 0):
            return SharedLayout(rows, cols, e, swizzle_bytes=span, panels=True)
    return (f"{buf.name}'s rows are {cols * e} bytes" + (f" and the instruction spans {extent * e} of them" if mn_major else "")
            + f"; it reads panels of {', '.join(map(str, u.attrs.get('shared_swizzles', ())))} bytes")


def plan_gemm(op, threads: int, ctx) -> GemmPlan | None:
    """A plan for ``op`` (a ``T.gemm`` TileOp) on a matrix unit of the target, or None (with the reason in
    ``ctx.notes``)."""
    found = _why_not(op, threads, ctx)
    c = op.args[2].buffer
    if ctx.option("tilecore.matrix_unit_gemm", True) is False:
        found = "pass config tilecore.matrix_unit_gemm is False"
    if isinstance(found, str):
        note = f"tilecore.matrix: gemm into {c.name} stays off the matrix units: {found}"
        if note not in ctx.notes:  # the layout pass may ask again while it settles
            ctx.notes.append(note)
        return None
    u, (wm, wn), (m, n, k), shared = found
    mt, nt = m // (u.m * wm), n // (u.n * wn)
    lay = u.c.tile(0, wm, "thread").tile(1, wn, "thread").tile(0, mt, "reg").tile(1, nt, "reg",
                                                                                   name=f"{u.spelling}.C x {wm}x{wn} groups")
    attrs = {"unit": u.spelling, "groups": (wm, wn), "atoms": (mt, nt), "k_steps": k // u.k}
    if shared:  # operands the instruction reads from their tiles itself, with the tile layout it reads
        attrs["shared"] = shared
    # A may come from registers (a fragment the layout pass keeps there): each thread then holds, for every
    # atom row and k step, the unit's A registers of its lane; register (mi + mt ks) a.regs + r
    a_lay = u.a.tile(0, wm, "thread").tile(0, mt, "reg").tile(1, k // u.k, "reg", name=f"{u.spelling}.A x {wm} groups")
    attrs["a_layout"] = a_lay.replicate_over(wn) if wn > 1 else a_lay
    return GemmPlan(u, lay, attrs)


def lower_gemm(op, plan: GemmPlan, registers: dict, ctx) -> list:
    """The per-thread statements of ``op`` on ``plan.unit`` (a list; see the module docstring)."""
    u = plan.unit
    a, b, c = op.args
    ta, tb = bool(op.attrs.get("transpose_A")), bool(op.attrs.get("transpose_B"))
    wm, wn = plan.attrs["groups"]
    mt, nt = plan.attrs["atoms"]
    creg, clay = registers[id(c.buffer)]
    if clay != plan.c_layout:
        raise ValueError(f"gemm into {c.buffer.name}: its registers are laid out as {clay}, the plan needs {plan.c_layout}")
    tid = ThreadIndex()
    lane = binary("floormod", tid, u.group) if wm * wn > 1 else tid
    group = binary("div", tid, u.group)
    g_row = binary("floormod", group, wm) if wm > 1 else const(0)
    g_col = binary("div", group, wm) if wm > 1 else group if wn > 1 else const(0)  # one group: thread / group is 0
    areg = Buffer(f"{c.buffer.name}_mma_a", (mt * u.a.regs,), a.buffer.dtype, "register")
    breg = Buffer(f"{c.buffer.name}_mma_b", (nt * u.b.regs,), b.buffer.dtype, "register")
    kk = Var("mk")
    k0 = binary("mul", kk, u.k)

    def at(r, row, col, trans):  # element (row, col) of the matrix region r views, transposed or not
        idx = list(r.starts)
        i, j = (col, row) if trans else (row, col)
        idx[-2], idx[-1] = binary("add", idx[-2], i), binary("add", idx[-1], j)
        return BufferLoad(r.buffer, tuple(idx))

    def load(operand, r, dst, offset, lay, row0, col0, trans, steps):
        """One operand atom: a MatrixLoad whose fallback stores each register of the lane by ``lay``."""
        stores = []
        for q in range(lay.regs):
            i, j = lay.coords_expr(lane, q)
            stores.append(Store(dst, (const(offset + q),), at(r, binary("add", row0, i), binary("add", col0, j), trans),
                                span=op.span))
        # the origin's last index is the region's start plus a multiple of the unit's step along that axis
        start = const_value(r.starts[-1])
        step = steps[0] if trans else steps[1]
        align = math.gcd(step, int(start)) if start is not None else 1
        return MatrixLoad(u.spelling, operand, dst, offset, at(r, row0, col0, trans), lane, trans, align, seq(stores),
                          span=op.span)

    body = []
    a_regs = registers.get(id(a.buffer))
    if a_regs is not None and a_regs[1] != plan.attrs["a_layout"]:
        raise ValueError(f"gemm operand {a.buffer.name}: its registers are laid out as {a_regs[1]}, the plan needs "
                         f"{plan.attrs['a_layout']}")
    # operands the instruction reads from their shared tiles itself (a paneled layout, MatrixOp's origins)
    shared = dict(plan.attrs.get("shared", {}))
    if a_regs is not None:
        shared.pop("a", None)
    row0 = [binary("mul", binary("add", g_row, wm * mi), u.m) for mi in range(mt)]
    col0 = [binary("mul", binary("add", g_col, wn * ni), u.n) for ni in range(nt)]
    for mi in range(mt):
        if a_regs is not None:  # A in registers in the unit's order: moves the compiler folds away
            for r in range(u.a.regs):
                src = binary("add", binary("mul", kk, mt * u.a.regs), mi * u.a.regs + r)
                body.append(Store(areg, (const(mi * u.a.regs + r),), BufferLoad(a_regs[0], (src,)), span=op.span))
        elif "a" not in shared:
            body.append(load("a", a, areg, mi * u.a.regs, u.a, row0[mi], k0, ta, (u.m, u.k)))
    for ni in range(nt):
        if "b" not in shared:
            body.append(load("b", b, breg, ni * u.b.regs, u.b, k0, col0[ni], tb, (u.k, u.n)))
    for ni in range(nt):
        for mi in range(mt):
            ops = {"a": areg, "a_offset": mi * u.a.regs, "b": breg, "b_offset": ni * u.b.regs}
            attrs = {}
            if "a" in shared:
                ops.update(a=a.buffer, a_offset=0, a_origin=at(a, row0[mi], k0, ta))
                attrs.update(a_trans=ta, a_layout=shared["a"])
            if "b" in shared:
                ops.update(b=b.buffer, b_offset=0, b_origin=at(b, k0, col0[ni], tb))
                attrs.update(b_trans=tb, b_layout=shared["b"])
            body.append(MatrixOp(u.spelling, creg, (mi + mt * ni) * u.c.regs, **ops, attrs=attrs, span=op.span))
    out = [Allocate(r) for r, x in ((areg, "a"), (breg, "b")) if x not in shared]
    if op.attrs.get("clear_accum"):
        out += [Store(creg, (const(r),), const(0, creg.dtype), span=op.span) for r in range(clay.regs)]
    # unrolled: the register offsets and the operand addresses of each k step fold to constants
    loop = For(kk, as_expr(0), as_expr(plan.attrs["k_steps"]), "unroll", seq(body), span=op.span)
    if u.attrs.get("async"):  # the unit runs behind the threads: order what they wrote before, wait after
        reads = (a_regs[0],) if a_regs is not None else ()  # A's registers (D59: an emitter may pin them)
        out += [MatrixSync(u.spelling, "begin", creg, reads=reads, span=op.span), loop,
                MatrixSync(u.spelling, "end", creg, span=op.span)]
    else:
        out.append(loop)
    return out


def _swizzle_for(buf: Buffer) -> SharedLayout | None:
    """The XOR swizzle for a shared operand tile: 16-byte units of a row permuted by the row within spans
    of 128 bytes (64 or 32 for shorter rows), so the rows a group's cooperative operand load reads at one
    column land in different banks; None where the rows are not whole 32-byte spans."""
    shape = buf.static_shape()
    if shape is None or len(shape) < 2 or buf.base is not None:
        return None
    rows, cols = shape[-2], shape[-1]
    row_bytes = cols * buf.dtype.bytes
    for span in (128, 64, 32):
        if row_bytes % span == 0 and 16 % buf.dtype.bytes == 0:
            return SharedLayout(rows, cols, buf.dtype.bytes, swizzle_bytes=span)
    return None


@tile_pass("tilecore.swizzle_operand_tiles")
def swizzle_operand_tiles(func, ctx):
    """Store the shared tiles that matrix-unit operands are loaded from (:class:`~tilecore.ir.MatrixLoad`)
    swizzled (:class:`~tilecore.layout.SharedLayout`), recorded in the launch's ``shared_layouts`` attribute
    as ``(buffer, layout)`` pairs (and by name in ``kernel.meta["attrs"]["shared_layouts"]``): the emitter
    maps every element access of those buffers through the layout.
    Only tiles written by asynchronous copies of whole 16-byte units are swizzled: a tile any block-wide
    operation reads by address (a :class:`~tilecore.ir.Collective` region) or any thread stores elements into
    keeps the plain row-major layout. Measured on the H100 (decision D13): the swizzle makes 4096^3 fp16 at
    128x128x32 1.9x faster (1.096 -> 0.580 ms), and the 4096x777x4096 GEMM, whose B tile is filled by element
    stores, 1.4x slower when that tile is swizzled too (0.708 -> 0.998 ms).
    Where the profile declares ``features.async_copy_linear_destination`` (copies that write one run across
    the thread group, which only a row-major tile takes) no tile an asynchronous copy fills is swizzled.
    ``tilecore.swizzle_operand_tiles=False`` turns it off."""
    off = ctx.option("tilecore.swizzle_operand_tiles", True) is False
    if off and not collect(func.body, BulkStore):  # (a bulk store's tile keeps its layout either way)
        return func

    # hardware whose asynchronous copies write one run across the thread group (each thread's bytes right
    # after the previous thread's) can only fill a row-major tile that way
    linear = ctx.capabilities.satisfies("feature:async_copy_linear_destination")[0] is True

    def fix(s):
        if not isinstance(s, KernelLaunch) or "shared_layouts" in s.attrs:
            return None
        # tiles a matrix instruction reads itself must have the layout it reads (the plan chose it)
        required: dict = {}
        for m in [] if off else collect(s.body, MatrixOp):
            for x in ("a", "b"):
                origin = getattr(m, f"{x}_origin")
                if origin is None:
                    continue
                buf, lay = origin.buffer, m.attrs[f"{x}_layout"]
                if required.setdefault(id(buf), (buf, lay))[1] != lay:
                    raise CompileError(f"{buf.name} is read by {m.spelling} as {lay} and as {required[id(buf)][1]}; "
                                       "pass tilecore.swizzle_operand_tiles=False to keep the gemms on loaded operands", m.span)
        for st in collect(s.body, BulkStore):  # a bulk tile store reads its tile in the layout it records (D46)
            required.setdefault(id(st.src), (st.src, st.layout))
        loads = [] if off else collect(s.body, MatrixLoad)
        tiles = {id(m.origin.buffer): m.origin.buffer for m in loads
                 if m.origin.buffer.scope == "shared" and id(m.origin.buffer) not in required}
        if not tiles and not required:
            return None
        plain: set = set()
        by_address: dict = {}

        def uses(x):
            if isinstance(x, (Collective, TileOp)):
                for a in x.args:
                    b = a.buffer if isinstance(a, Region) else a if isinstance(a, Buffer) else None
                    if b is not None:
                        plain.add(id(b.base or b))
                        by_address.setdefault(id(b.base or b), x)
            elif isinstance(x, AsyncCopy) and (x.elements * x.dst.dtype.bytes != 16 or linear):
                plain.add(id(x.dst))
            elif isinstance(x, Store):
                plain.add(id(x.buffer))

        walk(s.body, uses)
        for key, (buf, lay) in required.items():
            if key in by_address:  # a block-wide library call reading it by address (row-major)
                raise CompileError(f"internal: {buf.name} is read by a matrix instruction as a {lay.swizzle_bytes}-byte "
                                   f"paneled tile and by {getattr(by_address[key], 'name', None) or by_address[key].op} "
                                   "by address (row-major)", by_address[key].span)
        chosen = tuple(required.values()) + tuple(
            (b, lay) for k, b in tiles.items() if k not in plain and (lay := _swizzle_for(b)) is not None)
        if not chosen:
            return None
        for b, lay in chosen:
            recorded[b.name] = (f"{lay.rows}x{lay.cols} tile, {lay.swizzle_bytes}-byte XOR swizzle of 16-byte units"
                                + (f", {lay.swizzle_bytes}-byte panels" if lay.panels else ""))
        return s.with_(attrs={**s.attrs, "shared_layouts": chosen})

    recorded: dict = {}
    body = rewrite(func.body, fix)
    return func.with_body(body, shared_layouts=recorded) if recorded else func


__all__ = ["GemmPlan", "plan_gemm", "lower_gemm", "swizzle_operand_tiles"]
