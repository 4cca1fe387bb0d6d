"""Layout conversion: moving a fragment's elements from one :class:`FragmentLayout` to another over the
same threads (docs/layout.md, "Layout conversion").

:func:`plan_conversion` compares the two layouts slot by slot and picks the cheapest exchange that is right
for every thread:

- ``registers``: every thread already holds each element it needs: register moves, no communication;
- ``shuffle``: every element a thread needs is held by a lane of its own warp/wave/subgroup (the
  target's shuffle width), at a few xor distances per register (at most :data:`MAX_EXCHANGES`): for
  each distance one xor shuffle, each thread sending the register its partner needs and keeping the
  value from its own distance;
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
    """How to fill ``dst``'s registers from ``src``'s. ``kind`` is ``registers``, ``shuffle`` or ``shared``.
    For the first two, ``masks[r]`` lists the xor distances destination register ``r`` is gathered over:
    for each mask ``m`` every thread ``u`` sends its source register :meth:`sender_reg` ``(u ^ m, r)``
    (a shuffle by ``m``; ``0`` is the thread's own register), and thread ``t`` keeps the value of the mask
    ``t ^ holder(t, r)``. The holder of an element is the source replica whose replication digits equal the
    receiving thread's (its own thread where it holds the element)."""

    src: FragmentLayout
    dst: FragmentLayout
    kind: str
    masks: tuple = field(default=())
    width: int = 0

    def all_masks(self) -> tuple:
        return tuple(sorted({m for ms in self.masks for m in ms if m}))

    def shuffles(self) -> int:
        return sum(1 for ms in self.masks for m in ms if m)

    def describe(self) -> str:
        if self.kind == "registers":
            return "registers (each thread already holds its elements: per-thread moves)"
        if self.kind == "shuffle":
            return (f"shuffle ({self.shuffles()} xor shuffles over lanes "
                    f"{', '.join(str(m) for m in self.all_masks())} for {len(self.masks)} registers)")
        return "shared (a shared-memory round trip: store, barrier, load)"

    # -- the same maps as tables (numpy) and as IR expressions (lowerings) ---------------------------
    def tables(self):
        """``(holder, reg)``: int arrays ``(threads, dst.regs)``: the source thread and register each
        destination slot is read from."""
        return _holder_tables(self.src, self.dst)

    def slot_exprs(self, thread, r: int):
        """IR expressions of the source thread and register that destination register ``r`` of the thread
        ``thread`` (an IR expression) is read from."""
        from ..ir import as_expr, binary, const, simplify

        src, dst = self.src, self.dst
        coords = dst.coords_expr(thread, r)
        t, reg = const(0), const(0)
        for c, ds in zip(coords, src.dims):
            place = 1
            for d in ds:
                if d.extent > 1:
                    v = binary("floormod", binary("div", c, place) if place > 1 else c, d.extent)
                    if d.space == "thread":
                        t = binary("add", t, binary("mul", v, d.stride))
                    else:
                        reg = binary("add", reg, binary("mul", v, d.stride))
                place *= d.extent
        for d in src.replicate:
            if d.extent > 1:
                v = binary("floormod", binary("div", as_expr(thread), d.stride), d.extent)
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


def plan_conversion(src: FragmentLayout, dst: FragmentLayout, shuffle_width: int = 0) -> Conversion:
    """The exchange that gives every thread the elements of its ``dst`` registers from ``src``'s registers.
    ``shuffle_width``: the aligned group of lanes a xor shuffle reaches (0 where the target has none)."""
    import numpy as np

    if src.shape != dst.shape:
        raise ValueError(f"a conversion keeps the shape: {src.shape} -> {dst.shape}")
    if src.threads != dst.threads:
        raise ValueError(f"a conversion keeps the threads: {src.threads} -> {dst.threads}")
    if src.opaque or dst.opaque:
        raise ValueError("an opaque layout cannot be converted element by element")
    holder, _reg = _holder_tables(src, dst)
    tid = np.arange(dst.threads)[:, None]
    mask = tid ^ holder
    if (mask == 0).all():
        return Conversion(src, dst, "registers", tuple((0,) for _ in range(dst.regs)))
    width = shuffle_width
    if not width or dst.threads % width or (mask >= width).any():
        return Conversion(src, dst, "shared")
    masks = tuple(tuple(int(m) for m in np.unique(mask[:, r])) for r in range(dst.regs))
    if max(len(ms) for ms in masks) > MAX_EXCHANGES:
        return Conversion(src, dst, "shared")
    return Conversion(src, dst, "shuffle", masks, width)


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
        for m in ms:
            sent = regs[t, sreg[t ^ m, r]]          # every thread u sends its register for thread u ^ m
            got = sent[t ^ m]                        # thread t receives thread t ^ m's
            keep = (t ^ holder[:, r]) == m
            out[keep, r] = got[keep]
    return out


__all__ = ["Conversion", "plan_conversion", "apply_conversion"]
