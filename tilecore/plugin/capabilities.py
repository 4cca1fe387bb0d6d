"""The capability profiles of installed backends: collected from every backend's files, resolved per
target, cached for the process."""
from __future__ import annotations

import functools

from ..errors import TargetError


@functools.lru_cache(maxsize=1)
def _registry():
    from ..capabilities import CapabilityRegistry
    from .registry import get_registry

    reg = get_registry()
    caps = CapabilityRegistry()
    for backend in reg.backends().values():
        for path in backend.capability_files():
            caps.add_file(path, origin=backend.distribution or backend.name)
    for path in reg.extra_capability_paths():
        from pathlib import Path

        p = Path(path)
        if p.is_dir():
            caps.add_directory(p)
        else:
            caps.add_file(p)
    from ..capabilities._data import flush_parsed

    flush_parsed()  # the documents parsed just now, remembered for the next process (D25)
    return caps


def capability_registry():
    return _registry()


def clear_cache() -> None:
    _registry.cache_clear()
    profile_for.cache_clear()


@functools.lru_cache(maxsize=None)
def profile_for(target):
    """The resolved :class:`~tilecore.capabilities.Capabilities` of a Target."""
    if not target.capability_id:
        raise TargetError(f"target {target} names no capability profile (its backend must set capability_id)")
    caps = _registry()
    if target.capability_id not in caps.ids():
        raise TargetError(f"target {target}: capability profile {target.capability_id!r} not found; the "
                          f"backend's wheel must carry it (known: {', '.join(caps.ids())})")
    return caps.resolve(target.capability_id)


def profile_with(target, overlay):
    """:func:`profile_for`, with ``overlay`` (the pass config ``tilecore.capability_overlay``: a mapping of nested
    or dotted capability keys) merged over it: a compile planned against another profile's features, limits and
    matrix units on this target's code generator (e.g. a smaller GPU's paths measured on a bigger one, D63)."""
    base = profile_for(target)
    if not overlay:
        return base
    from ..capabilities import CapabilityError
    from ..errors import CompileError

    if not isinstance(overlay, dict):
        raise CompileError(f"pass config tilecore.capability_overlay must be a mapping of capability keys, not "
                           f"{type(overlay).__name__}; e.g. {{\"limits.max_shared_bytes_per_block.value\": 166912}}")
    try:
        return _registry().overlay(base.id, overlay, source="pass config tilecore.capability_overlay")
    except CapabilityError as exc:
        raise CompileError(f"pass config tilecore.capability_overlay: {exc}") from None
