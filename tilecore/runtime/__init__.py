"""Runtime protocol re-exports and the profiler (see tilecore.plugin.api for the contracts)."""
from ..plugin.api import Program, Runtime

__all__ = ["Program", "Runtime"]
