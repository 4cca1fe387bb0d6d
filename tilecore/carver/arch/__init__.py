"""TileLang's ``tilelang.carver.arch``: only ``driver`` (the device's compute-unit count)."""
from __future__ import annotations

from . import driver

__all__ = ["driver"]


def __getattr__(name):
    from ...errors import not_provided

    raise not_provided("tilecore.carver.arch", name)
