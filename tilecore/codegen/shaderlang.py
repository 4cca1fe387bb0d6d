"""An emitter for the W3C web shading language, shared by backends whose kernels are compute shaders.

The shading language looks like C in its statements (``if``, ``for``, ``{}``) but differs in what
matters to a printer: declarations are ``let name: type = value;`` and ``var name: type;``, there are
no implicit conversions (``f32(x)``, ``i32(x)`` are explicit), integers are 32-bit only, shift counts
are unsigned, ``select(f, t, cond)`` replaces ``?:``, atomics live in ``atomic<T>`` cells reached
through pointers, and NaN or infinity may not be written as constant expressions. So this class
subclasses :class:`~tilecore.codegen.CFamilyEmitter` for the walk and overrides the spellings.

Values vs storage, as in the C family: a 16-bit float is stored as ``f16`` and computed in ``f32``
(loads widen, stores and casts round to nearest even), so results match the reference backend.

What stays with the backend: the module layout (how tensors and scalar arguments are bound, how the
grid maps to dispatches), written in its ``emit``. Helpers here build the pieces: :meth:`prelude`
(helper functions the expressions use), :meth:`workgroup_decl` and :attr:`atomic_buffers` (buffers
that are targets of atomics are declared ``array<atomic<T>>`` and every access goes through
``atomicLoad``/``atomicStore``; ``f32`` atomics keep their bits in ``atomic<u32>`` cells and update them
by compare-and-swap).
"""
from __future__ import annotations

import math
import struct

from ..errors import CompileError
from ..ir import Allocate, Atomic, BinOp, Cast, FloatImm, IntImm, Store, collect, is_float, simplify
from .cfamily import CFamilyEmitter, EmitState

_KEYWORDS = frozenset("""
alias break case const const_assert continue continuing default diagnostic discard else enable false fn for
if let loop override requires return struct switch true var while
NULL Self abstract active alignas alignof as asm asm_fragment async attribute auto await become binding_array
cast catch class co_await co_return co_yield coherent column_major common compile compile_fragment concept
const_cast consteval constexpr constinit crate debugger decltype delete demote demote_to_helper do
dynamic_cast enum explicit export extends extern external fallthrough filter final finally friend from fxgroup
get goto groupshared highp impl implements import inline instanceof interface layout lowp macro macro_rules
match mediump meta mod module move mut mutable namespace new nil noexcept noinline nointerpolation
noperspective null nullptr of operator package packoffset partition pass patch pixelfragment precise precision
premerge priv protected pub public readonly ref regardless register reinterpret_cast require resource
restrict self set shared sizeof smooth snorm static static_assert static_cast std subroutine super target
template this thread_local throw trait try type typedef typeid typename typeof union unless unorm unsafe
unsized use using varying virtual volatile where with writeonly yield
array atomic bool f16 f32 i32 u32 mat2x2 mat3x3 mat4x4 ptr sampler texture_2d vec2 vec3 vec4
read write read_write function private workgroup uniform storage
abs acos asin atan atan2 ceil clamp cos cosh cross degrees determinant distance dot exp exp2 faceForward
floor fma fract frexp inverseSqrt ldexp length log log2 max min mix modf normalize pow radians reflect
refract round saturate sign sin sinh smoothstep sqrt step tan tanh transpose trunc select bitcast all any
arrayLength countLeadingZeros countOneBits countTrailingZeros extractBits firstLeadingBit firstTrailingBit
insertBits reverseBits workgroupBarrier storageBarrier workgroupUniformLoad atomicLoad atomicStore atomicAdd
atomicSub atomicMax atomicMin atomicAnd atomicOr atomicXor atomicExchange atomicCompareExchangeWeak
""".split())

#: helper functions the expressions may call; emitted once at module scope (only those used)
HELPERS = {
    "tc_floordiv": "fn tc_floordiv(a: i32, b: i32) -> i32 {\n"
                   "  let q = a / b;\n  return select(q, q - 1, (a % b != 0) && ((a < 0) != (b < 0)));\n}",
    "tc_floormod": "fn tc_floormod(a: i32, b: i32) -> i32 {\n"
                   "  let r = a % b;\n  return select(r, r + b, (r != 0) && ((r < 0) != (b < 0)));\n}",
    # NaN and infinities cannot be constant expressions; a function call is evaluated at run time
    "tc_f32_bits": "fn tc_f32_bits(b: u32) -> f32 {\n  return bitcast<f32>(b);\n}",
    # NaN by its bits: the language lets a compiler assume `x != x` is false
    "tc_isnan": "fn tc_isnan(x: f32) -> bool {\n  return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;\n}",
    "tc_nanmax": "fn tc_nanmax(a: f32, b: f32) -> f32 {\n"
                 "  return select(max(a, b), bitcast<f32>(0x7fc00000u), tc_isnan(a) || tc_isnan(b));\n}",
    "tc_nanmin": "fn tc_nanmin(a: f32, b: f32) -> f32 {\n"
                 "  return select(min(a, b), bitcast<f32>(0x7fc00000u), tc_isnan(a) || tc_isnan(b));\n}",
    # erf: Abramowitz-Stegun 7.1.26 (max abs error ~1.5e-7)
    "tc_erf": "fn tc_erf(x: f32) -> f32 {\n  let t = 1.0 / (1.0 + 0.3275911 * abs(x));\n"
              "  let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t "
              "+ 0.254829592) * t * exp(-x * x);\n  return select(-y, y, x >= 0.0);\n}",
}


class ShaderLangEmitter(CFamilyEmitter):
    lang = "shader"
    index_type = "i32"
    #: types in memory (storage buffers, workgroup and private arrays)
    storage_types = {"bool": "bool", "int32": "i32", "uint32": "u32", "float32": "f32", "float16": "f16"}
    #: types computed with
    value_types = {"bool": "bool", "int32": "i32", "uint32": "u32", "float32": "f32", "float16": "f32"}
    load_conv = {"float16": "f32({})"}
    store_conv = {"float16": "f16({})"}
    round_conv = {"float16": "f32(f16({}))"}
    float_suffix = {"float32": "f", "float16": "f"}
    # one spelling per name (the language has no double); kept in the base's (float, double) shape
    math = {name: (fmt, fmt) for name, fmt in {
        "exp": "exp({0})", "exp2": "exp2({0})", "exp10": "pow(10.0f, {0})", "log": "log({0})",
        "log2": "log2({0})", "log10": "(log2({0}) * 0.30102999566398120f)", "sqrt": "sqrt({0})",
        "rsqrt": "inverseSqrt({0})", "tanh": "tanh(clamp({0}, -15.0f, 15.0f))",
        "sigmoid": "(1.0f / (1.0f + exp(-({0}))))", "erf": "tc_erf({0})", "sin": "sin({0})", "cos": "cos({0})",
        "tan": "tan({0})", "floor": "floor({0})", "ceil": "ceil({0})", "round": "round({0})",
        "trunc": "trunc({0})", "pow": "pow({0}, {1})", "abs": "abs({0})",
        "ieee_add": "({0} + {1})", "ieee_sub": "({0} - {1})", "ieee_mul": "({0} * {1})",
        "ieee_fdiv": "({0} / {1})", "ieee_fmaf": "fma({0}, {1}, {2})", "ieee_frcp": "(1.0f / {0})",
        "ieee_fsqrt": "sqrt({0})", "ieee_frsqrt": "inverseSqrt({0})",
    }.items()}
    int_abs = "abs({0})"
    minmax = {"min": "min({0}, {1})", "max": "max({0}, {1})"}
    minmax_nan = {"min": "tc_nanmin({0}, {1})", "max": "tc_nanmax({0}, {1})"}
    floordiv_int = "tc_floordiv({0}, {1})"
    floormod_int = "tc_floormod({0}, {1})"
    thread_index_expr = "tc_tid"
    #: storage writes by one thread must be visible to the others after the barrier, not only
    #: workgroup memory
    barrier_stmt = "storageBarrier(); workgroupBarrier();"
    reserved = _KEYWORDS
    for_header = "for (var {v}: {type} = {start}; {v} < {end}; {v} = {v} + {type}(1)) {{"
    bind_stmt = "let {name}: {type} = {value};"
    select_expr = "select({f}, {t}, {c})"

    def need(self, st: EmitState, helper: str) -> None:
        """Record that the module needs ``HELPERS[helper]``."""
        needs = getattr(st, "helpers", None)
        if needs is None:
            needs = st.helpers = set()
        needs.add(helper)

    def prelude(self, st: EmitState) -> str:
        return "\n".join(HELPERS[h] for h in sorted(getattr(st, "helpers", ())))

    # -- expressions ----------------------------------------------------------------------------
    def float_lit(self, v: float, dtype) -> str:
        if math.isnan(v) or math.isinf(v) or abs(v) > 3.4028234663852886e38:
            bits = 0x7FC00000 if math.isnan(v) else (0x7F800000 if v > 0 else 0xFF800000)
            return f"tc_f32_bits({bits:#010x}u)"
        v = struct.unpack("<f", struct.pack("<f", v))[0]  # the literal is f32: print the f32 value
        text = repr(float(v))
        if "e" not in text and "." not in text:
            text += ".0"
        return f"{text}f" if not text.startswith("-") else f"({text}f)"

    def int_lit(self, v: int, dtype) -> str:
        if dtype == "bool":
            return "true" if v else "false"
        if is_float(dtype):
            return self.float_lit(float(v), dtype)
        if dtype == "uint32":
            return f"{v}u"
        if not -2**31 <= v < 2**31:
            raise CompileError(f"the integer constant {v} does not fit the 32-bit integers of this target")
        if v == -2**31:  # 2147483648i itself is out of range, so the literal cannot be negated
            return "(-2147483647i - 1i)"
        return f"{v}i" if v >= 0 else f"({v}i)"

    def expr(self, st: EmitState, e) -> str:
        if isinstance(e, FloatImm):
            text = self.float_lit(e.value, e.dtype)
            if text.startswith("tc_f32_bits"):
                self.need(st, "tc_f32_bits")
            return text
        if isinstance(e, BinOp):
            a, b = self.expr(st, e.a), self.expr(st, e.b)
            if e.op in ("shl", "shr"):
                return f"({a} {'<<' if e.op == 'shl' else '>>'} u32({b}))"
            if e.op in ("min", "max") and is_float(e.dtype) and not getattr(st, "fast", False):
                self.need(st, "tc_isnan")
                self.need(st, "tc_nan" + e.op)
            if e.op in ("floordiv", "floormod") and not is_float(e.dtype):
                if e.dtype == "uint32":
                    return f"({a} {'/' if e.op == 'floordiv' else '%'} {b})"
                self.need(st, "tc_" + e.op)
            return super().expr(st, e)
        if isinstance(e, Cast):
            inner = self.expr(st, e.value)
            if e.dtype == "bool":
                if e.value.dtype == "bool":
                    return inner
                return f"({inner} != {self.vtype(e.value.dtype)}(0))"
            if e.dtype in self.round_conv:
                return self.round_conv[e.dtype].format(inner)
            return f"{self.vtype(e.dtype)}({inner})"
        return super().expr(st, e)

    def load(self, st: EmitState, buf, ref: str) -> str:
        if self.is_atomic(st, buf):
            return self._from_cell(buf, f"atomicLoad(&{ref})")
        return super().load(st, buf, ref)

    def call(self, st: EmitState, e) -> str:
        if e.name in ("erf", "fast_erf"):
            self.need(st, "tc_erf")
        return super().call(st, e)

    # -- atomics ----------------------------------------------------------------------------------
    def find_atomic_buffers(self, st: EmitState, body) -> None:
        """Mark every buffer that an :class:`~tilecore.ir.Atomic` updates (call before printing)."""
        st.atomic_buffers = {id(a.buffer.base or a.buffer) for a in collect(body, Atomic)}
        # and every buffer an atomic that returns the old value updates (D69)
        from ..ir import AtomicRet, stmt_exprs, walk, walk_expr

        def mark(e):
            if isinstance(e, AtomicRet):
                st.atomic_buffers.add(id(e.buffer.base or e.buffer))

        walk(body, lambda x: [walk_expr(e, mark) for e in stmt_exprs(x)])

    #: D69: ``atomicAdd`` returns the old value; the language's atomics are relaxed only (no device-scope
    #: acquire or release, no fence), so other orders are refused
    atomic_fetch = "atomicAdd({ptr}, {value})"
    atomic_fetch_dtypes = ("int32", "uint32")

    def atomic_fetch_expr(self, st: EmitState, e) -> str:
        if e.order != "relaxed":
            raise CompileError(f"T.atomic_{e.op}(..., return_prev=True, memory_order={e.order!r}): this language's "
                               "atomics are relaxed only (memory_order=None or \"relaxed\")")
        return super().atomic_fetch_expr(st, e)

    def is_atomic(self, st: EmitState, buf) -> bool:
        return id(buf.base or buf) in getattr(st, "atomic_buffers", ())

    def element_type(self, st: EmitState, buf) -> str:
        """The array element type of a buffer's declaration (``atomic<T>`` for atomic targets)."""
        t = self.stype(buf.dtype)
        if self.is_atomic(st, buf):
            if t == "f32":  # no float atomics: the bits live in a u32 cell, updated by compare-and-swap
                return "atomic<u32>"
            if t not in ("i32", "u32"):
                raise CompileError(f"atomics on {buf.dtype} are not expressible in this language (only 32-bit "
                                   "cells are atomic)")
            return f"atomic<{t}>"
        return t

    @staticmethod
    def _from_cell(buf, text: str) -> str:
        return f"bitcast<f32>({text})" if buf.dtype == "float32" else text

    @staticmethod
    def _to_cell(buf, text: str) -> str:
        return f"bitcast<u32>({text})" if buf.dtype == "float32" else text

    def workgroup_decl(self, st: EmitState, buf, count: int) -> str:
        return f"var<workgroup> {self.name(st, buf)}: array<{self.element_type(st, buf)}, {max(int(count), 1)}>;"

    # -- statements -------------------------------------------------------------------------------
    def loop_type(self, var) -> str:
        return self.vtype(var.dtype)

    def store(self, st: EmitState, buf, ref: str, value) -> None:
        if self.is_atomic(st, buf):
            self.line(st, f"atomicStore(&{ref}, {self._to_cell(buf, self.expr(st, value))});")
        else:
            super().store(st, buf, ref, value)

    def stmt_Allocate(self, st, s: Allocate):
        """A thread-private array (block-level allocations are the backend's workgroup declarations)."""
        b = s.buffer
        n = simplify(b.numel())
        if not isinstance(n, IntImm):
            raise CompileError(f"{b.name}: private arrays need a constant size in this language", s.span)
        self.line(st, f"var {self.name(st, b)}: array<{self.element_type(st, b)}, {max(n.value, 1)}>;")
        if s.init is not None:
            self.stmt_Store(st, Store(b, tuple(IntImm(0) for _ in b.shape), s.init))

    def stmt_Atomic(self, st, s: Atomic):
        ref = "&" + self.element(st, s.buffer, s.indices)
        fn = {"add": "atomicAdd", "max": "atomicMax", "min": "atomicMin", "sub": "atomicSub"}.get(s.op)
        if fn is None:
            raise CompileError(f"atomic {s.op} has no spelling in this language", s.span)
        value = self.expr(st, s.value)
        if s.buffer.dtype == "float32":
            # compare-and-swap on the bits until no other invocation changed the cell in between
            op = {"add": "(tc_old_f + {v})", "sub": "(tc_old_f - {v})", "max": "max(tc_old_f, {v})",
                  "min": "min(tc_old_f, {v})"}[s.op].format(v=value)
            for text in ("{", f"  var tc_old: u32 = atomicLoad({ref});", "  loop {",
                         "    let tc_old_f: f32 = bitcast<f32>(tc_old);",
                         f"    let tc_cas = atomicCompareExchangeWeak({ref}, tc_old, bitcast<u32>({op}));",
                         "    if (tc_cas.exchanged) { break; }", "    tc_old = tc_cas.old_value;", "  }", "}"):
                self.line(st, text)
            return
        self.line(st, f"_ = {fn}({ref}, {value});")


__all__ = ["ShaderLangEmitter", "HELPERS"]
