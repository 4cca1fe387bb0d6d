"""Layout conversion: moving a fragment's elements from one :class:`FragmentLayout` to another over the
same threads (docs/layout.md, "Layout conversion").

:func:`plan_conversion` compares the two layouts slot by slot and picks the cheapest exchange that is right
for every thread:

- ``registers``: every thread already holds each element it needs (in a register that is the same on every
  thread): a register permutation, no communication;
- ``shuffle``: each destination register ``r`` comes from one source register ``s`` of the thread whose
  index is this thread's xor a constant ``mask`` smaller than the shuffle width (a lane of the same
  warp/wave/subgroup): one xor shuffle per register (``mask == 0``: a move);
- ``shared``: anything else goes through shared memory: every thread (the first replica) stores its
  elements at their row-major offsets, a barrier, every thread loads the elements of its destination
  registers.

The plan is data (the lowering in ``tilecore.passes.layout`` spells it as IR); :func:`apply_conversion`
runs a plan on a host array of per-thread registers, which is what the tests check the algebra with.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .fragment import FragmentLayout


@dataclass(frozen=True)
class Conversion:
    """How to fill ``dst``'s registers from ``src``'s. ``kind`` is ``registers``, ``shuffle`` or ``shared``;
    for the first two, ``steps[r] = (src_reg, mask)``: destination register ``r`` is source register
    ``src_reg`` of thread ``thread ^ mask``."""

    src: FragmentLayout
    dst: FragmentLayout
    kind: str
    steps: tuple = field(default=())

    def masks(self) -> tuple:
        return tuple(sorted({m for _s, m in self.steps if m}))

    def describe(self) -> str:
        if self.kind == "registers":
            return "registers (each thread already holds its elements: per-thread moves)"
        if self.kind == "shuffle":
            return f"shuffle (xor lanes {', '.join(str(m) for m in self.masks())}; {len(self.steps)} registers)"
        return "shared (a shared-memory round trip: store, barrier, load)"


def plan_conversion(src: FragmentLayout, dst: FragmentLayout, shuffle_width: int = 0) -> Conversion:
    """The exchange that gives every thread the elements of its ``dst`` registers from ``src``'s registers.
    ``shuffle_width``: the lanes a xor shuffle reaches (0 where the target has no shuffles)."""
    import numpy as np

    if src.shape != dst.shape:
        raise ValueError(f"a conversion keeps the shape: {src.shape} -> {dst.shape}")
    if src.threads != dst.threads:
        raise ValueError(f"a conversion keeps the threads: {src.threads} -> {dst.threads}")
    if src.opaque or dst.opaque:
        raise ValueError("an opaque layout cannot be converted element by element")
    threads = src.threads
    stab, dtab = src.element_table(), dst.element_table()   # (threads, regs, ndim)
    t = np.arange(threads)
    steps = []
    for r in range(dst.regs):
        want = dst.element(0, r)
        holders, s = src.locate(want)
        found = None
        for h in sorted(holders):
            m = h  # thread 0 reads from thread 0 ^ m == h
            if m and (not shuffle_width or m >= shuffle_width or threads % shuffle_width):
                continue
            partner = t ^ m
            if (partner < threads).all() and (stab[partner, s] == dtab[:, r]).all():
                found = (s, m)
                break
        if found is None:
            return Conversion(src, dst, "shared")
        steps.append(found)
    kind = "registers" if all(m == 0 for _s, m in steps) else "shuffle"
    return Conversion(src, dst, kind, tuple(steps))


def apply_conversion(conv: Conversion, regs):
    """Run ``conv`` on the host: ``regs[thread, reg]`` in ``conv.src`` -> the same elements in ``conv.dst``
    (a ``(threads, dst.regs)`` array); what the IR lowering computes, for tests of the algebra."""
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
    for r, (s, m) in enumerate(conv.steps):
        out[:, r] = regs[t ^ m, s]
    return out


__all__ = ["Conversion", "plan_conversion", "apply_conversion"]
