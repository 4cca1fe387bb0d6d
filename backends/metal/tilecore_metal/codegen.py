"""Metal Shading Language from the core's SIMT C++ emitter.

MSL is C++14 with address spaces and attributes, so everything structural (block indices, threadgroup
memory, distributed loops, barriers, register programs, assertions) is the core's
:class:`tilecore.codegen.SIMTCppEmitter`; this class is Metal's spellings as data plus the kernel
signature, which MSL writes as bindings instead of a C parameter list:

- ``[[kernel, max_total_threads_per_threadgroup(N)]] void tc_kernel(...)``, one ``device T* [[buffer(k)]]``
  per tensor in parameter order, then one ``constant long& [[buffer(k)]]`` per ABI integer and one
  ``constant float& [[buffer(k)]]`` per ABI float (Metal has no double), then the status word
  ``device int* tc_status [[buffer(k)]]``, then ``[[threadgroup_position_in_grid]]`` and
  ``[[thread_index_in_threadgroup]]``. ``Source.meta["bindings"]`` lists the indices in order, for the
  runtime and the binding lint (``tilecore_metal.lint``);
- block memory as kernel-scope ``threadgroup`` arrays (32 KiB on every Apple family: never a dynamic
  carve-out), ``threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup)``;
- ``simd_shuffle_xor`` for the core's register exchanges (row reductions of fragments in registers);
- ``T.gemm`` on ``simdgroup_matrix<T, 8, 8>`` through the ``tc_sg_gemm`` collective (``intrinsics.py``,
  prelude ``tc_metal.h``);
- numerics per decision D3: ``precise::`` math and safe compile options unless ``tilecore.fast_math``,
  then ``fast::`` math and ``fastMathEnabled`` (``Source.meta["fast_math"]``).
"""
from __future__ import annotations

from importlib import resources

from tilecore.codegen import EmitState, SIMTCppEmitter
from tilecore.codegen.abi import abi_of, host_expr, single_launch
from tilecore.codegen.simtcpp import _swizzle_hint, grid3
from tilecore.errors import CompileError, UnsupportedFeatureError
from tilecore.ir import (Assert, Atomic, BinOp, BufferLoad, Expr, Region, ShuffleXor, Store, collect, const_value,
                         simplify)
from tilecore.plugin.api import Source

ENTRY = "tc_kernel"
#: the MSL version the kernels need: 3.0 (atomic_float) everywhere, 3.1 where bfloat appears
MSL_VERSION = "3.0"
MSL_VERSION_BFLOAT = "3.1"


def prelude_text(name: str = "tc_metal.h") -> str:
    return resources.files("tilecore_metal").joinpath(f"prelude/{name}").read_text().replace("#pragma once\n", "")


def _precise(fn: str) -> tuple:
    return (f"precise::{fn}({{0}})", f"precise::{fn}({{0}})")


class MetalEmitter(SIMTCppEmitter):
    lang = "metal"
    entry = ENTRY
    #: no vector spelling yet (a device pointer cast per address space and the packed types are not written):
    #: tilecore.vectorize_stores' vectors are emitted as their element stores
    vector_stores = False
    index_type = "long"
    kernel_qualifier = "kernel"
    launch_bounds = "max_total_threads_per_threadgroup({})"
    restrict = ""
    block_index = "tc_bid.{}"
    thread_index_expr = "((int)tc_tid)"
    barrier_stmt = "threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);"
    barrier_or_exit_stmt = "if (tc_barrier_or(tc_fail, &tc_any_fail)) return;"
    shuffle_xor = "simd_shuffle_xor({0}, (ushort)({1}))"
    #: simd_shuffle names a lane of the whole 32-wide simdgroup: a narrower group keeps its own lanes' base
    shuffle_index = "simd_shuffle({0}, (ushort)((((int)tc_tid) & (32 - {2})) | ({1})))"
    static_shared_decl = "threadgroup {type} {name}[{n}];"
    dynamic_shared_decl = ""
    #: 32 KiB on every Apple family: block memory is always kernel-scope threadgroup arrays
    static_shared_limit = 1 << 40
    atomic_cas = "tc_cas_int({0}, {1}, {2})"
    storage_types = {
        "bool": "uchar", "int8": "char", "int16": "short", "int32": "int", "int64": "long", "uint8": "uchar",
        "uint16": "ushort", "uint32": "uint", "uint64": "ulong", "float16": "half", "bfloat16": "bfloat",
        "float32": "float",
    }
    value_types = {**storage_types, "bool": "int", "float16": "float", "bfloat16": "float"}
    load_conv = {"float16": "((float)({}))", "bfloat16": "((float)({}))"}
    store_conv = {"float16": "((half)({}))", "bfloat16": "((bfloat)({}))"}
    round_conv = {"float16": "((float)(half)({}))", "bfloat16": "((float)(bfloat)({}))"}
    float_suffix = {"float32": "f", "float16": "f", "bfloat16": "f", "float64": "f"}
    #: safe math (decision D3): the ``precise::`` functions; fast math swaps the namespace for ``fast::``
    math = {
        **{fn: _precise(fn) for fn in ("exp", "exp2", "exp10", "log", "log2", "log10", "sqrt", "rsqrt", "tanh",
                                        "sin", "cos", "tan")},
        "sigmoid": ("(1.0f / (1.0f + precise::exp(-({0}))))",) * 2,
        "erf": ("tc_erf({0})",) * 2,
        "floor": ("floor({0})",) * 2, "ceil": ("ceil({0})",) * 2, "round": ("rint({0})",) * 2,
        "trunc": ("trunc({0})",) * 2, "pow": ("precise::pow({0}, {1})",) * 2, "abs": ("fabs({0})",) * 2,
        "ieee_add": ("({0} + {1})",) * 2, "ieee_sub": ("({0} - {1})",) * 2, "ieee_mul": ("({0} * {1})",) * 2,
        "ieee_fdiv": ("precise::divide({0}, {1})",) * 2, "ieee_fmaf": ("fma({0}, {1}, {2})",) * 2,
        "ieee_frcp": ("precise::divide(1.0f, {0})",) * 2, "ieee_fsqrt": ("precise::sqrt({0})",) * 2,
        "ieee_frsqrt": ("precise::rsqrt({0})",) * 2,
    }
    fast_math = {fn: (f"fast::{fn}({{0}})",) * 2 for fn in ("exp", "exp2", "log", "log2", "rsqrt", "sin", "cos", "tan")}
    fast_math["sigmoid"] = ("(1.0f / (1.0f + fast::exp(-({0}))))",) * 2
    reserved = SIMTCppEmitter.reserved | frozenset({
        "kernel", "device", "threadgroup", "constant", "thread", "metal", "half", "bfloat", "uchar", "ushort",
        "uint", "ulong", "simd_sum", "simd_max", "precise", "fast", "vertex", "fragment", "sampler", "texture"})

    # -- numerics ----------------------------------------------------------------------------------
    def call(self, st, e):
        text = super().call(st, e)
        return text.replace("precise::", "fast::") if getattr(st, "fast", False) else text

    def int_lit(self, v: int, dtype) -> str:
        if dtype == "bool":
            return "1" if v else "0"
        return f"{v}L" if abs(v) >= 2**31 else (str(v) if v >= 0 else f"({v})")

    # -- the kernel ----------------------------------------------------------------------------------
    def emit(self, func, ctx) -> Source:
        st = EmitState()
        st.fast = bool(ctx.option("tilecore.fast_math", False))
        st.ctx = ctx
        abi = abi_of(func)
        limit = ctx.capabilities.limit("max_buffer_arguments")
        nbind = len(abi.buffers) + len(abi.ints) + len(abi.floats) + 1
        if limit is not None and nbind > int(limit[0]):
            raise UnsupportedFeatureError(
                f"kernel {func.name} needs {nbind} buffer bindings ({len(abi.buffers)} tensors, "
                f"{len(abi.ints) + len(abi.floats)} scalars and the status word); Metal binds at most "
                f"{int(limit[0])} buffers per kernel (limit max_buffer_arguments). Pass fewer tensors or scalars",
                func.span, feature="limit:max_buffer_arguments", target=str(ctx.target))
        st.has_asserts = bool(collect(func.body, Assert))
        params, bindings = [], []
        for p in abi.buffers:
            params.append(f"device {self.stype(p.buffer.dtype)}* {self.name(st, p.buffer)} [[buffer({len(bindings)})]]")
            bindings.append({"kind": "tensor", "name": p.name})
        for k in range(len(abi.ints)):
            params.append(f"constant long& tc_i{k} [[buffer({len(bindings)})]]")
            bindings.append({"kind": "int", "index": k})
        for k in range(len(abi.floats)):
            params.append(f"constant float& tc_f{k} [[buffer({len(bindings)})]]")
            bindings.append({"kind": "float", "index": k})
        params.append(f"device int* tc_status [[buffer({len(bindings)})]]")
        bindings.append({"kind": "status"})
        params += ["uint3 tc_bid [[threadgroup_position_in_grid]]", "uint tc_tid [[thread_index_in_threadgroup]]"]
        st.indent = 1
        for k, v in enumerate(abi.ints):
            self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)})tc_i{k};")
        for k, v in enumerate(abi.floats):
            self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)})tc_f{k};")
        if st.has_asserts:
            self.line(st, "int tc_fail = 0;")
            self.line(st, "threadgroup int tc_any_fail;")
        launch, top = single_launch(func)
        st.launch_meta = {}
        st.swizzle = _swizzle_hint(func)
        for s in top:
            self.stmt(st, s)
        ints = list(abi.ints)
        written = {id(s.buffer.base or s.buffer) for s in collect(func.body, Store) + collect(func.body, Atomic)}
        meta = dict(st.launch_meta)
        meta["grid"] = [host_expr(simplify(g), ints) for g in grid3(launch.grid)]
        meta["asserts"] = list(st.asserts)
        meta["bindings"] = bindings
        meta["buffers"] = [{"name": p.name, "dtype": str(p.buffer.dtype), "itemsize": p.buffer.dtype.bytes,
                            "shape": [host_expr(d, ints) for d in p.buffer.shape],
                            "written": id(p.buffer) in written} for p in abi.buffers]
        meta["nints"], meta["nfloats"] = len(abi.ints), len(abi.floats)
        meta["fast_math"] = st.fast
        meta["family"] = ctx.target.arch
        if limit is not None:
            meta["max_buffer_arguments"] = int(limit[0])
        body = "\n".join(st.lines)
        meta["msl_version"] = MSL_VERSION_BFLOAT if "bfloat" in body else MSL_VERSION
        bounds = self.launch_bounds.format(meta["threads"])
        sig = ",\n    ".join(params)
        code = (f"{self.preamble(st, func)}[[{self.kernel_qualifier}, {bounds}]] void {self.entry}(\n    {sig}) {{\n"
                f"{body}\n}}\n")
        return Source(code, self.lang, self.entry, meta)

    def preamble(self, st: EmitState, func) -> str:
        mode = "fast math" if st.fast else "safe math"
        return (f"// generated by tilecore-metal for kernel {func.name} ({st.ctx.target.arch}, {mode})\n"
                "#include <metal_stdlib>\nusing namespace metal;\n" + prelude_text())

    def stmt_KernelLaunch(self, st, s):
        threads = 1
        for t in s.threads:
            threads *= int(t)
        caps_max = st.ctx.capabilities.get("execution.max_threads_per_block", self.max_threads_per_block)
        if threads > int(caps_max):
            raise UnsupportedFeatureError(f"T.Kernel(threads={tuple(s.threads)}) asks for {threads} threads per "
                                          f"threadgroup; this target allows {caps_max}", s.span,
                                          feature="limit:max_threads_per_block", target=str(st.ctx.target))
        super().stmt_KernelLaunch(st, s)

    # -- statements MSL spells differently --------------------------------------------------------------
    def stmt_Print(self, st, s):
        raise UnsupportedFeatureError("T.print: Metal compute kernels have no printf; print on the CPU target "
                                      "(target='cpu') to debug", s.span, feature="print", target=str(st.ctx.target))

    def stmt_Assert(self, st, s):
        code = self.record_assert(st, s)
        fail = f"tc_set_status(tc_status, {code});"
        if s.values:  # checked mode: the first failure also records its indices (64-bit words after the code)
            vals = " ".join(f"tc_v[{k}] = (long)({self.expr(st, v)});" for k, v in enumerate(s.values))
            fail = (f"if ({self.atomic_cas.format('tc_status', 0, code)} == 0) {{ device long* tc_v = "
                    f"(device long*)(tc_status + 2); {vals} }}")
        self.line(st, f"if (!({self.expr(st, s.cond)})) {{ {fail} tc_fail = 1; }}")

    # -- row reductions across a whole simdgroup: simd_sum / simd_max / simd_min ---------------------------
    #: the core's butterfly over every lane of a simdgroup of 32 (xor masks 1, 2, 4, 8, 16)
    SIMD_MASKS = (1, 2, 4, 8, 16)
    SIMD_REDUCE = {"add": ("simd_sum({})", "simd_sum({})"), "max": ("tc_simd_max({})", "simd_max({})"),
                   "min": ("tc_simd_min({})", "simd_min({})")}

    def stmt_Seq(self, st, s):
        body = list(s.body)
        i = 0
        while i < len(body):
            end = self._simd_reduction(st, body, i)
            if end is None:
                self.stmt(st, body[i])
                i += 1
            else:
                i = end

    @staticmethod
    def _butterfly_step(s):
        """``(buffer, register, op, mask)`` of ``part[q] = op(part[q], simd_shuffle_xor(part[q], mask))`` over
        32 lanes, else None."""
        if not isinstance(s, Store) or len(s.indices) != 1 or not isinstance(s.value, BinOp):
            return None
        v = s.value
        q = const_value(s.indices[0])
        if v.op not in ("add", "max", "min") or q is None or not isinstance(v.b, ShuffleXor) or v.b.width != 32:
            return None
        for x in (v.a, v.b.value):
            if not (isinstance(x, BufferLoad) and x.buffer is s.buffer and len(x.indices) == 1
                    and const_value(x.indices[0]) == q):
                return None
        return s.buffer, q, v.op, v.b.mask

    def _simd_reduction(self, st, body, i):
        """A run of butterfly steps from ``body[i]`` that combines every register it touches across the whole
        simdgroup, emitted as one ``simd_sum`` / ``simd_max`` / ``simd_min`` per register (max and min keep
        NaN propagation unless fast math: ``tc_simd_max``); returns the index after the run, or None."""
        steps, j = {}, i
        while j < len(body) and (got := self._butterfly_step(body[j])) is not None:
            buf, q, op, mask = got
            steps.setdefault((id(buf), q), [buf, op, []])[2].append(mask)
            if steps[(id(buf), q)][1] != op:
                return None
            j += 1
        if not steps or any(tuple(m) != self.SIMD_MASKS for _, _, m in steps.values()):
            return None
        for (_, q), (buf, op, _) in steps.items():
            ref = f"{self.name(st, buf)}[{q}]"
            self.line(st, f"{ref} = {self.SIMD_REDUCE[op][1 if st.fast else 0].format(ref)};")
        return j

    def stmt_Atomic(self, st, s):
        """``tc_atomic_<op>_<dtype>`` on device memory, ``..._tg`` on threadgroup memory (prelude)."""
        ref = "&" + self.element(st, s.buffer, s.indices)
        space = "" if s.buffer.scope == "global" else "_tg"
        self.line(st, f"tc_atomic_{s.op}_{s.buffer.dtype}{space}({ref}, {self.expr(st, s.value)});")

    def stmt_Collective(self, st, s):
        """The backend's block-wide operations (``intrinsics.COLLECTIVES``): region arguments pass the
        address of their first element in threadgroup memory, scalars by value as ``long``."""
        from .intrinsics import COLLECTIVES

        spell = COLLECTIVES.get(s.name)
        if spell is None:
            raise CompileError(f"internal: unknown block-wide operation {s.name}", s.span)
        if s.threads is None:
            raise CompileError(f"internal: {s.name} reached codegen without tilecore.simt_distribute", s.span)
        args = []
        for a in s.args:
            if isinstance(a, Region):
                args.append(f"({self.name(st, a.buffer)} + {self.flat_index(st, a.buffer, a.starts)})")
            elif isinstance(a, Expr):
                args.append(f"(long)({self.expr(st, a)})")
        acc = s.attrs.get("acc")
        if acc is not None:  # simdgroup accumulators that live over a loop (intrinsics.resident_accumulators)
            if s.name == "tc_sg_acc_load":
                self.line(st, f"simdgroup_matrix<float, 8, 8> {acc}[{s.attrs['tiles']}];")
            args.append(acc)
        template = ", ".join(str(t) for t in spell(s))
        self.line(st, f"{s.name}<{template}>({', '.join(args)}, tc_tid);")
