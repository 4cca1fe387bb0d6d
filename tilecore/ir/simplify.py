"""A small integer simplifier: canonical linear forms.

Index arithmetic in tile kernels is almost always linear in loop and block variables
(``(by + 1) * 128 - by * 128``). Rewriting integer expressions as ``sum(coeff * atom) + const`` makes
such extents fold back to constants, which shape checks and codegen rely on. Anything non-linear is
kept as an atom (with its children simplified).

Atoms are told apart by :func:`atom_key`, which names variables and buffers by identity, never by their
printed names: a lowering's loop variable ``i`` and the user's ``i`` are different atoms.
"""
from __future__ import annotations

from .dtypes import is_float
from .expr import BinOp, BufferLoad, Cast, Expr, FloatImm, IntImm, Var, as_expr, binary, const_value
from .memo import MISS, IdentityMemo, forget_all

#: a sum's linear form, simplify's answers and atom_key's keys, each by the identity of the expression (D65)
_LINEAR = IdentityMemo()
_MEMO = IdentityMemo()
_KEYS = IdentityMemo()


def _linear(e: Expr, terms: dict, scale: int) -> int:
    """Accumulate ``scale * e`` into ``terms`` (key -> [atom, coeff]); return the constant part."""
    v = const_value(e)
    if v is not None and isinstance(v, int):
        return scale * v
    if isinstance(e, BinOp) and e.op in ("add", "sub", "mul") and not is_float(e.dtype):
        # a sum's form worked out once by identity (D65), then merged in the order the walk below would add it
        hit = _LINEAR.get(id(e), e)
        if hit is MISS:
            own: dict = {}
            c = _linear_walk(e, own, 1)
            hit = _LINEAR.put(id(e), ([(k, a, n) for k, (a, n) in own.items()], c), e)
        for key, atom, coeff in hit[0]:
            if key in terms:
                terms[key][1] += coeff * scale
            else:
                terms[key] = [atom, coeff * scale]
        return hit[1] * scale
    return _linear_walk(e, terms, scale)


def _linear_walk(e: Expr, terms: dict, scale: int) -> int:
    v = const_value(e)
    if v is not None and isinstance(v, int):
        return scale * v
    if isinstance(e, BinOp) and not is_float(e.dtype):
        if e.op == "add":
            return _linear(e.a, terms, scale) + _linear(e.b, terms, scale)
        if e.op == "sub":
            return _linear(e.a, terms, scale) + _linear(e.b, terms, -scale)
        if e.op == "mul":
            ca, cb = const_value(e.a), const_value(e.b)
            if cb is not None:
                return _linear(e.a, terms, scale * cb)
            if ca is not None:
                return _linear(e.b, terms, scale * ca)
    atom = _simplify_children(e)
    key = atom_key(atom)
    if key in terms:
        terms[key][1] += scale
    else:
        terms[key] = [atom, scale]
    return 0


def atom_key(e) -> tuple:
    """A hashable structural key of ``e``: equal keys mean the same value. Variables and buffers count by
    identity (``id``; the caller keeps ``e`` alive while it uses the key), constants by value."""
    if isinstance(e, Var):
        return ("var", id(e))
    if type(e).__name__ == "AtomicRet":  # a side effect: never equal to another (D69)
        return ("atomic", id(e))
    if isinstance(e, (IntImm, FloatImm)):
        return (type(e).__name__, e.value, str(e.dtype))
    hit = _KEYS.get(id(e), e)
    return _KEYS.put(id(e), _atom_key(e), e) if hit is MISS else hit


def _atom_key(e) -> tuple:
    parts: list = [type(e).__name__, str(e.dtype)]
    if isinstance(e, BufferLoad):
        parts.append(("buffer", id(e.buffer)))
    for slot in type(e).__slots__:
        v = getattr(e, slot)
        if isinstance(e, BufferLoad) and slot == "buffer":
            continue
        if isinstance(v, tuple):
            parts.append(tuple(atom_key(x) if isinstance(x, Expr) else repr(x) for x in v))
        else:
            parts.append(atom_key(v) if isinstance(v, Expr) else repr(v))
    return tuple(parts)


def _simplify_children(e: Expr) -> Expr:
    if isinstance(e, BinOp):
        a, b = simplify(e.a), simplify(e.b)
        out = binary(e.op, a, b)
        # the same expression where nothing changed (so the memo and the prover's know it again, D65)
        if a is e.a and b is e.b and isinstance(out, BinOp) and out.op == e.op and out.a is a and out.b is b \
                and out.dtype == e.dtype:
            return e
        return out
    return e


def forget() -> None:
    """Drop what simplify, the linear forms, atom_key and the prover remember (the compiler calls it around each
    kernel's lowering: the answers are reused within one kernel, and kept longer they only hold expressions alive)."""
    forget_all()


def simplify(e):
    """Return an equivalent, canonical form of an integer expression (other values pass through)."""
    if not isinstance(e, BinOp) or is_float(e.dtype):
        return e
    hit = _MEMO.get(id(e), e)
    return _MEMO.put(id(e), _simplify(e), e) if hit is MISS else hit


def _simplify(e):
    terms: dict = {}
    c = _linear(e, terms, 1)
    out: Expr | None = None
    for atom, coeff in terms.values():
        if coeff == 0:
            continue
        term = atom if coeff == 1 else binary("mul", atom, IntImm(coeff, e.dtype))
        out = term if out is None else binary("add", out, term)
    if out is None:
        return IntImm(c, e.dtype)
    return binary("add", out, IntImm(c, e.dtype)) if c else out


def prove_equal(a, b) -> bool | None:
    """True / False when the difference of ``a`` and ``b`` simplifies to a constant; None otherwise."""
    d = const_value(simplify(binary("sub", as_expr(a), as_expr(b))))
    return None if d is None else d == 0
