"""WGSL for WebGPU: one ``@compute`` entry per kernel, from the core's shading-language emitter.

The kernel arrives distributed over its threads by ``tilecore.simt_distribute``: the launch body
starts with the block's allocations, which become ``var<workgroup>`` arrays (shared, fragment and
local buffers alike: every thread of the block sees them), parallel loops are strided over
``local_invocation_index`` and barriers are ``workgroupBarrier()``. The workgroup is one-dimensional
with ``prod(threads)`` invocations.

Module layout:

- ``@binding(0)``: a uniform buffer of 32-bit words: the ABI integers (as ``i32``), the ABI floats
  (as ``f32``) and the grid extents (filled by the host);
- ``@binding(1 + k)``: tensor ``k`` as ``var<storage, read_write> array<T>`` (``atomic<T>`` when the
  kernel updates it atomically).

The grid of any rank is linearized: the host dispatches ``ceil(blocks / 65535)`` rows of at most
65535 workgroups (the per-dimension limit), the shader rebuilds the linear block id, returns for the
padding workgroups and splits the id back into ``bx, by, ...`` with the grid extents.

Two block-wide operations from the intrinsic table (``tilecore_webgpu.intrinsics``) arrive as
:class:`~tilecore.ir.Collective` statements and are printed inline: ``webgpu.subgroup_reduce`` (the
entry then takes the subgroup builtins and the module a ``tc_red_<type>`` workgroup scratch) and
``webgpu.tiled_gemm`` (a register-blocked loop nest, built as IR and printed by the ordinary walk).

``Source.meta`` carries what the runtime needs without the IR: each tensor's dtype, element size and
shape (Python expressions over the ABI integers ``ints[k]``), whether the kernel writes it, the grid
expressions, the workgroup size and the number of uniform words.
"""
from __future__ import annotations

import math
import re

from tilecore.codegen import EmitState, abi_of, host_expr, single_launch
from tilecore.codegen.shaderlang import ShaderLangEmitter
from tilecore.errors import MAX_FAULT_VALUES, CompileError, UnsupportedFeatureError
from tilecore.ir import (Allocate, Atomic, Bind, Buffer, BufferLoad, For, If, KernelLaunch, Seq, ShuffleWidth,
                         ShuffleXor, Store, ThreadIndex, Var, as_expr, binary, cast, collect, compare, const,
                         const_value, is_float, simplify)
from tilecore.plugin import Source

from .intrinsics import REDUCE_SCRATCH_WORDS, block_shape

ENTRY = "tc_kernel"
#: the fault buffer (bound after the tensors when the kernel has assertions): word 0 is the code of the
#: first failed assertion (0: none), then the values it recorded
FAULT = "tc_fault"
#: the entry's extra parameters when the kernel uses subgroup operations. wgpu's shader compiler
#: takes them under the device feature and rejects the ``enable subgroups;`` directive, so none is written
SUBGROUP_BUILTINS = (", @builtin(subgroup_invocation_id) tc_sg_lane: u32, @builtin(subgroup_size) tc_sg_size: u32, "
                     "@builtin(subgroup_id) tc_sg_id: u32, @builtin(num_subgroups) tc_sg_n: u32")
#: the pass config that caps the width fragments' row reductions shuffle across (a power of two; 1 keeps
#: every reduction in workgroup memory at run time, with the same generated code)
MAX_SHUFFLE_WIDTH = "tilecore.webgpu.max_shuffle_width"
_SUBGROUP_OP = {"sum": "subgroupAdd", "abssum": "subgroupAdd", "max": "subgroupMax", "absmax": "subgroupMax",
                "min": "subgroupMin"}


class WebGPUEmitter(ShaderLangEmitter):
    lang = "wgsl"
    #: register exchanges of fragments' row reductions (the core's ShuffleXor, under ``mask < ShuffleWidth()``)
    shuffle_xor = "subgroupShuffleXor({0}, {1}u)"
    shuffle_width_expr = "tc_sgw"

    def emit(self, func, ctx) -> Source:
        st = EmitState()
        st.fast = bool(ctx.option("tilecore.fast_math", False))
        st.ctx = ctx
        abi = abi_of(func)
        self.find_atomic_buffers(st, func.body)
        caps = ctx.capabilities
        target = str(ctx.target)
        nbuf = len(abi.buffers)
        lim = caps.limit("max_storage_buffers_per_stage")
        if lim is not None and nbuf > lim[0]:
            raise UnsupportedFeatureError(
                f"kernel {func.name} takes {nbuf} tensors; WebGPU binds each as a storage buffer and target "
                f"{target} allows {int(lim[0])} per shader stage (limit max_storage_buffers_per_stage). Pass "
                "fewer tensors (e.g. pack several into one)", func.span,
                feature="limit:max_storage_buffers_per_stage", target=target)
        launch, top = single_launch(func)
        written = {id(s.buffer.base or s.buffer) for s in collect(func.body, Store) + collect(func.body, Atomic)}
        ints = list(abi.ints)
        grid = list(launch.grid)
        n_words = len(abi.ints) + len(abi.floats) + len(grid)
        st.grid_slot = len(abi.ints) + len(abi.floats)
        vec4s = max(1, -(-n_words // 4))
        # the body first (it names things and collects helpers), then the module around it
        st.indent = 1
        for k, v in enumerate(abi.ints):
            self.line(st, f"let {self.name(st, v)}: {self.vtype(v.dtype)} = {self._word(k, v.dtype)};")
        for k, v in enumerate(abi.floats):
            self.line(st, f"let {self.name(st, v)}: {self.vtype(v.dtype)} = "
                          f"{self._word(len(abi.ints) + k, 'float32')};")
        st.workgroup = []
        st.subgroups = False
        st.scratch = {}
        st.collectives = 0
        st.shuffles = False
        for s in top:
            self.stmt(st, s)
        body = "\n".join(st.lines)
        entry = ["  let tc_tid: i32 = i32(tc_lidx);"]
        if st.shuffles:
            st.subgroups = True
            entry = self._subgroup_numbering(st, func.span)
        for t, words in sorted(st.scratch.items()):
            st.workgroup.append(f"var<workgroup> tc_red_{t}: array<{t}, {words}>;")
            st.workgroup_bytes += 4 * words
        if st.scratch:  # the subgroup reductions' scratch, which the IR (and so memory planning) does not see
            self._check_workgroup_bytes(st, st.workgroup_bytes, func.span)
        decls = []
        for k, p in enumerate(abi.buffers):
            decls.append(f"@group(0) @binding({k + 1}) var<storage, read_write> {self.name(st, p.buffer)}: "
                         f"array<{self.element_type(st, p.buffer)}>;")
        if st.asserts:
            decls.append(f"@group(0) @binding({nbuf + 1}) var<storage, read_write> {FAULT}: "
                         f"array<atomic<i32>, {1 + MAX_FAULT_VALUES}>;")
        uses_f16 = bool(re.search(r"\bf16\b", "\n".join([body, *decls, *st.workgroup])))
        header = [f"// generated by tilecore-webgpu for kernel {func.name}"]
        if uses_f16:
            header.append("enable f16;")
        header.append(f"struct TcArgs {{ w: array<vec4<u32>, {vec4s}> }}")
        header.append("@group(0) @binding(0) var<uniform> tc_args: TcArgs;")
        code = "\n".join(header + decls + st.workgroup + [self.prelude(st)] + [
            f"@compute @workgroup_size({st.threads})",
            f"fn {ENTRY}(@builtin(workgroup_id) tc_wid: vec3<u32>, @builtin(num_workgroups) tc_nwg: vec3<u32>, "
            "@builtin(local_invocation_index) tc_lidx: u32" + (SUBGROUP_BUILTINS if st.subgroups else "") + ") {",
            *entry, body, "}", ""])
        meta = {
            "buffers": [{"name": p.name, "dtype": str(p.buffer.dtype), "itemsize": p.buffer.dtype.bytes,
                         "shape": [host_expr(d, ints) for d in p.buffer.shape],
                         "written": id(p.buffer) in written} for p in abi.buffers],
            "grid": [host_expr(g, ints) for g in grid],
            "threads": st.threads, "nints": len(abi.ints), "nfloats": len(abi.floats), "arg_words": 4 * vec4s,
            "workgroup_bytes": st.workgroup_bytes, "f16": uses_f16, "asserts": list(st.asserts),
            "max_workgroups_per_dimension": int((caps.limit("max_workgroups_per_dimension") or (65535,))[0]),
        }
        return Source(code, "wgsl", ENTRY, meta)

    def expr(self, st: EmitState, e) -> str:
        if isinstance(e, (ShuffleWidth, ShuffleXor)):
            st.shuffles = True
        return super().expr(st, e)

    def _subgroup_numbering(self, st: EmitState, span) -> list:
        """The entry's first lines where fragments' row reductions shuffle (``ShuffleWidth``/``ShuffleXor``).

        The core's ShuffleXor pairs threads by ``ThreadIndex() ^ mask`` inside aligned groups of
        ``ShuffleWidth()``; WGSL promises neither a subgroup size nor that subgroups follow
        ``local_invocation_index``. So the workgroup votes (a workgroup atomic cleared by invocation 0, a
        barrier, ``atomicMax`` of each invocation's size or a "no" mark, a barrier, invocation 0 copies the
        result to a plain variable, whose ``workgroupUniformLoad`` makes it uniform for the barriers that
        branch on it; WGSL's atomic overload of ``workgroupUniformLoad`` is newer than some compilers): where
        every invocation sees ``num_subgroups * subgroup_size`` equal to the workgroup size and a
        power-of-two size (so every subgroup is full and the same size), the thread index is renumbered
        ``subgroup_id * subgroup_size + subgroup_invocation_id`` (a permutation of the invocations) and
        ``tc_sgw`` is the subgroup size (capped by the ``tilecore.webgpu.max_shuffle_width`` pass config);
        otherwise ``tc_sgw`` is 1 and the reductions go through workgroup memory."""
        cap = st.ctx.option(MAX_SHUFFLE_WIDTH, 128)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1 or cap & (cap - 1):
            raise CompileError(f"pass config {MAX_SHUFFLE_WIDTH}={cap!r}: use a power of two (1 keeps fragments' "
                               "row reductions in workgroup memory)", span)
        st.workgroup += ["var<workgroup> tc_sg_vote: atomic<u32>;", "var<workgroup> tc_sg_width: u32;"]
        st.workgroup_bytes += 8
        self._check_workgroup_bytes(st, st.workgroup_bytes, span)
        full = f"tc_sg_n * tc_sg_size == {st.threads}u && (tc_sg_size & (tc_sg_size - 1u)) == 0u"
        return [
            "  // subgroups as the lockstep groups of fragments' row reductions: the workgroup agrees on their width",
            "  // (1 unless every subgroup is full and of one power-of-two size) and numbers its threads by them.",
            "  // The vote is cleared first: lavapipe was seen to leave an old value in workgroup memory",
            "  if (tc_lidx == 0u) { atomicStore(&tc_sg_vote, 0u); }",
            "  workgroupBarrier();",
            f"  atomicMax(&tc_sg_vote, select(0xffffffffu, tc_sg_size, {full}));",
            "  workgroupBarrier();",
            "  if (tc_lidx == 0u) { tc_sg_width = atomicLoad(&tc_sg_vote); }",
            "  let tc_sg_w: u32 = workgroupUniformLoad(&tc_sg_width);",
            "  let tc_sg_full: bool = tc_sg_w != 0xffffffffu;",
            f"  let tc_sgw: i32 = select(1i, min(i32(tc_sg_w), {cap}i), tc_sg_full);",
            "  let tc_tid: i32 = select(i32(tc_lidx), i32(tc_sg_id * tc_sg_size + tc_sg_lane), tc_sg_full);"]

    @staticmethod
    def _word(k: int, dtype) -> str:
        ref = f"tc_args.w[{k // 4}][{k % 4}]"
        if dtype == "uint32":
            return ref
        if dtype == "bool":
            return f"({ref} != 0u)"
        if is_float(dtype):
            return f"bitcast<f32>({ref})"
        return f"bitcast<i32>({ref})"

    # -- kernel launch ------------------------------------------------------------------------------
    def stmt_KernelLaunch(self, st: EmitState, s: KernelLaunch):
        target = str(st.ctx.target)
        threads = int(math.prod(int(t) for t in s.threads))
        lim = st.ctx.capabilities.limit("max_threads_per_block")
        if lim is not None and threads > lim[0]:
            raise UnsupportedFeatureError(f"T.Kernel(threads={tuple(s.threads)}) asks for {threads} invocations per "
                                          f"workgroup; target {target} allows {int(lim[0])}", s.span,
                                          feature="limit:max_threads_per_block", target=target)
        if "simt_threads" not in s.attrs:
            raise CompileError("internal: the kernel reached WebGPU codegen without tilecore.simt_distribute", s.span)
        st.threads = threads
        top = s.body.body if isinstance(s.body, Seq) else [s.body]
        # the linear block id; padding workgroups (the last row of a split grid) leave at once
        grid = list(s.grid)
        self.line(st, "let tc_block: i32 = i32(tc_wid.x + tc_nwg.x * (tc_wid.y + tc_nwg.y * tc_wid.z));")
        extents = [f"bitcast<i32>(tc_args.w[{(st.grid_slot + d) // 4}][{(st.grid_slot + d) % 4}])"
                   for d in range(len(grid))]
        total = " * ".join(extents) or "1"
        self.line(st, f"if (tc_block >= {total}) {{ return; }}")
        stride = []
        for d, v in enumerate(s.block_vars):
            q = f"(tc_block / ({' * '.join(stride)}))" if stride else "tc_block"
            val = f"({q} % {extents[d]})" if d < len(grid) - 1 else q
            self.line(st, f"let {self.name(st, v)}: {self.vtype(v.dtype)} = {val};")
            stride.append(extents[d])
        # block-local memory: workgroup arrays at module scope
        total_bytes = 0
        # register buffers (fragments in registers) are each invocation's own arrays, declared in place below
        for a in (x for x in top if isinstance(x, Allocate) and x.buffer.scope != "register"):
            n = const_value(simplify(a.buffer.numel()))
            if n is None:
                raise UnsupportedFeatureError(
                    f"{a.buffer.name}: block-local buffers with symbolic sizes are not supported by this backend",
                    a.span, feature="dynamic_shared_memory", target=target)
            st.workgroup.append(self.workgroup_decl(st, a.buffer, int(n)))
            total_bytes += (max(int(n), 1) * a.buffer.dtype.bytes + 15) // 16 * 16
        st.workgroup_bytes = total_bytes  # checked against the limit by tilecore.plan_memory
        for stmt in top:
            if not isinstance(stmt, Allocate) or stmt.buffer.scope == "register":
                self.stmt(st, stmt)

    def _check_workgroup_bytes(self, st: EmitState, total: int, span) -> None:
        target = str(st.ctx.target)
        lim = st.ctx.capabilities.limit("max_shared_bytes_per_block")
        if lim is not None and lim[1] == "max" and total > lim[0]:
            raise UnsupportedFeatureError(
                f"kernel needs {total} bytes of workgroup memory (shared, fragment and local buffers all live "
                f"there on this backend); target {target} allows {int(lim[0])} (limit max_shared_bytes_per_block)",
                span, feature="limit:max_shared_bytes_per_block", target=target)

    # -- assertions (checked mode): the first failure's code and values go to the fault buffer ----------
    def stmt_Assert(self, st: EmitState, s):
        code = self.record_assert(st, s)
        vals = " ".join(f"atomicStore(&{FAULT}[{k + 1}], i32({self.expr(st, v)}));" for k, v in enumerate(s.values))
        self.line(st, f"if (!({self.expr(st, s.cond)})) {{")
        self.line(st, f"  loop {{ let tc_r = atomicCompareExchangeWeak(&{FAULT}[0], 0i, {code}i); "
                      f"if (tc_r.exchanged) {{ {vals} break; }} if (tc_r.old_value != 0i) {{ break; }} }}")
        self.line(st, "}")

    # -- block-wide operations from the intrinsic table (tilecore_webgpu.intrinsics) -----------------
    def stmt_Collective(self, st: EmitState, s):
        st.collectives += 1
        if s.name == "webgpu.subgroup_reduce":
            return self._subgroup_reduce(st, s, st.collectives)
        if s.name == "webgpu.tiled_gemm":
            return self._tiled_gemm(st, s)
        return super().stmt_Collective(st, s)

    def _row_vars(self, st: EmitState, row: str, extents: list) -> list:
        """``let`` one variable per extent, splitting the flat ``row`` (row-major) back into indices."""
        vs = []
        for d, e in enumerate(extents):
            stride = math.prod(extents[d + 1:])
            v = Var("ri")
            q = f"({row} / {stride}i)" if stride > 1 else row
            self.line(st, f"let {self.name(st, v)}: i32 = {q} % {e}i;" if d else f"let {self.name(st, v)}: i32 = {q};")
            vs.append(v)
        return vs

    def _subgroup_reduce(self, st: EmitState, s, k: int) -> None:
        """Each subgroup reduces a strided part of one row (lanes without elements hold the identity,
        every lane calls the subgroup operation); the parts meet in ``tc_red_<type>`` and one
        invocation per row combines them in order with the destination's old value."""
        from tilecore.passes.lower_tile import _nonunit, _reduce_init, _region_index  # compile time only

        src, dst = s.args
        kind, dim, clear = s.attrs["kind"], s.attrs["dim"], s.attrs["clear"]
        dtype = dst.buffer.dtype
        vt = self.vtype(dtype)
        kept = [d for d in range(len(src.extents)) if d != dim and const_value(src.extents[d]) != 1]
        ddims = _nonunit(dst.extents)
        extents = [int(const_value(src.extents[d])) for d in kept]
        rows, length = math.prod(extents), int(const_value(src.extents[dim]))
        parts = max(1, min(st.threads // 4, REDUCE_SCRATCH_WORDS // rows))
        st.scratch[vt] = max(st.scratch.get(vt, 0), rows * parts)
        st.subgroups = True
        init = self.expr(st, _reduce_init(kind, dtype))

        def combine(a: str, x: str) -> str:
            if kind in ("abssum", "absmax") and x != "tc_part":
                x = f"abs({x})"
            return f"({a} + {x})" if kind in ("sum", "abssum") else f"{'max' if 'max' in kind else 'min'}({a}, {x})"

        np_, w, p, red = f"tc_np{k}", f"tc_w{k}", f"tc_p{k}", f"tc_red_{vt}"
        self.line(st, f"{{  // T.reduce_{kind} of {rows} row(s) of {length}: subgroups, then workgroup memory")
        st.indent += 1
        self.line(st, f"let {np_}: i32 = clamp(i32(tc_sg_n) / {rows}i, 1i, {parts}i);")
        self.line(st, f"for (var {w}: i32 = i32(tc_sg_id); {w} < {rows}i * {np_}; {w} = {w} + i32(tc_sg_n)) {{")
        st.indent += 1
        vs = self._row_vars(st, f"({w} / {np_})", extents)
        e = Var("re")
        idx = list(_region_index(src, vs, kept))
        idx[dim] = binary("add", idx[dim], e)
        x = self.expr(st, cast(dtype, BufferLoad(src.buffer, tuple(idx))))
        en = self.name(st, e)
        self.line(st, f"var {p}: {vt} = {init};")
        self.line(st, f"for (var {en}: i32 = ({w} % {np_}) * i32(tc_sg_size) + i32(tc_sg_lane); {en} < {length}i; "
                      f"{en} = {en} + {np_} * i32(tc_sg_size)) {{")
        self.line(st, f"  {p} = {combine(p, x)};")
        self.line(st, "}")
        self.line(st, f"let tc_s{k}: {vt} = {_SUBGROUP_OP[kind]}({p});")
        self.line(st, f"if (tc_sg_lane == 0u) {{ {red}[{w}] = tc_s{k}; }}")
        st.indent -= 1
        self.line(st, "}")
        self.line(st, "workgroupBarrier();")
        r = f"tc_r{k}"
        self.line(st, f"for (var {r}: i32 = tc_tid; {r} < {rows}i; {r} = {r} + {st.threads}i) {{")
        st.indent += 1
        vs = self._row_vars(st, r, extents)
        di = _region_index(dst, vs, ddims)
        acc = Var("acc", dtype)
        an = self.name(st, acc)
        self.line(st, f"var {an}: {vt} = {init if clear else self.expr(st, BufferLoad(dst.buffer, di))};")
        self.line(st, f"for (var tc_q{k}: i32 = 0i; tc_q{k} < {np_}; tc_q{k} = tc_q{k} + 1i) {{")
        self.line(st, f"  {an} = {combine(an, f'{red}[{r} * {np_} + tc_q{k}]').replace('abs(', '(')};")
        self.line(st, "}")
        self.stmt_Store(st, Store(dst.buffer, di, acc))
        st.indent -= 1
        self.line(st, "}")
        st.indent -= 1
        self.line(st, "}")

    def _tiled_gemm(self, st: EmitState, s) -> None:
        """Each invocation owns a ``tm x tn`` block of C in a private accumulator array and walks K once,
        reading tm values of A and tn of B from workgroup memory per step; per element the sum is
        ``c + a_k * b_k`` for ``k`` ascending, as in the generic lowering."""
        from tilecore.passes.lower_tile import matrix_index  # compile time only

        a, b, c = s.args
        ta, tb = s.attrs.get("transpose_A"), s.attrs.get("transpose_B")
        m, n = int(const_value(c.extents[-2])), int(const_value(c.extents[-1]))
        kdim = int(const_value(a.extents[-2] if ta else a.extents[-1]))
        acc_t = c.buffer.dtype
        tm, tn = block_shape(m, n, st.threads)
        nblocks, cols = (m // tm) * (n // tn), n // tn
        accb = Buffer("acc", (tm * tn,), acc_t, "local")
        it, idx, i0, j0, kk = Var("it"), Var("blk"), Var("gi0"), Var("gj0"), Var("gk")
        avs = [Var(f"ga{x}", acc_t) for x in range(tm)]
        bvs = [Var(f"gb{y}", acc_t) for y in range(tn)]
        cidx = [[matrix_index(c, binary("add", i0, x), binary("add", j0, y)) for y in range(tn)] for x in range(tm)]
        zero = const(0, acc_t)
        init = [Store(accb, (const(x * tn + y),), zero if s.attrs.get("clear_accum") else BufferLoad(c.buffer, cidx[x][y]))
                for x in range(tm) for y in range(tn)]
        step = [Bind(avs[x], cast(acc_t, BufferLoad(a.buffer, matrix_index(a, kk, binary("add", i0, x)) if ta
                                                    else matrix_index(a, binary("add", i0, x), kk))))
                for x in range(tm)]
        step += [Bind(bvs[y], cast(acc_t, BufferLoad(b.buffer, matrix_index(b, binary("add", j0, y), kk) if tb
                                                     else matrix_index(b, kk, binary("add", j0, y)))))
                 for y in range(tn)]
        step += [Store(accb, (const(x * tn + y),), binary("add", BufferLoad(accb, (const(x * tn + y),)),
                                                          binary("mul", avs[x], bvs[y])))
                 for x in range(tm) for y in range(tn)]
        out = [Store(c.buffer, cidx[x][y], BufferLoad(accb, (const(x * tn + y),))) for x in range(tm) for y in range(tn)]
        body = Seq([Bind(i0, binary("mul", binary("div", idx, cols), tm)),
                    Bind(j0, binary("mul", binary("sub", idx, binary("mul", binary("div", idx, cols), cols)), tn)),
                    Allocate(accb), *init, For(kk, as_expr(0), as_expr(kdim), "serial", Seq(step)), *out])
        if nblocks % st.threads:
            body = If(compare("lt", idx, nblocks), body)
        trips = -(-nblocks // st.threads)
        loop = For(it, as_expr(0), as_expr(trips), "serial",
                   Seq([Bind(idx, binary("add", binary("mul", it, st.threads), ThreadIndex())), body]))
        self.line(st, f"// T.gemm {m}x{n}x{kdim}: a {tm}x{tn} register block per invocation (tiled gemm)")
        self.stmt(st, loop)

