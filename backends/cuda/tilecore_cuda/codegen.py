"""CUDA C++ for NVIDIA GPUs: one ``extern "C" __global__`` function per kernel.

The kernel arrives distributed over its threads by ``tilecore.simt_distribute`` (this backend adds it
before codegen): the launch body starts with the block's allocations, which become ``__shared__``
arrays (dynamic shared memory above 48 KiB), parallel loops are strided over ``threadIdx.x`` and
barriers are ``__syncthreads()``. The block is launched one-dimensional with ``prod(threads)``
threads; the grid's first three dimensions map to ``blockIdx.x/y/z`` (more are flattened into x).

Parameters: one pointer per tensor, one ``long long`` per ABI integer, one ``double`` per ABI float,
then ``int* tc_status`` (the device-assertion status word). ``Source.meta`` carries the launch
geometry as small Python expressions over the ABI integers (``grid``), the flat thread count, the
dynamic shared-memory size and the assertion messages.
"""
from __future__ import annotations

import math
from importlib import resources

from tilecore.codegen import CFamilyEmitter, EmitState, abi_of, host_expr, single_launch
from tilecore.errors import CompileError, UnsupportedFeatureError
from tilecore.ir import (Allocate, Assert, BufferLoad, Collective, Expr, IntImm, KernelLaunch, MatrixOp, Region, Seq, collect,
                         const_value, simplify)
from tilecore.plugin import Source


ENTRY = "tc_kernel"
STATIC_SHARED_LIMIT = 48 * 1024


def prelude(hopper: bool = False) -> str:
    names = ["tc_cuda.cuh"] + (["tc_hopper.cuh"] if hopper else [])
    text = "".join(resources.files("tilecore_cuda").joinpath(f"prelude/{n}").read_text() for n in names)
    return text.replace("#pragma once\n", "")


class CUDAEmitter(CFamilyEmitter):
    lang = "cuda"
    index_type = "long long"
    storage_types = {
        "bool": "unsigned char", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
        "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
        "uint64": "unsigned long long", "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
        "float64": "double", "float8_e4m3": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2",
    }
    value_types = {**storage_types, "bool": "int", "float16": "float", "bfloat16": "float", "float8_e4m3": "float",
                   "float8_e5m2": "float"}
    load_conv = {"float16": "__half2float({})", "bfloat16": "__bfloat162float({})",
                 "float8_e4m3": "((float)({}))", "float8_e5m2": "((float)({}))"}
    store_conv = {"float16": "__float2half_rn({})", "bfloat16": "__float2bfloat16_rn({})",
                  "float8_e4m3": "__nv_fp8_e4m3((float)({}))", "float8_e5m2": "__nv_fp8_e5m2((float)({}))"}
    round_conv = {"float16": "tc_round_h({})", "bfloat16": "tc_round_bf({})",
                  "float8_e4m3": "((float)__nv_fp8_e4m3((float)({})))", "float8_e5m2": "((float)__nv_fp8_e5m2((float)({})))"}
    fast_math = {
        "exp": ("__expf({0})", "exp({0})"), "exp2": ("exp2f({0})", "exp2({0})"), "exp10": ("__exp10f({0})", "exp10({0})"),
        "log": ("__logf({0})", "log({0})"), "log2": ("__log2f({0})", "log2({0})"), "log10": ("__log10f({0})", "log10({0})"),
        "sin": ("__sinf({0})", "sin({0})"), "cos": ("__cosf({0})", "cos({0})"), "tan": ("__tanf({0})", "tan({0})"),
        "sqrt": ("sqrtf({0})", "sqrt({0})"), "rsqrt": ("rsqrtf({0})", "rsqrt({0})"),
        "tanh": ("tanhf({0})", "tanh({0})"), "sigmoid": ("(1.0f / (1.0f + __expf(-({0}))))", "(1.0 / (1.0 + exp(-({0}))))"),
    }
    thread_index_expr = "((int)threadIdx.x)"
    #: MatrixOp spellings of the units in units.py (prelude/tc_matrix.cuh)
    matrix_ops = {"mma_sync_m16n8k16": "tc_mma_16816_r(&{c}[{c_off}], &{a}[{a_off}], &{b}[{b_off}]);"}
    barrier_stmt = "__syncthreads();"
    reserved = CFamilyEmitter.reserved | frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize",
                                                    "new", "delete", "class", "template", "this", "namespace",
                                                    "operator", "private", "public", "protected", "virtual",
                                                    "friend", "true", "false", "typename", "using", "dim3"})

    def emit(self, func, ctx) -> Source:
        st = EmitState()
        st.fast = bool(ctx.option("tilecore.fast_math", False))
        st.ctx = ctx
        abi = abi_of(func)
        has_asserts = bool(collect(func.body, Assert))
        st.has_asserts = has_asserts
        if has_asserts:
            self.barrier_stmt = "if (__syncthreads_or(tc_fail)) return;"
        params = []
        for p in abi.buffers:
            t = self.stype(p.buffer.dtype)
            params.append(f"{t}* __restrict__ {self.name(st, p.buffer)}")
        for k, _v in enumerate(abi.ints):
            params.append(f"long long tc_i{k}")
        for k, _v in enumerate(abi.floats):
            params.append(f"double tc_f{k}")
        # Hopper pipelines: one tensor map (a __grid_constant__ parameter, built by the runtime) per TMA operand
        pipelines = [c for c in collect(func.body, Collective) if c.attrs.get("tensor_maps")]
        st.tmaps, tmap_meta = {}, []
        for c in pipelines:
            names = []
            for m in c.attrs["tensor_maps"]:
                idx = next(k for k, p in enumerate(abi.buffers) if p.buffer is (m["buffer"].base or m["buffer"]))
                name = f"tc_tmap{len(tmap_meta)}"
                shape = m["buffer"].shape
                tmap_meta.append({"arg": idx, "dtype": m["dtype"], "elem_bytes": m["elem_bytes"],
                                  "dims": [host_expr(simplify(d), list(abi.ints)) for d in reversed(shape)],
                                  "box": list(m["box"]), "swizzle": m["swizzle"]})
                params.append(f"const __grid_constant__ tc_tmap {name}")
                names.append(name)
            st.tmaps[id(c)] = names
        # register programs on mma.sync targets copy with 16-byte cp.async: their sources must be 16-byte aligned
        aligned = set()
        for c in collect(func.body, Collective):
            plan = c.attrs.get("plan")
            if plan and plan.get("mode") == "mma":
                for cp in plan["copies"].values():
                    aligned.add(next(k for k, p in enumerate(abi.buffers) if p.buffer is (cp.args[0].buffer.base or cp.args[0].buffer)))
        params.append("int* __restrict__ tc_status")
        st.indent = 1
        for k, v in enumerate(abi.ints):
            self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)})tc_i{k};")
        for k, v in enumerate(abi.floats):
            self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)})tc_f{k};")
        if has_asserts:
            self.line(st, "int tc_fail = 0;")
        launch, top = single_launch(func)
        st.launch_meta = {}
        st.swizzle = None
        for h in func.attrs.get("hints", ()):
            h = dict(h)
            if h.get("kind") == "use_swizzle" and h.get("enable", "True") not in ("False", "T.bool(0)", "0"):
                st.swizzle = (int(h.get("panel_size", 10)), h.get("order", "row"))
        for s in top:
            self.stmt(st, s)
        meta = dict(st.launch_meta)
        meta["grid"] = [host_expr(simplify(g), list(abi.ints)) for g in self._grid3(launch.grid)]
        meta["asserts"] = list(st.asserts)
        meta["arch"] = getattr(ctx.target, "arch", "")
        meta["tensor_maps"] = tmap_meta
        meta["aligned_args"] = sorted(aligned)
        body = "\n".join(st.lines)
        threads = meta["threads"]
        # one block per SM for warp-specialized kernels: setmaxnreg needs a register cap at entry
        bounds = f"{threads}, 1" if launch.attrs.get("warp_specialized") else f"{threads}"
        helpers = ""
        if pipelines:
            from .hopper import wgmma_wrappers

            helpers = wgmma_wrappers(pipelines)
        if collect(func.body, MatrixOp):
            helpers += resources.files("tilecore_cuda").joinpath("prelude/tc_matrix.cuh").read_text()
        code = (f"/* generated by tilecore-cuda for kernel {func.name} */\n{prelude(bool(pipelines))}\n{helpers}"
                f"extern \"C\" __global__ void __launch_bounds__({bounds}) {ENTRY}({', '.join(params)}) {{\n"
                f"{body}\n}}\n")
        return Source(code, "cuda", ENTRY, meta)

    @staticmethod
    def _grid3(grid):
        grid = list(grid)
        if len(grid) <= 3:
            return grid + [IntImm(1)] * (3 - len(grid))
        x = grid[0]
        for g in grid[1:len(grid) - 2]:
            x = x * g
        return [x, grid[-2], grid[-1]]

    def expr(self, st: EmitState, e) -> str:
        regs = getattr(st, "regs", None)
        if regs and isinstance(e, BufferLoad):
            ref = regs.get(id(e.buffer))
            if ref is not None:  # a fragment held in registers (cuda.hopper_register_program)
                return ref
        return super().expr(st, e)

    # -- kernel launch ------------------------------------------------------------------------------
    def stmt_KernelLaunch(self, st: EmitState, s: KernelLaunch):
        threads = int(math.prod(int(t) for t in s.threads))
        if threads > 1024:
            raise UnsupportedFeatureError(f"T.Kernel(threads={tuple(s.threads)}) asks for {threads} threads per "
                                          f"block; this target allows 1024", s.span,
                                          feature="limit:max_threads_per_block", target=str(st.ctx.target))
        if "simt_threads" not in s.attrs:
            raise CompileError("internal: the kernel reached CUDA codegen without tilecore.simt_distribute", s.span)
        top = s.body.body if isinstance(s.body, Seq) else [s.body]
        shared = [a for a in top if isinstance(a, Allocate)]
        # block indices
        grid = list(s.grid)
        bvars = list(s.block_vars)
        if len(grid) <= 3 and getattr(st, "swizzle", None) and len(grid) >= 2 and st.swizzle[0] > 0:
            # T.use_swizzle: consecutive blocks walk `panel` rows of blockIdx.y (order "row") or `panel`
            # columns of blockIdx.x (order "col") before moving on, so the tiles they share stay in L2
            panel, order = st.swizzle
            gx, gy = self.expr(st, grid[0]), self.expr(st, grid[1])
            fast, slow = ("x", "y") if order == "row" else ("y", "x")
            gf, gs = (gx, gy) if order == "row" else (gy, gx)
            self.line(st, f"const long long tc_gf = {gf}, tc_gs = {gs};")
            self.line(st, f"const long long tc_lin = (long long)blockIdx.{slow} * tc_gf + blockIdx.{fast};")
            self.line(st, f"const long long tc_pn = {panel}LL * tc_gf, tc_first = (tc_lin / tc_pn) * {panel}LL;")
            self.line(st, f"const long long tc_rows = tc_min(tc_gs - tc_first, {panel}LL);")
            self.line(st, f"const long long tc_b{fast} = (tc_lin % tc_pn) / tc_rows;")
            self.line(st, f"const long long tc_b{slow} = tc_first + (tc_lin % tc_pn) % tc_rows;")
            for v, axis in zip(bvars, "xyz"):
                src = f"tc_b{axis}" if axis in "xy" else f"blockIdx.{axis}"
                self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)}){src};")
        elif len(grid) <= 3:
            for v, axis in zip(bvars, "xyz"):
                self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)})blockIdx.{axis};")
        else:
            nx = len(grid) - 2
            self.line(st, "long long tc_bx = (long long)blockIdx.x;")
            for v, g in zip(bvars[:nx], grid[:nx]):
                self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = "
                              f"({self.vtype(v.dtype)})(tc_bx % (long long)({self.expr(st, g)}));")
                self.line(st, f"tc_bx /= (long long)({self.expr(st, g)});")
            for v, axis in zip(bvars[nx:], "yz"):
                self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)})blockIdx.{axis};")
        # block-local memory
        sizes = []
        for a in shared:
            n = const_value(simplify(a.buffer.numel()))
            if n is None:
                raise UnsupportedFeatureError(
                    f"{a.buffer.name}: block-local buffers with symbolic sizes are not supported by this backend yet",
                    a.span, feature="dynamic_block_buffers", target=str(st.ctx.target))
            sizes.append(max(int(n), 1) * a.buffer.dtype.bytes)
        total = sum((b + 15) // 16 * 16 for b in sizes)
        lim = st.ctx.capabilities.limit("max_shared_bytes_per_block")
        if lim is not None and lim[1] == "max" and total > lim[0]:
            raise UnsupportedFeatureError(
                f"kernel needs {total} bytes of block-local memory (shared, fragment and local buffers all live "
                f"in shared memory on this backend); target {st.ctx.target} allows {int(lim[0])}",
                s.span, feature="limit:max_shared_bytes_per_block", target=str(st.ctx.target))
        dynamic = total > STATIC_SHARED_LIMIT
        if dynamic:
            self.line(st, "extern __shared__ __align__(16) unsigned char tc_smem[];")
        off = 0
        for a, nbytes in zip(shared, sizes):
            b = a.buffer
            t = self.stype(b.dtype)
            if dynamic:
                self.line(st, f"{t}* __restrict__ {self.name(st, b)} = ({t}*)(tc_smem + {off});")
            else:
                n = max(int(const_value(simplify(b.numel()))), 1)
                self.line(st, f"__shared__ __align__(16) {t} {self.name(st, b)}[{n}];")
            off += (nbytes + 15) // 16 * 16
        st.launch_meta = {"threads": threads, "dynamic_shared_bytes": total if dynamic else 0,
                          "shared_bytes": total}
        for stmt in top:
            if isinstance(stmt, Allocate):
                continue
            self.stmt(st, stmt)

    # -- block-collective operations (tensor-core gemm, cp.async copies) -------------------------------
    def stmt_Collective(self, st, s: Collective):
        """``name<template...>(args...)`` from the prelude; every thread of the block runs it (the
        barriers around it come from ``tilecore.simt_distribute``). Regions pass the address of their
        first element, scalars pass by value as ``long long``."""
        from .intrinsics import COLLECTIVES

        if s.name == "tc_register_program":
            from .regprog import emit_register_program

            return emit_register_program(self, st, s)
        spell = COLLECTIVES.get(s.name)
        if spell is None:
            raise CompileError(f"internal: unknown block-wide operation {s.name}", s.span)
        if s.threads is None:
            raise CompileError(f"internal: {s.name} reached CUDA codegen without tilecore.simt_distribute", s.span)
        args = []
        for a in s.args:
            if isinstance(a, Region):
                args.append(f"({self.name(st, a.buffer)} + {self.flat_index(st, a.buffer, a.starts)})")
            elif isinstance(a, Expr):
                args.append(f"(long long)({self.expr(st, a)})")
            else:
                raise CompileError(f"internal: {s.name}: argument {a!r} has no CUDA spelling", s.span)
        args += [f"&{name}" for name in getattr(st, "tmaps", {}).get(id(s), [])]
        template = ", ".join(str(t) for t in spell(s))
        self.line(st, f"{s.name}<{template}>({', '.join(args)});")

    # -- debugging ------------------------------------------------------------------------------------
    def stmt_Print(self, st, s):
        self.emit_printf(st, s)

    def stmt_Assert(self, st, s):
        code = self.record_assert(st, s)
        fail = f"tc_set_status(tc_status, {code});"
        if s.values:  # a checked-mode bounds check: the first failure also records its indices (runtime.STATUS_WORDS)
            vals = " ".join(f"tc_v[{k}] = (long long)({self.expr(st, v)});" for k, v in enumerate(s.values))
            fail = (f"if (atomicCAS(tc_status, 0, {code}) == 0) {{ long long* tc_v = (long long*)(tc_status + 2); "
                    f"{vals} }}")
        self.line(st, f"if (!({self.expr(st, s.cond)})) {{ {fail} tc_fail = 1; }}")
