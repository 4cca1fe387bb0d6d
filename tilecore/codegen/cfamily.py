"""A C-family source emitter over lowered tile IR, shared by every C-like backend.

The emitter is mostly data: a subclass sets type names, conversion spellings, math function names and
pragmas, and overrides the few methods that differ between targets (how a kernel launch and its
allocations look). Statements and expressions are printed here once.

Values vs storage: a dtype may be stored in memory as one C type and computed with in another (e.g. a
16-bit float stored as ``uint16_t`` and computed in ``float``). ``storage_types`` and ``value_types``
say which; ``load_conv`` / ``store_conv`` convert between them and ``round_conv`` rounds a computed
value to a narrow dtype without leaving the value type (what a cast to that dtype means).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import CompileError
from ..ir import (Allocate, Assert, Atomic, AtomicRet, Fence, Barrier, BinOp, Bind, Break, Buffer, BufferLoad, Call, Cast, Cmp, Collective,
                  Continue, Expr,
                  FloatImm, For, If, IntImm, KernelLaunch, Logic, PerThread, Print, Select, Seq, ShuffleIndex,
                  ShuffleWidth, ShuffleXor, Store, ThreadIndex, Var, binary,
                  const, const_value,
                  is_float, simplify)
from ..plugin.api import Emitter, Source

_OPS = {"add": "+", "sub": "-", "mul": "*", "shl": "<<", "shr": ">>", "xor": "^", "bitand": "&", "bitor": "|"}
_CMPS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


@dataclass
class EmitState:
    lines: list = field(default_factory=list)
    names: dict = field(default_factory=dict)
    used: set = field(default_factory=set)
    indent: int = 1
    asserts: list = field(default_factory=list)
    keep: list = field(default_factory=list)  # every named object, so that ids are not reused


#: pass config: a store of a value cast to the stored dtype converts once (no round trip through the value type;
#: the same bits; D55: by default on targets of the class it was measured on, ``feature:bulk_tensor_copy``; True: any
#: target; False: the round trip)
STORE_CAST_ONCE = "tilecore.store_cast_once"


def _cast_once(st) -> bool:
    ctx = getattr(st, "ctx", None)
    if ctx is None:
        return False
    want = ctx.option(STORE_CAST_ONCE, None)
    if want is None:
        from ..passes.masksplit import measured_class

        return measured_class(ctx)
    return want is True


#: C11 / GCC's names of the IR's memory orders (the __atomic builtins)
C_ORDERS = {"relaxed": "__ATOMIC_RELAXED", "acquire": "__ATOMIC_ACQUIRE", "release": "__ATOMIC_RELEASE",
            "acq_rel": "__ATOMIC_ACQ_REL"}


def kept_workspaces(func) -> tuple:
    """The kernel's kept workspaces (``PrimFunc.attrs["kept_workspaces"]``, D69), each with its static element count;
    a CompileError where a shape is not a constant."""
    from ..ir import const_value

    out = []
    for b in func.attrs.get("kept_workspaces", ()) or ():
        n = const_value(simplify(b.numel()))
        if n is None:
            raise CompileError(f"kernel {func.name}: the kept workspace {b.name} needs a static size, got {b.shape}")
        out.append((b, int(n)))
    return tuple(out)


class CFamilyEmitter(Emitter):
    lang = "c"
    index_type = "int64_t"
    storage_types = {
        "bool": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
        "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
        "float16": "uint16_t", "bfloat16": "uint16_t", "float32": "float", "float64": "double",
    }
    value_types = {**storage_types, "bool": "int", "float16": "float", "bfloat16": "float"}
    load_conv = {"float16": "tc_h2f({})", "bfloat16": "tc_bf2f({})"}
    #: element copies between buffers of one dtype move the storage type (:meth:`raw_copy`); an emitter
    #: whose loads do more than convert (packing, swizzled views) keeps it off
    copy_in_storage_type = False
    store_conv = {"float16": "tc_f2h({})", "bfloat16": "tc_f2bf({})"}
    round_conv = {"float16": "tc_round_h({})", "bfloat16": "tc_round_bf({})"}
    float_suffix = {"float32": "f", "float16": "f", "bfloat16": "f", "float64": ""}
    # math: name -> format per value type ("f" = float, "d" = double); {0}, {1}.. are the arguments
    math = {
        "exp": ("expf({0})", "exp({0})"), "exp2": ("exp2f({0})", "exp2({0})"),
        "exp10": ("powf(10.0f, {0})", "pow(10.0, {0})"), "log": ("logf({0})", "log({0})"),
        "log2": ("log2f({0})", "log2({0})"), "log10": ("log10f({0})", "log10({0})"),
        "sqrt": ("sqrtf({0})", "sqrt({0})"), "rsqrt": ("(1.0f / sqrtf({0}))", "(1.0 / sqrt({0}))"),
        "tanh": ("tanhf({0})", "tanh({0})"), "sigmoid": ("(1.0f / (1.0f + expf(-({0}))))", "(1.0 / (1.0 + exp(-({0}))))"),
        "erf": ("erff({0})", "erf({0})"), "sin": ("sinf({0})", "sin({0})"), "cos": ("cosf({0})", "cos({0})"),
        "tan": ("tanf({0})", "tan({0})"), "floor": ("floorf({0})", "floor({0})"), "ceil": ("ceilf({0})", "ceil({0})"),
        "round": ("nearbyintf({0})", "nearbyint({0})"), "trunc": ("truncf({0})", "trunc({0})"),
        "pow": ("powf({0}, {1})", "pow({0}, {1})"), "abs": ("fabsf({0})", "fabs({0})"),
        "ieee_add": ("({0} + {1})", "({0} + {1})"), "ieee_sub": ("({0} - {1})", "({0} - {1})"),
        "ieee_mul": ("({0} * {1})", "({0} * {1})"), "ieee_fdiv": ("({0} / {1})", "({0} / {1})"),
        "ieee_fmaf": ("fmaf({0}, {1}, {2})", "fma({0}, {1}, {2})"), "ieee_frcp": ("(1.0f / {0})", "(1.0 / {0})"),
        "ieee_fsqrt": ("sqrtf({0})", "sqrt({0})"), "ieee_frsqrt": ("(1.0f / sqrtf({0}))", "(1.0 / sqrt({0}))"),
    }
    #: fast variants; a target without faster ones maps them to the exact functions
    fast_math: dict = {}
    int_abs = "tc_iabs({0})"
    minmax = {"min": "tc_min({0}, {1})", "max": "tc_max({0}, {1})"}
    #: float min / max: NaN in either operand gives NaN (as torch.minimum / maximum), unless fast math
    minmax_nan = {"min": "tc_nanmin({0}, {1})", "max": "tc_nanmax({0}, {1})"}
    floordiv_int = "tc_floordiv({0}, {1})"
    floormod_int = "tc_floormod({0}, {1})"
    simd_pragma = ""
    unroll_pragma = ""
    #: spelling of :class:`~tilecore.ir.ThreadIndex` (the flat thread index inside the block) and of a
    #: block-wide :class:`~tilecore.ir.Barrier`; targets that distribute work over threads override them
    thread_index_expr = "0"
    barrier_stmt = ""
    #: spelling of :class:`~tilecore.ir.ShuffleXor` (``{0}`` value, ``{1}`` mask, ``{2}`` width): a target
    #: whose threads exchange registers sets it; the core asks for it only where the capabilities declare
    #: ``features.subgroup_ops`` and an ``execution.simd_width`` wider than the masks
    shuffle_xor = ""
    #: spelling of :class:`~tilecore.ir.ShuffleIndex` (``{0}`` value, ``{1}`` source lane within the aligned
    #: group, ``{2}`` width): the core asks for it only where the capabilities also declare
    #: ``features.shuffle_index`` (plugin API 1.4)
    shuffle_index = ""
    #: spelling of :class:`~tilecore.ir.ShuffleWidth` (the lockstep width decided at run time, uniform over
    #: the block): the core asks for it only where the profile declares ``execution.simd_width: dynamic``
    shuffle_width_expr = ""
    #: spelling of an atomic that returns the element's old value (:class:`~tilecore.ir.AtomicRet`, decision D69):
    #: ``{op}`` ``{order}`` ``{scope}`` ``{dtype}`` (the IR's names), ``{ptr}`` the element's address, ``{value}``;
    #: a target that spells none leaves it empty and refuses such kernels with a CompileError
    atomic_fetch = ""
    #: the integer dtypes :attr:`atomic_fetch` spells
    atomic_fetch_dtypes = ("int32", "uint32", "int64", "uint64")
    #: spelling of a :class:`~tilecore.ir.Fence` by ``(scope, order)``; a target without one refuses it
    fence_stmts: dict = {}
    #: statement and expression shapes; ``{type}`` is :meth:`loop_type` for loops, the value type otherwise
    for_header = "for ({type} {v} = {start}; {v} < {end}; ++{v}) {{"
    bind_stmt = "const {type} {name} = {value};"
    select_expr = "({c} ? {t} : {f})"

    # -- entry -------------------------------------------------------------------------------------
    def emit(self, func, ctx) -> Source:  # pragma: no cover - subclasses define the function layout
        raise NotImplementedError

    # -- names -------------------------------------------------------------------------------------
    #: every identifier an emitter writes itself (parameters, helpers, scratch, its own loop counters)
    #: starts with this prefix; :meth:`name` never gives an IR object a name that does
    own_prefix = "tc_"

    def name(self, st: EmitState, obj) -> str:
        """The identifier of an IR variable or buffer in this function: objects are told apart by
        identity, so two of the same name (a user's ``i`` and a lowering's ``i``) print differently, and
        none is printed as a keyword, a name the target's spellings use (``expf``, ``threadIdx``) or
        a name in the emitters' own ``tc_`` namespace (``tc_tid``, ``tc_status``)."""
        obj = getattr(obj, "base", None) or obj  # a view (T.Tensor(shape, dtype, A.data)) is its base's memory
        key = id(obj)
        if key in st.names:
            return st.names[key]
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in obj.name) or "v"
        if base[0].isdigit() or base.startswith("_") or base.lower().startswith(self.own_prefix):
            base = "v" + base
        taken = self.taken_names()
        cand, n = base, 1
        while cand in st.used or cand in taken:
            cand = f"{base}_{n}"
            n += 1
        st.used.add(cand)
        st.names[key] = cand
        st.keep.append(obj)  # the id stays this object's for the whole emission
        return cand

    #: names of the target's spelling tables below that are not identifiers of a called function
    _SPELLING_TABLES = ("storage_types", "value_types", "load_conv", "store_conv", "round_conv", "math", "fast_math",
                        "minmax", "minmax_nan", "int_abs", "floordiv_int", "floormod_int", "thread_index_expr", "barrier_stmt",
                        "index_type", "shuffle_xor", "shuffle_index")

    def taken_names(self) -> frozenset:
        """:attr:`reserved` and every identifier the target's spelling tables write (computed once per class)."""
        cls = type(self)
        got = cls.__dict__.get("_taken_names")
        if got is None:
            words: set = set()
            for attr in self._SPELLING_TABLES:
                words |= _identifiers(getattr(cls, attr, ""))
            got = frozenset(self.reserved | words | {"NAN", "INFINITY"})
            cls._taken_names = got
        return got

    reserved = frozenset({"int", "float", "double", "char", "long", "short", "signed", "unsigned", "void", "for",
                          "if", "else", "while", "do", "return", "break", "continue", "const", "static", "auto",
                          "register", "switch", "case", "default", "goto", "sizeof", "struct", "union", "enum",
                          "typedef", "volatile", "extern", "inline", "restrict", "bool", "main", "half",
                          "free", "malloc", "printf", "fflush", "stdout", "memcpy", "size_t"})

    # -- expressions -------------------------------------------------------------------------------
    def vtype(self, dtype) -> str:
        try:
            return self.value_types[dtype]
        except KeyError:
            raise CompileError(f"this target's code generator has no C type for {dtype}") from None

    def stype(self, dtype) -> str:
        try:
            return self.storage_types[dtype]
        except KeyError:
            raise CompileError(f"this target's code generator has no storage type for {dtype}") from None

    def int_lit(self, v: int, dtype) -> str:
        if dtype == "bool":
            return "1" if v else "0"
        return f"{v}LL" if abs(v) >= 2**31 else (str(v) if v >= 0 else f"({v})")

    def float_lit(self, v: float, dtype) -> str:
        suffix = self.float_suffix.get(dtype, "f")
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(float(v))
        if "e" not in text and "." not in text:
            text += ".0"
        return f"{text}{suffix}" if not text.startswith("-") else f"({text}{suffix})"

    def element(self, st: EmitState, buf: Buffer, indices) -> str:
        """The element ``buf[indices]`` as stored (an lvalue of the storage type)."""
        return f"{self.name(st, buf)}[{self.flat_index(st, buf, indices)}]"

    def flat_index(self, st: EmitState, buf: Buffer, indices) -> str:
        """The element offset of ``buf[indices]``: row-major, or through the tile's shared layout where the
        launch stores it swizzled (``shared_layouts``, tilecore.passes.matrix.swizzle_operand_tiles: the
        last two dimensions are one tile, the leading ones count whole tiles)."""
        if len(indices) == 1 and isinstance(indices[0], Expr):  # one dimension: the index itself (as _row_major gives)
            return self.expr(st, simplify(indices[0]))
        lay = getattr(st, "shared_layouts", {}).get(id(buf))
        if lay is not None and len(indices) >= 2:
            tile = lay.offset_expr(indices[-2], indices[-1])
            lead = self._row_major(indices[:-2], buf.shape[:-2])
            return self.expr(st, simplify(binary("add", binary("mul", lead, lay.size), tile)))
        return self.expr(st, simplify(self._row_major(indices, buf.shape)))

    @staticmethod
    def _row_major(indices, shape) -> Expr:
        flat: Expr = const(0)
        stride: Expr = const(1)
        for idx, dim in reversed(list(zip(indices, shape))):
            flat = binary("add", flat, binary("mul", idx, stride))
            stride = binary("mul", stride, dim)
        return flat

    def expr(self, st: EmitState, e) -> str:
        if isinstance(e, Var):
            return self.name(st, e)
        if isinstance(e, IntImm):
            return self.int_lit(e.value, e.dtype)
        if isinstance(e, FloatImm):
            return self.float_lit(e.value, e.dtype)
        if isinstance(e, BinOp):
            a, b = self.expr(st, e.a), self.expr(st, e.b)
            if e.op in _OPS:
                return f"({a} {_OPS[e.op]} {b})"
            if e.op in self.minmax:
                if is_float(e.dtype) and not st_fast(st) and e.op in self.minmax_nan:
                    return self.minmax_nan[e.op].format(a, b)
                return self.minmax[e.op].format(a, b)
            if e.op == "div":
                return f"({a} / {b})"
            if e.op == "floordiv":
                return self.floordiv_int.format(a, b) if not is_float(e.dtype) else self._math("floor", e.dtype, [f"({a} / {b})"])
            if e.op == "floormod":
                if is_float(e.dtype):
                    fl = self._math("floor", e.dtype, [f"({a} / {b})"])
                    return f"({a} - {b} * {fl})"
                return self.floormod_int.format(a, b)
            raise CompileError(f"no C spelling for binary op {e.op}")
        if isinstance(e, Cmp):
            return f"({self.expr(st, e.a)} {_CMPS[e.op]} {self.expr(st, e.b)})"
        if isinstance(e, Logic):
            if e.op == "not":
                return f"(!{self.expr(st, e.a)})"
            return f"({self.expr(st, e.a)} {'&&' if e.op == 'and' else '||'} {self.expr(st, e.b)})"
        if isinstance(e, Select):
            return self.select_expr.format(c=self.expr(st, e.cond), t=self.expr(st, e.t), f=self.expr(st, e.f))
        if isinstance(e, Cast):
            inner = self.expr(st, e.value)
            if e.dtype == "bool":
                return f"({inner} != 0)"
            if e.dtype in self.round_conv:
                if not is_float(e.value.dtype):
                    inner = f"(({self.vtype(e.dtype)})({inner}))"
                return self.round_conv[e.dtype].format(inner)
            return f"(({self.vtype(e.dtype)})({inner}))"
        if isinstance(e, ThreadIndex):
            return self.thread_index_expr
        if isinstance(e, ShuffleWidth):
            if not self.shuffle_width_expr:
                raise CompileError("this target's code generator has no spelling for the run-time width of its "
                                   "lockstep thread groups (shuffle_width_expr), which its capability profile's "
                                   "execution.simd_width: dynamic asks for")
            return self.shuffle_width_expr
        if isinstance(e, ShuffleXor):
            if not self.shuffle_xor:
                raise CompileError("this target's code generator has no spelling for a register exchange between "
                                   "threads (shuffle_xor)")
            return self.shuffle_xor.format(self.expr(st, e.value), e.mask, e.width)
        if isinstance(e, ShuffleIndex):
            if not self.shuffle_index:
                raise CompileError("this target's code generator has no spelling for an indexed register exchange "
                                   "between threads (shuffle_index), which its capability profile's "
                                   "features.shuffle_index asks for")
            return self.shuffle_index.format(self.expr(st, e.value), self.expr(st, e.lane), e.width)
        if isinstance(e, Call):
            return self.call(st, e)
        if isinstance(e, BufferLoad):
            return self.load(st, e.buffer, self.element(st, e.buffer, e.indices))
        if isinstance(e, AtomicRet):
            return self.atomic_fetch_expr(st, e)
        raise CompileError(f"no C spelling for expression {type(e).__name__}")

    def atomic_fetch_expr(self, st: EmitState, e: AtomicRet) -> str:
        """An atomic that returns the old value (D69), through :attr:`atomic_fetch`."""
        name = f"T.atomic_{e.op}(..., return_prev=True) on {e.buffer.dtype}"
        if not self.atomic_fetch:
            raise CompileError(f"{name}: this target's code generator ({type(self).__name__}) has no atomic that "
                               "returns the old value (drop return_prev, or compile for a target whose code generator spells "
                               "it)")
        if e.op != "add" or str(e.buffer.dtype) not in self.atomic_fetch_dtypes:
            raise CompileError(f"{name}: this target returns the old value of integer additions only "
                               f"({', '.join(self.atomic_fetch_dtypes)}); T.atomic_add on an integer buffer does")
        ptr = "&" + self.element(st, e.buffer, e.indices)
        return self.atomic_fetch.format(op=e.op, order=e.order, scope=e.scope, dtype=e.buffer.dtype, ptr=ptr,
                                        value=self.expr(st, e.value), ctype=self.stype(e.buffer.dtype),
                                        corder=C_ORDERS[e.order])

    def stmt_GroupBarrier(self, st: EmitState, s):
        raise CompileError(f"a block group's barrier (T.group_barrier {s.phase!r}): this target's code generator "
                           f"({type(self).__name__}) has no block groups whose blocks run at once (a launch with "
                           "attrs['block_group'] needs a target with execution.cluster.supported)", s.span)

    def stmt_PeerStore(self, st: EmitState, s):
        raise CompileError(f"a store into a block group peer's {s.buffer.name}: this target's code generator "
                           f"({type(self).__name__}) has no block groups whose blocks share block memory", s.span)

    def stmt_Fence(self, st: EmitState, s: Fence):
        text = self.fence_stmts.get((s.scope, s.order))
        if text is None:
            raise CompileError(f"T.fence(scope={s.scope!r}, order={s.order!r}): this target's code generator "
                               f"({type(self).__name__}) has no such memory fence", s.span)
        self.line(st, text)

    def load(self, st: EmitState, buf: Buffer, ref: str) -> str:
        """The value of the element ``ref`` of ``buf`` (converted from storage to the value type)."""
        conv = self.load_conv.get(buf.dtype)
        return conv.format(ref) if conv else ref

    def _math(self, name: str, dtype, args: list) -> str:
        fmt = self.math.get(name)
        if fmt is None:
            raise CompileError(f"T.{name} has no implementation in this target's code generator")
        return fmt[1 if dtype == "float64" else 0].format(*args)

    def call(self, st: EmitState, e: Call) -> str:
        args = [self.expr(st, a) for a in e.args]
        if e.name == "abs" and not is_float(e.dtype):
            return self.int_abs.format(*args)
        name = e.name
        if name.startswith("fast_"):
            base = name[5:]
            fmt = self.fast_math.get(base)
            if fmt is not None:
                return fmt[1 if e.dtype == "float64" else 0].format(*args)
            name = base
        elif name in ("exp", "log", "log2", "log10", "exp10", "sin", "cos", "tan") and st_fast(st):
            fmt = self.fast_math.get(name)
            if fmt is not None:
                return fmt[1 if e.dtype == "float64" else 0].format(*args)
        return self._math(name, e.dtype, args)

    # -- statements --------------------------------------------------------------------------------
    def line(self, st: EmitState, text: str) -> None:
        st.lines.append("  " * st.indent + text)

    def stmt(self, st: EmitState, s) -> None:
        method = getattr(self, "stmt_" + type(s).__name__, None)
        if method is None:
            raise CompileError(f"no C spelling for statement {type(s).__name__}", s.span)
        method(st, s)

    def stmt_Seq(self, st, s: Seq):
        for c in s.body:
            self.stmt(st, c)

    def stmt_For(self, st, s: For):
        v = self.name(st, s.var)
        innermost = not _has_loop(s.body)
        if s.kind in ("parallel", "vectorized") and innermost and self.simd_pragma and not _has_control(s.body):
            self.line(st, self.simd_pragma)
        elif s.kind == "unroll" and self.unroll_pragma and isinstance(s.extent, IntImm) and s.extent.value <= 256:
            self.line(st, self.unroll_pragma.format(n=s.extent.value))
        start = self.expr(st, s.start)
        end = self.expr(st, simplify(binary("add", s.start, s.extent)))
        self.line(st, self.for_header.format(type=self.loop_type(s.var), v=v, start=start, end=end))
        st.indent += 1
        self.stmt(st, s.body)
        st.indent -= 1
        self.line(st, "}")

    def loop_type(self, var) -> str:
        """The type of a loop counter (:attr:`index_type`; a target without 64-bit integers overrides)."""
        return self.index_type

    def stmt_If(self, st, s: If):
        self.line(st, f"if ({self.expr(st, s.cond)}) {{")
        st.indent += 1
        self.stmt(st, s.then)
        st.indent -= 1
        if s.orelse is not None:
            self.line(st, "} else {")
            st.indent += 1
            self.stmt(st, s.orelse)
            st.indent -= 1
        self.line(st, "}")

    def store_value(self, st, buf: Buffer, value) -> str:
        raw = self.raw_copy(st, buf, value) if self.copy_in_storage_type else None
        if raw is not None:
            return raw
        conv = self.store_conv.get(buf.dtype)
        once = _cast_once(st)
        if once and conv and isinstance(value, Cast) and value.dtype == buf.dtype and is_float(value.value.dtype) \
                and buf.dtype in self.round_conv and self.vtype(value.value.dtype) == self.vtype(buf.dtype):
            # a cast to the stored dtype: one conversion (rounding twice to the same dtype gives the same bits;
            # the round trip through the value type cost two instructions an element: D55)
            return conv.format(self.expr(st, value.value))
        text = self.expr(st, value)
        return conv.format(text) if conv else text

    def raw_copy(self, st, buf: Buffer, value):
        """``value`` spelled in ``buf``'s storage type where it is an element of a buffer of the same dtype
        (or such an element under a select whose other side is a constant): an element copy then moves the
        stored bits without a round trip through the value type (two conversions per element for 16-bit
        floats, which dominated the instruction count of copies the hardware cannot do asynchronously).
        None: the general spelling."""
        if buf.dtype not in self.store_conv or buf.dtype not in self.load_conv:
            return None
        if isinstance(value, BufferLoad) and value.buffer.dtype == buf.dtype:
            return self.element(st, value.buffer, value.indices)
        if isinstance(value, Select) and isinstance(value.t, BufferLoad) and value.t.buffer.dtype == buf.dtype \
                and const_value(value.f) is not None:
            t = self.raw_copy(st, buf, value.t)
            f = self.store_conv[buf.dtype].format(self.expr(st, value.f))
            return f"({self.expr(st, value.cond)} ? {t} : {f})"
        return None

    def stmt_Store(self, st, s: Store):
        self.store(st, s.buffer, self.element(st, s.buffer, s.indices), s.value)

    def store(self, st: EmitState, buf: Buffer, ref: str, value) -> None:
        """Write ``value`` (an IR expression) to the element ``ref`` of ``buf``."""
        self.line(st, f"{ref} = {self.store_value(st, buf, value)};")

    def stmt_Bind(self, st, s: Bind):
        self.line(st, self.bind_stmt.format(type=self.vtype(s.var.dtype), name=self.name(st, s.var),
                                            value=self.expr(st, s.value)))

    def stmt_Allocate(self, st, s: Allocate):
        b = s.buffer
        n = self.expr(st, simplify(b.numel()))
        self.line(st, f"{self.stype(b.dtype)} {self.name(st, b)}[{n}];")
        if s.init is not None:
            self.line(st, f"{self.name(st, b)}[0] = {self.store_value(st, b, s.init)};")

    def stmt_Atomic(self, st, s: Atomic):
        ref = "&" + self.element(st, s.buffer, s.indices)
        self.line(st, f"tc_atomic_{s.op}_{s.buffer.dtype}({ref}, {self.expr(st, s.value)});")

    def stmt_Barrier(self, st, s: Barrier):
        if self.barrier_stmt:
            self.line(st, self.barrier_stmt)

    def stmt_PerThread(self, st, s: PerThread):
        """Every thread runs the body as it is (in its own scope: the arrays it declares are its own)."""
        self.line(st, "{")
        st.indent += 1
        self.stmt(st, s.body)
        st.indent -= 1
        self.line(st, "}")

    def stmt_Break(self, st, s: Break):
        self.line(st, "break;")

    def stmt_Continue(self, st, s: Continue):
        self.line(st, "continue;")

    def stmt_Collective(self, st, s: Collective):
        """A block-wide operation from a backend's device library; a target with one overrides this."""
        raise CompileError(f"the block-wide operation {s.name} has no implementation in this target's code "
                           "generator", s.span)

    #: how a target spells a registered matrix unit's instruction (:class:`~tilecore.ir.MatrixOp`): the unit's
    #: ``spelling`` -> a statement with the fields ``{c} {c_off} {a} {a_off} {b} {b_off}`` (register arrays
    #: and the offsets of the instruction's registers in them)
    matrix_ops: dict = {}

    def stmt_MatrixOp(self, st, s):
        fmt = self.matrix_ops.get(s.spelling)
        if fmt is None:
            raise CompileError(f"the matrix unit instruction {s.spelling} has no spelling in this target's code "
                               "generator (add it to the emitter's matrix_ops)", s.span)
        self.line(st, fmt.format(c=self.name(st, s.c), c_off=s.c_offset, a=self.name(st, s.a), a_off=s.a_offset,
                                 b=self.name(st, s.b), b_off=s.b_offset))

    def stmt_MatrixLoad(self, st, s):
        """A matrix unit's operand load (:class:`~tilecore.ir.MatrixLoad`): its fallback, one store per
        register. Targets with a cooperative load for the unit override this and fall back here."""
        self.stmt(st, s.fallback)

    #: True: this emitter spells :class:`~tilecore.ir.VectorStore` (``tilecore.vectorize_stores`` runs only for
    #: emitters that say so)
    vector_stores = False

    def stmt_VectorStore(self, st, s):
        """One access of ``s.lanes`` consecutive elements (:class:`~tilecore.ir.VectorStore`): here its
        fallback, the element stores. Targets with a vector spelling override this."""
        self.stmt(st, s.fallback)

    #: True: this emitter spells :class:`~tilecore.ir.MatrixStore` (``tilecore.matrix_stores`` runs only for emitters
    #: that say so; plugin API 1.10)
    matrix_stores = False

    def stmt_MatrixStore(self, st, s):
        """Four 8x8 matrices stored by a group of 32 threads (:class:`~tilecore.ir.MatrixStore`): here its
        fallback, the pair stores. Targets with a cooperative spelling override this."""
        self.stmt(st, s.fallback)

    def stmt_Print(self, st, s: Print):  # pragma: no cover - target specific
        raise CompileError("T.print is not implemented by this target's code generator", s.span)

    def emit_printf(self, st, s: Print) -> None:
        """``T.print`` as C ``printf`` (a value, or every element of a buffer with its index), for targets
        that have it; their ``stmt_Print`` calls this."""
        msg = s.message.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        if s.buffer is not None:
            b = s.buffer
            i = f"tc_pi_{len(st.names)}"
            n = self.expr(st, simplify(b.numel()))
            conv = self.load_conv.get(b.dtype, "{}").format(f"{self.name(st, b)}[{i}]")
            fmt, cast = ("%.9g", "(double)") if is_float(b.dtype) or b.dtype in self.load_conv else ("%lld", "(long long)")
            self.line(st, f"for ({self.index_type} {i} = 0; {i} < {n}; ++{i}) "
                          f"printf(\"{msg}[%lld] = {fmt}\\n\", (long long){i}, {cast}({conv}));")
        else:
            v = s.value
            fmt, cast = ("%.9g", "(double)") if is_float(v.dtype) else ("%lld", "(long long)")
            self.line(st, f"printf(\"{msg}{': ' if msg else ''}{fmt}\\n\", {cast}({self.expr(st, v)}));")

    def record_assert(self, st, s: Assert) -> int:
        """Record ``s`` in ``st.asserts`` (what ``Source.meta["asserts"]`` carries; the runtime turns an entry
        into an exception with :func:`tilecore.errors.kernel_failure`); returns its 1-based code."""
        where = f" (at {s.span})" if s.span else ""
        if s.values:
            st.asserts.append({"message": s.message + where.replace("{", "{{").replace("}", "}}"),
                               "values": len(s.values)})
        else:
            st.asserts.append(s.message + where)
        return len(st.asserts)

    def stmt_Assert(self, st, s: Assert):  # pragma: no cover - target specific
        raise CompileError("T.device_assert is not implemented by this target's code generator", s.span)

    def stmt_KernelLaunch(self, st, s: KernelLaunch):  # pragma: no cover - target specific
        raise NotImplementedError


def _identifiers(value) -> set:
    """Identifiers in a spelling (a string, or the strings of a dict or tuple), numbers' suffixes aside."""
    if isinstance(value, dict):
        return set().union(*(_identifiers(v) for v in value.values())) if value else set()
    if isinstance(value, (tuple, list)):
        return set().union(*(_identifiers(v) for v in value)) if value else set()
    return set(_IDENT.findall(value)) if isinstance(value, str) else set()


_IDENT = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


def st_fast(st: EmitState) -> bool:
    return getattr(st, "fast", False)


def _has_loop(s) -> bool:
    from ..ir import walk

    found = []
    walk(s, lambda x: found.append(1) if isinstance(x, For) else None)
    return bool(found)


def _has_control(s) -> bool:
    from ..ir import walk

    found = []
    walk(s, lambda x: found.append(1) if isinstance(x, (Break, Continue, Print, Assert, Atomic, Allocate)) else None)
    return bool(found)
