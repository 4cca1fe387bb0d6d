"""Exceptions a user of tilecore can meet, each naming the problem and the fix.

Every compile-time error carries the kernel's source location (:class:`Span`) when one is known, so
messages read ``file.py:42 in matmul: T.gemm: ...``.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A position in the user's kernel source."""

    file: str
    line: int
    func: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where} in {self.func}" if self.func else where


class TilecoreError(Exception):
    """Base class of every error tilecore raises on purpose."""


class CompileError(TilecoreError):
    """A kernel cannot be compiled; the message names the construct and its source line."""

    def __init__(self, message: str, span: Span | None = None):
        self.span = span
        self.bare_message = message
        super().__init__(f"{span}: {message}" if span else message)


class ParseError(CompileError):
    """The kernel's Python source uses something the tile language does not accept."""


class TileOpShapeError(CompileError):
    """Operands of a tile op have shapes that do not fit together (e.g. T.gemm with unequal K)."""


class UnsupportedFeatureError(CompileError):
    """The kernel needs a capability the target explicitly lacks."""

    def __init__(self, message: str, span: Span | None = None, *, feature: str = "", target: str = ""):
        self.feature = feature
        self.target = target
        super().__init__(message, span)


class ArgumentError(TilecoreError, TypeError):
    """A kernel was called with a wrong or missing argument; names the argument and what was expected."""


class TargetError(TilecoreError, ValueError):
    """A target string names no installed backend, or the backend cannot serve it."""


class PluginError(TilecoreError):
    """A backend plugin is broken or incompatible with this tilecore."""


class DeviceError(TilecoreError, RuntimeError):
    """A kernel was launched where its backend has no device (e.g. compiled on a machine without one)."""


class KernelAssertionError(TilecoreError, AssertionError):
    """A ``T.device_assert`` failed while the kernel ran."""


class KernelRuntimeError(TilecoreError, RuntimeError):
    """A kernel failed while it ran: in checked mode, an access outside its buffer (names the buffer, the
    index and the kernel's source line)."""


#: the most values a failed checked-mode bounds check records (indices, then the shape: 8 dimensions)
MAX_FAULT_VALUES = 16


def kernel_failure(entry, values=()) -> TilecoreError:
    """The exception for a failed device assertion: ``entry`` is what the emitter recorded for it (its
    message, or ``{"message": template, "values": n}`` for a checked-mode bounds check) and ``values``
    what the device recorded when it failed."""
    if isinstance(entry, dict):
        vals = [int(v) for v in list(values)[:int(entry.get("values", 0))]]
        try:
            msg = entry["message"].format(*vals)
        except (IndexError, KeyError, ValueError):
            msg = f"{entry['message']} (values {vals})"
        return KernelRuntimeError(msg)
    return KernelAssertionError(f"T.device_assert failed: {entry}")


class CacheError(TilecoreError):
    """The kernel cache or an exported kernel file is unreadable."""
