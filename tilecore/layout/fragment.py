"""Fragment layouts: which thread, and which of its registers, holds each element of a fragment.

A layout is data, in the style of CuTe's layouts and of the fragment figures in vendors' ISA manuals. Each logical
dimension of the fragment's shape is split into *digits* (a mixed-radix decomposition of the index,
innermost first); each digit is placed either in the thread index or in the register index, with a
stride. For the 16x8 accumulator of a warp-wide 16x8x16 matrix multiply::

    dim 0 (16 rows):  row = r0 + 8 r1     r0 (extent 8) -> thread, stride 4;  r1 (extent 2) -> register, stride 2
    dim 1 (8 cols):   col = c0 + 2 c1     c0 (extent 2) -> register, stride 1; c1 (extent 4) -> thread, stride 1

so element (row, col) lives in thread ``4 r0 + c1``, register ``2 r1 + c0``. *Replication* digits are
thread digits that no coordinate uses: every thread they tell apart holds the same elements (a row
maximum held by the four threads that share the row).

Because the thread digits' strides must form a mixed radix (sorted by stride: 1, e0, e0 e1, ...), and
the same for registers, every layout built here is a bijection between its elements (times the
replication) and ``threads x regs`` slots; :meth:`FragmentLayout.check` verifies it by enumeration.

What lowerings ask of a layout: :attr:`threads`, :attr:`regs`, :meth:`locate` / :meth:`element` (and their
IR-expression forms :meth:`coords_expr`, :meth:`reg_of`), :meth:`reduce_masks` (the xor-shuffle pattern
that combines the threads sharing a row), :meth:`contiguous_regs` (vector loads and stores),
:meth:`project` (the layout of a row reduction's result). Layouts compose: :meth:`tile` repeats a layout
over more threads or registers, :meth:`transpose` permutes dimensions, :meth:`replicate` adds copies.

The core ships no matrix unit's layout: a backend registers its units' operand and accumulator layouts
(:class:`tilecore.layout.MatrixUnit`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

SPACES = ("thread", "reg")


@dataclass(frozen=True)
class Digit:
    """One mixed-radix digit of a coordinate, placed in ``space`` (``thread`` or ``reg``) at ``stride``."""

    space: str
    extent: int
    stride: int

    def __post_init__(self):
        if self.space not in SPACES:
            raise ValueError(f"a digit lives in 'thread' or 'reg', not {self.space!r}")
        if self.extent < 1 or self.stride < 1:
            raise ValueError(f"digit extent and stride must be positive, got {self.extent} and {self.stride}")

    def __repr__(self) -> str:
        return f"{'t' if self.space == 'thread' else 'r'}{self.extent}@{self.stride}"


def _radix_check(digits: list, what: str, name: str) -> int:
    """Digits of one space must tile ``0 .. prod(extents)-1`` exactly: sorted by stride, each stride is
    the product of the extents before it. Returns the product."""
    size = 1
    for d in sorted((d for d in digits if d.extent > 1), key=lambda d: d.stride):
        if d.stride != size:
            raise ValueError(f"layout {name}: {what} digits {sorted(digits, key=lambda d: d.stride)} do not "
                             f"form a mixed radix (a digit of stride {d.stride} where {size} was expected)")
        size *= d.extent
    return size


class FragmentLayout:
    """A fragment's placement over ``threads`` threads and ``regs`` registers per thread.

    ``dims[d]`` lists the digits of dimension ``d`` innermost first (their extents multiply to
    ``shape[d]``); ``replicate`` lists thread digits no coordinate uses. ``opaque`` marks a layout whose
    element placement the hardware hides (a fragment that is only loaded, multiplied and stored whole);
    element access then goes through on-chip memory, and :meth:`locate` refuses.
    """

    def __init__(self, shape, dims, replicate=(), name: str = "", opaque: bool = False):
        self.shape = tuple(int(s) for s in shape)
        self.dims = tuple(tuple(d if isinstance(d, Digit) else Digit(*d) for d in ds) for ds in dims)
        self.replicate = tuple(d if isinstance(d, Digit) else Digit("thread", *d) for d in replicate)
        self.name = name or "fragment"
        self.opaque = opaque
        if len(self.dims) != len(self.shape):
            raise ValueError(f"layout {self.name}: {len(self.dims)} digit lists for a {len(self.shape)}-D shape")
        for d, (n, ds) in enumerate(zip(self.shape, self.dims)):
            if math.prod(x.extent for x in ds) != n:
                raise ValueError(f"layout {self.name}: the digits of dimension {d} ({list(ds)}) do not multiply to "
                                 f"its extent {n}")
        if any(d.space != "thread" for d in self.replicate):
            raise ValueError(f"layout {self.name}: replication digits are thread digits")
        alld = [x for ds in self.dims for x in ds] + list(self.replicate)
        self.threads = _radix_check([x for x in alld if x.space == "thread"], "thread", self.name)
        self.regs = _radix_check([x for x in alld if x.space == "reg"], "register", self.name)

    # -- identity -----------------------------------------------------------------------------------
    def _key(self):
        canon = lambda ds: tuple(x for x in ds if x.extent > 1)  # noqa: E731
        return (self.shape, tuple(canon(ds) for ds in self.dims), tuple(sorted(canon(self.replicate),
                                                                               key=lambda d: d.stride)), self.opaque)

    def __eq__(self, other) -> bool:
        return isinstance(other, FragmentLayout) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        parts = [" ".join(repr(x) for x in ds) for ds in self.dims]
        rep = f" | replicate {' '.join(repr(x) for x in self.replicate)}" if self.replicate else ""
        return (f"{self.name}{self.shape}[{' ; '.join(parts)}{rep}] "
                f"({self.threads} threads x {self.regs} regs{', opaque' if self.opaque else ''})")

    @property
    def replication(self) -> int:
        return math.prod(d.extent for d in self.replicate)

    # -- numeric maps -------------------------------------------------------------------------------
    def _no_opaque(self):
        if self.opaque:
            raise ValueError(f"layout {self.name} is opaque: the hardware does not say which thread holds an element")

    def locate(self, coords) -> tuple:
        """``(threads, reg)`` holding element ``coords``: every replica's thread, and the register."""
        self._no_opaque()
        t = r = 0
        for c, n, ds in zip(coords, self.shape, self.dims):
            if not 0 <= c < n:
                raise IndexError(f"element {tuple(coords)} is outside the fragment's shape {self.shape}")
            for d in ds:
                c, v = divmod(c, d.extent)
                if d.space == "thread":
                    t += v * d.stride
                else:
                    r += v * d.stride
        threads = [t + sum(v * d.stride for v, d in zip(vs, self.replicate))
                   for vs in itertools.product(*(range(d.extent) for d in self.replicate))]
        return tuple(threads), r

    def element(self, thread: int, reg: int) -> tuple:
        """The coordinates of the element in register ``reg`` of ``thread`` (the inverse of :meth:`locate`)."""
        self._no_opaque()
        if not (0 <= thread < self.threads and 0 <= reg < self.regs):
            raise IndexError(f"slot (thread {thread}, reg {reg}) outside {self.threads} threads x {self.regs} regs")
        out = []
        for ds in self.dims:
            c, place = 0, 1
            for d in ds:
                v = (thread if d.space == "thread" else reg) // d.stride % d.extent
                c += v * place
                place *= d.extent
            out.append(c)
        return tuple(out)

    # -- the same maps over every slot at once (numpy; lowerings that compare two layouts slot by slot) -----
    def element_table(self):
        """``table[thread, reg]`` = the coordinates of the element in that slot: an int array of shape
        ``(threads, regs, ndim)`` (the vectorized :meth:`element`)."""
        import numpy as np

        self._no_opaque()
        t = np.arange(self.threads, dtype=np.int64)[:, None]
        r = np.arange(self.regs, dtype=np.int64)[None, :]
        out = np.zeros((self.threads, self.regs, len(self.dims)), dtype=np.int64)
        for k, ds in enumerate(self.dims):
            place = 1
            for d in ds:
                out[:, :, k] += ((t if d.space == "thread" else r) // d.stride % d.extent) * place
                place *= d.extent
        return out

    def locate_table(self, coords):
        """The vectorized :meth:`locate` for an int array of coordinates (last axis = dimensions): the first
        replica's thread and the register, two arrays of the leading shape. Replicas add
        :meth:`replica_offsets` to the thread."""
        import numpy as np

        self._no_opaque()
        coords = np.asarray(coords, dtype=np.int64)
        if coords.shape[-1] != len(self.shape):
            raise IndexError(f"{coords.shape[-1]}-D coordinates for the {len(self.shape)}-D fragment {self.shape}")
        t = np.zeros(coords.shape[:-1], dtype=np.int64)
        r = np.zeros(coords.shape[:-1], dtype=np.int64)
        for k, (n, ds) in enumerate(zip(self.shape, self.dims)):
            c = coords[..., k]
            if c.size and (c.min() < 0 or c.max() >= n):
                raise IndexError(f"coordinates outside the fragment's shape {self.shape}")
            for d in ds:
                c, v = np.divmod(c, d.extent)
                if d.space == "thread":
                    t += v * d.stride
                else:
                    r += v * d.stride
        return t, r

    def replica_offsets(self) -> tuple:
        """What replicas add to the first replica's thread (``(0,)`` without replication)."""
        return tuple(sorted(sum(v * d.stride for v, d in zip(vs, self.replicate))
                            for vs in itertools.product(*(range(d.extent) for d in self.replicate))))

    def check(self) -> None:
        """Verify by enumeration that this layout is a bijection between its elements times the replication
        and the ``threads x regs`` slots (``ValueError`` naming the first collision otherwise)."""
        self._no_opaque()
        seen: dict = {}
        for coords in itertools.product(*(range(n) for n in self.shape)):
            threads, reg = self.locate(coords)
            for t in threads:
                if (t, reg) in seen:
                    raise ValueError(f"layout {self.name}: {coords} and {seen[(t, reg)]} share thread {t} reg {reg}")
                seen[(t, reg)] = coords
                if self.element(t, reg) != coords:
                    raise ValueError(f"layout {self.name}: element({t}, {reg}) is not the inverse of locate{coords}")
        if len(seen) != self.threads * self.regs:
            raise ValueError(f"layout {self.name}: {len(seen)} slots used of {self.threads} x {self.regs}")

    # -- what lowerings ask -------------------------------------------------------------------------
    def reduce_masks(self, dim: int) -> tuple | None:
        """The xor masks of a butterfly that combines the threads holding the elements of one line along
        ``dim`` (empty when one thread holds the whole line), or None where the digits are not powers of two."""
        masks = []
        for d in self.dims[dim]:
            if d.space != "thread" or d.extent == 1:
                continue
            if d.extent & (d.extent - 1) or d.stride & (d.stride - 1):
                return None
            masks += [d.stride << k for k in range(d.extent.bit_length() - 1)]
        return tuple(masks)

    def contiguous_regs(self, dim: int = -1) -> int:
        """How many consecutive elements along ``dim`` sit in consecutive registers of one thread (the
        width of a vector load or store)."""
        run = 1
        for d in self.dims[dim]:
            if d.space != "reg" or d.stride != run:
                break
            run *= d.extent
        return run

    def lanes_span(self) -> int:
        """One more than the largest thread stride times extent among coordinate digits: threads whose
        index differs by less than this may hold different elements."""
        return max([d.stride * d.extent for ds in self.dims for d in ds if d.space == "thread"] or [1])

    # -- composition -------------------------------------------------------------------------------
    def project(self, dim: int, name: str = "") -> "FragmentLayout":
        """The layout of a reduction along ``dim``: that dimension's thread digits become replication (the
        threads sharing a line hold its result), its register digits disappear (registers repacked)."""
        dim = dim % len(self.shape)
        reps = list(self.replicate) + [d for d in self.dims[dim] if d.space == "thread" and d.extent > 1]
        kept = [ds for k, ds in enumerate(self.dims) if k != dim]
        regs = sorted((d for ds in kept for d in ds if d.space == "reg" and d.extent > 1), key=lambda d: d.stride)
        restride, s = {}, 1
        for d in regs:
            restride[id(d)] = s
            s *= d.extent
        dims = [[Digit("reg", d.extent, restride[id(d)]) if d.space == "reg" and d.extent > 1 else d for d in ds]
                for ds in kept]
        shape = [n for k, n in enumerate(self.shape) if k != dim]
        return FragmentLayout(shape, dims, reps, name or f"{self.name}.project({dim})", self.opaque)

    def transpose(self, perm=None, name: str = "") -> "FragmentLayout":
        perm = tuple(perm) if perm is not None else tuple(reversed(range(len(self.shape))))
        return FragmentLayout([self.shape[p] for p in perm], [self.dims[p] for p in perm], self.replicate,
                              name or f"{self.name}.T", self.opaque)

    def tile(self, dim: int, times: int, space: str, inner: bool = False, name: str = "") -> "FragmentLayout":
        """Repeat the layout ``times`` along ``dim``, the copies told apart by new threads (``space='thread'``:
        a warp's atom over the block's warps) or new registers (``'reg'``: a thread holds several atoms). The
        new digit is the outermost of ``dim`` (``inner=True``: innermost) and of its space."""
        dim = dim % len(self.shape)
        stride = self.threads if space == "thread" else self.regs
        new = Digit(space, times, stride)
        dims = [list(ds) for ds in self.dims]
        dims[dim] = [new] + dims[dim] if inner else dims[dim] + [new]
        shape = list(self.shape)
        shape[dim] *= times
        return FragmentLayout(shape, dims, self.replicate, name or self.name, self.opaque)

    def replicate_over(self, times: int, name: str = "") -> "FragmentLayout":
        """The same elements held by ``times`` groups of threads (new outermost thread digit)."""
        return FragmentLayout(self.shape, self.dims, self.replicate + (Digit("thread", times, self.threads),),
                              name or self.name, self.opaque)

    # -- IR-expression forms (for lowerings) --------------------------------------------------------
    def coords_expr(self, thread, reg: int) -> tuple:
        """The coordinates held in the constant register ``reg`` of the thread whose index is the IR
        expression ``thread``."""
        from ..ir import as_expr, binary, const

        self._no_opaque()
        out = []
        for ds in self.dims:
            c, place, fixed = const(0), 1, 0
            for d in ds:
                if d.space == "reg":
                    fixed += (reg // d.stride % d.extent) * place
                elif d.extent > 1:
                    v = binary("div", as_expr(thread), d.stride) if d.stride > 1 else as_expr(thread)
                    if d.stride * d.extent < self.threads:
                        v = binary("floormod", v, d.extent)
                    c = binary("add", c, binary("mul", v, place))
                place *= d.extent
            out.append(binary("add", c, fixed))
        return tuple(out)

    def reg_offsets(self, reg: int) -> tuple:
        """The constant part of :meth:`coords_expr` for register ``reg``: what the register digits add to each
        coordinate (a thread's coordinates in register ``reg`` are those of its register 0 plus these)."""
        out = []
        for ds in self.dims:
            place, fixed = 1, 0
            for d in ds:
                if d.space == "reg":
                    fixed += (reg // d.stride % d.extent) * place
                place *= d.extent
            out.append(fixed)
        return tuple(out)

    def reg_of(self, other: "FragmentLayout", reg: int, dropped: int | None = None) -> int:
        """The register of this layout holding the element that ``other`` (a layout this one was projected or
        copied from, with the same thread digits) keeps in register ``reg``; ``dropped`` is the dimension
        of ``other`` this layout does not have."""
        coords = list(other.element(0, reg))
        if dropped is not None:
            coords.pop(dropped % len(other.shape))
        return self.locate(coords)[1]

    def owns_same(self, other: "FragmentLayout", dropped: int | None = None) -> bool:
        """True when every thread holds, in this layout, the elements it needs to compute ``other``'s
        elements in place (``other``'s coordinates with dimension ``dropped`` removed): the thread digits of
        the shared dimensions agree."""
        if self.opaque or other.opaque or self.threads != other.threads:
            return False
        odims = [ds for k, ds in enumerate(other.dims) if dropped is None or k != dropped % len(other.shape)]
        if len(odims) != len(self.dims):
            return False
        return all(_thread_placement(a) == _thread_placement(b) for a, b in zip(self.dims, odims))


def _thread_placement(ds) -> tuple:
    """(place, extent, stride) of each thread digit of one dimension, where ``place`` is the digit's weight
    in the coordinate: two dimensions with equal placements put each index on the same threads."""
    out, place = [], 1
    for d in ds:
        if d.space == "thread" and d.extent > 1:
            out.append((place, d.extent, d.stride))
        place *= d.extent
    return tuple(out)


def blocked(shape, threads: int, vector: int = 1, lanes: int = 32, name: str = "blocked") -> FragmentLayout | None:
    """The core's layout for a fragment no matrix unit produces, over ``threads`` threads: along the last
    dimension ``vector`` consecutive elements per thread, then up to ``lanes`` threads side by side (so a
    row's threads are neighbours within a warp of ``lanes`` and a row reduction is an xor butterfly), then
    the rest of the threads down the rows, then registers. Elements are replicated when the fragment has
    fewer than ``threads * vector`` of them. None when the shape does not divide."""
    shape = tuple(int(s) for s in shape)
    if not shape or any(s <= 0 for s in shape):
        return None
    if len(shape) > 2:
        return None
    cols = shape[-1]
    vec = math.gcd(vector, cols)
    per_row = cols // vec
    g = 1
    while g * 2 <= min(lanes, threads) and per_row % (g * 2) == 0:
        g *= 2
    rest = threads // g
    if threads % g:
        return None
    col_digits = [Digit("reg", vec, 1), Digit("thread", g, 1)]
    tstride, rstride = g, vec
    more_cols = per_row // g
    dims = []
    if len(shape) == 1:
        # a 1-D fragment: spread the remaining columns over the other threads first
        t2 = math.gcd(rest, more_cols)
        col_digits += [Digit("thread", t2, tstride), Digit("reg", more_cols // t2, rstride)]
        tstride *= t2
        rstride *= more_cols // t2
        rest //= t2
        dims = [col_digits]
    else:
        rows = shape[0]
        t2 = math.gcd(rest, rows)
        # threads the rows leave idle (fewer rows than warps: a norm's blk_m = 1) take more of the columns
        # instead of holding copies of them: (1, 8192) over 256 threads is 32 registers each, not 256 x 8 copies
        t3 = math.gcd(rest // t2, more_cols)
        if t3 > 1:
            col_digits.append(Digit("thread", t3, tstride * t2))
        col_digits.append(Digit("reg", more_cols // t3, rstride))
        rstride *= more_cols // t3
        row_digits = [Digit("thread", t2, tstride), Digit("reg", rows // t2, rstride)]
        tstride *= t2 * t3
        rest //= t2 * t3
        dims = [row_digits, col_digits]
    replicate = [Digit("thread", rest, tstride)] if rest > 1 else []
    return FragmentLayout(shape, dims, replicate, name)


__all__ = ["Digit", "FragmentLayout", "blocked"]
