"""The plugin API: what a backend wheel implements, and how tilecore finds it.

A backend distribution declares an entry point in the ``tilecore.backends`` group naming a module (or
object) with ``@hookimpl`` functions; its ``tilecore_backends`` hook returns
:class:`Backend` instances. See docs/plugin-guide.md.
"""
from .api import (EXTENSIBLE_OPS, MODES, PLUGIN_API, Backend, Compiler, DeviceInfo, Emitter, Intrinsic, OpExtension,
                  PassSpec, Probe, Program, Runtime, Source, Target, capability_paths)
from .capabilities import capability_registry, profile_for
from .hookspecs import hookimpl, hookspec
from .registry import GROUP, PluginRecord, Registry, get_registry, reset_registry

__all__ = [
    "EXTENSIBLE_OPS", "MODES", "PLUGIN_API", "GROUP", "Backend", "OpExtension", "Compiler", "DeviceInfo", "Emitter", "Intrinsic", "PassSpec", "Probe",
    "Program", "Runtime", "Source", "Target", "PluginRecord", "Registry", "capability_paths",
    "capability_registry", "get_registry", "hookimpl", "hookspec", "profile_for", "reset_registry",
    "resolve_target", "list_targets",
]


def resolve_target(spec):
    """``(backend, Target)`` for a target string such as ``"cpu"``."""
    return get_registry().resolve(spec)


def list_targets() -> list:
    """Target strings offered by the installed, working backends."""
    return sorted(t for b in get_registry().backends().values() for t in b.targets())
