"""CUDA C++ for NVIDIA GPUs: one ``extern "C" __global__`` function per kernel.

The kernel signature, block indices (with ``T.use_swizzle``), the ``__shared__`` carve-out, block-wide
operations and assertions are the core's SIMT C++ emitter (:class:`tilecore.codegen.SIMTCppEmitter`);
this class adds CUDA's types and conversions, its fast-math functions, the prelude (``prelude/``), the
TMA tensor maps of Hopper pipelines (``__grid_constant__`` parameters), the register programs
(``regprog.py``) and the launch facts they need (``arch``, ``tensor_maps``, ``aligned_args``).
"""
from __future__ import annotations

import dataclasses
import re
from importlib import resources

from tilecore.codegen import SIMTCppEmitter, EmitState, abi_of, host_expr
from tilecore.codegen.simtcpp import grid3
from tilecore.errors import CompileError
from tilecore.ir import (as_expr, KernelLaunch, BinOp, Bind, For, ThreadIndex, AsyncCopy, CopyBarrierWait, VectorStore, BufferLoad, BulkCopy, BulkStore, Cast, Collective, MatrixLoad, MatrixOp, MatrixStore, MatrixSync, Seq, Store, binary, collect, const,
                         const_value, logic_or, simplify, Var, walk, walk_expr)
from tilecore.codegen.cfamily import kept_workspaces, st_fast
from tilecore.ir.thread_values import thread_values
from tilecore.ir.visit import stmt_exprs

from .compiler import REGISTER_UNIT, REGISTERS_PER_SM


def _reads_thread_index(e) -> bool:
    from tilecore.ir import walk_expr

    found = []
    walk_expr(e, lambda x: found.append(x) if isinstance(x, ThreadIndex) else None)
    return bool(found)

ENTRY = "tc_kernel"
STATIC_SHARED_LIMIT = 48 * 1024


#: cp.async of 4 or 8 bytes (the prelude's tc_cp_async16 moves 16), added to a kernel that uses it
ASYNC_CA = """/* device-only: begin (tests/cuda_host_emulator.py swaps these for a host emulation) */
/* cp.async.ca (sm_80+): global -> shared, N = 4 or 8 bytes; bytes past `src_bytes` are zero-filled */
template <int N> __device__ __forceinline__ void tc_cp_async_ca(void* dst_smem, const void* src_global, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\\n" ::"r"(tc_smem_addr(dst_smem)), "l"(src_global), "n"(N),
               "r"(src_bytes)
               : "memory");
}
/* device-only: end */
"""


FP8_INCLUDE, BF16_INCLUDE = "#include <cuda_fp8.h>", "#include <cuda_bf16.h>"
#: what in a kernel's text (body, helpers, parameters) needs cuda_bf16.h: the type, the prelude's bfloat16
#: helpers (tc_round_bf, tc_pack_bf2, tc_atomic_*_bfloat16) and the WGMMA structs named after bf16
_BF16_USE = re.compile(r"bfloat16|bf16|_bf\b|_bf2\b|_bf\(")


def _tiles(launch):
    """The number of blocks of ``launch``'s grid (its output tiles: a persistent GEMM's tile count)."""
    n = as_expr(1)
    for g in launch.grid:
        n = binary("mul", n, as_expr(g))
    return simplify(n)


def min_expr(a, b):
    return simplify(binary("min", as_expr(a), as_expr(b)))


def prelude(hopper: bool = False, fp8: bool = True, bf16: bool = True, tma: bool = False, splitk: bool = False,
            persistent: bool = False) -> str:
    """The prelude text for a kernel; without ``fp8`` / ``bf16`` it leaves out cuda_fp8.h / cuda_bf16.h (and the
    helpers that need them), which only kernels with those types use: a third of NVRTC's front-end time for
    the others (docs/decisions.md D25). cuda_fp8.h includes cuda_bf16.h. ``tma``: the TMA and mbarrier
    primitives (tc_tma.cuh) without the Hopper pipelines (``hopper`` includes both). ``splitk``: the split-K
    GEMM (tc_splitk.cuh, after tc_hopper.cuh), only in kernels that use it; ``persistent``: the persistent
    GEMM (tc_persistent.cuh, likewise)."""
    names = (["tc_cuda.cuh"] + (["tc_tma.cuh"] if hopper or tma else []) + (["tc_hopper.cuh"] if hopper else [])
             + (["tc_splitk.cuh"] if splitk else []) + (["tc_persistent.cuh"] if persistent else []))
    text = "".join(resources.files("tilecore_cuda").joinpath(f"prelude/{n}").read_text() for n in names)
    drop = ((FP8_INCLUDE,) if not fp8 else ()) + ((BF16_INCLUDE,) if not (bf16 or fp8) else ())
    if drop:
        text = "".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith(drop))
    return SIMTCppEmitter.inline_prelude(text).replace("#pragma once\n", "")


def _fit_offset(first, off):
    """``(X, Y)`` with ``off == (first ^ X) + Y`` at every thread (numpy arrays of element offsets), X taken from the
    low bits a swizzle flips (tried from none up: a plain offset first); None where no such constants exist."""
    low = (1 << max(int(first.max()), int(off.max()), 1).bit_length()) - 1
    k = 0
    while (1 << k) - 1 <= low:
        x = int((first[0] ^ off[0]) & ((1 << k) - 1))
        y = off - (first ^ x)
        if (y == y[0]).all():
            return x, int(y[0])
        k += 1
    return None


_PTX_ATOM_TYPES = {"int32": ("s32", "int", "r"), "uint32": ("u32", "unsigned int", "r"),
                   "int64": ("u64", "long long", "l"), "uint64": ("u64", "unsigned long long", "l")}


def atom_helper(op: str, order: str, scope: str, dtype: str) -> str:
    """``tc_atom_<op>_<order>_<scope>_<dtype>(ptr, v)``: ``atom.<op>.<sem>.<gpu|cta>.<type>`` returning the old value
    (D69; a 64-bit addition as .u64: the same bits as a signed one)."""
    ptx, ctype, reg = _PTX_ATOM_TYPES[dtype]
    sem = f".{order}"
    return (f"__device__ __forceinline__ {ctype} tc_atom_{op}_{order}_{scope}_{dtype}({ctype}* p, {ctype} v) {{\n"
            f"  {ctype} old;\n"
            f"  asm volatile(\"atom{sem}.{'gpu' if scope == 'device' else 'cta'}.global.{op}.{ptx} %0, [%1], %2;\" "
            f": \"={reg}\"(old) : \"l\"(p), \"{reg}\"(v) : \"memory\");\n"
            f"  return old;\n}}\n")


class CUDAEmitter(SIMTCppEmitter):
    lang = "cuda"
    entry = ENTRY
    static_shared_limit = STATIC_SHARED_LIMIT
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

    #: vector stores of computed pairs: one conversion instruction per pair (cuda_fp16.h / cuda_bf16.h)
    vector_pack = {"float16": ("__half2", "__floats2half2_rn({0}, {1})"),
                   "bfloat16": ("__nv_bfloat162", "__floats2bfloat162_rn({0}, {1})")}

    #: named barrier 1 over a warp-specialized block's consumers (barrier 0 is __syncthreads)
    group_barrier_stmt = 'asm volatile("bar.sync 1, {n};\\n" ::: "memory");'
    #: registers of one multiprocessor's register file a block may hold; what the producer group keeps
    REGISTER_FILE, PRODUCER_REGS = REGISTERS_PER_SM, 40

    #: D69: an atomic that returns the old value, a helper per (op, order, scope, dtype) in the preamble
    #: (:func:`atom_helper`: ``atom.add.acq_rel.gpu.s32``); fences as ``fence.acq_rel.gpu`` / ``.cta``
    atomic_fetch = "tc_atom_{op}_{order}_{scope}_{dtype}({ptr}, {value})"
    fence_stmts = {(scope, order): f'asm volatile("fence.acq_rel.{ptx}; \\n" ::: "memory");'
                   for scope, ptx in (("block", "cta"), ("device", "gpu")) for order in ("acquire", "release", "acq_rel")}

    #: MatrixOp spellings of the units in units.py (prelude/tc_matrix.cuh)
    matrix_ops = {"mma_sync_m16n8k16": "tc_mma_16816_r(&{c}[{c_off}], &{a}[{a_off}], &{b}[{b_off}]);"}

    @property
    def collectives(self):
        from .intrinsics import COLLECTIVES

        return COLLECTIVES

    # -- hooks of the SIMT C++ emitter ------------------------------------------------------------------
    def extra_params(self, st: EmitState, func, abi) -> list:
        """Hopper pipelines: one tensor map (a ``__grid_constant__`` parameter, built by the runtime) per
        TMA operand. Also notes which tensors register programs copy with 16-byte cp.async (they must be
        16-byte aligned: ``meta["aligned_args"]``)."""
        from .hopper import tensor_map

        params = []
        st.pipelines = [c for c in self.collected(st, func.body, Collective) if c.attrs.get("tensor_maps")]
        st.tmaps, st.tmap_meta = {}, []

        def add_map(m: dict, when=None) -> str:
            """A ``__grid_constant__`` parameter for tensor map ``m`` (hopper.tensor_map) and its launch facts;
            ``when``: the condition (over the kernel's integers) under which the kernel reads it, None: always."""
            name = f"tc_tmap{len(st.tmap_meta)}"
            buf = m["buffer"].base or m["buffer"]
            st.tmap_meta.append({"arg": next(k for k, p in enumerate(abi.buffers) if p.buffer is buf),
                                 "dtype": m["dtype"], "elem_bytes": m["elem_bytes"],
                                 "dims": [host_expr(simplify(d), list(abi.ints)) for d in reversed(m["buffer"].shape)],
                                 "box": list(m["box"]), "swizzle": m["swizzle"],
                                 **({"fix": m["fix"]} if "fix" in m else {})})  # the runtime's error says it
            if when is not None:  # a versioned loop's bulk copies (BulkCopy.when): encoded where it holds
                st.tmap_meta[-1]["when"] = host_expr(when, list(abi.ints))
            params.append(f"const __grid_constant__ tc_tmap {name}")
            return name

        for c in st.pipelines:
            st.tmaps[id(c)] = [add_map(m) for m in c.attrs["tensor_maps"]]
        # bulk tile copies (tilecore.plan_pipelines): one tensor map per (tensor, box, swizzle)
        # (a map only copies of versioned loops read, BulkCopy.when, is built where one of their tests holds)
        st.bulk_maps = {}
        users: dict = {}
        for c in self.collected(st, func.body, BulkCopy):
            users.setdefault(self.bulk_key(c), []).append(c)
        for key, cs in users.items():
            whens = [c.when for c in cs]
            when = None
            if all(w is not None for w in whens):
                when = whens[0]
                for w in whens[1:]:
                    when = when if w is when else logic_or(when, w)
            st.bulk_maps[key] = add_map(tensor_map(cs[0].src, key[1], key[2]), when)
        self.bulk_store_maps(st, func, add_map)
        st.aligned = set()
        for c in self.collected(st, func.body, Collective):
            plan = c.attrs.get("plan")
            if plan and plan.get("mode") == "mma":
                for cp in plan["copies"].values():
                    st.aligned.add(next(k for k, p in enumerate(abi.buffers)
                                        if p.buffer is (cp.args[0].buffer.base or cp.args[0].buffer)))
        # a Hopper pipeline's epilogue that stores pairs unchecked (hopper.epilogue_flags: EPI_PAIRS) needs C aligned
        for c in st.pipelines:
            if c.attrs.get("epi", 0) & 4:
                out = c.args[1].buffer
                st.aligned.add(next(k for k, p in enumerate(abi.buffers) if p.buffer is (out.base or out)))
        # software-pipelined copies (tilecore.plan_pipelines) of more than one element need aligned sources
        for c in self.collected(st, func.body, AsyncCopy):
            if c.elements > 1:
                st.aligned.add(next(k for k, p in enumerate(abi.buffers) if p.buffer is (c.src.base or c.src)))
        # vector stores (tilecore.vectorize_stores) proved offsets aligned; the tensor's base must be too
        kept = {id(b) for b in func.attrs.get("kept_workspaces", ()) or ()}
        for c in self.collected(st, func.body, VectorStore):
            if c.buffer.scope != "global":  # (a bulk store's shared tile, D46: block memory is aligned)
                continue
            if id(c.buffer.base or c.buffer) in kept:  # a kept workspace (D69): the runtime's, 256-byte aligned
                continue
            st.aligned.add(next(k for k, p in enumerate(abi.buffers) if p.buffer is (c.buffer.base or c.buffer)))
        # a GEMM split over K (hopper.split_k): its global scratch, one pointer after the tensor maps
        st.workspace = sum(int(c.attrs.get("workspace_bytes", 0)) for c in st.pipelines)
        # the core's kept workspaces (D69: a split-K GEMM's partials and counters) after the pipelines', each at a
        # 256-byte offset, pointers into the same per-(device, stream) buffer the runtime keeps
        st.kept_decls = []
        for b, n in kept_workspaces(func):
            off = -(-st.workspace // 256) * 256
            t = self.stype(b.dtype)
            st.kept_decls.append(f"  {t}* {self.name(st, b)} = reinterpret_cast<{t}*>(__builtin_assume_aligned("
                                 f"tc_workspace + {off}, 16));")  # the runtime's buffer: 256-byte aligned
            st.workspace = off + n * b.dtype.bytes
        if st.workspace:
            params.append("unsigned char* tc_workspace")
        st.lines.extend(st.kept_decls)  # the body's first lines
        return params

    @staticmethod
    def bulk_key(c: BulkCopy) -> tuple:
        """(tensor, box innermost first, swizzle in bytes) of a bulk copy's tensor map: one panel's columns, then
        the box's other extents."""
        lay = c.layout
        box = (lay.panel_elems if lay.panels else lay.cols,) + tuple(int(b) for b in reversed(c.box[:-1]))
        return id(c.src), box, lay.swizzle_bytes if lay.panels else 0

    def bulk_store_maps(self, st, func, add_map) -> None:
        """Bulk tile stores (tilecore.bulk_store, D46): one tensor map per (tensor, box, swizzle) they write."""
        from .hopper import TMAP_DTYPES, TMAP_SWIZZLE, tensor_map

        for c in self.collected(st, func.body, BulkStore):
            key = self.store_key(c)
            if key not in st.bulk_maps:
                if str(c.dst.dtype) == "bool":  # stored as unsigned char (storage_types): bytes to the TMA unit
                    m = {"buffer": c.dst, "dtype": TMAP_DTYPES["uint8"], "elem_bytes": 1, "box": tuple(key[2]),
                         "swizzle": TMAP_SWIZZLE[key[3]]}
                else:
                    m = tensor_map(c.dst, key[2], key[3])
                st.bulk_maps[key] = add_map(m)

    @staticmethod
    def store_key(c: BulkStore) -> tuple:
        """(``"store"``, tensor, box innermost first, swizzle) of a bulk store's tensor map: one panel's columns by
        the tile's rows (by one element of each dimension before them: a tile of a 4-D tensor's last two, D61)."""
        lay = c.layout
        rows = int(c.cells[2]) if c.cells is not None else int(c.box[0])  # a cell's rows (D78)
        return "store", id(c.dst), (lay.panel_elems, rows) + (1,) * (len(c.dst.shape) - 2), lay.swizzle_bytes

    def extra_meta(self, st: EmitState, func, ctx, meta: dict) -> None:
        meta["arch"] = getattr(ctx.target, "arch", "")
        meta["tensor_maps"] = st.tmap_meta
        meta["aligned_args"] = sorted(st.aligned)
        if st.workspace:  # the runtime allocates it once per device and stream, zero-filled (runtime.py)
            meta["workspace"] = {"bytes": st.workspace, "zeroed": True}
        clusters = {int(c.attrs["cluster"]) for c in st.pipelines if c.attrs.get("cluster")}
        if clusters:  # a split GEMM summed in thread-block clusters (D41): the kernel's __cluster_dims__, for the record
            meta["cluster"] = [1, 1, max(clusters)]
        grouped = [x for x in collect(func.body, KernelLaunch) if x.attrs.get("block_group")]
        groups = [tuple(int(d) for d in x.attrs["block_group"]) for x in grouped]
        if groups:  # the core's block group (D75): a thread-block cluster of that shape, x fastest
            g = list(groups[0])[:3]
            if len(groups[0]) > 3 and any(d != 1 for d in groups[0][3:]):
                raise CompileError(f"a block group of shape {groups[0]}: CUDA's clusters have 3 dimensions")
            meta["cluster"] = g + [1] * (3 - len(g))
            by = grouped[0].attrs.get("block_group_by")
            if by:  # D84: the options that made the clusters (the runtime's clusters-at-once warning names them)
                from .hopper import GENERAL_SPLIT_K

                routed = grouped[0].attrs.get("split_k") and grouped[0].attrs.get("tilecore.cuda.general_plain_gemm")
                meta["cluster_by"] = ([GENERAL_SPLIT_K] if routed and by == "tilecore.split_k_reduce" else []) + [by]
            if getattr(st, "group_copies", False):  # D80: the group's blocks share copies (tilecore.group_multicast)
                meta["group_multicast"] = True
        if getattr(st, "hopper_persistent", None) is not None:  # a persistent GEMM: min(tiles, its blocks) in x
            from .hopper import PERSISTENT_BLOCKS_PER_SM

            launch, ints = st.hopper_persistent, list(abi_of(func).ints)
            blocks = int(launch.attrs["hopper_persistent"])
            tiles = _tiles(launch)
            if getattr(st, "mcast_slots", None) is not None:  # clusters of two (D44): pairs of slots, an even grid
                tiles, blocks = st.mcast_slots, blocks - blocks % 2
                meta["cluster"] = [2, 1, 1]
            grid = min_expr(tiles, blocks)
            meta["grid"] = [host_expr(grid, ints), "1", "1"]
            # the runtime caps the grid at the device's own multiprocessors (an H100 PCIe has 114, an H20 78)
            # (its own key: meta["persistent"] is the core's tilecore.persistent launch, D36)
            meta["hopper_persistent"] = {"tiles": host_expr(tiles, ints), "blocks_per_sm": PERSISTENT_BLOCKS_PER_SM}
            if getattr(st, "mcast_slots", None) is not None:
                meta["hopper_persistent"]["cluster"] = 2

    def emit(self, func, ctx):
        """The core's kernel text, with ``__cluster_dims__`` where a split GEMM sums in clusters (D41): the cluster
        shape is compiled into the kernel, so every launch path (cuLaunchKernel, the compiled launcher, CUDA
        graphs) launches clusters without a launch attribute."""
        src = super().emit(func, ctx)
        if self.programmatic_launch(ctx):
            src = self._programmatic(src)
        cluster = src.meta.get("cluster")
        if cluster:
            head = f"{self.kernel_qualifier} void __launch_bounds__("
            dims = ", ".join(str(int(d)) for d in cluster)
            src = dataclasses.replace(src, code=src.code.replace(head, f"{self.kernel_qualifier} void __cluster_dims__({dims}) "
                                                f"__launch_bounds__(", 1))
        return src

    #: pass config (D76): programmatic dependent launch. The kernel starts with ``griddepcontrol.launch_dependents``
    #: (the next kernel in the stream may be launched now: its blocks become resident as this kernel's leave their
    #: SMs) and ``griddepcontrol.wait`` (this kernel reads and writes nothing before the kernel before it in the
    #: stream has completed and its memory is visible); the runtime launches it with
    #: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (meta ``programmatic_launch``), so the launch's latency
    #: and the block's start overlap the previous kernel's last blocks. sm_90 and later; default False
    PROGRAMMATIC_OPTION = "tilecore.cuda.programmatic_launch"

    def programmatic_launch(self, ctx) -> bool:
        if ctx is None or not ctx.switch(self.PROGRAMMATIC_OPTION, False, expected=(
                "True (the kernel launched as a programmatic dependent launch: griddepcontrol at its start, D76) or "
                "False (the default)")):
            return False
        arch = str(getattr(ctx.target, "arch", ""))
        m = re.search(r"(\d+)", arch)
        return m is not None and int(m.group(1)) >= 90

    def _programmatic(self, src):
        """The kernel text with the two griddepcontrol instructions at the top of its body (before its first
        statement: nothing global is read or written above them), and ``programmatic_launch`` in its metadata."""
        code = src.code
        k = code.index(f" {self.entry}(")
        j = code.index(") {\n", k) + 4
        pre = ('  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");\n'
               '  asm volatile("griddepcontrol.wait;" ::: "memory");\n')
        return dataclasses.replace(src, code=code[:j] + pre + code[j:], meta={**src.meta, "programmatic_launch": True})

    def min_blocks(self, st: EmitState, launch):
        # one block per SM for warp-specialized kernels that move registers (setmaxnreg needs a register cap at
        # entry); a core-specialized block of fewer than 384 threads moves none and keeps its occupancy
        if launch.attrs.get("producer_threads"):
            return 1 if int(const_value(simplify(launch.threads[0]))) >= 384 else None
        return 1 if launch.attrs.get("warp_specialized") else None

    @staticmethod
    def collected(st, root, kind) -> list:
        """``collect(root, kind)`` from one walk of ``root`` a kernel (D65: the emitter asked a dozen times for the
        statements of each kind in the whole kernel, each a walk of it)."""
        if not hasattr(st, "walked"):
            st.walked = {}
        hit = st.walked.get(id(root))
        if hit is None or hit[0] is not root:
            every: list = []
            walk(root, every.append)
            hit = st.walked[id(root)] = (root, every)
        return [x for x in hit[1] if isinstance(x, kind)]

    def preamble(self, st: EmitState, func) -> str:
        helpers = "".join(atom_helper(*m) for m in sorted(set(re.findall(
            r"\btc_atom_(add)_(relaxed|acquire|release|acq_rel)_(block|device)_(u?int(?:32|64))\(", "\n".join(st.lines)))))
        if st.pipelines:
            from .hopper import wgmma_wrappers

            helpers = wgmma_wrappers(st.pipelines)
        if any(c.elements * c.dst.dtype.bytes < 16 for c in self.collected(st, func.body, AsyncCopy)):
            helpers += ASYNC_CA
        if getattr(st, "group_copies", False):  # copies and releases shared by a block group (D80)
            helpers += resources.files("tilecore_cuda").joinpath("prelude/tc_group_copy.cuh").read_text()
        if "tc_named_" in "\n".join(st.lines):  # ping-pong turns (the general path's warpgroups)
            helpers += resources.files("tilecore_cuda").joinpath("prelude/tc_named_barrier.cuh").read_text()
        if "tc_ex2_ftz(" in "\n".join(st.lines):  # exp2 past its range check in a register program (D35)
            helpers += resources.files("tilecore_cuda").joinpath("prelude/tc_ex2.cuh").read_text()
        if "tc_div_fast(" in "\n".join(st.lines):  # O / l with div.rn's fast path once a row (D60)
            helpers += resources.files("tilecore_cuda").joinpath("prelude/tc_div_row.cuh").read_text()
        if "tc_ex2_poly(" in "\n".join(st.lines):  # exp2 on the FMA pipe in a register program (D60)
            helpers += resources.files("tilecore_cuda").joinpath("prelude/tc_ex2_poly.cuh").read_text()
        if self.collected(st, func.body, MatrixStore):  # four 8x8 matrices a warp into shared memory (D51)
            helpers += resources.files("tilecore_cuda").joinpath("prelude/tc_stmatrix.cuh").read_text()
        if re.search(r"\btc_pipe_prof[},]", "\n".join(st.lines)):  # the persistent GEMM's profile (D49)
            helpers += "__device__ unsigned long long tc_pipe_prof[TC_PROF_BLOCKS * TC_PROF_WORDS];\n"
        if re.search(r"\btc_(pack_bits|mma_16816_r|ldsm_regs)\b", "\n".join(st.lines)):
            # registered matrix units on register arrays (units.py): mma.sync, ldmatrix into registers, a wgmma's A
            # from registers; not a wgmma on shared tiles alone (D65: its bfloat16 helpers pulled cuda_bf16.h into
            # every general-path 16-bit GEMM)
            helpers += resources.files("tilecore_cuda").joinpath("prelude/tc_matrix.cuh").read_text()
        if getattr(st, "wgmma_structs", None):  # wgmma as a registered unit (tc_wgmma.cuh)
            helpers += resources.files("tilecore_cuda").joinpath("prelude/tc_wgmma.cuh").read_text()
            helpers += "".join(st.wgmma_structs.values())
        # the 8-bit float and bfloat16 types (and helpers) appear in the kernel's text: its parameters, body
        # and helpers; tc_matrix.cuh's helpers take bfloat16 arguments
        dtypes = " ".join(str(p.buffer.dtype) for p in abi_of(func).buffers)
        body = "\n".join(st.lines)
        fp8 = "float8" in dtypes or "__nv_fp8" in body or "__nv_fp8" in helpers
        bf16 = bool(_BF16_USE.search(dtypes) or _BF16_USE.search(body) or _BF16_USE.search(helpers))
        text = prelude(bool(st.pipelines), fp8, bf16, tma=bool(getattr(st, "bulk_maps", None)),
                       splitk=any(c.name == "tc_wgmma_splitk" for c in getattr(st, "pipelines", ())),
                       persistent=getattr(st, "hopper_persistent", None) is not None)
        return f"/* generated by tilecore-cuda for kernel {func.name} */\n{text}\n{helpers}"

    def collective_extra_args(self, st, s) -> list:
        ws = ["tc_workspace"] if s.attrs.get("workspace_bytes") else []
        if s.name == "tc_wgmma_splitk" and s.attrs.get("cluster"):  # summed in its cluster (D41): no workspace
            ws = ["(unsigned char*)0"]
        return [f"&{name}" for name in getattr(st, "tmaps", {}).get(id(s), [])] + ws

    # -- CUDA-only statements ----------------------------------------------------------------------------
    #: pass config: a wgmma descriptor's thread-dependent part (the warpgroup: ``threadIdx.x / 128``) from a
    #: warp-uniform value, so the descriptors are computed in the uniform datapath (D55; default off)
    UNIFORM_OPTION = "tilecore.cuda.uniform_warp_index"

    def warp_uniform_ok(self, st) -> bool:
        ctx = getattr(st, "ctx", None)
        return (ctx is not None and self._auto_option(st, self.UNIFORM_OPTION, gemm=True)
                and getattr(self, "_block_threads", 0) > 0 and self._block_threads % 32 == 0
                and getattr(st, "warp_line", None) is not None)

    @staticmethod
    def _auto_option(st, key: str, gemm: bool = False, default="auto") -> bool:
        """A D59 option: True / False as asked; "auto" (the default unless ``default`` says otherwise) where the
        launch has a gemm reading registers as an operand (st.register_operands); with ``gemm`` also in a
        persistent launch (a tile loop) of wgmma gemms (st.persistent_gemm, D62)."""
        v = st.ctx.option(key, default)
        return v is True or (v == "auto" and (bool(getattr(st, "register_operands", False))
                                             or gemm and bool(getattr(st, "persistent_gemm", False))))

    def fast_minmax(self, st) -> bool:
        ctx = getattr(st, "ctx", None)
        return ctx is None or ctx.option(self.FAST_MINMAX_OPTION, True) is not False

    def warp_index(self, st) -> str:
        """``tc_warp_u``: the thread's warp index as a warp-uniform value (a shuffle from lane 0, which the
        compiler keeps in a uniform register), declared at the kernel's top on first use."""
        if not getattr(st, "warp_declared", False):
            pos, indent = st.warp_line
            st.lines.insert(pos, " " * indent + "const int tc_warp_u = __shfl_sync(0xffffffffu, ((int)threadIdx.x) >> 5, 0);")
            st.warp_declared = True
        return "tc_warp_u"

    #: pass config (D61): under fast math a float max / min as fmaxf / fminf (one FMNMX, the register programs'
    #: spelling) rather than tc_max / tc_min (a compare and a select: FSETP + FSEL); default True. Neither propagates
    #: NaN (fast math); they may differ in the sign of a zero result of +0 against -0
    FAST_MINMAX_OPTION = "tilecore.cuda.fast_minmax"

    def expr(self, st: EmitState, e) -> str:
        if isinstance(e, BinOp) and e.op in ("max", "min") and st_fast(st) \
                and str(e.dtype) in ("float32", "float16", "bfloat16") and self.fast_minmax(st):
            return f"{'fmaxf' if e.op == 'max' else 'fminf'}({self.expr(st, e.a)}, {self.expr(st, e.b)})"
        if getattr(st, "warp_uniform", False) and isinstance(e, BinOp) and e.op in ("floordiv", "div") \
                and isinstance(e.a, ThreadIndex) and isinstance(const_value(e.b), int) and const_value(e.b) % 32 == 0:
            per = const_value(e.b) // 32
            return f"({self.warp_index(st)} / {per})" if per > 1 else self.warp_index(st)
        if isinstance(e, BinOp) and e.op in ("floormod", "floordiv") and getattr(st, "nonneg", None):
            c = const_value(e.b)
            if isinstance(c, int) and c > 0 and c & (c - 1) == 0 and self.nonnegative(st, e.a):
                a = self.expr(st, e.a)
                return f"({a} & {c - 1})" if e.op == "floormod" else f"({a} >> {c.bit_length() - 1})"
        regs = getattr(st, "regs", None)
        if regs and isinstance(e, BufferLoad):
            ref = regs.get(id(e.buffer))
            if ref is not None:  # a fragment held in registers (cuda.register_program)
                return ref
        return super().expr(st, e)

    def stmt_Collective(self, st, s: Collective):
        if s.name == "tc_register_program":
            from .regprog import emit_register_program

            return emit_register_program(self, st, s)
        if s.name == "tc_wgmma_persistent":
            return self.persistent_gemm(st, s)
        return super().stmt_Collective(st, s)

    # -- a persistent GEMM (hopper.persistent_blocks, prelude/tc_persistent.cuh) ------------------------------
    def _block_indices(self, st, s) -> None:
        """A persistent launch defines its block variables per tile, in the GEMM's tile function."""
        if s.attrs.get("hopper_persistent"):
            st.hopper_persistent = s
            return
        super().block_indices(st, s)

    def persistent_gemm(self, st, s: Collective) -> None:
        """``tc_wgmma_persistent<...>(pipe, C, tiles, ldc, tile_of, maps)``: ``tile_of`` (a lambda) maps a tile's
        linear index to the block indices today's grid gives the block of that index (x fastest, then y, z;
        ``T.use_swizzle`` as the emitter's block_indices spells it, on these indices), then to the tile's
        arguments, each of the collective's own expressions of the block variables."""
        launch = st.hopper_persistent
        gx, gy, _ = (self.expr(st, simplify(g)) for g in grid3(launch.grid))
        pipe, target, a_r0, a_c0, b_r0, b_c0, k_tiles, m_valid, n_valid, ldc = s.args
        mc = s.attrs.get("mcast")
        if mc:
            return self.multicast_gemm(st, s, launch, mc)
        self.line(st, "auto tc_tile_of = [&](long long tc_t) {")
        st.indent += 1
        dims = len(launch.grid)
        if dims == 1:
            self.line(st, "const long long tc_px = tc_t;")
        elif dims == 2:
            self.line(st, f"const long long tc_px = tc_t % ({gx}), tc_py = tc_t / ({gx});")
        else:
            self.line(st, f"const long long tc_px = tc_t % ({gx}), tc_py = (tc_t / ({gx})) % ({gy}), "
                          f"tc_pz = tc_t / (({gx}) * ({gy}));")
        self.block_index = "tc_p{}"
        try:
            super().block_indices(st, launch)
        finally:
            del self.block_index
        vals = [self.flat_index(st, target.buffer, target.starts)] + [
            self.expr(st, e) for e in (a_r0, a_c0, b_r0, b_c0, k_tiles, m_valid, n_valid)]
        self.line(st, f"return tc_gemm_tile{{{', '.join(f'(long long)({v})' for v in vals)}}};")
        st.indent -= 1
        self.line(st, "};")
        tiles = self.expr(st, simplify(_tiles(launch)))
        template = ", ".join(str(t) for t in self.collectives[s.name](s))
        args = [f"({self.name(st, pipe.buffer)} + {self.flat_index(st, pipe.buffer, pipe.starts)})",
                self.name(st, target.buffer), f"(long long)({tiles})", f"(long long)({self.expr(st, ldc)})",
                "tc_tile_of"] + [a for a in self.collective_extra_args(st, s) if a != "tc_workspace"]
        if s.attrs.get("release") or s.attrs.get("profile") or s.attrs.get("stream_k"):
            # D49: not the default release, or profiled; D53: stream-K's schedule and workspace
            if len(args) == 7:
                args.append("nullptr")
            args.append(self.mc_arg(s, 0))
        self.line(st, f"{s.name}<{template}>({', '.join(args)});")

    @staticmethod
    def mc_arg(s: Collective, share: int) -> str:
        """tc_wgmma_persistent's last argument (tc_persistent.cuh's tc_mc): the operand a cluster of two shares
        (D44), how a stage is released (D49's tilecore.cuda.stage_release), and the profile's array (D49)."""
        rel, prof = int(s.attrs.get("release", 0)), s.attrs.get("profile")
        sk = s.attrs.get("stream_k")
        if sk:  # D53: tc_mc's SK, its workspace (the kernel's tc_workspace) and slots
            return (f"tc_mc<{share}, {rel}, {1 if prof else 0}, {int(sk['mode'])}>"
                    f"{{{'tc_pipe_prof' if prof else 'nullptr'}, tc_workspace, {int(sk['slots'])}}}")
        if prof:
            return f"tc_mc<{share}, {rel}, 1>{{tc_pipe_prof}}"
        return f"tc_mc<{share}, {rel}>()" if share else f"tc_mc<0, {rel}>()"

    def multicast_gemm(self, st, s: Collective, launch, mc: dict) -> None:
        """The persistent GEMM in clusters of two blocks (hopper.cluster_multicast_plan, D44): slots 2 p and 2 p + 1
        are the two tiles of pair p, side by side in grid dimension ``mc["dim"]`` (the one that moves only the
        operand the pair does not share). The pairs form a grid of half as many (rounded up) in that dimension,
        walked from the pair's linear index as the grid walks its blocks (x fastest; ``T.use_swizzle`` as the
        emitter spells it, on the pairs); a slot past the grid's tiles takes its partner's tile with m_valid 0
        (tc_persistent.cuh: loaded and multiplied, never stored)."""
        pipe, target, a_r0, a_c0, b_r0, b_c0, k_tiles, m_valid, n_valid, ldc = s.args
        d = int(mc["dim"])
        grid = [simplify(as_expr(g)) for g in launch.grid]
        counts = [int(const_value(g)) for g in grid]
        pairs = list(counts)
        pairs[d] = -(-counts[d] // 2)
        st.mcast_slots = as_expr(2 * pairs[0] * pairs[1])
        axis = "xy"[d]
        qvars = tuple(Var(f"tc_q{a}", v.dtype) for a, v in zip("xy", launch.block_vars))
        self.line(st, "auto tc_tile_of = [&](long long tc_t) {")
        st.indent += 1
        self.line(st, f"const long long tc_rank = tc_t % 2, tc_pair = tc_t / 2;  /* the pair's tiles side by side in "
                      f"{axis} */")
        self.line(st, f"const long long tc_px = tc_pair % ({pairs[0]}), tc_py = tc_pair / ({pairs[0]});")
        self.block_index = "tc_p{}"
        try:
            super().block_indices(st, launch.with_(grid=tuple(as_expr(n) for n in pairs), block_vars=qvars))
        finally:
            del self.block_index
        q, odd = self.name(st, qvars[d]), counts[d] % 2 == 1
        if odd:
            self.line(st, f"const bool tc_dup = 2 * (long long){q} + tc_rank >= {counts[d]};  /* past the grid's "
                          "tiles */")
        for i, v in enumerate(launch.block_vars):
            val = (f"2 * {q} + tc_rank" + (" - (tc_dup ? 1 : 0)" if odd else "") if i == d else self.name(st, qvars[i]))
            self.line(st, f"const {self.vtype(v.dtype)} {self.name(st, v)} = ({self.vtype(v.dtype)})({val});")
        vals = [self.flat_index(st, target.buffer, target.starts)] + [
            self.expr(st, e) for e in (a_r0, a_c0, b_r0, b_c0, k_tiles)]
        vals.append(f"tc_dup ? 0 : ({self.expr(st, m_valid)})" if odd else self.expr(st, m_valid))
        vals.append(self.expr(st, n_valid))
        self.line(st, f"return tc_gemm_tile{{{', '.join(f'(long long)({v})' for v in vals)}}};")
        st.indent -= 1
        self.line(st, "};")
        template = ", ".join(str(t) for t in self.collectives[s.name](s))
        extra = self.collective_extra_args(st, s)
        if len(extra) == 2:
            extra.append("nullptr")
        args = [f"({self.name(st, pipe.buffer)} + {self.flat_index(st, pipe.buffer, pipe.starts)})",
                self.name(st, target.buffer), f"(long long)({self.expr(st, st.mcast_slots)})",
                f"(long long)({self.expr(st, ldc)})", "tc_tile_of"] + extra + [self.mc_arg(s, int(mc["share"]))]
        self.line(st, f"{s.name}<{template}>({', '.join(args)});")

    # -- matrix unit operands (tilecore.passes.matrix) ------------------------------------------------------
    #: ldmatrix for the mma.sync m16n8k16 operands: (operand, stored transposed) -> (8x8 matrices, .trans,
    #: the row and column of the stored tile that lane ``l`` addresses). Lane ``l`` gives row ``l % 8`` of
    #: matrix ``l / 8`` and receives, per matrix, the pair at row ``l / 4``, columns ``2 (l % 4)`` ``+ 1`` (the
    #: transposed pair with .trans): A's matrices are (rows 0-7 | 8-15) x (k 0-7 | 8-15) in register order,
    #: B's are k 0-7 and k 8-15 (units.py has the register layouts this reproduces).
    LDMATRIX = {
        ("a", False): (4, False, lambda l: (binary("floormod", l, 16), binary("mul", binary("div", l, 16), 8))),
        ("a", True): (4, True, lambda l: (binary("add", binary("floormod", l, 8), binary("mul", binary("div", l, 16), 8)),
                                          binary("mul", binary("floormod", binary("div", l, 8), 2), 8))),
        ("b", True): (2, False, lambda l: (binary("floormod", l, 8), binary("mul", binary("floormod", binary("div", l, 8), 2), 8))),
        ("b", False): (2, True, lambda l: (binary("floormod", l, 16), const(0))),
    }

    # -- wgmma through the core's matrix-unit GEMM (units.WGMMA_ATTRS) ------------------------------------
    #: descriptor swizzle mode by panel width (PTX ISA, matrix descriptor: 1 = 128B, 2 = 64B, 3 = 32B)
    WGMMA_SWIZZLE = {128: 1, 64: 2, 32: 3}

    def wgmma_desc(self, st, s, x: str) -> str:
        """The matrix descriptor of operand ``x`` of ``s``: its origin's byte address in the paneled tile (the
        origin starts a group of 8 rows, so its offset is the unswizzled one), SBO = 8 rows of a panel,
        LBO = one panel (MN-major: the instruction spans several) or 16 (K-major: unused)."""
        origin, lay, trans = getattr(s, f"{x}_origin"), s.attrs[f"{x}_layout"], s.attrs[f"{x}_trans"]
        buf = origin.buffer
        mn_major = trans if x == "a" else not trans
        lbo = lay.rows * lay.swizzle_bytes if mn_major else 16
        st.warp_uniform = self.warp_uniform_ok(st)
        try:
            split = self.desc_split(st, buf, origin.indices, x == "b" and s.a_origin is None)
            flat = self.flat_index(st, buf, origin.indices) if split is None else self.expr(st, split[0])
            off = None if split is None else self.expr(st, split[1])
        finally:
            st.warp_uniform = False
        addr = f"tc_smem_addr({self.name(st, buf)}) + (unsigned)({flat}) * {buf.dtype.bytes}u"
        desc = f"tc_wg_desc({addr}, {lbo}u, {8 * lay.swizzle_bytes}u, {self.WGMMA_SWIZZLE[lay.swizzle_bytes]}u)"
        if off is not None:
            st.wgmma_structs.setdefault("tc_wg_desc_at", self.DESC_AT)
            return f"tc_wg_desc_at({desc}, (int)({off}) * {buf.dtype.bytes})"
        return desc

    #: pass config: a wgmma descriptor inside an unrolled k loop as the descriptor at the loop's first step plus
    #: the step's offset, a constant once the loop is unrolled (D59; D66: "auto" by default, below): the register programs' form,
    #: 4 uniform-datapath instructions an HGMMA fewer
    DESC_OFFSET_OPTION = "tilecore.cuda.descriptor_offsets"
    #: D66: "auto" (the default since D66's round 3): in kernels with a gemm reading registers whose longest unrolled
    #: wgmma k loop has 16 steps or more (FlashAttention at d256: Q K^T's 16 descriptor pairs; H200, three rounds: causal
    #: +3.7 to +6.9%, exact and fast, non-causal -3 to +10%, 9 of 12 rows ahead, mean +3.3%); d128 (8 steps) within
    #: the noise either way (-4 to +2%): off there
    DESC_OFFSET_DEFAULT = "auto"
    DESC_OFFSET_MIN_STEPS = 16
    #: D74: ``"fit"``: "auto"'s kernels and, in a kernel with a gemm reading registers, wherever the fragments the
    #: gemms carry across the loop's back edge (their accumulators and the registers they read, 32-bit words a thread:
    #: FlashAttention's S, O and P) are at most this many: there ptxas 13.0 fits the unswitched iteration (D70) with
    #: the offsets (d128 128x128: 160, d256 128x64: 176, d64 128x176: 164: no spill) and spills above it (d128 128x176
    #: causal or ragged: 196 words, 36 / 52 bytes a thread stored / loaded)
    DESC_OFFSET_MAX_CARRIED = 176
    #: D83: ``"registers"``: "auto"'s kernels and, elsewhere, only the descriptors of a gemm reading its A from
    #: registers (FlashAttention's P @ V: V's 11 descriptors at 128x176, each 4-5 dependent uniform instructions
    #: between the HGMMAs inside ping-pong's turn otherwise); Q K^T's descriptors as before (with them too, d128
    #: 128x176 causal spills: D74)
    DESC_OFFSET_VALUES = (True, False, "auto", "fit", "registers")

    def descriptor_offsets(self, st, a_regs: bool = False) -> bool:
        """Whether the descriptors of an unrolled wgmma k loop are stepped as offsets (``a_regs``: the gemm reads
        its A from registers)."""
        v = st.ctx.option(self.DESC_OFFSET_OPTION, self.DESC_OFFSET_DEFAULT)
        if not any(v is x or (isinstance(v, str) and v == x) for x in self.DESC_OFFSET_VALUES):
            raise CompileError(f"{self.DESC_OFFSET_OPTION} must be True, False, \"auto\", \"fit\" or "
                               f"\"registers\", not {v!r}")
        if v is True:
            return True
        if v == "registers" and a_regs and getattr(st, "register_operands", False):
            return True
        if v == "registers":
            v = "auto"
        if v == "auto" and a_regs and getattr(st, "register_operands", False) \
                and getattr(st, "carried_words", 0) > self.DESC_OFFSET_MAX_CARRIED \
                and not st.ctx.option("tilecore.fast_math", False):
            return True  # D83: "auto" takes "registers" where offsets everywhere spill (d128 128x176), exact build
        if v not in ("auto", "fit") or not getattr(st, "register_operands", False):
            return False
        if getattr(st, "wgmma_k_steps", 0) >= self.DESC_OFFSET_MIN_STEPS:
            return True
        return v == "fit" and 0 < getattr(st, "carried_words", 0) <= self.DESC_OFFSET_MAX_CARRIED
    DESC_AT = """/* D59: a matrix descriptor advanced by a signed byte offset (a multiple of 16) inside its tile (the 14-bit
 * address field in 16-byte units; shared addresses stay below 2^18: no carry or borrow leaves the field). D66: one
 * 64-bit add (UIADD3.64, the register programs' stepping), the same bits as adding to the low word alone; that form
 * (mask and or) made ptxas rebuild the high word (UMOV) for every instruction of an unrolled k loop */
__device__ __forceinline__ unsigned long long tc_wg_desc_at(unsigned long long d, int off) {
  return d + (unsigned long long)(long long)(off >> 4);
}
"""

    def desc_split(self, st, buf, indices, a_regs: bool = False):
        """``(base, step)`` element offsets with ``base + step`` the origin's offset in its tile, ``step`` in the
        innermost unrolled loop's variable only (0 at its first step) and ``base`` free of it, where
        tilecore.cuda.descriptor_offsets is on; else None. A remainder of a multiple (``(x * 128) % 8``, the swizzle's
        term for an origin on a whole panel) folds to 0 first."""
        ctx = getattr(st, "ctx", None)
        if ctx is None or not getattr(st, "unrolled", None) or not self.descriptor_offsets(st, a_regs):
            return None
        from tilecore.ir import free_vars
        from tilecore.passes.pipeline import map_expr, substitute

        lay = getattr(st, "shared_layouts", {}).get(id(buf))
        if lay is not None and len(indices) >= 2:
            flat = binary("add", binary("mul", self._row_major(indices[:-2], buf.shape[:-2]), lay.size),
                          lay.offset_expr(indices[-2], indices[-1]))
        else:
            flat = self._row_major(indices, buf.shape)

        def fold(x):
            if isinstance(x, BinOp) and x.op == "floormod" and isinstance(x.a, BinOp) and x.a.op == "mul":
                m = const_value(x.b)
                c = const_value(x.a.b) if const_value(x.a.b) is not None else const_value(x.a.a)
                if isinstance(m, int) and isinstance(c, int) and m > 0 and c % m == 0:
                    return const(0, x.dtype)
            if isinstance(x, BinOp) and x.op in ("xor", "bitor") and const_value(x.b) == 0:
                return x.a
            if isinstance(x, BinOp) and x.op in ("xor", "bitor") and const_value(x.a) == 0:
                return x.b
            return None

        flat = simplify(map_expr(simplify(flat), fold))
        names = free_vars(flat)
        for v in reversed(st.unrolled):
            if not any(x is v for x in names):
                continue
            base = simplify(map_expr(simplify(substitute(flat, {id(v): const(0, v.dtype)})), fold))
            step = simplify(map_expr(simplify(binary("sub", flat, base)), fold))
            if all(x is v for x in free_vars(step)) and not any(x is v for x in free_vars(base)):
                return base, step
            return None
        return None

    #: pass config: ``x % 2^n`` and ``x / 2^n`` (floor) of a value the loops show nonnegative as ``x & (2^n - 1)``
    #: and ``x >> n`` (D59; "auto", the default: in kernels with a gemm reading registers, FlashAttention's form,
    #: where the H200 measured +0.2-1.0% non-causal, +2.1-2.9% causal): a pipelined loop's stage and barrier
    #: parity without the 64-bit signed division sequences (about 15 instructions an iteration)
    NONNEG_OPTION = "tilecore.cuda.nonnegative_index_shifts"

    def nonneg_shifts(self, st) -> bool:
        """tilecore.cuda.nonnegative_index_shifts: True / False as asked; "auto" as D59 / D62 say (:meth:`_auto_option`)
        and (D68) in a launch of mma.sync k steps on a target without wgmma (st.mma_sync_steps): there the ldmatrix
        addresses' 64-bit signed floor divisions, hoisted out of the loop, held FlashAttention's registers (252 and a
        stack at 128x128; 223 without, its k steps then unrolled)."""
        if self._auto_option(st, self.NONNEG_OPTION, gemm=True):
            return True
        return st.ctx.option(self.NONNEG_OPTION, "auto") == "auto" and bool(getattr(st, "mma_sync_steps", False))

    def nonnegative(self, st, e) -> bool:
        """Whether ``e`` is at least 0 wherever it is evaluated: a constant, a variable of an enclosing loop
        (its start a constant) plus a constant no smaller than minus that start, sums, products, quotients
        and remainders by positive constants of such values."""
        c = const_value(e)
        if isinstance(c, int):
            return c >= 0
        starts = st.nonneg
        if isinstance(e, ThreadIndex):
            return True
        if isinstance(e, Var):
            return any(v is e and lo >= 0 for v, lo in starts)
        if isinstance(e, BinOp) and e.op == "add":
            for x, y in ((e.a, e.b), (e.b, e.a)):
                k = const_value(y)
                if isinstance(x, Var) and isinstance(k, int):
                    return any(v is x and lo + k >= 0 for v, lo in starts)
            return self.nonnegative(st, e.a) and self.nonnegative(st, e.b)
        if isinstance(e, BinOp) and e.op in ("mul", "floordiv", "floormod", "div"):
            k = const_value(e.b)
            return (self.nonnegative(st, e.a) and self.nonnegative(st, e.b)) if e.op == "mul" else \
                (isinstance(k, int) and k > 0 and self.nonnegative(st, e.a))
        return False

    #: pass config: ``#pragma unroll`` on the core's matrix-unit k-step loops (kind "unroll", a constant count, a
    #: MatrixOp inside), which NVRTC leaves rolled for mma.sync (their ldmatrix are asm volatile): True on every such
    #: loop; "registers" only where the step indexes a register array (an A operand from a fragment, FlashAttention's
    #: P: rolled, that array goes to local memory; unrolling every loop of that kernel spills); False none; "auto"
    #: (the default): on targets without wgmma, a launch's one k-step loop where it has one gemm (measured +13% on
    #: the mma.sync GEMM; FlashAttention's two unrolled spilled, 0.46x), else none (D63)
    UNROLL_STEPS_OPTION = "tilecore.cuda.unroll_matrix_steps"

    @staticmethod
    def _indexes_registers(loop) -> bool:
        """A load or store of a ``register`` buffer inside ``loop`` whose index uses the loop's variable."""
        hit: list = []

        def uses(e):
            walk_expr(e, lambda x: hit.append(1) if x is loop.var else None)

        def expr(e):
            walk_expr(e, lambda x: [uses(i) for i in x.indices]
                      if isinstance(x, BufferLoad) and x.buffer.scope == "register" else None)

        def look(x):
            for e in stmt_exprs(x):
                expr(e)
            if isinstance(x, Store) and x.buffer.scope == "register":
                for i in x.indices:
                    uses(i)

        walk(loop.body, look)
        return bool(hit)

    @classmethod
    def _start_floor(cls, e):
        """A constant no larger than ``e``: ``e`` itself if constant, ``c`` for ``max(x, c)`` (D74: the masked iterations'
        loop starts at ``max(E, 1)``); else None."""
        c = const_value(e)
        if isinstance(c, int) and not isinstance(c, bool):
            return c
        if isinstance(e, BinOp) and e.op == "max":
            lo = [x for x in (cls._start_floor(e.a), cls._start_floor(e.b)) if x is not None]
            return max(lo) if lo else None
        return None

    def stmt_For(self, st, s):
        """Loops as the C family spells them; an unrolled loop of a constant count is remembered while its body
        is emitted (desc_split), and with tilecore.cuda.nonnegative_index_shifts a loop whose start is a
        constant (its variable is at least that start inside it)."""
        unrolled = s.kind == "unroll" and const_value(s.extent) is not None
        ctx = getattr(st, "ctx", None)
        if unrolled and ctx is not None and collect(s.body, MatrixOp):
            how = ctx.option(self.UNROLL_STEPS_OPTION, "auto")
            if how == "auto":
                how = (getattr(st, "matrix_loops", 0) == 1 and not ctx.capabilities.feature("wgmma")
                       and not any(m.spelling.startswith("wgmma_") for m in collect(s.body, MatrixOp)))
            if how is True or how == "registers" and self._indexes_registers(s):
                self.line(st, "#pragma unroll")
        lo = self._start_floor(s.start)
        nonneg = ctx is not None and self.nonneg_shifts(st) and isinstance(lo, int)
        if unrolled:
            if not hasattr(st, "unrolled"):
                st.unrolled = []
            st.unrolled.append(s.var)
        if nonneg:
            if not getattr(st, "nonneg", None):
                st.nonneg = []
            st.nonneg.append((s.var, lo))
        try:
            if not unrolled and ctx is not None and self._narrow_counter(st, s):
                return self._narrow_for(st, s)
            return super().stmt_For(st, s)
        finally:
            if unrolled:
                st.unrolled.pop()
            if nonneg:
                st.nonneg.pop()

    #: pass config (D66): a loop (a 64-bit counter: the index type) whose start and end are 32-bit values (constants in int's range, int32
    #: expressions) counts with a 32-bit counter, its variable a 64-bit copy of it (``for (int k_n = ...) { const
    #: long long k = k_n;``): the same values in the body, the increment and the test on 32 bits (FlashAttention's
    #: main loop: UIADD3.X and UISETP.EX an iteration, 64-bit slot and parity arithmetic). "auto": in kernels with a
    #: gemm reading registers, as D59's options; True: every such loop; False (the default): none
    NARROW_COUNTER_OPTION = "tilecore.cuda.narrow_loop_counters"
    NARROW_COUNTER_DEFAULT = False

    @staticmethod
    def _int32_valued(e) -> bool:
        c = const_value(e)
        if isinstance(c, bool):
            return False
        if isinstance(c, int):
            return -2 ** 31 <= c < 2 ** 31
        return str(getattr(e, "dtype", "")) in ("int32", "int16", "int8", "uint8", "uint16")

    def _narrow_counter(self, st, s) -> bool:
        if self.loop_type(s.var) != "long long" or s.kind in ("parallel", "vectorized"):
            return False
        if not self._auto_option(st, self.NARROW_COUNTER_OPTION, default=self.NARROW_COUNTER_DEFAULT):
            return False
        end = simplify(binary("add", s.start, s.extent))
        return self._int32_valued(s.start) and self._int32_valued(end)

    def _narrow_for(self, st, s) -> None:
        v = self.name(st, s.var)
        n = self.name(st, Var(f"{v}_n", "int32"))  # a fresh identifier (names are told apart by identity)
        start = self.expr(st, s.start)
        end = self.expr(st, simplify(binary("add", s.start, s.extent)))
        self.line(st, f"for (int {n} = {start}; {n} < {end}; ++{n}) {{")
        st.indent += 1
        self.line(st, f"const {self.loop_type(s.var)} {v} = {n};")
        self.stmt(st, s.body)
        st.indent -= 1
        self.line(st, "}")

    #: pass config (D60 in the register programs, D61 here): a run of register divisions by shared divisors,
    #: FlashAttention's ``O[i, j] = O[i, j] / l[i]``, as div.rn.f32's fast path with the reciprocal once a divisor
    ROW_DIVISION_OPTION = "tilecore.cuda.row_division"

    def stmt_Seq(self, st, s: Seq):
        """Statements in order; in the exact build (``tilecore.cuda.row_division``, on by default) a run of
        register divisions sharing divisors (:meth:`division_runs`) is spelled by :meth:`row_divide`."""
        runs = self.division_runs(st, s.body)
        k = 0
        while k < len(s.body):
            run = runs.get(k)
            if run is not None:
                end, binds, stores = run
                for b in binds:
                    self.stmt(st, b)
                self.row_divide(st, stores)
                k = end
                continue
            if (isinstance(s.body[k], MatrixLoad) and k + 1 < len(s.body) and isinstance(s.body[k + 1], MatrixLoad)
                    and self.ldmatrix_pair(st, s.body[k], s.body[k + 1])):
                k += 2
                continue
            self.stmt(st, s.body[k])
            k += 1

    def division_runs(self, st, body: list) -> dict:
        """``{start: (end, binds, stores)}``: maximal runs of ``body`` made of stores ``F[c] = F[c] / R[k]`` (``F``
        and ``R`` float32 register arrays, every index a constant, ``R`` not written in the run, each element of
        ``F`` written once) and of index binds that read no buffer (the fragment lowering's per-element
        coordinates), where some divisor is shared by two stores or more; none in fast math (its ``/`` is not
        div.rn) or with the option off. The core's lowering of a ``T.Parallel`` nest over a fragment leaves
        FlashAttention's epilogue in this form."""
        ctx = getattr(st, "ctx", None)
        if st_fast(st) or ctx is None or not body:
            return {}
        if not any(isinstance(x, Store) and isinstance(x.value, BinOp) and x.value.op == "div" for x in body):
            return {}
        from ._lean import ROW_DIVISION_DEFAULT

        if not ctx.option(self.ROW_DIVISION_OPTION, ROW_DIVISION_DEFAULT):
            return {}

        def element(e):
            if not (isinstance(e, BufferLoad) and e.buffer.scope == "register" and str(e.buffer.dtype) == "float32"):
                return None
            idx = tuple(const_value(i) for i in e.indices)
            return (id(e.buffer), idx) if all(isinstance(i, int) for i in idx) else None

        def division(x):
            """(dividend's key, divisor's key, dividend, divisor) of ``F[c] = F[c] / R[k]``; else None."""
            if not (isinstance(x, Store) and isinstance(x.value, BinOp) and x.value.op == "div"
                    and str(x.value.dtype) == "float32"):
                return None
            a, r = element(x.value.a), element(x.value.b)
            if a is None or r is None or x.value.a.buffer is not x.buffer or a[1] != tuple(
                    const_value(i) for i in x.indices):
                return None
            return a, r, x.value.a, x.value.b

        runs: dict = {}
        k = 0
        while k < len(body):
            start, binds, stores, written, stored, divided = k, [], [], set(), set(), set()
            while k < len(body):
                x = body[k]
                if isinstance(x, Bind) and not collect(x.value, BufferLoad):
                    binds.append(x)
                    k += 1
                    continue
                d = division(x)
                # each element written once; no divisor's array written in the run (its reciprocal comes first)
                if d is None or d[0] in written or d[1][0] in stored or d[0][0] in divided or d[1][0] == d[0][0]:
                    break
                stores.append(d)
                written.add(d[0])
                stored.add(d[0][0])
                divided.add(d[1][0])
                k += 1
            if len(stores) > len({d[1] for d in stores}):
                runs[start] = (k, binds, stores)
            elif k == start:
                k += 1
        return runs

    def row_divide(self, st, stores: list) -> None:
        """The divisions of a run (:meth:`division_runs`) with div.rn.f32's own fast path (``prelude/tc_div_row.cuh``,
        D60: the reciprocal's MUFU.RCP and Newton step once a divisor, three FFMA an element) where every
        dividend and divisor of the thread lies in [2^-40, 2^40] in magnitude, where that path's result is the
        correctly rounded quotient; the divisions as written otherwise: the same bits. ptxas emits each ``/`` as
        its own region (MUFU.RCP, FCHK, a branch to the slow path's CALL), one after another. The test is the
        thread's own (the run may sit under any control flow), not the warp's vote of the register programs."""
        divs: dict = {}
        for _, rk, _, r in stores:
            divs.setdefault(rk, (f"tc_dr{len(divs)}", self.expr(st, r)))
        self.line(st, "{")
        st.indent += 1
        self.line(st, "bool tc_dk = true;")
        for name, r in divs.values():
            self.line(st, f"const float {name} = tc_div_rcp({r}); tc_dk = tc_dk & tc_div_safe({r});")
        for _, _, a, _ in stores:
            self.line(st, f"tc_dk = tc_dk & tc_div_safe({self.expr(st, a)});")
        self.line(st, "if (tc_dk) {")
        st.indent += 1
        for _, rk, a, _ in stores:
            name, r = divs[rk]
            self.line(st, f"{self.expr(st, a)} = tc_div_fast({self.expr(st, a)}, {r}, {name});")
        st.indent -= 1
        self.line(st, "} else {")
        st.indent += 1
        for _, rk, a, _ in stores:
            self.line(st, f"{self.expr(st, a)} = ({self.expr(st, a)} / {divs[rk][1]});")
        st.indent -= 1
        self.line(st, "}")
        st.indent -= 1
        self.line(st, "}")

    def stmt_MatrixOp(self, st, s):
        if not s.spelling.startswith("wgmma_"):
            return super().stmt_MatrixOp(st, s)
        from .hopper import wgmma_struct

        n = int(s.spelling.split("n")[-1].split("k")[0])
        dtype = str((s.b_origin.buffer if s.b_origin is not None else s.b).dtype)
        a_regs = s.a_origin is None
        name, text = wgmma_struct(dtype, n, not s.attrs["b_trans"], a_regs,
                                  trans_a=bool(s.attrs.get("a_trans")) and not a_regs)
        if not hasattr(st, "wgmma_structs"):
            st.wgmma_structs = {}
        st.wgmma_structs.setdefault(name, text)
        d = f"*reinterpret_cast<float(*)[{n // 2}]>(&{self.name(st, s.c)}[{s.c_offset}])"
        if a_regs:
            a = self.name(st, s.a)
            av = ", ".join(f"tc_pack_bits({a}[{s.a_offset + 2 * i}], {a}[{s.a_offset + 2 * i + 1}])" for i in range(4))
        else:
            av = self.wgmma_desc(st, s, "a")
        self.line(st, f"{name}::run({d}, {av}, {self.wgmma_desc(st, s, 'b')});")

    def stmt_MatrixSync(self, st, s: MatrixSync):
        """Around one gemm's wgmma instructions: before, the threads' shared-memory writes are fenced into the
        async proxy and the block meets (the tiles are whole), then ``wgmma.fence``; after, one commit group
        and a wait for it (or for all but ``pending`` groups). The accumulators are fenced so the compiler
        keeps their uses on the right side."""
        if not s.spelling.startswith("wgmma_"):
            raise CompileError(f"internal: the matrix unit {s.spelling} has no synchronization spelling", s.span)
        if s.phase == "pin":  # D59: registers the unit reads next, written: kept in the form it reads
            text = self.operand_fences(st, s, pin=True).strip()
            if text:
                self.line(st, text)
            return
        n = int(const_value(simplify(s.acc.numel())))
        regs = f"tc_wg_fence_regs<{n}>({self.name(st, s.acc)});"
        if s.phase == "begin":
            regs += self.operand_fences(st, s)
        if s.phase == "begin" and not s.meet:  # no thread wrote what it reads (thread distribution proved)
            self.line(st, f"{regs} tc_wg_fence();")
        elif s.phase == "begin":
            # right after a barrier of the threads (only scopes opened since): the fence goes before it
            barrier = self.barrier_text(st, getattr(st, "consumers", 0))
            for i in range(len(st.lines) - 1, -1, -1):
                if st.lines[i].strip() == "{":
                    continue
                if st.lines[i].strip() == barrier:
                    st.lines[i] = st.lines[i].replace(barrier, f"tc_wg_fence_proxy(); {barrier}")
                    self.line(st, f"{regs} tc_wg_fence();")
                    return
                break
            self.line(st, f"{regs} tc_wg_fence_proxy(); {barrier} tc_wg_fence();")
        elif s.phase == "end" and s.pending < 0:  # commit only: a wait follows (a turn passed between, D55)
            self.line(st, "tc_wg_commit();")
        else:  # "end" closes the gemm's group; "wait" only waits (after a loop that left one pending)
            commit = "tc_wg_commit(); " if s.phase == "end" else ""
            self.line(st, f"{commit}tc_wg_wait<{int(s.pending)}>(); {regs}")

    #: pass config: before a gemm's ``wgmma.fence``, its 16-bit A operand registers pinned as the packed pairs
    #: the instruction reads (D59; default off): the conversions that write them (FlashAttention's P) then come
    #: before the fence, as in the register programs, not between the wgmma instructions, where ptxas fenced
    #: and closed a group before each one (WARPGROUP.ARRIVE and gsb0 on each of P @ V's 8 HGMMA)
    OPERAND_FENCE_OPTION = "tilecore.cuda.fence_register_operands"

    def operand_fences(self, st, s, pin: bool = False) -> str:
        """The fences of ``s.reads`` (tilecore.cuda.fence_register_operands): before a gemm's wgmma.fence, the
        pairs pinned where they are (or, where a "pin" came before in the kernel, unpacked from the packed copy
        it made); at a "pin" (the rotated loop's end, D59), the pairs packed into ``<name>_pk``, declared at the
        kernel's top, so the loop carries P as the 32-bit registers the instruction reads."""
        ctx = getattr(st, "ctx", None)
        if ctx is None or not self._auto_option(st, self.OPERAND_FENCE_OPTION):
            return ""
        out = ""
        pinned = getattr(st, "pinned_pairs", None)
        if pinned is None:
            pinned = st.pinned_pairs = set()
        for buf in getattr(s, "reads", ()):
            count = const_value(simplify(buf.numel()))
            if buf.dtype.bytes == 2 and isinstance(count, int) and count % 2 == 0:
                if not hasattr(st, "wgmma_structs"):
                    st.wgmma_structs = {}
                st.wgmma_structs.setdefault("tc_wg_fence_pairs", self.FENCE_PAIRS)
                name = self.name(st, buf)
                if pin:
                    if id(buf) not in pinned:
                        pos, indent = st.warp_line
                        st.lines.insert(pos, " " * indent + f"unsigned {name}_pk[{count // 2}];")
                        pinned.add(id(buf))
                    out += f" tc_wg_pin_pairs<{count}>({name}, {name}_pk);"
                elif id(buf) in pinned:
                    out += f" tc_wg_unpin_pairs<{count}>({name}, {name}_pk);"
                else:
                    out += f" tc_wg_fence_pairs<{count}>({name});"
        return out

    #: emitted after tc_wgmma.cuh where used (so no other kernel's source changes)
    FENCE_PAIRS = """/* a 16-bit A operand in registers, pinned as the packed pairs the instruction reads (D59): their last
 * writes (conversions) stay before the wgmma.fence that follows, not between the wgmma instructions */
__device__ __forceinline__ void tc_wg_unpack(unsigned u, __half& lo, __half& hi) {
  lo = __ushort_as_half((unsigned short)(u & 0xFFFFu)); hi = __ushort_as_half((unsigned short)(u >> 16));
}
__device__ __forceinline__ void tc_wg_unpack(unsigned u, __nv_bfloat16& lo, __nv_bfloat16& hi) {
  lo = __ushort_as_bfloat16((unsigned short)(u & 0xFFFFu)); hi = __ushort_as_bfloat16((unsigned short)(u >> 16));
}
template <int N, typename T> __device__ __forceinline__ void tc_wg_fence_pairs(T* r) {
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    unsigned u = tc_pack_bits(r[i], r[i + 1]);
    asm volatile("" : "+r"(u)::"memory");
    tc_wg_unpack(u, r[i], r[i + 1]);
  }
}
/* D59: the pairs packed into pk at the rotated loop's end (carried as 32-bit registers), unpacked before the
 * next gemm's fence (the pack that follows folds away) */
template <int N, typename T> __device__ __forceinline__ void tc_wg_pin_pairs(const T* r, unsigned* pk) {
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    pk[i / 2] = tc_pack_bits(r[i], r[i + 1]);
    asm volatile("" : "+r"(pk[i / 2])::"memory");
  }
}
template <int N, typename T> __device__ __forceinline__ void tc_wg_unpin_pairs(T* r, const unsigned* pk) {
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    unsigned u = pk[i / 2];
    asm volatile("" : "+r"(u)::"memory");
    tc_wg_unpack(u, r[i], r[i + 1]);
  }
}
"""

    #: named barriers of the consumer groups' turns (0: __syncthreads, 1: the consumers' barrier)
    TURN_BARRIER = 2

    def stmt_Turn(self, st, s):
        """Turns of a warp-specialized block's consumer groups (tilecore.pingpong, D55) on named barriers: group
        ``g`` waits on barrier 2 + g (bar.sync with the other group's arrival), passes on the next group's."""
        if s.groups != 2:
            raise CompileError(f"internal: turns of {s.groups} consumer groups (the CUDA spelling has two)", s.span)
        if getattr(st, "warp_line", None) is None or s.group_threads % 32:
            raise CompileError("internal: turns outside a kernel launch's threads", s.span)
        g = f"({self.warp_index(st)} / {s.group_threads // 32})"
        n, b = 2 * s.group_threads, self.TURN_BARRIER
        text = {"take": f"tc_named_sync({b} + {g}, {n});",
                "pass": f"tc_named_arrive({b} + ({g} ^ 1), {n});",
                "init": f"if ({g} == 1) tc_named_arrive({b}, {n});",
                "fini": f"if ({g} == 0) tc_named_sync({b}, {n});"}.get(s.phase)
        if text is None:
            raise CompileError(f"internal: turn phase {s.phase!r}", s.span)
        self.line(st, text)

    @staticmethod
    def _ldmatrix_ok(s) -> bool:
        """``s`` (a MatrixLoad) is one ldmatrix: the mma.sync unit, 16-bit elements of a shared tile whose rows and
        origin column are whole 16-byte units."""
        from .units import MMA_16816

        src = s.origin.buffer
        row_len = const_value(simplify(src.shape[-1])) if len(src.shape) >= 2 else None
        return not (s.spelling != MMA_16816 or src.scope in ("global", "register") or src.dtype.bytes != 2
                    or row_len is None or row_len % 8 or s.align % 8)

    #: pass config (D68): two B operand loads of mma.sync m16n8k16 next to each other (two n8 atoms of one k step,
    #: their registers adjacent) as one ldmatrix .x4, lanes 16-31 addressing the second atom's rows (the register
    #: programs' form: half the ldmatrix of B); "auto" (the default): in launches of mma.sync k steps on a target
    #: without wgmma (st.mma_sync_steps, where it was measured); True on any target; False one .x2 each
    LDMATRIX_PAIRS_OPTION = "tilecore.cuda.ldmatrix_pairs"

    def ldmatrix_pair(self, st, s1, s2) -> bool:
        """Emit MatrixLoads ``s1``, ``s2`` as one ``ldmatrix .x4`` if they pair (see LDMATRIX_PAIRS_OPTION): B operands
        (two 8x8 matrices each) of the same tile, stored the same way, by the same lane, into consecutive registers of
        one array, the second origin a constant offset from the first; returns whether it did."""
        ctx = getattr(st, "ctx", None)
        want = None if ctx is None else ctx.option(self.LDMATRIX_PAIRS_OPTION, "auto")
        if not (want is True or want == "auto" and getattr(st, "mma_sync_steps", False)):
            return False
        if not (s1.operand == s2.operand == "b" and s1.spelling == s2.spelling and s1.trans == s2.trans
                and s1.dst is s2.dst and s1.origin.buffer is s2.origin.buffer
                and const_value(simplify(binary("sub", s2.lane, s1.lane))) == 0
                and self._ldmatrix_ok(s1) and self._ldmatrix_ok(s2)):
            return False
        n, trans, lane_rc = self.LDMATRIX[("b", s1.trans)]
        if s2.dst_offset != s1.dst_offset + 2 * n or len(s1.origin.indices) != len(s2.origin.indices):
            return False
        deltas = [const_value(simplify(binary("sub", b, a))) for a, b in zip(s1.origin.indices, s2.origin.indices)]
        if any(not isinstance(d, int) for d in deltas):
            return False
        # the .x2 addresses depend on lane % 16 only: lanes 16-31 give the second atom's the same way
        half = binary("div", s1.lane, 16)
        dr, dc = lane_rc(s1.lane)
        idx = [binary("add", i, binary("mul", half, d)) if d else i for i, d in zip(s1.origin.indices, deltas)]
        idx[-2], idx[-1] = binary("add", idx[-2], dr), binary("add", idx[-1], dc)
        src = s1.origin.buffer
        ptr = f"{self.name(st, src)} + {self.flat_index(st, src, idx)}"
        self.line(st, f"tc_ldsm_regs<{2 * n}, {'true' if trans else 'false'}>(&{self.name(st, s1.dst)}[{s1.dst_offset}], {ptr});")
        return True

    def stmt_MatrixLoad(self, st, s):
        """ldmatrix where the stored tile allows it (16-bit elements in shared memory, 16-byte rows: the
        row length and the origin's column multiples of 8 elements); the per-register loads otherwise."""
        if not self._ldmatrix_ok(s):
            return super().stmt_MatrixLoad(st, s)
        src = s.origin.buffer
        n, trans, lane_rc = self.LDMATRIX[(s.operand, s.trans)]
        dr, dc = lane_rc(s.lane)
        idx = list(s.origin.indices)
        idx[-2], idx[-1] = binary("add", idx[-2], dr), binary("add", idx[-1], dc)
        ptr = f"{self.name(st, src)} + {self.flat_index(st, src, idx)}"
        self.line(st, f"tc_ldsm_regs<{n}, {'true' if trans else 'false'}>(&{self.name(st, s.dst)}[{s.dst_offset}], {ptr});")

    # -- asynchronous copies (tilecore.plan_pipelines) --------------------------------------------------
    def stmt_AsyncCopy(self, st, s: AsyncCopy):
        """``cp.async`` of the run's bytes (``.cg`` for 16, ``.ca`` for 4 and 8); a false predicate copies
        0 source bytes, which zero-fills the destination, from the tensor's start."""
        nbytes = s.elements * s.dst.dtype.bytes
        if nbytes not in (4, 8, 16):
            raise CompileError(f"internal: an asynchronous copy of {nbytes} bytes has no cp.async form", s.span)
        dst = f"{self.name(st, s.dst)} + {self.flat_index(st, s.dst, s.dst_indices)}"
        src = f"{self.name(st, s.src)} + {self.flat_index(st, s.src, s.src_indices)}"
        call = "tc_cp_async16" if nbytes == 16 else f"tc_cp_async_ca<{nbytes}>"
        if const_value(s.pred) == 1:
            self.line(st, f"{call}({dst}, {src}, {nbytes});")
            return
        self.line(st, f"{{ const bool tc_p = {self.expr(st, s.pred)}; "
                      f"{call}({dst}, tc_p ? {src} : {self.name(st, s.src)}, tc_p ? {nbytes} : 0); }}")

    # -- bulk tile copies on transaction barriers (tilecore.plan_pipelines, feature:bulk_tensor_copy) -----
    def bar_addr(self, st, bar, index) -> str:
        return f"tc_smem_addr({self.name(st, bar)} + ({self.expr(st, simplify(index))}))"

    def stmt_BulkCopy(self, st, s: BulkCopy):
        """One TMA tile load per panel (``cp.async.bulk.tensor``, the panel's swizzle in the tensor map),
        completing on the stage's mbarrier."""
        lay, es = s.layout, s.dst.dtype.bytes
        name = st.bulk_maps[self.bulk_key(s)]
        zero = (const(0), const(0))
        base = f"tc_smem_addr({self.name(st, s.dst)}) + (unsigned)({self.flat_index(st, s.dst, tuple(s.dst_indices) + zero)}) * {es}u"
        coords = [f"(int)({self.expr(st, simplify(e))})" for e in reversed(s.starts)]
        bar = self.bar_addr(st, s.barrier, s.index)
        panels = lay.cols // lay.panel_elems if lay.panels else 1
        g = int(getattr(s, "multicast", 1) or 1)
        if g > 1:  # D80: this block's 1/g of the panels, into every block of the cluster
            if panels % g or len(coords) not in (2, 3):
                raise CompileError(f"a bulk copy into {s.dst.name} shared by a block group of {g}: CUDA splits its "
                                   f"{panels} panel(s) among the group's blocks and multicasts 2- or 3-dimensional "
                                   f"boxes (this one has {len(coords)})", s.span)
            per = panels // g
            st.group_copies = True
            self.line(st, "{")
            self.line(st, f"  const int tc_gp = (int)tc_group_rank() * {per};")
            for q in range(per):
                p = f"(tc_gp + {q})" if q else "tc_gp"
                c = [f"{coords[0]} + {p} * {lay.panel_elems}"] + coords[1:]
                dst = f"{base} + (unsigned)({p}) * {lay.rows * lay.swizzle_bytes}u"
                self.line(st, f"  tc_tma_load_group_{len(coords)}d({dst}, &{name}, {bar}, (unsigned short){(1 << g) - 1}, "
                              f"{', '.join(c)});")
            self.line(st, "}")
            return
        for p in range(panels):
            c = [f"{coords[0]} + {p * lay.panel_elems}" if p else coords[0]] + coords[1:]
            dst = f"{base} + {p * lay.rows * lay.swizzle_bytes}u" if p else base
            self.line(st, f"tc_tma_load_{len(coords)}d({dst}, &{name}, {bar}, {', '.join(c)});")

    def stmt_BulkStore(self, st, s: BulkStore):
        """One TMA tile store per panel (``cp.async.bulk.tensor ... global.shared::cta.bulk_group``, the panel's
        swizzle in C's tensor map; TMA writes nothing outside C), then one commit of the thread's bulk group."""
        lay, es = s.layout, s.src.dtype.bytes
        name = st.bulk_maps[self.store_key(s)]
        base = f"tc_smem_addr({self.name(st, s.src)})"
        coords = [f"(int)({self.expr(st, simplify(e))})" for e in reversed(s.starts)]
        if s.cells is not None:  # cells first .. end - 1 of rows x one panel, panel-major (D78): a run-time loop
            rows = int(s.cells[2])
            bands = lay.rows // rows
            first, end = (f"(int)({self.expr(st, simplify(e))})" for e in s.cells[:2])
            self.line(st, f"for (int tc_c = {first}; tc_c < {end}; ++tc_c) {{")
            c = [f"{coords[0]} + (tc_c / {bands}) * {lay.panel_elems}",
                 f"{coords[1]} + (tc_c % {bands}) * {rows}"] + coords[2:]
            src = f"{base} + (unsigned)(tc_c / {bands}) * {lay.rows * lay.swizzle_bytes}u + " \
                  f"(unsigned)(tc_c % {bands}) * {rows * lay.swizzle_bytes}u"
            self.line(st, f"  tc_tma_store_{len(coords)}d(&{name}, {src}, {', '.join(c)});")
            self.line(st, "}")
            self.line(st, "tc_bulk_commit();")
            return
        if s.panels is not None:  # some of the panels, from a run-time first one (D75)
            first = f"(int)({self.expr(st, simplify(s.panels[0]))})"
            for p in range(int(s.panels[1])):
                q = f"({first} + {p})"
                c = [f"{coords[0]} + {q} * {lay.panel_elems}"] + coords[1:]
                src = f"{base} + (unsigned)({q}) * {lay.rows * lay.swizzle_bytes}u"
                self.line(st, f"tc_tma_store_{len(coords)}d(&{name}, {src}, {', '.join(c)});")
            self.line(st, "tc_bulk_commit();")
            return
        for p in range(lay.cols // lay.panel_elems):
            c = [f"{coords[0]} + {p * lay.panel_elems}" if p else coords[0]] + coords[1:]
            src = f"{base} + {p * lay.rows * lay.swizzle_bytes}u" if p else base
            self.line(st, f"tc_tma_store_{len(coords)}d(&{name}, {src}, {', '.join(c)});")
        self.line(st, "tc_bulk_commit();")

    def stmt_BulkStoreWait(self, st, s):
        self.line(st, f"tc_bulk_wait{'_read' if s.read else ''}<{int(s.pending)}>();")

    #: the block group's barrier (D75): PTX's cluster barrier, by phase and order
    group_barriers = {("arrive", "release"): "barrier.cluster.arrive.release.aligned;",
                      ("arrive", "relaxed"): "barrier.cluster.arrive.relaxed.aligned;",
                      ("wait", "acquire"): "barrier.cluster.wait.acquire.aligned;"}

    def stmt_GroupBarrier(self, st, s):
        phases = [("arrive", "release"), ("wait", "acquire")] if s.phase == "sync" else [(s.phase, s.order)]
        for p in phases:
            self.line(st, f'asm volatile("{self.group_barriers[p]}\\n" ::: "memory");')

    #: a peer store's element types: (PTX type, asm constraint, C conversion of the value)
    peer_types = {"float32": ("f32", "f", "{}"), "int32": ("s32", "r", "{}"), "uint32": ("u32", "r", "{}"),
                  "float64": ("f64", "d", "{}")}

    def stmt_PeerStore(self, st, s):
        """``mapa`` (this block's address of the element -> the group peer's) and ``st.shared::cluster`` of 1, 2 or 4
        consecutive elements (D75)."""
        dt = str(s.buffer.dtype)
        if dt not in self.peer_types or len(s.values) not in (1, 2, 4) or \
                len(s.values) * s.buffer.dtype.bytes > 16:
            raise CompileError(f"a store into a group peer's {s.buffer.name} of {len(s.values)} {dt}: CUDA stores "
                               f"1, 2 or 4 elements of {', '.join(self.peer_types)} (up to 16 bytes)", s.span)
        ptx, con, conv = self.peer_types[dt]
        n = len(s.values)
        ref = self.element(st, s.buffer, s.indices)
        vals = [conv.format(self.expr(st, v)) for v in s.values]
        regs = ", ".join(f"%{i + 2}" for i in range(n))
        vec = f".v{n}" if n > 1 else ""
        operand = f"{{{regs}}}" if n > 1 else regs
        ins = ", ".join([f'"r"(tc_smem_addr(&{ref}))', f'"r"((unsigned)({self.expr(st, s.rank)}))'] +
                        [f'"{con}"({v})' for v in vals])
        if s.barrier is not None:  # completes on the peer's transaction barrier: st.async ... complete_tx::bytes
            bar = self.bar_addr(st, s.barrier, s.barrier_index)
            regs = ", ".join(f"%{i + 3}" for i in range(n))
            operand = f"{{{regs}}}" if n > 1 else regs
            ins = ", ".join([f'"r"(tc_smem_addr(&{ref}))', f'"r"((unsigned)({self.expr(st, s.rank)}))', f'"r"({bar})'] +
                            [f'"{con}"({v})' for v in vals])
            self.line(st, f'asm volatile("{{\\n .reg .b32 tc_pa, tc_pb;\\n mapa.shared::cluster.u32 tc_pa, %0, %1;\\n '
                          f'mapa.shared::cluster.u32 tc_pb, %2, %1;\\n st.async.shared::cluster.mbarrier::complete_tx::bytes'
                          f'{vec}.{ptx} [tc_pa], {operand}, [tc_pb];\\n}}" :: {ins} : "memory");')
            return
        self.line(st, f'asm volatile("{{\\n .reg .b32 tc_pa;\\n mapa.shared::cluster.u32 tc_pa, %0, %1;\\n '
                      f'st.shared::cluster{vec}.{ptx} [tc_pa], {operand};\\n}}" :: {ins} : "memory");')

    def stmt_BulkFence(self, st, s):
        self.line(st, "tc_fence_proxy_async();")

    #: four 8x8 matrices a warp by stmatrix (tilecore.matrix_stores, plugin API 1.10, D51)
    matrix_stores = True

    def stmt_MatrixStore(self, st, s):
        """``stmatrix.sync.aligned.m8n8.x4.shared.b16``: each lane's four pairs packed as the VectorStore packs
        them (the conversion takes the value before its rounding cast), at the address of its row."""
        dt = str(s.buffer.dtype)
        pack = self.vector_pack.get(dt)
        if pack is None or len(s.values) != 8 or s.buffer.scope != "shared":
            return super().stmt_MatrixStore(st, s)
        vals = [self.expr(st, v.value if isinstance(v, Cast) and str(v.dtype) == dt and
                          str(v.value.dtype) == "float32" else v) for v in s.values]
        regs = ", ".join(f"tc_stsm_u32({pack[1].format(vals[k], vals[k + 1])})" for k in range(0, 8, 2))
        ref = self.matrix_store_ref(st, s) or self.element(st, s.buffer, s.indices)
        self.line(st, f"tc_stsm_x4(tc_smem_addr(&{ref}), {regs});")

    #: pass config (D65): the matrix stores of one per-thread block into one tile addressed from the first one's
    #: element offset, computed once: each later one at ``(first ^ X) + Y`` for constants X, Y checked for every thread
    #: of the block (a swizzled tile's column step flips bits of the 16-byte unit, a panel step adds); True (default);
    #: False: each store computes its whole offset (before D65)
    MATRIX_STORE_OFFSETS_OPTION = "tilecore.cuda.matrix_store_offsets"

    def matrix_store_ref(self, st, s) -> str | None:
        """The element a :class:`MatrixStore` names, from the block's first matrix store into the same tile where
        its offset is that one's ``(first ^ X) + Y`` for every thread (``tilecore.cuda.matrix_store_offsets``); the
        first declares ``tc_msN``. None: the element as the C family spells it."""
        ctx = getattr(st, "ctx", None)
        threads = getattr(self, "_block_threads", 0)
        if ctx is None or ctx.option(self.MATRIX_STORE_OFFSETS_OPTION, True) is False or threads <= 0 \
                or len(s.indices) != 2:
            return None
        import numpy as np

        t = np.arange(threads, dtype=np.int64)
        lay = getattr(st, "shared_layouts", {}).get(id(s.buffer))
        flat = lay.offset_expr(s.indices[0], s.indices[1]) if lay is not None else \
            self._row_major(s.indices, s.buffer.shape)
        off = thread_values(flat, t, {})
        if off is None:
            return None
        buf = self.name(st, s.buffer)
        if not hasattr(st, "matrix_store_bases"):
            st.matrix_store_bases = {}
        bases = st.matrix_store_bases
        base = bases.get(id(s.buffer))
        if base is not None and self._in_scope(st, base[2]):
            name, first, _decl = base
            fit = _fit_offset(first, off)
            if fit is not None:
                x, y = fit
                e = f"({name} ^ {x})" if x else name
                return f"{buf}[{e} + {y}]" if y else f"{buf}[{e}]"
        st.matrix_store_count = getattr(st, "matrix_store_count", 0) + 1
        name = f"tc_ms{st.matrix_store_count - 1}"
        decl = f"const int {name} = {self.flat_index(st, s.buffer, s.indices)};"
        self.line(st, decl)
        bases[id(s.buffer)] = (name, off, "  " * st.indent + decl)
        return f"{buf}[{name}]"

    @staticmethod
    def _in_scope(st, decl: str) -> bool:
        """The line ``decl`` was emitted in a scope still open: no line since has a smaller indent."""
        depth = len(decl) - len(decl.lstrip(" "))
        for ln in reversed(st.lines):
            if ln == decl:
                return True
            if ln.strip() and len(ln) - len(ln.lstrip(" ")) < depth:
                return False
        return False

    def stmt_CopyBarrierInit(self, st, s):
        n = int(const_value(simplify(s.barrier.numel())))
        self.line(st, f"for (int tc_i = 0; tc_i < {n}; ++tc_i) tc_mbar_init(tc_smem_addr({self.name(st, s.barrier)} + tc_i), "
                      f"{int(s.count)});")
        self.line(st, 'asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");')

    def stmt_CopyBarrierArrive(self, st, s):
        self.line(st, f"tc_mbar_expect_tx({self.bar_addr(st, s.barrier, s.index)}, {int(s.bytes)}u);")

    def stmt_CopyBarrierWait(self, st, s):
        self.line(st, f"tc_mbar_wait({self.bar_addr(st, s.barrier, s.index)}, {self.expr(st, simplify(s.parity))});")

    def stmt_If(self, st, s):
        """As the C family; after the issuing thread's block holding its wait for a stage's release (D62:
        tilecore.pipeline_release_stages, no block barrier in the loop) its warp reconverges (``__syncwarp``), so
        the compiler keeps the loop's warp-uniform values (stage slots, descriptors) in the uniform datapath."""
        super().stmt_If(st, s)
        if s.orelse is None and any(getattr(w, "issuer", False) for w in collect(s.then, CopyBarrierWait)) \
                and _reads_thread_index(s.cond):
            self.line(st, "__syncwarp();")

    def stmt_StageRelease(self, st, s):
        g = int(getattr(s, "group", 1) or 1)
        if g == 1:
            self.line(st, f"tc_mbar_arrive({self.bar_addr(st, s.barrier, s.index)});")
            return
        # D80: released in every block of the cluster: this thread on its own block's barrier, a lane a warp for the
        # warp on each other block's (mbarrier.arrive with a count)
        st.group_copies = True
        self.line(st, "{")
        self.line(st, f"  const unsigned tc_rb = {self.bar_addr(st, s.barrier, s.index)};")
        self.line(st, "  tc_mbar_arrive(tc_rb);")
        if g == 2:
            self.line(st, "  tc_mbar_arrive_peer_warp(tc_rb, tc_group_rank() ^ 1u);")
        else:
            self.line(st, f"  for (unsigned tc_r = 1; tc_r < {g}u; ++tc_r) "
                          f"tc_mbar_arrive_peer_warp(tc_rb, (tc_group_rank() + tc_r) % {g}u);")
        self.line(st, "}")

    # -- warp-specialized blocks: the producer group gives its registers to the consumers (setmaxnreg) -----
    def consumer_regs(self, s) -> int | None:
        """Registers per consumer thread after the producer group drops to PRODUCER_REGS, or None where that
        gains nothing: with fewer than 384 threads a thread may already hold 255 (launch bounds, one block per
        multiprocessor)."""
        producers = int(s.consumers and (self._block_threads - s.consumers))
        if self._block_threads < 384 or producers % 128:
            return None
        return min(256, (self.REGISTER_FILE - self.PRODUCER_REGS * producers) // s.consumers // REGISTER_UNIT
                   * REGISTER_UNIT)

    def producer_entry(self, st, s):
        if self.consumer_regs(s):
            self.line(st, f'asm volatile("setmaxnreg.dec.sync.aligned.u32 {self.PRODUCER_REGS};\\n");')

    def consumer_entry(self, st, s):
        regs = self.consumer_regs(s)
        if regs:
            self.line(st, f'asm volatile("setmaxnreg.inc.sync.aligned.u32 {regs};\\n");')

    def stmt_KernelLaunch(self, st, s):
        self._block_threads = int(const_value(simplify(s.threads[0]))) if len(s.threads) == 1 else 0
        st.warp_line, st.warp_declared = None, False
        # D59: a launch whose gemm reads registers the threads write (FlashAttention's P @ V): the uniform warp
        # index and the operand fence by default (measured there; the other kernels' sources as before)
        st.register_operands = any(x.reads for x in self.collected(st, s.body, MatrixSync))
        # D62: a persistent launch (tilecore.persistent's tile loop) of wgmma gemms on shared tiles (the GEMM the
        # plugin's pipeline runs): the uniform warp index and the shifts by default too (H200, 128x128x64/4 panel 8:
        # 0.87-0.95x the plugin without them, 0.97-1.04x with them, 16 rows over four processes; 128x256x64/3 and /4
        # within the noise, means +1.0% / 0.0%)
        st.persistent_gemm = bool(s.attrs.get("persistent")) and not st.register_operands and \
            any(m.spelling.startswith("wgmma_") for m in self.collected(st, s.body, MatrixSync))
        # D63: the launch's matrix-unit k-step loops (tilecore.cuda.unroll_matrix_steps "auto": one of them)
        st.matrix_loops = sum(1 for f in self.collected(st, s.body, For) if f.kind == "unroll" and collect(f.body, MatrixOp))
        # D68: a launch of mma.sync k steps (a target without wgmma): the index shifts by default there
        ctx = getattr(st, "ctx", None)
        st.mma_sync_steps = bool(st.matrix_loops) and ctx is not None and not ctx.capabilities.feature("wgmma") \
            and not any(m.spelling.startswith("wgmma_") for m in self.collected(st, s.body, MatrixOp))
        # D66: the longest unrolled k loop of wgmma instructions (tilecore.cuda.descriptor_offsets "auto": 16 or more)
        st.wgmma_k_steps = max((int(const_value(f.extent)) for f in self.collected(st, s.body, For)
                                if f.kind == "unroll" and isinstance(const_value(f.extent), int)
                                and any(m.spelling.startswith("wgmma_") for m in collect(f.body, MatrixOp))), default=0)
        # D74: the 32-bit words a thread the launch's asynchronous gemms carry (accumulators and register operands;
        # tilecore.cuda.descriptor_offsets "fit")
        st.carried_words = self.carried_words(st, s) if st.register_operands else 0
        return super().stmt_KernelLaunch(st, s)

    def carried_words(self, st, launch) -> int:
        """32-bit registers a thread of the accumulators and the register operands of the launch's asynchronous gemms
        (each buffer once): at FlashAttention's d128 128x128, S (64) + O (64) + P in halves (32) = 160."""
        seen, words = set(), 0
        for m in self.collected(st, launch.body, MatrixSync):
            if m.phase != "begin":
                continue
            for buf in ((m.acc,) if m.acc is not None else ()) + tuple(m.reads):
                shape = buf.static_shape() if buf is not None else None
                if buf is None or id(buf) in seen or shape is None:
                    continue
                seen.add(id(buf))
                n = 1
                for x in shape:
                    n *= int(x)
                words += -(-n * buf.dtype.bytes // 4)
        return words

    def block_indices(self, st, s) -> None:
        """(after them: where a warp-uniform warp index is declared if a descriptor uses one)"""
        self._block_indices(st, s)
        st.warp_line = (len(st.lines), st.indent * 2)

    def stmt_AsyncCommit(self, st, s):
        self.line(st, "tc_cp_async_commit();")

    def stmt_AsyncWait(self, st, s):
        self.line(st, f"tc_cp_async_wait<{int(s.pending)}>();")
