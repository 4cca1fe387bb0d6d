"""``T.const`` and ``T.empty``: the two names of eager-style kernels (TileLang's style since its #2010).

An eager kernel is a ``@tilecore.jit`` function whose body *is* the kernel::

    @tilecore.jit
    def add(A, B, block=128, dtype=T.float32):
        N = T.const("N")                 # a size bound from the tensors' shapes at call time
        A: T.Tensor((N,), dtype)         # declares the parameter A
        B: T.Tensor((N,), dtype)
        C = T.empty((N,), dtype)         # an output, allocated by the call
        with T.Kernel(T.ceildiv(N, block)) as bx:
            ...
        return C

    c = add(a, b)                        # compiles once per shape and dtype, runs, returns C
    k = add.compile(N=4096)              # or compile for given sizes; k(a, b) returns C

The body is parsed twice per new set of compile-time arguments (tilecore/compiler/eager.py): a first
pass with the sizes as symbols stops as soon as every tensor argument is declared (to learn which
dimension of which tensor gives which size), then each new set of sizes is parsed with plain
numbers, so every kernel the body produces has static shapes.
"""
from __future__ import annotations

import re

from ..errors import ParseError
from ..ir import Buffer, Param, Var, const_value
from ..ir.dtypes import canonical
from .builder import current


class Discovered(Exception):
    """Raised by the first pass once every tensor argument is declared: the rest of the body is not needed."""


class EagerState:
    """What the builder of an eager kernel knows: the sizes, the pending parameters, the outputs."""

    def __init__(self, consts: dict, pending: list, symbolic: bool):
        self.consts = dict(consts)      # name -> int (known sizes)
        self.symbolic = symbolic        # first pass: unknown sizes become symbols
        self.symbols: dict = {}         # name -> Var (first pass)
        self.pending = list(pending)    # parameter names still to be declared with `name: T.Tensor(...)`
        self.params: dict = {}          # name -> Param, in declaration order
        self.specs: dict = {}           # name -> TensorSpec as annotated (first pass)
        self.outputs: list = []         # buffers made by T.empty, in creation order
        self.asked: set = set()         # the names T.const was called with

    def declare(self, interp, name: str, ann) -> None:
        from .parser import TensorSpec

        if isinstance(ann, TensorSpec):
            value = Buffer(name, ann.shape, ann.dtype, "global")
            self.params[name] = Param(name, buffer=value)
            self.specs[name] = ann
        else:
            try:
                value = Var(name, canonical(ann))
            except (TypeError, ValueError, KeyError):
                raise ParseError(f"`{name}: ...` declares a kernel argument; annotate it with T.Tensor(shape, dtype) "
                                 "or a dtype such as T.int32", interp.builder.span) from None
            self.params[name] = Param(name, var=value)
        self.pending.remove(name)
        _, layer = interp.lookup_raw(name)
        (layer if layer is not None else interp.layers[-1])[name] = value
        if self.symbolic and not self.pending:
            raise Discovered()


class Pending:
    """The value of a tensor argument before its ``A: T.Tensor(shape, dtype)`` line."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr):
        raise ParseError(f"`{self.name}` is used before its declaration; put `{self.name}: T.Tensor(shape, dtype)` "
                         "before its first use", current().span)

    def __getitem__(self, idx):
        return self.__getattr__("[]")


def _eager(what: str) -> EagerState:
    b = current(what)
    state = getattr(b, "eager", None)
    if state is None:
        raise ParseError(f"{what} belongs to eager kernels: use it in the body of a @tilecore.jit function that "
                         "declares its tensors (`A: T.Tensor(shape, dtype)`), not in a @T.prim_func", b.span)
    return state


def const(name: str, dtype="int32"):
    """``M, N = T.const("M, N")``: sizes bound from the arguments' shapes (or ``.compile(M=...)``).

    One name gives one value; several names (separated by commas or spaces) give a tuple."""
    state = _eager("T.const")
    names = [n for n in re.split(r"[\s,]+", name.strip()) if n]
    if not names:
        raise ParseError("T.const needs at least one name, e.g. T.const('M, N')", current().span)
    values = []
    state.asked.update(names)
    for n in names:
        if n in state.consts:
            values.append(state.consts[n])
        elif state.symbolic:
            values.append(state.symbols.setdefault(n, Var(n, canonical(dtype))))
        else:
            raise ParseError(f"T.const: the size {n!r} is not determined by any tensor argument's declared shape; pass "
                             f"it yourself: kernel.compile({n}=...) or call the kernel with {n}=...", current().span)
    return values[0] if len(values) == 1 else tuple(values)


def empty(*shape, dtype="float32"):
    """``C = T.empty((M, N), dtype)``: an output tensor the call allocates; ``return`` it."""
    state = _eager("T.empty")
    b = current("T.empty")
    if b.in_kernel:
        raise ParseError("T.empty declares an output of the kernel; call it before `with T.Kernel(...)`", b.span)
    if len(shape) == 2 and isinstance(shape[0], (tuple, list)) and not isinstance(shape[1], (tuple, list)):
        shape, dtype = shape[0], shape[1]
    elif len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    if not shape or any(isinstance(s, (tuple, list)) for s in shape):
        raise ParseError(f"T.empty takes a shape and a dtype, e.g. T.empty((M, N), T.float32); got {shape!r}", b.span)
    buf = Buffer("out", tuple(shape), dtype, "global")
    buf._unnamed = True
    state.outputs.append(buf)
    return buf


def static_dims(spec) -> list:
    """The annotated dims of a tensor as ints, Vars or other expressions (first pass)."""
    return [const_value(s) if const_value(s) is not None else s for s in spec.shape]


def missing_name(name: str):
    """``T.<name>`` for a name the language lacks (the module ``__getattr__`` of tilecore.language)."""
    from ..errors import not_provided

    raise not_provided("T", name)
