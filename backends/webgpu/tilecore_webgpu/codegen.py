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

``Source.meta`` carries what the runtime needs without the IR: each tensor's dtype, element size and
shape (Python expressions over the ABI integers ``ints[k]``), whether the kernel writes it, the grid
expressions, the workgroup size and the number of uniform words.
"""
from __future__ import annotations

import math
import re

from tilecore.codegen import EmitState, abi_of
from tilecore.codegen.shaderlang import ShaderLangEmitter
from tilecore.errors import CompileError, UnsupportedFeatureError
from tilecore.ir import (Allocate, Atomic, BinOp, Bind, Cast, IntImm, KernelLaunch, Seq, Store, Var, collect,
                         const_value, is_float, simplify)
from tilecore.plugin import Source

ENTRY = "tc_kernel"


def host_expr(e, ints: list) -> str:
    """A Python expression computing the integer ``e`` from the ABI integers (``ints[k]``)."""
    e = simplify(e)
    if isinstance(e, IntImm):
        return str(e.value)
    if isinstance(e, Var):
        for k, v in enumerate(ints):
            if v is e:
                return f"ints[{k}]"
        raise CompileError(f"{e.name} is needed at launch (a grid or tensor size) but is not a kernel argument")
    if isinstance(e, Cast) and not is_float(e.dtype) and not is_float(e.value.dtype):
        return host_expr(e.value, ints)
    if isinstance(e, BinOp) and not is_float(e.dtype):
        a, b = host_expr(e.a, ints), host_expr(e.b, ints)
        ops = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "floormod": "%", "shl": "<<", "shr": ">>",
               "bitand": "&", "bitor": "|", "xor": "^"}
        if e.op in ops:
            return f"({a} {ops[e.op]} {b})"
        if e.op in ("min", "max"):
            return f"{e.op}({a}, {b})"
        if e.op == "div":
            return f"int({a} / {b})"
    raise CompileError(f"the size {e!r} cannot be computed at launch by this backend")


class WebGPUEmitter(ShaderLangEmitter):
    lang = "wgsl"

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
        launches = collect(func.body, KernelLaunch)
        if len(launches) != 1:
            raise CompileError(f"kernel {func.name}: this backend needs exactly one T.Kernel per function, "
                               f"found {len(launches)}", func.span)
        launch = launches[0]
        written = {id(s.buffer) for s in collect(func.body, Store)} | {id(s.buffer) for s in collect(func.body, Atomic)}
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
        top = func.body.body if isinstance(func.body, Seq) else [func.body]
        st.workgroup = []
        for s in top:
            if isinstance(s, (KernelLaunch, Bind)):
                self.stmt(st, s)
            else:
                raise CompileError(f"kernel {func.name}: statements outside T.Kernel ({type(s).__name__}) are not "
                                   "supported by this backend", s.span)
        body = "\n".join(st.lines)
        decls = []
        for k, p in enumerate(abi.buffers):
            decls.append(f"@group(0) @binding({k + 1}) var<storage, read_write> {self.name(st, p.buffer)}: "
                         f"array<{self.element_type(st, p.buffer)}>;")
        uses_f16 = bool(re.search(r"\bf16\b", "\n".join([body, *decls, *st.workgroup])))
        header = [f"// generated by tilecore-webgpu for kernel {func.name}"]
        if uses_f16:
            header.append("enable f16;")
        header.append(f"struct TcArgs {{ w: array<vec4<u32>, {vec4s}> }}")
        header.append("@group(0) @binding(0) var<uniform> tc_args: TcArgs;")
        code = "\n".join(header + decls + st.workgroup + [self.prelude(st)] + [
            f"@compute @workgroup_size({st.threads})",
            f"fn {ENTRY}(@builtin(workgroup_id) tc_wid: vec3<u32>, @builtin(num_workgroups) tc_nwg: vec3<u32>, "
            "@builtin(local_invocation_index) tc_lidx: u32) {",
            "  let tc_tid: i32 = i32(tc_lidx);",
            body, "}", ""])
        meta = {
            "buffers": [{"name": p.name, "dtype": str(p.buffer.dtype), "itemsize": p.buffer.dtype.bytes,
                         "shape": [host_expr(d, ints) for d in p.buffer.shape],
                         "written": id(p.buffer) in written} for p in abi.buffers],
            "grid": [host_expr(g, ints) for g in grid],
            "threads": st.threads, "nints": len(abi.ints), "nfloats": len(abi.floats), "arg_words": 4 * vec4s,
            "workgroup_bytes": st.workgroup_bytes, "f16": uses_f16,
            "max_workgroups_per_dimension": int((caps.limit("max_workgroups_per_dimension") or (65535,))[0]),
        }
        return Source(code, "wgsl", ENTRY, meta)

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
        for a in (x for x in top if isinstance(x, Allocate)):
            n = const_value(simplify(a.buffer.numel()))
            if n is None:
                raise UnsupportedFeatureError(
                    f"{a.buffer.name}: block-local buffers with symbolic sizes are not supported by this backend",
                    a.span, feature="dynamic_shared_memory", target=target)
            st.workgroup.append(self.workgroup_decl(st, a.buffer, int(n)))
            total_bytes += (max(int(n), 1) * a.buffer.dtype.bytes + 15) // 16 * 16
        lim = st.ctx.capabilities.limit("max_shared_bytes_per_block")
        if lim is not None and lim[1] == "max" and total_bytes > lim[0]:
            raise UnsupportedFeatureError(
                f"kernel needs {total_bytes} bytes of workgroup memory (shared, fragment and local buffers all live "
                f"there on this backend); target {target} allows {int(lim[0])} (limit max_shared_bytes_per_block)",
                s.span, feature="limit:max_shared_bytes_per_block", target=target)
        st.workgroup_bytes = total_bytes
        for stmt in top:
            if not isinstance(stmt, Allocate):
                self.stmt(st, stmt)
