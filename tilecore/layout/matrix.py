"""Matrix units as data: a backend registers each unit's operand and accumulator layouts.

A :class:`MatrixUnit` says what one matrix instruction computes (``C[m, n] += A[m, k] B[k, n]`` over
``group`` threads) and where each operand element lives (:class:`~tilecore.layout.FragmentLayout` over
the group). The core never ships one; a backend returns its units from ``Backend.matrix_units(target)``
and the core uses those whose ``family`` and dtypes the target's capability profile lists under
``matrix_units`` (so a profile without the unit never gets it). ``spelling`` is the key the backend's
emitter expands into the instruction.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .fragment import FragmentLayout


@dataclass(frozen=True)
class MatrixUnit:
    family: str                 #: the capability profile's ``matrix_units[].family`` this unit belongs to
    m: int
    n: int
    k: int
    a_dtypes: tuple             #: operand dtypes (A and B)
    acc_dtype: str              #: accumulator dtype
    group: int                  #: threads that execute one instruction together (a warp, a wave, a warpgroup)
    a: FragmentLayout           #: (m, k) over ``group`` threads
    b: FragmentLayout           #: (k, n)
    c: FragmentLayout           #: (m, n)
    spelling: str               #: what the backend's emitter expands (e.g. an intrinsic name)
    attrs: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        for role, lay, shape in (("a", self.a, (self.m, self.k)), ("b", self.b, (self.k, self.n)),
                                 ("c", self.c, (self.m, self.n))):
            if lay.shape != shape:
                raise ValueError(f"matrix unit {self.spelling}: the {role} layout's shape {lay.shape} is not {shape}")
            if lay.threads != self.group:
                raise ValueError(f"matrix unit {self.spelling}: the {role} layout spans {lay.threads} threads, "
                                 f"the unit's group is {self.group}")

    @property
    def name(self) -> str:
        return self.spelling

    def layouts(self) -> dict:
        return {"a": self.a, "b": self.b, "c": self.c}


def units_for(backend, target, capabilities) -> list:
    """The backend's matrix units that ``capabilities`` lists (by family and operand/accumulator dtypes)."""
    hook = getattr(backend, "matrix_units", None)
    units = list(hook(target)) if hook is not None else []
    declared = capabilities.get("matrix_units", None) or []
    out = []
    for u in units:
        for d in declared:
            if (d.get("family") == u.family and str(d.get("acc_dtype")) == u.acc_dtype
                    and set(u.a_dtypes) <= set(d.get("a_dtypes", ())) and int(d.get("k", u.k)) % u.k == 0):
                out.append(u)
                break
    return out


__all__ = ["MatrixUnit", "units_for"]
