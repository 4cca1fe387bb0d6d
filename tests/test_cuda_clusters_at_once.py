"""How many thread-block clusters a GPU holds at once is capability data (docs/decisions.md D47): the split-K GEMM
sums a split tile inside one cluster by default only where all of the grid's clusters fit at once (D41), and the
figures it compares with are the profile's ``execution.cluster.at_once``, no longer a table in the CUDA plugin.

Through the public API (``tilecore.compile`` of the README GEMM on ``cuda:sm_90a``): the figures in the sm_90a file
decide as before, a test profile with other figures (the shipped profile with ``execution.cluster.at_once``
overlaid, as a probe would) changes the choice, and a profile without them keeps the workspace sum and says why.
Compile-only wherever a CUDA compiler exists.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tilecore
from tilecore.capabilities import CapabilityError
from tilecore.plugin import capability_registry

pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, _notes, gemm  # noqa: E402

#: 32 tiles of 128 x 128 over K = 4096: the rule's 4 splits (D31)
LLM_128 = dict(M=128, N=4096, K=4096, bm=128, bn=128, threads=256, stages=3)


def _compile(monkeypatch, at_once="shipped", **cfg):
    """The GEMM compiled for sm_90a, whose profile has ``execution.cluster.at_once`` overlaid unless "shipped"."""
    if at_once != "shipped":  # the profile's figures overlaid for this compile (tilecore.capability_overlay, D63)
        cfg = {**cfg, "tilecore.capability_overlay": {"execution.cluster.at_once": at_once}}
    s = dict(LLM_128)
    fn = gemm(s.pop("M"), s.pop("N"), s.pop("K"), **s)
    # the plugin's split-K (D78 would route this 3-split tile to the core's sum in cells)
    return tilecore.compile(fn, target=HOPPER, pass_configs={**NOCACHE, "tilecore.cuda.general_split_k": False, **cfg})


def _splits(k) -> tuple:
    """(split count, summed in clusters) of a compiled split GEMM."""
    meta = k.source.meta
    cluster = bool(meta.get("cluster"))
    assert cluster != ("workspace" in meta)  # exactly one of the two sums
    return int(meta["grid"][2]), cluster


def test_the_figures_are_the_profiles():
    """sm_90a declares the H100's measured figures with how they were measured; sm_100a, which extends it, says
    it has none (null) instead of inheriting an H100's; a figure that is not a count is a schema error."""
    reg = capability_registry()
    h100 = reg.resolve("cuda/sm_90a")
    assert dict(h100.get("execution.cluster.at_once")) == {"2": 66, "3": 39, "4": 30, "8": 15}
    assert h100.get("execution.cluster.at_once_shared_bytes") == 99376
    assert "cuOccupancyMaxActiveClusters" in h100.get("provenance")["execution.cluster.at_once"]
    assert reg.resolve("cuda/sm_100a").get("execution.cluster.at_once") is None
    with pytest.raises(CapabilityError, match="execution.cluster.at_once"):
        reg.overlay("cuda/sm_90a", {"execution.cluster.at_once": {"4": "many"}})
    with pytest.raises(CapabilityError, match="execution.cluster.at_once"):
        reg.overlay("cuda/sm_90a", {"execution.cluster.at_once": {"four": 30}})


@needs_toolchain
def test_the_shipped_figures_choose_as_d41_measured(monkeypatch):
    # 32 clusters of 4 do not fit in 30: one split fewer, 3 in clusters (39 fit), said with the profile's figures
    k = _compile(monkeypatch)
    assert _splits(k) == (3, True)
    assert "4 splits in clusters would not all fit at once on cuda/sm_90a (30 of 4), 3 do (39)" in _notes(k)
    k = _compile(monkeypatch, **{"tilecore.cuda.split_k": 4})
    assert _splits(k) == (4, False)
    assert "32 clusters of 4 blocks may not all fit on the GPU at once (cuda/sm_90a holds 30)" in _notes(k)


@needs_toolchain
def test_other_figures_change_the_choice(monkeypatch):
    # a GPU that holds 32 clusters of 4: the rule's 4 splits in clusters, no workspace
    assert _splits(_compile(monkeypatch, {"2": 66, "3": 39, "4": 32, "8": 15})) == (4, True)
    # one that holds fewer than 32 of 3 and of 4: the workspace sum over the rule's 4 splits
    k = _compile(monkeypatch, {"2": 66, "3": 31, "4": 30})
    assert _splits(k) == (4, False)
    assert "cuda/sm_90a holds 30" in _notes(k)
    # an asked-for split count is kept, in clusters where they fit
    assert _splits(_compile(monkeypatch, {"2": 16}, **{"tilecore.cuda.split_k": 2})) == (2, False)
    assert _splits(_compile(monkeypatch, {"2": 32}, **{"tilecore.cuda.split_k": 2})) == (2, True)


@needs_toolchain
def test_a_profile_without_the_figures_keeps_the_workspace_sum(monkeypatch):
    k = _compile(monkeypatch, None)
    assert _splits(k) == (4, False)
    assert ("partials summed through global memory, not in one cluster per tile: 32 clusters of 4 blocks may not "
            "all fit on the GPU at once (cuda/sm_90a declares no execution.cluster.at_once for clusters of 4)"
            ) in _notes(k)
    # asking for clusters still builds them (the runtime asks the driver at load and warns)
    k = _compile(monkeypatch, None, **{"tilecore.cuda.split_k_reduce": "cluster"})
    assert _splits(k) == (4, True)
