"""tilecore-musa's generated code run on the host emulation (tests/musa_host_emulator.py) at the hardware's
warp width: QY2 (128 lanes) through the 32x32x16 MMA atom and 128-wide lane exchanges, PH1 (32 lanes)
through TME loads on ASYNC barriers. The numbers are checked against float64 references; run at the wrong
warp width, or with a barrier step removed, the same kernels fail."""
from __future__ import annotations

import numpy as np
import pytest

import tilecore
from kernels_for_tests import matmul_relu
from musa_host_emulator import compiler, run_on_host

pytest.importorskip("tilecore_musa")
pytestmark = pytest.mark.skipif(compiler() is None, reason="no clang++ for the host emulation")
QY2, PH1 = "musa:mp_22", "musa:mp_31"


def _gemm_case(M, N, K, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
    return a, b, ref


def test_qy2_readme_gemm_on_the_atom_at_warp_128():
    M, N, K = 100, 128, 96
    k = tilecore.compile(matmul_relu(M, N, K, 64, 64, 32), target=QY2)
    assert "tc_mp22_mma(&" in k.source.code
    a, b, ref = _gemm_case(M, N, K, np.float16)
    c = run_on_host(k, [a, b, np.zeros((M, N), np.float16)])[2]
    assert np.abs(c.astype(np.float64) - ref).max() < 0.05 * max(1.0, np.abs(ref).max()) / 10


def test_qy2_softmax_right_at_128_wrong_at_32():
    from tilecore_conformance import composite

    k = tilecore.compile(composite.softmax("float32", rows=16, cols=512, br=4, threads=128), target=QY2)
    x = np.random.default_rng(1).standard_normal((16, 512)).astype(np.float32)
    ref = composite.softmax_ref([x], "float32")[0]
    y = run_on_host(k, [x, np.zeros_like(x)])[1]
    assert np.abs(y - ref).max() < 1e-6
    # the same QY2 code on 32-wide warps (what a CUDA-style proxy would run) exchanges with lanes that do not
    # exist in its warp: the emulator refuses, as the hardware would compute garbage
    with pytest.raises(RuntimeError, match="lane exchange wider than the warp"):
        run_on_host(k, [x, np.zeros_like(x)], warp=32)


def test_ph1_tme_loads_on_async_barriers():
    from test_musa_backend import tme_gemm32

    M, N, K = 100, 72, 40  # ragged: the TME boxes run past the tensors (zero fill)
    k = tilecore.compile(tme_gemm32(M, N, K), target=PH1, pass_configs={"tilecore.disable_cache": True})
    src = k.source.code
    assert k.source.meta["vendor"]["tme_loads"] == 2 and "tc_sqmma_gemm<" not in src
    a, b, _ = _gemm_case(M, N, K, np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    c = run_on_host(k, [a, b, np.zeros((M, N), np.float32)])[2]
    assert np.abs(c - ref).max() < 1e-3
    # without the wait the tile is read before the copy lands: wrong numbers
    bad = k.source.__class__(src.replace("    __musa_async_wait(1, tc_phase1);\n", ""), k.source.lang, k.source.entry,
                             k.source.meta)
    c = run_on_host(_with_source(k, bad), [a, b, np.zeros((M, N), np.float32)])[2]
    assert np.abs(c - ref).max() > 0.1
    # without the transaction bytes the barrier is over-filled
    bad = k.source.__class__(src.replace("__musa_async_add_trans(2, ", "(void)(2, "), k.source.lang, k.source.entry,
                             k.source.meta)
    with pytest.raises(RuntimeError, match="more bytes than its barrier expects"):
        run_on_host(_with_source(k, bad), [a, b, np.zeros((M, N), np.float32)])


class _with_source:
    def __init__(self, kernel, source):
        self.source = source


def test_a_wrong_qy2_layout_fails_on_host(monkeypatch):
    """The emulated instruction follows the fork's layouts, not units.py: register C with its two register
    digits swapped and the same GEMM comes out wrong."""
    import tilecore_musa.units as units
    from tilecore.layout import FragmentLayout, MatrixUnit

    good = units.qy2_mma_32x32x16()
    c = FragmentLayout((32, 32), [[("thread", 4, 8), ("thread", 2, 64), ("reg", 4, 1)],
                                  [("thread", 8, 1), ("thread", 2, 32), ("reg", 2, 4)]], name="wrong.C")
    wrong = MatrixUnit(good.family, 32, 32, 16, good.a_dtypes, good.acc_dtype, 128, good.a, good.b, c, good.spelling)
    monkeypatch.setattr(units, "units", lambda target: [wrong])
    M, N, K = 64, 64, 32
    k = tilecore.compile(matmul_relu(M, N, K, 64, 64, 32), target=QY2, pass_configs={"tilecore.disable_cache": True})
    assert "tc_mp22_mma(&" in k.source.code
    a, b, ref = _gemm_case(M, N, K, np.float16)
    out = run_on_host(k, [a, b, np.zeros((M, N), np.float16)])[2]
    assert np.abs(out.astype(np.float64) - ref).max() > 1.0
