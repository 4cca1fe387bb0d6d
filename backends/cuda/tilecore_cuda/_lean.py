"""Fewer instructions in the register programs' softmax, each bit for bit what the program writes
(docs/decisions.md D35). Found by form, never by name:

- ``tilecore.cuda.pack_direct``: a 16-bit fragment whose only use is the A operand of one ``T.gemm`` and
  whose only writer is a whole ``T.copy`` from a float32 fragment (FlashAttention's ``T.copy(acc_s,
  acc_s_cast)``) is packed straight from the float32 fragment (one ``cvt.rn.f16x2.f32`` per pair). The
  copy's rounding to 16 bits, the conversion back to float and the packing (F2FP, HADD2.F32, F2FP per pair
  of elements: three conversions where one does) round the same value once: ``RN16(RN16(x)) = RN16(x)``.
- ``tilecore.cuda.exp2_range_check``: in the exact build, a 2-D ``T.Parallel`` nest ``F[i, j] =
  T.exp2(arg)`` computes every argument first and, where the thread's smallest one is at least -126, runs
  ``ex2.approx.ftz`` alone: ``exp2f`` without flushing is lowered by ptxas to ``FSETP.GEU x, -126``, ``x *
  0.5`` and a squaring of the result under that predicate around the same ``MUFU.EX2``, and those only act
  below -126 (subnormal results). Elsewhere (an argument below -126, or -inf from a mask) ``exp2f`` as
  before. The test costs one ``FMNMX`` an element instead of three instructions.
- ``tilecore.cuda.tree_reduce`` (D39, on where the loop runs 5 times or more): a row maximum or minimum of a 2-D fragment as 4 (2 for rows of more
  than 32 values a thread) partial chains combined pairwise, the identity last: the same bits, a quarter (a half)
  of the dependency depth.
- ``tilecore.cuda.skip_unit_rescale``: a 2-D nest ``F[i, j] = F[i, j] * r[i]`` (the rescale of O by
  ``exp2(m_prev - m_cur)``) is skipped where the row factors of every lane of the warp are exactly 1 (no
  row maximum moved): ``x * 1 = x`` in IEEE arithmetic without flushing, so the exact build's bits are kept;
  under fast math ``x * 1`` flushes a subnormal ``x`` to 0, so there a skipped rescale may keep a subnormal
  (below 1.2e-38) the multiply would have flushed.
"""
from __future__ import annotations

from tilecore.ir import BinOp, Bind, BufferLoad, Call, Seq, Store, TileOp, walk, walk_expr

PACK_DIRECT_DEFAULT = True
#: off: fewer instructions, but slower on the H100 (D35: the arguments, their minimum and the vote all come before
#: the first MUFU.EX2, which ptxas otherwise interleaves with them; non-causal exact 548.5 alone against 542.9 off,
#: causal 473.4 against 488.0)
EXP2_RANGE_CHECK_DEFAULT = False
#: off until pack + rescale is measured (D35: alone +6.5% exact, -1.6% fast on the H100)
SKIP_UNIT_RESCALE_DEFAULT = False
#: on (D39, measured on the H100: non-causal fast 128 x 128 667.1 -> 677.2 TFLOP/s, exact 128 x 176 579.4 -> 612.3):
#: the same bits (max and min are exact and associative; the identity is applied last, so a row whose every value
#: fmaxf drops, NaN, still gives the identity), a dependency chain of about n / (4 k) + log2 k steps instead of
#: n / 4. k partial chains keep k - 1 more values live a row: 4 where a thread holds at most 32 values a row, 2 above.
TREE_REDUCE_DEFAULT = True
#: ``True`` keeps the chain where the loop runs fewer times than this (its largest trip count known at compile
#: time): there ptxas unrolls it and the partial chains' registers made it serialize the WGMMAs (causal 128 x 64 at
#: s128 and s256, 128 x 128 at s256 and s384) or spill (128 x 128 at s384); none from 5 trips on (s128-s1000 swept)
TREE_MIN_TRIPS = 5
#: off until measured (D39; fast math only): a row sum feeding only a running sum ``L = L * X + r`` stays per
#: thread, its quad's four parts added once after the loop (4 SHFL + 4 FADD an iteration fewer)
ROW_SUM_PER_THREAD_DEFAULT = False


#: ``exp2_range_check="late"`` (D60): 8-column groups of a row a thread's vote covers (4 elements each)
EXP2_LATE_GROUP = 2


#: ``tilecore.cuda.exp2_poly`` (D60): 8-column groups of each row a thread computes on the FMA pipe (0: none)
EXP2_POLY_DEFAULT = 0


def exp2_poly(option) -> int:
    """``tilecore.cuda.exp2_poly`` checked: an int >= 0 (8-column groups of each row a thread holds whose
    exponentials run as ``tc_ex2_poly``; more than the row has means all of them)."""
    if isinstance(option, bool) or not isinstance(option, int) or option < 0:
        raise ValueError(f"tilecore.cuda.exp2_poly: {option!r}; use an int >= 0 (8-column groups of each row a "
                         "thread computes on the FMA pipe; 0: every exponential on MUFU.EX2)")
    return option


def exp2_late_group(option) -> int:
    """``tilecore.cuda.exp2_late_group`` checked: a positive int (8-column groups a vote of ``"late"`` covers; the
    nest's column count rounds it down to a divisor)."""
    if isinstance(option, bool) or not isinstance(option, int) or option < 1:
        raise ValueError(f"tilecore.cuda.exp2_late_group: {option!r}; use a positive int (8-column groups of a row "
                         "that one warp vote of exp2_range_check='late' covers)")
    return option


def exp2_check_mode(option):
    """``tilecore.cuda.exp2_range_check`` checked: False (off), ``"args"`` (True: D35's test on the computed
    arguments), ``"rows"`` (D54: the bound from each row's smallest input, beside the row maximum) or ``"late"``
    (D60: ``ex2.approx.ftz`` at once, each argument kept and tested beside it, ``exp2f`` redone after the vote)."""
    if option is None or option is False:
        return False
    if option is True or option == "args":
        return "args"
    if option in ("rows", "late"):
        return option
    raise ValueError(f"tilecore.cuda.exp2_range_check: {option!r}; use False, True (or 'args': the computed arguments' "
                     "minimum, D35), 'rows' (each row's smallest input, D54) or 'late' (each argument tested beside "
                     "its MUFU.EX2, exp2f redone after a warp vote, D60)")


def reduce_chains(option, per_row: int) -> int:
    """``tilecore.cuda.tree_reduce`` as a number of partial chains for a row of ``per_row`` values a thread:
    False -> 1 (one chain, as written), True -> 4 up to 32 values, else 2; an integer k >= 1 -> k (a power of two)."""
    if isinstance(option, bool) or option is None:
        return (4 if per_row <= 32 else 2) if option else 1
    k = int(option)
    if k < 1 or k & (k - 1):
        raise ValueError(f"tilecore.cuda.tree_reduce: {option!r} partial chains; use True, False or a power of two")
    return min(k, per_row)

_16BIT = ("float16", "bfloat16")


def _written(s) -> set:
    """The buffers statement ``s`` writes (stores, and the destination of tile ops)."""
    out = set()

    def visit(n):
        if isinstance(n, Store):
            out.add(n.buffer)
        elif isinstance(n, TileOp):
            dst = {"copy": 1, "gemm": 2, "fill": 0, "reduce": 1}.get(n.op)
            if dst is not None and len(n.args) > dst and hasattr(n.args[dst], "buffer"):
                out.add(n.args[dst].buffer)
            elif dst is None:  # an op this module does not know: everything it names
                out.update(a.buffer for a in n.args if hasattr(a, "buffer"))

    walk(s, visit)
    return out


def _named(s) -> set:
    """Every buffer statement ``s`` names (read or written)."""
    out = set()

    def expr(x):
        if isinstance(x, BufferLoad):
            out.add(x.buffer)

    def visit(n):
        if isinstance(n, Store):
            out.add(n.buffer)
            walk_expr(n.value, expr)
        elif isinstance(n, Bind):
            walk_expr(n.value, expr)
        elif isinstance(n, TileOp):
            for a in n.args:
                if hasattr(a, "buffer"):
                    out.add(a.buffer)
                else:
                    walk_expr(a, expr)

    walk(s, visit)
    return out


def direct_casts(plan) -> dict:
    """``{a: src}``: 16-bit fragments ``a`` the gemm can pack straight from the float32 fragment ``src``.

    ``a`` is 2-D, named only in the loop body, by exactly one whole ``T.copy(src, a)`` and, later, by exactly
    one ``T.gemm`` as its A operand; no statement between the two writes ``src``. The pack then happens where
    it did (at the gemm, or at the end of the work before it with the intra-warpgroup overlap), from ``src``'s
    values, which are the values the copy rounded."""
    frags, body = plan["frags"], plan["body"]
    outside = set().union(*(_named(s) for s in plan["pre"] + plan["post"])) if plan["pre"] + plan["post"] else set()
    out = {}
    for g, s in enumerate(body):
        if not (isinstance(s, TileOp) and s.op == "gemm"):
            continue
        a = s.args[0].buffer
        if frags.get(a) != 2 or str(a.dtype) not in _16BIT or a in outside:
            continue
        users = [k for k, x in enumerate(body) if a in _named(x)]
        copies = [k for k in users if isinstance(body[k], TileOp) and body[k].op == "copy"
                  and body[k].args[1].buffer is a]
        if len(copies) != 1 or set(users) != {copies[0], g} or copies[0] > g:
            continue
        c = copies[0]
        src = body[c].args[0].buffer
        if frags.get(src) != 2 or str(src.dtype) != "float32" or src.static_shape() != a.static_shape():
            continue
        if any(src in _written(x) for x in body[c + 1:g]):
            continue
        out[a] = src
    return out


def exp2_store(s, frags):
    """``(dst, arg)`` where the nest body ``s`` is the single store ``dst[i, j] = T.exp2(arg)`` into a 2-D
    float32 fragment; else None."""
    while isinstance(s, Seq) and len(s.body) == 1:
        s = s.body[0]
    if not (isinstance(s, Store) and frags.get(s.buffer) == 2 and str(s.buffer.dtype) == "float32"):
        return None
    v = s.value
    if isinstance(v, Call) and v.name == "exp2" and str(v.dtype) == "float32" and len(v.args) == 1:
        return s.buffer, v.args[0]
    return None


def row_division(s, frags):
    """``(dst, row)`` where the nest body ``s`` is the single store ``dst[i, j] = dst[i, j] / row[i]``, ``dst`` a 2-D
    float32 fragment and ``row`` a 1-D float32 fragment (FlashAttention's ``O / l``); else None."""
    while isinstance(s, Seq) and len(s.body) == 1:
        s = s.body[0]
    if not (isinstance(s, Store) and frags.get(s.buffer) == 2 and str(s.buffer.dtype) == "float32"):
        return None
    v = s.value
    if isinstance(v, BinOp) and v.op == "div" and str(v.dtype) == "float32" and isinstance(v.a, BufferLoad) \
            and v.a.buffer is s.buffer and isinstance(v.b, BufferLoad) and frags.get(v.b.buffer) == 1 \
            and str(v.b.buffer.dtype) == "float32":
        return s.buffer, v.b.buffer
    return None


#: ``tilecore.cuda.row_division`` (D60): on since round 3 measured it (+4.4% causal, +2.3% non-causal, the same bits)
ROW_DIVISION_DEFAULT = True


def unit_rescale(s, frags):
    """``(dst, row)`` where the nest body ``s`` is the single store ``dst[i, j] = dst[i, j] * row[i]`` (or
    ``row[i] * dst[i, j]``), ``dst`` a 2-D float32 fragment and ``row`` a 1-D float32 fragment; else None."""
    while isinstance(s, Seq) and len(s.body) == 1:
        s = s.body[0]
    if not (isinstance(s, Store) and frags.get(s.buffer) == 2 and str(s.buffer.dtype) == "float32"):
        return None
    v = s.value
    if not (isinstance(v, BinOp) and v.op == "mul" and str(v.dtype) == "float32"):
        return None
    for x, r in ((v.a, v.b), (v.b, v.a)):
        if isinstance(x, BufferLoad) and x.buffer is s.buffer and isinstance(r, BufferLoad) \
                and frags.get(r.buffer) == 1 and str(r.buffer.dtype) == "float32":
            return s.buffer, r.buffer
    return None
