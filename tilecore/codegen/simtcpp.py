"""A SIMT C++ emitter: one kernel function per launch for C++ dialects that run a block of threads
(a grid of blocks, ``__shared__`` block memory, a block barrier, atomics), shared by every backend whose
device language has that shape.

The kernel arrives distributed over its threads by ``tilecore.simt_distribute``: the launch body starts
with the block's allocations, which become block-memory arrays (one dynamic carve-out above
:attr:`~SIMTCppEmitter.static_shared_limit`), parallel loops are strided over the flat thread index and
barriers are block barriers. The block is one-dimensional with ``prod(threads)`` threads; the grid's first
three dimensions map to the block index's x/y/z (more are flattened into x), with ``T.use_swizzle``
rasterization when asked.

Parameters: one pointer per tensor, one ``long long`` per ABI integer, one ``double`` per ABI float,
then ``int* tc_status`` (the device-assertion status word). ``Source.meta`` carries the launch geometry
as small Python expressions over the ABI integers (``grid``), the flat thread count, the block-memory
sizes and the assertion messages.

Everything a dialect spells differently is a class attribute below (the defaults are the spellings the
common dialect uses); a backend subclass sets its types and conversions (see :class:`CFamilyEmitter`),
:attr:`collectives` and the hooks marked as such.
"""
from __future__ import annotations

import math
from importlib import resources

from ..errors import CompileError, UnsupportedFeatureError
from ..ir import Allocate, Assert, Cast, Expr, IntImm, KernelLaunch, Region, Seq, collect, const_value, simplify
from ..plugin.api import Source
from .abi import abi_of, host_expr, single_launch
from .cfamily import CFamilyEmitter, EmitState


def reused_span(shared: list, sizes: list, offsets: list, names) -> tuple | None:
    """``(offset, bytes)`` of the block memory the buffers named ``names`` take together, where they lie one after
    another (the alignment padding between them included); None where one is missing or they lie apart."""
    found = sorted((offsets[i], sizes[i]) for i, a in enumerate(shared)
                   if a.buffer.name in names and offsets[i] is not None and not a.reuses)
    if not names or len(found) != len(set(names)):
        return None
    start, end = found[0][0], found[0][0] + found[0][1]
    for off, n in found[1:]:
        if off - end >= 1024:  # another buffer between them
            return None
        end = off + n
    return start, end - start


class SIMTCppEmitter(CFamilyEmitter):
    index_type = "long long"
    entry = "tc_kernel"
    # -- spellings ---------------------------------------------------------------------------------
    kernel_qualifier = 'extern "C" __global__'
    #: the launch-bounds attribute around the thread count (and the minimum blocks per multiprocessor)
    launch_bounds = "__launch_bounds__({})"
    restrict = "__restrict__"
    block_index = "blockIdx.{}"  # .format(axis), axis in "xyz"
    thread_index_expr = "((int)threadIdx.x)"
    barrier_stmt = "__syncthreads();"
    copy_in_storage_type = True
    shuffle_xor = "__shfl_xor_sync(0xffffffffu, {0}, {1}, {2})"
    shuffle_index = "__shfl_sync(0xffffffffu, {0}, {1}, {2})"
    #: a barrier of threads ``0 .. n-1`` only (``{n}``: the consumers of a warp-specialized block); None: none
    group_barrier_stmt = None
    #: a barrier after which every thread leaves if any failed a device assertion (``tc_fail``)
    barrier_or_exit_stmt = "if (__syncthreads_or(tc_fail)) return;"
    static_shared_decl = "__shared__ __align__({align}) {type} {name}[{n}];"
    dynamic_shared_decl = "extern __shared__ __align__({align}) unsigned char tc_smem[];"
    #: block memory above this many bytes is one dynamic carve-out (the launch passes its size)
    static_shared_limit = 48 * 1024
    max_threads_per_block = 1024
    #: compare-and-swap on the status word: (pointer, expected, new) -> the old value
    atomic_cas = "atomicCAS({0}, {1}, {2})"
    #: block-wide operations of the backend's device library: name -> f(Collective) -> template arguments
    collectives: dict = {}
    #: vector stores (:class:`~tilecore.ir.VectorStore`, ``tilecore.vectorize_stores``): ``tc_vst<V>(p, v)``
    #: writes the ``V`` (``tc_vecn<T, n>``, n elements of the storage type, or a packed pair type of
    #: :attr:`vector_pack`) at ``p`` as one access. These helpers are added to a kernel's source only where it
    #: stores vectors; a dialect without such an access sets :attr:`vector_stores` False (element stores).
    vector_stores = True
    vector_helpers = ("/* device-only: begin (vector stores, tilecore.vectorize_stores; the host emulators check "
                      "their alignment) */\n"
                      "template <typename T, int N> struct alignas(sizeof(T) * N) tc_vecn { T v[N]; };\n"
                      "template <typename V, typename T> __device__ __forceinline__ void tc_vst(T* p, const V& v) "
                      "{ *reinterpret_cast<V*>(p) = v; }\n"
                      "/* device-only: end */\n")
    #: ``tc_vld<V>(p)``: the ``V`` at ``p`` read as one access (a vector store whose values are one aligned run of
    #: a shared buffer, :attr:`~tilecore.ir.VectorStore.vector_load`); added only where a kernel uses it
    vector_load_helpers = ("/* device-only: begin (vector loads of shared -> global copies, tilecore.vectorize_stores; "
                           "the host emulators check their alignment) */\n"
                           "template <typename V, typename T> __device__ __forceinline__ V tc_vld(const T* p) "
                           "{ return *reinterpret_cast<const V*>(p); }\n"
                           "/* device-only: end */\n")
    #: packed conversions of a pair: dtype -> (the pair's type, format over two values in the value type,
    #: rounded to nearest even); used where a vector's values are computed (not copied in storage type)
    vector_pack: dict = {}
    reserved = CFamilyEmitter.reserved | frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize",
                                                    "new", "delete", "class", "template", "this", "namespace",
                                                    "operator", "private", "public", "protected", "virtual",
                                                    "friend", "true", "false", "typename", "using", "dim3"})

    @staticmethod
    def inline_prelude(text: str) -> str:
        """``text`` (a backend's prelude) with its ``#include "tc_simt.h"`` line replaced by the core's
        SIMT prelude (``tilecore/codegen/prelude/tc_simt.h``), so that the kernel source stands alone."""
        return text.replace('#include "tc_simt.h"\n', simt_prelude())

    def stmt_VectorStore(self, st, s):
        if not self.vector_stores:
            return super().stmt_VectorStore(st, s)
        st.vectors = True
        n, dt = s.lanes, str(s.buffer.dtype)
        ref = "&" + self.element(st, s.buffer, s.indices)
        pack = self.vector_pack.get(dt)
        raw = [self.raw_copy(st, s.buffer, v) if self.copy_in_storage_type else None for v in s.values]
        src = s.values[0]
        if s.vector_load and id(src.buffer) not in getattr(st, "shared_layouts", {}):
            # one read of the run (the pass proved it consecutive and aligned in a row-major shared buffer; a
            # buffer the launch stores through a swizzled layout keeps element reads)
            st.vector_loads = True
            vtype = f"tc_vecn<{self.stype(s.buffer.dtype)}, {n}>"
            self.line(st, f"tc_vst<{vtype}>({ref}, tc_vld<{vtype}>(&{self.element(st, src.buffer, src.indices)}));")
            return
        if pack is not None and n % 2 == 0 and all(r is None for r in raw):
            # a cast to the stored dtype is the pair conversion's own rounding (round to nearest even twice
            # is once): the conversion takes the value before the cast
            vals = [self.expr(st, v.value if isinstance(v, Cast) and str(v.dtype) == dt and
                              str(v.value.dtype) == "float32" else v) for v in s.values]
            pairs = [pack[1].format(vals[k], vals[k + 1]) for k in range(0, n, 2)]
            vtype = pack[0] if n == 2 else f"tc_vecn<{pack[0]}, {n // 2}>"
            value = pairs[0] if n == 2 else f"{vtype}{{{{{', '.join(pairs)}}}}}"
        else:
            vtype = f"tc_vecn<{self.stype(s.buffer.dtype)}, {n}>"
            value = f"{vtype}{{{{{', '.join(self.store_value(st, s.buffer, v) for v in s.values)}}}}}"
        self.line(st, f"tc_vst<{vtype}>({ref}, {value});")

    # -- hooks ---------------------------------------------------------------------------------------
    def preamble(self, st: EmitState, func) -> str:
        """Text before the kernel function (a header comment, the prelude, helper functions)."""
        return ""

    def extra_params(self, st: EmitState, func, abi) -> list:
        """Parameters after the ABI scalars and before ``tc_status``."""
        return []

    def extra_meta(self, st: EmitState, func, ctx, meta: dict) -> None:
        """Add the backend's own launch facts to ``meta``."""

    def min_blocks(self, st: EmitState, launch) -> int | None:
        """Blocks per multiprocessor for the launch-bounds attribute (None: only the thread count)."""
        return None

    # -- the kernel ----------------------------------------------------------------------------------
    def emit(self, func, ctx) -> Source:
        st = EmitState()
        st.fast = bool(ctx.option("tilecore.fast_math", False))
        st.ctx = ctx
        abi = abi_of(func)
        st.has_asserts = bool(collect(func.body, Assert))
        params = [f"{self.stype(p.buffer.dtype)}* {self.restrict} {self.name(st, p.buffer)}" for p in abi.buffers]
        params += [f"long long tc_i{k}" for k in range(len(abi.ints))]
        params += [f"double tc_f{k}" for k in range(len(abi.floats))]
        params += self.extra_params(st, func, abi)
        params.append(f"int* {self.restrict} tc_status")
        st.indent = 1
        for k, v in enumerate(abi.ints):
            self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)})tc_i{k};")
        for k, v in enumerate(abi.floats):
            self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)})tc_f{k};")
        if st.has_asserts:
            self.line(st, "int tc_fail = 0;")
        launch, top = single_launch(func)
        st.launch_meta = {}
        st.swizzle = _swizzle_hint(func)
        st.block_order = func.attrs.get("block_order")  # D54: tilecore.order_blocks (heaviest blocks first)
        for s in top:
            self.stmt(st, s)
        meta = dict(st.launch_meta)
        meta["grid"] = [host_expr(simplify(g), list(abi.ints)) for g in grid3(launch.grid)]
        meta["asserts"] = list(st.asserts)
        self.extra_meta(st, func, ctx, meta)
        threads, blocks = meta["threads"], self.min_blocks(st, launch)
        bounds = self.launch_bounds.format(f"{threads}" if blocks is None else f"{threads}, {blocks}")
        body = "\n".join(st.lines)
        helpers = self.vector_helpers if getattr(st, "vectors", False) else ""
        helpers += self.vector_load_helpers if getattr(st, "vector_loads", False) else ""
        code = (f"{self.preamble(st, func)}{helpers}{self.kernel_qualifier} void {bounds} {self.entry}({', '.join(params)}) {{\n"
                f"{body}\n}}\n")
        return Source(code, self.lang, self.entry, meta)

    def stmt_Barrier(self, st, s):
        self.line(st, self.barrier_text(st, s.threads))

    def barrier_text(self, st, threads: int = 0) -> str:
        """The statement of a barrier of the whole block, or of its first ``threads`` threads."""
        if threads:
            if self.group_barrier_stmt is None:
                raise CompileError(f"{type(self).__name__} has no barrier of a group of threads (a warp-specialized "
                                   "block's consumers)")
            return self.group_barrier_stmt.format(n=threads)
        return self.barrier_or_exit_stmt if getattr(st, "has_asserts", False) else self.barrier_stmt

    # -- warp-specialized blocks (tilecore.plan_pipelines: Specialized) -------------------------------------
    def stmt_Specialized(self, st, s):
        """``if (tid >= consumers) { producer's first thread runs it } else { consumers }``, with the
        backend's entry hooks (e.g. moving registers from the producer group to the consumers)."""
        tid = self.thread_index_expr
        self.line(st, f"if ({tid} >= {s.consumers}) {{")
        st.indent += 1
        self.producer_entry(st, s)
        self.line(st, f"if ({tid} == {s.consumers}) {{")
        st.indent += 1
        self.stmt(st, s.producer)
        st.indent -= 1
        self.line(st, "}")
        st.indent -= 1
        self.line(st, "} else {")
        st.indent += 1
        self.consumer_entry(st, s)
        outer, st.consumers = getattr(st, "consumers", 0), s.consumers
        self.stmt(st, s.consumer)
        st.consumers = outer
        st.indent -= 1
        self.line(st, "}")

    def producer_entry(self, st, s) -> None:
        """Hook: the producer group's first statements (every thread of the group runs them)."""

    def consumer_entry(self, st, s) -> None:
        """Hook: the consumers' first statements."""

    # -- kernel launch: block indices, block memory ----------------------------------------------------
    def stmt_KernelLaunch(self, st: EmitState, s: KernelLaunch):
        threads = int(math.prod(int(t) for t in s.threads))
        if threads > self.max_threads_per_block:
            raise UnsupportedFeatureError(f"T.Kernel(threads={tuple(s.threads)}) asks for {threads} threads per "
                                          f"block; this target allows {self.max_threads_per_block}", s.span,
                                          feature="limit:max_threads_per_block", target=str(st.ctx.target))
        if "simt_threads" not in s.attrs:
            raise CompileError("internal: the kernel reached codegen without tilecore.simt_distribute", s.span)
        top = s.body.body if isinstance(s.body, Seq) else [s.body]
        st.shared_layouts = {id(b): lay for b, lay in s.attrs.get("shared_layouts", ())}
        self.block_indices(st, s)
        # register buffers (fragments in registers) are each thread's own arrays, declared in place below
        block = [a for a in top if isinstance(a, Allocate) and a.buffer.scope != "register"]
        st.launch_meta = {"threads": threads, **self.block_memory(st, s, block)}
        if "persistent" in s.attrs:  # tilecore.persistent: the blocks it launches and the occupancy it assumed
            st.launch_meta["persistent"] = dict(s.attrs["persistent"])
        for stmt in top:
            if not isinstance(stmt, Allocate) or stmt.buffer.scope == "register":
                self.stmt(st, stmt)

    def block_indices(self, st: EmitState, s: KernelLaunch) -> None:
        """The block variables from the block index; ``T.use_swizzle`` rasterizes the first two."""
        grid, bvars = list(s.grid), list(s.block_vars)
        bidx = self.block_index.format
        if self.heaviest_first(st, s):  # D54: the block's linear index remapped, heaviest blocks first
            bidx = "tc_hf{}".format
        if len(grid) <= 3 and getattr(st, "swizzle", None) and len(grid) >= 2 and st.swizzle[0] > 0:
            # T.use_swizzle: consecutive blocks walk `panel` rows of the y index (order "row") or `panel`
            # columns of the x index (order "col") before moving on, so the tiles they share stay in cache
            panel, order = st.swizzle
            gx, gy = self.expr(st, grid[0]), self.expr(st, grid[1])
            fast, slow = ("x", "y") if order == "row" else ("y", "x")
            gf, gs = (gx, gy) if order == "row" else (gy, gx)
            self.line(st, f"const long long tc_gf = {gf}, tc_gs = {gs};")
            self.line(st, f"const long long tc_lin = (long long){bidx(slow)} * tc_gf + {bidx(fast)};")
            self.line(st, f"const long long tc_pn = {panel}LL * tc_gf, tc_first = (tc_lin / tc_pn) * {panel}LL;")
            self.line(st, f"const long long tc_rows = tc_min(tc_gs - tc_first, {panel}LL);")
            self.line(st, f"const long long tc_b{fast} = (tc_lin % tc_pn) / tc_rows;")
            self.line(st, f"const long long tc_b{slow} = tc_first + (tc_lin % tc_pn) % tc_rows;")
            for v, axis in zip(bvars, "xyz"):
                src = f"tc_b{axis}" if axis in "xy" else bidx(axis)
                self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)}){src};")
        elif len(grid) <= 3:
            for v, axis in zip(bvars, "xyz"):
                self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)}){bidx(axis)};")
        else:
            nx = len(grid) - 2
            self.line(st, f"long long tc_bx = (long long){bidx('x')};")
            for v, g in zip(bvars[:nx], grid[:nx]):
                self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = "
                              f"({self.vtype(v.dtype)})(tc_bx % (long long)({self.expr(st, g)}));")
                self.line(st, f"tc_bx /= (long long)({self.expr(st, g)});")
            for v, axis in zip(bvars[nx:], "yz"):
                self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)}){bidx(axis)};")

    def heaviest_first(self, st: EmitState, s: KernelLaunch) -> bool:
        """``tilecore.order_blocks``'s order (D54, ``tilecore/passes/blockorder.py``): where it applies to this launch
        (the grid it analyzed, no ``T.use_swizzle``), defines ``tc_hfx`` / ``tc_hfy`` / ``tc_hfz`` from the block index:
        the growing axis descending in sections of ``G`` rows of the other axes. Returns whether it did."""
        order = getattr(st, "block_order", None)
        if not order or getattr(st, "swizzle", None):
            return False
        axis, grid, g = order
        if len(s.grid) != len(grid) or [const_value(simplify(x)) for x in s.grid] != list(grid):
            return False  # (a launch rewritten since, e.g. tilecore.persistent's grid of resident blocks)
        bidx = self.block_index.format
        axes = "xyz"[:len(grid)]
        total = 1
        for n in grid:
            total *= n
        ty = "int" if total < 2 ** 31 else "long long"
        strides, m = [], 1
        for n in grid:
            strides.append(m)
            m *= n
        lin = " + ".join(f"({ty}){bidx(a)}" + (f" * {st_}" if st_ != 1 else "") for a, st_ in zip(axes, strides))
        ga, rows = grid[axis], total // grid[axis]
        g = min(int(g), rows)
        self.line(st, f"/* heaviest blocks first (D54): {axes[axis]} descending, sections of {g} of {rows} rows */")
        self.line(st, f"const {ty} tc_hfl = {lin};")
        if g == 1:
            self.line(st, f"const {ty} tc_hfw = tc_hfl % {ga}, tc_hfrow = tc_hfl / {ga};")
            self.line(st, f"const {ty} tc_hfa = {ga - 1} - tc_hfw;")
        else:
            self.line(st, f"const {ty} tc_hfs = tc_hfl / {g * ga}, tc_hfw = tc_hfl % {g * ga};")
            self.line(st, f"const {ty} tc_hfg = tc_min(({ty}){g}, ({ty})({rows} - tc_hfs * {g}));")
            self.line(st, f"const {ty} tc_hfa = {ga - 1} - tc_hfw / tc_hfg, tc_hfrow = tc_hfs * {g} + tc_hfw % tc_hfg;")
        rest = [(a, n) for i, (a, n) in enumerate(zip(axes, grid)) if i != axis]
        div = 1
        for k, (a, n) in enumerate(rest):
            q = "tc_hfrow" if div == 1 else f"(tc_hfrow / {div})"
            self.line(st, f"const {ty} tc_hf{a} = {q}" + (f" % {n}" if k < len(rest) - 1 else "") + ";")
            div *= n
        self.line(st, f"const {ty} tc_hf{axes[axis]} = tc_hfa;")
        return True

    def block_memory(self, st: EmitState, s: KernelLaunch, shared: list) -> dict:
        """Declare the block's buffers (16-byte aligned, or on the boundary their shared layout starts on:
        :attr:`~tilecore.layout.SharedLayout.align_bytes`; one dynamic carve-out when they are large);
        returns the launch facts ``dynamic_shared_bytes`` and ``shared_bytes``. The total was checked
        against the target's limit by the core's memory planning (``tilecore.plan_memory``)."""
        sizes, aligns = [], []
        layouts = getattr(st, "shared_layouts", {})
        for a in shared:
            n = const_value(simplify(a.buffer.numel()))
            if n is None:
                raise UnsupportedFeatureError(
                    f"{a.buffer.name}: block-local buffers with symbolic sizes are not supported by this backend yet",
                    a.span, feature="dynamic_block_buffers", target=str(st.ctx.target))
            sizes.append(max(int(n), 1) * a.buffer.dtype.bytes)
            lay = layouts.get(id(a.buffer))
            aligns.append(max(16, lay.align_bytes) if lay is not None else 16)
        offsets, total = [None] * len(shared), 0
        for i, (nbytes, align) in enumerate(zip(sizes, aligns)):
            if shared[i].reuses:
                continue
            total = (total + align - 1) // align * align
            offsets[i] = total
            total += (nbytes + 15) // 16 * 16  # checked against the limit by tilecore.plan_memory
        taken: dict = {}  # bytes of each reused span already given to buffers over it (one after another)
        for i, a in enumerate(shared):  # a buffer over others dead by the time it is written (Allocate.reuses, D75)
            if offsets[i] is not None:
                continue
            over = reused_span(shared, sizes, offsets, a.reuses)
            key = tuple(sorted(a.reuses))
            if over is not None:
                at = -(-(over[0] + taken.get(key, 0)) // aligns[i]) * aligns[i]
                if at + sizes[i] <= over[0] + over[1]:
                    offsets[i] = at
                    taken[key] = at + -(-sizes[i] // 16) * 16 - over[0]
                    continue
            total = (total + aligns[i] - 1) // aligns[i] * aligns[i]
            offsets[i] = total
            total += (sizes[i] + 15) // 16 * 16
        dynamic = total > self.static_shared_limit
        if dynamic:
            self.line(st, self.dynamic_shared_decl.format(align=max(aligns, default=16)))
        overlaid = {r for a in shared if a.reuses for r in a.reuses}
        for a, off, align in zip(shared, offsets, aligns):
            b = a.buffer
            t = self.stype(b.dtype)
            if dynamic:  # a buffer over others (and those under it) names memory another pointer names: no restrict
                alone = not a.reuses and b.name not in overlaid
                self.line(st, f"{t}*{' ' + self.restrict if alone else ''} {self.name(st, b)} = ({t}*)(tc_smem + {off});")
            else:
                n = max(int(const_value(simplify(b.numel()))), 1)
                self.line(st, self.static_shared_decl.format(type=t, name=self.name(st, b), n=n, align=align))
        return {"dynamic_shared_bytes": total if dynamic else 0, "shared_bytes": total}

    # -- block-collective operations ---------------------------------------------------------------------
    def stmt_Collective(self, st, s):
        """``name<template...>(args...)`` from the backend's device library (:attr:`collectives`); every
        thread of the block runs it (the barriers around it come from ``tilecore.simt_distribute``).
        Regions pass the address of their first element, scalars pass by value as ``long long``."""
        spell = self.collectives.get(s.name)
        if spell is None:
            raise CompileError(f"internal: unknown block-wide operation {s.name}", s.span)
        if s.threads is None:
            raise CompileError(f"internal: {s.name} reached codegen without tilecore.simt_distribute", s.span)
        args = []
        for a in s.args:
            if isinstance(a, Region):
                args.append(f"({self.name(st, a.buffer)} + {self.flat_index(st, a.buffer, a.starts)})")
            elif isinstance(a, Expr):
                args.append(f"(long long)({self.expr(st, a)})")
            else:
                raise CompileError(f"internal: {s.name}: argument {a!r} has no spelling in this target's code "
                                   "generator", s.span)
        args += self.collective_extra_args(st, s)
        template = ", ".join(str(t) for t in spell(s))
        self.line(st, f"{s.name}<{template}>({', '.join(args)});")

    def collective_extra_args(self, st, s) -> list:
        """Hook: arguments after a collective's own (e.g. descriptors passed as kernel parameters)."""
        return []

    # -- debugging ------------------------------------------------------------------------------------
    def stmt_Print(self, st, s):
        self.emit_printf(st, s)

    def stmt_Assert(self, st, s):
        code = self.record_assert(st, s)
        fail = f"tc_set_status(tc_status, {code});"
        if s.values:  # a checked-mode bounds check: the first failure also records its indices (status words)
            vals = " ".join(f"tc_v[{k}] = (long long)({self.expr(st, v)});" for k, v in enumerate(s.values))
            fail = (f"if ({self.atomic_cas.format('tc_status', 0, code)} == 0) {{ long long* tc_v = (long long*)"
                    f"(tc_status + 2); {vals} }}")
        self.line(st, f"if (!({self.expr(st, s.cond)})) {{ {fail} tc_fail = 1; }}")


def simt_prelude() -> str:
    """The core's SIMT C++ prelude, ``#pragma once`` dropped (it is inlined once per kernel source)."""
    return resources.files(__package__).joinpath("prelude/tc_simt.h").read_text().replace("#pragma once\n", "")


def grid3(grid) -> list:
    """The launch grid as three dimensions: shorter grids padded with 1, longer ones flattened into x."""
    grid = list(grid)
    if len(grid) <= 3:
        return grid + [IntImm(1)] * (3 - len(grid))
    x = grid[0]
    for g in grid[1:len(grid) - 2]:
        x = x * g
    return [x, grid[-2], grid[-1]]


def _swizzle_hint(func):
    """``(panel, order)`` of the last enabled ``T.use_swizzle`` hint, else None."""
    found = None
    for h in func.attrs.get("hints", ()):
        h = dict(h)
        if h.get("kind") == "use_swizzle" and h.get("enable", "True") not in ("False", "T.bool(0)", "0"):
            found = int(h.get("panel_size", 10)), h.get("order", "row")
    return found
