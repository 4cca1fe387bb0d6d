"""TileLang's ``tilelang.carver.arch.driver``: ``get_num_sms`` for persistent kernels.

A persistent kernel launches one block per compute unit and loops over its tiles, so the count only
sizes the grid: any positive count gives the same results.
"""
from __future__ import annotations

import os

__all__ = ["get_num_sms"]


def get_num_sms(device_id: int = 0) -> int:
    """The number of SMs / compute units kernels run on, from the first of:

    1. torch's accelerator (``torch.accelerator``) when one is present: device ``device_id``'s
       ``multi_processor_count``;
    2. the current target's capability profile (``TILECORE_TARGET``, else the target ``"auto"`` picks):
       its ``execution.cores``, the probed value where the profile says the figure comes from a probe
       (the cpu target: ``os.cpu_count()``);
    3. ``os.cpu_count()``.
    """
    return _accelerator_units(device_id) or _profile_cores() or os.cpu_count() or 1


def _accelerator_units(device_id: int) -> int | None:
    """``multi_processor_count`` of torch's current accelerator device, when torch has one and reports it."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional
        return None
    acc = getattr(torch, "accelerator", None)  # torch >= 2.6
    if acc is None or not acc.is_available():
        return None
    module = getattr(torch, acc.current_accelerator().type, None)
    props = getattr(module, "get_device_properties", None)
    count = getattr(props(device_id), "multi_processor_count", None) if props else None
    return int(count) if count else None


def _profile_cores() -> int | None:
    """``execution.cores`` of the current target's profile (probed where its provenance says so)."""
    from ...capabilities._data import expand_dotted, get_dotted
    from ...capabilities._profile import _probe_sourced
    from ...compiler import resolve_auto
    from ...plugin import get_registry, profile_for

    backend, target = get_registry().resolve(resolve_auto(None))
    caps = profile_for(target)
    if _probe_sourced(caps, "execution.cores"):
        probe = backend.probe()
        probed = get_dotted(expand_dotted(probe.capabilities), "execution.cores") if probe.status == "ok" else None
        return int(probed) if probed else None
    declared = caps.get("execution.cores")
    return int(declared) if declared else None
