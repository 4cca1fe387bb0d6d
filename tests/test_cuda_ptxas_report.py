"""ptxas's report reaches the kernel author (plugin API 1.7): registers and spills in ``meta["ptxas"]``, and a
:class:`tilecore.errors.PerformanceWarning` naming the kernel, its line and the fix where ptxas spilled or
serialized wgmma, at compile time and again when the kernel comes from the cache. Needs NVRTC, no GPU."""
from __future__ import annotations

import os
import warnings

import pytest

import tilecore
from tilecore.errors import PerformanceWarning

tilecore_cuda = pytest.importorskip("tilecore_cuda")
from tilecore_conformance.composite import flash_attention_forward  # noqa: E402
from tilecore_cuda.compiler import performance_notes, ptxas_report  # noqa: E402

HAS_TOOLCHAIN = tilecore_cuda.CUDABackend().probe().status != "no-toolchain"
pytestmark = pytest.mark.skipif(not HAS_TOOLCHAIN and os.environ.get("TILECORE_CUDA_REQUIRE_TOOLCHAIN") != "1",
                                reason="no CUDA compiler here (pip install 'nvidia-cuda-nvrtc==13.0.*')")

SPILLING_LOG = """ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to
insufficient register resources for the function 'tc_kernel'. Try decreasing register pressure.
ptxas info    : Function properties for tc_kernel
ptxas         .     632 bytes stack frame, 1304 bytes spill stores, 1300 bytes spill loads
ptxas info    : Used 128 registers, used 16 barriers, 632 bytes cumulative stack size"""


def test_the_report_parses_what_ptxas_prints():
    report = ptxas_report(SPILLING_LOG.replace("due to\n", "due to "))
    assert report["registers"] == 128 and report["spill_stores"] == 1304 and report["spill_loads"] == 1300
    assert report["stack"] == 632
    assert report["performance_loss"][0].startswith("wgmma.mma_async instructions are serialized")
    notes = performance_notes(report)
    assert len(notes) == 2 and "1304 bytes stored" in notes[0] and "smaller tiles" in notes[0]
    assert "fewer warpgroups" in notes[1]
    other = performance_notes(ptxas_report("ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async "
                                           "instructions are serialized due to non wgmma instructions defining "
                                           "accumulator registers of a wgmma between start and end of the pipeline "
                                           "stage in the function 'tc_kernel'."))
    assert len(other) == 1 and "please report it" in other[0]
    clean = ptxas_report("ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                         "ptxas info    : Used 168 registers, used 1 barriers")
    assert clean == {"stack": 0, "spill_stores": 0, "spill_loads": 0, "registers": 168}
    assert performance_notes(clean) == []
    # a log without ptxas's lines (NVRTC on the GPU hosts, for a program it compiled before) is no report, not a clean one
    none = ptxas_report("")
    assert none == {"reported": False} and performance_notes(none) == []


def _attention(bm, bn, threads):
    return flash_attention_forward(1536, 128, 2, bm, bn, "float16", False, batch=1, threads=threads, num_stages=2)


def test_a_kernel_that_spills_warns_with_its_line_and_the_fix(tmp_path, monkeypatch):
    # a 128 x 256 fp32 accumulator over one warpgroup (the Hopper pipeline refuses it: too many accumulators) on the
    # general path: 256 values a thread, ptxas spills and serializes the wgmma (before D86 the example was
    # FlashAttention with three consumer warpgroups on the retired WGMMA register program)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_cuda_hopper import gemm

    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path))
    func = gemm(512, 512, 512, threads=128, bn=256)
    with pytest.warns(PerformanceWarning) as rec:
        kernel = tilecore.compile(func, target="cuda:sm_90a")
    msg = str(rec[0].message)
    assert "spilled registers" in msg and "serialized" in msg and "smaller tiles" in msg
    assert f"{func.name}" in msg and str(func.span.line) in msg
    report = kernel.meta["source"]["meta"]["ptxas"]
    assert report["spill_stores"] > 0 and report["registers"] <= 255
    # the same kernel from the cache warns again
    with pytest.warns(PerformanceWarning, match="spilled registers"):
        again = tilecore.compile(func, target="cuda:sm_90a")
    assert again.meta["from_cache"]


def test_a_kernel_that_fits_says_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        kernel = tilecore.compile(_attention(128, 128, 256), target="cuda:sm_90a",
                                  pass_configs={"tilecore.disable_cache": True})
    report = kernel.meta["source"]["meta"]["ptxas"]
    assert report["spill_stores"] == 0 and 0 < report["registers"] <= 255
    assert "performance_notes" not in kernel.meta["source"]["meta"]


def test_a_dynamic_trip_count_does_not_serialize_wgmma():
    # the catalog's dynamic-shape GEMM on the core's general path: the loop and its drain sit under one
    # `trips > 0` test; before that, ptxas serialized every wgmma of the kernel (the zeroing and an async group
    # both reached the drain's wait as the accumulators' last definition)
    from tilecore_conformance.catalog import _dynamic_gemm_kernel

    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        kernel = tilecore.compile(_dynamic_gemm_kernel("float16", "float32", False, False, 70, 72, 96),
                                  target="cuda:sm_90a", pass_configs={"tilecore.disable_cache": True})
    assert "performance_loss" not in kernel.meta["source"]["meta"]["ptxas"]
    assert "wgmma" in kernel.get_kernel_source()
