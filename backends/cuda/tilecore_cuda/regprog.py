"""The mma.sync register program: a whole ``T.Kernel`` with its fragments in registers (sm_80 / sm_86 / sm_89).

``cuda.register_program`` (tile-lowering slot, after ``cuda.hopper_gemm_pipeline``) takes a kernel whose block
program fits this model and that the route (:data:`MMA_GENERAL_FORMS`) does not leave to the core's general path, and
emits it as one block-collective statement, ``tc_register_program``, that the CUDA emitter spells out
(:func:`emit_register_program`):

- the block's warpgroups (``threads / 128`` of them) each own 64 rows of every fragment, every warp 16: a 2-D
  fragment ``(bM, n)`` is held in the ``mma.sync`` m16n8k16 accumulator layout (``n / 2`` registers per thread:
  warp ``w`` has rows ``16 w + lane / 4 (+ 8)``, register ``4 j + 2 h + e`` is column ``8 j + 2 (lane % 4) + e`` of
  row ``+ 8 h``); a 1-D fragment ``(bM,)`` holds the thread's two rows. ``bM`` must be ``64 * warpgroups``;
- every warp issues the ``T.copy`` from global into shared memory as ``num_stages``-deep 16-byte ``cp.async``
  copies into 128-byte-swizzled tiles (copies before the ``T.Pipelined`` loop once);
- the statements run in program order on the registers: ``T.gemm`` as ``ldmatrix`` + ``mma.sync`` (A from shared
  memory or from a 16-bit fragment in registers), ``T.reduce`` along rows with quad shuffles, ``T.fill``,
  fragment-to-fragment ``T.copy`` (with conversion), fragment-to-global ``T.copy``, and ``T.Parallel`` nests over
  ``(bM,)`` or ``(bM, n)`` whose fragment accesses are indexed by the loop variables. A shared tile that only relays
  a fragment to global memory after the loop is folded into the fragment-to-global store (``_fold.py``, D33).

On sm_90a the WGMMA register program (``cuda.hopper_register_program``: a producer warpgroup on TMA, consumer
warpgroups on WGMMA, FA3's schedules) is retired (D86, issue 11): every kernel of its form (:func:`wgmma_form`)
runs on the core's general path, which takes WGMMA and TMA itself; ``tilecore.cuda.register_programs=True`` and the
options only it read (:data:`RETIRED_OPTIONS`) are refused there, naming D86.

A kernel with anything else (other scopes, other index patterns, branches at block level, ...) keeps the generic
path; the reason is recorded in ``kernel.meta["attrs"]["hopper_pipelines"]``.
"""
from __future__ import annotations

from tilecore.ir import (Allocate, Bind, Buffer, BufferLoad, Collective, For, KernelLaunch, Region, Seq, Store, TileOp,
                         BinOp, Call, FloatImm, Select, Var, as_expr, binary, compare, const_value,
                         simplify, walk, walk_expr)
from tilecore.ir.visit import collect
from tilecore.ir.dtypes import is_float
from tilecore.passes.pipeline import map_expr, map_stmt, substitute
from tilecore.passes import tile_pass
from tilecore.passes.core import block_allocations, onchip_limit
from tilecore.passes.guard import guard_stmt, launch_facts, loop_facts
# the masked-loop split's analysis is the core's (D55's tilecore.split_masked_iterations; D30 wrote it here first)
from tilecore.passes.masksplit import mask_nest as _nest, mask_parts as _mask_parts, mentions as _mentions
from tilecore.passes.masksplit import unmask as _unmask

from . import _lean
from ._fold import fold_epilogue_tiles as _fold_epilogue_tiles
from ._irutil import NoMatch as _No, full as _full, need as _need, nonunit, row_stride, static as _s
from .hopper import WG, rewrite_launches

#: kind -> (identity, combine under fast math, combine otherwise): fmaxf / fminf drop NaN, T.reduce_max
#: propagates it (tc_nanmax is one max.NaN instruction on sm_80+)
_REDUCE = {"sum": ("0.0f", "({a} + {b})", "({a} + {b})"),
           "max": ("(-INFINITY)", "fmaxf({a}, {b})", "tc_nanmax({a}, {b})"),
           "min": ("INFINITY", "fminf({a}, {b})", "tc_nanmin({a}, {b})")}
_16BIT = ("float16", "bfloat16")


class _Analysis:
    def __init__(self, launch: KernelLaunch, ctx):
        self.ctx = ctx
        threads = 1
        for t in launch.threads:
            threads *= int(const_value(as_expr(t)))
        _need(len(launch.threads) == 1 and threads % WG == 0 and 0 < threads <= 768,
              "a one-dimensional block of whole warpgroups")
        self.nc = threads // WG
        self.bm = 64 * self.nc
        self.frags: dict = {}
        self.shared: dict = {}
        self.copies: dict = {}       # shared buffer -> (copy op, staged)
        self.wgmma: list = []
        self.gemm_n: list = []

    # -- buffers --------------------------------------------------------------------------------
    def allocate(self, a: Allocate):
        b = a.buffer
        shape = b.static_shape()
        _need(shape is not None and a.init is None, f"{b.name}: a buffer without a static shape")
        if b.scope == "shared":
            _need(len(shape) == 2 and str(b.dtype) in _16BIT, f"{b.name}: shared buffers must be 2-D 16-bit tiles")
            rows, cols = shape
            _need(rows % 8 == 0 and rows <= 256 and ((cols * b.dtype.bytes) % 128 == 0 or
                                                     (cols * b.dtype.bytes == 64 and rows % 16 == 0)),
                  f"{b.name}: shared tiles must be whole 128-byte rows (or one 64-byte column of them in 16-row "
                  "groups), 8-row groups, at most 256 rows")
            # the swizzle (and atom width) in bytes: 128, or 64 for a tile of 64-byte rows (block_K = 32 of 16-bit
            # elements: the TMA map's and the WGMMA descriptor's 64-byte mode, D47). 16-row groups keep such a tile
            # a whole number of KiB, so every tile after it stays on the 1024-byte boundary 128-byte swizzle needs
            swz = 128 if (cols * b.dtype.bytes) % 128 == 0 else 64
            self.shared[b] = {"rows": rows, "cols": cols, "esize": b.dtype.bytes, "swz": swz}
        elif b.scope == "fragment":
            _need(shape[0] == self.bm and len(shape) in (1, 2),
                  f"{b.name}: fragments must be ({self.bm},) or ({self.bm}, n) for {self.nc} warpgroup(s)")
            _need(str(b.dtype) in ("float32", *_16BIT), f"{b.name}: fragment dtype {b.dtype}")
            if len(shape) == 2:
                _need(shape[1] % 8 == 0 and 8 <= shape[1] <= 256, f"{b.name}: fragment width must be 8..256, by 8")
            self.frags[b] = len(shape)
        else:
            raise _No(f"{b.name}: {b.scope} buffers")

    # -- statements -----------------------------------------------------------------------------
    def no_frag_loads(self, e, what: str):
        def chk(x):
            if isinstance(x, BufferLoad) and (x.buffer in self.frags or x.buffer in self.shared):
                raise _No(f"{what} reads {x.buffer.name}")
        walk_expr(e, chk)

    def stmt(self, s, where: str):
        if isinstance(s, Bind):
            self.no_frag_loads(s.value, "a block-level value")
            return
        if isinstance(s, TileOp):
            return getattr(self, "op_" + s.op, self.op_other)(s, where)
        if isinstance(s, For) and s.kind == "parallel":
            return self.parallel(s)
        raise _No(f"{type(s).__name__} at block level")

    def op_other(self, s, where):
        raise _No(f"T.{s.op}")

    def op_fill(self, s, where):
        r = s.args[0]
        _need(_full(r) and r.buffer in self.frags, "T.fill of something other than a whole fragment")
        self.no_frag_loads(s.args[1], "T.fill")

    def op_copy(self, s, where):
        src, dst = s.args
        _need(isinstance(src, Region) and isinstance(dst, Region), "copy of non-regions")
        if dst.buffer in self.shared:
            _need(src.buffer.scope != "fragment",
                  f"{dst.buffer.name}: a shared tile filled from fragment {src.buffer.name} is used otherwise than "
                  "relaying it whole to global memory (written once, whole, then only copied whole to global "
                  "memory at block level: what the register program folds into a store from registers)")
            _need(src.buffer.scope == "global" and _full(dst) and src.buffer.dtype == dst.buffer.dtype,
                  "copies into shared memory must be whole tiles from global tensors of the same dtype")
            _need(dst.buffer not in self.copies, f"{dst.buffer.name} is filled twice")
            _need(where in ("pre", "loop"), "a copy into shared memory after the loop")
            nu = nonunit(src.extents)
            rows, cols = self.shared[dst.buffer]["rows"], self.shared[dst.buffer]["cols"]
            _need(nu and nu[-1] == src.buffer.ndim - 1 and len(nu) <= 2, "source tile must end in the last dimension")
            ext = [_s(src.extents[d]) for d in nu]
            _need(ext == ([rows, cols] if len(nu) == 2 else [cols]) and (len(nu) == 2 or rows == 1),
                  "copy extents do not match the shared tile")
            _need(src.buffer.ndim <= 5, "TMA copies tensors of at most 5 dimensions")
            row = _s(src.buffer.shape[-1])
            _need(row is not None and (row * src.buffer.dtype.bytes) % 16 == 0,
                  f"rows of {src.buffer.name} are not a static multiple of 16 bytes, as 16-byte copies need")
            self.copies[dst.buffer] = (s, where == "loop")
            return
        if src.buffer in self.frags and dst.buffer in self.frags:
            _need(_full(src) and _full(dst) and src.buffer.static_shape() == dst.buffer.static_shape(),
                  "fragment copies must be whole")
            return
        if src.buffer in self.frags and dst.buffer.scope == "global" and self.frags[src.buffer] == 1:
            # a row value per row (FlashAttention's log-sum-exp): one run of bM elements along any dimension
            nu = nonunit(dst.extents)
            _need(_full(src) and len(nu) == 1 and _s(dst.extents[nu[0]]) == self.bm,
                  f"a copy of {src.buffer.name} to global memory must be the whole fragment into one run of "
                  f"{self.bm} elements")
            _need(str(dst.buffer.dtype) in ("float32", *_16BIT), "output dtype")
            return
        if src.buffer in self.frags and dst.buffer.scope == "global":
            _need(_full(src) and self.frags[src.buffer] == 2, "only whole 2-D fragments are stored to global memory")
            nu = nonunit(dst.extents)
            shape = src.buffer.static_shape()
            _need(len(nu) == 2 and nu[-1] == dst.buffer.ndim - 1 and [_s(dst.extents[d]) for d in nu] == list(shape),
                  "fragment-to-global copy extents")
            _need(str(dst.buffer.dtype) in ("float32", *_16BIT), "output dtype")
            return
        raise _No(f"T.copy {src.buffer.scope} -> {dst.buffer.scope}")

    def op_reduce(self, s, where):
        src, dst = s.args[:2]
        _need(s.attrs.get("kind") in _REDUCE and s.attrs.get("dim") in (1, -1), "reduce kind / dim")
        _need(_full(src) and _full(dst) and self.frags.get(src.buffer) == 2 and self.frags.get(dst.buffer) == 1,
              "reduce from a 2-D fragment into a 1-D fragment")

    def op_gemm(self, s, where):
        a, b, c = s.args
        _need(not s.attrs.get("transpose_A"), "transpose_A")
        _need(all(_full(r) for r in (a, b, c)), "gemm operands must be whole buffers")
        _need(self.frags.get(c.buffer) == 2 and str(c.buffer.dtype) == "float32", "gemm C must be a float32 fragment")
        _need(b.buffer in self.shared, "gemm B must be in shared memory")
        dt = str(b.buffer.dtype)
        _need(str(a.buffer.dtype) == dt, "gemm operand dtypes differ")
        n = c.buffer.static_shape()[1]
        tb = bool(s.attrs.get("transpose_B"))
        bshape = b.buffer.static_shape()
        k = a.buffer.static_shape()[1]
        _need(tuple(bshape) == ((n, k) if tb else (k, n)), "gemm shapes")
        _need(k % 16 == 0, "gemm K must be a multiple of 16")
        if not tb:
            _need((n * 2) % 128 == 0, "B as (K, N) needs N in whole 128-byte rows")
        self.gemm_n.append(n)
        if a.buffer in self.shared:
            self.wgmma.append((dt, n, not tb, False))
        else:
            _need(self.frags.get(a.buffer) == 2, "gemm A must be in shared memory or a 2-D fragment")
            self.wgmma.append((dt, n, not tb, True))

    def parallel(self, loop: For):
        _need(_s(loop.start) == 0 and _s(loop.extent) == self.bm, f"T.Parallel over {self.bm} rows first")
        inner = loop.body
        while isinstance(inner, Seq) and len(inner.body) == 1:
            inner = inner.body[0]
        if isinstance(inner, For) and inner.kind == "parallel":
            _need(_s(inner.start) == 0 and _s(inner.extent) is not None, "column loop")
            cols, body, jv = _s(inner.extent), inner.body, inner.var
        else:
            cols, body, jv = None, loop.body, None
        iv = loop.var

        def check_load(x):
            if isinstance(x, BufferLoad):
                if x.buffer in self.shared:
                    raise _No("T.Parallel reads a shared tile")
                dims = self.frags.get(x.buffer)
                if dims == 1:
                    _need(len(x.indices) == 1 and x.indices[0] is iv, f"{x.buffer.name} indexed by something else than the row")
                elif dims == 2:
                    _need(cols is not None and x.indices[0] is iv and x.indices[1] is jv
                          and x.buffer.static_shape()[1] == cols, f"{x.buffer.name} indexed by something else than (row, col)")

        def check(st):
            if isinstance(st, Seq):
                return
            if isinstance(st, Bind):
                walk_expr(st.value, check_load)
                return
            if isinstance(st, Store):
                walk_expr(st.value, check_load)
                for i in st.indices:
                    walk_expr(i, check_load)
                dims = self.frags.get(st.buffer)
                if dims == 1:
                    _need(cols is None and st.indices[0] is iv, f"{st.buffer.name}: row values are written in a 1-D loop")
                elif dims == 2:
                    _need(cols is not None and st.indices[0] is iv and st.indices[1] is jv
                          and st.buffer.static_shape()[1] == cols, f"{st.buffer.name} written at other than (row, col)")
                else:
                    _need(st.buffer.scope == "global", f"T.Parallel writes {st.buffer.scope} memory")
                return
            raise _No(f"{type(st).__name__} inside T.Parallel")

        walk(body, check)


def _p_in_block_memory(lbody: list, threads: int, ctx) -> bool:
    """Whether the core's general path keeps FlashAttention's P (the second gemm's A fragment) in block memory: the
    first gemm's accumulator is split across the columns by the warp groups (no ``T.GemmWarpPolicy.FullRow``: the
    core's :func:`~tilecore.passes.matrix.plan_gemm` gives ``wn > 1``), so P feeds the matrix unit only through block
    memory (the layout pass keeps it there) and each row reduction combines the groups' partials through a scratch.
    The register program holds every warp on 16 whole rows either way. D85 measured that form (the catalog's kernel,
    64x64) at 0.56-0.64x the register program at d64 and 0.83-0.89x at d128 with sm_86's block memory."""
    from tilecore.passes.matrix import plan_gemm

    gemms = [s for s in lbody if isinstance(s, TileOp) and s.op == "gemm"]
    if len(gemms) != 2:
        return False
    first = plan_gemm(gemms[0], threads, ctx)
    return first is not None and first.attrs["groups"][1] > 1


def _plan(launch: KernelLaunch, ctx, mode: str) -> dict:
    body = list(launch.body.body) if isinstance(launch.body, Seq) else [launch.body]
    body, folded = _fold_epilogue_tiles(body)
    an = _Analysis(launch, ctx)
    loops = [k for k, s in enumerate(body) if isinstance(s, For) and s.kind == "pipelined"]
    _need(len(loops) == 1, "one T.Pipelined loop at block level")
    lk = loops[0]
    loop = body[lk]
    pre, post = [], []
    for k, s in enumerate(body):
        if isinstance(s, Allocate):
            an.allocate(s)
    for k, s in enumerate(body):
        if isinstance(s, Allocate) or k == lk:
            continue
        an.stmt(s, "pre" if k < lk else "post")
        (pre if k < lk else post).append(s)
    lbody = list(loop.body.body) if isinstance(loop.body, Seq) else [loop.body]
    for s in lbody:
        an.stmt(s, "loop")
    _need(set(an.copies) == set(an.shared), "every shared tile is filled by one T.copy from global memory")
    _need(an.wgmma, "no T.gemm")
    # 64-byte tiles on WGMMA: measured faster than the general path only at block_N 256 (H100, D47: 128x256x32
    # 0.251 -> 0.240 ms; 128x128x32 0.293 -> 0.309, 64x128x32 a tie), so narrower GEMMs keep the general path
    # (and the mma.sync program, 2x slower than both there, never takes what WGMMA left on a WGMMA target)
    wgmma_target = ctx.capabilities.feature("wgmma") and not ctx.option("tilecore.cuda.disable_wgmma", False)
    _need(all(an.shared[b]["swz"] == 128 for b in an.shared) or not wgmma_target or
          (mode == "wgmma" and max(an.gemm_n) >= 256),
          "64-byte tiles take WGMMA here only for gemms 256 wide (narrower ones are as fast on the general path, D47)")
    if mode == "mma":
        _need(all(n % 16 == 0 for n in an.gemm_n), "gemm widths must be multiples of 16 for mma.sync")
    staged = [b for b in an.shared if an.copies[b][1]]
    once = [b for b in an.shared if not an.copies[b][1]]
    _need(staged, "nothing to pipeline")
    size = {b: an.shared[b]["rows"] * an.shared[b]["cols"] * an.shared[b]["esize"] for b in an.shared}
    once_bytes = sum(size[b] for b in once)
    stage_bytes = sum(size[b] for b in staged)
    limit = onchip_limit(ctx)
    stages = max(int(loop.annotations.get("num_stages") or 0), 2)
    while stages >= 2 and 1024 + once_bytes + stages * stage_bytes + 16 * stages + 16 > limit:
        stages -= 1
    _need(stages >= 2, "not even two stages fit in shared memory")
    layout, off = {}, 0
    for b in once:
        layout[b] = off
        off += size[b]
    off = 0
    for b in staged:
        layout[b] = off
        off += size[b]
    # the block memory the core's general path needs at the least for this kernel (the route's rule, D85): every
    # shared tile of the launch once (those the register program folds too: the general path keeps them) and the
    # loop's stages of the tiles its copies fill before the first gemm (the planner's leading copies)
    first_gemm = next((k for k, s in enumerate(lbody) if isinstance(s, TileOp) and s.op == "gemm"), len(lbody))
    leading = {s.args[1].buffer for s in lbody[:first_gemm] if isinstance(s, TileOp) and s.op == "copy"
               and s.args[1].buffer in size}
    every_tile = sum(-(-(const_value(simplify(a.buffer.numel())) or 0) * a.buffer.dtype.bytes // 16) * 16
                     for a in block_allocations(launch.body) if a.buffer.scope == "shared")
    general_min = every_tile + (max(int(loop.annotations.get("num_stages") or 0), 2) - 1) * sum(size[b] for b in leading)
    return {"mode": mode, "nc": an.nc, "bm": an.bm, "stages": stages, "pre": pre, "loop": loop, "body": lbody, "post": post,
            "folded": folded, "general_min_bytes": general_min,
            "p_in_block_memory": _p_in_block_memory(lbody, an.nc * WG, ctx),
            "frags": an.frags, "shared": an.shared, "once": once, "staged": staged, "offset": layout,
            "once_bytes": once_bytes, "stage_bytes": stage_bytes,
            "pipe_bytes": 1024 + once_bytes + stages * stage_bytes + 16 * stages + 16,
            "copies": {b: an.copies[b][0] for b in an.shared}, "tensor_maps": [], "gemms": len(an.wgmma),
            "gemm_list": list(an.wgmma),  # (dtype, n, B K-major, A from registers) of each gemm in order
            "wgmma": sorted(set(an.wgmma)) if mode == "wgmma" else []}


def _loads(x) -> set:
    """The buffers expression or statement ``x`` reads (BufferLoad anywhere in it)."""
    out = set()
    fn = lambda e: out.add(e.buffer) if isinstance(e, BufferLoad) else None  # noqa: E731
    if hasattr(x, "dtype") and not hasattr(x, "body"):
        walk_expr(x, fn)
    else:
        def visit(n):
            if isinstance(n, Store):
                walk_expr(n.value, fn)
                for i in n.indices:
                    walk_expr(i, fn)
            elif isinstance(n, Bind):
                walk_expr(n.value, fn)
            elif isinstance(n, TileOp):
                for a in n.args:
                    if isinstance(a, Region):
                        out.add(a.buffer)
                    else:
                        walk_expr(a, fn)
        walk(x, visit)
    return out


def _stores_of(s) -> list:
    out = []
    walk(s, lambda n: out.append(n) if isinstance(n, Store) else None)
    return out


def _partial_sums(plan, ctx, name) -> dict:
    """``tilecore.cuda.row_sum_per_thread`` (D39, fast math only: the additions' order changes): ``{id(reduce):
    L}`` for each ``T.reduce_sum(F, r)`` (whole rows, cleared) in the loop body whose result ``r`` is read only by
    one 1-D nest ``L[i] = L[i] * X[i] + r[i]`` (the running row sum: linear in ``r``), where ``L`` is named in the
    body by that nest only, set before the loop only by a fill with 0, and ``X`` holds the same value in the four
    threads of a row (a 1-D fragment nothing derived from a 2-D one without a reduction). Each thread then keeps
    its own part of ``L`` and ``r`` (no shuffles an iteration); the quad's parts are added once after the loop,
    before anything reads ``L`` (FA3's ``finalize``)."""
    if not (ctx.option("tilecore.cuda.row_sum_per_thread", _lean.ROW_SUM_PER_THREAD_DEFAULT)
            and ctx.option("tilecore.fast_math", False)):
        return {}
    body, frags = plan["body"], plan["frags"]
    one_d = {b for b, n in frags.items() if n == 1}
    every = plan["pre"] + body + plan["post"]
    out = {}
    for red in body:
        if not (isinstance(red, TileOp) and red.op == "reduce" and red.attrs.get("kind") == "sum"
                and red.attrs.get("clear", True) and red.args[1].buffer in one_d):
            continue
        r = red.args[1].buffer
        users = [x for x in every if x is not red and r in _touched(x, frags)]
        if len(users) != 1 or not isinstance(users[0], For):
            continue
        stores = _stores_of(users[0])
        if len(stores) != 1 or stores[0].buffer not in one_d:
            continue
        st_, L = stores[0], stores[0].buffer
        v = st_.value
        if not (isinstance(v, BinOp) and v.op == "add"):
            continue
        terms = [v.a, v.b]
        rt = [t for t in terms if isinstance(t, BufferLoad) and t.buffer is r]
        other = [t for t in terms if not any(t is u for u in rt)]
        if len(rt) != 1 or len(other) != 1 or not (isinstance(other[0], BinOp) and other[0].op == "mul"):
            continue
        m = other[0]
        lt = [t for t in (m.a, m.b) if isinstance(t, BufferLoad) and t.buffer is L]
        xt = [t for t in (m.a, m.b) if not any(t is u for u in lt)]
        if len(lt) != 1 or len(xt) != 1 or not (isinstance(xt[0], BufferLoad) and xt[0].buffer in one_d):
            continue
        X = xt[0].buffer
        if any(L in _touched(x, frags) for x in body if x is not users[0]):
            continue
        pre_writes = [x for x in plan["pre"] if L in _touched(x, frags)]
        if any(not (isinstance(x, TileOp) and x.op == "fill" and const_value(x.args[1]) == 0) for x in pre_writes):
            continue
        # X's value the same in a row's four threads: no 1-D fragment it derives from is written from a 2-D
        # fragment other than by a reduction (every reduction here ends with the quad's shuffles), nor from r / L
        mixed = {r, L}
        changed = True
        while changed:
            changed = False
            for x in every:
                if isinstance(x, TileOp) and x.op == "reduce" and x is not red:
                    continue
                written = {b for b in _touched(x, frags) if b in one_d} - _loads_only(x, frags)
                if not written:
                    continue
                reads = _loads(x)
                if (reads & mixed or any(frags.get(b) == 2 for b in reads)) and not written <= mixed:
                    mixed |= written
                    changed = True
        if X in mixed:
            continue
        out[id(red)] = L
    if out:
        ctx.notes.append(f"{name}: row sums kept per thread until after the loop ("
                         f"{', '.join(sorted(b.name for b in out.values()))}; fast math)")
    return out


def _loads_only(x, frags) -> set:
    """Fragments statement ``x`` reads but does not write."""
    written = set()
    walk(x, lambda n: written.add(n.buffer) if isinstance(n, Store) else None)
    if isinstance(x, TileOp):
        dst = {"copy": 1, "gemm": 2, "fill": 0, "reduce": 1}.get(x.op)
        if dst is not None and len(x.args) > dst and isinstance(x.args[dst], Region):
            written.add(x.args[dst].buffer)
    return {b for b in _touched(x, frags) if b not in written}


def _touched(s, frags) -> set:
    """The register fragments (keys of ``frags``) statement ``s`` reads or writes."""
    found = set()

    def expr(x):
        if isinstance(x, BufferLoad) and x.buffer in frags:
            found.add(x.buffer)

    def visit(n):
        if isinstance(n, TileOp):
            for a in n.args:
                if isinstance(a, Region):
                    if a.buffer in frags:
                        found.add(a.buffer)
                else:
                    walk_expr(a, expr)
        elif isinstance(n, Store):
            if n.buffer in frags:
                found.add(n.buffer)
            walk_expr(n.value, expr)
        elif isinstance(n, Bind):
            walk_expr(n.value, expr)

    walk(s, visit)
    return found


def _is_gemm(s) -> bool:
    return isinstance(s, TileOp) and s.op == "gemm"


def _two_gemms(plan) -> tuple:
    """FlashAttention's form of a loop body, found from the statements (no names): exactly two ``T.gemm``,
    with elementwise or reduction work on fragments between them (``T.Parallel`` nests, ``T.reduce``).
    Returns ``(g1, g2)``, the two gemms' positions in the body, or raises :class:`_No` saying what is missing."""
    body = plan["body"]
    gemms = [k for k, s in enumerate(body) if _is_gemm(s)]
    _need(len(gemms) == 2, f"the loop body has {len(gemms)} T.gemm, not two")
    g1, g2 = gemms
    _need(any(isinstance(s, For) or (isinstance(s, TileOp) and s.op == "reduce") for s in body[g1 + 1:g2]),
          "no elementwise or reduction work between the two T.gemm")
    return g1, g2


#: default of ``tilecore.cuda.split_masked_loop`` (docs/decisions.md D30): the loop runs its iterations where
#: every ``T.if_then_else`` mask on the loop variable provably holds without the mask (the same values: exact)
SPLIT_MASKED_LOOP_DEFAULT = True


#: default of ``tilecore.cuda.fold_softmax_scale`` (D30): under fast math, ``T.exp`` / ``T.exp2`` of a sum of one
#: element term and row terms becomes one ``fmaf`` into ``exp2f``, the natural exponent's log2(e) folded into the
#: factors; the exact build is left as written (contraction and reassociation change its roundings)
FOLD_SOFTMAX_SCALE_DEFAULT = True
LOG2E = 1.4426950408889634


def _affine(e, invariant) -> list | None:
    """``e`` as ``[(term, factor)]`` (``e`` = sum of ``term * factor``) over ``+``, ``-`` and products with a
    factor ``invariant`` says is the same for the row's elements; a term None stands for 1."""
    if isinstance(e, BinOp) and is_float(e.dtype):
        if e.op in ("add", "sub"):
            a, b = _affine(e.a, invariant), _affine(e.b, invariant)
            if e.op == "sub":
                b = [(t, _times(f, FloatImm(-1.0, e.dtype))) for t, f in b]
            return a + b
        if e.op == "mul":
            for x, y in ((e.a, e.b), (e.b, e.a)):
                if invariant(y):
                    return [(t, _times(f, y)) for t, f in _affine(x, invariant)]
    if isinstance(e, FloatImm):
        return [(None, e)]
    return [(e, FloatImm(1.0, e.dtype))]


def _times(a, b):
    if isinstance(a, FloatImm) and isinstance(b, FloatImm):
        return FloatImm(a.value * b.value, a.dtype)
    if isinstance(a, FloatImm) and a.value == 1.0:
        return b
    if isinstance(b, FloatImm) and b.value == 1.0:
        return a
    return binary("mul", a, b)


def _fold_exp(e, invariant):
    """Under fast math: ``exp(x A + B)`` -> ``exp2f(fmaf(x, A log2 e, B log2 e))`` and ``exp2(x A + B)`` ->
    ``exp2f(fmaf(x, A, B))``, ``A`` and ``B`` the same for the row (computed once per row by the compiler), so an
    element costs one FFMA and one MUFU.EX2 however the user wrote the affine argument (``(x - m) * s``,
    ``x * s - m * s``, ``exp`` with the scale). ``e`` itself where there is no such call."""
    def fn(x):
        if not (isinstance(x, Call) and x.name in ("exp", "exp2", "fast_exp", "fast_exp2")
                and str(x.dtype) == "float32"):
            return None
        if x.name.endswith("exp2") and _fma_form(x.args[0], invariant):
            return None  # already x * A + B: nvcc contracts it under fast math (the catalog's attention)
        terms = _affine(x.args[0], invariant)
        elem = [tf for tf in terms if tf[0] is not None and not invariant(tf[0])]
        if len(elem) != 1:
            return None
        scale = FloatImm(LOG2E if x.name.endswith("exp") else 1.0, "float32")
        (t, a), rest = elem[0], [tf for tf in terms if tf is not elem[0]]
        b = None
        for u, f in rest:
            term = _times(f, scale) if u is None else _times(u, _times(f, scale))
            b = term if b is None else binary("add", b, term)
        arg = _times(t, _times(a, scale)) if b is None else Call("ieee_fmaf", (t, _times(a, scale), b), "float32",
                                                                 (("rounding", "rn"),))
        return Call("exp2", (arg,), "float32")

    return map_expr(e, fn)


def _fma_form(e, invariant) -> bool:
    """``e`` is ``x * A + B`` or ``x * A - B`` (``A``, ``B`` the row's)."""
    if not (isinstance(e, BinOp) and e.op in ("add", "sub")):
        return False
    sides = ((e.a, e.b), (e.b, e.a)) if e.op == "add" else ((e.a, e.b),)
    return any(invariant(b) and isinstance(a, BinOp) and a.op == "mul" and (invariant(a.a) or invariant(a.b))
               for a, b in sides)


def _split_masked(plan, facts, ctx, name) -> None:
    """``tilecore.cuda.split_masked_loop``: where the loop body's ``T.Parallel`` nests hold masks
    (``T.if_then_else``) on the loop variable that provably hold for whole iterations up to some block-level
    bound (causal attention's diagonal: ``bx * bm + i >= k * bn + j`` holds for every ``i, j`` while
    ``k < floor((bx * bm - bn + 1) / bn) + 1``), those iterations run a body without the masks and the rest
    keep them. Found from the predicates (the prover's ranges of the nest's variables), not from a name.
    Sets ``plan["unmasked"]`` to ``{"end": iterations without masks (a block-level expression, clamped to
    the trip count), "body": the body without them, "all": whether every iteration is one}``."""
    plan["unmasked"] = None
    loop = plan["loop"]
    k = loop.var
    ends, body, changed, masks = [], [], False, []
    outer = {}  # the loop body's binds before the nest: their values (they may vary with k), substituted
    for s in plan["body"]:
        if isinstance(s, Bind):
            outer[id(s.var)] = substitute(s.value, outer)
        if isinstance(s, For) and s.kind == "parallel":
            ranges, binds, stores = _nest(s, outer)
            for st in stores:
                def look(x, binds=binds, ranges=ranges):
                    if isinstance(x, Select):
                        c = substitute(x.cond, binds)
                        if _mentions(c, k):
                            masks.append(x)
                            ends.extend(_mask_parts(c, k, ranges)[0])
                walk_expr(st.value, look)
            new = _rewrite_stores(s, lambda v, ranges=ranges, binds=binds: _unmask(v, k, ranges, binds))
            changed |= new is not s
            body.append(new)
        else:
            body.append(s)
    if not masks:
        return
    if not changed or not ends:
        ctx.notes.append(f"{name}: no masked-loop split (no T.if_then_else on the loop variable that holds "
                         "for whole iterations)")
        return
    end = ends[0]
    for e in ends[1:]:
        end = binary("min", end, e)
    n = loop.extent
    count = simplify(binary("min", binary("max", binary("sub", end, loop.start), 0), n))
    # block-level binds before the loop (the trip count's own) hold where the loop runs
    for b in plan["pre"]:
        if isinstance(b, Bind) and not is_float(b.var.dtype):
            facts = facts.with_range(b.var, b.value, b.value)
    every = facts.proves(compare("ge", binary("sub", end, loop.start), n))
    plan["unmasked"] = {"end": count, "body": body, "all": bool(every)}
    where = "every iteration" if every else "the iterations before the mask's first"
    ctx.notes.append(f"{name}: masked-loop split: {where} run without the T.if_then_else masks on "
                     f"{loop.var.name}")


def _binds_in(s) -> list:
    out = []
    walk(s, lambda x: out.append(x) if isinstance(x, Bind) else None)
    return out


def _rewrite_stores(s, fn):
    """``s`` (a ``T.Parallel`` nest) with ``fn`` applied to the value of each store; ``s`` itself if none changes."""
    from tilecore.ir.visit import rewrite

    hit = []

    def one(x):
        if isinstance(x, Store):
            v = fn(x.value)
            if v is not x.value:
                hit.append(x)
                return x.with_(value=v)
        return None

    new = rewrite(s, one)
    return new if hit else s


#: ``tilecore.cuda.register_programs`` (D61): True: the mma.sync register program takes every kernel of its form;
#: False: none (the core's general path takes every kernel); "auto" (the default): the route of
#: :data:`MMA_GENERAL_FORMS` on the mma.sync targets (sm_80 / 86 / 89). On sm_90a the WGMMA register program is
#: retired (D86): every kernel of its form (:func:`wgmma_form`) runs on the core's general path, with
#: :data:`AUTO_FORM_DEFAULTS` where the route is "auto"; True there is refused (:func:`retired_wgmma`)
REGISTER_PROGRAMS = "tilecore.cuda.register_programs"
REGISTER_PROGRAMS_DEFAULT = "auto"
#: the decision that retired the WGMMA register program (issue 11): named by every refusal of its options
RETIRED = "D86"
#: D77 / D81 / D82 / D83: the forms of FlashAttention that "auto" had left to the general path on sm_90a before D86,
#: each ``(head dimension, fast math, consumer warpgroups, key block)`` with None for any, every one measured at 0.95x
#: the WGMMA register program or better (H200, b8 h32 s4096): d128 at 128x128 (GQA too; 0.959-1.033), d128 at 128x176
#: (fast 0.997-1.012; exact with D83's two loops and P @ V's descriptor offsets 0.964-0.978, causal 0.980-1.016),
#: d256 at 128x64 (0.960-1.009), one consumer warpgroup at 64x64 with d128 (1.07-1.30) and d64 (0.97-1.21), d64 with
#: two consumer warpgroups at 128x128 (D81: 0.966-1.046 shuffled), d256 at 64x64 with its form's defaults (D82:
#: 0.980-1.061). D86 retired the program; the forms it still took then (d64 at 128x176 and d128 at 128x64 with two
#: consumer warpgroups: TileLang's GQA backward example's forward kernel) were measured in D86's round 1. Kept as
#: the record of what each route measured; the route itself no longer reads it
AUTO_GENERAL: tuple = ((128, None, 2, 128), (128, None, 2, 176), (256, None, 2, 64), (128, None, 1, 64),
                       (64, None, 1, 64), (64, None, 2, 128), (256, None, 1, 64))


#: D82: the general path's options the route sets as the compile's defaults (``PassContext.set_defaults``: a value the
#: config gives wins) on sm_90a for FlashAttention's form (the retired WGMMA register program's, :func:`wgmma_form`),
#: keyed ``(head dimension, fast math, consumer warpgroups, key block)`` with None for any; only where
#: ``tilecore.cuda.register_programs`` is "auto" (False: the core's own defaults).
#: d256 at 64x64 (one consumer warpgroup, 160 KiB of stages: one block an SM either way): a producer warpgroup issues
#: the bulk copies (``tilecore.warp_specialize``: V refilled as soon as P @ V released its stage, no block barrier in
#: the loop, the register program's form) and O leaves by bulk tile stores (``tilecore.bulk_store``). D82 (H200, 15
#: rounds each, general / register program, exact then fast, non-causal / causal): the thread-0 form 0.847 / 0.801,
#: 0.958 / 0.844; the producer warpgroup 0.955 / 0.925, 1.041 / 0.906 (round 1); with the bulk stores (round 2, the
#: mean of the default route's kernel and the same kernel as a variant) 1.003 / 0.980, 1.061 / 0.980.
#: (D83's d128 at 128x176 exact build takes its two loops and P @ V's descriptor offsets from the core's and the
#: emitter's own "auto" rules, ``tilecore.pipeline_mask_unswitch`` and ``tilecore.cuda.descriptor_offsets``: on any
#: route)
AUTO_FORM_DEFAULTS: dict = {(256, None, 1, 64): {"tilecore.warp_specialize": True, "tilecore.bulk_store": True}}
#: the decision each entry of :data:`AUTO_FORM_DEFAULTS` was measured in (the route's note names it)
AUTO_FORM_WHY: dict = {(256, None, 1, 64): "D82"}


def _wgmma_target(ctx) -> bool:
    return bool(ctx.capabilities.feature("wgmma")) and not ctx.option("tilecore.cuda.disable_wgmma", False)


def wgmma_form(launch: KernelLaunch, ctx) -> tuple | None:
    """``(head dimension or None, consumer warpgroups, key block)`` where this kernel is of the form the retired WGMMA
    register program took on a WGMMA target (one pipelined loop, every shared tile filled by one copy, its fragments
    held in the accumulator layout; head dimension None where it is not FlashAttention's two gemms), else None."""
    plan = _wgmma_plan(launch, ctx)
    if plan is None:
        return None
    shape = _attention_shape(plan)
    return (None if shape is None else shape[1], plan["nc"], plan["gemm_list"][0][1])


def _wgmma_plan(launch: KernelLaunch, ctx) -> dict | None:
    if not _wgmma_target(ctx):
        return None
    top = launch.body.body if isinstance(launch.body, Seq) else [launch.body]
    if any(isinstance(s, Collective) for s in top) or not any(isinstance(s, For) and s.kind == "pipelined" for s in top):
        return None
    try:
        return _plan(launch, ctx, "wgmma")
    except _No:
        return None


#: D86: the retired program ran FlashAttention's loop at least two stages deep whatever its ``num_stages`` (TileLang's
#: GQA backward example asks one: the general path then issues no copy ahead). ``tilecore.cuda.attention_stage_floor``
#: ("auto", the default; False: the kernel's own ``num_stages``): on sm_90a under register_programs "auto", that
#: form's pipelined loop asking fewer than two stages gets two where the general path's least plan with two fits the
#: block memory (``plan["general_min_bytes"]``, D85's rule)
STAGE_FLOOR = "tilecore.cuda.attention_stage_floor"


def _stage_floor(launch: KernelLaunch, plan: dict, ctx) -> tuple:
    """``(launch, note)``: the launch with its pipelined loop two stages deep (:data:`STAGE_FLOOR`), or ``(None, "")``
    where it asks two or more, the option is False or two stages would not fit."""
    v = ctx.option(STAGE_FLOOR, "auto")
    if v not in ("auto", False):
        from tilecore.errors import CompileError

        raise CompileError(f"pass config {STAGE_FLOOR}={v!r}: give \"auto\" (the default) or False")
    loop = plan["loop"]
    asked = int(loop.annotations.get("num_stages") or 0)
    if v is False or asked >= 2 or plan["general_min_bytes"] > onchip_limit(ctx):
        return None, ""
    top = list(launch.body.body) if isinstance(launch.body, Seq) else [launch.body]
    k = next(i for i, x in enumerate(top) if isinstance(x, For) and x.kind == "pipelined")
    top[k] = top[k].with_(annotations={**top[k].annotations, "num_stages": 2})
    body = Seq(top, span=launch.body.span) if isinstance(launch.body, Seq) else top[0]
    return launch.with_(body=body), (f"; its loop two stages deep (num_stages={asked} asked: the retired program's "
                                     f"floor, {STAGE_FLOOR})")


def register_programs_route(ctx):
    """The option's value: True, False or "auto" (anything else fails, naming the option and its values)."""
    v = ctx.option(REGISTER_PROGRAMS, REGISTER_PROGRAMS_DEFAULT)
    if v is True or v is False or v == "auto":
        return v
    from tilecore.errors import CompileError

    raise CompileError(f"{REGISTER_PROGRAMS} must be True, False or \"auto\", not {v!r}")


def retired_wgmma(launch: KernelLaunch, ctx) -> tuple:
    """``(why, launch)``: why this kernel runs on the core's general path on a WGMMA target though it is the retired
    WGMMA register program's form (None: it is not that form), and the launch to compile there (None: as it is;
    :func:`_stage_floor`). ``tilecore.cuda.register_programs=True`` is refused for it, naming
    D86 and what runs instead. Under "auto", :data:`AUTO_FORM_DEFAULTS`' options for its form become the compile's
    defaults (D82)."""
    plan = _wgmma_plan(launch, ctx)
    if plan is None:
        return None, None
    shape = _attention_shape(plan)
    dim, nc, bn = (None if shape is None else shape[1], plan["nc"], plan["gemm_list"][0][1])
    if register_programs_route(ctx) is True:
        from tilecore.errors import CompileError

        raise CompileError(f"{REGISTER_PROGRAMS}=True: the WGMMA register program (sm_90a) is retired ({RETIRED}, "
                           "issue 11); this kernel runs on the core's general path, which takes WGMMA and TMA itself "
                           "and measured at 0.95x the program or better on FlashAttention's forms (docs/decisions.md "
                           f"D77-D83, {RETIRED}): drop the option (or give False); the mma.sync register program is "
                           "still there on sm_80 / sm_86 / sm_89")
    fast = bool(ctx.option("tilecore.fast_math", False))
    what = ("its form" if dim is None else
            f"FlashAttention's form, {nc} consumer warpgroup(s), head dimension {dim}, key block {bn}, "
            f"{'fast math' if fast else 'the exact build'}")
    why = f"{what}: the WGMMA register program is retired ({RETIRED})"
    if dim is None or register_programs_route(ctx) != "auto":
        return why, None
    new, more = _stage_floor(launch, plan, ctx)
    why += more
    form = next(((d, f, c, k) for d, f, c, k in AUTO_FORM_DEFAULTS
                 if d in (None, dim) and f in (None, fast) and c in (None, nc) and k in (None, bn)), None)
    if form is not None:
        extra = AUTO_FORM_DEFAULTS[form]
        taken = ctx.set_defaults(extra)
        why += (f"; the form's defaults {', '.join(f'{k}={v!r}' for k, v in extra.items())} "
                f"({AUTO_FORM_WHY.get(form, 'D82')}{'' if len(taken) == len(extra) else '; the config gives the rest'})")
    return why, new


def _lower_as(mode: str):
    name = "cuda.register_program"

    def lower(launch: KernelLaunch, ctx):
        top = launch.body.body if isinstance(launch.body, Seq) else [launch.body]
        if any(isinstance(s, Collective) for s in top):
            return None  # already taken by an earlier pass
        if not any(isinstance(s, For) and s.kind == "pipelined" for s in top):
            ctx.notes.append(f"{name}: kernel not mapped to registers (no T.Pipelined loop at block level: the "
                             "register program pipelines one)")
            return None
        why, new = retired_wgmma(launch, ctx)  # D86: on sm_90a the WGMMA program's form goes to the general path
        if why is not None:
            ctx.notes.append(f"{name}: left to the core's general path ({why})")
            return new
        try:
            plan = _plan(launch, ctx, mode)
        except _No as e:
            ctx.notes.append(f"{name}: kernel not mapped to registers ({e})")
            return None
        if mode == "mma":
            why, notes = _route_notes(plan, ctx, name)
            ctx.notes.extend(notes)
            if why:
                return None
        # the core's bounds guards (tilecore.guard_accesses runs after this pass): global accesses in the
        # block-level statements that the tensor's edge may cut (none when the shapes divide)
        facts = launch_facts(launch)
        plan["pre"] = [guard_stmt(s, facts) for s in plan["pre"]]
        plan["post"] = [guard_stmt(s, facts) for s in plan["post"]]
        plan["body"] = [guard_stmt(s, loop_facts(plan["loop"], facts)) for s in plan["body"]]
        plan["pingpong"] = plan["overlap"] = plan["split"] = None
        if plan["folded"]:
            ctx.notes.append(f"{name}: {', '.join(plan['folded'])} only relayed a fragment to global memory: "
                             "stored from the registers directly")
        plan["fold"] = bool(ctx.option("tilecore.cuda.fold_softmax_scale", FOLD_SOFTMAX_SCALE_DEFAULT))
        # fewer instructions, the same bits (D35; _lean.py)
        plan["direct"] = (_lean.direct_casts(plan) if ctx.option("tilecore.cuda.pack_direct", _lean.PACK_DIRECT_DEFAULT)
                          else {})
        plan["exp2_check"] = _lean.exp2_check_mode(ctx.option("tilecore.cuda.exp2_range_check",
                                                              _lean.EXP2_RANGE_CHECK_DEFAULT))
        plan["exp2_poly"] = _lean.exp2_poly(ctx.option("tilecore.cuda.exp2_poly", _lean.EXP2_POLY_DEFAULT))
        plan["row_division"] = bool(ctx.option("tilecore.cuda.row_division", _lean.ROW_DIVISION_DEFAULT))
        plan["exp2_late_group"] = _lean.exp2_late_group(ctx.option("tilecore.cuda.exp2_late_group",
                                                                   _lean.EXP2_LATE_GROUP))
        plan["skip_rescale"] = bool(ctx.option("tilecore.cuda.skip_unit_rescale", _lean.SKIP_UNIT_RESCALE_DEFAULT))
        plan["tree_reduce"] = ctx.option("tilecore.cuda.tree_reduce", _lean.TREE_REDUCE_DEFAULT)
        _lean.reduce_chains(plan["tree_reduce"], 1)  # a bad value fails here, naming the option
        if plan["tree_reduce"] is True:  # D39: the chain where the loop runs at most TREE_MIN_TRIPS - 1 times
            binds: dict = {}
            for x in plan["pre"]:
                if isinstance(x, Bind):
                    binds[id(x.var)] = substitute(x.value, binds)
            ext = simplify(substitute(as_expr(plan["loop"].extent), binds))
            most = facts.bound(ext, True)
            most = const_value(simplify(most)) if most is not None else const_value(ext)
            if isinstance(most, int) and most < _lean.TREE_MIN_TRIPS:
                plan["tree_reduce"] = False
        plan["unmasked"] = None
        if ctx.option("tilecore.cuda.split_masked_loop", SPLIT_MASKED_LOOP_DEFAULT):
            _split_masked(plan, facts, ctx, name)
        plan["beside"], plan["late"], plan["tma_store"], plan["persist"] = None, [], None, None
        plan["partial_sums"] = _partial_sums(plan, ctx, name)
        pipe = Buffer("regprog_smem", (plan["pipe_bytes"],), "uint8", "shared")
        coll = Collective("tc_register_program", (Region(pipe, (as_expr(0),), (pipe.shape[0],)),),
                          {"plan": plan, "tensor_maps": plan["tensor_maps"], "wgmma": plan["wgmma"]},
                          span=launch.span)
        body = Seq([Allocate(pipe, span=launch.span), coll], span=launch.body.span)
        ctx.notes.append(f"{name}: mma.sync + cp.async, {plan['nc'] * 4} warps of 16 rows, {len(plan['frags'])} "
                         f"fragments in registers, {len(plan['once'])} tile(s) loaded once, "
                         f"{len(plan['staged'])} pipelined {plan['stages']} stages deep")
        return launch.with_(body=body)

    return lower


#: pass config: the forms of kernel the mma.sync register program leaves to the core's general path on targets without
#: wgmma (sm_80, sm_86, sm_89), where the general path measured at least 0.97x its speed: ``"gemm"`` (one gemm, D63),
#: ``"attention"`` (FlashAttention's form: two gemms, the softmax between them; every shape) and
#: ``"attention-measured"`` (that form at the shapes of :data:`MMA_ATTENTION_SHAPES` where the general path's least
#: plan fits the target's block memory: sm_80, D73; sm_86 / sm_89, D85).
#: ``tilecore.cuda.register_programs=True`` still forces the register program, False sends every kernel to the
#: general path (with the core's own defaults: the form's defaults below come with the route)
MMA_GENERAL_FORMS = "tilecore.cuda.mma_general_forms"
#: measured (H200 as sm_80): the GEMM + bias + ReLU 4096^3 at 128x128x32 on the general path 1.05x the register
#: program, 1.15x with its k steps unrolled and the barriers pruned (this plugin's defaults there; D63);
#: FlashAttention with the late copy and D55's options 0.99-1.05x at the shapes of MMA_ATTENTION_SHAPES (D71 round 2,
#: D73); with Q landed by the loop's first wait (its tile swizzled) 1.21-1.46x, 64x64 d64 too (D79)
MMA_GENERAL_FORMS_DEFAULT: tuple = ("gemm", "attention-measured")
_FORMS = ("gemm", "attention", "attention-measured")
#: (block rows, head dimension: the second gemm's width) of FlashAttention's form that ``"attention-measured"``
#: routes: D71 round 2 (H200 as sm_80 through D63's overlay, fast math, b8 h32 s4096, the key block as wide as the
#: rows), the general path with :data:`MMA_ATTENTION_DEFAULTS` against the register program: 128x128 d128 1.002 /
#: 0.992 causal, 64x64 d128 1.049 / 1.007, 128x128 d64 1.005 / 1.018; 64x64 d64 since D79 (the form's defaults with
#: the lead copy and the joined commit group: 1.20-1.33x fast math and exact, causal and not, both orders; D73's
#: defaults had 0.93-0.97: Q's ldmatrix read an unswizzled tile, 8-way bank conflicts); 64 rows at d256 since D82 (with
#: O's relay tile folded, :data:`MMA_ATTENTION_SHAPE_DEFAULTS`: 1.46-1.55x, causal 1.21-1.49x; without it 0.83-0.86x
#: causal, 255 registers and spills); other shapes were not measured and stay
MMA_ATTENTION_SHAPES: tuple = ((128, 128), (64, 128), (128, 64), (64, 64), (64, 256))
#: ``"attention-measured"`` routes a shape where the general path's least plan of the kernel fits the target's block
#: memory (:func:`_general_fits`: the capability profile's ``max_shared_bytes_per_block``; D73 routed only on targets
#: with sm_80's, D85 on every mma.sync target by this rule). With sm_86's / sm_89's block memory through D63's overlay
#: (one H100 / H200, ``--profile sm86``, the SM's carveout at that profile's) the general path with the form's
#: defaults measured against the register program (regprog time / general time, in order / reversed): D79 round 3
#: 64x64 d64 1.462 / 1.458, causal 1.444 / 1.402; 64x64 d128 1.669 / 1.659, causal 1.397 / 1.384; D85 round 1 (H200,
#: the route's default, TileLang's fp16 forward, fast math) 128x128 d64 1.307 / 1.297, causal 1.247 / 1.245; 64x64 d64
#: 1.489 / 1.492, causal 1.442 / 1.439; 64x64 d128 1.671 / 1.659, causal 1.389 / 1.386; 128 rows x 32 keys d64 1.262 /
#: 1.254, causal 1.297 / 1.289, d128 1.251 / 1.242, causal 1.307 / 1.301; round 2, the catalog's kernel in bf16 with
#: FullRow: 128x128 d64 1.320 / 1.310, causal 1.205 / 1.201, 64x64 d64 1.674 / 1.673, causal 1.503 / 1.487, d128 1.593 /
#: 1.580, causal 1.142 / 1.138; round 3, TileLang's in the exact build: 128x128 d64 1.303 / 1.302, causal 1.246 / 1.244,
#: 64x64 d64 1.523 / 1.523, causal 1.396 / 1.409, d128 1.501 / 1.510, causal 1.171 / 1.173
SM86_MEASURED = "1.14-1.67x"
#: FlashAttention's form whose P the general path keeps in block memory (:func:`_p_in_block_memory`: the catalog's
#: kernel, no warp policy) stays on the register program under ``"attention-measured"`` on every mma.sync target. D85
#: round 1 (H200, sm_86's profile, 64x64, fast math; regprog time / general time): d64 0.643 / 0.638, causal 0.559 /
#: 0.560 (fp16 and bf16 alike), d128 0.888 / 0.881, causal 0.840 / 0.834
P_SHARED_MEASURED = "0.56-0.89x"
#: the core's options the route turns on by default for FlashAttention's form on the general path of an mma.sync
#: target (``PassContext.set_defaults``: a value the compile's config gives wins, either way): V issued at the top of
#: the iteration after the barrier that frees its buffer (D71) and D55's (a cast stored once, the proven comparisons
#: of named booleans pruned, the masked iterations split), which the core turns on by itself only on targets with
#: bulk tile copies. The kernel was then D71's ``late-d55`` row. D79: and the copy before the loop (Q) issued by the
#: core as its own group, landed by the loop's first wait (``tilecore.pipeline_lead_copies``: Q, K(0), V(0) in flight
#: together, and Q's tile swizzled like K's and V's: the plugin's whole-tile copy left it unswizzled, so its ldmatrix
#: were 8-way bank conflicts), and where V is staged (64x64 d64) the stage ahead's K and V one commit group
#: (``tilecore.pipeline_join_groups``). Measured (H200 as sm_80, regprog time / row time, in order / reversed): D73's
#: default -> with the lead copy: d128 128x128 1.053 / 1.037 -> 1.323 / 1.314, causal 1.002 / 0.995 -> 1.245 / 1.228,
#: 64x64 1.049 / 1.040 -> 1.460 / 1.430, causal 1.006 / 0.998 -> 1.386 / 1.379; d64 128x128 1.006 / 1.004 -> 1.221 /
#: 1.211, causal 0.976 / 0.985 -> 1.212 / 1.221; 64x64 d64 (routed) 0.970 / 0.977 -> 1.213 / 1.226 with both, causal
#: 0.931 / 0.942 -> 1.263 / 1.196 (the lead copy alone 1.198 / 1.191, 1.206 / 1.188)
MMA_ATTENTION_DEFAULTS: dict = {"tilecore.pipeline_late_copy": True, "tilecore.store_cast_once": True,
                                "tilecore.prune_condition_binds": True, "tilecore.split_masked_iterations": True,
                                "tilecore.pipeline_lead_copies": True, "tilecore.pipeline_join_groups": True}
#: and at 128-row blocks also ``tilecore.prune_false_comparisons`` (the non-causal mask's edge test folded where the
#: key block divides the sequence). D73 round 1 (H200 as sm_80, regprog time / row time, in order / reversed): 128x128
#: d128 1.024 / 1.015 -> 1.053 / 1.044 (fast math), 0.996 / 0.988 -> 1.058 / 1.049 (exact); d64 1.017 / 1.007 -> 1.013 /
#: 1.005 (fast), 1.016 / 1.007 -> 1.046 / 1.039 (exact); at 64 rows a loss (64x64 d128 fast 1.049 -> 1.035, exact
#: 1.081 -> 1.077; 64x64 d64 routed 0.970 / 1.002 -> 0.943 / 0.974): not there. Causal rows within 0.6%
MMA_ATTENTION_ROWS_DEFAULTS: dict = {128: {"tilecore.prune_false_comparisons": True}}
#: D82: and by (block rows, head dimension): the options of one routed shape. 64 rows at d256: O's relay tile folded
#: (``tilecore.fold_relay_tiles``: O stored from its registers, so V gets its second stage in the 163 KiB and ptxas
#: holds the kernel in 255 registers without spills; the route's other defaults spilled 40-64 bytes). Measured (H200
#: as sm_80, regprog time / row time, in order / reversed): fast math 1.519 / 1.499, causal 1.485 / 1.460; exact 1.549 /
#: 1.530, causal 1.212 / 1.214 (the route's defaults without it: 1.075, 0.861 causal; exact 1.208, 0.833)
MMA_ATTENTION_SHAPE_DEFAULTS: dict = {(64, 256): {"tilecore.fold_relay_tiles": True}}


def _mma_forms(ctx) -> tuple:
    forms = ctx.option(MMA_GENERAL_FORMS, MMA_GENERAL_FORMS_DEFAULT)
    if isinstance(forms, str) or not all(f in _FORMS for f in forms):
        from tilecore.errors import CompileError

        raise CompileError(f"pass config {MMA_GENERAL_FORMS}={forms!r}: give a list of forms among "
                           f"{', '.join(map(repr, _FORMS))}")
    return tuple(forms)


def _attention_shape(plan) -> tuple | None:
    """``(block rows, head dimension)`` of FlashAttention's form (two gemms, the second reading its A from
    registers, work between them), or None for another form."""
    gemms = plan.get("gemm_list", [])
    if len(gemms) != 2 or not gemms[1][3]:
        return None
    try:
        _two_gemms(plan)
    except _No:
        return None
    return plan["bm"], gemms[1][1]


def routed_to_general(plan, ctx) -> str | None:
    """Why the mma.sync register program leaves this kernel to the general path (its form is routed there), or
    None. Only on targets without wgmma (on sm_90a with ``tilecore.cuda.disable_wgmma`` the general path would take
    wgmma) and unless ``tilecore.cuda.register_programs`` is True."""
    if ctx.option("tilecore.cuda.register_programs", None) is True or ctx.capabilities.feature("wgmma"):
        return None
    forms = _mma_forms(ctx)
    how = f"{MMA_GENERAL_FORMS}; tilecore.cuda.register_programs=True forces the register program"
    if plan["gemms"] == 1:
        return f"its form (gemm) runs on the core's general path on this target ({how})" if "gemm" in forms else None
    shape = _attention_shape(plan)
    if "attention" in forms:
        what = "attention" if shape is None else f"attention, {shape[0]} rows, head dimension {shape[1]}"
        return f"its form ({what}) runs on the core's general path on this target ({how})"
    if shape is not None and "attention-measured" in forms and shape in MMA_ATTENTION_SHAPES \
            and not plan["p_in_block_memory"] and _general_fits(plan, ctx):
        return (f"its form (attention, {shape[0]} rows, head dimension {shape[1]}) runs on the core's general path on "
                "this target: there the general path with the late copy, D55's options and the lead copy measured "
                f"1.20-1.46x the register program with sm_80's block memory, {SM86_MEASURED} with sm_86's / sm_89's "
                f"(D71, D73, D79, D85; 64 rows at d256 with O's relay tile folded 1.21-1.55x with sm_80's, D82; {how})")
    return None


def _general_fits(plan, ctx) -> bool:
    """The route's block-memory rule (D85): the general path's least plan of this kernel (every shared tile once, the
    leading copies' stages: ``plan["general_min_bytes"]``) fits the target's block memory (``onchip_limit``: the
    capability profile's ``max_shared_bytes_per_block``). Where it does not, the general path could not keep the
    loop's stages (or the kernel at all) and the register program, which folds the output's relay tile, keeps it."""
    return plan["general_min_bytes"] <= onchip_limit(ctx)


def form_defaults(shape: tuple) -> dict:
    """The general path's defaults for FlashAttention's form at ``(block rows, head dimension)`` where the route sends
    it there (:data:`MMA_ATTENTION_DEFAULTS`, :data:`MMA_ATTENTION_ROWS_DEFAULTS` by the block's rows and
    :data:`MMA_ATTENTION_SHAPE_DEFAULTS` by the shape)."""
    return {**MMA_ATTENTION_DEFAULTS, **MMA_ATTENTION_ROWS_DEFAULTS.get(shape[0], {}),
            **MMA_ATTENTION_SHAPE_DEFAULTS.get(tuple(shape), {})}


def _route_notes(plan, ctx, name) -> tuple:
    """``(why, notes)``: why the route sends this kernel to the general path (None: the register program keeps
    it) and the notes saying so. Where FlashAttention's form goes, the form's defaults on the general path
    (:func:`form_defaults`) are set for the rest of the compile (those the config does not name)."""
    why = routed_to_general(plan, ctx)
    shape = _attention_shape(plan) if plan["gemms"] != 1 else None
    if why is None:
        if shape is not None and ctx.option("tilecore.cuda.register_programs", None) is not True \
                and not ctx.capabilities.feature("wgmma"):
            if "attention-measured" not in _mma_forms(ctx):
                why_not = f"{MMA_GENERAL_FORMS} names neither \"attention\" nor \"attention-measured\""
            elif shape in MMA_ATTENTION_SHAPES and plan["p_in_block_memory"]:
                why_not = ("the general path would keep P, the second gemm's A, in block memory: the first gemm's warp "
                           "groups split its columns (T.GemmWarpPolicy.FullRow keeps whole rows a warp); that form "
                           f"measured {P_SHARED_MEASURED} the register program: D85; {MMA_GENERAL_FORMS} with "
                           "\"attention\" routes it")
            elif shape in MMA_ATTENTION_SHAPES:
                why_not = (f"the general path needs at least {plan['general_min_bytes']} bytes of block memory for it "
                           f"(every shared tile once, the leading copies' stages), this target has "
                           f"{onchip_limit(ctx):.0f}: D85; {MMA_GENERAL_FORMS} with \"attention\" routes it")
            else:
                why_not = ("the route takes it to the general path only at rows x head dimension "
                           f"{', '.join(f'{r}x{d}' for r, d in MMA_ATTENTION_SHAPES)}: D71, D73; {MMA_GENERAL_FORMS} "
                           "with \"attention\" routes every shape")
            return None, [f"{name}: FlashAttention's form at {shape[0]} rows, head dimension {shape[1]} stays on the "
                          f"register program ({why_not})"]
        return None, []
    if shape is None:
        return why, [f"{name}: kernel not mapped to registers ({why})"]
    wanted = form_defaults(shape)
    taken = ctx.set_defaults(wanted)
    given = [k for k in wanted if k not in taken]
    defaults = ", ".join(f"{k}={v!r}" for k, v in taken.items()) or "none"
    return why, [f"{name}: kernel not mapped to registers ({why}); the form's defaults on the general path: "
                 f"{defaults}" + (f" (given by the pass config: {', '.join(given)})" if given else "")]


@tile_pass("cuda.route_shape_defaults")
def route_shape_defaults(func, ctx):
    """D82: the options of :data:`MMA_ATTENTION_SHAPE_DEFAULTS` that passes before the register program read (O's relay
    tile, folded in the ``layout`` slot), set as the compile's defaults before that slot where the route sends the
    kernel's FlashAttention form at that shape to the general path (the route decides again, and notes the form's
    defaults, in :func:`register_program`). Changes no IR."""
    if not MMA_ATTENTION_SHAPE_DEFAULTS or ctx.capabilities.feature("wgmma") \
            or not all(ctx.capabilities.feature(f) for f in ("mma_sync", "async_copy")) \
            or ctx.option("tilecore.cuda.register_programs", None) is False or ctx.option("tilecore.checked", False):
        return func
    for launch in collect(func.body, KernelLaunch):
        try:
            plan = _plan(launch, ctx, "mma")
        except _No:
            continue
        shape = _attention_shape(plan) if plan["gemms"] != 1 else None
        if shape is not None and tuple(shape) in MMA_ATTENTION_SHAPE_DEFAULTS and routed_to_general(plan, ctx):
            ctx.set_defaults(MMA_ATTENTION_SHAPE_DEFAULTS[tuple(shape)])
    return func


#: D86: the options only the retired WGMMA register program read (FA3's schedules and epilogue, D28-D45), each with
#: what it did; a compile that names one fails, naming D86 (none has an effect on the general path or the mma.sync
#: register program)
RETIRED_OPTIONS: dict = {
    "tilecore.cuda.pingpong": "consumer warpgroups taking turns on the tensor cores (D28, D52)",
    "tilecore.cuda.intra_wg_overlap": "the second gemm of iteration j-1 beside iteration j's softmax (D28)",
    "tilecore.cuda.softmax_beside_pv": "the softmax beside P @ V (D39)",
    "tilecore.cuda.producer_registers": "the producer warpgroup's setmaxnreg (D39)",
    "tilecore.cuda.rescale_under_qk": "O's rescale under the next Q K^T (D45)",
    "tilecore.cuda.attention_tma_store": "O through shared memory and TMA stores (D45)",
    "tilecore.cuda.attention_persistent": "a persistent grid of FlashAttention tiles (D45)",
}


def refuse_retired_options(ctx) -> None:
    """A :class:`CompileError` for the first option of :data:`RETIRED_OPTIONS` the compile's config gives."""
    for name, what in RETIRED_OPTIONS.items():
        if ctx.option(name, None) is not None:
            from tilecore.errors import CompileError

            raise CompileError(f"pass config {name}: {what} was an option of the WGMMA register program (sm_90a), "
                               f"retired in {RETIRED} (issue 11); FlashAttention runs on the core's general path, "
                               "whose own options (tilecore.warp_specialize, tilecore.bulk_store, "
                               "tilecore.pipeline_mask_unswitch, ...; docs/decisions.md D77-D86) do this work: drop "
                               f"{name} from the config")


@tile_pass("cuda.register_program")
def register_program(func, ctx):
    """The same kernels on mma.sync + cp.async targets (sm_80 / 86 / 89; on sm_90a only with
    ``tilecore.cuda.disable_wgmma``: the WGMMA register program's form goes to the general path there, D86):
    fragments in registers, every warp owning 16 rows, multi-stage cp.async copies into swizzled tiles."""
    refuse_retired_options(ctx)
    return rewrite_launches(func, ctx, _lower_as("mma"), features=("mma_sync", "async_copy"))


# -- the CUDA text ----------------------------------------------------------------------------------

class _Emit:
    """Writes the producer and consumer code of one register program into the emitter's lines."""

    def __init__(self, em, st, coll: Collective):
        self.em, self.st, self.p = em, st, coll.attrs["plan"]
        self.pipe = em.name(st, coll.args[0].buffer)
        self.row_vars = None        # ids of the variables that vary along a row, inside a 2-D T.Parallel nest

    def line(self, text: str):
        self.em.line(self.st, text)

    def block(self, head: str, fn):
        self.line(head + " {")
        self.st.indent += 1
        fn()
        self.st.indent -= 1
        self.line("}")

    # smem addresses
    def tile_addr(self, b, stage: str | None = "tc_s") -> str:
        """Shared address of ``b``'s tile; a staged tile's copy for ``stage`` (a C expression)."""
        p = self.p
        if b in p["staged"]:
            return f"(tc_base + {p['once_bytes'] + p['offset'][b]}u + (unsigned){stage} * {p['stage_bytes']}u)"
        return f"(tc_base + {p['offset'][b]}u)"

    def loop_var(self, loop: For):
        v = self.em.name(self.st, loop.var)
        self.line(f"const {self.em.vtype(loop.var.dtype)} {v} = ({self.em.vtype(loop.var.dtype)})"
                  f"({self.em.expr(self.st, loop.start)} + tc_it);")

    def finish_partials(self):
        """D39 (``tilecore.cuda.row_sum_per_thread``): the quad's parts of each per-thread row sum added up."""
        for L in sorted(set(self.p.get("partial_sums", {}).values()), key=lambda b: b.name):
            v = self.em.name(self.st, L)
            self.line("#pragma unroll")
            self.line(f"for (int tc_h = 0; tc_h < 2; ++tc_h) {{ {v}[tc_h] = ({v}[tc_h] + tc_shfl_xor({v}[tc_h], 1)); "
                      f"{v}[tc_h] = ({v}[tc_h] + tc_shfl_xor({v}[tc_h], 2)); }}")

    def consumer_setup(self, index: str):
        """Consumer ``index``'s rows (64 per warpgroup, 16 per warp) and its register fragments."""
        em, st = self.em, self.st
        # WGMMA: the consumer's index broadcast from lane 0 (as CUTLASS's canonical_warp_group_idx): ptxas then knows
        # it is the same for the warp and keeps what derives from it (the A tile's WGMMA descriptors) in uniform
        # registers, not rebuilt or moved each iteration (D35: 22-46 instructions an iteration; broadcasting
        # tc_wg instead gains 16 fewer). mma.sync has no descriptors: its index stays as it was
        self.line(f"const int tc_c = {index}, tc_t = threadIdx.x % 128, tc_l = tc_t % 32;")
        self.line("const int tc_row = tc_c * 64 + (tc_t / 32) * 16 + tc_l / 4;")
        self.line("const int tc_col = 2 * (tc_l % 4);")
        for b in self.p["frags"]:
            n = self.regs_of(b)
            self.line(f"float {em.name(st, b)}[{n}];")
            if self.p["frags"][b] == 2 and str(b.dtype) in _16BIT:
                self.line(f"unsigned {self.packed(b)}[{n // 2}];")

    def regs_of(self, b) -> int:
        return b.static_shape()[1] // 2 if self.p["frags"][b] == 2 else 2

    def rounded(self, b, text: str) -> str:
        conv = self.em.round_conv.get(str(b.dtype))
        return conv.format(text) if conv else text

    def cstmt(self, s):
        em, st = self.em, self.st
        if isinstance(s, Bind):
            em.stmt(st, s)
        elif isinstance(s, For):
            self.parallel(s)
        elif isinstance(s, TileOp):
            getattr(self, "c_" + s.op)(s)
        else:  # pragma: no cover - the analysis admitted nothing else
            raise AssertionError(type(s).__name__)

    def c_fill(self, s):
        b = s.args[0].buffer
        v = self.rounded(b, self.em.expr(self.st, s.args[1]))
        self.line("#pragma unroll")
        self.line(f"for (int tc_q = 0; tc_q < {self.regs_of(b)}; ++tc_q) {self.em.name(self.st, b)}[tc_q] = {v};")

    def c_copy(self, s):
        em, st = self.em, self.st
        src, dst = s.args
        if dst.buffer in self.p["shared"]:
            return  # the producer's TMA copy
        if dst.buffer in self.p["frags"]:
            if self.p.get("direct", {}).get(dst.buffer) is src.buffer:
                return  # packed from src at the gemm (tilecore.cuda.pack_direct): one rounding, there
            self.line("#pragma unroll")
            self.line(f"for (int tc_q = 0; tc_q < {self.regs_of(dst.buffer)}; ++tc_q) {em.name(st, dst.buffer)}[tc_q] = "
                      f"{self.rounded(dst.buffer, em.name(st, src.buffer) + '[tc_q]')};")
            return
        if self.p["frags"][src.buffer] == 1:
            return self.store_rows(s)
        # fragment -> global: rows tc_row (+ 8), columns tc_col + 8 j (+ 1), bounded by the tensor's edge
        g = dst.buffer
        nu = nonunit(dst.extents)
        rd, cd = nu
        n = src.buffer.static_shape()[1]
        t = em.stype(g.dtype)
        f = em.name(st, src.buffer)
        via = s.attrs.get("via")

        def body():
            self.line(f"{t}* tc_g = {em.name(st, g)} + {em.flat_index(st, g, dst.starts)};")
            self.line(f"const long long tc_ld = {em.expr(st, row_stride(g, rd))};")
            self.line(f"const long long tc_mv = {em.expr(st, simplify(binary('sub', g.shape[rd], dst.starts[rd])))};")
            self.line(f"const long long tc_nv = {em.expr(st, simplify(binary('sub', g.shape[cd], dst.starts[cd])))};")
            self.line(f"const bool tc_pairs = ((reinterpret_cast<unsigned long long>(tc_g) % {2 * g.dtype.bytes}) == 0) "
                      "&& (tc_ld % 2 == 0);")
            self.line("#pragma unroll")

            def jloop():
                self.line("#pragma unroll")

                def hloop():
                    self.line("const int tc_r = tc_row + 8 * tc_h, tc_cc = 8 * tc_j + tc_col;")
                    v0, v1 = f"{f}[4 * tc_j + 2 * tc_h]", f"{f}[4 * tc_j + 2 * tc_h + 1]"
                    if via and via != str(g.dtype):  # a folded shared tile's dtype in between (its rounding)
                        v0, v1 = (em.round_conv.get(via, "{}").format(v) for v in (v0, v1))
                    self.line(f"const float tc_v0 = {v0}, tc_v1 = {v1};")
                    self.line(f"{t}* tc_p = tc_g + (long long)tc_r * tc_ld + tc_cc;")
                    self.block("if (tc_r < tc_mv)", lambda: (
                        self.line(f"if (tc_pairs && tc_cc + 1 < tc_nv) tc_store2<{t}>(tc_p, tc_v0, tc_v1);"),
                        self.line(f"else {{ if (tc_cc < tc_nv) tc_store1<{t}>(tc_p, tc_v0); "
                                  f"if (tc_cc + 1 < tc_nv) tc_store1<{t}>(tc_p + 1, tc_v1); }}")))

                self.block("for (int tc_h = 0; tc_h < 2; ++tc_h)", hloop)

            self.block(f"for (int tc_j = 0; tc_j < {n // 8}; ++tc_j)", jloop)

        self.block("", body)  # a scope of its own

    def store_rows(self, s):
        """A 1-D fragment -> global: the thread's two rows (tc_row, + 8), written by the first lane of each quad
        (the four lanes of a quad hold the same row values), bounded by the tensor's edge."""
        em, st = self.em, self.st
        src, dst = s.args
        g = dst.buffer
        d = nonunit(dst.extents)[0]
        t = em.stype(g.dtype)

        def body():
            self.line(f"{t}* tc_g = {em.name(st, g)} + {em.flat_index(st, g, dst.starts)};")
            self.line(f"const long long tc_ld = {em.expr(st, row_stride(g, d))};")
            self.line(f"const long long tc_mv = {em.expr(st, simplify(binary('sub', g.shape[d], dst.starts[d])))};")
            self.line("#pragma unroll")
            self.line(f"for (int tc_h = 0; tc_h < 2; ++tc_h) if (tc_l % 4 == 0 && tc_row + 8 * tc_h < tc_mv) "
                      f"tc_store1<{t}>(tc_g + (long long)(tc_row + 8 * tc_h) * tc_ld, {em.name(st, src.buffer)}[tc_h]);")

        self.block("", body)

    def c_reduce(self, s):
        em, st = self.em, self.st
        src, dst = s.args[:2]
        ident, fast_op, exact_op = _REDUCE[s.attrs["kind"]]
        op = fast_op if getattr(st, "fast", False) else exact_op
        f, v = em.name(st, src.buffer), em.name(st, dst.buffer)
        n = src.buffer.static_shape()[1]

        chains = (_lean.reduce_chains(self.p.get("tree_reduce", False), n // 4) if s.attrs["kind"] in ("max", "min")
                  else 1)

        def body():
            if chains > 1:  # D39: k chains side by side, combined pairwise, then the identity: the chain's result,
                m, k = n // 4, chains  # bit for bit (max / min are exact and associative), depth m / k + log2 k
                val = f + "[4 * (tc_q / 2) + 2 * tc_h + tc_q % 2]"
                self.line(f"float tc_t[{k}];")
                self.line("#pragma unroll")
                self.line(f"for (int tc_q = 0; tc_q < {k}; ++tc_q) tc_t[tc_q] = {val};")
                self.line("#pragma unroll")
                self.line(f"for (int tc_q = {k}; tc_q < {m}; ++tc_q) "
                          f"tc_t[tc_q % {k}] = {op.format(a=f'tc_t[tc_q % {k}]', b=val)};")
                self.line("#pragma unroll")
                self.line(f"for (int tc_w = 1; tc_w < {k}; tc_w *= 2)")
                self.line("#pragma unroll")
                self.line(f"  for (int tc_q = 0; tc_q + tc_w < {k}; tc_q += 2 * tc_w) "
                          f"tc_t[tc_q] = {op.format(a='tc_t[tc_q]', b='tc_t[tc_q + tc_w]')};")
                self.line(f"float tc_r = {op.format(a=ident, b='tc_t[0]')};")
            else:
                self.line(f"float tc_r = {ident};")
                self.line("#pragma unroll")
                self.line(f"for (int tc_j = 0; tc_j < {n // 8}; ++tc_j) {{ "
                          f"tc_r = {op.format(a='tc_r', b=f + '[4 * tc_j + 2 * tc_h]')}; "
                          f"tc_r = {op.format(a='tc_r', b=f + '[4 * tc_j + 2 * tc_h + 1]')}; }}")
            if id(s) not in self.p.get("partial_sums", {}):  # D39: else this thread's part (added up after the loop)
                self.line(f"tc_r = {op.format(a='tc_r', b='tc_shfl_xor(tc_r, 1)')};")
                self.line(f"tc_r = {op.format(a='tc_r', b='tc_shfl_xor(tc_r, 2)')};")
            if s.attrs.get("clear", True):
                self.line(f"{v}[tc_h] = tc_r;")
            else:
                self.line(f"{v}[tc_h] = {op.format(a=v + '[tc_h]', b='tc_r')};")

        self.line("#pragma unroll")
        self.block("for (int tc_h = 0; tc_h < 2; ++tc_h)", body)

    def c_gemm(self, s):
        return self.c_gemm_mma(s)

    def packed(self, b) -> str:
        return f"tc_pa_{self.em.name(self.st, b)}"

    def pack_source(self, b) -> str:
        """The register array a 16-bit fragment is packed from: the float32 fragment its copy rounds, where
        ``tilecore.cuda.pack_direct`` found one (the rounding happens once, in the pack), else its own."""
        return self.em.name(self.st, self.p.get("direct", {}).get(b, b))


    # -- the masked-loop split (tilecore.cuda.split_masked_loop) --------------------------------------------
    def variant(self, unmasked: bool) -> list:
        """The loop body for the iterations with (``unmasked`` False) or without masks."""
        um = self.p.get("unmasked")
        return um["body"] if unmasked and um else self.p["body"]

    def loops(self, first: int, step, nit: str = "tc_nit") -> None:
        """The loop over iterations ``first ..`` of the trip count ``tc_nit``: one loop, or (the split) the
        iterations without masks (``tc_it < tc_nu``) then those with them. ``step(body)`` emits one iteration."""
        um = self.p.get("unmasked")
        if not um or um["all"]:
            body = self.variant(bool(um))
            self.block(f"for (int tc_it = {first}; tc_it < {nit}; ++tc_it)", lambda: step(body))
            return
        body = self.variant(True)
        self.block(f"for (int tc_it = {first}; tc_it < tc_nu; ++tc_it)", lambda: step(body))
        body = self.variant(False)
        start = f"max(tc_nu, {first})" if first else "tc_nu"
        self.block(f"for (int tc_it = {start}; tc_it < {nit}; ++tc_it)", lambda: step(body))
        self.variant(False)

    def split_count(self) -> None:
        """``tc_nu``: the iterations that run without masks (the split's block-level bound, clamped to 0..tc_nit)."""
        um = self.p.get("unmasked")
        if um and not um["all"]:
            self.line(f"const int tc_nu = (int)({self.em.expr(self.st, um['end'])});  "
                      "/* iterations without the masks */")

    def parallel(self, loop: For):
        em, st, p = self.em, self.st, self.p
        inner = loop.body
        while isinstance(inner, Seq) and len(inner.body) == 1:
            inner = inner.body[0]
        two = isinstance(inner, For) and inner.kind == "parallel"
        iv = em.name(st, loop.var)
        old = getattr(st, "regs", None)
        if two:
            jv = em.name(st, inner.var)
            cols = _s(inner.extent)
            body = inner.body

            # what varies along a row: the column variable and what the nest binds (tilecore.cuda.fold_softmax_scale)
            self.row_vars = {id(inner.var)} | {id(x.var) for x in _binds_in(body)}  # (the Var, not its name)

            def at_element():  # the element's indices and every fragment's register for it
                self.line(f"const int {iv} = tc_row + 8 * tc_h;")
                self.line(f"const int {jv} = 8 * tc_j + tc_col + tc_e;")
                st.regs = {id(b): (f"{em.name(st, b)}[4 * tc_j + 2 * tc_h + tc_e]" if d == 2 else f"{em.name(st, b)}[tc_h]")
                           for b, d in p["frags"].items()}

            def elem():
                at_element()
                self.body(body)

            def nest(each):
                self.line("#pragma unroll")
                self.block(f"for (int tc_j = 0; tc_j < {cols // 8}; ++tc_j)", lambda: (
                    self.line("#pragma unroll"),
                    self.block("for (int tc_h = 0; tc_h < 2; ++tc_h)", lambda: (
                        self.line("#pragma unroll"),
                        self.block("for (int tc_e = 0; tc_e < 2; ++tc_e)", each)))))

            fast = getattr(st, "fast", False)
            ex = _lean.exp2_store(body, p["frags"]) if p.get("exp2_check") and not fast else None
            rs = _lean.unit_rescale(body, p["frags"]) if p.get("skip_rescale") else None
            dv = _lean.row_division(body, p["frags"]) if p.get("row_division") and not fast else None
            src = self.exp2_source(ex[1]) if ex and p["exp2_check"] == "rows" else None
            if ex and src is not None:
                self.exp2_row_bound(ex, src, cols, nest, at_element, iv, getattr(self, "rows_mode", None))
            elif ex and p["exp2_check"] == "late":
                self.exp2_late(ex, cols, nest, at_element)
            elif not ex and p.get("exp2_poly") and _lean.exp2_store(body, p["frags"]):
                self.exp2_poly(_lean.exp2_store(body, p["frags"]), cols, nest, at_element)
            elif ex:
                self.exp2_checked(ex, cols, nest, at_element)
            elif dv:
                self.row_divide(dv, cols, nest, at_element)
            elif rs:
                r = em.name(st, rs[1])
                # x * 1 = x; decided for the warp (a uniform branch keeps ptxas's uniform registers)
                self.block(f"if (__any_sync(0xffffffffu, {r}[0] != 1.0f || {r}[1] != 1.0f))", lambda: nest(elem))
            else:
                nest(elem)
            self.row_vars = None
        else:
            def row():
                self.line(f"const int {iv} = tc_row + 8 * tc_h;")
                st.regs = {id(b): f"{em.name(st, b)}[tc_h]" for b, d in p["frags"].items() if d == 1}
                self.body(loop.body)

            self.line("#pragma unroll")
            self.block("for (int tc_h = 0; tc_h < 2; ++tc_h)", row)
        st.regs = old

    def exp2_source(self, arg):
        """The 2-D fragment ``X`` where ``arg`` is non-decreasing in the element ``X[i, j]`` it reads and every other
        leaf is the same along a row (``X[i, j] * c - r``, ``(X[i, j] - r) * c``, ``X[i, j] * c - r * c``, ``c`` a
        positive constant, ``r`` row values), else None (``tilecore.cuda.exp2_range_check="rows"``, D54)."""
        found = []

        def mono(e) -> bool:
            if isinstance(e, BufferLoad) and self.p["frags"].get(e.buffer) == 2:
                if found and found[0] is not e.buffer:
                    return False
                found.append(e.buffer)
                return True
            if isinstance(e, BinOp) and str(e.dtype) == "float32":
                if e.op == "add":
                    return (mono(e.a) and self.row_invariant(e.b)) or (self.row_invariant(e.a) and mono(e.b))
                if e.op == "sub":
                    return mono(e.a) and self.row_invariant(e.b)
                if e.op == "mul":
                    for x, c in ((e.a, e.b), (e.b, e.a)):
                        v = const_value(c)
                        if isinstance(v, float) and v > 0 and mono(x):
                            return True
            return False

        return found[0] if mono(arg) and found else None

    def reads_rows(self, e) -> bool:
        """Whether ``e`` reads a 1-D (row) fragment."""
        found = []
        walk_expr(e, lambda x: found.append(x) if isinstance(x, BufferLoad) and self.p["frags"].get(x.buffer) == 1
                  else None)
        return bool(found)

    def exp2_row_bound(self, ex, src, cols: int, nest, at_element, iv: str, kind=None) -> None:
        """``F[i, j] = T.exp2(arg)`` in the exact build with ``tilecore.cuda.exp2_range_check="rows"`` (D54): ``arg``
        is non-decreasing in ``X[i, j]`` (:meth:`exp2_source`), so the thread's smallest argument of row ``i`` is
        ``arg`` at the row's smallest ``X`` (the same operations, each rounded the same way: IEEE rounding is
        monotone): that minimum (four chains, fminf drops NaN) needs no row maximum. Where every row's bound of
        every lane of the warp is at least -126, ``ex2.approx.ftz`` alone (exp2f's lowering runs that same MUFU.EX2
        there, D35); otherwise ``exp2f`` as written. Where ``arg = X[i, j] * c -/+ r``, the products go into ``F``
        first (they need no row maximum: ptxas computes them while it is reduced, as without the check).

        ``kind``: None, all of it with the branch around the nest; ``"check"``, the products, minima and ``tc_ok``
        only (:meth:`overlapped` then branches around the rest of the work before the next gemm); ``"fast"`` /
        ``"slow"``, the exponentials of one side of that branch."""
        em, st, p = self.em, self.st, self.p
        dst, arg = ex
        x = em.name(st, src)
        per = cols // 8  # 8-column groups a thread holds in a row (two values each)
        step = 2 if per % 2 == 0 else 1
        chains = [f"{x}[4 * {j} + 2 * tc_h + {e}]" for j in range(step) for e in range(2)]
        # arg = head -/+ tail with head X[i, j] * c (no row values): the products before the branch, where ptxas
        # computes them while the row maximum is reduced (as it does without the check), each branch the rest
        head, tail = None, None
        if isinstance(arg, BinOp) and arg.op in ("sub", "add"):
            for h, t in [(arg.a, arg.b)] + ([(arg.b, arg.a)] if arg.op == "add" else []):
                if self.exp2_source(h) is src and not self.reads_rows(h) and self.row_invariant(t):
                    head, tail = h, t
                    break

        def rest():
            if head is None:
                return em.expr(st, arg)
            f = st.regs[id(dst)]
            if head is arg.a:
                return f"({f} {'-' if arg.op == 'sub' else '+'} {em.expr(st, tail)})"
            return f"({em.expr(st, tail)} + {f})"

        def row_min():
            names = [f"tc_u{k}" for k in range(len(chains))]
            self.line(f"float {', '.join(f'{n} = {c}' for n, c in zip(names, chains))};")
            self.line("#pragma unroll")
            upd = " ".join(f"{n} = fminf({n}, {x}[4 * (tc_j + {k // 2}) + 2 * tc_h + {k % 2}]);"
                           for k, n in enumerate(names))
            self.line(f"for (int tc_j = {step}; tc_j < {per}; tc_j += {step}) {{ {upd} }}")
            red = names[0]
            for n in names[1:]:
                red = f"fminf({red}, {n})"
            self.line(f"tc_mn[tc_h] = {red};")

        def bound():
            self.line(f"const int {iv} = tc_row + 8 * tc_h;")
            old = st.regs
            st.regs = {id(b): ("tc_mn[tc_h]" if b is src else f"{em.name(st, b)}[tc_h]")
                       for b, d in p["frags"].items() if d == 1 or b is src}
            self.line(f"tc_ok = tc_ok && ({em.expr(st, arg)} >= -126.0f);")
            st.regs = old

        def head_elem():
            at_element()
            self.line(f"{st.regs[id(dst)]} = {em.expr(st, head)};")

        def fast_elem():
            at_element()
            self.line(f"{st.regs[id(dst)]} = tc_ex2_ftz({rest()});")

        def slow_elem():
            at_element()
            self.line(f"{st.regs[id(dst)]} = exp2f({rest()});")

        def check():
            self.line("float tc_mn[2];")
            self.line("#pragma unroll")
            self.block("for (int tc_h = 0; tc_h < 2; ++tc_h)", row_min)
            if head is not None:
                nest(head_elem)
            self.line("bool tc_ok = true;")
            self.line("#pragma unroll")
            self.block("for (int tc_h = 0; tc_h < 2; ++tc_h)", bound)

        if kind == "check":
            return check()
        if kind in ("fast", "slow"):
            return nest(fast_elem if kind == "fast" else slow_elem)

        def whole():
            check()
            # decided for the warp (a uniform branch keeps ptxas's uniform registers, D35)
            self.block("if (__all_sync(0xffffffffu, tc_ok))", lambda: nest(fast_elem))
            self.block("else", lambda: nest(slow_elem))

        self.block("", whole)

    def exp2_poly(self, ex, cols: int, nest, at_element) -> None:
        """``F[i, j] = T.exp2(arg)`` with ``tilecore.cuda.exp2_poly = n`` (D60, FA4's split of the exponentials
        between the units): in ``n`` of the ``cols / 8`` column groups of each row a thread holds (spread evenly),
        ``tc_ex2_poly`` (prelude/tc_ex2_poly.cuh: range reduction and a degree-6 polynomial on the FMA pipe, at
        most 0.95 ulp from 2^x over every argument the softmax can pass, subnormal results included: within
        ``exp2f``'s documented 2 ulp, not its bits); the others as written (``exp2f``, one MUFU.EX2 each). The
        group is a constant after unrolling (``tc_j``), so each element compiles to one of the two."""
        em, st = self.em, self.st
        dst, arg = ex
        per = cols // 8
        n = min(int(self.p["exp2_poly"]), per)

        def elem():
            at_element()
            a = em.expr(st, arg)
            self.line(f"{st.regs[id(dst)]} = ((tc_j * {n}) % {per} < {n}) ? tc_ex2_poly({a}) : exp2f({a});")

        nest(elem)

    def row_divide(self, dv, cols: int, nest, at_element) -> None:
        """``F[i, j] = F[i, j] / r[i]`` in the exact build with ``tilecore.cuda.row_division`` (D60): ``div.rn.f32``'s
        own fast path (``prelude/tc_div_row.cuh``: the reciprocal's MUFU.RCP and Newton step once a row, then three
        FFMA an element) where every element of the warp's rows and the row values lie in [2^-40, 2^40] in
        magnitude, a range in which that path's checks (FCHK) pass and its result is the correctly rounded quotient;
        else the division as written. ptxas emits each ``/`` as its own region (MUFU.RCP, FCHK, a branch to the
        slow path's CALL): 64 serialized divisions a thread, against 2 reciprocals and 64 independent FFMA chains."""
        em, st = self.em, self.st
        dst, row = dv
        f, r = em.name(st, dst), em.name(st, row)
        n = cols // 2

        def whole():
            self.line("float tc_dr[2];")
            self.line("bool tc_dk = true;")
            self.line("#pragma unroll")
            self.line(f"for (int tc_h = 0; tc_h < 2; ++tc_h) {{ tc_dr[tc_h] = tc_div_rcp({r}[tc_h]); "
                      f"tc_dk = tc_dk & tc_div_safe({r}[tc_h]); }}")
            self.line("#pragma unroll")
            self.line(f"for (int tc_q = 0; tc_q < {n}; ++tc_q) tc_dk = tc_dk & tc_div_safe({f}[tc_q]);")
            # decided for the warp (a uniform branch, D35); the element's row: (tc_q / 2) % 2 (4 tc_j + 2 tc_h + tc_e)
            self.block("if (__all_sync(0xffffffffu, tc_dk))", lambda: (
                self.line("#pragma unroll"),
                self.line(f"for (int tc_q = 0; tc_q < {n}; ++tc_q) {f}[tc_q] = "
                          f"tc_div_fast({f}[tc_q], {r}[(tc_q / 2) % 2], tc_dr[(tc_q / 2) % 2]);")))
            self.block("else", lambda: (
                self.line("#pragma unroll"),
                self.line(f"for (int tc_q = 0; tc_q < {n}; ++tc_q) {f}[tc_q] = ({f}[tc_q] / {r}[(tc_q / 2) % 2]);")))

        self.block("", whole)

    def exp2_late(self, ex, cols: int, nest, at_element) -> None:
        """``F[i, j] = T.exp2(arg)`` in the exact build with ``tilecore.cuda.exp2_range_check="late"`` (D60), in
        groups of ``4 * EXP2_LATE_GROUP`` elements a thread: each argument is kept (``tc_x``) and ``F`` gets
        ``ex2.approx.ftz`` of it at once, the MUFU.EX2 that ``exp2f``'s non-flushing lowering runs wherever the
        argument is not below -126; beside it one test an element (``arg < -126``: exactly where ``exp2f`` halves
        the argument and squares the result; NaN is not below). After the group, where any lane of the warp saw
        such an argument (other than -inf, where both give +0), the group's ``F`` is computed again from ``tc_x``
        with ``exp2f``: the same bits as ``exp2f`` everywhere, and no exponential waits for a minimum (D35's ``args`` and D54's ``rows`` put one
        before the first MUFU.EX2). Groups, not the whole nest: the kept arguments of all 64 elements cost ptxas
        registers it spilled (48 bytes a thread at 128 x 128). With ``tilecore.cuda.exp2_poly`` the polynomial's
        groups (:meth:`exp2_poly`) take ``tc_ex2_poly`` and no test."""
        em, st = self.em, self.st
        dst, arg = ex
        f = em.name(st, dst)
        per = cols // 8
        g = max(1, min(per, int(self.p.get("exp2_late_group", _lean.EXP2_LATE_GROUP))))
        while per % g:
            g -= 1

        npoly = min(int(self.p.get("exp2_poly") or 0), per)  # with exp2_poly: those groups on the FMA pipe, untested

        def mufu(j: str) -> str:  # the element's group is not a polynomial one (a constant after unrolling)
            return f"((({j}) * {npoly}) % {per} >= {npoly})" if npoly else "true"

        def elem():
            at_element()
            reg = st.regs[id(dst)]
            x = "tc_x[4 * tc_jj + 2 * tc_h + tc_e]"
            self.line(f"{x} = {em.expr(st, arg)};")
            if npoly:
                self.line(f"tc_lo = tc_lo | ({mufu('tc_j')} && {x} < -126.0f);")
                self.line(f"{reg} = {mufu('tc_j')} ? tc_ex2_ftz({x}) : tc_ex2_poly({x});")
            else:
                self.line(f"tc_lo = tc_lo | ({x} < -126.0f);")
                self.line(f"{reg} = tc_ex2_ftz({x});")

        def group():
            self.line(f"float tc_x[{4 * g}];")
            self.line("bool tc_lo = false;")
            self.line("#pragma unroll")
            self.block(f"for (int tc_jj = 0; tc_jj < {g}; ++tc_jj)", lambda: (
                self.line("const int tc_j = tc_g + tc_jj;"),
                self.line("#pragma unroll"),
                self.block("for (int tc_h = 0; tc_h < 2; ++tc_h)", lambda: (
                    self.line("#pragma unroll"),
                    self.block("for (int tc_e = 0; tc_e < 2; ++tc_e)", elem)))))
            # decided for the warp (a uniform branch keeps ptxas's uniform registers, D35); -inf (a masked score)
            # passes the one test, but ex2.approx.ftz gives exp2f's +0 there: tested again inside, so that the
            # masked iterations redo only groups with a finite argument below -126
            self.block("if (__any_sync(0xffffffffu, tc_lo))", lambda: (
                self.line("tc_lo = false;"),
                self.line("#pragma unroll"),
                self.line(f"for (int tc_q = 0; tc_q < {4 * g}; ++tc_q) "
                          "tc_lo = tc_lo | ((tc_x[tc_q] < -126.0f) & (tc_x[tc_q] != -INFINITY)"
                          + (f" & {mufu('tc_g + tc_q / 4')}" if npoly else "") + ");"),
                self.block("if (__any_sync(0xffffffffu, tc_lo))", lambda: (
                    self.line("#pragma unroll"),
                    self.line(f"for (int tc_q = 0; tc_q < {4 * g}; ++tc_q) "
                              + (f"if {mufu('tc_g + tc_q / 4')} " if npoly else "")
                              + f"{f}[4 * tc_g + tc_q] = exp2f(tc_x[tc_q]);")))))

        self.line("#pragma unroll")
        self.block(f"for (int tc_g = 0; tc_g < {per}; tc_g += {g})", group)

    def exp2_checked(self, ex, cols: int, nest, at_element) -> None:
        """``F[i, j] = T.exp2(arg)`` in the exact build (``tilecore.cuda.exp2_range_check``): every argument into
        ``F`` first; then, where none of the thread's is below -126 (NaN aside), ``ex2.approx.ftz`` alone, which
        is the MUFU.EX2 that ``exp2f``'s non-flushing lowering runs for such arguments (it halves the argument
        and squares the result only below -126, for subnormal results); otherwise ``exp2f`` as written."""
        em, st = self.em, self.st
        dst, arg = ex
        f, n = em.name(st, dst), cols // 2

        def elem():
            at_element()
            self.line(f"{st.regs[id(dst)]} = {em.expr(st, arg)};")

        nest(elem)

        def check():  # the thread's smallest argument, four chains deep (fminf drops NaN)
            self.line(f"float tc_lo0 = {f}[0], tc_lo1 = {f}[1], tc_lo2 = {f}[2], tc_lo3 = {f}[3];")
            self.line("#pragma unroll")
            self.line(f"for (int tc_q = 4; tc_q < {n}; tc_q += 4) {{ tc_lo0 = fminf(tc_lo0, {f}[tc_q]); "
                      f"tc_lo1 = fminf(tc_lo1, {f}[tc_q + 1]); tc_lo2 = fminf(tc_lo2, {f}[tc_q + 2]); "
                      f"tc_lo3 = fminf(tc_lo3, {f}[tc_q + 3]); }}")
            # decided for the warp (a uniform branch: ptxas keeps the loop's uniform registers, which a
            # divergent one costs it, about 50 instructions an iteration)
            self.block("if (__all_sync(0xffffffffu, fminf(fminf(tc_lo0, tc_lo1), fminf(tc_lo2, tc_lo3)) >= -126.0f))", lambda: (
                self.line("#pragma unroll"),
                self.line(f"for (int tc_q = 0; tc_q < {n}; ++tc_q) {f}[tc_q] = tc_ex2_ftz({f}[tc_q]);")))
            self.block("else", lambda: (
                self.line("#pragma unroll"),
                self.line(f"for (int tc_q = 0; tc_q < {n}; ++tc_q) {f}[tc_q] = exp2f({f}[tc_q]);")))

        self.block("", check)

    def row_invariant(self, e) -> bool:
        """Whether ``e`` is the same for every element of a row: no 2-D fragment, nothing the column varies."""
        bad = []

        def chk(x):
            if isinstance(x, BufferLoad) and self.p["frags"].get(x.buffer) == 2 or \
                    isinstance(x, Var) and id(x) in self.row_vars:
                bad.append(x)

        walk_expr(e, chk)
        return not bad

    def body(self, s):
        em, st = self.em, self.st
        if isinstance(s, Seq):
            for x in s.body:
                self.body(x)
        elif isinstance(s, Store) and s.buffer in self.p["frags"]:
            ref = st.regs[id(s.buffer)]
            value = s.value
            if self.p.get("fold") and getattr(st, "fast", False) and self.row_vars is not None:
                value = _fold_exp(value, self.row_invariant)
            self.line(f"{ref} = {self.rounded(s.buffer, em.expr(st, value))};")
        else:
            em.stmt(st, s)


    # -- mma.sync + cp.async (no producer: every warp loads, then computes) ------------------------------
    def run(self):
        p = self.p
        S = p["stages"]
        em, st = self.em, self.st
        loop = p["loop"]
        n = f"(int)({em.expr(st, loop.extent)})"
        self.line("{")
        st.indent += 1
        self.line(f"const unsigned tc_base = (tc_smem_addr({self.pipe}) + 1023u) & ~1023u;")
        self.line("const int tc_wg = threadIdx.x / 128;")
        for x in p["pre"]:
            if isinstance(x, Bind):
                em.stmt(st, x)
        self.consumer_setup("tc_wg")
        # copies: the tiles loaded once, then stages 0 .. S-2, one cp.async group each
        for b in p["once"]:
            self.cp_async(b, None)
        self.line("tc_cp_async_commit();")
        for k in range(S - 1):
            self.block(f"if ({k} < {n})", lambda k=k: self.prefetch(loop, str(k)))
            self.line("tc_cp_async_commit();")
        for x in p["pre"]:
            if not isinstance(x, Bind):
                self.cstmt(x)

        def step(body):
            self.loop_var(loop)
            self.line(f"const int tc_s = tc_it % {S};")
            self.line(f"tc_cp_async_wait<{S - 2}>();")
            self.line("__syncthreads();  /* stage tc_s has landed; every warp is done with the stage refilled next */")
            self.block(f"if (tc_it + {S - 1} < {n})", lambda: self.prefetch(loop, f"tc_it + {S - 1}"))
            self.line("tc_cp_async_commit();")
            for x in body:
                self.cstmt(x)

        self.split_count()
        self.loops(0, step, n)
        self.line("tc_cp_async_wait<0>();")
        self.finish_partials()
        for x in p["post"]:
            self.cstmt(x)
        st.indent -= 1
        self.line("}")

    def prefetch(self, loop: For, it: str):
        """The staged tiles of iteration ``it`` (the loop variable re-declared in a scope of its own)."""
        v, t = self.em.name(self.st, loop.var), self.em.vtype(loop.var.dtype)
        self.line(f"const int tc_pit = {it};")
        self.line(f"const int tc_ps = tc_pit % {self.p['stages']};")
        self.line(f"const {t} {v} = ({t})({self.em.expr(self.st, loop.start)} + tc_pit);")
        for b in self.p["staged"]:
            self.cp_async(b, "tc_ps")

    def cp_async(self, b, stage):
        """16-byte cp.async copies of ``b``'s tile into its swizzled layout (:meth:`swizzled`: 128-byte rows, atoms
        of 64 16-bit columns, chunk ``c`` of row ``r`` at chunk ``c ^ (r % 8)``; or 64-byte rows); zero-filled past
        the tensor's edge."""
        em, st, p = self.em, self.st, self.p
        src = p["copies"][b].args[0]
        g = src.buffer
        info = p["shared"][b]
        rows, cols, es = info["rows"], info["cols"], info["esize"]
        cpr = cols * es // 16
        nu = nonunit(src.extents)
        cd = nu[-1]
        rd = nu[0] if len(nu) == 2 else None
        ok = []
        for d, (start, dim) in enumerate(zip(src.starts, g.shape)):
            if d not in (rd, cd):
                ok.append(f"(({em.expr(st, start)}) < ({em.expr(st, dim)}))")
        ld = row_stride(g, rd) if rd is not None else as_expr(1)
        addr = self.tile_addr(b, stage)
        t = em.stype(g.dtype)

        def body():
            self.line(f"const {t}* tc_src = {em.name(st, g)} + {em.flat_index(st, g, src.starts)};")
            self.line(f"const long long tc_ld = {em.expr(st, ld)};")
            rv = (em.expr(st, simplify(binary("sub", g.shape[rd], src.starts[rd]))) if rd is not None else "1")
            self.line(f"const long long tc_rv = {'(' + ' && '.join(ok) + ') ? ' if ok else ''}{rv}{' : 0' if ok else ''};")
            self.line(f"const long long tc_cv = {em.expr(st, simplify(binary('sub', g.shape[cd], src.starts[cd])))};")
            self.line(f"const unsigned tc_dst = {addr};")

            def chunk():
                self.line(f"const int tc_r = tc_q / {cpr}, tc_k = tc_q % {cpr};")
                self.line(f"const long long tc_left = tc_cv - (long long)tc_k * {16 // es};")
                self.line(f"const int tc_n = (tc_r < tc_rv && tc_left > 0) ? (int)(tc_left < {16 // es} ? tc_left : "
                          f"{16 // es}) * {es} : 0;")
                self.line(f"const unsigned tc_d = {self.swizzled('tc_dst', info, 'tc_r', 'tc_k')};")
                self.line(f"tc_cp_async16_raw(tc_d, tc_n ? (const void*)(tc_src + (long long)tc_r * tc_ld + tc_k * "
                          f"{16 // es}) : (const void*)tc_src, tc_n);")

            self.block(f"for (int tc_q = threadIdx.x; tc_q < {rows * cpr}; tc_q += {p['nc'] * 128})", chunk)

        self.block("", body)

    def ldsm_addr(self, b, row: str, chunk: str) -> str:
        """Shared address of 16-byte chunk ``chunk`` of row ``row`` in ``b``'s swizzled tile."""
        return f"({self.swizzled(self.tile_addr(b), self.p['shared'][b], f'({row})', f'({chunk})')})"

    @staticmethod
    def swizzled(base: str, info: dict, row: str, chunk: str) -> str:
        """``base`` plus the offset of 16-byte chunk ``chunk`` of row ``row`` in a swizzled tile: atoms of 128-byte
        rows, chunk ``c`` at ``c ^ (row % 8)`` (TMA's and WGMMA's 128-byte mode), or of 64-byte rows, chunk ``c``
        at ``c ^ (row / 2 % 4)`` (their 64-byte mode: the same address bits 4-5 xor 7-8)."""
        rows = info["rows"]
        if info["swz"] == 64:
            return (f"{base} + (unsigned)({chunk} / 4) * {rows * 64}u + (unsigned){row} * 64u + "
                    f"(unsigned)((({chunk} % 4) ^ ({row} / 2 % 4)) * 16)")
        return (f"{base} + (unsigned)({chunk} / 8) * {rows * 128}u + (unsigned){row} * 128u + "
                f"(unsigned)((({chunk} % 8) ^ ({row} % 8)) * 16)")

    def c_gemm_mma(self, s):
        em, st, p = self.em, self.st, self.p
        a, b, c = s.args
        tb = bool(s.attrs.get("transpose_B"))
        n = c.buffer.static_shape()[1]
        k = a.buffer.static_shape()[1]
        bf16 = "true" if str(b.buffer.dtype) == "bfloat16" else "false"
        cn = em.name(st, c.buffer)
        a_regs = a.buffer in p["frags"]
        if s.attrs.get("clear_accum"):
            self.line(f"for (int tc_q = 0; tc_q < {n // 2}; ++tc_q) {cn}[tc_q] = 0.0f;")
        if a_regs:
            f, pa = self.pack_source(a.buffer), self.packed(a.buffer)
            pack = "tc_pack_h2" if str(a.buffer.dtype) == "float16" else "tc_pack_bf2"
            self.line("#pragma unroll")
            self.line(f"for (int tc_q = 0; tc_q < {k // 4}; ++tc_q) {pa}[tc_q] = {pack}({f}[2 * tc_q], {f}[2 * tc_q + 1]);")

        def kstep():
            if a_regs:
                self.line(f"const unsigned* tc_a = {self.packed(a.buffer)} + 4 * tc_kk;")
            else:
                self.line("unsigned tc_a[4];")
                row = "(tc_c * 64 + (tc_t / 32) * 16 + (tc_l % 16))"
                self.line(f"tc_ldsm_x4_raw(tc_a, {self.ldsm_addr(a.buffer, row, '2 * tc_kk + tc_l / 16')});")

            def jpair():
                self.line("unsigned tc_b[4];")
                if tb:  # B is (N, K): rows of n, plain ldmatrix
                    row = "(16 * tc_jp + (tc_l / 16) * 8 + tc_l % 8)"
                    self.line(f"tc_ldsm_x4_raw(tc_b, {self.ldsm_addr(b.buffer, row, '2 * tc_kk + (tc_l / 8) % 2')});")
                else:   # B is (K, N): rows of k, transposing ldmatrix
                    row = "(16 * tc_kk + tc_l % 8 + 8 * ((tc_l / 8) % 2))"
                    self.line(f"tc_ldsm_x4_t_raw(tc_b, {self.ldsm_addr(b.buffer, row, '2 * tc_jp + tc_l / 16')});")
                self.line(f"tc_mma_16816<{bf16}>({cn} + 8 * tc_jp, tc_a, tc_b);")
                self.line(f"tc_mma_16816<{bf16}>({cn} + 8 * tc_jp + 4, tc_a, tc_b + 2);")

            self.line("#pragma unroll")
            self.block(f"for (int tc_jp = 0; tc_jp < {n // 16}; ++tc_jp)", jpair)

        self.line("#pragma unroll")
        self.block(f"for (int tc_kk = 0; tc_kk < {k // 16}; ++tc_kk)", kstep)


def emit_register_program(em, st, coll: Collective) -> None:
    _Emit(em, st, coll).run()
