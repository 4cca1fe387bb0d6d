"""The core's relay-tile fold (``tilecore.fold_relay_tiles``, D63) by default for FlashAttention's form on the
mma.sync targets (D68).

The register program folds a shared tile that only relays a fragment to global memory (D33: FlashAttention's
``O_shared``); where that form runs on the core's general path instead (``tilecore.cuda.mma_general_forms`` has
``"attention"``, or ``tilecore.cuda.register_programs=False``) on a target without wgmma, this pass folds it the same
way, so V gets its second stage at 163 KiB. Only launches with two gemms or more (the attention form; the GEMM form's
epilogue measured 4.3% slower folded, D63). ``tilecore.fold_relay_tiles`` True / False still decides everywhere.
"""
from __future__ import annotations

from tilecore.ir import TileOp, collect
from tilecore.passes import tile_pass
from tilecore.passes.relay import OPTION, fold_function


def _attention_form(launch) -> bool:
    return sum(1 for t in collect(launch.body, TileOp) if t.op == "gemm") >= 2


@tile_pass("cuda.fold_relay_tiles")
def fold_attention_relay_tiles(func, ctx):
    """The fold where tilecore.fold_relay_tiles is unset, the target has no wgmma and the attention form is left to
    the general path."""
    from .regprog import MMA_GENERAL_FORMS, MMA_GENERAL_FORMS_DEFAULT

    if ctx.option(OPTION, None) is not None or ctx.capabilities.feature("wgmma"):
        return func
    forced = ctx.option("tilecore.cuda.register_programs", None)
    forms = ctx.option(MMA_GENERAL_FORMS, MMA_GENERAL_FORMS_DEFAULT)
    if forced is True or (forced is None and (isinstance(forms, str) or "attention" not in forms)):
        return func
    return fold_function(func, _attention_form)
