"""AscendC from lowered tile IR: a C-family emitter whose memory is AscendC tensors.

One kernel function (``extern "C" __global__ __aicore__``), ``GM_ADDR`` tensor arguments and the ABI scalars
by value; inside ``if ASCEND_IS_AIV`` one ``TPipe`` and one ``TBuf<VECCALC>`` holding every tile at the
offset ``ascend.plan_onchip`` gave it; the grid is the flattened ``GetBlockIdx()``. Vector leaves print as
AscendC instructions, copies as ``DataCopyPad``, syncs as ``SetFlag``/``WaitFlag``/``PipeBarrier``; a scalar
element access is ``GetValue``/``SetValue`` (scalar pipe). Under ``TC_ASCEND_EMU`` the source also has a host
launcher, ``tc_launch``, that runs every block through the emulator.
"""
from __future__ import annotations

from importlib import resources

from tilecore.codegen import CFamilyEmitter, EmitState, abi_of
from tilecore.codegen.abi import single_launch
from tilecore.errors import CompileError
from tilecore.ir import Allocate, Buffer, BufferLoad, Seq, as_expr, collect, const_value, simplify
from tilecore.plugin import Source

from .passes import ONCHIP, plan_scopes

POSITIONS = {"ub": "VECCALC", "l1": "A1", "l0a": "A2", "l0b": "B2", "l0c": "CO1"}

ENTRY = "tc_kernel"
LAUNCHER = "tc_launch"


def emulator_dir() -> str:
    return str(resources.files("tilecore_ascend").joinpath("emulator"))


def prelude_dir() -> str:
    return str(resources.files("tilecore_ascend").joinpath("prelude"))


class AscendCEmitter(CFamilyEmitter):
    lang = "ascendc"
    storage_types = {**CFamilyEmitter.storage_types, "float16": "half", "bfloat16": "bfloat16_t"}
    value_types = {**storage_types, "bool": "int", "float16": "float", "bfloat16": "float"}
    load_conv = {"float16": "(float)({})", "bfloat16": "(float)({})"}
    store_conv = {"float16": "(half)({})", "bfloat16": "(bfloat16_t)({})"}
    reserved = frozenset({"half", "bfloat16_t", "AscendC", "GetBlockIdx", "DataCopyPad", "LocalTensor", "GlobalTensor",
                          "TPipe", "TBuf", "SetFlag", "WaitFlag", "PipeBarrier", "HardEvent", "int", "float", "double",
                          "char", "const", "if", "for", "while", "return", "auto", "new", "delete", "class", "template"})

    # -- memory access -------------------------------------------------------------------------------
    def _mem(self, buf: Buffer) -> bool:
        return buf.scope == "global" or buf.scope in ONCHIP

    def expr(self, st: EmitState, e) -> str:
        if isinstance(e, BufferLoad) and self._mem(e.buffer):
            ref = f"{self.name(st, e.buffer)}.GetValue({self.flat_index(st, e.buffer, e.indices)})"
            return self.load(st, e.buffer, ref)
        return super().expr(st, e)

    def stmt_Store(self, st, s):
        if not self._mem(s.buffer):
            return super().stmt_Store(st, s)
        self.line(st, f"{self.name(st, s.buffer)}.SetValue({self.flat_index(st, s.buffer, s.indices)}, "
                      f"{self.store_value(st, s.buffer, s.value)});")

    def stmt_Allocate(self, st, s):
        if s.buffer.scope in ONCHIP:
            return  # placed in the TBuf by the plan
        super().stmt_Allocate(st, s)

    # -- AscendC leaves -----------------------------------------------------------------------------
    def _at(self, st, buf, off) -> str:
        o = const_value(simplify(off))
        return self.name(st, buf) if o == 0 else f"{self.name(st, buf)}[{self.expr(st, simplify(off))}]"

    def stmt_Sync(self, st, s):
        if s.kind == "barrier":
            self.line(st, f"PipeBarrier<PIPE_{s.src}>();")
        else:
            fn = "SetFlag" if s.kind == "set" else "WaitFlag"
            self.line(st, f"{fn}<HardEvent::{s.src}_{s.dst}>({s.event});")

    def stmt_CopyIn(self, st, s):
        size = s.dst.dtype.bytes
        rows, cols = self.expr(st, s.rows), self.expr(st, s.cols)
        gap = self.expr(st, simplify(s.src_pitch))
        params = (f"DataCopyExtParams((uint16_t)({rows}), (uint32_t)(({cols}) * {size}), "
                  f"(uint32_t)((({gap}) - ({cols})) * {size}), "
                  f"(uint32_t)(({s.dst_pitch * size} - (({cols}) * {size} + 31) / 32 * 32) / 32), 0)")
        t = self.stype(s.dst.dtype)
        self.line(st, f"if (({rows}) > 0 && ({cols}) > 0) DataCopyPad({self._at(st, s.dst, s.dst_off)}, "
                      f"{self._at(st, s.src, s.src_off)}, {params}, DataCopyPadExtParams<{t}>(false, 0, 0, 0));")

    def stmt_CopyOut(self, st, s):
        size = s.src.dtype.bytes
        rows, cols = self.expr(st, s.rows), self.expr(st, s.cols)
        gap = self.expr(st, simplify(s.dst_pitch))
        params = (f"DataCopyExtParams((uint16_t)({rows}), (uint32_t)(({cols}) * {size}), "
                  f"(uint32_t)(({s.src_pitch * size} - (({cols}) * {size} + 31) / 32 * 32) / 32), "
                  f"(uint32_t)((({gap}) - ({cols})) * {size}), 0)")
        self.line(st, f"if (({rows}) > 0 && ({cols}) > 0) DataCopyPad({self._at(st, s.dst, s.dst_off)}, "
                      f"{self._at(st, s.src, s.src_off)}, {params});")

    def stmt_VecOp(self, st, s):
        d = self._at(st, *s.dst)
        srcs = [self._at(st, b, o) for b, o in s.srcs]
        n = self.expr(st, s.count)
        if s.name == "Cast":
            narrow = s.dst[0].dtype.bytes < s.srcs[0][0].dtype.bytes  # rounds to nearest even; widening is exact
            args = [d, srcs[0], "RoundMode::CAST_RINT" if narrow else "RoundMode::CAST_NONE", n]
        elif s.scalar is not None:
            val = f"({self.stype(s.dst[0].dtype)})({self.expr(st, s.scalar)})"
            args = [d, *srcs, val, n]
        else:
            args = [d, *srcs, n]
        self.line(st, f"{s.name}({', '.join(args)});")

    # -- the cube -------------------------------------------------------------------------------------
    def stmt_InitL1(self, st, s):
        t = self.stype(s.dst.dtype)
        n = 1
        for d in s.dst.static_shape():
            n *= d
        self.line(st, f"InitConstValue({self.name(st, s.dst)}, InitConstValueParams<{t}>(1, {n * s.dst.dtype.bytes // 32}, 0, ({t})0));")

    def stmt_CopyNd2Nz(self, st, s):
        rows, cols, pitch = self.expr(st, s.rows), self.expr(st, s.cols), self.expr(st, simplify(s.pitch))
        self.line(st, f"if (({rows}) > 0 && ({cols}) > 0) DataCopy({self.name(st, s.dst)}, {self._at(st, s.src, s.src_off)}, "
                      f"Nd2NzParams(1, (uint16_t)({rows}), (uint16_t)({cols}), 0, (uint16_t)({pitch}), {s.tile_rows}, 1, 0));")

    def stmt_LoadFractals(self, st, s):
        dst = self._at(st, s.dst, as_expr(s.dst_frac * 256))
        self.line(st, f"LoadData({dst}, {self.name(st, s.src)}, LoadData2DParams({s.start}, {s.repeat}, {s.stride}, 0, 0, "
                      f"{'true' if s.trans else 'false'}, 0));")

    def stmt_MmadOp(self, st, s):
        self.line(st, f"Mmad({self.name(st, s.c)}, {self.name(st, s.a)}, {self.name(st, s.b)}, "
                      f"MmadParams({s.m}, {s.n}, {s.k}, ({self.expr(st, s.init)}) != 0));")

    def stmt_FixpipeOut(self, st, s):
        rows, cols, pitch = self.expr(st, s.rows), self.expr(st, s.cols), self.expr(st, simplify(s.pitch))
        d = s.dst.dtype
        quant = {"float16": "F322F16", "bfloat16": "F322BF16"}.get(str(d), "NoQuant")
        self.line(st, f"if (({rows}) > 0 && ({cols}) > 0) Fixpipe<{self.stype(d)}, float, CFG_ROW_MAJOR>("
                      f"{self._at(st, s.dst, s.dst_off)}, {self.name(st, s.src)}, FixpipeParamsV220((uint16_t)({cols}), "
                      f"(uint16_t)({rows}), {s.tile_rows}, (uint32_t)({pitch}), QuantMode_t::{quant}));")

    # -- the kernel ----------------------------------------------------------------------------------
    def stmt_CrossSet(self, st, s):
        self.line(st, f"CrossCoreSetFlag<0x2, PIPE_FIX>({s.flag});")

    def stmt_CrossWait(self, st, s):
        self.line(st, f"CrossCoreWaitFlag({s.flag});")

    def stmt_Assert(self, st, s):
        raise CompileError("T.device_assert and checked mode are not implemented by tilecore-ascend yet", s.span)

    def stmt_Print(self, st, s):
        raise CompileError("T.print is not implemented by tilecore-ascend yet", s.span)

    def _section(self, st, launch, stmts, scopes, plans, aiv_of_mix, sub=None):
        """One core's part: its buffers, its block index, its statements."""
        used = [k for k in scopes if plans[k]]
        if used:
            self.line(st, "TPipe tc_pipe;")
        for scope in used:
            plan = plans[scope]
            total = max(off + size for _, off, size in plan)
            self.line(st, f"TBuf<TPosition::{POSITIONS[scope]}> tc_{scope};")
            self.line(st, f"tc_pipe.InitBuffer(tc_{scope}, {-(-total // 32) * 32});")
            for a, off, size in plan:
                b, t = a.buffer, self.stype(a.buffer.dtype)
                name = self.name(st, b)
                self.line(st, f"LocalTensor<{t}> {name} = tc_{scope}.GetWithOffset<{t}>({size // b.dtype.bytes}, {off});")
                self.line(st, f'TC_EMU_NAME({name}, "{b.name}");')
        # a mixed kernel's AIVs count two per block (GetTaskRation): each waits for the AIC's hand-off; they
        # split the block's rows (GetSubBlockIdx) where the vector part is row-wise, else sub-block 0 does it all
        self.line(st, "const int64_t tc_bid = GetBlockIdx() / GetTaskRation();" if aiv_of_mix else
                  "const int64_t tc_bid = GetBlockIdx();")
        stride = "1"
        for v, g in zip(launch.block_vars, launch.grid):
            ge = self.expr(st, g)
            self.line(st, f"const int64_t {self.name(st, v)} = tc_bid / ({stride}) % ({ge});")
            stride = f"{stride} * ({ge})"
        from .cube import CrossWait

        guard = aiv_of_mix and sub is None
        if aiv_of_mix and sub is not None:
            self.line(st, f"const int64_t {self.name(st, sub)} = GetSubBlockIdx();")
        if guard:
            for x in stmts:
                if isinstance(x, CrossWait):
                    self.stmt(st, x)
            stmts = [x for x in stmts if not isinstance(x, CrossWait)]
            self.line(st, "if (GetSubBlockIdx() == 0) {")
            st.indent += 1
        for x in stmts:
            self.stmt(st, x)
        if guard:
            st.indent -= 1
            self.line(st, "}")

    def emit(self, func, ctx) -> Source:
        from .cube import CrossSet

        st = EmitState()
        st.fast = bool(ctx.option("tilecore.fast_math", False))
        abi = abi_of(func)
        launch, top = single_launch(func)
        body = list(launch.body.body) if isinstance(launch.body, Seq) else [launch.body]
        plans = plan_scopes(launch.body)
        ub_bytes = max((off + size for _, off, size in plans["ub"]), default=0)
        cube = any(plans[k] for k in ("l1", "l0a", "l0b", "l0c"))
        cut = next((k for k, x in enumerate(body) if isinstance(x, CrossSet)), None)
        ws_bytes = int(func.attrs.get("ascend_workspace_bytes_per_block", 0) or 0)
        if cut is not None:
            head, tail = body[:cut + 1], body[cut + 1:]
            decls = [x for x in head if isinstance(x, Allocate) and x.buffer.scope not in ONCHIP]
            sections = [("ASCEND_IS_AIC", head, ("l1", "l0a", "l0b", "l0c"), False),
                        ("ASCEND_IS_AIV", decls + tail, ("ub",), True)]
            ktype = "KERNEL_TYPE_MIX_AIC_1_2"
        elif cube:
            if plans["ub"]:
                raise CompileError(f"kernel {func.name}: UB tiles in a cube kernel without a hand-off", func.span)
            sections, ktype = [("ASCEND_IS_AIC", body, ("l1", "l0a", "l0b", "l0c"), False)], "KERNEL_TYPE_AIC_ONLY"
        else:
            sections, ktype = [("ASCEND_IS_AIV", body, ("ub",), False)], "KERNEL_TYPE_AIV_ONLY"
        params = [f"GM_ADDR tc_gm{k}" for k in range(len(abi.buffers))]
        params += [f"int64_t {self.name(st, v)}" for v in abi.ints]
        params += [f"{self.vtype(v.dtype)} {self.name(st, v)}" for v in abi.floats]
        if ws_bytes:
            params.append("GM_ADDR tc_ws")
        from .cube import FixpipeOut

        ws_bufs = {id(x.dst): x.dst for x in collect(launch.body, FixpipeOut) if x.dst.scope == "global"
                   and not any(x.dst is p.buffer for p in abi.buffers)}
        for name, stmts, scopes, aiv_of_mix in sections:
            st.indent = 1
            self.line(st, f"if {name} {{")
            st.indent = 2
            for k, p in enumerate(abi.buffers):
                t = self.stype(p.buffer.dtype)
                gname = self.name(st, p.buffer)
                self.line(st, f"GlobalTensor<{t}> {gname};")
                self.line(st, f"{gname}.SetGlobalBuffer((__gm__ {t}*)tc_gm{k});")
            for b in ws_bufs.values():
                self.line(st, f"GlobalTensor<float> {self.name(st, b)};")
                self.line(st, f"{self.name(st, b)}.SetGlobalBuffer((__gm__ float*)tc_ws);")
            for x in top:
                if not isinstance(x, type(launch)):
                    self.stmt(st, x)
            self._section(st, launch, stmts, scopes, plans, aiv_of_mix, func.attrs.get("ascend_aiv_sub"))
            st.indent = 1
            self.line(st, "}")
        kbody = "\n".join(st.lines)
        # the emulator's launcher: every block in turn on the host (its AIC, then its AIV sub-blocks)
        host = EmitState(names=st.names, used=st.used, keep=st.keep, indent=1)
        for k, v in enumerate(abi.ints):
            self.line(host, f"const int64_t {self.name(host, v)} = tc_ints[{k}];")
        for k, v in enumerate(abi.floats):
            self.line(host, f"const {self.vtype(v.dtype)} {self.name(host, v)} = ({self.vtype(v.dtype)})tc_floats[{k}];")
        nblocks = " * ".join(f"({self.expr(host, g)})" for g in launch.grid) or "1"
        args = [f"(GM_ADDR)tc_bufs[{k}]" for k in range(len(abi.buffers))]
        args += [self.name(host, v) for v in abi.ints] + [self.name(host, v) for v in abi.floats]
        if ws_bytes:
            args.append("(GM_ADDR)tc_ws")
        runs = {"KERNEL_TYPE_AIV_ONLY": [(1, 0)], "KERNEL_TYPE_AIC_ONLY": [(2, 0)],
                "KERNEL_TYPE_MIX_AIC_1_2": [(2, 0), (1, 0), (1, 1)]}[ktype]
        ratio = 2 if ktype == "KERNEL_TYPE_MIX_AIC_1_2" else 1
        calls = "".join(f"    tc_emu_begin((int)tc_b, (int)tc_nblocks, {core}, {sub}, {ratio});\n    {ENTRY}({', '.join(args)});\n"
                        "    tc_emu_end();\n" for core, sub in runs)
        host_body = "\n".join(host.lines)
        ws_alloc = (f"  void* tc_ws = std::calloc((size_t)tc_nblocks * {ws_bytes} + 32, 1);\n"
                    f"  tc_emu_workspace(tc_ws, (uint64_t)tc_nblocks * {ws_bytes});\n") if ws_bytes else ""
        ws_free = "  std::free(tc_ws);\n" if ws_bytes else ""
        code = (f"// generated by tilecore-ascend for kernel {func.name}\n"
                "#ifdef TC_ASCEND_EMU\n#include \"ascendc_emu.h\"\n#else\n#include \"kernel_operator.h\"\n#endif\n"
                "#include \"tc_ascend.h\"\nusing namespace AscendC;\n\n"
                f"extern \"C\" __global__ __aicore__ void {ENTRY}({', '.join(params)}) {{\n"
                f"  KERNEL_TASK_TYPE_DEFAULT({ktype});\n"
                f"{kbody}\n}}\n\n"
                "#ifdef TC_ASCEND_EMU\n"
                f"extern \"C\" __attribute__((visibility(\"default\"))) int {LAUNCHER}(void** tc_bufs, const int64_t* tc_ints, "
                "const double* tc_floats) {\n"
                "  (void)tc_bufs; (void)tc_ints; (void)tc_floats;\n"
                f"{host_body}\n"
                f"  const int64_t tc_nblocks = {nblocks};\n"
                "  tc_emu_reset_findings();\n"
                f"{ws_alloc}"
                "  for (int64_t tc_b = 0; tc_b < tc_nblocks; ++tc_b) {\n"
                "    tc_emu_block();\n"
                f"{calls}"
                "    tc_emu_block_end();\n"
                f"  }}\n{ws_free}  return tc_emu_findings();\n}}\n"
                "#else\n"
                "// the device launcher (CANN, runtime.AscendDeviceRuntime): blocks are AI Cores (an AIC and its AIVs)\n"
                "extern \"C\" int64_t tc_blocks(const int64_t* tc_ints, const double* tc_floats) {\n"
                "  (void)tc_ints; (void)tc_floats;\n"
                f"{host_body}\n"
                f"  return {nblocks};\n}}\n"
                "extern \"C\" int tc_call(void* tc_stream, void** tc_bufs, const int64_t* tc_ints, const double* tc_floats, "
                "void* tc_ws) {\n"
                "  (void)tc_bufs; (void)tc_ws;\n"
                f"{host_body}\n"
                f"  {ENTRY}<<<(uint32_t)({nblocks}), nullptr, tc_stream>>>({', '.join(args)});\n"
                "  return 0;\n}\n#endif\n")
        caps = ctx.capabilities
        limits = {k: int(caps.limit(k)[0]) for k in ("max_ub_bytes", "max_l1_bytes", "event_ids_per_hard_event")
                  if caps.limit(k) is not None}
        return Source(code, "ascendc", ENTRY, {"launcher": LAUNCHER, "ub_bytes": ub_bytes, "limits": limits,
                                                "kernel_type": ktype, "workspace_bytes_per_block": ws_bytes,
                                                "aiv_rows_per_sub_block": func.attrs.get("ascend_aiv_rows"),
                                                "onchip_bytes": {k: max((o + n for _, o, n in v), default=0)
                                                                 for k, v in plans.items()}})
