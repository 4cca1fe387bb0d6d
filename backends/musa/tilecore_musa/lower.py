"""MUSA's own tile-op lowerings and passes, chosen by the capability profile (never by an arch name).

- ``musa.tme_copy`` (``feature:bulk_tensor_copy``, PH1): a ``T.copy`` of a box of a global tensor into a
  whole shared tile is one TME load (``__musa_tme_ld_tile_<rank>d``) through a tensor descriptor the host
  builds, completing on an ASYNC barrier; ``T.copy(..., disable_tma=True)`` or ``force_async_copy=True``
  keeps the copy off TME.
- ``musa.sqmma_gemm`` (``feature:sqmma``, PH1): a 16-bit ``T.gemm`` of whole shared tiles into a float32
  accumulator, in a block of whole 4-warp squads, runs as SQMMA instructions that each squad issues
  (C stays in shared memory: the layout pass keeps it there for a hardware-feature intrinsic).
- ``musa.tme_pipelined_copies`` (slot ``tile-lowering``, before the core): the same TME loads for the copies
  of ``T.Pipelined`` loops, which the core would otherwise stage for per-thread asynchronous copies.
- ``musa.async_barriers`` (slot ``before-codegen``, after the core): numbers the TME loads' ASYNC
  barriers (IDs 1, 2, ... in program order, one per copy site) and records them in ``func.attrs``.
- ``musa.note_threads`` (slot ``legalize``, after the core): records each launch's thread count and
  ``producer_threads`` on its tile ops, which the choices above need; checks ``producer_threads``.

Both lowerings produce :class:`~tilecore.ir.Collective` statements: thread distribution runs them on
every thread between two barriers, and the emitter writes them out (codegen.py).
"""
from __future__ import annotations

from tilecore.errors import CompileError
from tilecore.ir import Collective, For, KernelLaunch, Region, TileOp, const_value, rewrite, simplify
from tilecore.passes import tile_pass
from tilecore.plugin import Intrinsic

#: SQMMA instruction shapes tilecore-musa issues, widest first (mute MP31_64x64 / MP31_32x32 forms), and the
#: k step of 16-bit operands
SQMMA_SHAPES = ((64, 64), (32, 32))
SQMMA_K = 16
SQUAD = 128
#: TME box limits tilecore-musa keeps to (policy: at most 256 elements per box dimension, rows of a whole
#: number of 16 bytes)
TME_MAX_BOX = 256


def _static(e):
    v = const_value(simplify(e)) if e is not None else None
    return None if v is None else int(v)


def _whole(r: Region) -> bool:
    """The region is its whole buffer (starts 0, extents the static shape)."""
    shape = r.buffer.static_shape()
    return (shape is not None and all(_static(s) == 0 for s in r.starts)
            and [_static(e) for e in r.extents] == [int(d) for d in shape])


def _extensions(op) -> dict:
    return dict(op.attrs.get("extensions", ()))


# -- TME copies ----------------------------------------------------------------------------------------

def tme_plan(op: TileOp):
    """(box extents per source dim, bytes) of a copy one TME load can do, else None."""
    src, dst = op.args
    if not (isinstance(src, Region) and isinstance(dst, Region)):
        return None
    if src.buffer.scope != "global" or dst.buffer.scope != "shared" or src.buffer.dtype != dst.buffer.dtype:
        return None
    if op.attrs.get("disable_tma") or _extensions(op).get("force_async_copy"):
        return None
    if not _whole(dst) or not 1 <= src.buffer.ndim <= 5:
        return None
    box = [_static(e) for e in src.extents]
    if any(b is None or b < 1 or b > TME_MAX_BOX for b in box):
        return None
    if [b for b in box if b != 1] != [int(d) for d in dst.buffer.static_shape() if int(d) != 1]:
        return None
    nbytes = dst.buffer.dtype.bytes
    if (box[-1] * nbytes) % 16:
        return None
    total = nbytes
    for b in box:
        total *= b
    return box, total


def tme_applies(op, ctx) -> bool:
    return op.op == "copy" and tme_plan(op) is not None


def lower_tme_copy(op: TileOp, ctx):
    src, dst = op.args
    box, total = tme_plan(op)
    attrs = {"src": src.buffer.name, "dtype": str(src.buffer.dtype), "box": box,
             "bytes": total, "issuer": op.attrs.get("musa_issuer", 0)}
    return Collective("tc_musa_tme_load", (dst, *src.starts), attrs, span=op.span)


# -- SQMMA gemms ---------------------------------------------------------------------------------------

def sqmma_plan(op: TileOp):
    """(M, N, K, IM, IN, transA, transB) of a gemm SQMMA can do, else None."""
    a, b, c = op.args
    if not all(isinstance(x, Region) and _whole(x) and x.buffer.ndim == 2 for x in (a, b, c)):
        return None
    if a.buffer.scope != "shared" or b.buffer.scope != "shared" or c.buffer.scope not in ("fragment", "shared"):
        return None
    if str(a.buffer.dtype) not in ("float16", "bfloat16") or a.buffer.dtype != b.buffer.dtype:
        return None
    if str(c.buffer.dtype) != "float32":
        return None
    threads = op.attrs.get("musa_threads", 0)
    if not threads or threads % SQUAD:
        return None
    ta, tb = bool(op.attrs.get("transpose_A")), bool(op.attrs.get("transpose_B"))
    am, ak = a.buffer.static_shape()
    bk, bn = b.buffer.static_shape()
    m, k = (ak, am) if ta else (am, ak)
    n = bk if tb else bn
    if k % SQMMA_K:
        return None
    for im, inn in SQMMA_SHAPES:
        if m % im == 0 and n % inn == 0:
            return int(m), int(n), int(k), im, inn, ta, tb
    return None


def sqmma_applies(op, ctx) -> bool:
    return op.op == "gemm" and sqmma_plan(op) is not None


def lower_sqmma_gemm(op: TileOp, ctx):
    a, b, c = op.args
    m, n, k, im, inn, ta, tb = sqmma_plan(op)
    attrs = {"M": m, "N": n, "K": k, "IM": im, "IN": inn, "IK": SQMMA_K, "TA": ta, "TB": tb,
             "dtype": str(a.buffer.dtype), "clear": bool(op.attrs.get("clear_accum")),
             "lda": int(a.buffer.static_shape()[-1]), "ldb": int(b.buffer.static_shape()[-1]),
             "ldc": int(c.buffer.static_shape()[-1])}
    return Collective("tc_musa_sqmma", (a, b, c), attrs, span=op.span)


def _sqmma_for(dtype: str):
    return lambda op, ctx: sqmma_applies(op, ctx) and str(op.args[0].buffer.dtype) == dtype


def intrinsics(target) -> list:
    return [
        Intrinsic("copy", "musa.tme_copy", lower_tme_copy, requires=("feature:bulk_tensor_copy",
                                                                      "feature:async_barrier"),
                  priority=20, applies=tme_applies),
        *[Intrinsic("gemm", f"musa.sqmma_gemm_{short}", lower_sqmma_gemm, requires=("feature:sqmma", f"dtype:{dt}:mma"),
                    priority=20, applies=_sqmma_for(dt)) for dt, short in (("float16", "f16"), ("bfloat16", "bf16"))],
    ]


# -- passes ----------------------------------------------------------------------------------------------

@tile_pass("musa.note_threads")
def note_threads(func, ctx):
    """Put each launch's flat thread count (and the TME issuing thread) on its tile ops; check
    ``T.Kernel(producer_threads=N)``: a whole number of warps, fewer than the block's threads."""
    warp = int(ctx.capabilities.get("execution.simd_width"))

    def launch(s):
        if not isinstance(s, KernelLaunch):
            return None
        threads = 1
        for t in s.threads:
            threads *= int(t)
        producers = dict(s.attrs.get("extensions", ())).get("producer_threads")
        issuer = 0
        if producers is not None:
            if producers <= 0 or producers % warp or producers >= threads:
                raise CompileError(f"T.Kernel(threads={threads}, producer_threads={producers}): producer_threads must "
                                   f"be a positive multiple of the warp width ({warp} on {ctx.target}) and fewer than "
                                   f"the block's {threads} threads", s.span)
            issuer = threads - producers  # the first thread of the trailing producer warps issues TME loads

        def op(x):
            if isinstance(x, TileOp):
                return TileOp(x.op, x.args, {**x.attrs, "musa_threads": threads, "musa_issuer": issuer}, span=x.span)
            return None

        return s.with_(body=rewrite(s.body, op))

    return func.with_body(rewrite(func.body, launch))


@tile_pass("musa.tme_pipelined_copies")
def tme_pipelined_copies(func, ctx):
    """Inside ``T.Pipelined`` loops, lower the copies TME can do to TME loads before the core stages them
    for its per-thread asynchronous copies: on a target with TME the operand tiles of a pipelined loop come
    through the copy engine. Each iteration waits for its loads before its compute (no multi-stage ring of
    barriers yet: ``num_stages`` does not overlap TME loads with compute)."""
    if ctx.capabilities.satisfies("feature:bulk_tensor_copy")[0] is not True:
        return func
    if ctx.capabilities.satisfies("feature:async_barrier")[0] is not True:
        return func

    def copy(s):
        if isinstance(s, TileOp) and tme_applies(s, ctx):
            return lower_tme_copy(s, ctx)
        return None

    def loop(s):
        if isinstance(s, For) and s.kind == "pipelined":
            return s.with_(body=rewrite(s.body, copy))
        return None

    return func.with_body(rewrite(func.body, loop))


@tile_pass("musa.async_barriers")
def async_barriers(func, ctx):
    """Number the ASYNC barriers: one ID per TME load site, from 1 in program order (``attrs["barrier"]``);
    ``func.attrs["async_barriers"]`` is how many the kernel uses."""
    count = [0]

    def number(s):
        if isinstance(s, Collective) and s.name == "tc_musa_tme_load":
            count[0] += 1
            return Collective(s.name, s.args, {**s.attrs, "barrier": count[0]}, s.threads, span=s.span)
        return None

    body = rewrite(func.body, number)
    return func.with_body(body, async_barriers=count[0])
