"""The AscendC statements the lowering produces: leaves of the IR (plugin ``Stmt`` subclasses) that the
emitter prints and the sync pass reads.

Each leaf says which pipe runs it and which on-chip buffers it reads and writes; everything else in a
lowered kernel (loads and stores of single elements) runs on the scalar pipe S.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tilecore.ir import Buffer, Expr, Stmt

PIPES = ("S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX")


@dataclass(eq=False)
class AscendOp(Stmt):
    """Base of the leaves: ``pipe`` runs it; ``reads``/``writes`` are the on-chip buffers it touches."""

    def pipe(self) -> str:  # pragma: no cover - every leaf defines it
        raise NotImplementedError

    def reads(self) -> tuple:
        return ()

    def writes(self) -> tuple:
        return ()


@dataclass(eq=False)
class CopyIn(AscendOp):
    """GM -> UB on MTE2 (``DataCopyPad``): ``rows`` runs of ``cols`` elements, GM rows ``src_pitch`` elements
    apart, UB rows ``dst_pitch`` elements apart (a multiple of 32 bytes)."""
    dst: Buffer
    dst_off: Expr
    src: Buffer
    src_off: Expr
    rows: Expr
    cols: Expr
    src_pitch: Expr
    dst_pitch: int

    def pipe(self):
        return "MTE2"

    def writes(self):
        return (self.dst,)


@dataclass(eq=False)
class CopyOut(AscendOp):
    """UB -> GM on MTE3 (``DataCopyPad``), the mirror of :class:`CopyIn`."""
    dst: Buffer
    dst_off: Expr
    src: Buffer
    src_off: Expr
    rows: Expr
    cols: Expr
    dst_pitch: Expr
    src_pitch: int

    def pipe(self):
        return "MTE3"

    def reads(self):
        return (self.src,)


@dataclass(eq=False)
class VecOp(AscendOp):
    """One vector instruction over ``count`` elements of UB tiles (count form): ``name(dst, *srcs[, scalar],
    count)``; operands are ``(buffer, element offset)`` pairs. Reductions take a work tile as their last source."""
    name: str
    dst: tuple
    srcs: tuple
    count: Expr
    scalar: Expr | None = None
    attrs: dict = field(default_factory=dict)

    def pipe(self):
        return "V"

    def reads(self):
        return tuple(b for b, _ in self.srcs)

    def writes(self):
        return (self.dst[0],) + tuple(b for b, _ in self.srcs if self.name.startswith("Reduce") and b is self.srcs[-1][0])


@dataclass(eq=False)
class Sync(AscendOp):
    """``SetFlag<SRC_DST>(event)`` (kind ``set``), ``WaitFlag`` (``wait``) or ``PipeBarrier<PIPE_SRC>`` (``barrier``).

    Every set and wait of one flag share ``key``; ``ascend.insert_sync`` gives each key an event ID from the
    pool of its ``HardEvent`` when its first SetFlag is reached and returns the ID at the wait marked
    ``last`` (a loop-carried flag keeps its ID from the SetFlag before the loop to the WaitFlag after it)."""
    kind: str
    src: str
    dst: str
    event: int = 0
    key: object = None
    last: bool = True

    def pipe(self):
        return "S"
