"""tilecore: a tile-kernel compiler whose core knows no vendor.

``import tilecore`` is cheap: the compiler, the plugins and the language load on first use.

    import tilecore
    import tilecore.language as T

    kernel = tilecore.compile(my_prim_func, target="cpu", out_idx=[-1])
    C = kernel(A, B)
"""
from __future__ import annotations

import importlib

from ._version import __version__

_LAZY = {
    "compile": ("tilecore.compiler", "compile"),
    "jit": ("tilecore.compiler", "jit"),
    "JITKernel": ("tilecore.compiler.kernel", "JITKernel"),
    "load_kernel": ("tilecore.compiler.kernel", "load_kernel"),
    "autotune": ("tilecore.autotune", "autotune"),
    "PassConfigKey": ("tilecore.passes", "PassConfigKey"),
    "language": ("tilecore.language", None),
    "errors": ("tilecore.errors", None),
    "targets": ("tilecore.plugin", "list_targets"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'tilecore' has no attribute {name!r}") from None
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
