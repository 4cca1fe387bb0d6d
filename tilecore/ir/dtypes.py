"""Data type names of the tile IR.

A dtype is its canonical name (``"float16"``); :class:`DType` is a ``str`` subclass so ``T.float16``
compares equal to ``"float16"`` and can also be called to cast a value (``T.float32(x)``).
"""
from __future__ import annotations

import math

_ALIASES = {
    "half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32", "double": "float64",
    "fp64": "float64", "bf16": "bfloat16", "int": "int32", "long": "int64", "e4m3": "float8_e4m3",
    "float8_e4m3fn": "float8_e4m3", "e5m2": "float8_e5m2", "uchar": "uint8", "char": "int8",
}

#: canonical name -> (kind, bits); kind is "float", "int", "uint" or "bool".
DTYPES = {
    "bool": ("bool", 8), "int4": ("int", 4),
    "int8": ("int", 8), "int16": ("int", 16), "int32": ("int", 32), "int64": ("int", 64),
    "uint8": ("uint", 8), "uint16": ("uint", 16), "uint32": ("uint", 32), "uint64": ("uint", 64),
    "float8_e4m3": ("float", 8), "float8_e5m2": ("float", 8),
    "float16": ("float", 16), "bfloat16": ("float", 16), "float32": ("float", 32), "float64": ("float", 64),
}


class DType(str):
    """A canonical dtype name; calling it casts: ``T.float32(x)``.

    ``DType(spelling)`` takes any spelling :func:`canonical` accepts (``"half"``, ``torch.float16``,
    a numpy dtype) and gives the canonical name: ``T.dtype("half") == "float16"``.
    """

    def __new__(cls, value="float32"):
        if type(value) is cls:
            return value
        if type(value) is str and value in DTYPES:  # the common case, kept fast
            return str.__new__(cls, value)
        return str.__new__(cls, _canonical_name(value))

    def __call__(self, value=None):
        from .expr import Cast, const

        if value is None:  # T.int32() as a type marker
            return self
        return Cast(str(self), const(value, self)) if not hasattr(value, "dtype") else Cast(str(self), value)

    def as_torch(self):
        """The matching ``torch.dtype`` (``T.float16.as_torch() is torch.float16``)."""
        import torch

        return getattr(torch, _TORCH_NAMES.get(str(self), str(self)))

    @property
    def bits(self) -> int:
        return DTYPES[self][1]

    @property
    def bytes(self) -> int:
        return max(1, DTYPES[self][1] // 8)


_TORCH_NAMES = {"float8_e4m3": "float8_e4m3fn"}


def _canonical_name(dtype) -> str:
    if isinstance(dtype, DType):
        return str(dtype)
    if isinstance(dtype, type) and dtype in (bool, int, float):  # Python's own types, as TileLang takes them
        return {bool: "bool", int: "int32", float: "float32"}[dtype]
    name = getattr(dtype, "name", None) if not isinstance(dtype, str) else dtype
    if name is None:  # torch.dtype has no .name; str(torch.float16) == "torch.float16"
        name = str(dtype)
    name = str(name).replace("torch.", "")
    name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPES))}")
    return name


def canonical(dtype) -> DType:
    """Return the canonical :class:`DType` for a name, a DType, a numpy or a torch dtype."""
    if isinstance(dtype, DType):
        return dtype
    return DType(dtype)


def is_float(dtype) -> bool:
    return DTYPES[canonical(dtype)][0] == "float"


def is_int(dtype) -> bool:
    return DTYPES[canonical(dtype)][0] in ("int", "uint", "bool")


def is_signed(dtype) -> bool:
    return DTYPES[canonical(dtype)][0] in ("int", "float")


def min_value(dtype) -> float | int:
    kind, bits = DTYPES[canonical(dtype)]
    if kind == "float":
        return -math.inf
    if kind == "int":
        return -(1 << (bits - 1))
    return 0


def max_value(dtype) -> float | int:
    kind, bits = DTYPES[canonical(dtype)]
    if kind == "float":
        return math.inf
    if kind == "int":
        return (1 << (bits - 1)) - 1
    if kind == "bool":
        return 1
    return (1 << bits) - 1


def promote(a: str, b: str) -> str:
    """The dtype of a binary op on ``a`` and ``b`` (floats win, then the wider type)."""
    if a == b:
        return a
    fa, fb = is_float(a), is_float(b)
    if fa != fb:
        return a if fa else b
    return a if DTYPES[a][1] >= DTYPES[b][1] else b
