"""Scalar expressions of the tile IR.

Expressions are immutable trees with a dtype. Python operators build them (``i * 16 + j``), folding
constants as they go, so static shapes stay plain numbers. ``==`` builds a comparison like every other
operator; use :func:`same` to compare two trees structurally. An expression cannot be used as a
Python ``bool`` unless it is a constant: the language turns ``if`` on a symbolic value into IR instead.
"""
from __future__ import annotations

import math
import operator
from typing import Any

from .dtypes import DType, canonical, is_float, promote

INDEX = DType("int32")  # dtype of loop variables, block indices and shape symbols


class Expr:
    __slots__ = ("dtype",)
    dtype: str

    # -- arithmetic ---------------------------------------------------------------------------
    def __add__(self, o): return binary("add", self, o)
    def __radd__(self, o): return binary("add", o, self)
    def __sub__(self, o): return binary("sub", self, o)
    def __rsub__(self, o): return binary("sub", o, self)
    def __mul__(self, o): return binary("mul", self, o)
    def __rmul__(self, o): return binary("mul", o, self)
    def __truediv__(self, o): return binary("div", self, o)
    def __rtruediv__(self, o): return binary("div", o, self)
    def __floordiv__(self, o): return binary("floordiv", self, o)
    def __rfloordiv__(self, o): return binary("floordiv", o, self)
    def __mod__(self, o): return binary("floormod", self, o)
    def __rmod__(self, o): return binary("floormod", o, self)
    def __pow__(self, o): return Call("pow", (self, as_expr(o, self.dtype)), self.dtype)
    def __neg__(self): return binary("sub", const(0, self.dtype), self)
    def __pos__(self): return self
    # `&` `|` `~` are logical on booleans (as in TVMScript conditions) and bitwise on integers
    def __and__(self, o): return logic_and(self, o) if self.dtype == "bool" else binary("bitand", self, o)
    def __rand__(self, o): return logic_and(o, self) if self.dtype == "bool" else binary("bitand", o, self)
    def __or__(self, o): return logic_or(self, o) if self.dtype == "bool" else binary("bitor", self, o)
    def __ror__(self, o): return logic_or(o, self) if self.dtype == "bool" else binary("bitor", o, self)
    def __invert__(self): return logic_not(self) if self.dtype == "bool" else binary("xor", self, const(-1, self.dtype))
    def __lshift__(self, o): return binary("shl", self, o)
    def __rshift__(self, o): return binary("shr", self, o)
    def __xor__(self, o): return binary("xor", self, o)

    # -- comparisons ----------------------------------------------------------------------------
    def __lt__(self, o): return compare("lt", self, o)
    def __le__(self, o): return compare("le", self, o)
    def __gt__(self, o): return compare("gt", self, o)
    def __ge__(self, o): return compare("ge", self, o)
    def __eq__(self, o): return compare("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return compare("ne", self, o)  # type: ignore[override]
    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError(
            f"the symbolic value {self} has no Python truth value; use it in an `if` inside the kernel "
            "(it becomes a branch in the IR) or T.if_then_else(cond, a, b)"
        )

    def astype(self, dtype) -> "Expr":
        return cast(dtype, self)

    def __repr__(self) -> str:
        from .printer import expr_str

        return expr_str(self)


class Var(Expr):
    __slots__ = ("name",)

    def __init__(self, name: str, dtype=INDEX):
        self.name = name
        self.dtype = canonical(dtype)


class IntImm(Expr):
    __slots__ = ("value",)

    def __init__(self, value: int, dtype=INDEX):
        self.value = int(value)
        self.dtype = canonical(dtype)


class FloatImm(Expr):
    __slots__ = ("value",)

    def __init__(self, value: float, dtype="float32"):
        self.value = float(value)
        self.dtype = canonical(dtype)


class BinOp(Expr):
    """``op`` is one of add sub mul div floordiv floormod min max shl shr xor bitand bitor."""

    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr, dtype: str):
        self.op, self.a, self.b, self.dtype = op, a, b, canonical(dtype)


class Cmp(Expr):
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr):
        self.op, self.a, self.b, self.dtype = op, a, b, DType("bool")


class Logic(Expr):
    """``and`` / ``or`` / ``not`` on boolean expressions (``b`` is None for ``not``)."""

    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr | None = None):
        self.op, self.a, self.b, self.dtype = op, a, b, DType("bool")


class Select(Expr):
    __slots__ = ("cond", "t", "f")

    def __init__(self, cond: Expr, t: Expr, f: Expr):
        self.cond, self.t, self.f, self.dtype = cond, t, f, t.dtype


class Cast(Expr):
    __slots__ = ("value",)

    def __init__(self, dtype, value: Expr):
        self.dtype, self.value = canonical(dtype), as_expr(value)


class Call(Expr):
    """An intrinsic call: math (``exp``, ``sqrt``, ...), fast (``fast_exp``) or IEEE (``ieee_add``)."""

    __slots__ = ("name", "args", "attrs")

    def __init__(self, name: str, args: tuple, dtype, attrs: tuple = ()):
        self.name, self.args, self.dtype, self.attrs = name, tuple(args), canonical(dtype), tuple(attrs)


class ThreadIndex(Expr):
    """The flat index of the executing thread inside its block (0 .. prod(threads) - 1).

    Introduced by thread distribution (``tilecore.simt_distribute``); emitters spell it through
    ``thread_index_expr``.
    """

    __slots__ = ()

    def __init__(self, dtype=INDEX):
        self.dtype = canonical(dtype)


class ShuffleXor(Expr):
    """``value`` as held by the thread whose index is this thread's xor ``mask``, within aligned groups of
    ``width`` threads that run in lockstep (a warp, a wave, a subgroup). Every thread of the group must
    evaluate it. Produced by fragment lowerings (a row reduction across the threads of a layout);
    emitters spell it (``shuffle_xor`` in a C-family emitter), and a backend without shuffles never gets it.
    """

    __slots__ = ("value", "mask", "width")

    def __init__(self, value, mask: int, width: int):
        self.value, self.mask, self.width, self.dtype = value, int(mask), int(width), value.dtype


class ShuffleIndex(Expr):
    """``value`` as held by lane ``lane`` of this thread's aligned group of ``width`` threads that run in
    lockstep (a warp, a wave, a subgroup): the thread ``ThreadIndex() // width * width + lane``. ``lane`` is
    an integer expression in ``[0, width)`` that may differ from thread to thread (an indexed shuffle, where
    :class:`ShuffleXor` pairs threads by a constant distance). Every thread of the group must evaluate it.
    Produced by layout conversions (a permutation of registers within the group); emitters spell it
    (``shuffle_index`` in a C-family emitter), and a backend whose capabilities do not declare
    ``features.shuffle_index`` never gets it.
    """

    __slots__ = ("value", "lane", "width")

    def __init__(self, value, lane, width: int):
        self.value, self.lane, self.width, self.dtype = value, as_expr(lane), int(width), value.dtype


class ShuffleWidth(Expr):
    """How many consecutive threads exchange registers through :class:`ShuffleXor` on this run, on a
    target whose lockstep group size is known only at run time (capability ``execution.simd_width:
    dynamic``): a power of two, the same on every thread of the block (a branch on it is uniform), 1
    where no exchange is possible. Threads ``ThreadIndex() // w * w .. + w - 1`` form an aligned group,
    so ``ShuffleXor(v, m, ...)`` reaches its partner wherever ``m < ShuffleWidth()``. Produced by fragment
    lowerings (a row reduction that shuffles within the group and meets the other groups in shared
    memory); emitters spell it (``shuffle_width_expr`` in a C-family emitter).
    """

    __slots__ = ()

    def __init__(self, dtype=INDEX):
        self.dtype = canonical(dtype)


class AtomicRet(Expr):
    """``buffer[indices] = op(buffer[indices], value)`` done atomically, its value the element's value BEFORE the
    update (TileLang's ``T.atomic_add(..., return_prev=True)``). ``order`` is the memory order of the access
    (``"relaxed"``, ``"acquire"``, ``"release"``, ``"acq_rel"``), ``scope`` who must see it in that order
    (``"block"``: the block's threads; ``"device"``: every block of the launch). It has a side effect: it is
    evaluated exactly once where it stands (a :class:`~tilecore.ir.Bind` value, or the value of a block-level
    :class:`~tilecore.ir.Store`, which one thread of the block runs); no pass duplicates, moves or drops it
    (:func:`same` and the simplifier's keys tell every instance apart). An emitter spells it or refuses with
    a :class:`~tilecore.errors.CompileError` (decision D69)."""

    __slots__ = ("op", "buffer", "indices", "value", "order", "scope")

    def __init__(self, op: str, buffer, indices, value, order: str = "relaxed", scope: str = "device"):
        if op not in ATOMIC_OPS:
            raise ValueError(f"atomic op {op!r}: expected one of {', '.join(ATOMIC_OPS)}")
        if order not in MEMORY_ORDERS:
            raise ValueError(f"memory order {order!r}: expected one of {', '.join(MEMORY_ORDERS)}")
        if scope not in MEMORY_SCOPES:
            raise ValueError(f"memory scope {scope!r}: expected one of {', '.join(MEMORY_SCOPES)}")
        self.op, self.buffer, self.indices = op, buffer, tuple(as_expr(i) for i in indices)
        self.value, self.order, self.scope, self.dtype = as_expr(value, buffer.dtype), order, scope, buffer.dtype


#: the read-modify-write operations of :class:`AtomicRet` and ``Atomic``
ATOMIC_OPS = ("add", "max", "min")
#: memory orders of atomics and fences (C++'s names); ``"relaxed"`` orders nothing around the access
MEMORY_ORDERS = ("relaxed", "acquire", "release", "acq_rel")
#: who observes an atomic or a fence in its order: the block's threads, or every thread of the launch
MEMORY_SCOPES = ("block", "device")


class BufferLoad(Expr):
    __slots__ = ("buffer", "indices")

    def __init__(self, buffer, indices):
        self.buffer, self.indices, self.dtype = buffer, tuple(as_expr(i) for i in indices), buffer.dtype

    def __getitem__(self, idx):  # `x[0]` on a T.alloc_var value
        return self.buffer[idx]


# -- construction helpers -----------------------------------------------------------------------

def const(value: Any, dtype=None) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return IntImm(int(value), dtype or "bool")
    if isinstance(value, int):
        if dtype is not None and is_float(dtype):
            return FloatImm(float(value), dtype)
        return IntImm(value, dtype or INDEX)
    if isinstance(value, float):
        if dtype is not None and not is_float(dtype):
            return IntImm(int(value), dtype)
        return FloatImm(value, dtype or "float32")
    if hasattr(value, "item"):  # numpy scalars
        return const(value.item(), dtype)
    raise TypeError(f"cannot use {value!r} ({type(value).__name__}) as a value in a kernel")


def as_expr(value: Any, like: str | None = None) -> Expr:
    """``value`` as an Expr; Python numbers take the dtype ``like`` when given."""
    return value if isinstance(value, Expr) else const(value, like)


def is_const(e: Any) -> bool:
    return isinstance(e, (int, float, IntImm, FloatImm)) and not isinstance(e, bool) or isinstance(e, bool)


def const_value(e: Any):
    """The Python value of a constant expression, or None."""
    if isinstance(e, (bool, int, float)):
        return e
    if isinstance(e, (IntImm, FloatImm)):
        return e.value
    return None


_FOLD = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "min": min, "max": max, "shl": operator.lshift, "shr": operator.rshift, "xor": operator.xor,
    "bitand": operator.and_, "bitor": operator.or_,
}
_CMP = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
        "eq": operator.eq, "ne": operator.ne}


def _operands(a, b):
    ea = a if isinstance(a, Expr) else None
    eb = b if isinstance(b, Expr) else None
    first = ea if ea is not None else eb
    like = first.dtype if first is not None else None
    # A Python float next to an integer expression makes the expression float32.
    if like is not None and not is_float(like) and isinstance(a if ea is None else b, float):
        like = "float32"
    return as_expr(a, like), as_expr(b, like)


def binary(op: str, a, b) -> Expr:
    a, b = _operands(a, b)
    dtype = promote(a.dtype, b.dtype)
    if a.dtype != dtype:
        a = cast(dtype, a)
    if b.dtype != dtype:
        b = cast(dtype, b)
    va, vb = const_value(a), const_value(b)
    if va is not None and vb is not None:
        if op in _FOLD:
            return const(_FOLD[op](va, vb), dtype)
        if vb != 0:
            if op == "div":
                return const(va / vb if is_float(dtype) else int(va / vb), dtype)
            if op == "floordiv":
                return const(va // vb, dtype)
            if op == "floormod":
                return const(va % vb, dtype)
    # identities that keep index arithmetic readable
    if op in ("add", "sub") and vb == 0:
        return a
    if op == "add" and va == 0:
        return b
    if op == "mul" and (va == 1 or vb == 1):
        return b if va == 1 else a
    if op == "mul" and not is_float(dtype) and (va == 0 or vb == 0):
        return const(0, dtype)
    if (op == "div" or op == "floordiv" and not is_float(dtype)) and vb == 1:  # float x // 1 is floor(x)
        return a
    return BinOp(op, a, b, dtype)


def compare(op: str, a, b) -> Expr:
    a, b = _operands(a, b)
    va, vb = const_value(a), const_value(b)
    if va is not None and vb is not None:
        return IntImm(int(_CMP[op](va, vb)), "bool")
    dtype = promote(a.dtype, b.dtype)
    return Cmp(op, a if a.dtype == dtype else cast(dtype, a), b if b.dtype == dtype else cast(dtype, b))


def logic_and(a, b) -> Expr:
    va, vb = const_value(a), const_value(b)
    if va is not None:
        return as_expr(b, "bool") if va else IntImm(0, "bool")
    if vb is not None:
        return as_expr(a, "bool") if vb else IntImm(0, "bool")
    return Logic("and", a, b)


def logic_or(a, b) -> Expr:
    va, vb = const_value(a), const_value(b)
    if va is not None:
        return IntImm(1, "bool") if va else as_expr(b, "bool")
    if vb is not None:
        return IntImm(1, "bool") if vb else as_expr(a, "bool")
    return Logic("or", a, b)


def logic_not(a) -> Expr:
    va = const_value(a)
    if va is not None:
        return IntImm(int(not va), "bool")
    return Logic("not", a)


def cast(dtype, value) -> Expr:
    dtype = canonical(dtype)
    value = as_expr(value, dtype)
    if value.dtype == dtype:
        return value
    v = const_value(value)
    if v is not None and dtype in ("float32", "float64", "int32", "int64", "bool"):
        if is_float(dtype):
            return FloatImm(float(v), dtype)
        if isinstance(v, float) and not math.isfinite(v):
            return Cast(dtype, value)
        return IntImm(int(v), dtype)
    return Cast(dtype, value)


def select(cond, t, f) -> Expr:
    t, f = _operands(t, f)
    dtype = promote(t.dtype, f.dtype)
    t, f = cast(dtype, t), cast(dtype, f)
    vc = const_value(cond)
    if vc is not None:
        return t if vc else f
    return Select(as_expr(cond, "bool"), t, f)


def minimum(a, b) -> Expr:
    return binary("min", a, b)


def maximum(a, b) -> Expr:
    return binary("max", a, b)


def same(a, b) -> bool:
    """Structural equality of two expressions (or Python numbers)."""
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        return const_value(a) is not None and const_value(a) == const_value(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, (Var, AtomicRet)):  # an atomic is its own value: two of them are two updates
        return a is b
    if isinstance(a, (IntImm, FloatImm)):
        return a.value == b.value and a.dtype == b.dtype
    if isinstance(a, BufferLoad):
        return a.buffer is b.buffer and all(same(x, y) for x, y in zip(a.indices, b.indices))
    for slot in type(a).__slots__:
        x, y = getattr(a, slot), getattr(b, slot)
        if isinstance(x, tuple):
            if len(x) != len(y) or not all(same(p, q) if isinstance(p, Expr) else p == q for p, q in zip(x, y)):
                return False
        elif isinstance(x, Expr) or isinstance(y, Expr):
            if not (isinstance(x, Expr) and isinstance(y, Expr) and same(x, y)):
                return False
        elif x != y:
            return False
    return a.dtype == b.dtype


def walk_expr(e, fn) -> None:
    """Call ``fn`` on ``e`` and every sub-expression, parents first."""
    if not isinstance(e, Expr):
        return
    fn(e)
    for slot in type(e).__slots__:
        v = getattr(e, slot, None)
        for item in (v if isinstance(v, tuple) else (v,)):
            if isinstance(item, Expr):
                walk_expr(item, fn)
