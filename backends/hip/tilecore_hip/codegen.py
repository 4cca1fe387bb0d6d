"""HIP C++ for AMD GPUs: one ``extern "C" __global__`` function per kernel, compiled by clang with no
ROCm header (``-nogpuinc -nogpulib``).

Everything structural (signature, block indices, LDS carve-out, assertions) is the core's SIMT C++ emitter
(:class:`tilecore.codegen.SIMTCppEmitter`); this class is HIP's spellings as data: types and conversions,
clang's AMDGPU builtins for indices, barriers and lane exchanges (prelude ``tc_hip.h``; the indexed exchange
in ``tc_hip_shuffle.h``, included where a kernel uses it), the matrix instructions (``matrix_ops``, prelude
``tc_hip_matrix.h``) and ``global_load_lds`` for the core pipeline
planner's asynchronous copies. The wave width is the profile's ``execution.simd_width`` (``TC_WAVE``).
"""
from __future__ import annotations

import re
from importlib import resources

from tilecore.codegen import EmitState, SIMTCppEmitter
from tilecore.errors import CompileError
from tilecore.ir import (AsyncCopy, MatrixOp, ShuffleIndex, binary, collect, const, const_value, simplify, stmt_exprs,
                         walk, walk_expr)

ENTRY = "tc_kernel"
#: LDS is allocated statically up to the profile's limit (HIP has no 48 KiB static cap)
STATIC_SHARED_LIMIT = 160 * 1024
#: functions of the math prelude that are calls into ROCm's device library (ocml)
OCML_FUNCS = ("exp", "exp2", "exp10", "log", "log2", "log10", "tanh", "erf", "sin", "cos", "tan", "pow")
_OCML_CALL = re.compile(r"\b(?:%s)f?\(" % "|".join(OCML_FUNCS))


def _read(name: str) -> str:
    return resources.files("tilecore_hip").joinpath(f"prelude/{name}").read_text().replace("#pragma once\n", "")


def isa_version(arch: str) -> int:
    """``gfx942`` -> 9402: the device library's ``__oclc_ISA_version`` (major, minor, stepping in hex)."""
    digits = arch[3:]
    major, rest = (digits[:-2], digits[-2:])
    return int(major) * 1000 + int(rest[0], 16) * 100 + int(rest[1], 16)


def _uses_shuffle_index(body) -> bool:
    found = []

    def visit(s):
        for e in stmt_exprs(s):
            walk_expr(e, lambda x: found.append(x) if isinstance(x, ShuffleIndex) else None)
    walk(body, visit)
    return bool(found)


class HIPEmitter(SIMTCppEmitter):
    lang = "hip"
    entry = ENTRY
    static_shared_limit = STATIC_SHARED_LIMIT
    #: the block size the kernel is compiled for (clang ignores CUDA's launch_bounds spelling on AMDGPU: the
    #: register budget and the removal of barriers in one-wave blocks follow this attribute)
    launch_bounds = "tc_block_size({})"
    block_index = "tc_block_{}()"
    thread_index_expr = "tc_thread_x()"
    barrier_stmt = "tc_barrier();"
    barrier_or_exit_stmt = "if (tc_barrier_or(tc_fail)) return;"
    shuffle_xor = "tc_shfl_xor({0}, {1}, {2})"
    shuffle_index = "tc_shfl_idx({0}, {1}, {2})"
    static_shared_decl = "__shared__ __align__({align}) {type} {name}[{n}];"
    dynamic_shared_decl = "extern __shared__ __align__({align}) unsigned char tc_smem[];"
    storage_types = {
        "bool": "unsigned char", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
        "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
        "uint64": "unsigned long long", "float16": "_Float16", "bfloat16": "__bf16", "float32": "float",
        "float64": "double", "float8_e4m3": "tc_fp8_e4m3", "float8_e5m2": "tc_fp8_e5m2",
    }
    value_types = {**storage_types, "bool": "int", "float16": "float", "bfloat16": "float", "float8_e4m3": "float",
                   "float8_e5m2": "float"}
    load_conv = {"float16": "((float)({}))", "bfloat16": "((float)({}))",
                 "float8_e4m3": "tc_e4m3_f({})", "float8_e5m2": "tc_e5m2_f({})"}
    store_conv = {"float16": "((_Float16)({}))", "bfloat16": "((__bf16)({}))",
                  "float8_e4m3": "tc_f_e4m3({})", "float8_e5m2": "tc_f_e5m2({})"}
    round_conv = {"float16": "tc_round_h({})", "bfloat16": "tc_round_bf({})",
                  "float8_e4m3": "tc_e4m3_f(tc_f_e4m3({}))", "float8_e5m2": "tc_e5m2_f(tc_f_e5m2({}))"}
    #: the hardware's approximate transcendental instructions (v_exp_f32, v_log_f32, v_rsq_f32, ...)
    fast_math = {
        "exp": ("__builtin_amdgcn_exp2f(1.4426950408889634f * ({0}))", "exp({0})"),
        "exp2": ("__builtin_amdgcn_exp2f({0})", "exp2({0})"),
        "log": ("(0.6931471805599453f * __builtin_amdgcn_logf({0}))", "log({0})"),
        "log2": ("__builtin_amdgcn_logf({0})", "log2({0})"),
        "rsqrt": ("__builtin_amdgcn_rsqf({0})", "(1.0 / sqrt({0}))"),
        "sigmoid": ("__builtin_amdgcn_rcpf(1.0f + __builtin_amdgcn_exp2f(-1.4426950408889634f * ({0})))",
                    "(1.0 / (1.0 + exp(-({0}))))"),
    }
    #: MatrixOp spellings of the units in units.py (prelude/tc_hip_matrix.h)
    matrix_ops = {
        "mfma_f32_16x16x16_f16": "tc_mfma_16x16x16(&{c}[{c_off}], &{a}[{a_off}], &{b}[{b_off}]);",
        "mfma_f32_16x16x32_f16": "tc_mfma_16x16x32(&{c}[{c_off}], &{a}[{a_off}], &{b}[{b_off}]);",
        "mfma_f32_16x16x32_fp8": "tc_mfma_16x16x32_fp8(&{c}[{c_off}], &{a}[{a_off}], &{b}[{b_off}]);",
        "wmma_f32_16x16x16_f16_w32": "tc_wmma_16x16x16(&{c}[{c_off}], &{a}[{a_off}], &{b}[{b_off}]);",
    }

    # -- hooks of the SIMT C++ emitter ------------------------------------------------------------------
    def preamble(self, st: EmitState, func) -> str:
        """The prelude after the profile's facts: ``TC_WAVE`` (``execution.simd_width``), ``TC_FP8_FNUZ``
        (``features.float8_fnuz``), ``TC_ASYNC_MAX`` (``limits.max_async_copy_bytes``)."""
        caps, arch = st.ctx.capabilities, st.ctx.target.arch
        wave = int(caps.get("execution.simd_width"))
        limit = caps.limit("max_async_copy_bytes")
        config = (f"#define TC_WAVE {wave}\n#define TC_ISA_VERSION {isa_version(arch)}\n"
                  f"#define TC_FP8_FNUZ {int(caps.satisfies('feature:float8_fnuz')[0] is True)}\n"
                  f"#define TC_ASYNC_MAX {int(limit[0]) if limit else 0}\n")
        prelude = SIMTCppEmitter.inline_prelude(_read("tc_hip.h"))
        helpers = _read("tc_hip_matrix.h") if collect(func.body, MatrixOp) else ""
        # the indexed exchange only where a layout conversion uses it (every other kernel's source unchanged)
        if _uses_shuffle_index(func.body):
            helpers += _read("tc_hip_shuffle.h")
        return (f"/* generated by tilecore-hip for kernel {func.name} ({arch}, wave {wave}) */\n"
                f"{config}{prelude}{_read('tc_hip_math.h')}{helpers}")

    def extra_meta(self, st: EmitState, func, ctx, meta: dict) -> None:
        meta["arch"] = ctx.target.arch
        meta["wave"] = int(ctx.capabilities.get("execution.simd_width"))
        body = "\n".join(st.lines)
        # ROCm's device library is linked only into kernels that call one of its functions
        meta["libs"] = ["ocml"] if _OCML_CALL.search(body) else []

    def min_blocks(self, st: EmitState, launch):
        return None

    # -- matrix unit operands (tilecore.passes.matrix) ------------------------------------------------------
    #: operands whose registers are one run of consecutive elements in the stored tile: spelling -> elements
    #: per lane, and the lane's (row, column) in the tile as stored. MFMA A stored M x K (and B stored N x K):
    #: lane ``l`` holds row ``l % 16``, k ``per (l / 16) ..``; WMMA: row ``l % 16``, all 16 k (units.py).
    VECTOR_OPERANDS = {
        "mfma_f32_16x16x16_f16": 4, "mfma_f32_16x16x32_f16": 8, "mfma_f32_16x16x32_fp8": 8,
        "wmma_f32_16x16x16_f16_w32": 16,
    }

    def stmt_MatrixLoad(self, st, s):
        """Vector LDS reads (``ds_read_b64`` / ``_b128``, at most 16 bytes each) where the operand's registers
        are consecutive in the stored tile (A stored M x K, B stored N x K) and the row length and the
        origin's column are multiples of the run; the per-register loads otherwise."""
        per = self.VECTOR_OPERANDS.get(s.spelling)
        src = s.origin.buffer
        row_len = const_value(simplify(src.shape[-1])) if len(src.shape) >= 2 else None
        contiguous = (s.operand == "a") != bool(s.trans)
        nbytes = (per or 0) * src.dtype.bytes
        if (per is None or not contiguous or src.scope in ("global", "register") or row_len is None
                or row_len % per or s.align % per or nbytes % 8):
            return super().stmt_MatrixLoad(st, s)
        row = binary("floormod", s.lane, 16)
        col = const(0) if per == 16 else binary("mul", binary("div", s.lane, 16), per)
        # reads of at most 16 bytes, each addressed through the tile's layout: the core may store operand
        # tiles XOR-swizzled in 16-byte units (tilecore.swizzle_operand_tiles), which keeps only those whole
        chunk = min(per, 16 // src.dtype.bytes)
        for c in range(0, per, chunk):
            idx = list(s.origin.indices)
            idx[-2], idx[-1] = binary("add", idx[-2], row), binary("add", idx[-1], binary("add", col, c))
            ptr = f"{self.name(st, src)} + {self.flat_index(st, src, idx)}"
            self.line(st, f"tc_lds_vec<{chunk}>(&{self.name(st, s.dst)}[{s.dst_offset + c}], {ptr});")

    # -- asynchronous copies (tilecore.plan_pipelines): global_load_lds ------------------------------------
    def stmt_AsyncCopy(self, st, s: AsyncCopy):
        """``global_load_lds`` of 4 (or, where the profile allows, 12 and 16) bytes: the instruction writes
        each lane's bytes at one LDS address per wave plus ``lane * size`` (M0), so ``tc_async_copy`` issues
        it only where the wave's destinations are that run and every predicate holds, and copies with plain
        loads and LDS stores otherwise (zero where the predicate is false)."""
        nbytes = s.elements * s.dst.dtype.bytes
        if nbytes not in (4, 8, 16):
            raise CompileError(f"internal: an asynchronous copy of {nbytes} bytes has no global_load_lds form", s.span)
        dst = f"{self.name(st, s.dst)} + {self.flat_index(st, s.dst, s.dst_indices)}"
        src = f"{self.name(st, s.src)} + {self.flat_index(st, s.src, s.src_indices)}"
        pred = "true" if const_value(s.pred) == 1 else self.expr(st, s.pred)
        self.line(st, f"tc_async_copy<{nbytes}>({dst}, {src}, {pred});")

    def stmt_AsyncCommit(self, st, s):
        pass  # the hardware counts loads, not groups: tc_async_wait waits for them all

    def stmt_AsyncWait(self, st, s):
        self.line(st, "tc_async_wait();")
