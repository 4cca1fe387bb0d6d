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
    "autotune": ("tilecore.autotuner", "autotune"),
    "PassConfigKey": ("tilecore.passes", "PassConfigKey"),
    "language": ("tilecore.language", None),
    "errors": ("tilecore.errors", None),
    "targets": ("tilecore.plugin", "list_targets"),
    # TileLang's names around T (docs/tilelang-compat.md)
    "autotuner": ("tilecore.autotuner", None),
    "profiler": ("tilecore.profiler", None),
    "testing": ("tilecore.testing", None),
    "math": ("tilecore.math", None),
    "layout": ("tilecore.layout", None),
    "utils": ("tilecore.utils", None),
    "carver": ("tilecore.carver", None),
    "Profiler": ("tilecore.runtime.profiler", "Profiler"),
    "TensorSupplyType": ("tilecore.utils.tensor", "TensorSupplyType"),
    "cdiv": ("tilecore.math", "cdiv"),
    "next_power_of_2": ("tilecore.math", "next_power_of_2"),
    "disable_cache": ("tilecore.compiler.cache", "disable_cache"),
    "enable_cache": ("tilecore.compiler.cache", "enable_cache"),
    "is_cache_enabled": ("tilecore.compiler.cache", "enabled"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        from .errors import not_provided

        raise not_provided("tilecore", name) from None
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
