"""Hook specifications of the ``tilecore`` plugin system (pluggy), in lifecycle order.

Plugins are found through the ``tilecore.backends`` entry-point group, the first time tilecore needs a
backend (never at ``import tilecore``). Each entry point names a module or an object carrying
``@hookimpl`` functions. Implementations may take a subset of a spec's arguments, so specs can grow.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .api import Backend, Target

hookspec = pluggy.HookspecMarker("tilecore")
hookimpl = pluggy.HookimplMarker("tilecore")


# -- registration ---------------------------------------------------------------------------------

@hookspec
def tilecore_backends() -> "list[Backend]":
    """Return the backends this plugin provides (usually one).

    Called once per plugin, right after it loads. Must only construct objects: no device probing, no
    compiler discovery (those happen in ``Backend.probe`` when asked). An exception here marks this
    plugin ``broken`` and leaves the others working.

    :return: a list of :class:`~tilecore.plugin.api.Backend` instances.

    .. versionadded:: 1.0
    """


@hookspec
def tilecore_capability_paths() -> list:
    """Return extra capability YAML files or folders (for plugins that describe devices another
    backend runs, e.g. a board vendor's profile). Backends return theirs from ``capability_files``.

    .. versionadded:: 1.0
    """


# -- compilation ----------------------------------------------------------------------------------

@hookspec
def tilecore_pipeline_passes(target: "Target") -> list:
    """Return :class:`~tilecore.plugin.api.PassSpec` objects to add to the pipeline for ``target``.

    Called for every plugin on every compile; return ``[]`` for targets you do not care about. A
    backend's own passes come from ``Backend.passes``; this hook is for cross-cutting plugins
    (instrumentation, checkers).

    .. versionadded:: 1.0
    """
