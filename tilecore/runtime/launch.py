"""Launch helpers every runtime needs, read from ``Source.meta``: the host-side shape expressions and
the device-assertion table.

- :func:`shape_fn` turns the Python expressions an emitter wrote with
  :func:`tilecore.codegen.host_expr` (grid sizes, tensor sizes, descriptor dims) into one function of
  the ABI integers, compiled once per kernel instead of evaluated per launch.
- :class:`AssertionTable` holds ``meta["asserts"]`` and turns the code a failed launch left in its status
  word into the exception the user sees (:func:`tilecore.errors.kernel_failure`).
"""
from __future__ import annotations

from typing import Callable

from ..errors import TilecoreError, kernel_failure

#: all a shape expression may call (host_expr writes min, max and int)
_SHAPE_BUILTINS = {"__builtins__": {}, "min": min, "max": max, "int": int}


def shape_fn(exprs) -> Callable[[list], tuple]:
    """One function ``f(ints) -> tuple of int`` computing ``exprs`` (Python expressions over ``ints[k]``,
    as :func:`~tilecore.codegen.host_expr` writes them) from a launch's integer arguments."""
    if not exprs:
        return lambda ints: ()
    return eval(f"lambda ints: ({', '.join(f'int({e})' for e in exprs)},)", dict(_SHAPE_BUILTINS))  # noqa: S307


class AssertionTable:
    """The device assertions of one kernel (``meta["asserts"]``, numbered from 1 in the order the emitter
    recorded them with ``record_assert``). Falsy when the kernel has none, so a launcher can skip the
    status read-back."""

    def __init__(self, meta: dict):
        self.entries = list(meta.get("asserts", []))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, code: int):
        """What the emitter recorded for assertion ``code`` (a message, or a dict for a bounds check)."""
        return self.entries[code - 1] if 0 < code <= len(self.entries) else f"assertion {code}"

    def records_values(self, code: int) -> bool:
        """Whether assertion ``code`` records values (a checked-mode bounds check: its indices)."""
        return isinstance(self.entry(code), dict)

    def failure(self, code: int, values=()) -> TilecoreError:
        """The exception for a launch whose status word holds ``code`` (non-zero) and ``values``."""
        return kernel_failure(self.entry(code), values)


__all__ = ["AssertionTable", "shape_fn"]
