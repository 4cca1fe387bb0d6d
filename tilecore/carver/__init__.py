"""TileLang's ``tilelang.carver``, as far as kernels use it: ``arch.driver.get_num_sms``.

The rest of TileLang's carver (its tile-size templates and roller) is not provided: tune with
``tilecore.autotune`` and an explicit list of configs (docs/tilelang-compat.md).
"""
from __future__ import annotations

__all__ = ["arch"]


def __getattr__(name):
    if name == "arch":
        import importlib

        return importlib.import_module("tilecore.carver.arch")
    from ..errors import not_provided

    raise not_provided("tilecore.carver", name)
