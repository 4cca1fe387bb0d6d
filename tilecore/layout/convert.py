"""Layout conversion: moving a fragment's elements from one :class:`FragmentLayout` to another over the
same threads (docs/layout.md, "Layout conversion").

:func:`plan_conversion` compares the two layouts slot by slot and picks the cheapest exchange that is right
for every thread:

- ``registers``: every thread already holds each element it needs: register moves, no communication;
- ``shuffle``: every element a thread needs is held by a lane of its own warp/wave/subgroup (the
  target's shuffle width), at a few xor distances per register (at most :data:`MAX_EXCHANGES`): for
  each distance one xor shuffle, each thread sending the register its partner needs and keeping the
  value from its own distance;
- ``index``: every element a thread needs is held by a lane of its own group, but a register's holders are
  at more xor distances than its source registers (a permutation of lanes that xor distances gather
  slowly: a transpose of lane bits, an interleave), and the target has indexed shuffles
  (``features.shuffle_index``): for each source register a destination register reads, one indexed shuffle
  (every thread sends that register; each reads the lane that holds its element, a closed-form expression
  of its thread index from the two layouts' digits) and each thread keeps the value of its own source
  register. Registers that xor shuffles gather as cheaply keep them (a plan may mix the two);
- ``shared``: anything else goes through shared memory: every thread (the first replica) stores its
  elements at their row-major offsets, a barrier, every thread loads the elements of its destination
  registers.

The plan is data (the lowering in ``tilecore.passes.layout`` spells it as IR); :func:`apply_conversion`
runs a plan on a host array of per-thread registers, which is what the tests check the algebra with.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .fragment import FragmentLayout


#: the most xor exchanges one destination register may take before the conversion goes through shared
#: memory instead (a round trip costs a store, a load and two block barriers per register set)
MAX_EXCHANGES = 4


@dataclass(frozen=True)
class Conversion:
    """How to fill ``dst``'s registers from ``src``'s. ``kind`` is ``registers``, ``shuffle``, ``index`` or
    ``shared``. For the first three, ``masks[r]`` lists the xor distances destination register ``r`` is
    gathered over: for each mask ``m`` every thread ``u`` sends the source register thread ``u ^ m`` needs
    (a shuffle by ``m``; ``0`` is the thread's own register), and thread ``t`` keeps the value of the mask
    ``t ^ holder(t, r)``. In an ``index`` plan a register ``r`` with ``sources[r]`` (then ``masks[r]`` is
    empty) is gathered by indexed shuffles instead: for each source register ``k`` in ``sources[r]`` every
    thread sends its register ``k`` and reads lane :meth:`lane_expr` ``(t, r)`` of its group of ``width``;
    thread ``t`` keeps the value of its own source register. The holder of an element is the source replica
    whose replication digits equal the receiving thread's (its own thread where it holds the element)."""

    src: FragmentLayout
    dst: FragmentLayout
    kind: str
    masks: tuple = field(default=())
    width: int = 0
    sources: tuple = field(default=())

    def all_masks(self) -> tuple:
        return tuple(sorted({m for ms in self.masks for m in ms if m}))

    def shuffles(self) -> int:
        return sum(1 for ms in self.masks for m in ms if m)

    def indexed(self) -> int:
        """Indexed shuffles the plan runs (one per destination register and source register it reads)."""
        return sum(len(ks) for ks in self.sources)

    def describe(self) -> str:
        if self.kind == "registers":
            return "registers (each thread already holds its elements: per-thread moves)"
        if self.kind == "shuffle":
            return (f"shuffle ({self.shuffles()} xor shuffles over lanes "
                    f"{', '.join(str(m) for m in self.all_masks())} for {len(self.masks)} registers)")
        if self.kind == "index":
            xor = (f" and {self.shuffles()} xor shuffles over lanes {', '.join(str(m) for m in self.all_masks())}"
                   if self.shuffles() else "")
            return (f"index ({self.indexed()} indexed shuffles within groups of {self.width}{xor} "
                    f"for {len(self.masks)} registers)")
        return "shared (a shared-memory round trip: store, barrier, load)"

    def lane_expr(self, thread, r: int):
        """The IR expression of the lane (within its aligned group of :attr:`width`) that holds the element
        destination register ``r`` of the thread ``thread`` (an IR expression) needs: the holder's thread
        index from the two layouts' digits (:meth:`slot_exprs`), modulo the width (the holder is in the
        thread's own group). Digits whose strides are multiples of the width are left out (they add whole
        groups) and one across it keeps its low part, where every stride and the width divide one another;
        else the whole holder index is taken modulo the width."""
        from ..ir import binary, simplify

        w = self.width
        digits = [d for ds in self.src.dims for d in ds if d.space == "thread"] + list(self.src.replicate)
        if all(d.stride % w == 0 or w % d.stride == 0 for d in digits if d.extent > 1):
            return self._slot_exprs(thread, r, w)[0]
        return simplify(binary("floormod", self._slot_exprs(thread, r, 0)[0], w))

    # -- the same maps as tables (numpy) and as IR expressions (lowerings) ---------------------------
    def tables(self):
        """``(holder, reg)``: int arrays ``(threads, dst.regs)``: the source thread and register each
        destination slot is read from."""
        return _holder_tables(self.src, self.dst)

    def slot_exprs(self, thread, r: int):
        """IR expressions of the source thread and register that destination register ``r`` of the thread
        ``thread`` (an IR expression) is read from."""
        return self._slot_exprs(thread, r, 0)

    def _slot_exprs(self, thread, r: int, below: int):
        """:meth:`slot_exprs`; with ``below`` > 0 the source thread modulo ``below`` (a power of two):
        thread digits at strides of ``below`` and above add multiples of it and are left out."""
        from ..ir import as_expr, binary, const, simplify

        src, dst = self.src, self.dst

        def keep(d, v):
            if not below:
                return v
            if d.stride >= below:
                return None
            if d.stride * d.extent > below:           # a digit across the boundary keeps its low part
                return binary("floormod", v, below // d.stride)
            return v

        coords = dst.coords_expr(thread, r)
        t, reg = const(0), const(0)
        for c, ds in zip(coords, src.dims):
            place = 1
            for d in ds:
                if d.extent > 1:
                    v = binary("floormod", binary("div", c, place) if place > 1 else c, d.extent)
                    if d.space == "thread":
                        v = keep(d, v)
                        if v is not None:
                            t = binary("add", t, binary("mul", v, d.stride))
                    else:
                        reg = binary("add", reg, binary("mul", v, d.stride))
                place *= d.extent
        for d in src.replicate:
            if d.extent > 1:
                v = keep(d, binary("floormod", binary("div", as_expr(thread), d.stride), d.extent))
                if v is not None:
                    t = binary("add", t, binary("mul", v, d.stride))
        return simplify(t), simplify(reg)


def _holder_tables(src: FragmentLayout, dst: FragmentLayout):
    import numpy as np

    threads = dst.threads
    coords = dst.element_table()                         # (threads, dst.regs, ndim)
    base, reg = src.locate_table(coords)                 # first replica, register
    tid = np.arange(threads)[:, None]
    for d in src.replicate:                              # the replica that shares the receiver's digits
        base = base + (tid // d.stride % d.extent) * d.stride
    return base, reg


def plan_conversion(src: FragmentLayout, dst: FragmentLayout, shuffle_width: int = 0,
                    shuffle_index: bool = False) -> Conversion:
    """The exchange that gives every thread the elements of its ``dst`` registers from ``src``'s registers.
    ``shuffle_width``: the aligned group of lanes a shuffle reaches (0 where the target has none);
    ``shuffle_index``: whether the target also has indexed shuffles (a source lane per thread).

    Per destination register: xor shuffles where its holders are at no more than :data:`MAX_EXCHANGES` xor
    distances and take no more shuffles than indexed ones would, else indexed shuffles (one per source
    register it reads, at most :data:`MAX_EXCHANGES`); a register neither gathers sends the whole
    conversion through shared memory."""
    import numpy as np

    if src.shape != dst.shape:
        raise ValueError(f"a conversion keeps the shape: {src.shape} -> {dst.shape}")
    if src.threads != dst.threads:
        raise ValueError(f"a conversion keeps the threads: {src.threads} -> {dst.threads}")
    if src.opaque or dst.opaque:
        raise ValueError("an opaque layout cannot be converted element by element")
    holder, sreg = _holder_tables(src, dst)
    tid = np.arange(dst.threads)[:, None]
    mask = tid ^ holder
    if (mask == 0).all():
        return Conversion(src, dst, "registers", tuple((0,) for _ in range(dst.regs)))
    width = shuffle_width
    if not width or dst.threads % width or (mask >= width).any():
        return Conversion(src, dst, "shared")
    masks, sources = [], []
    for r in range(dst.regs):
        ms = tuple(int(m) for m in np.unique(mask[:, r]))
        ks = tuple(int(k) for k in np.unique(sreg[:, r]))
        xor_ok, xor_cost = len(ms) <= MAX_EXCHANGES, sum(1 for m in ms if m)
        if xor_ok and (not shuffle_index or xor_cost <= len(ks)):
            masks.append(ms)
            sources.append(())
        elif shuffle_index and len(ks) <= MAX_EXCHANGES:
            masks.append(())
            sources.append(ks)
        else:
            return Conversion(src, dst, "shared")
    if not any(sources):
        return Conversion(src, dst, "shuffle", tuple(masks), width)
    return Conversion(src, dst, "index", tuple(masks), width, tuple(sources))


def apply_conversion(conv: Conversion, regs):
    """Run ``conv`` on the host: ``regs[thread, reg]`` in ``conv.src`` -> the same elements in ``conv.dst``
    (a ``(threads, dst.regs)`` array), exchange by exchange as the IR lowering does it."""
    import numpy as np

    regs = np.asarray(regs)
    src, dst = conv.src, conv.dst
    out = np.empty((dst.threads, dst.regs), dtype=regs.dtype)
    t = np.arange(dst.threads)
    if conv.kind == "shared":
        mem = {}
        for th in range(src.threads):
            for r in range(src.regs):
                mem.setdefault(src.element(th, r), regs[th, r])
        for th in range(dst.threads):
            for r in range(dst.regs):
                out[th, r] = mem[dst.element(th, r)]
        return out
    holder, sreg = conv.tables()
    for r, ms in enumerate(conv.masks):
        if conv.sources and conv.sources[r]:
            # indexed shuffles, through the same closed forms the lowering emits: the lane each thread reads
            # and the source register it keeps
            from ..ir import ThreadIndex

            lane = eval_index(conv.lane_expr(ThreadIndex(), r), t)
            keep_reg = eval_index(conv.slot_exprs(ThreadIndex(), r)[1], t)
            if ((lane < 0) | (lane >= conv.width)).any():
                raise ValueError(f"register {r}: a source lane outside the group of {conv.width}")
            for k in conv.sources[r]:
                got = regs[t // conv.width * conv.width + lane, k]   # every thread sends k, reads `lane`
                keep = keep_reg == k
                out[keep, r] = got[keep]
            continue
        for m in ms:
            sent = regs[t, sreg[t ^ m, r]]          # every thread u sends its register for thread u ^ m
            got = sent[t ^ m]                        # thread t receives thread t ^ m's
            keep = (t ^ holder[:, r]) == m
            out[keep, r] = got[keep]
    return out


_INT_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
            "div": lambda a, b: a // b, "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b,
            "xor": lambda a, b: a ^ b, "bitand": lambda a, b: a & b, "bitor": lambda a, b: a | b,
            "shl": lambda a, b: a << b, "shr": lambda a, b: a >> b}


def eval_index(e, tid):
    """An integer IR expression of :class:`~tilecore.ir.ThreadIndex` and constants, evaluated for every
    thread index in the int array ``tid`` (non-negative operands, as layouts' index arithmetic is)."""
    import numpy as np

    from ..ir import BinOp, Cast, IntImm, ThreadIndex

    if isinstance(e, IntImm):
        return np.full(np.shape(tid), e.value, dtype=np.int64)
    if isinstance(e, ThreadIndex):
        return np.asarray(tid, dtype=np.int64)
    if isinstance(e, Cast):
        return eval_index(e.value, tid)
    if isinstance(e, BinOp) and e.op in _INT_OPS:
        return _INT_OPS[e.op](eval_index(e.a, tid), eval_index(e.b, tid))
    raise ValueError(f"not an index expression of the thread: {type(e).__name__}")


__all__ = ["Conversion", "plan_conversion", "apply_conversion", "eval_index"]
