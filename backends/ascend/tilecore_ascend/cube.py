"""``ascend.lower_cube``: ``T.gemm`` on the cube unit.

A gemm ``C += A x B`` (A, B 16-bit tiles, C a float32 fragment, every dimension a multiple of 16) whose
operand tiles are only filled from global memory and whose accumulator is only cleared, accumulated and
copied to global memory runs on the AI Core's cube:

- ``T.copy(global -> A/B tile)``: ``DataCopy`` with ``Nd2NzParams`` into L1 (zN layout), after an
  ``InitConstValue`` zeroing the tile when it may be partial at a tensor edge (MTE2);
- ``T.gemm``: K in chunks that fit half of L0A/L0B (the two halves alternate between chunks), each chunk's
  fractals moved by ``LoadData`` into L0A (zZ) and L0B (nZ), transposing fractals where the tile is stored
  the other way (MTE1), then ``Mmad`` into the L0C accumulator (M), the first one initialising it after a
  ``T.clear``;
- ``T.copy(C -> global)``: ``Fixpipe`` from L0C to GM, row-major (FIX).
``ascend.insert_sync`` then places the MTE2->MTE1, MTE1->M, M->MTE1 (chunk reuse), M->FIX and FIX->M flags.
Kernels whose accumulator is also read element-wise (an epilogue on the vector unit) need the cube->vector
hand-off through GM and are not taken: their gemm stays on the generic lowering.
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecore.ir import (Allocate, Buffer, BufferLoad, Expr, For, If, IntImm, KernelLaunch, Region, Seq, Store, TileOp, Var,
                         as_expr,
                         binary, collect, compare, const_value, logic_or, rewrite, seq, simplify, stmt_exprs, walk,
                         walk_expr)
from tilecore.passes import tile_pass

from .intrinsics import _static, _tile_of, _whole
from .ops import AscendOp, CopyIn

HALF = ("float16", "bfloat16")
L0_HALF = 32768  # bytes of L0A / L0B one K chunk may use (two chunks ping-pong)


@dataclass(eq=False)
class CopyNd2Nz(AscendOp):
    """GM -> L1 zN (``DataCopy`` with ``Nd2NzParams``): ``rows`` x ``cols`` valid elements, GM rows ``pitch``
    apart, the L1 tile ``tile_rows`` (a multiple of 16) rows per 16-column block."""
    dst: Buffer
    src: Buffer
    src_off: Expr
    rows: Expr
    cols: Expr
    pitch: Expr
    tile_rows: int

    def pipe(self):
        return "MTE2"

    def writes(self):
        return (self.dst,)


@dataclass(eq=False)
class InitL1(AscendOp):
    """``InitConstValue``: zero a whole L1 tile (MTE2)."""
    dst: Buffer

    def pipe(self):
        return "MTE2"

    def writes(self):
        return (self.dst,)


@dataclass(eq=False)
class LoadFractals(AscendOp):
    """``LoadData`` (2-D): ``repeat`` fractals of ``src`` (L1) from fractal ``start``, ``stride`` apart, into
    ``dst`` (L0A/L0B) from fractal ``dst_frac``, each transposed when ``trans`` (MTE1)."""
    dst: Buffer
    dst_frac: int
    src: Buffer
    start: int
    repeat: int
    stride: int
    trans: bool

    def pipe(self):
        return "MTE1"

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.dst,)


@dataclass(eq=False)
class MmadOp(AscendOp):
    """``Mmad``: ``c`` (L0C) = (``init`` ? 0 : c) + a (L0A) x b (L0B) over m x n x k (M)."""
    c: Buffer
    a: Buffer
    b: Buffer
    m: int
    n: int
    k: int
    init: Expr

    def pipe(self):
        return "M"

    def reads(self):
        return (self.a, self.b, self.c)

    def writes(self):
        return (self.c,)


@dataclass(eq=False)
class FixpipeOut(AscendOp):
    """``Fixpipe``: L0C (zN, ``tile_rows`` rows) -> GM row-major, ``rows`` x ``cols`` valid (FIX)."""
    dst: Buffer
    dst_off: Expr
    src: Buffer
    rows: Expr
    cols: Expr
    pitch: Expr
    tile_rows: int

    def pipe(self):
        return "FIX"

    def reads(self):
        return (self.src,)


@dataclass(eq=False)
class CrossSet(AscendOp):
    """``CrossCoreSetFlag<2, PIPE_FIX>(id)``: the AIC tells its AIVs the workspace is written (ends the AIC part)."""
    flag: int

    def pipe(self):
        return "S"


@dataclass(eq=False)
class CrossWait(AscendOp):
    """``CrossCoreWaitFlag(id)``: the AIV waits for its AIC's hand-off (starts the AIV part)."""
    flag: int

    def pipe(self):
        return "S"


def _uses(body, buf) -> list:
    """Every statement that names ``buf`` (tile ops by region, scalar code by load or store)."""
    out = []

    def visit(s):
        if isinstance(s, TileOp):
            if any(getattr(a, "buffer", None) is buf for a in s.args):
                out.append(s)
            return
        hit = isinstance(s, Store) and s.buffer is buf
        for e in stmt_exprs(s):
            found = []
            walk_expr(e, lambda x: found.append(x) if isinstance(x, BufferLoad) and x.buffer is buf else None)
            hit = hit or bool(found)
        if hit:
            out.append(s)

    walk(body, visit)
    return out


def _takes(g, body, after=()) -> bool:
    """Whether the cube takes gemm ``g``: its operand tiles are only filled from global memory, its
    accumulator only cleared and accumulated before the hand-off point; statements in ``after`` (the
    vector part) may use the accumulator freely."""
    a, b, c = g.args
    sa, sb, sc = _static(a.buffer.shape), _static(b.buffer.shape), _static(c.buffer.shape)
    if not (sa and sb and sc and len(sa) == len(sb) == len(sc) == 2):
        return False
    if not (a.buffer.dtype in HALF and b.buffer.dtype == a.buffer.dtype and c.buffer.dtype == "float32"):
        return False
    if not (a.buffer.scope in ("shared", "fragment") and b.buffer.scope in ("shared", "fragment")
            and c.buffer.scope == "fragment" and _whole(a) and _whole(b) and _whole(c)):
        return False
    if any(d % 16 for d in sa + sb + sc):
        return False
    ta, tb = g.attrs.get("transpose_A"), g.attrs.get("transpose_B")
    m, k = (sa[1], sa[0]) if ta else sa
    k2, n = (sb[1], sb[0]) if tb else sb
    if k != k2 or (m, n) != sc or m * n * 4 > 131072:
        return False
    for op in _uses(body, a.buffer) + _uses(body, b.buffer):
        if not (isinstance(op, TileOp) and (op.op == "gemm" or (op.op == "copy" and op.args[1].buffer in (a.buffer, b.buffer)
                                                                and op.args[0].buffer.scope == "global"
                                                                and _tile_of(op.args[0], op.args[1].buffer) is not None))):
            return False
    late = set()
    for s in after:
        late |= {id(x) for x in _uses(s, c.buffer)}
    for op in _uses(body, c.buffer):
        if id(op) in late:
            continue
        if not isinstance(op, TileOp):
            return False
        if op.op == "gemm" and op.args[2].buffer is c.buffer and op.args[0].buffer.dtype == a.buffer.dtype:
            continue
        if op.op == "fill" and const_value(op.args[1]) == 0 and _whole(op.args[0]):
            continue
        if op.op == "copy" and op.args[0].buffer is c.buffer and op.args[1].buffer.scope == "global" and \
                _tile_of(op.args[1], c.buffer) is not None and op.args[1].buffer.dtype in ("float32",) + HALF:
            continue
        return False
    return True


def _lower_gemm(g, l0a, l0b, flag, shapes):
    """Chunk ``ci`` of K uses L0 half ``ci % 2`` (there is one half when the whole K fits)."""
    a, b, c = g.args
    ta, tb = g.attrs.get("transpose_A"), g.attrs.get("transpose_B")
    sa, sb = shapes[a.buffer], shapes[b.buffer]
    m, kp = (sa[1], sa[0]) if ta else sa
    n = sb[0] if tb else sb[1]
    mc, nc, kc_all = m // 16, n // 16, kp // 16
    kc = max(1, min(kc_all, L0_HALF // (m * 2) // 16, L0_HALF // (n * 2) // 16))
    out = []
    for ci, k0 in enumerate(range(0, kc_all, kc)):
        kn = min(kc, kc_all - k0)
        la, lb = l0a[ci % len(l0a)], l0b[ci % len(l0b)]
        for mb in range(mc):  # L0A zZ row of fractals mb
            if ta:   # A tile is K x M in L1 (zN over M): fractal (kb, mb) at mb * kc_all + kb, transposed
                out.append(LoadFractals(la, mb * kn, a.buffer, mb * kc_all + k0, kn, 1, True, span=g.span))
            else:    # A tile is M x K (zN over K): fractal (mb, kb) at kb * mc + mb
                out.append(LoadFractals(la, mb * kn, a.buffer, k0 * mc + mb, kn, mc, False, span=g.span))
        for kb in range(k0, k0 + kn):  # L0B nZ row of fractals kb
            if tb:   # B tile is N x K (zN over K): fractal (nb, kb) at kb * nc + nb, already n-major
                out.append(LoadFractals(lb, (kb - k0) * nc, b.buffer, kb * nc, nc, 1, False, span=g.span))
            else:    # B tile is K x N (zN over N): fractal (kb, nb) at nb * kc_all + kb, transposed
                out.append(LoadFractals(lb, (kb - k0) * nc, b.buffer, kb, nc, kc_all, True, span=g.span))
        out.append(MmadOp(c.buffer, la, lb, m, n, kn * 16, BufferLoad(flag, (as_expr(0),)), span=g.span))
        out.append(Store(flag, (as_expr(0),), IntImm(0, "int32"), span=g.span))
    return out


def _split(top) -> int:
    """Index of the last top-level statement that holds a T.gemm (the end of the cube part)."""
    last = -1
    for k, st in enumerate(top):
        if any(op.op == "gemm" for op in collect(st, TileOp)):
            last = k
    return last


@tile_pass("ascend.lower_cube")
def lower_cube(func, ctx):
    launches = collect(func.body, KernelLaunch)
    if len(launches) != 1:
        return func
    launch = launches[0]
    top = list(launch.body.body) if isinstance(launch.body, Seq) else [launch.body]
    split = _split(top)
    if split < 0:
        return func
    head, tail = top[:split + 1], top[split + 1:]
    gemms = [g for g in collect(Seq(head), TileOp) if g.op == "gemm"]
    if not all(_takes(g, launch.body, tail) for g in gemms):
        return func
    l1 = {}
    for g in gemms:
        for r in g.args[:2]:
            l1[r.buffer] = _static(r.buffer.shape)
    accs = {g.args[2].buffer for g in gemms}
    # the vector part: everything after the last gemm that is not a plain copy of an accumulator out
    direct = all(isinstance(x, TileOp) and x.op == "copy" and x.args[0].buffer in accs
                 for a in accs for st in tail for x in _uses(st, a))
    for a in collect(Seq(head), Allocate):
        if a.buffer.scope in ("shared", "fragment") and a.buffer not in l1 and a.buffer not in accs:
            if any(_uses(st, a.buffer) for st in head):
                return func  # vector work before the hand-off: not split yet
    if len(accs) != 1 and not direct:
        return func
    acc_of = {c: (c if direct else Buffer(c.name + "_l0c", c.shape, "float32", "fragment")) for c in accs}
    # the vector part's rows split over the two AIV sub-blocks of the AI Core (where it is row-wise)
    sub = Var("aiv_sub")
    split = None if direct else _split_rows(tail, next(iter(accs)), sub)
    if split is not None:
        tail, halves = split
    else:
        halves = {}
    flags = {c: Buffer(c.name + "_init", (1,), "int32", "var") for c in accs}
    l0a, l0b = _l0_buffers(gemms, l1)
    taken = set(id(g) for g in gemms)

    def fix(s):
        if isinstance(s, Allocate) and s.buffer in accs:
            extra = [] if direct else [Allocate(acc_of[s.buffer], span=s.span)]
            mine = Allocate(halves[id(s.buffer)], span=s.span) if id(s.buffer) in halves else s
            return seq([mine] + extra + [Allocate(flags[s.buffer], init=IntImm(1, "int32"), span=s.span)])
        if not isinstance(s, TileOp):
            return None
        if s.op == "gemm" and id(s) in taken:
            g = TileOp("gemm", (s.args[0], s.args[1], Region(acc_of[s.args[2].buffer], s.args[2].starts, s.args[2].extents)),
                       s.attrs, span=s.span)
            return seq(_lower_gemm(g, l0a, l0b, flags[s.args[2].buffer], l1))
        if s.op == "copy" and s.args[1].buffer in l1:
            src, dst = s.args
            off, rows, cols, pitch, _, partial = _tile_of(src, dst.buffer)
            tile_rows = l1[dst.buffer][0]
            out = []
            if partial:
                cond = simplify(logic_or(compare("lt", rows, as_expr(tile_rows)),
                                         compare("lt", cols, as_expr(l1[dst.buffer][1]))))
                zero = InitL1(dst.buffer, span=s.span)
                out.append(zero if const_value(cond) == 1 else If(cond, zero, span=s.span))
            out.append(CopyNd2Nz(dst.buffer, src.buffer, off, rows, cols, pitch, tile_rows, span=s.span))
            return seq(out)
        if s.op == "fill" and s.args[0].buffer in accs:
            return Store(flags[s.args[0].buffer], (as_expr(0),), IntImm(1, "int32"), span=s.span)
        if direct and s.op == "copy" and s.args[0].buffer in accs:
            src, dst = s.args
            off, rows, cols, pitch, _, _ = _tile_of(dst, src.buffer)
            return FixpipeOut(dst.buffer, off, src.buffer, rows, cols, pitch, _static(src.buffer.shape)[0], span=s.span)
        return None

    head = [rewrite(st, fix) for st in head]
    if direct:
        tail = [rewrite(st, fix) for st in tail]
        attrs = {}
    else:  # the hand-off: L0C -> GM workspace (FIX), cross-core flag, workspace -> UB (MTE2) on the AIV
        c = next(iter(accs))
        m, n = _static(c.shape)
        ws = Buffer("workspace", (m * n,), "float32", "global")
        bid, stride = as_expr(0), as_expr(1)
        for v, g in zip(launch.block_vars, launch.grid):
            bid = binary("add", bid, binary("mul", v, stride))
            stride = binary("mul", stride, g)
        off = simplify(binary("mul", bid, as_expr(m * n)))
        span = launch.span
        head += [FixpipeOut(ws, off, acc_of[c], as_expr(m), as_expr(n), as_expr(n), m, span=span), CrossSet(0, span=span)]
        attrs = {"ascend_workspace_bytes_per_block": m * n * 4}
        if split is None:
            tail = [CrossWait(0, span=span), CopyIn(c, as_expr(0), ws, off, as_expr(m), as_expr(n), as_expr(n), n, span=span)] + tail
        else:  # sub-block s reads and works on rows [s * m/2, (s + 1) * m/2) of the block's tile
            rows = m // 2
            part = simplify(binary("add", off, binary("mul", sub, as_expr(rows * n))))
            tail = [CrossWait(0, span=span),
                    CopyIn(halves[id(c)], as_expr(0), ws, part, as_expr(rows), as_expr(n), as_expr(n), n, span=span)] + tail
            attrs.update(ascend_aiv_sub=sub, ascend_aiv_rows=rows)
    body = seq(head + tail)
    first = [True]

    def add_l0(s):
        if isinstance(s, Allocate) and (s.buffer in accs or any(s.buffer is h for h in halves.values())) and first[0]:
            first[0] = False
            return seq([s] + [Allocate(b, span=s.span) for b in l0a + l0b])
        return None

    body = rewrite(body, add_l0)
    new_launch = launch.with_(body=body)
    if func.body is launch:
        fbody = new_launch
    elif isinstance(func.body, Seq) and any(x is launch for x in func.body.body):
        fbody = func.body.with_(body=[new_launch if x is launch else x for x in func.body.body])
    else:
        return func
    scopes = {**{b.name: "l1" for b in l1}, **{acc_of[b].name: "l0c" for b in accs}}
    return func.with_body(fbody, ascend_cube=tuple(sorted(scopes.items())), **attrs)


def _l0_buffers(gemms, l1):
    """The L0A/L0B halves the K chunks alternate between (one each when every gemm takes one chunk)."""
    dtype = gemms[0].args[0].buffer.dtype
    rows = max((l1[g.args[0].buffer][1] if g.attrs.get("transpose_A") else l1[g.args[0].buffer][0]) for g in gemms)
    cols = max((l1[g.args[1].buffer][0] if g.attrs.get("transpose_B") else l1[g.args[1].buffer][1]) for g in gemms)
    kmax = max(l1[g.args[0].buffer][0 if g.attrs.get("transpose_A") else 1] for g in gemms)
    kc = max(1, min(kmax // 16, L0_HALF // (rows * 2) // 16, L0_HALF // (cols * 2) // 16))
    halves = 2 if kmax // 16 > kc else 1
    return ([Buffer(f"l0a_{k}", (rows * kc * 16,), dtype, "fragment") for k in range(halves)],
            [Buffer(f"l0b_{k}", (cols * kc * 16,), dtype, "fragment") for k in range(halves)])


def placement(body) -> dict:
    """``id(buffer) -> scope`` of the tiles the cube lowering placed (the rest are UB tiles)."""
    out = {}

    def visit(s):
        if isinstance(s, (CopyNd2Nz, InitL1)):
            out[id(s.dst)] = "l1"
        elif isinstance(s, LoadFractals):
            out[id(s.src)] = "l1"
        elif isinstance(s, MmadOp):
            out[id(s.a)], out[id(s.b)], out[id(s.c)] = "l0a", "l0b", "l0c"
        elif isinstance(s, FixpipeOut):
            out[id(s.src)] = "l0c"

    walk(body, visit)
    return out


class _NoSplit(Exception):
    pass


def _split_rows(tail, c, sub):
    """The vector part with its tiles' rows split over the two AIV sub-blocks: ``(tail, {id(tile): half})``,
    or None where the part is not row-wise. Row-wise means: every tile it uses (the accumulator ``c`` and
    the tiles it allocates) has ``c``'s row count and is used by whole-tile ``T.fill``, ``T.copy`` out to
    global memory, or ``T.Parallel`` nests whose outer loop runs over the rows and indexes every tile by it
    (no global access inside). Sub-block ``sub`` then works on rows ``[sub * m/2, (sub + 1) * m/2)``."""
    from .intrinsics import _static, _whole

    shape = _static(c.shape)
    if shape is None or len(shape) != 2 or shape[0] % 2 or shape[0] < 2:
        return None
    m, half = shape[0], shape[0] // 2
    table = {id(c): Buffer(c.name, (half,) + tuple(c.shape[1:]), c.dtype, c.scope)}
    for a in collect(Seq(list(tail)), Allocate):
        sh = _static(a.buffer.shape) if a.buffer.scope in ("shared", "fragment") else None
        if sh is not None and sh[0] == m:
            table[id(a.buffer)] = Buffer(a.buffer.name, (half,) + tuple(a.buffer.shape[1:]), a.buffer.dtype, a.buffer.scope)

    def touched(s) -> list:
        out = []

        def see(e):
            if isinstance(e, BufferLoad):
                out.append((e.buffer, e.indices))

        def visit(x):
            if isinstance(x, Store):
                out.append((x.buffer, x.indices))
            if isinstance(x, TileOp):
                out.extend((r.buffer, None) for r in x.args if isinstance(r, Region))
            for e in stmt_exprs(x):
                walk_expr(e, see)

        walk(s, visit)
        return out

    def halve(r):
        return Region(table[id(r.buffer)], r.starts, (as_expr(half),) + tuple(r.extents[1:]))

    def conv(s):
        if isinstance(s, Seq):
            return s.with_(body=[conv(x) for x in s.body])
        if isinstance(s, Allocate) and id(s.buffer) in table:
            return s.with_(buffer=table[id(s.buffer)])
        uses = touched(s)
        if not any(id(b) in table for b, _ in uses):
            if any(b.scope in ("shared", "fragment") for b, _ in uses):
                raise _NoSplit  # another on-chip tile: not row-wise
            return s
        if isinstance(s, TileOp) and s.op == "fill" and _whole(s.args[0]):
            return s.with_(args=(halve(s.args[0]),) + tuple(s.args[1:]))
        if isinstance(s, TileOp) and s.op == "copy":
            src, dst = s.args[0], s.args[1]
            if id(src.buffer) in table and _whole(src) and dst.buffer.scope == "global" and \
                    const_value(simplify(dst.extents[0])) == m:
                start = binary("add", dst.starts[0], binary("mul", sub, as_expr(half)))
                return s.with_(args=(halve(src), Region(dst.buffer, (start,) + tuple(dst.starts[1:]),
                                                         (as_expr(half),) + tuple(dst.extents[1:]))) + tuple(s.args[2:]))
            raise _NoSplit
        if isinstance(s, For) and s.kind == "parallel" and const_value(s.start) == 0 and const_value(s.extent) == m:
            for b, idx in uses:
                if b.scope == "global" or id(b) not in table or idx is None or idx[0] is not s.var:
                    raise _NoSplit
            from .double_buffer import _rename

            return _rename(s.with_(extent=as_expr(half, s.extent.dtype)), table)
        raise _NoSplit

    try:
        return [conv(x) for x in tail], table
    except _NoSplit:
        return None
