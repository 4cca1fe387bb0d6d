"""The Metal backend's intrinsic table: ``T.gemm`` on simdgroup matrices.

``metal.gemm_simdgroup``: ``T.gemm`` whose operands are in threadgroup memory (shared tiles, or fragments
the core's layout pass keeps there), with 8x8-multiple tile shapes, a float32 accumulator and a block of
whole simdgroups. It lowers to one :class:`~tilecore.ir.Collective`, ``tc_sg_gemm<...>(A, B, C, tid)``
(prelude ``tc_metal.h``): each simdgroup takes chunks of 8x8 accumulator tiles, keeps them in
``simdgroup_matrix<float, 8, 8>`` registers over the K loop (``simdgroup_load`` of the operand tiles,
transposed where a transpose makes the stride along K the row stride, ``simdgroup_multiply_accumulate``)
and stores them back with ``simdgroup_store``.

The simdgroup matrix is an opaque fragment: Metal does not say which thread holds which element
(``units.py`` registers it with the core as a :class:`~tilecore.layout.MatrixUnit` whose layouts are
``opaque``). The core therefore keeps the accumulator in threadgroup memory wherever elements are
accessed (``T.clear``, epilogues, ``T.copy`` out): its layout pass sees that a hardware gemm needing a
feature (``feature:simdgroup_matrix``) runs this op and records the reason in
``kernel.meta["attrs"]["fragment_layouts"]``. Chosen by capability, never by family name.
"""
from __future__ import annotations

from tilecore.ir import (Buffer, BufferLoad, Collective, For, KernelLaunch, Region, Seq, Store, TileOp, as_expr,
                         const_value, rewrite, seq, simplify, stmt_exprs, walk, walk_expr)
from tilecore.passes import tile_pass
from tilecore.passes.matrix import mark_block_threads as _mark_block_threads
from tilecore.plugin import Intrinsic

BLOCK_LOCAL = ("shared", "fragment", "local")
ATOM = 8
SIMD = 32


def _static(e):
    v = const_value(simplify(as_expr(e)))
    return None if v is None else int(v)


def _strides(buf: Buffer):
    shape = buf.static_shape()
    if shape is None:
        return None
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= int(d)
    return tuple(reversed(out))


def _gemm_dims(op: TileOp):
    a, b, c = op.args
    ta, tb = bool(op.attrs.get("transpose_A")), bool(op.attrs.get("transpose_B"))
    m, n = _static(c.extents[-2]), _static(c.extents[-1])
    k = _static(a.extents[-2] if ta else a.extents[-1])
    return ta, tb, m, n, k


@tile_pass("metal.mark_block_threads")
def mark_block_threads(func, ctx):
    """Record the block's thread count on each T.gemm (``block_threads``): simdgroup matrices need whole
    simdgroups. Runs before the core's layout pass, which asks the intrinsic table whether a gemm runs
    on the simdgroup matrices (and so keeps its accumulator in threadgroup memory)."""
    return _mark_block_threads(func)


def gemm_simdgroup_applies(op: TileOp, ctx) -> bool:
    a, b, c = op.args
    threads = op.attrs.get("block_threads")
    if not isinstance(threads, int) or threads < SIMD or threads % SIMD:
        return False
    if not all(isinstance(r, Region) and r.buffer.scope in BLOCK_LOCAL for r in (a, b, c)):
        return False
    if c.buffer.dtype != "float32" or a.buffer.dtype not in ("float16", "bfloat16", "float32"):
        return False
    if b.buffer.dtype != a.buffer.dtype or not ctx.capabilities.satisfies(f"dtype:{a.buffer.dtype}:mma")[0]:
        return False
    if any(len(r.extents) < 2 or _strides(r.buffer) is None for r in (a, b, c)):
        return False
    if any(_static(e) != 1 for r in (a, b, c) for e in r.extents[:-2]):
        return False
    ta, tb, m, n, k = _gemm_dims(op)
    if None in (m, n, k) or not (m and n and k) or m % ATOM or n % ATOM or k % ATOM:
        return False
    kb = _static(b.extents[-1] if tb else b.extents[-2])
    ma = _static(a.extents[-1] if ta else a.extents[-2])
    nb = _static(b.extents[-2] if tb else b.extents[-1])
    return (kb, ma, nb) == (k, m, n)


def chunking(mt: int, nt: int, nsg: int) -> tuple:
    """``(RM, RN)``: the 8x8 accumulator tiles one simdgroup holds at a time (at most 4 x 4), chosen for the
    fewest rounds of operand loads and multiplies per simdgroup."""
    best = None
    for rm in (d for d in range(1, min(mt, 4) + 1) if mt % d == 0):
        for rn in (d for d in range(1, min(nt, 4) + 1) if nt % d == 0):
            rounds = -(-(mt // rm) * (nt // rn) // nsg)
            key = (rounds * (rm * rn + rm + rn), -rm * rn, abs(rm - rn))
            if best is None or key < best[0]:
                best = (key, rm, rn)
    return best[1], best[2]


def gemm_template(s: Collective) -> list:
    """Template arguments of ``tc_sg_gemm`` once the thread count is known (the emitter calls this)."""
    at = s.attrs
    threads = int(s.threads or SIMD)
    rm, rn = chunking(at["M"] // ATOM, at["N"] // ATOM, max(threads // SIMD, 1))
    return [threads, at["M"], at["N"], at["K"], at["SAM"], at["SAK"], at["SBK"], at["SBN"], at["SCM"], rm, rn,
            "true" if at["clear"] else "false"]


def lower_gemm_simdgroup(op: TileOp, ctx):
    a, b, c = op.args
    ta, tb, m, n, k = _gemm_dims(op)
    sa, sb, sc = _strides(a.buffer), _strides(b.buffer), _strides(c.buffer)
    sam, sak = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
    sbk, sbn = (sb[-1], sb[-2]) if tb else (sb[-2], sb[-1])
    attrs = {"M": m, "N": n, "K": k, "SAM": sam, "SAK": sak, "SBK": sbk, "SBN": sbn, "SCM": sc[-2],
             "dtype": str(a.buffer.dtype), "clear": bool(op.attrs.get("clear_accum")),
             "threads": op.attrs["block_threads"]}
    return Collective("tc_sg_gemm", (a, b, c), attrs, span=op.span)


# -- accumulators held in simdgroup registers over a whole K loop -------------------------------------------

#: at most this many 8x8 accumulator tiles per simdgroup stay in registers over a loop (2 floats per thread each)
MAX_RESIDENT_TILES = 16


def _touches(s, buf) -> list:
    """The statements under ``s`` that read or write ``buf`` (tile-op regions, stores, loads)."""
    found = []

    def visit(x):
        if isinstance(x, (TileOp, Collective)) and any(isinstance(a, Region) and (a.buffer.base or a.buffer) is buf
                                                       for a in x.args):
            found.append(x)
            return
        if isinstance(x, Store) and (x.buffer.base or x.buffer) is buf:
            found.append(x)
            return
        hit = []
        for e in stmt_exprs(x):
            walk_expr(e, lambda y: hit.append(1) if isinstance(y, BufferLoad) and (y.buffer.base or y.buffer) is buf
                      else None)
        if hit:
            found.append(x)

    walk(s, visit)
    return found


def _resident_plan(loop: For, ctx):
    """``(gemm, attrs)`` where ``loop``'s body runs exactly one simdgroup gemm (a ``tc_sg_gemm`` collective)
    into an accumulator nothing else in the loop touches (the K loop of a tiled GEMM), and the block's
    simdgroups can hold all its tiles; else None."""
    body = list(loop.body.body) if isinstance(loop.body, Seq) else [loop.body]
    gemms = [x for x in body if isinstance(x, Collective) and x.name == "tc_sg_gemm"]
    if len(gemms) != 1 or gemms[0].attrs["clear"]:
        return None
    op = gemms[0]
    c = op.args[2].buffer
    if _touches(loop.body, c) != [op] or c.dtype != "float32":
        return None
    at = op.attrs
    nsg = at["threads"] // SIMD
    rm, rn = chunking(at["M"] // ATOM, at["N"] // ATOM, nsg)
    chunks = (at["M"] // (ATOM * rm)) * (at["N"] // (ATOM * rn))
    per_sg = -(-chunks // nsg)
    if per_sg * rm * rn > MAX_RESIDENT_TILES:
        return None
    return op, {"RM": rm, "RN": rn, "tiles": per_sg * rm * rn}


@tile_pass("metal.resident_accumulators")
def resident_accumulators(func, ctx):
    """Keep a K loop's simdgroup accumulators in registers for the whole loop (after the core's tile lowering,
    which turned each simdgroup ``T.gemm`` into a ``tc_sg_gemm`` collective): where a loop at the top of a
    launch runs one such gemm into an accumulator nothing else in the loop touches, the
    accumulator tiles are loaded from threadgroup memory once before the loop (``tc_sg_acc_load``), the
    gemm multiplies into them (``tc_sg_gemm_acc``) and they are stored back once after it
    (``tc_sg_acc_store``), instead of a load and a store per iteration. Element access before and after
    the loop still goes through threadgroup memory (the fragment is opaque). Pass config
    ``tilecore.metal.resident_accumulators=False`` turns it off."""
    if ctx.option("tilecore.metal.resident_accumulators", True) is False:
        return func
    counter = [0]

    def launch(s):
        if not isinstance(s, KernelLaunch):
            return None
        top = list(s.body.body) if isinstance(s.body, Seq) else [s.body]
        out, changed = [], False
        for st in top:
            found = _resident_plan(st, ctx) if isinstance(st, For) else None
            if found is None:
                out.append(st)
                continue
            op, geo = found
            c = op.args[2]
            name = f"tc_acc{counter[0]}"
            counter[0] += 1
            common = {"M": op.attrs["M"], "N": op.attrs["N"], "SCM": op.attrs["SCM"], "acc": name, **geo}
            new_gemm = Collective("tc_sg_gemm_acc", op.args[:2], {**op.attrs, **common}, span=op.span)
            body = rewrite(st.body, lambda x: new_gemm if x is op else None)
            out += [Collective("tc_sg_acc_load", (c,), common, span=op.span), st.with_(body=body),
                    Collective("tc_sg_acc_store", (c,), common, span=op.span)]
            recorded[c.buffer.name] = (f"{geo['tiles']} 8x8 tiles per simdgroup in simdgroup registers over the "
                                       f"loop on {st.var.name}")
            changed = True
        return s.with_(body=seq(out)) if changed else None

    recorded: dict = {}
    body = rewrite(func.body, launch)
    return func.with_body(body, resident_accumulators=recorded) if recorded else func


def _acc_template(s: Collective) -> list:
    at = s.attrs
    return [int(s.threads or SIMD), at["M"], at["N"], at["SCM"], at["RM"], at["RN"]]


def _gemm_acc_template(s: Collective) -> list:
    at = s.attrs
    return [int(s.threads or SIMD), at["M"], at["N"], at["K"], at["SAM"], at["SAK"], at["SBK"], at["SBN"], at["RM"],
            at["RN"]]


COLLECTIVES = {"tc_sg_gemm": gemm_template, "tc_sg_acc_load": _acc_template, "tc_sg_acc_store": _acc_template,
               "tc_sg_gemm_acc": _gemm_acc_template}

INTRINSICS = [
    Intrinsic("gemm", "metal.gemm_simdgroup", lower_gemm_simdgroup, requires=("feature:simdgroup_matrix",),
              priority=20, applies=gemm_simdgroup_applies),
]
