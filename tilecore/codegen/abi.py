"""The calling convention between generated kernels and the core's argument binding.

Every kernel entry takes three arrays: buffer addresses in parameter order, 64-bit integers (integer
scalar parameters, then the symbolic dimensions of the tensors' shapes), and doubles (float scalar
parameters). Emitters and the binding layer both derive the order from :func:`abi_of`, so they agree.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import is_float


@dataclass(frozen=True)
class KernelABI:
    buffers: tuple       # Param objects with a buffer
    ints: tuple          # Vars: integer scalar params, then shape symbols
    floats: tuple        # Vars: float scalar params
    shape_symbols: tuple  # Vars bound from tensor shapes


def abi_of(func) -> KernelABI:
    buffers = tuple(p for p in func.params if p.buffer is not None)
    scalars = [p.var for p in func.params if p.var is not None]
    ints = [v for v in scalars if not is_float(v.dtype)]
    floats = tuple(v for v in scalars if is_float(v.dtype))
    symbols = tuple(v for v in func.shape_vars() if not any(v is s for s in scalars))
    return KernelABI(buffers, tuple(ints) + symbols, floats, symbols)
