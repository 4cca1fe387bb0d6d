"""The core's barrier pruning (``tilecore.prune_barriers``, D63) on by default on the mma.sync targets.

The core pass is off unless asked; this plugin asks where it was measured: targets without wgmma (sm_80, sm_86,
sm_89), whose general path pipelines with per-thread ``cp.async`` copies. H200 as sm_80 (D63): the GEMM's k loop 3 ->
1 barriers, +9%; softmax / RMSNorm / the 777-column GEMM +0.4-1.4%; the catalog passes with it. ``False`` turns it
off; ``True`` runs the core pass on any target (this one then does nothing).
"""
from __future__ import annotations

from tilecore.passes import tile_pass
from tilecore.passes.barriers import OPTION, prune_function


@tile_pass("cuda.prune_barriers")
def prune_barriers_by_default(func, ctx):
    """The core's barrier pruning where tilecore.prune_barriers is unset and the target has no wgmma."""
    if ctx.option(OPTION, None) is not None or ctx.capabilities.feature("wgmma"):
        return func
    return prune_function(func)
