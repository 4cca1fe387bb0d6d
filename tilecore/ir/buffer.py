"""Buffers and buffer regions.

A :class:`Buffer` is a dense, row-major array in one memory scope:

- ``global``   kernel parameters (tensors passed by the caller);
- ``shared``   on-chip memory shared by the threads of one block (``T.alloc_shared``);
- ``fragment`` a block-wide tile whose elements the backend distributes over the threads'
  registers (``T.alloc_fragment``);
- ``local``    per-thread storage (``T.alloc_local``);
- ``var``      a single per-thread scalar (``T.alloc_var``).

Indexing a buffer with scalars gives a :class:`~tilecore.ir.expr.BufferLoad`; indexing with at
least one slice gives a :class:`Region`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .dtypes import canonical
from .expr import INDEX, BufferLoad, Expr, as_expr, binary, const_value

SCOPES = ("global", "shared", "fragment", "local", "var", "register")  # register: a thread's private array


class Buffer:
    def __init__(self, name: str, shape, dtype, scope: str = "global"):
        if scope not in SCOPES:
            raise ValueError(f"unknown memory scope {scope!r}; known: {', '.join(SCOPES)}")
        if isinstance(shape, (int, Expr)):
            shape = (shape,)
        self.name = name
        self.shape = tuple(as_expr(s, INDEX) for s in shape)
        self.dtype = canonical(dtype)
        self.scope = scope
        self.base: Buffer | None = None  # set on a view: the buffer whose memory it names

    class Data:
        """``A.data``: the memory of a global buffer, for ``T.Tensor(shape, dtype, A.data)``."""

        def __init__(self, buffer: "Buffer"):
            self.buffer = buffer

    @property
    def data(self) -> "Buffer.Data":
        return Buffer.Data(self)

    def view(self, shape) -> "Buffer":
        """The same memory, row-major with another shape (a global buffer's reshape). Emitters name a
        view by its base, so every access goes to the base's memory at the view's flat index."""
        root = self.base or self
        v = Buffer(root.name, shape, root.dtype, root.scope)
        v.base = root
        return v

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def static_shape(self) -> tuple | None:
        vals = tuple(const_value(s) for s in self.shape)
        return None if any(v is None for v in vals) else vals

    def numel(self) -> Expr:
        n: Expr = as_expr(1)
        for s in self.shape:
            n = binary("mul", n, s)
        return n

    def __getitem__(self, idx):
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) == 1 and idx[0] is Ellipsis:
            idx = (slice(None),) * self.ndim
        if any(isinstance(i, slice) for i in idx):
            return Region.from_slices(self, idx)
        if len(idx) != self.ndim:
            raise IndexError(f"buffer {self.name} has {self.ndim} dims, indexed with {len(idx)}")
        return BufferLoad(self, idx)

    def region(self) -> "Region":
        return Region(self, tuple(as_expr(0) for _ in self.shape), self.shape)

    def __repr__(self) -> str:
        dims = ", ".join(str(s) for s in self.shape)
        return f"Buffer({self.name}, ({dims}), {self.dtype}, {self.scope})"

    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False)
class Region:
    """``buffer[starts[d] : starts[d] + extents[d]]`` along every dimension."""

    buffer: Buffer
    starts: tuple
    extents: tuple

    @staticmethod
    def from_slices(buffer: Buffer, idx: tuple) -> "Region":
        if len(idx) != buffer.ndim:
            raise IndexError(f"buffer {buffer.name} has {buffer.ndim} dims, sliced with {len(idx)}")
        starts, extents = [], []
        for d, i in enumerate(idx):
            if isinstance(i, slice):
                if i.step not in (None, 1):
                    raise IndexError(f"{buffer.name}: slices with a step are not supported")
                start = as_expr(0 if i.start is None else i.start)
                stop = buffer.shape[d] if i.stop is None else as_expr(i.stop)
                starts.append(start)
                extents.append(simplify_index(binary("sub", stop, start)))
            else:
                starts.append(as_expr(i))
                extents.append(as_expr(1))
        return Region(buffer, tuple(starts), tuple(extents))

    @property
    def shape(self) -> tuple:
        return self.extents


def simplify_index(e: Expr) -> Expr:
    from .simplify import simplify

    return simplify(e)
