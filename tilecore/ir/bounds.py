"""A small prover for index bounds: is ``e >= 0`` whenever this statement runs?

Facts come from where a statement sits: a loop variable lies in ``[start, start + extent - 1]``, a
block index in ``[0, grid - 1]``, the thread index in ``[0, threads - 1]``, a bound scalar equals its value, and the conditions of enclosing
``if`` statements (and ``T.if_then_else`` / ``and`` operands) hold. :class:`Facts` holds them;
:meth:`Facts.proves` answers for one integer comparison.

The method is interval arithmetic on linear forms: ``e`` is written as ``sum(coeff * atom) + const``
(see :mod:`.simplify`) and each bounded atom is replaced by its lower bound (positive coefficient) or
upper bound (negative coefficient), recursively, until what is left is a constant or an expression
in free symbols (shape variables, scalar parameters) that stand for themselves. ``floordiv`` /
``div`` by a positive constant, ``floormod`` by a positive constant, ``min``, ``max`` and integer
casts are understood; anything else (a value read from memory) is unknown and proves nothing. The
answer is sound (True only when it holds) and may be False for true facts it cannot see.

Divisibility is the third question (:meth:`Facts.divisor`, :meth:`Facts.proves_multiple`): the largest known
``k`` that divides a linear form, from its constant coefficients (``by * 128``), bound scalars, products, and the
conditions ``x % k == 0`` (``floormod``) of enclosing ``if`` statements and ``T.assume``; a variable that ranges over
consecutive integers (a loop or block index) and a free symbol without such a condition divide by 1. It answers
"is this offset a multiple of a vector run?" (16-byte alignment of asynchronous copies with dynamic shapes).

Two questions, two tools. :class:`Facts` answers "does this hold whenever the statement runs?" over
symbolic bounds (the guard pass: elide a guard only when the access is surely in bounds).
:func:`int_bounds` answers "which integers can this take?" over constant ranges (the static check:
refuse an on-chip index only when it is out of range for every value)."""
from __future__ import annotations

import math

from .dtypes import is_float
from .expr import BinOp, Cast, Cmp, Expr, IntImm, Logic, ThreadIndex, Var, binary, const_value
from .memo import MISS, IdentityMemo
from .simplify import _linear, atom_key, simplify

_DEPTH = 8
THREADS = "threads"  # the key of the thread index's range in Facts.ranges


class Facts:
    """Known ranges of variables (inclusive ``(lo, hi)`` expressions) and conditions known to hold."""

    def __init__(self, ranges: dict | None = None, known: tuple = (), divs: dict | None = None):
        self.ranges = dict(ranges or {})  # id(var) -> (lo, hi); either may be None (unknown)
        self.known = tuple(known)         # expressions g with g >= 0
        self.divs = dict(divs or {})      # atom_key(x) -> (x, k): k divides x

    def with_range(self, var: Var, lo, hi) -> "Facts":
        out = Facts.__new__(Facts)  # one copy of the ranges; the conditions are shared (never changed in place)
        out.ranges, out.known, out.divs = {**self.ranges, id(var): (lo, hi)}, self.known, self.divs
        return out

    def with_threads(self, n: int) -> "Facts":
        """These facts where a block runs ``n`` threads (:class:`~tilecore.ir.ThreadIndex` in ``[0, n - 1]``)."""
        return Facts({**self.ranges, THREADS: (0, int(n) - 1)}, self.known, self.divs)

    def with_cond(self, cond, holds: bool = True) -> "Facts":
        """These facts plus ``cond`` (or its negation): each integer comparison and divisibility it implies."""
        new = tuple(nonneg_forms(cond, holds))
        divs = dict(self.divs)
        for x, k in multiple_forms(cond, holds):
            if not _pure(x):
                continue  # a value read from memory may change after the test: no lasting fact
            x = simplify(x)
            key = atom_key(x)
            old = divs.get(key, (x, 1))[1]
            divs[key] = (x, old * k // math.gcd(old, k))
        if not new and len(divs) == len(self.divs) and all(divs[k] == self.divs.get(k) for k in divs):
            return self
        return Facts(self.ranges, self.known + new, divs)

    # -- divisibility -------------------------------------------------------------------------------------
    def divisor(self, e: Expr, depth: int = 0) -> int:
        """The largest ``k`` these facts show divides the integer ``e`` (0 when ``e`` is 0: every ``k`` does)."""
        if is_float(e.dtype):
            return 1
        terms: dict = {}
        g = abs(_linear(e, terms, 1))  # the linear form of e is simplify(e)'s (D65: no rebuild)
        for atom, coeff in terms.values():
            if coeff == 0 or g == 1:
                continue
            g = math.gcd(g, abs(coeff) * self._atom_divisor(atom, depth))
        return g

    def _atom_divisor(self, a: Expr, depth: int) -> int:
        if not self.divs and not isinstance(a, Var) and _thread_only(a):
            # no divisibility conditions and an atom of the thread index and constants: a function of the atom (D65)
            key = (id(a), depth)
            hit = _DIVISORS.get(key, a)
            return _DIVISORS.put(key, self._atom_divisor_of(a, depth), a) if hit is MISS else hit
        return self._atom_divisor_of(a, depth)

    def _atom_divisor_of(self, a: Expr, depth: int) -> int:
        known = self.divs.get(atom_key(a))
        k = known[1] if known is not None else 1
        if depth > _DEPTH:
            return k
        if isinstance(a, Var):
            r = self.ranges.get(id(a))
            if r is not None and r[0] is not None and r[1] is not None:
                width = const_value(simplify(binary("sub", r[1], r[0])))
                if width == 0:  # a bound scalar (or a one-value loop) is its value
                    return _lcm(k, self.divisor(r[0], depth + 1))
            return k  # a range of consecutive integers, or a free symbol: only what a condition says
        if isinstance(a, Cast) and not is_float(a.dtype) and not is_float(a.value.dtype):
            return _lcm(k, self.divisor(a.value, depth + 1))
        if isinstance(a, BinOp) and not is_float(a.dtype):
            if a.op == "mul":
                return _lcm(k, self.divisor(a.a, depth + 1) * self.divisor(a.b, depth + 1))
            d = const_value(a.b)
            if a.op == "floormod" and isinstance(d, int) and d > 0:
                # x - d * floor(x / d): what divides both x and d divides it
                return _lcm(k, math.gcd(self.divisor(a.a, depth + 1), d))
            if a.op == "shl" and isinstance(d, int) and 0 <= d < 63:
                return _lcm(k, self.divisor(a.a, depth + 1) << d)
        return k

    def proves_multiple(self, e: Expr, k: int) -> bool:
        """True when ``e`` is surely a multiple of ``k`` (``k >= 1``)."""
        return self.divisor(e) % k == 0

    def bound(self, e: Expr, upper: bool, depth: int = 0):
        """An expression free of bounded variables that is ``>= e`` (upper) or ``<= e``; None if unknown."""
        terms: dict = {}
        out: Expr = IntImm(_linear(e, terms, 1), e.dtype)  # simplify(e)'s linear form (D65)
        for atom, coeff in terms.values():
            if coeff == 0:
                continue
            b = self._atom_bound(atom, upper if coeff > 0 else not upper, depth)
            if b is None:
                return None
            out = binary("add", out, binary("mul", b, coeff))
        return simplify(out)

    def _atom_bound(self, a: Expr, upper: bool, depth: int):
        if depth > _DEPTH:
            return None
        if not isinstance(a, (Var, ThreadIndex)) and _thread_only(a):
            # an atom of the thread index and constants: its bound depends on the block's size alone (D65: the
            # registers of a fragment share their thread part; the passes ask for it again and again)
            # (a division's operand not shown nonnegative by its bound may be by a known condition: those too)
            key = (id(a), upper, depth, self.ranges.get(THREADS), id(self.known))
            hit = _BOUNDS.get(key, a, self.known)
            return _BOUNDS.put(key, self._atom_bound_of(a, upper, depth), a, self.known) if hit is MISS else hit
        return self._atom_bound_of(a, upper, depth)

    def _atom_bound_of(self, a: Expr, upper: bool, depth: int):
        if isinstance(a, ThreadIndex):  # the thread's index in its block: [0, threads - 1] where the launch says
            r = self.ranges.get(THREADS)
            return None if r is None else IntImm(r[1] if upper else r[0], a.dtype)
        if isinstance(a, Var):
            if id(a) not in self.ranges:
                return a  # a free symbol (a shape or a scalar parameter) is its own bound
            b = self.ranges[id(a)][1 if upper else 0]
            return None if b is None else self.bound(b, upper, depth + 1)
        if isinstance(a, Cast) and not is_float(a.dtype) and not is_float(a.value.dtype):
            return self.bound(a.value, upper, depth + 1)
        if isinstance(a, BinOp) and not is_float(a.dtype):
            d = const_value(a.b)
            if a.op in ("floordiv", "div") and isinstance(d, int) and d > 0:
                x = self.bound(a.a, upper, depth + 1)
                if a.op == "div" and (x is None or not self.proves_nonneg(a.a, depth + 1)):
                    return None  # truncation is monotone too, but keep to the plain case
                return None if x is None else simplify(binary("floordiv", x, d))
            if a.op == "floormod" and isinstance(d, int) and d > 0:
                return IntImm(d - 1 if upper else 0, a.dtype)
            if a.op in ("min", "max"):
                x, y = self.bound(a.a, upper, depth + 1), self.bound(a.b, upper, depth + 1)
                if x is None or y is None:
                    # the bound of min from above (max from below) needs only one side
                    keep = x if x is not None else y
                    return keep if (a.op == "min") == upper else None
                return simplify(binary(a.op, x, y))
        return None

    def proves_nonneg(self, e: Expr, depth: int = 0) -> bool:
        lo = self.bound(e, False, depth)
        v = const_value(lo) if lo is not None else None
        if v is not None and v >= 0:
            return True
        for g in self.known:  # e >= c * g >= 0 for a known g and c > 0
            for c in _scales(e, g):
                lo = self.bound(binary("sub", e, binary("mul", g, c) if c != 1 else g), False, depth)
                v = const_value(lo) if lo is not None else None
                if v is not None and v >= 0:
                    return True
        return False

    def proves(self, cond: Expr) -> bool:
        """True when the integer condition ``cond`` (comparisons and ``x % k == 0`` joined by ``and``) surely holds."""
        mults = multiple_forms(cond, True)
        if mults and _is_multiple(cond):
            return all(self.proves_multiple(x, k) for x, k in mults)
        if isinstance(cond, Logic) and cond.op == "and":
            return self.proves(cond.a) and self.proves(cond.b)
        forms = nonneg_forms(cond, True, exact=True)
        return forms is not None and all(self.proves_nonneg(g) for g in forms)


#: the prover's answers for atoms of the thread index and constants, by the atom's identity (an expression is never
#: changed after it is built; each entry keeps its atom alive, so the id is not reused while it is remembered)
_BOUNDS = IdentityMemo(1 << 14)
_DIVISORS = IdentityMemo(1 << 14)
_THREAD_ONLY = IdentityMemo(1 << 14)


def _thread_only(e) -> bool:
    """``e`` is integer arithmetic on the thread index and constants (no variable, no memory, no call)."""
    hit = _THREAD_ONLY.get(id(e), e)
    if hit is not MISS:
        return hit
    if isinstance(e, (ThreadIndex, IntImm)):
        out = True
    elif isinstance(e, BinOp):
        out = not is_float(e.dtype) and _thread_only(e.a) and _thread_only(e.b)
    elif isinstance(e, Cast):
        out = not is_float(e.dtype) and _thread_only(e.value)
    else:
        out = False
    return _THREAD_ONLY.put(id(e), out, e)


def _scales(e, g) -> list:
    """Multipliers ``c > 0`` worth trying in ``e - c * g >= 0`` (which, with a known ``g >= 0``, proves
    ``e >= 0``): 1, and each ratio of a coefficient of ``e`` to the same atom's in ``g`` (same sign, an
    integer), which cancels that atom: ``4063 - 32 k - i`` with ``126 - k >= 0`` known (a pipeline's
    "the stage ahead exists") leaves ``31 - i``."""
    te: dict = {}
    tg: dict = {}
    _linear(simplify(e), te, 1)
    _linear(simplify(g), tg, 1)
    out = [1]
    for key, (_atom, ce) in te.items():
        cg = tg.get(key, (None, 0))[1]
        if cg and ce and (ce > 0) == (cg > 0) and ce % cg == 0 and ce // cg > 1 and ce // cg not in out:
            out.append(ce // cg)
    return out


def _pure(e) -> bool:
    """``e`` is integer arithmetic on variables and constants (no memory read, no call)."""
    if isinstance(e, (Var, IntImm)):
        return True
    if isinstance(e, BinOp):
        return _pure(e.a) and _pure(e.b)
    if isinstance(e, Cast):
        return _pure(e.value)
    return False


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b) if a and b else 0


def _multiple(c):
    """``(x, k)`` when ``c`` says ``x % k == 0`` (``floormod(x, k) == 0`` either way round, ``k`` a positive constant)."""
    if not (isinstance(c, Cmp) and c.op == "eq") or is_float(c.a.dtype):
        return None
    for m, z in ((c.a, c.b), (c.b, c.a)):
        k = const_value(m.b) if isinstance(m, BinOp) and m.op == "floormod" else None
        if const_value(z) == 0 and isinstance(k, int) and k > 0:
            return m.a, k
    return None


def _is_multiple(c) -> bool:
    return _multiple(c) is not None


def multiple_forms(cond, holds: bool = True) -> list:
    """``(x, k)`` pairs, ``k`` dividing ``x``, that ``cond`` (or ``not cond``) implies."""
    if isinstance(cond, Logic):
        if cond.op == "not":
            return multiple_forms(cond.a, not holds)
        if (cond.op == "and") == holds:
            return multiple_forms(cond.a, holds) + multiple_forms(cond.b, holds)
        return []
    if isinstance(cond, Cmp) and cond.op == "ne" and not holds:
        cond = Cmp("eq", cond.a, cond.b)
        holds = True
    m = _multiple(cond) if holds else None
    return [m] if m is not None else []


def nonneg_forms(cond, holds: bool = True, exact: bool = False):
    """Expressions ``g`` with ``g >= 0`` that ``cond`` (or ``not cond``) implies.

    With ``exact``, returns None unless the forms say all that ``cond`` says (so proving them proves it).
    """
    out: list = []
    ok = _forms(cond, holds, out)
    if exact and not ok:
        return None
    return out


_NEG = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}


def _forms(c, holds: bool, out: list) -> bool:
    if isinstance(c, Logic):
        if c.op == "not":
            return _forms(c.a, not holds, out)
        if (c.op == "and") == holds:  # a and b holds / a or b fails: both parts
            a = _forms(c.a, holds, out)
            return _forms(c.b, holds, out) and a
        return False
    if isinstance(c, Cmp) and not is_float(c.a.dtype) and c.op in _NEG:
        op = c.op if holds else _NEG[c.op]
        a, b = c.a, c.b
        g = {"lt": lambda: binary("sub", binary("sub", b, a), 1), "le": lambda: binary("sub", b, a),
             "gt": lambda: binary("sub", binary("sub", a, b), 1), "ge": lambda: binary("sub", a, b)}[op]()
        out.append(g)
        return True
    v = const_value(c)
    return v is not None and bool(v) == holds


thread_only = _thread_only

__all__ = ["Facts", "multiple_forms", "nonneg_forms", "thread_only"]


# -- constant integer ranges (the static on-chip bounds check) -----------------------------------

def int_bounds(e, ranges: dict):
    v = const_value(e)
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(e, Var):
        return ranges.get(id(e))
    if isinstance(e, Cast) and not is_float(e.dtype) and not is_float(e.value.dtype):
        return int_bounds(e.value, ranges)
    if not isinstance(e, BinOp) or is_float(e.dtype):
        return None
    a, b = int_bounds(e.a, ranges), int_bounds(e.b, ranges)
    if a is None or b is None:
        return None
    if e.op == "add":
        return (a[0] + b[0], a[1] + b[1])
    if e.op == "sub":
        return (a[0] - b[1], a[1] - b[0])
    if e.op == "mul":
        p = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
        return (min(p), max(p))
    if e.op == "min":
        return (min(a[0], b[0]), min(a[1], b[1]))
    if e.op == "max":
        return (max(a[0], b[0]), max(a[1], b[1]))
    if e.op in ("floordiv", "floormod") and b[0] == b[1] and b[0] > 0:
        d = b[0]
        if e.op == "floordiv":
            return (a[0] // d, a[1] // d)
        if a[0] // d == a[1] // d:  # one period: no wrap-around
            return (a[0] % d, a[1] % d)
        return (0, d - 1)
    return None


def loop_range(start, extent, ranges: dict):
    """The range of a loop variable running ``start .. start + extent - 1`` (None if unknown or empty)."""
    s, n = int_bounds(start, ranges), int_bounds(extent, ranges)
    if s is None or n is None or n[1] < 1:
        return None
    return (s[0], s[1] + n[1] - 1)
