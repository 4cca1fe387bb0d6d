"""Hopper GEMM pipelines (``cuda.hopper_gemm_pipeline``: TMA + mbarrier + WGMMA, warp-specialized), through
the public API.

Compile-only checks wherever a CUDA compiler exists (CI): which loops the pass takes and which it leaves
to the ``mma.sync`` path (with the reason), and the SASS (HGMMA / QGMMA, UTMALDG, the mbarrier SYNCS,
USETMAXREG). On an sm_90 GPU the kernels run and are compared with float64 references.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_backend import HAS_DEVICE, NOCACHE, needs_toolchain  # noqa: E402

HOPPER = "cuda:sm_90a"
#: the two routes of the kernels the plugin's register programs take (tilecore.cuda.register_programs, D61): every one
#: to the core's general path, or every one to the register programs; the compile cache off
GENERAL = {**NOCACHE, "tilecore.cuda.register_programs": False}
REGPROG = {**NOCACHE, "tilecore.cuda.register_programs": True}
#: one block per tile (the persistent grid is the default since D43; tests/test_cuda_persistent.py covers it)
PER_TILE = {"tilecore.disable_cache": True, "tilecore.cuda.persistent": False}


@pytest.fixture(autouse=True)
def _the_plugins_hopper_pipeline(monkeypatch):
    """These tests test the plugin's Hopper pipeline on plain GEMMs, which D58 routes to the core's general path by
    default: pinned to the pipeline (``tilecore.cuda.general_plain_gemm=False``, on top of any TILECORE_PASS_CONFIGS)."""
    import json
    import os

    env = json.loads(os.environ.get("TILECORE_PASS_CONFIGS", "") or "{}")
    monkeypatch.setenv("TILECORE_PASS_CONFIGS", json.dumps({**env, "tilecore.cuda.general_plain_gemm": False}))


def _on_hopper() -> bool:
    if not HAS_DEVICE:
        return False
    from tilecore_cuda.runtime import arch_of, device_properties

    return arch_of(device_properties(0)) == "sm_90a"


hopper_gpu = pytest.mark.skipif(not _on_hopper(), reason="no sm_90 GPU here")


def gemm(M, N, K, bm=128, bn=256, bk=64, threads=256, stages=4, dtype="float16", out="float16", tb=False,
         epilogue="copy", panel=0):
    """C = A @ B (B given as (N, K) when ``tb``); ``epilogue="relu"`` works on the fragment before the copy,
    so the accumulators must reach shared memory first."""
    b_shape, bs_shape = ((N, K), (bn, bk)) if tb else ((K, N), (bk, bn))

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((M, N), out)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            if panel:
                T.use_swizzle(panel)
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared(bs_shape, dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, ko * bk], A_s)
                if tb:
                    T.copy(B[bx * bn, ko * bk], B_s)
                else:
                    T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l, transpose_B=tb)
            if epilogue == "relu":
                for i, j in T.Parallel(bm, bn):
                    C_l[i, j] = T.max(C_l[i, j], 0.0)
            T.copy(C_l, C[by * bm, bx * bn])

    return main


def _notes(k) -> str:
    return " | ".join(k.meta["attrs"].get("hopper_pipelines", ()))


# -- compile-only ---------------------------------------------------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("persistent", [None, False])
def test_readme_gemm_becomes_a_warp_specialized_tma_wgmma_pipeline(persistent):
    """By default (D43) on a persistent grid (D34): at most one block per SM, each looping over its tiles; with
    ``tilecore.cuda.persistent=False`` one block per tile. The same pipeline either way, and no spill."""
    cfg = NOCACHE if persistent is None else {**NOCACHE, "tilecore.cuda.persistent": persistent}
    k = tilecore.compile(gemm(1024, 1024, 1024), target=HOPPER, pass_configs=cfg)
    assert "128x256x64 float16, 4 stages, 2 consumer warpgroup(s) + 1 producer, epilogue to global" in _notes(k)
    src = k.get_kernel_source()
    collective = "tc_wgmma_pipeline<384," if persistent is False else "tc_wgmma_persistent<384,"
    assert collective in src and "__launch_bounds__(384, 1)" in src
    assert k.source.meta["grid"] == (["4", "8", "1"] if persistent is False else ["32", "1", "1"])
    assert k.source.meta["ptxas"].get("spill_stores", 0) == 0
    # A's and B's tensor maps; persistent, C's too (its epilogue through TMA stores, in two halves at 4 stages: D38)
    assert src.count("__grid_constant__ tc_tmap") == (2 if persistent is False else 3)
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    for op in ("HGMMA.64x256x16.F32", "UTMALDG.2D", "SYNCS", "USETMAXREG"):
        assert op in sass, op
    assert "HMMA" not in sass  # no mma.sync fallback in this kernel
    assert "tnspB" in sass  # B is (K, N): N-major operand


@needs_toolchain
def test_k_major_b_and_bfloat16():
    k = tilecore.compile(gemm(512, 512, 512, bn=128, dtype="bfloat16", out="float32", tb=True), target=HOPPER,
                         pass_configs=NOCACHE)
    assert "128x128x64 bfloat16" in _notes(k)
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "HGMMA.64x128x16.F32.BF16" in sass and "tnspB" not in sass


@needs_toolchain
@pytest.mark.parametrize("dtype,sass_type", [("float8_e4m3", "E4M3.E4M3"), ("float8_e5m2", "E5M2.E5M2")])
def test_fp8_gemm_uses_qgmma(dtype, sass_type):
    k = tilecore.compile(gemm(1024, 1024, 1024, bk=128, dtype=dtype, tb=True), target=HOPPER,
                         pass_configs=NOCACHE)
    assert f"128x256x128 {dtype}" in _notes(k)
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert f"QGMMA.64x256x32.F32.{sass_type}" in sass and "UTMALDG" in sass


@needs_toolchain
def test_epilogue_on_the_fragment_goes_through_shared_memory():
    k = tilecore.compile(gemm(512, 512, 512, bn=128, epilogue="relu"), target=HOPPER, pass_configs=NOCACHE)
    assert "epilogue to shared memory" in _notes(k)
    assert "tc_wgmma_pipeline<384, 128, 128, 64, 4, 2, 1, false, 0, 64, 64, 0, false," in k.get_kernel_source()


#: the epilogue's direct stores (D25's flags), not its TMA stores (D38, the default on a persistent grid)
DIRECT = {"tilecore.cuda.tma_store": False}


def _epi(k) -> int:
    """The EPI template argument of the kernel's tc_wgmma_pipeline or tc_wgmma_persistent (what the epilogue
    need not check; the persistent collective has no TO_GLOBAL before it: it always stores to global)."""
    src = k.get_kernel_source()
    for name, at in (("tc_wgmma_pipeline<", 13), ("tc_wgmma_persistent<", 12)):
        if name in src:
            return int(src[src.index(name):].split(">", 1)[0].split(",")[at])
    raise AssertionError("no Hopper GEMM collective in the kernel")


@needs_toolchain
@pytest.mark.parametrize("M,N,epi", [(512, 768, 7), (1000, 768, 6), (512, 1000, 5), (200, 136, 4)])
def test_epilogue_drops_the_checks_the_shapes_prove(M, N, epi):
    """Rows (1), columns (2), aligned pairs (4): set only where every block's tile is in range / even."""
    # the direct stores' flags (D38's TMA stores, the default, need none of them: test_cuda_tma_store.py)
    k = tilecore.compile(gemm(M, N, 64, bn=256 if N >= 256 else 128), target=HOPPER, pass_configs={**NOCACHE, **DIRECT})
    assert _epi(k) == epi
    assert k.source.meta["aligned_args"] == [2]  # C: the launch checks its address (pairs are stored unchecked)


@needs_toolchain
def test_keep_epilogue_checks_compiles_every_check():
    k = tilecore.compile(gemm(512, 768, 64), target=HOPPER,
                         pass_configs={**NOCACHE, **DIRECT, "tilecore.cuda.keep_epilogue_checks": True})
    assert _epi(k) == 0 and k.source.meta["aligned_args"] == []


@needs_toolchain
def test_epilogue_of_a_dynamic_m_keeps_the_row_check():
    k = tilecore.compile(dynamic_m_gemm(), target=HOPPER, pass_configs={**NOCACHE, **DIRECT})
    assert _epi(k) == 6


@needs_toolchain
def test_full_tile_epilogue_is_a_third_of_the_code():
    """The 128x256 tile with every check (M = 4000: rows may be partial, the column and pair checks
    kept by an odd-width view of the same tile) against none: the unchecked kernel keeps every HGMMA and
    TMA load and is far shorter (the checks were 70% of the SASS and 40% of NVRTC's time; D25). One block per
    tile: the persistent kernel (the default) carries its tile loop and producer beside (1008 against 1888)."""
    full = tilecore.compile(gemm(4096, 4096, 4096), target=HOPPER, pass_configs=PER_TILE)
    part = tilecore.compile(gemm(4000, 4000, 4096), target=HOPPER, pass_configs=PER_TILE)
    assert (_epi(full), _epi(part)) == (7, 4)
    be = tilecore_cuda.CUDABackend()
    sf, sp = be.disassemble(full.binary, full.target), be.disassemble(part.binary, part.target)
    for op in ("HGMMA.64x256x16.F32", "UTMALDG.2D", "SYNCS.PHASECHK"):
        assert sf.count(op) == sp.count(op) > 0, op
    n = [sum(1 for ln in s.splitlines() if ln.strip().startswith("/*") and ";" in ln) for s in (sf, sp)]
    assert n[0] * 2 < n[1], n


@needs_toolchain
@pytest.mark.parametrize("kwargs,why", [
    ({"bk": 32}, "block_K must be whole 128-byte rows"),
    ({"dtype": "float8_e4m3", "bk": 128}, "transpose_B=True"),
    ({"threads": 128, "bn": 256}, "too many accumulators"),
    ({"threads": 96, "bm": 64}, "whole warpgroups"),
    ({"dtype": "float8_e4m3", "bk": 128, "tb": True, "K": 1000}, "rows of A are not a multiple of 16 bytes"),
])
def test_loops_the_pipeline_cannot_take_fall_back_with_a_reason(kwargs, why):
    K = kwargs.pop("K", 512)
    k = tilecore.compile(gemm(512, 512, K, **kwargs), target=HOPPER,  # (the route's default: D86 refuses True for
                         pass_configs={**NOCACHE, "tilecore.cuda.register_programs": "auto"})  # block_K 32's form)
    assert "not pipelined" in _notes(k) and why in _notes(k)
    # the kernel, not the prelude
    assert "tc_wgmma_pipeline" not in k.get_kernel_source().split('extern "C"')[1]


@needs_toolchain
def test_sm80_and_disable_switch_take_the_mma_sync_register_program():
    # sm_80's GEMM form runs on the general path by default since D63: pinned to the register program here
    for target, cfg in (("cuda:sm_80", {"tilecore.cuda.register_programs": True}),
                        (HOPPER, {"tilecore.cuda.disable_wgmma": True})):
        k = tilecore.compile(gemm(512, 512, 512, bn=128, stages=3), target=target, pass_configs={**NOCACHE, **cfg})
        assert "cuda.register_program: mma.sync + cp.async, 8 warps of 16 rows" in _notes(k)
        assert "3 stages deep" in _notes(k)
        src = k.get_kernel_source()
        assert "tc_wgmma" not in src and "tc_cp_async_wait<1>();" in src and "tc_ldsm_x4_t_raw" in src
        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
        for op in ("HMMA.16816.F32", "LDSM", "LDGSTS"):
            assert op in sass, (target, op)
        assert "STL" not in sass and "LDL" not in sass and "HGMMA" not in sass


@needs_toolchain
def test_kernels_outside_the_register_programs_take_the_core_unit_path():
    """The register programs refuse the kernel (96-byte tile rows: neither swizzle, D47); the core's layout pass
    puts C on the mma.sync unit (or, with ``tilecore.matrix_unit_gemm=False``, the plugin's per-op tensor-core GEMM
    runs it)."""
    fn = gemm(512, 512, 512, bk=48, bn=128, stages=2)
    k = tilecore.compile(fn, target="cuda:sm_80", pass_configs=NOCACHE)
    assert "cuda.register_program: kernel not mapped to registers" in _notes(k)
    assert k.meta["attrs"]["fragment_layouts"]["C_l"].startswith("mma_sync_m16n8k16.C")
    assert "tc_gemm_mma<" not in k.get_kernel_source() and "tc_ldsm_regs<" in k.get_kernel_source()
    k = tilecore.compile(fn, target="cuda:sm_80", pass_configs={**NOCACHE, "tilecore.matrix_unit_gemm": False})
    assert "tc_gemm_mma<" in k.get_kernel_source()


@needs_toolchain
def test_use_swizzle_rasterizes_blocks_in_panels():
    src = tilecore.compile(gemm(1024, 1024, 1024, panel=4), target=HOPPER, pass_configs=PER_TILE).get_kernel_source()
    assert "tc_pn = 4LL * tc_gf" in src and "const int bx = (int)tc_bx;" in src
    plain = tilecore.compile(gemm(1024, 1024, 1024), target=HOPPER, pass_configs=PER_TILE).get_kernel_source()
    assert "tc_pn" not in plain and "const int bx = (int)blockIdx.x;" in plain


# -- on an H100 -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torch_cuda():
    return pytest.importorskip("torch")


def _run(torch, fn, M, N, K, dtype, out, tb, seed=3):
    rng = np.random.default_rng(seed)
    a32 = rng.standard_normal((M, K)).astype(np.float32)
    b32 = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    tdt = {"float8_e4m3": torch.float8_e4m3fn}.get(dtype) or getattr(torch, dtype)
    a = torch.from_numpy(a32).cuda().to(tdt)
    b = torch.from_numpy(b32).cuda().to(tdt)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=getattr(torch, out))
    k = tilecore.compile(fn, target="cuda")
    k(a, b, c)
    torch.cuda.synchronize()
    a64, b64 = a.double().cpu().numpy(), b.double().cpu().numpy()
    ref = a64 @ (b64.T if tb else b64)
    return k, c.double().cpu().numpy(), ref


@hopper_gpu
@pytest.mark.parametrize("dtype,out,tb", [("float16", "float16", False), ("float16", "float32", True),
                                          ("bfloat16", "bfloat16", False), ("bfloat16", "float32", True),
                                          ("float8_e4m3", "float16", True)])
@pytest.mark.parametrize("M,N,K", [(512, 768, 1024), (1000, 1000, 1000), (200, 136, 72)])
def test_device_pipeline_matches_float64(torch_cuda, dtype, out, tb, M, N, K):
    bk = 128 if dtype == "float8_e4m3" else 64
    bn = 128 if N < 256 else 256
    if dtype == "float8_e4m3" and K % 16:
        K += 16 - K % 16  # TMA needs 16-byte rows (the fallback for other K is tested above)
    fn = gemm(M, N, K, bn=bn, bk=bk, dtype=dtype, out=out, tb=tb)
    k, got, ref = _run(torch_cuda, fn, M, N, K, dtype, out, tb)
    assert "epilogue to global" in _notes(k)
    tol = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 8e-2}[out] * np.sqrt(K)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, atol=tol, rtol=2e-2)


@hopper_gpu
def test_device_unchecked_pair_stores_refuse_a_misaligned_c(torch_cuda):
    from tilecore.errors import DeviceError

    k = tilecore.compile(gemm(256, 256, 64, bn=256), target="cuda")
    a = torch_cuda.randn(256, 64, device="cuda").half()
    b = torch_cuda.randn(64, 256, device="cuda").half()
    c = torch_cuda.empty(256 * 256 + 1, device="cuda").half()[1:].view(256, 256)  # 2 bytes past an aligned address
    with pytest.raises(DeviceError, match="16-byte aligned"):
        k(a, b, c)
    c = torch_cuda.empty(256, 256, device="cuda").half()
    k(a, b, c)
    torch_cuda.cuda.synchronize()
    assert torch_cuda.allclose(c.double(), a.double() @ b.double(), atol=0.5, rtol=2e-2)


@hopper_gpu
@pytest.mark.parametrize("dtype,out,tb", [("float16", "float16", False), ("bfloat16", "float32", True)])
@pytest.mark.parametrize("M,N,K,bm,bn,threads,stages", [(512, 768, 1024, 128, 128, 256, 3),
                                                        (1000, 1000, 1000, 64, 64, 128, 2),
                                                        (200, 144, 72, 128, 64, 256, 4)])
def test_device_mma_register_program_matches_float64(torch_cuda, dtype, out, tb, M, N, K, bm, bn, threads, stages):
    """The sm_80 path (mma.sync + multi-stage cp.async into swizzled tiles), run on the H100 with the Hopper
    passes switched off."""
    rng = np.random.default_rng(9)
    tdt = getattr(torch_cuda, dtype)
    a = torch_cuda.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).cuda().to(tdt)
    b = torch_cuda.from_numpy(rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)).cuda().to(tdt)
    c = torch_cuda.full((M, N), float("nan"), device="cuda", dtype=getattr(torch_cuda, out))
    fn = gemm(M, N, K, bm=bm, bn=bn, threads=threads, stages=stages, dtype=dtype, out=out, tb=tb)
    k = tilecore.compile(fn, target="cuda", pass_configs={"tilecore.cuda.disable_wgmma": True})
    assert "cuda.register_program: mma.sync" in _notes(k)
    k(a, b, c)
    torch_cuda.cuda.synchronize()
    a64, b64 = a.double().cpu().numpy(), b.double().cpu().numpy()
    ref = a64 @ (b64.T if tb else b64)
    tol = {"float32": 1e-3, "float16": 2e-2}[out] * np.sqrt(K)
    np.testing.assert_allclose(c.double().cpu().numpy(), ref, atol=tol, rtol=2e-2)


@hopper_gpu
@pytest.mark.parametrize("seq,dim,bm,bn,threads,causal", [(256, 128, 128, 128, 256, False),
                                                          (200, 64, 64, 64, 128, True),
                                                          (1000, 128, 128, 64, 256, True)])
def test_device_attention_mma_register_program_matches_float64(torch_cuda, seq, dim, bm, bn, threads, causal):
    from tilecore_conformance.composite import attention_ref

    torch = torch_cuda
    rng = np.random.default_rng(6)
    q, kk, v = (torch.from_numpy(rng.standard_normal((3, seq, dim)).astype(np.float32)).half().cuda()
                for _ in range(3))
    o = torch.full_like(q, float("nan"))
    k = tilecore.compile(_attention(seq, dim, bm, bn, threads, causal, heads=3), target="cuda",
                         pass_configs={"tilecore.cuda.disable_wgmma": True})
    assert "cuda.register_program: mma.sync" in _notes(k)
    k(q, kk, v, o)
    torch.cuda.synchronize()
    ref = attention_ref([x.cpu().numpy() for x in (q, kk, v)], "float16", causal, seq=seq, dim=dim)[0]
    np.testing.assert_allclose(o.double().cpu().numpy(), ref, atol=2e-2, rtol=2e-2)


@hopper_gpu
@pytest.mark.parametrize("panel", [3, 8])
def test_device_swizzled_grid_covers_every_tile_once(torch_cuda, panel):
    M, N, K = 1000, 1000, 256  # 8 x 4 blocks: panels that do not divide the grid
    fn = gemm(M, N, K, out="float32", panel=panel)
    k, got, ref = _run(torch_cuda, fn, M, N, K, "float16", "float32", False)
    np.testing.assert_allclose(got, ref, atol=1e-3 * np.sqrt(K), rtol=1e-3)


@hopper_gpu
@pytest.mark.parametrize("threads,bm,bn,stages", [(256, 128, 128, 3), (128, 64, 128, 2), (128, 128, 64, 5)])
def test_device_pipeline_shapes_and_shared_epilogue(torch_cuda, threads, bm, bn, stages):
    M, N, K = 384, 256, 640
    fn = gemm(M, N, K, bm=bm, bn=bn, threads=threads, stages=stages, out="float32", epilogue="relu")
    k, got, ref = _run(torch_cuda, fn, M, N, K, "float16", "float32", False)
    assert "epilogue to shared memory" in _notes(k)
    np.testing.assert_allclose(got, np.maximum(ref, 0), atol=1e-3 * np.sqrt(K), rtol=1e-3)


# -- FlashAttention forward: the core's general path (D86 retired the WGMMA register program) ---------------

#: the route's default, given explicitly (this module pins register_programs=True for the mma.sync program's tests)
AUTO = {"tilecore.cuda.register_programs": "auto"}

def _attention(seq, dim, bm, bn, threads, causal, heads=2, batch=None):
    from tilecore_conformance.composite import flash_attention_forward

    return flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=threads)


@needs_toolchain
def test_flash_attention_runs_on_the_general_path_with_wgmma_and_tma():
    """D86: the WGMMA register program's form compiles on the core's general path, which takes WGMMA (P @ V's A from
    registers) and TMA itself; no spills."""
    k = tilecore.compile(_attention(4096, 128, 128, 128, 256, True, heads=32, batch=8), target=HOPPER,
                         pass_configs={**NOCACHE, **AUTO})
    assert "retired (D86)" in _notes(k) and tilecore_cuda.lowering_path(k) == "generic"
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "HGMMA.64x128x16.F32" in sass and "UTMALDG" in sass
    assert "STL" not in sass and "LDL" not in sass  # fragments stay in registers


@needs_toolchain
@pytest.mark.parametrize("bm,threads,why", [(64, 256, "fragments must be (128,)"), (32, 128, "fragments must be (64,)")])
def test_attention_that_does_not_fit_keeps_the_generic_path(bm, threads, why):
    k = tilecore.compile(_attention(256, 64, bm, 64, threads, False), target=HOPPER, pass_configs=NOCACHE)
    assert "not mapped to registers" in _notes(k) and why in _notes(k)
    body = k.get_kernel_source().split("__global__")[-1]  # no register program (no producer warpgroup; the core's
    assert "tc_setmaxnreg" not in body and "tc_wgmma_pipeline" not in body  # planner may stage by TMA itself)
    # the core's units: wgmma where the block's 64-row tiles allow it, mma.sync for 32 rows
    assert ("tc_wg_fence();" if bm >= 64 else "tc_mma_16816_r(") in body


def run_attention(torch, seq, dim, bm, bn, threads, causal, heads=3, seed=11, fast=False):
    """((q, k, v), o) of the attention kernel as the route compiles it (random fp16 inputs; D86: the general path)."""
    rng = np.random.default_rng(seed)
    q, k, v = (torch.from_numpy(rng.standard_normal((heads, seq, dim)).astype(np.float32)).half().cuda()
               for _ in range(3))
    o = torch.full_like(q, float("nan"))
    kern = tilecore.compile(_attention(seq, dim, bm, bn, threads, causal, heads=heads), target="cuda",
                            pass_configs={**AUTO, "tilecore.fast_math": fast})
    kern(q, k, v, o)
    torch.cuda.synchronize()
    return (q, k, v), o


@hopper_gpu
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("seq,dim,bm,bn,threads,causal", [(256, 128, 128, 128, 256, False),
                                                          (200, 64, 64, 64, 128, True),
                                                          (1000, 128, 128, 64, 256, True),
                                                          (384, 64, 128, 128, 256, False)])
def test_device_attention_matches_float64(torch_cuda, seq, dim, bm, bn, threads, causal, fast):
    """The forms the WGMMA register program took (D86: the general path), ragged and causal, against float64."""
    from tilecore_conformance.composite import attention_ref

    inputs, o = run_attention(torch_cuda, seq, dim, bm, bn, threads, causal, seed=5, fast=fast)
    ref = attention_ref([x.cpu().numpy() for x in inputs], "float16", causal, seq=seq, dim=dim)[0]
    got = o.double().cpu().numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, atol=2e-2, rtol=2e-2)


def _gqa_inputs(rng, heads, kv_heads, seq, dim):
    from tilecore_conformance.composite import attention_ref

    q = rng.standard_normal((heads, seq, dim)).astype(np.float16)
    k, v = (rng.standard_normal((kv_heads, seq, dim)).astype(np.float16) for _ in range(2))
    group = heads // kv_heads
    # the reference: every query head against its group's K/V head
    ref = np.concatenate([attention_ref([q[h:h + 1], k[h // group:h // group + 1], v[h // group:h // group + 1]],
                                        "float16", True, seq=seq, dim=dim)[0] for h in range(heads)])
    return q, k, v, ref


def test_grouped_query_attention_on_the_reference():
    """kv_heads=2 of 6: query head h reads K/V head h // 3 (float64 reference per head), on the CPU."""
    from tilecore_conformance.composite import flash_attention_forward

    q, k, v, ref = _gqa_inputs(np.random.default_rng(3), 6, 2, 96, 32)
    kern = tilecore.compile(flash_attention_forward(96, 32, 6, 32, 32, "float16", True, kv_heads=2), target="cpu")
    o = np.full_like(q, np.nan)
    kern(q, k, v, o)
    np.testing.assert_allclose(o.astype(np.float64), ref, atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="kv_heads=4 must divide heads=6"):
        flash_attention_forward(96, 32, 6, 32, 32, "float16", True, kv_heads=4)


@needs_toolchain
def test_grouped_query_attention_is_the_general_paths():
    from tilecore_conformance.composite import flash_attention_forward

    k = tilecore.compile(flash_attention_forward(4096, 128, 32, 128, 128, "float16", False, batch=8, threads=256,
                                                 kv_heads=8), target=HOPPER, pass_configs={**NOCACHE, **AUTO})
    assert "retired (D86)" in _notes(k) and tilecore_cuda.lowering_path(k) == "generic"


@hopper_gpu
@pytest.mark.parametrize("heads,kv_heads,bm,threads", [(8, 2, 128, 256), (6, 1, 64, 128)])
def test_device_grouped_query_attention_matches_float64(torch_cuda, heads, kv_heads, bm, threads):
    from tilecore_conformance.composite import flash_attention_forward

    torch = torch_cuda
    seq, dim = 320, 128 if bm == 128 else 64
    q, k, v, ref = _gqa_inputs(np.random.default_rng(8), heads, kv_heads, seq, dim)
    kern = tilecore.compile(flash_attention_forward(seq, dim, heads, bm, 64, "float16", True, threads=threads,
                                                    kv_heads=kv_heads), target="cuda", pass_configs=AUTO)
    o = torch.full((heads, seq, dim), float("nan"), device="cuda", dtype=torch.float16)
    kern(*(torch.from_numpy(x).cuda() for x in (q, k, v)), o)
    torch.cuda.synchronize()
    np.testing.assert_allclose(o.double().cpu().numpy(), ref, atol=2e-2, rtol=2e-2)


# -- dynamic shapes ----------------------------------------------------------------------------------------

def dynamic_m_gemm(N=512, K=512, bm=128, bn=256, bk=64):
    M = T.dynamic("m")

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=256) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])
    return main


@needs_toolchain
def test_dynamic_m_gemm_builds_its_tensor_maps_at_launch():
    k = tilecore.compile(dynamic_m_gemm(), target=HOPPER, pass_configs=NOCACHE)
    assert "epilogue to global" in _notes(k)
    maps = k.source.meta["tensor_maps"]
    assert maps[0]["dims"] == ["512", "ints[0]"] and maps[0]["box"] == [64, 128]  # A: (K, m), innermost first
    k80 = tilecore.compile(dynamic_m_gemm(), target="cuda:sm_80",
                           pass_configs={**NOCACHE, "tilecore.cuda.register_programs": True})  # pinned (D63)
    assert "cuda.register_program: mma.sync" in _notes(k80)


@hopper_gpu
@pytest.mark.parametrize("wgmma", [True, False])
def test_device_dynamic_m_gemm_one_kernel_many_sizes(torch_cuda, wgmma):
    k = tilecore.compile(dynamic_m_gemm(), target="cuda", pass_configs={"tilecore.cuda.disable_wgmma": not wgmma})
    for m in (1, 130, 515):
        a = torch_cuda.randn(m, 512, device="cuda").half()
        b = torch_cuda.randn(512, 512, device="cuda").half()
        c = torch_cuda.full((m, 512), float("nan"), device="cuda").half()
        k(a, b, c)
        ref = a.double() @ b.double()
        assert torch_cuda.allclose(c.double(), ref, atol=0.5, rtol=2e-2), (m, (c.double() - ref).abs().max())
