"""Helpers around kernels (TileLang's ``tilelang.utils``): ``tilecore.utils.tensor``."""
from __future__ import annotations

__all__ = ["TensorSupplyType", "tensor"]


def __getattr__(name):
    import importlib

    if name == "tensor":
        return importlib.import_module("tilecore.utils.tensor")
    if name in ("TensorSupplyType", "torch_assert_close", "get_tensor_supply"):
        return getattr(importlib.import_module("tilecore.utils.tensor"), name)
    from ..errors import not_provided

    raise not_provided("tilecore.utils", name)
