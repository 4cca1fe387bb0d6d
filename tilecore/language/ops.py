"""Tile operations: ``T.copy``, ``T.fill``, ``T.clear``, ``T.gemm``, ``T.reduce_*``, ``T.cumsum``, atomics.

Each checks its operands' shapes where they are known while the kernel is parsed, so a mismatch is
reported at the user's line, and appends one :class:`~tilecore.ir.TileOp` to the kernel. What the ops
compute is specified in docs/language.md; how they run is the target's business (tile-op lowering).
"""
from __future__ import annotations

from ..errors import TileOpShapeError
from ..ir import (INDEX, Atomic, Buffer, BufferLoad, Expr, For, Region, Store, TileOp, Var, as_expr, cast, const_value,
                  prove_equal, select)
from .builder import current


def _region(x, op: str, role: str):
    """A Buffer or a slice is a region; a point access ``A[i, j]`` is returned as the BufferLoad."""
    if isinstance(x, Buffer):
        return x.region()
    if isinstance(x, (Region, BufferLoad)):
        return x
    raise TileOpShapeError(f"T.{op}: {role} must be a buffer, a slice of one, or a point such as A[i, j]; "
                           f"got {type(x).__name__}", current().span)


def _point_to_region(load: BufferLoad, like: tuple, op: str) -> Region:
    """TileLang's region rule: a point start takes the other operand's extents, aligned to the right.

    Missing leading dims of the point get extent 1; extra leading extents of the other side must be 1.
    """
    rank = load.buffer.ndim
    ext = list(like)
    while len(ext) > rank:
        lead = ext.pop(0)
        if const_value(lead) != 1:
            raise TileOpShapeError(
                f"T.{op}: the point {load.buffer.name}[...] has {rank} dims but the other operand's shape "
                f"{tuple(const_value(e) if const_value(e) is not None else e for e in like)} needs more; "
                "pass an explicit slice", current().span)
    ext = [as_expr(1)] * (rank - len(ext)) + ext
    return Region(load.buffer, load.indices, tuple(ext))


def _squeezed(extents) -> list:
    return [e for e in extents if const_value(e) != 1]


def _fmt(extents) -> str:
    return "(" + ", ".join(str(const_value(e)) if const_value(e) is not None else repr(e) for e in extents) + ")"


def _check_same(op: str, a: Region, b: Region, what: str) -> None:
    sa, sb = _squeezed(a.extents), _squeezed(b.extents)
    mismatch = len(sa) != len(sb) or any(prove_equal(x, y) is False for x, y in zip(sa, sb))
    if mismatch:
        raise TileOpShapeError(
            f"T.{op}: {what}: {a.buffer.name} region has shape {_fmt(a.extents)} but {b.buffer.name} region "
            f"has shape {_fmt(b.extents)} (unit dims aside, the shapes must be equal)", current().span)


def _emit(op: str, args: tuple, **attrs) -> None:
    current(f"T.{op}").emit(TileOp(op, args, attrs))


def copy(src, dst, coalesced_width=None, disable_tma=False, eviction_policy=None, **extensions) -> None:
    """Copy ``src`` into ``dst`` element by element (with a cast when the dtypes differ).

    Other keyword arguments are backend extensions (plugin API 1.2, ``Backend.op_extensions``): recorded on
    the op and checked when the kernel is compiled (a target whose backend does not declare one refuses it).
    """
    s, d = _region(src, "copy", "source"), _region(dst, "copy", "destination")
    if isinstance(s, BufferLoad) and isinstance(d, BufferLoad):
        raise TileOpShapeError("T.copy: both operands are points; make at least one a buffer or a slice",
                               current().span)
    if isinstance(s, BufferLoad):
        s = _point_to_region(s, d.extents, "copy")
    if isinstance(d, BufferLoad):
        d = _point_to_region(d, s.extents, "copy")
    _check_same("copy", s, d, "source and destination differ")
    attrs = {"disable_tma": bool(disable_tma)}
    if extensions:
        attrs["extensions"] = tuple(sorted(extensions.items()))
    _emit("copy", (s, d), **attrs)


def fill(buffer, value) -> None:
    r = _region(buffer, "fill", "destination")
    if isinstance(r, BufferLoad):
        r = Region(r.buffer, r.indices, tuple(as_expr(1) for _ in r.indices))
    _emit("fill", (r, cast(r.buffer.dtype, as_expr(value, r.buffer.dtype))))


def clear(buffer) -> None:
    fill(buffer, 0)


def _matrix(r: Region, op: str, name: str) -> tuple:
    ext = list(r.extents)
    while len(ext) > 2 and const_value(ext[0]) == 1:
        ext.pop(0)
    if len(ext) != 2:
        raise TileOpShapeError(f"T.{op}: {name} ({r.buffer.name}) must be a 2-D tile, got shape {_fmt(r.extents)}",
                               current().span)
    return ext[0], ext[1]


def gemm(A, B, C, transpose_A=False, transpose_B=False, policy=None, clear_accum=False, k_pack=1,
         wg_wait=0, **_ignored) -> None:
    """``C += op(A) @ op(B)``, accumulating in C's dtype; ``clear_accum`` zeroes C first."""
    a, b, c = (_region(x, "gemm", n) for x, n in ((A, "A"), (B, "B"), (C, "C")))
    if any(isinstance(x, BufferLoad) for x in (a, b, c)):
        raise TileOpShapeError("T.gemm: operands must be buffers or slices, not points", current().span)
    am, ak = _matrix(a, "gemm", "A")
    bk, bn = _matrix(b, "gemm", "B")
    cm, cn = _matrix(c, "gemm", "C")
    if transpose_A:
        am, ak = ak, am
    if transpose_B:
        bk, bn = bn, bk
    for x, y, what in ((ak, bk, "K"), (am, cm, "M"), (bn, cn, "N")):
        if prove_equal(x, y) is False:
            raise TileOpShapeError(
                f"T.gemm: {what} differs between operands: A {a.buffer.name}{_fmt(a.extents)}"
                f"{' (transposed)' if transpose_A else ''}, B {b.buffer.name}{_fmt(b.extents)}"
                f"{' (transposed)' if transpose_B else ''}, C {c.buffer.name}{_fmt(c.extents)}", current().span)
    _emit("gemm", (a, b, c), transpose_A=bool(transpose_A), transpose_B=bool(transpose_B),
          clear_accum=bool(clear_accum), policy=str(policy) if policy is not None else None)


def reduce(kind: str, src, dst, dim: int = -1, clear: bool = True) -> None:
    s, d = _region(src, f"reduce_{kind}", "source"), _region(dst, f"reduce_{kind}", "destination")
    if isinstance(s, BufferLoad) or isinstance(d, BufferLoad):
        raise TileOpShapeError(f"T.reduce_{kind}: operands must be buffers or slices", current().span)
    nd = len(s.extents)
    if not -nd <= dim < nd:
        raise TileOpShapeError(f"T.reduce_{kind}: dim {dim} out of range for a {nd}-D source", current().span)
    dim %= nd
    kept = Region(s.buffer, s.starts, tuple(e for i, e in enumerate(s.extents) if i != dim))
    _check_same(f"reduce_{kind}", kept, d, f"the destination must have the source's shape without dim {dim}")
    _emit("reduce", (s, d), kind=kind, dim=dim, clear=bool(clear))


def cumsum(src, dst=None, dim: int = 0, reverse: bool = False) -> None:
    s = _region(src, "cumsum", "source")
    d = s if dst is None else _region(dst, "cumsum", "destination")
    if isinstance(s, BufferLoad) or isinstance(d, BufferLoad):
        raise TileOpShapeError("T.cumsum: operands must be buffers or slices", current().span)
    nd = len(s.extents)
    if not -nd <= dim < nd:
        raise TileOpShapeError(f"T.cumsum: dim {dim} out of range for a {nd}-D source", current().span)
    _check_same("cumsum", s, d, "source and destination differ")
    _emit("cumsum", (s, d), dim=dim % nd, reverse=bool(reverse))


#: TileLang's memory orders -> the IR's (``"consume"`` reads as ``"acquire"``, ``"seq_cst"`` as ``"acq_rel"``)
_ORDERS = {None: "relaxed", "relaxed": "relaxed", "consume": "acquire", "acquire": "acquire", "release": "release",
           "acq_rel": "acq_rel", "seq_cst": "acq_rel"}


def atomic(op: str, dst, value, memory_order=None, return_prev=False):
    """``dst op= value`` atomically, element by element. ``dst`` a point with a scalar value; a region with a
    same-shape value; or a point with a tile value (the point starts a region of the tile's extents). With
    ``return_prev`` (a point and a scalar only) the old value, as an :class:`~tilecore.ir.AtomicRet` bound to a
    fresh scalar where it stands (D69)."""
    b = current(f"T.atomic_{op}")
    if isinstance(memory_order, int) and not isinstance(memory_order, bool):  # TileLang's ids
        memory_order = ("relaxed", "consume", "acquire", "release", "acq_rel", "seq_cst")[memory_order]
    if memory_order not in _ORDERS:
        raise TileOpShapeError(f"T.atomic_{op}: memory_order {memory_order!r}: expected one of "
                               f"{', '.join(k for k in _ORDERS if k)}", b.span)
    if return_prev:
        if not isinstance(dst, BufferLoad) or isinstance(value, (Buffer, Region)):
            raise TileOpShapeError(f"T.atomic_{op}(..., return_prev=True) takes one element and a scalar value (the "
                                   "old value of a region is not one value)", b.span)
        from ..ir import AtomicRet, Bind, Var

        e = AtomicRet(op, dst.buffer, dst.indices, cast(dst.buffer.dtype, as_expr(value, dst.buffer.dtype)),
                      _ORDERS[memory_order], "device")
        v = Var(b.fresh("prev"), dst.buffer.dtype)
        b.emit(Bind(v, e))
        return v
    if isinstance(dst, BufferLoad) and isinstance(value, (Buffer, Region)):
        # a tile into a point: the point starts a region of the value's extents (the region rule)
        v = _region(value, f"atomic_{op}", "value")
        d = _point_to_region(dst, v.extents, f"atomic_{op}")
        _check_same(f"atomic_{op}", v, d, "value and destination differ")
        _emit("atomic", (v, d), kind=op)
        return
    if isinstance(dst, BufferLoad):
        b.emit(Atomic(op, dst.buffer, dst.indices, cast(dst.buffer.dtype, as_expr(value, dst.buffer.dtype))))
        return None
    d = _region(dst, f"atomic_{op}", "destination")
    v = _region(value, f"atomic_{op}", "value") if isinstance(value, (Buffer, Region, BufferLoad)) else None
    if v is None:
        raise TileOpShapeError(f"T.atomic_{op}: a region destination takes a buffer or region value", b.span)
    if isinstance(v, BufferLoad):
        v = _point_to_region(v, d.extents, f"atomic_{op}")
    _check_same(f"atomic_{op}", v, d, "value and destination differ")
    _emit("atomic", (v, d), kind=op)


def im2col(img, col, nhw_step, c_step, kernel: int, stride: int, dilation: int, pad: int) -> None:
    """TileLang's im2col for a 2-D convolution over an NHWC image with a square ``kernel``: fills the
    (block_M, block_K) tile ``col`` with rows ``nhw_step * block_M + i`` of the unfolded image (one per output
    pixel n, oh, ow) and columns ``c_step * block_K + j`` (kh, kw, c, c fastest); zero where the kernel
    window reaches into the padding or the row is past the last pixel. Written as the ``T.Parallel`` loop
    TileLang lowers it to, so every backend runs it as such."""
    b = current("T.im2col")
    d = _region(col, "im2col", "destination")
    if not isinstance(img, Buffer) or img.ndim != 4:
        raise TileOpShapeError(f"T.im2col: the image must be a 4-D (N, H, W, C) tensor, got "
                               f"{getattr(img, 'name', type(img).__name__)}"
                               f"{_fmt(img.shape) if isinstance(img, Buffer) else ''}", b.span)
    if isinstance(d, BufferLoad) or len(d.extents) < 2 or any(const_value(e) != 1 for e in d.extents[:-2]):
        got = f"the point {d.buffer.name}[...]" if isinstance(d, BufferLoad) else f"{d.buffer.name}{_fmt(d.extents)}"
        raise TileOpShapeError(f"T.im2col: the destination must be a (block_M, block_K) tile, got {got}", b.span)
    if img.dtype != d.buffer.dtype:
        raise TileOpShapeError(f"T.im2col: the image is {img.dtype} but {d.buffer.name} is {d.buffer.dtype}; "
                               "they must be the same dtype", b.span)
    for name, v in (("kernel", kernel), ("stride", stride), ("dilation", dilation), ("pad", pad)):
        if not isinstance(v, int):
            raise TileOpShapeError(f"T.im2col: {name} must be a Python int, got {v!r}", b.span)
    n, h, w, c = img.shape
    block_m, block_k = d.extents[-2], d.extents[-1]
    oh = (h + (2 * pad - dilation * (kernel - 1) - 1)) // stride + 1
    ow = (w + (2 * pad - dilation * (kernel - 1) - 1)) // stride + 1
    i, j = Var(b.fresh("i"), INDEX), Var(b.fresh("j"), INDEX)
    m = as_expr(nhw_step) * block_m + i  # the output pixel (n, oh, ow) of row i
    k = as_expr(c_step) * block_k + j    # the kernel tap and channel (kh, kw, c) of column j
    ih = m % (oh * ow) // ow * stride + k // (c * kernel) * dilation - pad
    iw = m % ow * stride + k // c % kernel * dilation - pad
    inside = (ih >= 0) & (iw >= 0) & (ih < h) & (iw < w) & (m < n * oh * ow)
    value = select(inside, img[m // (oh * ow), ih, iw, k % c], cast(img.dtype, as_expr(0, img.dtype)))
    idx = (*d.starts[:-2], d.starts[-2] + i, d.starts[-1] + j)
    body = Store(d.buffer, idx, value, span=b.span)
    b.emit(For(i, as_expr(0), block_m, "parallel", For(j, as_expr(0), block_k, "parallel", body, span=b.span),
               span=b.span))


def _is_expr(x) -> bool:
    return isinstance(x, Expr)
