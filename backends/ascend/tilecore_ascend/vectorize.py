"""``ascend.vectorize_parallel``: element-wise ``T.Parallel`` nests over whole UB tiles as vector instructions.

A nest ``for i, j in T.Parallel(R, C)`` (or one loop over ``C``) whose body is stores ``t[i, j] = e`` into
float32 tiles of exactly that shape becomes one vector instruction per operator of ``e``, each over the whole
tile (``Add``, ``Mul``, ``Exp``...) into a temporary tile, the last into ``t``. Operands of ``e`` are
- tiles read at ``[i, j]`` (the same shape): vector operands;
- loop-invariant scalars: the scalar form of the instruction (``Adds``, ``Muls``, ``Maxs``, ``Mins``) or a
  ``Duplicate`` for the rest;
- per-row scalars (``m[i]``, ``m[i] * scale``): computed by the scalar unit (``GetValue``), one instruction per
  row (``Adds(t[i * C], x[i * C], -m_i, C)``), so ``C`` float32 rows must start on 32-byte boundaries.
Statements run one after the other over the whole tile, which is the per-element order because every tile
operand is read at the element being written. Anything else (other dtypes, guards, other index patterns,
comparisons) stays a scalar loop nest, lowered by the core.

Exact forms only: ``x / c`` is ``Div`` by a duplicated ``c``, not a multiply by ``1 / c``. ``exp2(x)`` is
``Exp(x * ln 2)`` (no ``Exp2`` instruction), within float32 rounding of the exact result.
"""
from __future__ import annotations

import math

from tilecore.ir import (Allocate, BinOp, Buffer, BufferLoad, Call, Cast, For, FloatImm, IntImm, Seq, Store, Var,
                         as_expr, binary, const, const_value, rewrite, seq, simplify, walk_expr)
from tilecore.passes import tile_pass

from .ops import VecOp

ONCHIP = ("shared", "fragment")
VEC_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "max": "Max", "min": "Min"}
VEC_UNARY = {"exp": "Exp", "log": "Ln", "sqrt": "Sqrt", "rsqrt": "Rsqrt", "abs": "Abs"}


class _Bail(Exception):
    pass


def _nest(loop):
    """``(vars, extents, body)`` of a perfectly nested parallel loop of static extents from 0 (1 or 2 deep)."""
    vs, ext, s = [], [], loop
    while isinstance(s, For) and s.kind == "parallel" and len(vs) < 2:
        if const_value(s.start) != 0 or const_value(s.extent) is None:
            raise _Bail
        vs.append(s.var)
        ext.append(int(const_value(s.extent)))
        s = s.body
        while isinstance(s, Seq) and len(s.body) == 1:
            s = s.body[0]
    return vs, ext, s


class _Lower:
    def __init__(self, vs, ext, span):
        self.vs, self.span = vs, span
        self.rows, self.cols = (ext[0], ext[1]) if len(ext) == 2 else (1, ext[0])
        self.n = self.rows * self.cols
        self.out: list = []
        if self.rows > 1 and (self.cols * 4) % 32:
            raise _Bail

    def uses_loop(self, e) -> set:
        found = set()
        walk_expr(e, lambda x: found.add(id(x)) if isinstance(x, Var) else None)
        return {k for k, v in enumerate(self.vs) if id(v) in found}

    def is_tile(self, e) -> bool:
        b = e.buffer
        return (b.scope in ONCHIP and b.dtype == "float32" and b.static_shape() == tuple(
            [self.rows, self.cols] if len(self.vs) == 2 else [self.cols])
                and all(isinstance(i, Var) and i is v for i, v in zip(e.indices, self.vs)))

    def kind(self, e):
        """("tile", buffer) | ("row", expr of the row var) | ("const", expr)."""
        if isinstance(e, BufferLoad) and e.buffer.scope == "global":
            raise _Bail
        used = self.uses_loop(e)
        if not used:
            return ("const", e)
        if used == {0} and len(self.vs) == 2:
            return ("row", e)  # a per-row scalar, e.g. m[i] * scale
        if e.dtype != "float32":
            raise _Bail
        if isinstance(e, BufferLoad):
            if not self.is_tile(e):
                raise _Bail
            return ("tile", e.buffer)
        if isinstance(e, BinOp) and e.op in VEC_BINARY:
            return self.binary(e.op, self.kind(e.a), self.kind(e.b))
        if isinstance(e, Call) and e.name in VEC_UNARY and len(e.args) == 1:
            return self.unary(VEC_UNARY[e.name], self.kind(e.args[0]))
        if isinstance(e, Call) and e.name == "exp2" and len(e.args) == 1:
            x = self.binary("mul", self.kind(e.args[0]), ("const", const(math.log(2.0), "float32")))
            return self.unary("Exp", x)
        if isinstance(e, Cast) and e.value.dtype == "float32":
            return self.kind(e.value)
        raise _Bail

    # -- instructions --------------------------------------------------------------------------------
    def temp(self):
        b = Buffer("vt", (self.n,), "float32", "fragment")
        self.out.append(Allocate(b, span=self.span))
        return b

    def vec(self, name, dst, srcs, scalar=None, count=None, off=None):
        o = as_expr(0) if off is None else off
        self.out.append(VecOp(name, (dst, o), tuple((b, o) for b in srcs), as_expr(count or self.n), scalar,
                              span=self.span))

    def per_row(self, make):
        """One instruction per row: ``make(offset, row scalar substitution)`` builds it."""
        i = Var("vr")
        body = make(binary("mul", i, as_expr(self.cols)), i)
        self.out.append(For(i, as_expr(0), as_expr(self.rows), "serial", body, span=self.span))

    def row_expr(self, e, i):
        row = self.vs[0]
        return rewrite_expr(e, row, i)

    def tile_of(self, k, dst=None):
        """The value ``k`` as a tile (a Duplicate for scalars)."""
        if k[0] == "tile":
            return k[1]
        t = dst or self.temp()
        if k[0] == "const":
            self.vec("Duplicate", t, (), k[1])
        else:
            e = k[1]
            self.per_row(lambda off, i: VecOp("Duplicate", (t, off), (), as_expr(self.cols), self.row_expr(e, i),
                                              span=self.span))
        return t

    def binary(self, op, a, b, dst=None):
        if a[0] != "tile" and b[0] != "tile":
            return (a[0] if a[0] == b[0] else "row", binary(op, a[1], b[1]))
        if a[0] != "tile" and op in ("add", "mul", "max", "min"):
            a, b = b, a
        t = dst or self.temp()
        if a[0] == "tile" and b[0] != "tile" and op in ("add", "sub", "mul", "max", "min"):
            name = {"add": "Adds", "sub": "Adds", "mul": "Muls", "max": "Maxs", "min": "Mins"}[op]
            val = (lambda e: binary("sub", const(0.0, "float32"), e)) if op == "sub" else (lambda e: e)
            if b[0] == "const":
                self.vec(name, t, (a[1],), simplify(val(b[1])))
            else:
                e = b[1]
                self.per_row(lambda off, i: VecOp(name, (t, off), ((a[1], off),), as_expr(self.cols),
                                                  val(self.row_expr(e, i)), span=self.span))
            return ("tile", t)
        x, y = self.tile_of(a), self.tile_of(b)
        self.vec(VEC_BINARY[op], t, (x, y))
        return ("tile", t)

    def unary(self, name, a, dst=None):
        if a[0] != "tile":
            raise _Bail  # a scalar math call inside a tile expression: leave it to the scalar path
        t = dst or self.temp()
        self.vec(name, t, (a[1],))
        return ("tile", t)

    def store(self, buf, e):
        k = self.kind_top(e, buf)
        if k[0] == "tile" and k[1] is not buf:
            self.vec("Adds", buf, (k[1],), const(0.0, "float32"))
        elif k[0] != "tile":
            self.tile_of(k, dst=buf)

    def kind_top(self, e, buf):
        """Like :meth:`kind`, with the outermost instruction writing ``buf`` itself."""
        if isinstance(e, BinOp) and e.op in VEC_BINARY and self.uses_loop(e) and e.dtype == "float32":
            a, b = self.kind(e.a), self.kind(e.b)
            if a[0] == "tile" or b[0] == "tile":
                return self.binary(e.op, a, b, dst=buf)
        if isinstance(e, Call) and e.name in VEC_UNARY and len(e.args) == 1 and e.dtype == "float32":
            a = self.kind(e.args[0])
            if a[0] == "tile":
                return self.unary(VEC_UNARY[e.name], a, dst=buf)
        return self.kind(e)


def rewrite_expr(e, var, new):
    """``e`` with ``var`` replaced by ``new`` (expressions are immutable; rebuilt where they change)."""
    if e is var:
        return new
    if isinstance(e, BufferLoad):
        return BufferLoad(e.buffer, tuple(rewrite_expr(i, var, new) for i in e.indices))
    if isinstance(e, BinOp):
        return binary(e.op, rewrite_expr(e.a, var, new), rewrite_expr(e.b, var, new))
    if isinstance(e, Call):
        return Call(e.name, tuple(rewrite_expr(a, var, new) for a in e.args), e.dtype, e.attrs)
    if isinstance(e, Cast):
        return Cast(e.dtype, rewrite_expr(e.value, var, new))
    if isinstance(e, (IntImm, FloatImm, Var)):
        return e
    raise _Bail


def vectorize_nest(loop):
    """The vector instructions of a parallel nest, or None when it is not one this pass takes."""
    try:
        vs, ext, body = _nest(loop)
        stores = body.body if isinstance(body, Seq) else [body]
        if not stores or not all(isinstance(s, Store) for s in stores):
            return None
        low = _Lower(vs, ext, loop.span)
        for s in stores:
            if not (s.buffer.scope in ONCHIP and s.buffer.dtype == "float32" and low.is_tile(BufferLoad(s.buffer, s.indices))):
                return None
            low.store(s.buffer, s.value)
        return seq(low.out)
    except _Bail:
        return None


@tile_pass("ascend.vectorize_parallel")
def vectorize_parallel(func, ctx):
    def fix(s):
        if isinstance(s, For) and s.kind == "parallel":
            return vectorize_nest(s)
        return None

    return func.with_body(rewrite(func.body, fix))
