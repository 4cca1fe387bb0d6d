"""Shared tiles of 64-byte rows in the register programs (docs/decisions.md D47): a GEMM with ``block_K = 32`` of
16-bit elements (A's tile (bM, 32), or B's as (bN, 32) with ``transpose_B``) reaches registers on sm_90a (TMA
copies and WGMMA descriptors in their 64-byte swizzle mode) and on sm_80 (cp.async into, and ldmatrix from, the
same 64-byte layout) instead of the general path; before, both register programs refused such tiles ("shared
tiles must be whole 128-byte rows").

Compile-only wherever a CUDA compiler exists: the notes, the descriptors' mode and the tensor maps' swizzle in the
source, the SASS (HGMMA + UTMALDG; HMMA + LDSM + LDGSTS). The sm_80 program run on the host emulator against
float64 (ragged shapes, both B layouts, bf16); a mutation (the copy writing the 128-byte pattern into a 64-byte
tile) must fail it. On an sm_90 GPU the sm_90a program against float64.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore

tilecore_cuda = pytest.importorskip("tilecore_cuda")
sys.path.insert(0, str(Path(__file__).parent))
from cuda_host_emulator import run_on_host  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402

#: sm_80's GEMM form runs on the general path by default since D63: these tests pin the register program
PINNED = {**NOCACHE, "tilecore.cuda.register_programs": True}
from test_cuda_hopper import _notes, gemm, hopper_gpu  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
#: the sm_80 register program on the H100 (the Hopper passes off), as tests/test_cuda_hopper.py runs it
MMA = {"tilecore.cuda.disable_wgmma": True}
REFUSAL = "shared tiles must be whole 128-byte rows"


def _bk32(M=1024, N=1024, K=1024, bm=128, bn=128, threads=256, stages=3, dtype="float16", out="float16", tb=False):
    return gemm(M, N, K, bm=bm, bn=bn, bk=32, threads=threads, stages=stages, dtype=dtype, out=out, tb=tb)


def _sass(k) -> str:
    return tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)


# -- compile-only ----------------------------------------------------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("tb", [False, True])
def test_sm90a_block_k_32_runs_on_the_general_path(tb):
    """D86: the GEMM at block_N 256 on 64-byte tiles, which the WGMMA register program took (D47), runs on the core's
    general path (the program retired), its note saying so; on WGMMA all the same, without spills."""
    k = tilecore.compile(_bk32(bn=256, tb=tb), target="cuda:sm_90a", pass_configs=NOCACHE)
    assert "retired (D86)" in _notes(k) and tilecore_cuda.lowering_path(k) == "generic"
    sass = _sass(k)
    assert "HGMMA.64x" in sass and "STL" not in sass
    # narrower gemms keep the general path on sm_90a (no faster there on the H100, D47), and say so
    k = tilecore.compile(_bk32(bn=128, tb=tb), target="cuda:sm_90a", pass_configs=NOCACHE)
    assert "64-byte tiles take WGMMA here only for gemms 256 wide" in _notes(k)


@needs_toolchain
@pytest.mark.parametrize("tb", [False, True])
def test_sm80_block_k_32_reaches_mma_sync_registers(tb):
    k = tilecore.compile(_bk32(tb=tb), target="cuda:sm_80", pass_configs=PINNED)
    notes = _notes(k)
    assert "cuda.register_program: mma.sync + cp.async, 8 warps of 16 rows" in notes and REFUSAL not in notes
    src = k.get_kernel_source()
    assert "* 64u + (unsigned)(((tc_k % 4) ^ (tc_r / 2 % 4)) * 16)" in src  # the copy's 64-byte layout
    sass = _sass(k)
    for op in ("HMMA.16816.F32", "LDSM.16.M88.4", "LDGSTS.E.BYPASS.128"):
        assert op in sass, op


def test_other_row_widths_are_still_refused():
    """96-byte rows (block_K = 48) are neither layout; a 64-byte tile of 24 rows (B as (N, K) at block_N = 24) would
    leave the tiles after it off the 1 KiB boundary the 128-byte swizzle needs: both refused, said so, and the
    kernels keep the general path."""
    why = "shared tiles must be whole 128-byte rows (or one 64-byte column of them in 16-row groups)"
    k = tilecore.compile(gemm(256, 256, 96, bm=128, bn=128, bk=48, threads=256, stages=2), target="cuda:sm_80",
                         pass_configs=PINNED)
    assert f"A_s: {why}" in _notes(k)
    k = tilecore.compile(gemm(256, 240, 256, bm=128, bn=24, bk=32, threads=256, stages=2, tb=True),
                         target="cuda:sm_90a", pass_configs=NOCACHE)
    assert f"B_s: {why}" in _notes(k)


# -- run on the host --------------------------------------------------------------------------------------

def _operands(rng, M, N, K, dtype, tb):
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    if dtype == "float16":
        a, b = a.astype(np.float16), b.astype(np.float16)
        return a, b, a.astype(np.float64), b.astype(np.float64)
    ab, bb = (((x.view(np.uint32).astype(np.uint64) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16)
              .astype(np.uint16) for x in (a, b))
    return ab, bb, *((x.astype(np.uint32) << 16).view(np.float32).astype(np.float64) for x in (ab, bb))


def _emulate(k, M, N, K, dtype, tb, seed):
    a, b, a64, b64 = _operands(np.random.default_rng(seed), M, N, K, dtype, tb)
    c = run_on_host(k, [a, b, np.full((M, N), np.nan, np.float32)])[2].astype(np.float64)
    ref = a64 @ (b64.T if tb else b64)
    bound = 1e-5 * (np.abs(a64) @ np.abs(b64.T if tb else b64)) + 1e-5
    return np.abs(c - ref) <= bound


@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("M,N,K,dtype,tb", [(64, 64, 96, "float16", False), (100, 72, 88, "float16", True),
                                            (64, 128, 64, "bfloat16", False)])
def test_emulated_sm80_program_with_64_byte_tiles(M, N, K, dtype, tb):
    k = tilecore.compile(_bk32(M, N, K, bm=64, bn=64 if N <= 72 else 128, threads=128, stages=2, dtype=dtype,
                               out="float32", tb=tb), target="cuda:sm_80", pass_configs=PINNED)
    assert "cuda.register_program: mma.sync" in _notes(k)
    ok = _emulate(k, M, N, K, dtype, tb, M + N + K)
    assert ok.all(), f"{(~ok).sum()} wrong elements"


@needs_toolchain
@needs_gxx
def test_mutation_copy_in_the_128_byte_pattern_is_caught(monkeypatch):
    """The cp.async copy addressing a 64-byte tile as if its rows were 128 bytes wide (its chunks xor row % 8, as
    in the 128-byte mode) while ldmatrix reads the 64-byte layout: the result check fails. Unmutated it passes
    above."""
    from tilecore_cuda import regprog

    real = regprog._Emit.swizzled

    def mutant(base, info, row, chunk):
        if row == "tc_r" and info["swz"] == 64:  # the copy's address only
            return (f"{base} + (unsigned){row} * 64u + (unsigned)((({chunk} % 4) ^ ({row} % 8)) * 16) % 64u")
        return real(base, info, row, chunk)

    monkeypatch.setattr(regprog._Emit, "swizzled", staticmethod(mutant))
    k = tilecore.compile(_bk32(64, 64, 96, bm=64, bn=64, threads=128, stages=2, out="float32"),
                         target="cuda:sm_80", pass_configs=PINNED)
    assert not _emulate(k, 64, 64, 96, "float16", False, 1).all()


# -- on an H100 / H200 ------------------------------------------------------------------------------------

@hopper_gpu
@pytest.mark.parametrize("dtype,out,tb", [("float16", "float16", False), ("bfloat16", "float32", True)])
@pytest.mark.parametrize("M,N,K,bm,bn,threads,stages,mma", [
    (1024, 1024, 1024, 128, 256, 256, 3, False),   # two warpgroups' form (D86: the general path), 64-byte tiles
    (1000, 520, 264, 64, 256, 128, 3, False),      # ragged in every dimension, one consumer warpgroup
    (1000, 520, 264, 64, 64, 128, 3, True),        # the sm_80 program (mma.sync) on the same GPU
])
def test_device_64_byte_tiles_match_float64(dtype, out, tb, M, N, K, bm, bn, threads, stages, mma):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(21)
    tdt = getattr(torch, dtype)
    a = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).cuda().to(tdt)
    b = torch.from_numpy(rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)).cuda().to(tdt)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=getattr(torch, out))
    fn = _bk32(M, N, K, bm=bm, bn=bn, threads=threads, stages=stages, dtype=dtype, out=out, tb=tb)
    k = tilecore.compile(fn, target="cuda", pass_configs=MMA if mma else {})
    notes = _notes(k)
    assert ("cuda.register_program: mma.sync" if mma else "retired (D86)") in notes, notes
    assert REFUSAL not in notes
    k(a, b, c)
    torch.cuda.synchronize()
    a64, b64 = a.double().cpu().numpy(), b.double().cpu().numpy()
    ref = a64 @ (b64.T if tb else b64)
    got = c.double().cpu().numpy()
    tol = {"float32": 1e-3, "float16": 2e-2}[out] * np.sqrt(K)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, atol=tol, rtol=2e-2)
