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


class PerformanceWarning(UserWarning):
    """A kernel compiled and will run correctly, but its device compiler reports something that costs much of
    its speed (registers spilled to memory, matrix instructions serialized); the message names the kernel, its
    definition line, what the compiler said and what usually fixes it. ``kernel.meta["source"]["meta"]
    ["performance_notes"]`` keeps the notes (a cached kernel warns again when it is loaded)."""


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


class NotProvidedError(TilecoreError, AttributeError):
    """A TileLang name tilecore does not provide; says what to use instead. An AttributeError too, so
    ``hasattr`` and ``getattr(m, name, default)`` keep working."""


#: TileLang names tilecore deliberately does not provide, with what to use instead
INSTEAD = {
    "tilecore.carver": "tilecore.autotune with an explicit list of configs (of TileLang's carver, tilecore provides "
                       "only tilecore.carver.arch.driver.get_num_sms)",
    "tilecore.engine": "tilecore.compile (and tilecore.compiler.lower for the lowered IR and source)",
    "tilecore.lower": "tilecore.compiler.lower(func, target)",
    "tilecore.transform": "tilecore.PassConfigKey for pass options; passes are added by backend plugins",
    "tilecore.tvm": "nothing: tilecore has its own IR and does not use TVM on its compile path",
    "tilecore.tileop": "the tile ops of tilecore.language (T.copy, T.gemm, T.reduce_*)",
    "tilecore.contrib": "the backend plugins, which find and run their vendor's toolchain",
    "tilecore.cache": "tilecore.disable_cache() / TILECORE_CACHE_DIR (the kernel cache is automatic)",
    "tilecore.env": "tilecore.disable_cache() and the TILECORE_* environment variables (docs/language.md)",
    "tilecore.par_compile": "tilecore.autotune, which compiles its configs in parallel",
    "tilecore.set_log_level": "nothing: tilecore does not log; errors are raised with the kernel's line",
    "tilecore.Layout": "T.annotate_layout hints (layouts are decided by the backends)",
    "tilecore.Fragment": "T.alloc_fragment (fragment layouts are decided by the backends)",
    "T.alloc_tmem": "T.alloc_fragment: tensor-memory accumulators are a backend's choice, not the kernel's",
    "T.annotate_ws_schedule": "T.Pipelined: warp specialization is decided by the backend",
    "T.PersistentTileScheduler": "a grid of one block per tile (T.Kernel over the tiles)",
    "T.import_source": "T.call_extern is not provided either: write the computation with T ops",
    "T.call_extern": "T ops (tilecore does not link user device source into kernels)",
}


def not_provided(where: str, name: str) -> NotProvidedError:
    """The error for ``where.name`` missing: names the feature, says what to use instead."""
    full = f"{where}.{name}"
    if name.startswith("__") and name.endswith("__"):
        return NotProvidedError(f"module {where!r} has no attribute {name!r}")
    parts = full.split(".")  # the entry for the name, else for the module it is in (tilecore.carver.X)
    instead = next((INSTEAD[k] for k in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if k in INSTEAD),
                   None)
    if instead:
        return NotProvidedError(f"{full} (TileLang's) is not provided by tilecore; instead: {instead} "
                                "(docs/tilelang-compat.md)")
    return NotProvidedError(f"{full} is not part of tilecore; docs/tilelang-compat.md lists the TileLang API tilecore "
                            "provides and what to use for the rest")
