"""The tile language: ``import tilecore.language as T``.

The surface follows TileLang's, so a TileLang kernel runs after changing its imports. What each name
does is specified in docs/language.md.
"""
from __future__ import annotations

import enum as _enum
import functools as _functools
import math as _math
import sys as _sys

from ..errors import ParseError, UnsupportedFeatureError
from ..ir import Buffer as _IRBuffer
from ..ir import (Allocate, Assert, Assume, BufferLoad, Call, DType, Expr, FloatImm, Hint, IntImm, Print, Store, Var,
                  as_expr, binary, canonical, compare, const_value, is_float, select)
from ..ir import cast as _to
from ..ir import const as _ir_const  # T.const is the eager kernels' size declaration (below)
from ..ir import max_value as _max_value
from ..ir import min_value as _min_value
from . import ops as _ops
from .builder import current
from .eager import const, empty  # eager-style @tilecore.jit kernels (tilecore/language/eager.py)
from .eager import missing_name as __getattr__  # T.<name> tilecore lacks: a tilecore error, not AttributeError
from .parser import BufferSpec, KernelSpec, LoopSpec, TensorSpec, parse_prim_func, run_macro

# -- dtypes -------------------------------------------------------------------------------------
bool_ = DType("bool")
int8, int16, int32, int64 = DType("int8"), DType("int16"), DType("int32"), DType("int64")
uint8, uint16, uint32, uint64 = DType("uint8"), DType("uint16"), DType("uint32"), DType("uint64")
float16, bfloat16, float32, float64 = DType("float16"), DType("bfloat16"), DType("float32"), DType("float64")
float8_e4m3, float8_e5m2 = DType("float8_e4m3"), DType("float8_e5m2")
float8_e4m3fn = float8_e4m3
half, float, double = float16, float32, float64  # noqa: A001 - TileLang spells these too
globals()["bool"] = bool_
#: TensorFloat-32 is float32 storage that a matrix unit may multiply with a 10-bit mantissa; tilecore
#: stores and computes it as float32 (results are at least as accurate as TF32's).
tfloat32 = float32
#: 4-bit integers (two per byte in TileLang). No target declares int4 storage, so a kernel that uses it
#: is refused at compile() with UnsupportedFeatureError (dtype:int4:storage).
int4 = DType("int4")
#: ``T.dtype``: the dtype type. ``T.dtype("half") == T.float16``; ``dtype: T.dtype = T.float16`` in a
#: signature; ``T.float16.as_torch() is torch.float16``.
dtype = DType


# -- functions and kernels ----------------------------------------------------------------------
def prim_func(fn=None, **_options):
    """Parse a kernel definition into tile IR (``@T.prim_func``)."""
    outer = _sys._getframe(1).f_locals  # the defining scope (see parser.Interpreter)
    if fn is None:
        return lambda f: parse_prim_func(f, outer)
    return parse_prim_func(fn, outer)


class Macro:
    """A function expanded inline into the kernel that calls it (``@T.macro``)."""

    def __init__(self, fn):
        self.fn = fn
        _functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        return run_macro(self.fn, args, kwargs)


def macro(fn=None, **_options):
    if fn is None:
        return lambda f: Macro(f)
    return Macro(fn)


class _TensorAnnotation:
    """``T.Tensor((M, K), dtype)`` or ``T.Tensor[(M, K), dtype]``: a global tensor parameter."""

    def __call__(self, shape, dtype="float32", data=None):
        shape = (shape,) if isinstance(shape, (int, Expr)) else tuple(shape)
        if data is not None:
            return _view(shape, canonical(dtype), data)
        return TensorSpec(shape, canonical(dtype))

    def __getitem__(self, item) -> TensorSpec:
        shape, dtype = item if isinstance(item, tuple) and len(item) == 2 and not isinstance(item[1], int) \
            else (item, "float32")
        return self(shape, dtype)


Tensor = _TensorAnnotation()
globals()["Buffer"] = Tensor


def _view(shape, dtype, data) -> _IRBuffer:
    """``T.Tensor(shape, dtype, A.data)`` in a kernel body: ``A``'s memory seen with another shape."""
    b = current("T.Tensor(shape, dtype, data)")
    base = getattr(data, "buffer", None)
    if not isinstance(data, _IRBuffer.Data) or base.scope != "global":
        raise ParseError("T.Tensor(shape, dtype, data): data must be `.data` of a T.Tensor parameter, "
                         "e.g. T.Tensor((M * K,), dtype, A.data)", b.span)
    if canonical(dtype) != base.dtype:
        raise ParseError(f"T.Tensor(shape, {dtype}, {base.name}.data): the view's dtype must be "
                         f"{base.name}'s ({base.dtype}); reinterpreting bits is not supported", b.span)
    return base.view(shape)


class _ScopedAnnotation:
    """``T.SharedBuffer(shape, dtype)`` (or ``[shape, dtype]``): a @T.macro parameter that takes a buffer
    of that scope; a buffer of another scope, dtype or shape passed to it is a ParseError at the call."""

    def __init__(self, scope: str):
        self.scope = scope

    def __call__(self, shape, dtype="float32") -> BufferSpec:
        shape = (shape,) if isinstance(shape, (int, Expr)) else tuple(shape)
        return BufferSpec(shape, canonical(dtype), self.scope)

    def __getitem__(self, item) -> BufferSpec:
        return self(*item) if isinstance(item, tuple) and len(item) == 2 and not isinstance(item[1], int) \
            else self(item)


SharedBuffer = _ScopedAnnotation("shared")
FragmentBuffer = _ScopedAnnotation("fragment")
LocalBuffer = _ScopedAnnotation("local")


def dynamic(name: str, dtype=int32) -> Var:
    """A symbolic dimension, bound from the tensors' shapes at call time."""
    return Var(name, dtype)


symbolic = dynamic


def Kernel(*grid, threads=128, is_cpu=False, prelude=None, **attrs) -> KernelSpec:  # noqa: N802
    """Launch ``prod(grid)`` blocks; use as ``with T.Kernel(gx, gy, threads=128) as (bx, by):``.

    Binds one block index per grid dim (a single Var for 1 dim, a tuple otherwise). Other keyword arguments
    are backend extensions (plugin API 1.2, ``Backend.op_extensions``), kept in the launch's
    ``attrs["extensions"]`` and checked when the kernel is compiled for a target.
    """
    if not 1 <= len(grid) <= 3:
        raise ParseError(f"T.Kernel takes 1 to 3 grid dims, got {len(grid)}", current("T.Kernel").span)
    threads = (threads,) if isinstance(threads, (int, Expr)) else tuple(threads)
    if not 1 <= len(threads) <= 3:
        raise ParseError("T.Kernel threads= takes an int or a tuple of up to 3", current("T.Kernel").span)
    for t in threads:
        if const_value(t) is None or const_value(t) < 1:
            raise ParseError(f"T.Kernel threads= must be positive integers, got {threads}", current("T.Kernel").span)
    ext = {"extensions": tuple(sorted(attrs.items()))} if attrs else {}
    return KernelSpec(tuple(as_expr(g) for g in grid), tuple(int(const_value(t)) for t in threads), ext)


# -- loops --------------------------------------------------------------------------------------
def _loop(kind, args, annotations=None, step=1) -> LoopSpec:
    if not args:
        raise ParseError(f"T.{kind} needs an extent")
    if len(args) == 1:
        start, stop = 0, args[0]
    else:
        start, stop = args[0], args[1]
    extent = binary("sub", as_expr(stop), as_expr(start))
    return LoopSpec((as_expr(start),), (extent,), kind, dict(annotations or {}), step)


def serial(*args, annotations=None):
    step = args[2] if len(args) > 2 else 1
    return _loop("serial", args[:2], annotations, step)


def unroll(*args, explicit=False, unroll_factor=None, annotations=None):
    return _loop("unroll", args[:2], annotations, args[2] if len(args) > 2 else 1)


def vectorized(*args, annotations=None):
    return _loop("vectorized", args[:2], annotations)


def Parallel(*extents, coalesced_width=None, loop_layout=None):  # noqa: N802
    """Independent iterations over ``extents`` (one loop var per extent)."""
    return LoopSpec(tuple(as_expr(0) for _ in extents), tuple(as_expr(e) for e in extents), "parallel", {})


def Pipelined(start, stop=None, num_stages=0, order=None, stage=None, sync=None, group=None):  # noqa: N802
    """A serial loop a backend may software-pipeline ``num_stages`` deep (``Pipelined(n)`` or ``(a, b)``)."""
    args = (start,) if stop is None else (start, stop)
    ann = {"num_stages": int(num_stages)}
    if order is not None:
        ann["order"] = tuple(order)
    if stage is not None:
        ann["stage"] = tuple(stage)
    return _loop("pipelined", args, ann)


Serial, Unroll = serial, unroll  # TileLang's capitalised aliases


def Persistent(domain, wave_size, index, group_size=8):  # noqa: N802
    """``for bx, by in T.Persistent([gx, gy], wave_size, index, group_size=8)``: a persistent loop.

    The block handles tiles ``index, index + wave_size, index + 2 * wave_size, ...`` of the domain,
    grouped by ``group_size`` along its last dimension (TileLang's order); tiles past the domain are
    skipped. One loop variable per domain dimension.
    """
    domain = tuple(as_expr(d) for d in (domain if isinstance(domain, (list, tuple)) else (domain,)))
    ann = {"domain": domain, "wave_size": as_expr(wave_size), "index": as_expr(index),
           "group_size": as_expr(1 if group_size is None else group_size)}
    return LoopSpec(tuple(as_expr(0) for _ in domain), domain, "persistent", ann)


def grid(*extents):
    return LoopSpec(tuple(as_expr(0) for _ in extents), tuple(as_expr(e) for e in extents), "serial", {})


# -- allocation ---------------------------------------------------------------------------------
def _alloc(shape, dtype, scope, init=None) -> _IRBuffer:
    b = current(f"T.alloc_{scope}")
    if not b.in_kernel:
        raise ParseError(f"T.alloc_{scope} must be called inside `with T.Kernel(...)`", b.span)
    buf = _IRBuffer(f"{scope}_buf", shape, dtype, scope)
    buf._unnamed = True
    b.emit(Allocate(buf, None if init is None else _to(buf.dtype, as_expr(init, buf.dtype))))
    return buf


def alloc_shared(shape, dtype, scope="shared.dyn") -> _IRBuffer:
    return _alloc(shape, dtype, "shared")


def alloc_fragment(shape, dtype, scope="local.fragment") -> _IRBuffer:
    return _alloc(shape, dtype, "fragment")


def alloc_local(shape, dtype) -> _IRBuffer:
    return _alloc(shape, dtype, "local")


def alloc_var(dtype, init=None, scope="local.var"):
    return _alloc((1,), dtype, "var", init)


def alloc_global(shape, dtype, scope="global") -> _IRBuffer:
    """A global-memory workspace of the kernel (TileLang's ``T.alloc_global``): a hidden tensor parameter,
    after the declared ones, that every call allocates zero-filled on the target's tensor device and
    drops afterwards. Its contents live for one call: all the ``T.Kernel`` launches of that call see it."""
    b = current("T.alloc_global")
    buf = _IRBuffer("workspace", shape, dtype, "global")
    buf._unnamed = True
    b.workspaces.append(buf)
    return buf


# -- barriers -----------------------------------------------------------------------------------
# An mbarrier-style barrier, for kernels written as one block-level program (tilecore's model). A
# barrier holds its number of completed phases; ``arrive`` completes the current phase (the block
# arrives as one), and ``wait(parity)`` passes when the phase of that parity has completed, i.e. when
# ``phases % 2 != parity`` (mbarrier's try_wait.parity rule). In program order a wait that would not
# pass can never pass: it is a deadlock on a GPU, and it stops the kernel with KernelAssertionError
# here (targets without device_assert refuse the kernel at compile time).
def alloc_barrier(arrive_count=1):
    """``T.alloc_barrier(128)`` or ``T.alloc_barrier([128] * n)``: n barriers (index with ``bars[i]``)."""
    counts = list(arrive_count) if isinstance(arrive_count, (list, tuple)) else [arrive_count]
    b = current("T.alloc_barrier")
    if not b.in_kernel:
        raise ParseError("T.alloc_barrier must be called inside `with T.Kernel(...)`", b.span)
    buf = _IRBuffer("barrier", (len(counts),), "int32", "shared")
    buf._unnamed = True
    buf.is_barrier = True
    b.emit(Allocate(buf))
    for i in range(len(counts)):
        b.emit(Store(buf, (_ir_const(i),), _ir_const(0, "int32")))
    return buf


def _barrier(bar, what: str):
    b = current(what)
    if isinstance(bar, BufferLoad) and getattr(bar.buffer, "is_barrier", False):
        return bar.buffer, bar.indices
    if isinstance(bar, _IRBuffer) and getattr(bar, "is_barrier", False):
        return bar, (_ir_const(0),)
    raise ParseError(f"{what}: the barrier must come from T.alloc_barrier (a barrier or bars[i])", b.span)


def barrier_arrive(mbarrier, *_args, **_kwargs) -> None:
    """Complete the barrier's current phase (the block arrives as one)."""
    buf, idx = _barrier(mbarrier, "T.barrier_arrive")
    current().emit(Store(buf, idx, binary("add", BufferLoad(buf, idx), _ir_const(1, "int32"))))


def barrier_wait(mbarrier, parity=0, *_args, **_kwargs) -> None:
    """Wait until the barrier's phase of ``parity`` (0 or 1) has completed."""
    buf, idx = _barrier(mbarrier, "T.barrier_wait")
    done = compare("ne", binary("bitand", BufferLoad(buf, idx), _ir_const(1, "int32")),
                   binary("bitand", as_expr(parity, "int32"), _ir_const(1, "int32")))
    span = current().span
    current().emit(Assert(done, f"T.barrier_wait on {buf.name} at {span} can never complete in program order "
                                "(its phase is not arrived before the wait): tilecore runs the block as one "
                                "program, so a producer must arrive before its consumer waits"))


mbarrier_arrive = barrier_arrive


def mbarrier_wait_parity(mbarrier, parity=0, *_args, **_kwargs) -> None:
    barrier_wait(mbarrier, parity)


# -- tile ops -----------------------------------------------------------------------------------
copy, fill, clear, gemm, cumsum = _ops.copy, _ops.fill, _ops.clear, _ops.gemm, _ops.cumsum


class GemmWarpPolicy(_enum.IntEnum):
    """``T.gemm(..., policy=T.GemmWarpPolicy.FullRow)``: how a block splits a GEMM tile (a hint)."""

    Square = 0
    FullRow = 1
    FullCol = 2


def reduce_sum(src, dst, dim=-1, clear=True): _ops.reduce("sum", src, dst, dim, clear)
def reduce_max(src, dst, dim=-1, clear=True): _ops.reduce("max", src, dst, dim, clear)
def reduce_min(src, dst, dim=-1, clear=True): _ops.reduce("min", src, dst, dim, clear)
def reduce_abssum(src, dst, dim=-1, clear=True): _ops.reduce("abssum", src, dst, dim, clear)
def reduce_absmax(src, dst, dim=-1, clear=True): _ops.reduce("absmax", src, dst, dim, clear)


def atomic_add(dst, value, memory_order=None, return_prev=False, use_tma=False):
    """TileLang's ``T.atomic_add``: ``dst += value`` atomically. With ``return_prev=True`` (a point ``dst``) the
    call's value is the element's value before the update (D69), in ``memory_order`` (None: ``"relaxed"``;
    ``"acquire"``, ``"release"``, ``"acq_rel"``; ``"seq_cst"`` is taken as ``"acq_rel"``) for every block of the
    launch; evaluated once where it stands. Put it in a ``T.Parallel`` loop (each iteration's thread updates
    once) or store it to a buffer."""
    return _ops.atomic("add", dst, value, memory_order, return_prev)


def atomic_max(dst, value, memory_order=None, return_prev=False):
    return _ops.atomic("max", dst, value, memory_order, return_prev)


def atomic_min(dst, value, memory_order=None, return_prev=False):
    return _ops.atomic("min", dst, value, memory_order, return_prev)


def fence(scope: str = "device", order: str = "acq_rel") -> None:
    """A memory fence of the executing thread (D69): ``scope`` ``"block"`` or ``"device"``, ``order``
    ``"release"``, ``"acquire"`` or ``"acq_rel"`` (tilecore's; TileLang has none by this name)."""
    from ..ir import Fence as _Fence

    try:
        f = _Fence(scope=scope, order=order)
    except ValueError as e:
        raise TypeError(f"T.fence: {e}") from None
    current("T.fence").emit(f)


def im2col(img, col, nhw_step, c_step, kernel, stride, dilation, pad, eviction_policy=None, annotations=None):
    """TileLang's ``T.im2col`` (docs/language.md); ``eviction_policy`` and ``annotations`` are hints."""
    _ops.im2col(img, col, nhw_step, c_step, kernel, stride, dilation, pad)


c2d_im2col = im2col  # TileLang's older name (deprecated there)


# -- hints --------------------------------------------------------------------------------------
def use_swizzle(panel_size: int = 10, order: str = "row", enable: bool = True) -> None:
    """Rasterize blocks in panels of ``panel_size`` for cache reuse (a hint; backends may ignore it)."""
    current("T.use_swizzle").emit(Hint("use_swizzle", {"panel_size": int(panel_size), "order": order,
                                                       "enable": bool(enable)}))


def annotate_layout(layouts: dict) -> None:
    """Request layouts for shared buffers / fragments (a hint; backends may ignore it)."""
    current("T.annotate_layout").emit(Hint("annotate_layout", {getattr(k, "name", str(k)): v
                                                               for k, v in layouts.items()}))


def annotate_padding(paddings: dict) -> None:
    current("T.annotate_padding").emit(Hint("annotate_padding", {getattr(k, "name", str(k)): v
                                                                 for k, v in paddings.items()}))


def no_set_max_nreg() -> None:
    current("T.no_set_max_nreg").emit(Hint("no_set_max_nreg", {}))


def disable_warp_group_reg_alloc() -> None:
    """A hint for warp-specialized Hopper kernels (do not rebalance registers); backends may ignore it."""
    current("T.disable_warp_group_reg_alloc").emit(Hint("disable_warp_group_reg_alloc", {}))


class Layout:
    """``T.Layout(shape, lambda *idx: [...])``: an index map, for T.annotate_layout (a hint).

    ``layout.map(*idx)`` applies it; a backend may use it or ignore it, results do not depend on it.
    """

    def __init__(self, shape, forward_fn):
        self.shape = tuple(shape) if isinstance(shape, (list, tuple)) else (shape,)
        self.forward_fn = forward_fn

    def map(self, *idx):
        return list(self.forward_fn(*idx))

    def __repr__(self) -> str:
        return f"Layout{self.shape}"


class Fragment(Layout):
    """``T.Fragment(shape, forward_thread_fn=..., forward_index_fn=...)``: a register layout (a hint)."""

    def __init__(self, shape, forward_fn=None, forward_thread_fn=None, forward_index_fn=None, replicate=1, **_kw):
        super().__init__(shape, forward_index_fn or forward_fn or (lambda *i: list(i)))
        self.forward_thread_fn = forward_thread_fn
        self.replicate = replicate


# -- thread-level programming -------------------------------------------------------------------
# A tilecore kernel body is one block-level program (docs/language.md, T.Kernel): there is no thread
# index in the language, so per-thread code cannot be expressed. These names exist so that a TileLang
# kernel that uses them fails with the reason and the replacement, not with an AttributeError.
def _thread_level(name: str, instead: str):
    def f(*_args, **_kwargs):
        b = current(f"T.{name}")
        raise UnsupportedFeatureError(
            f"T.{name} is not supported: tilecore kernels are block-level programs with no per-thread code "
            f"(see docs/language.md, T.Kernel); {instead}", b.span, feature=f"language:{name}")
    f.__name__ = name
    return f


_TILE_INSTEAD = "write the work as T.Parallel loops and tile ops (T.reduce_*, T.copy, T.atomic_add)"
get_thread_binding = _thread_level("get_thread_binding", _TILE_INSTEAD)
get_thread_bindings = _thread_level("get_thread_bindings", _TILE_INSTEAD)
for _n in ("shfl_sync", "shfl_xor", "shfl_down", "shfl_up", "tvm_warp_shuffle", "tvm_thread_allreduce",
           "alloc_reducer", "finalize_reducer"):
    globals()[_n] = _thread_level(_n, "use T.reduce_sum / T.reduce_max over a fragment instead")


# -- debugging ----------------------------------------------------------------------------------
def print(obj, msg: str = "") -> None:  # noqa: A001
    """Print a scalar or a whole buffer from the kernel (every block prints)."""
    b = current("T.print")
    if isinstance(obj, _IRBuffer):
        b.emit(Print(msg or obj.name, buffer=obj))
    else:
        b.emit(Print(msg, value=as_expr(obj)))


def device_assert(cond, msg: str = "device_assert failed") -> None:
    """Stop the kernel when ``cond`` is false; the call raises KernelAssertionError with ``msg``."""
    b = current("T.device_assert")
    c = const_value(cond) if isinstance(cond, Expr) else cond
    if isinstance(cond, Expr) and c is None:
        b.emit(Assert(cond, msg))
    elif not c:
        raise ParseError(f"T.device_assert is always false: {msg}", b.span)


def assume(cond) -> None:
    """Promise the compiler that the integer condition ``cond`` holds from here to the end of the enclosing
    block (TileLang's ``T.assume``), e.g. ``T.assume(N % 8 == 0)`` or ``T.assume(i < N)``: bounds guards it
    makes redundant are left out and copies it proves aligned are vectorized. Nothing checks it at run time
    (a false promise gives wrong results or faults), except in checked mode (``tilecore.checked``), where it
    is asserted."""
    b = current("T.assume")
    c = const_value(cond) if isinstance(cond, Expr) else cond
    if isinstance(cond, Expr) and c is None:
        b.emit(Assume(cond))
    elif not c:
        raise ParseError("T.assume of a condition that is always false", b.span)


# -- math ---------------------------------------------------------------------------------------
def _float_arg(x) -> Expr:
    e = as_expr(x, "float32")
    return e if is_float(e.dtype) else _to("float32", e)


def _unary(name):
    def f(x):
        e = _float_arg(x)
        return Call(name, (e,), e.dtype)
    f.__name__ = name
    return f


exp, exp2, exp10, log, log2, log10 = (_unary(n) for n in ("exp", "exp2", "exp10", "log", "log2", "log10"))
sqrt, rsqrt, tanh, sigmoid, erf = (_unary(n) for n in ("sqrt", "rsqrt", "tanh", "sigmoid", "erf"))
sin, cos, tan, floor, ceil, round, trunc = (_unary(n) for n in ("sin", "cos", "tan", "floor", "ceil", "round", "trunc"))  # noqa: A001


def pow(x, y):  # noqa: A001
    e = _float_arg(x)
    return Call("pow", (e, _to(e.dtype, as_expr(y, e.dtype))), e.dtype)


def abs(x):  # noqa: A001
    e = as_expr(x)
    return Call("abs", (e,), e.dtype)


def max(a, b):  # noqa: A001
    return binary("max", a, b)


def min(a, b):  # noqa: A001
    return binary("min", a, b)


def floordiv(a, b):
    """``a // b`` rounded toward minus infinity (Python's ``//``)."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return binary("floordiv", a, b)


def floormod(a, b):
    """``a % b`` with the sign of ``b`` (Python's ``%``)."""
    if isinstance(a, int) and isinstance(b, int):
        return a % b
    return binary("floormod", a, b)


def clamp(x, lo, hi):
    """``min(max(x, lo), hi)`` (TileLang's order: the lower bound applies first)."""
    return binary("min", binary("max", x, lo), hi)


def if_then_else(cond, t, f):
    return select(cond, t, f)


Select = if_then_else


def infinity(dtype="float32"):
    return FloatImm(_math.inf, canonical(dtype))


_FINITE_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
               "float64": 1.7976931348623157e308, "float8_e4m3": 448.0, "float8_e5m2": 57344.0}


def max_value(dtype):
    """The largest finite value of ``dtype`` (use T.infinity for +inf)."""
    d = canonical(dtype)
    return FloatImm(_FINITE_MAX[d], d) if is_float(d) else IntImm(_max_value(d), d)


def min_value(dtype):
    """The most negative finite value of ``dtype`` (use -T.infinity for -inf)."""
    d = canonical(dtype)
    return FloatImm(-_FINITE_MAX[d], d) if is_float(d) else IntImm(_min_value(d), d)


def ceildiv(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return binary("floordiv", binary("add", a, binary("sub", b, 1)), b)


def cast(value, dtype):
    """``T.cast(x, dtype)`` (TileLang's argument order)."""
    return _to(dtype, value)


def Cast(dtype, value):  # noqa: N802
    return _to(dtype, value)


# Fast intrinsics: may trade accuracy for speed on a target that has faster variants.
def _fast(name):
    def f(x):
        e = _float_arg(x)
        return Call("fast_" + name, (e,), e.dtype)
    f.__name__ = "__" + name
    return f


for _n in ("exp", "exp10", "log", "log2", "log10", "tan", "cos", "sin"):
    globals()["__" + _n] = _fast(_n)


# IEEE intrinsics: correctly rounded, never contracted or approximated, whatever the pass config.
def _ieee(name, arity):
    def f(*args, rounding="rn"):
        if len(args) != arity:
            raise TypeError(f"T.{name} takes {arity} arguments")
        es = [_float_arg(a) for a in args]
        return Call(name, tuple(_to(es[0].dtype, e) for e in es), es[0].dtype, (("rounding", rounding),))
    f.__name__ = name
    return f


ieee_add, ieee_sub, ieee_mul, ieee_fdiv = (_ieee(n, 2) for n in ("ieee_add", "ieee_sub", "ieee_mul", "ieee_fdiv"))
ieee_fmaf = _ieee("ieee_fmaf", 3)
ieee_frcp, ieee_fsqrt, ieee_frsqrt = (_ieee(n, 1) for n in ("ieee_frcp", "ieee_fsqrt", "ieee_frsqrt"))

__all__ = [n for n in dir() if not n.startswith("_")] + ["__" + n for n in
                                                        ("exp", "exp10", "log", "log2", "log10", "tan", "cos", "sin")]
