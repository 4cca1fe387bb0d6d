"""GEMM, softmax and FlashAttention forward through the core model (layout inference, tilecore.passes.matrix)
on a made-up matrix unit that is nothing like CUDA's (tests/fake_matrix_backend.py: 64-thread groups, a
column's rows in one thread's registers), compiled with tilecore.compile and run on the host
(tests/cuda_host_emulator.py, whose shim implements the unit from its description). Also the CUDA
mma.sync unit on the same path, for a GEMM the CUDA register programs do not take (B rows of 777
elements)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore

pytest.importorskip("tilecore_cuda")
sys.path.insert(0, str(Path(__file__).parent))
from cuda_host_emulator import run_on_host  # noqa: E402
from fake_matrix_backend import SPELLING, register  # noqa: E402
from test_cuda_tensor_cores import gemm_kernel  # noqa: E402

NOCACHE = {"tilecore.disable_cache": True}
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")


@pytest.fixture(scope="module")
def fakemu(tmp_path_factory):
    from tilecore.plugin import reset_registry

    reset_registry()
    register(tmp_path_factory.mktemp("fakemu"))
    yield "fakemu"
    reset_registry()


def _on_unit(k, frag, unit):
    lay = k.meta["attrs"]["fragment_layouts"][frag]
    assert lay.startswith(unit), lay
    return lay


def _operands(rng, a_shape, b_shape):
    a = rng.standard_normal(a_shape).astype(np.float16)
    b = rng.standard_normal(b_shape).astype(np.float16)
    return a, b, a.astype(np.float64), b.astype(np.float64)


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("shape,block,threads", [((128, 96, 64), (64, 32, 16), 128),
                                                 ((100, 72, 40), (32, 32, 8), 64),
                                                 ((64, 64, 32), (64, 64, 32), 256)])
def test_gemm_on_the_made_up_unit(fakemu, ta, tb, shape, block, threads):
    M, N, K = shape
    k = tilecore.compile(gemm_kernel(M, N, K, *block, ta, tb, threads=threads), target=fakemu, pass_configs=NOCACHE)
    _on_unit(k, "C_l", SPELLING)
    assert f"tc_fakemu_16x16x8(&C_l" in k.source.code
    rng = np.random.default_rng([M, int(ta), int(tb)])
    a, b, a64, b64 = _operands(rng, (K, M) if ta else (M, K), (N, K) if tb else (K, N))
    out = run_on_host(k, [a, b, np.full((M, N), np.nan, np.float32)])[2]
    ref = (a64.T if ta else a64) @ (b64.T if tb else b64)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_gemm_that_does_not_divide_says_why(fakemu):
    # 3x1 atoms of C cannot be split over two groups: C takes the core's blocked layout
    k = tilecore.compile(gemm_kernel(48, 16, 16, 48, 16, 16, threads=128), target=fakemu, pass_configs=NOCACHE)
    assert not k.meta["attrs"]["fragment_layouts"]["C_l"].startswith(SPELLING)
    assert "tc_fakemu" not in k.source.code
    rng = np.random.default_rng(3)
    a, b, a64, b64 = _operands(rng, (48, 16), (16, 16))
    out = run_on_host(k, [a, b, np.full((48, 16), np.nan, np.float32)])[2]
    np.testing.assert_allclose(out, a64 @ b64, rtol=1e-4, atol=1e-4)


def test_softmax_on_the_made_up_target(fakemu):
    composite = pytest.importorskip("tilecore_conformance.composite")
    k = tilecore.compile(composite.softmax("float16"), target=fakemu, pass_configs=NOCACHE)
    assert not k.meta["attrs"]["fragment_layouts"]["x"].startswith("shared")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((composite.ROWS, composite.COLS)).astype(np.float16)
    out = run_on_host(k, [x, np.zeros_like(x)])[1].astype(np.float64)
    ref = composite.softmax_ref([x], "float16")[0]
    assert np.abs(out - ref).max() <= 2e-3


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_on_the_made_up_unit(fakemu, causal):
    composite = pytest.importorskip("tilecore_conformance.composite")
    k = tilecore.compile(composite.attention("float16", causal), target=fakemu, pass_configs=NOCACHE)
    _on_unit(k, "acc_s", SPELLING)
    _on_unit(k, "acc_o", SPELLING)
    rng = np.random.default_rng(5)
    shape = (composite.HEADS, composite.SEQ, composite.DIM)
    q, kk, v = (rng.standard_normal(shape).astype(np.float16) for _ in range(3))
    out = run_on_host(k, [q, kk, v, np.zeros(shape, np.float16)])[3].astype(np.float64)
    ref = composite.attention_ref([q, kk, v], "float16", causal)[0]
    assert np.abs(out - ref).max() <= 2e-3


def test_mma_sync_through_the_core_model_for_a_gemm_off_the_matched_forms():
    """B rows of 777 float16 (not a multiple of 16 bytes): the register programs refuse it; the core's layout
    pass puts C on the registered mma.sync unit, with ldmatrix operand loads (the unit's MatrixLoad spelled by
    the CUDA emitter); ``tilecore.matrix_unit_gemm=False`` keeps it off the unit (the plugin's own GEMM)."""
    import tilecore_cuda
    from test_cuda_backend import needs_toolchain  # noqa: F401 - the same toolchain condition

    if tilecore_cuda.CUDABackend().probe().status == "no-toolchain":
        pytest.skip("no CUDA toolchain")
    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    from cuda_offpath import gemm_777

    M, N, K = 64, 777, 64
    fn = gemm_777(M, N, K, bm=64, bn=64, bk=32)
    off = tilecore.compile(fn, target="cuda:sm_80", pass_configs={**NOCACHE, "tilecore.matrix_unit_gemm": False})
    assert "tc_mma_16816_r(" not in off.source.code
    assert off.meta["attrs"]["fragment_layouts"]["C_local"].startswith("shared")
    assert any("tilecore.matrix_unit_gemm is False" in n for n in off.meta["attrs"]["notes"]) \
        if "notes" in off.meta["attrs"] else True
    k = tilecore.compile(fn, target="cuda:sm_80", pass_configs=NOCACHE)  # the default: the unit
    assert tilecore_cuda.lowering_path(k) == "generic"
    _on_unit(k, "C_local", "mma_sync_m16n8k16")
    assert "tc_mma_16816_r(" in k.source.code
    # A (64 x 32 tile, rows of 64 bytes) and B (32 x 64, rows of 128 bytes) both take ldmatrix: x4 for A,
    # x4.trans for B stored K x N (two atoms a load, D68's pairs)
    assert "tc_ldsm_regs<4, false>(" in k.source.code and "tc_ldsm_regs<4, true>(" in k.source.code
    assert "tc_ldsm_regs<2, " not in k.source.code
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    hmma = sass.count("HMMA.16816.F32")          # 2 x 4 atoms per warp (32 x 32) per k step of 16
    assert hmma in (8, 16), hmma                  # the loop over the tile's two k steps, or it unrolled
    assert "LDSM.16.M88.4" in sass and "LDSM.16.MT88.4" in sass
    assert "LDL" not in sass and "STL" not in sass  # operand and accumulator arrays stay in registers
    rng = np.random.default_rng(6)
    a, b, a64, b64 = _operands(rng, (M, K), (K, N))
    for kern in (k, off):
        out = run_on_host(kern, [a, b, np.zeros((M, N), np.float16)])[2].astype(np.float64)
        ref = a64 @ b64
        assert (np.abs(out - ref) <= 2e-3 * np.abs(ref) + 2e-2).all()
