"""Tile ops as AscendC instructions over UB tiles (the vector side).

``ascend.copy_gm_ub`` / ``ascend.copy_ub_gm``: ``T.copy`` between a global tensor and a whole on-chip tile as
one ``DataCopyPad`` (rows of the tile as DMA bursts, GM rows strided; partial tiles at tensor edges copy
the valid rectangle, and a load first zeroes the tile with ``Duplicate``, as the language defines a load
outside the tensor). ``ascend.fill``: ``Duplicate``. ``ascend.reduce``: ``ReduceSum/Max/Min`` per row
(dim 1) or ``Add/Max/Min`` across rows (dim 0), after ``Cast`` to float32 and ``Abs`` where needed.

Every op these do not take (other dtypes, slices of a tile, rows not a multiple of 32 bytes...) goes to the
core's generic lowering: scalar loops, which the emitter prints as ``GetValue``/``SetValue`` on the scalar
pipe. Both are synchronized by ``ascend.insert_sync``.
"""
from __future__ import annotations

from tilecore.ir import (Allocate, Buffer, BufferLoad, For, If, IntImm, Store, Var, as_expr, binary, compare, const,
                         const_value, logic_and, logic_or, maximum, minimum, select, seq, simplify)
from tilecore.plugin import Intrinsic

from .ops import CopyIn, CopyOut, VecOp

ONCHIP = ("shared", "fragment")
DUP_DTYPES = ("float16", "float32", "int16", "int32", "uint16", "uint32")


def _static(shape):
    vals = [const_value(simplify(s)) for s in shape]
    return None if any(v is None for v in vals) else tuple(int(v) for v in vals)


def _whole(region) -> bool:
    shape = _static(region.buffer.shape)
    return (shape is not None and all(const_value(s) == 0 for s in region.starts)
            and _static(region.extents) == shape)


def _flat(buf, idx):
    off = as_expr(0)
    for i, s in zip(idx, buf.shape):
        off = binary("add", binary("mul", off, s), i)
    return simplify(off)


def _clamp(n, limit):
    return simplify(minimum(maximum(n, as_expr(0)), as_expr(limit)))


def _tile_of(gm_region, tile):
    """(gm offset, rows, cols, gm pitch, tile pitch, partial) of a GM region matching a whole 1-D/2-D tile, or None."""
    shape = _static(tile.shape)
    if shape is None or len(shape) > 2 or gm_region.buffer.dtype != tile.dtype:
        return None
    ext = [const_value(simplify(e)) for e in gm_region.extents]
    nonunit = [d for d, e in enumerate(ext) if e != 1]
    gm_dims = len(gm_region.buffer.shape)
    want = [s for s in shape if s != 1]
    if [ext[d] for d in nonunit] != want or (nonunit and nonunit[-1] != gm_dims - 1):
        return None
    rows, cols = (shape if len(shape) == 2 else (1, shape[0]))
    if len(nonunit) == 2 and nonunit[0] != gm_dims - 2:
        return None
    size = tile.dtype.bytes
    if rows > 1 and (cols * size) % 32:
        return None  # UB rows must start on 32-byte boundaries
    gm = gm_region.buffer
    starts = gm_region.starts
    last = gm_dims - 1
    valid_cols = _clamp(binary("sub", gm.shape[last], starts[last]), cols)
    if rows > 1:
        valid_rows = _clamp(binary("sub", gm.shape[last - 1], starts[last - 1]), rows)
        lead = range(last - 1)
    else:
        valid_rows = as_expr(1)
        lead = range(last)
    cond = IntImm(1, "bool")
    for d in lead:  # the leading (unit) indices must be inside the tensor, else nothing is copied
        cond = logic_and(cond, logic_and(compare("ge", starts[d], as_expr(0)), compare("lt", starts[d], gm.shape[d])))
    if const_value(cond) != 1:
        valid_rows = simplify(select(cond, valid_rows, as_expr(0)))
    partial = not (const_value(valid_rows) == rows and const_value(valid_cols) == cols)
    return _flat(gm, starts), valid_rows, valid_cols, gm.shape[last], cols, partial


def _copy_in_applies(op, ctx):
    src, dst = op.args
    if not (src.buffer.scope == "global" and dst.buffer.scope in ONCHIP and _whole(dst)):
        return False
    got = _tile_of(src, dst.buffer)
    return got is not None and (not got[5] or dst.buffer.dtype in DUP_DTYPES)


def lower_copy_in(op, ctx):
    src, dst = op.args
    off, rows, cols, gp, tp, partial = _tile_of(src, dst.buffer)
    out = []
    if partial:  # elements outside the tensor read as zero: a partial tile is zeroed first
        n = 1
        for s in _static(dst.buffer.shape):
            n *= s
        rows_all = tp and _static(dst.buffer.shape)[0] if len(_static(dst.buffer.shape)) == 2 else 1
        cond = simplify(logic_or(compare("lt", rows, as_expr(rows_all)), compare("lt", cols, as_expr(tp))))
        zero = VecOp("Duplicate", (dst.buffer, as_expr(0)), (), as_expr(n), const(0, dst.buffer.dtype), span=op.span)
        out.append(zero if const_value(cond) == 1 else If(cond, zero, span=op.span))
    out.append(CopyIn(dst.buffer, as_expr(0), src.buffer, off, rows, cols, gp, tp, span=op.span))
    return seq(out)


#: conversions a copy out does with one ``Cast`` on the vector unit before the DMA
CASTS = {("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32")}


def _staged(src, dst):
    """The UB tile a copy out sends: ``src`` itself, or a tile of the destination's dtype it is cast into."""
    if src.buffer.dtype == dst.buffer.dtype:
        return src.buffer
    if (str(src.buffer.dtype), str(dst.buffer.dtype)) not in CASTS:
        return None
    return Buffer(src.buffer.name + "_cast", src.buffer.shape, dst.buffer.dtype, "fragment")


def _copy_out_applies(op, ctx):
    src, dst = op.args
    if not (dst.buffer.scope == "global" and src.buffer.scope in ONCHIP and _whole(src)):
        return False
    tile = _staged(src, dst)
    return tile is not None and _tile_of(dst, tile) is not None


def lower_copy_out(op, ctx):
    src, dst = op.args
    tile = _staged(src, dst)
    off, rows, cols, gp, tp, _ = _tile_of(dst, tile)
    out = []
    if tile is not src.buffer:
        out += [Allocate(tile, span=op.span),
                VecOp("Cast", (tile, as_expr(0)), ((src.buffer, as_expr(0)),), as_expr(_numel(tile)), span=op.span)]
    return seq(out + [CopyOut(dst.buffer, off, tile, as_expr(0), rows, cols, gp, tp, span=op.span)])


def _numel(buf) -> int:
    n = 1
    for s in _static(buf.shape):
        n *= s
    return n


def _fill_applies(op, ctx):
    r, _ = op.args
    return r.buffer.scope in ONCHIP and r.buffer.dtype in DUP_DTYPES and _whole(r)


def lower_fill(op, ctx):
    r, value = op.args
    return VecOp("Duplicate", (r.buffer, as_expr(0)), (), as_expr(_numel(r.buffer)), value, span=op.span)


REDUCE_INSTR = {"sum": "ReduceSum", "abssum": "ReduceSum", "max": "ReduceMax", "absmax": "ReduceMax", "min": "ReduceMin"}
COMBINE_INSTR = {"sum": "Add", "abssum": "Add", "max": "Max", "absmax": "Max", "min": "Min"}


def _reduce_applies(op, ctx):
    src, dst = op.args
    s, d = _static(src.buffer.shape), _static(dst.buffer.shape)
    if not (src.buffer.scope in ONCHIP and dst.buffer.scope in ONCHIP and _whole(src) and _whole(dst)):
        return False
    if s is None or d is None or len(s) != 2 or len(d) != 1 or op.attrs["dim"] not in (0, 1, -1):
        return False
    if src.buffer.dtype not in ("float32", "float16") or dst.buffer.dtype != "float32":
        return False
    dim = op.attrs["dim"] % 2
    return d[0] == s[1 - dim] and (s[1] * 4) % 32 == 0 and (dim == 1 or s[0] >= 1)


def lower_reduce(op, ctx):
    src, dst = op.args
    kind, dim, clear = op.attrs["kind"], op.attrs["dim"] % 2, op.attrs["clear"]
    rows, cols = _static(src.buffer.shape)
    r = dst.buffer
    out, span = [], op.span

    def temp(name, n):
        b = Buffer(name, (n,), "float32", "fragment")
        out.append(Allocate(b, span=span))
        return b

    def vec(name, d, srcs, count, scalar=None):
        out.append(VecOp(name, d, tuple(srcs), as_expr(count), scalar, span=span))

    x = src.buffer
    if x.dtype != "float32" or kind.startswith("abs"):
        t = temp("red_in", rows * cols)
        if x.dtype != "float32":
            vec("Cast", (t, as_expr(0)), [(x, as_expr(0))], rows * cols)
            x = t
        if kind.startswith("abs"):
            vec("Abs", (t, as_expr(0)), [(x, as_expr(0))], rows * cols)
            x = t
    if dim == 1:  # one whole-row reduction per row into a 32-byte slot, then the scalar unit combines
        red, work = temp("red_out", rows * 8), temp("red_work", cols)
        i = Var("i")
        off = lambda e, k: binary("mul", e, as_expr(k))  # noqa: E731
        out.append(For(i, as_expr(0), as_expr(rows), "serial",
                       VecOp(REDUCE_INSTR[kind], (red, off(i, 8)), ((x, off(i, cols)), (work, as_expr(0))), as_expr(cols),
                             span=span), span=span))
        j = Var("i")
        got = BufferLoad(red, (binary("mul", j, as_expr(8)),))
        old = BufferLoad(r, (j,))
        comb = {"Add": lambda a, b: binary("add", a, b), "Max": maximum, "Min": minimum}[COMBINE_INSTR[kind]]
        out.append(For(j, as_expr(0), as_expr(rows), "serial", Store(r, (j,), got if clear else comb(old, got), span=span),
                       span=span))
        return seq(out)
    # dim 0: combine the rows element-wise on the vector unit
    acc = r if clear else temp("red_acc", cols)
    vec("Adds", (acc, as_expr(0)), [(x, as_expr(0))], cols, const(0.0, "float32"))
    for k in range(1, rows):
        vec(COMBINE_INSTR[kind], (acc, as_expr(0)), [(acc, as_expr(0)), (x, as_expr(k * cols))], cols)
    if not clear:
        vec(COMBINE_INSTR[kind], (r, as_expr(0)), [(r, as_expr(0)), (acc, as_expr(0))], cols)
    return seq(out)


TABLE = [
    Intrinsic("copy", "ascend.copy_gm_ub", lower_copy_in, priority=10, applies=_copy_in_applies),
    Intrinsic("copy", "ascend.copy_ub_gm", lower_copy_out, priority=10, applies=_copy_out_applies),
    Intrinsic("fill", "ascend.fill", lower_fill, priority=10, applies=_fill_applies),
    Intrinsic("reduce", "ascend.reduce", lower_reduce, priority=10, applies=_reduce_applies),
]
