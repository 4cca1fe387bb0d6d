"""tilecore's lowered IR as a plain-data program that the TVM worker turns into TIR.

The bridge runs in the compiling process and imports no ``tvm``: it walks the kernel as the core's
pipeline leaves it for SIMT emitters (after ``tilecore.simt_distribute``: one launch, the block's
allocations first, parallel nests strided over :class:`~tilecore.ir.ThreadIndex`, explicit
:class:`~tilecore.ir.Barrier` statements) and writes it as nested lists of strings and numbers (JSON),
which ``worker.py`` rebuilds with ``tvm.tirx`` constructors in its own process. What TIR (or this
bridge) cannot express is refused here, at the statement's source line, never mistranslated.

Two workarounds for apache-tvm 0.27 live here, because they shape the program:

- ``bfloat16`` buffers are declared as ``uint16`` and their values computed as ``float32`` (a load
  widens the bits, a store rounds to nearest even), because the wheel's BF16 legalization reads a
  buffer it never declared;
- every buffer is flat (one dimension) and indexed with the row-major offset, views included, so no
  TVM buffer flattening runs.

Program layout (``Program.to_json()``): ``{"name", "params", "vars", "buffers", "grid", "block_vars",
"threads", "body"}``. Expressions: ``["v", id]``, ``["i", value, dtype]``, ``["f", value, dtype]``,
``["b", op, a, b, dtype]``, ``["c", op, a, b]``, ``["and"|"or", a, b]``, ``["not", a]``,
``["sel", c, t, f]``, ``["cast", dtype, v]``, ``["call", name, [args], dtype]``, ``["ld", buf, index]``,
``["tid"]``; bfloat16 bits: ``["bf16_in", bits]``, ``["bf16_out", value]``. Statements:
``["seq", [..]]``, ``["for", var, start, extent, kind, body]``, ``["if", c, then, else|None]``,
``["st", buf, index, value]``, ``["let", var, value]``, ``["alloc", buf]``, ``["sync"]``,
``["atomic", op, buf, index, value]``, ``["break"]``, ``["continue"]``.
"""
from __future__ import annotations

import math
import struct

from tilecore.errors import CompileError, UnsupportedFeatureError
from tilecore.ir import (Allocate, Atomic, Barrier, BinOp, Bind, Break, BufferLoad, Call, Cast, Cmp, Continue, FloatImm,
                         For, If, IntImm, KernelLaunch, Logic, PerThread, Select, Seq, Store, ThreadIndex, Var,
                         simplify)

#: tilecore binary operators -> the worker's names (TIR nodes)
BINOPS = {"add", "sub", "mul", "div", "floordiv", "floormod", "min", "max", "shl", "shr", "xor", "bitand", "bitor"}
#: math calls TIR has (``tvm.tirx.<name>``); fast_* and ieee_* variants map onto them
MATH = {"exp", "exp2", "exp10", "log", "log2", "log10", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos",
        "tan", "floor", "ceil", "round", "trunc", "pow", "abs"}
IEEE = {"ieee_add": "add", "ieee_sub": "sub", "ieee_mul": "mul", "ieee_fdiv": "div"}
#: what the worker computes with, per storage dtype (bfloat16 values live in float32 registers)
VALUE = {"bfloat16": "float32"}
#: how the worker declares buffers of a dtype (bfloat16 as its bits: the TVM 0.27 legalization fault)
STORAGE = {"bfloat16": "uint16"}


def _reserved() -> frozenset:
    """Identifiers a kernel variable may not be called in the generated languages (WGSL's reserved words,
    C's and the SIMT names; TVM 0.27 prints a variable named ``loop`` as is, which WGSL rejects)."""
    from tilecore.codegen.shaderlang import ShaderLangEmitter
    from tilecore.codegen.simtcpp import SIMTCppEmitter

    return frozenset(ShaderLangEmitter.reserved | SIMTCppEmitter.reserved
                     | {"kernel", "device", "thread", "threadgroup", "constant", "half", "bfloat", "global", "local",
                        "private", "restrict", "threadIdx", "blockIdx", "gridDim", "podArgs", "arg"})


RESERVED = _reserved()


def bf16_bits(x: float) -> int:
    """The bfloat16 bits of ``x``, rounded to nearest even (NaN stays a quiet NaN)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    if math.isnan(x):
        return (bits >> 16) | 0x40
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def vtype(dtype) -> str:
    return VALUE.get(str(dtype), str(dtype))


class Program:
    """The bridged kernel; ``refuse`` raises at a statement's line with the target in the message."""

    def __init__(self, target: str, caps=None):
        self.target = target
        self.caps = caps
        self.vars: dict = {}      # id(Var) -> index
        self.var_list: list = []  # [name, dtype]
        self.bufs: dict = {}      # id(base Buffer) -> index
        self.buf_list: list = []  # {"name", "dtype", "numel", "scope"}
        self.span = None
        self.launch_depth = 0

    # -- refusals -----------------------------------------------------------------------------------
    def refuse(self, what: str, fix: str, feature: str = "", span=None):
        msg = f"{what} cannot be bridged to TVM TIR for target {self.target}; {fix}"
        if feature:
            raise UnsupportedFeatureError(msg, span or self.span, feature=feature, target=self.target)
        raise CompileError(msg, span or self.span)

    # -- names --------------------------------------------------------------------------------------
    def var(self, v: Var) -> list:
        k = self.vars.get(id(v))
        if k is None:
            k = self.vars[id(v)] = len(self.var_list)
            self.var_list.append([v.name + "_" if v.name in RESERVED else v.name, vtype(v.dtype)])
        return ["v", k]

    def buf(self, b, scope: str = "") -> int:
        base = b.base if getattr(b, "base", None) is not None else b
        k = self.bufs.get(id(base))
        if k is None:
            if base.dtype in ("float8_e4m3", "float8_e5m2"):
                self.refuse(f"buffer {base.name} of {base.dtype}", "TVM 0.27's float8 legalization is not usable "
                            "from this bridge; use a float16 or float32 buffer", feature=f"dtype:{base.dtype}:storage")
            k = self.bufs[id(base)] = len(self.buf_list)
            self.buf_list.append({"name": base.name, "dtype": STORAGE.get(str(base.dtype), str(base.dtype)),
                                  "value": vtype(base.dtype), "bf16": base.dtype == "bfloat16",
                                  "numel": self.expr(simplify(base.numel())), "scope": scope})
        elif scope and not self.buf_list[k]["scope"]:
            self.buf_list[k]["scope"] = scope
        return k

    def flat(self, b, indices) -> list:
        """The row-major element offset of ``indices`` in ``b`` (a view indexes its base's storage)."""
        shape = b.shape
        if len(indices) != len(shape):
            self.refuse(f"an access to {b.name} with {len(indices)} indices (it has {len(shape)} dimensions)",
                        "index every dimension")
        off = None
        for k, i in enumerate(indices):
            off = i if off is None else off * shape[k] + i
        return self.expr(simplify(off if off is not None else IntImm(0)))

    # -- expressions --------------------------------------------------------------------------------
    def expr(self, e) -> list:
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, IntImm):
            return ["i", int(e.value), vtype(e.dtype)]
        if isinstance(e, FloatImm):
            v = e.value
            return ["f", v if math.isfinite(v) else repr(v), vtype(e.dtype)]
        if isinstance(e, ThreadIndex):
            return ["tid"]
        if isinstance(e, BinOp):
            if e.op not in BINOPS:
                self.refuse(f"the operator {e.op}", "rewrite it with + - * / // % min max")
            return ["b", e.op, self.expr(e.a), self.expr(e.b), vtype(e.dtype)]
        if isinstance(e, Cmp):
            return ["c", e.op, self.expr(e.a), self.expr(e.b)]
        if isinstance(e, Logic):
            return ["not", self.expr(e.a)] if e.op == "not" else [e.op, self.expr(e.a), self.expr(e.b)]
        if isinstance(e, Select):
            return ["sel", self.expr(e.cond), self.expr(e.t), self.expr(e.f)]
        if isinstance(e, Cast):
            inner = self.expr(e.value)
            if e.dtype == "bfloat16":
                if isinstance(e.value, (FloatImm, IntImm)):  # rounded here (see value_for)
                    return ["f", struct.unpack("<f", struct.pack("<I", bf16_bits(float(e.value.value)) << 16))[0],
                            "float32"]
                return ["bf16_in", ["bf16_out", ["cast", "float32", inner]]]  # round to bfloat16, keep as float32
            if e.value.dtype in ("float8_e4m3", "float8_e5m2") or e.dtype in ("float8_e4m3", "float8_e5m2"):
                self.refuse(f"a conversion to or from {e.dtype if 'float8' in e.dtype else e.value.dtype}",
                            "keep float8 data out of kernels for this target",
                            feature=f"dtype:{e.dtype if 'float8' in e.dtype else e.value.dtype}:storage")
            return ["cast", vtype(e.dtype), inner]
        if isinstance(e, Call):
            name = e.name[5:] if e.name.startswith("fast_") else e.name
            args = [self.expr(a) for a in e.args]
            if name in IEEE:
                return ["b", IEEE[name], *args, vtype(e.dtype)]
            if name == "ieee_fmaf":
                return ["b", "add", ["b", "mul", args[0], args[1], vtype(e.dtype)], args[2], vtype(e.dtype)]
            if name == "ieee_frcp":
                return ["b", "div", ["f", 1.0, vtype(e.dtype)], args[0], vtype(e.dtype)]
            if name == "ieee_fsqrt":
                name = "sqrt"
            if name == "ieee_frsqrt":
                name = "rsqrt"
            if name not in MATH:
                self.refuse(f"the call {e.name}()", "use a math function TIR has (exp, log, sqrt, tanh, ...)")
            return ["call", name, args, vtype(e.dtype)]
        if isinstance(e, BufferLoad):
            k = self.buf(e.buffer)
            load = ["ld", k, self.flat(e.buffer, e.indices)]
            return ["bf16_in", load] if self.buf_list[k]["bf16"] else load
        self.refuse(f"the expression {type(e).__name__} ({e!r})",
                    "this target has no spelling for it (its capability profile should have refused it earlier)")

    def value_for(self, b, value) -> list:
        if b.dtype == "bfloat16" and isinstance(value, (FloatImm, IntImm)):
            # a constant is rounded here: TVM 0.27's OpenCL generator reinterprets a constant as
            # `*(uint *)(&(3.0f))`, the address of an rvalue, which OpenCL C rejects
            return ["i", bf16_bits(float(value.value)), "uint16"]
        v = self.expr(value)
        return ["bf16_out", v] if b.dtype == "bfloat16" else v

    # -- statements ---------------------------------------------------------------------------------
    def stmt(self, s, top: bool = False) -> list:
        self.span = s.span or self.span
        if isinstance(s, Seq):
            return ["seq", [self.stmt(x, top) for x in s.body]]
        if isinstance(s, For):
            return ["for", self.var(s.var)[1], self.expr(s.start), self.expr(s.extent),
                    "unroll" if s.kind == "unroll" else "serial", self.stmt(s.body)]
        if isinstance(s, If):
            return ["if", self.expr(s.cond), self.stmt(s.then), None if s.orelse is None else self.stmt(s.orelse)]
        if isinstance(s, Store):
            k = self.buf(s.buffer)
            return ["st", k, self.flat(s.buffer, s.indices), self.value_for(s.buffer, s.value)]
        if isinstance(s, Bind):
            return ["let", self.var(s.var)[1], self.expr(s.value)]
        if isinstance(s, Allocate):
            b = s.buffer
            if not isinstance(simplify(b.numel()), IntImm):
                self.refuse(f"the block-local buffer {b.name} of symbolic size", "give it a constant shape")
            # top-level allocations are the block's memory; those inside loops are private to a thread
            scope = "local" if (not top or b.scope == "register") else "shared"
            k = self.buf(b, scope)
            out = ["alloc", k]
            if s.init is not None:
                out = ["seq", [out, ["st", k, ["i", 0, "int32"], self.value_for(b, s.init)]]]
            return out
        if isinstance(s, Barrier):
            return ["sync"]
        if isinstance(s, PerThread):
            return self.stmt(s.body)
        if isinstance(s, Atomic):
            self.refuse(f"atomic {s.op} on {s.buffer.name}", "TVM 0.27's source generators leave tirx.atomic_add "
                        "unresolved; use a reduction into a buffer instead", feature="feature:atomics")
        if isinstance(s, Break):
            return ["break"]
        if isinstance(s, Continue):
            return ["continue"]
        if isinstance(s, KernelLaunch):
            self.refuse("a nested T.Kernel", "use one T.Kernel per kernel")
        what = type(s).__name__
        self.refuse(f"the statement {what}", f"this target has no {what}; its capability profile should list the "
                    "feature as absent")


def _check_shared(p: Program, func, launch) -> None:
    """The block memory the bridged kernel declares (its top-level allocations) against the profile's limit."""
    from tilecore.ir import DType

    total = 0
    for b in p.buf_list:
        if b["scope"] == "shared":
            total += int(b["numel"][1]) * DType(b["dtype"]).bytes
    lim = p.caps.limit("max_shared_bytes_per_block") if p.caps is not None else None
    if lim is not None and total > lim[0]:
        raise UnsupportedFeatureError(
            f"kernel {func.name} needs {total} bytes of block memory (shared buffers and fragments kept in block "
            f"memory); target {p.target} allows {int(lim[0])} (limit max_shared_bytes_per_block). Use smaller tiles",
            launch.span or func.span, feature="limit:max_shared_bytes_per_block", target=p.target)


def bridge(func, ctx) -> dict:
    """The lowered ``func`` as the worker's program (a dict of JSON data)."""
    from tilecore.codegen import abi_of, single_launch

    target = str(ctx.target)
    p = Program(target, ctx.capabilities)
    abi = abi_of(func)
    launch, top = single_launch(func)
    if len(launch.grid) > 3:
        p.refuse(f"a grid of {len(launch.grid)} dimensions", "use at most 3 grid dimensions", span=launch.span)
    params = []
    for prm in abi.buffers:
        b = prm.buffer
        k = p.buf(b, "global")
        p.buf_list[k]["shape"] = [p.expr(simplify(x)) for x in b.shape]
        params.append(["buf", k])
    for v in list(abi.ints) + list(abi.floats):
        params.append(["var", p.var(v)[1]])
    body = [p.stmt(s, top=True) for s in top if not isinstance(s, KernelLaunch)]
    grid = [p.expr(simplify(g)) for g in launch.grid]
    block_vars = [p.var(v)[1] for v in launch.block_vars]
    p.span = launch.span
    inner = launch.body.body if isinstance(launch.body, Seq) else [launch.body]
    body += [p.stmt(s, top=True) for s in inner]
    threads = int(launch.attrs.get("simt_threads") or func.attrs.get("simt_threads") or 1)
    _check_shared(p, func, launch)
    return {"name": func.name, "params": params, "vars": p.var_list, "buffers": p.buf_list, "grid": grid,
            "block_vars": block_vars, "threads": threads, "body": ["seq", body]}


__all__ = ["bridge", "Program", "STORAGE", "VALUE"]
