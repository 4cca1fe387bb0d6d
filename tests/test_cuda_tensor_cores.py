"""Tensor-core gemm and cp.async copies (``cuda.copy_async``) in the CUDA backend, through the public API.

Two gemm paths, each tested: ``unit`` (the default: the core's layout pass puts C in registers on the
registered mma.sync m16n8k16 unit, operands by ldmatrix: tilecore.passes.matrix) and ``plugin``
(``tilecore.matrix_unit_gemm=False``: the plugin's ``cuda.gemm_mma_*``, ldmatrix + mma.sync with C in
shared memory, which also runs the gemms no unit fits).

Three levels: compile-only checks (generated source and SASS: HMMA, LDSM, LDGSTS) wherever a CUDA
compiler exists; the same kernels run on the host through ``cuda_host_emulator`` (the generated source,
with the prelude's inline PTX replaced by emulations of ldmatrix / mma.sync / cp.async written from the
PTX ISA) wherever g++ exists, compared with float64 numpy; and on a GPU, the kernels themselves.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
from cuda_host_emulator import run_on_host  # noqa: E402
from test_cuda_backend import HAS_DEVICE, NOCACHE, matmul_relu, needs_toolchain  # noqa: E402

ARCHS = ["cuda:sm_80", "cuda:sm_90a"]
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
gpu = pytest.mark.skipif(not HAS_DEVICE, reason="no CUDA device")


def gemm_kernel(M, N, K, bm, bn, bk, ta=False, tb=False, dtype="float16", threads=128, stages=2, clear=False):
    """C (float32) = op(A) @ op(B) with A, B staged through shared memory, any transpose."""
    a_shape, b_shape = ((K, M) if ta else (M, K)), ((N, K) if tb else (K, N))
    as_shape, bs_shape = ((bk, bm) if ta else (bm, bk)), ((bn, bk) if tb else (bk, bn))

    @T.prim_func
    def gemm(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared(as_shape, dtype)
            B_s = T.alloc_shared(bs_shape, dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            if clear:
                for i, j in T.Parallel(bm, bn):
                    C_l[i, j] = 1000.0  # garbage that clear_accum must ignore
            else:
                T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                if ta:
                    T.copy(A[ko * bk, by * bm], A_s)
                else:
                    T.copy(A[by * bm, ko * bk], A_s)
                if tb:
                    T.copy(B[bx * bn, ko * bk], B_s)
                else:
                    T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l, transpose_A=ta, transpose_B=tb, clear_accum=clear and K <= bk)
            T.copy(C_l, C[by * bm, bx * bn])

    return gemm


def staged_gemm_kernel(M, N, K, bm, bn, bk, stages=2):
    """Operands in slices of multi-stage shared buffers (regions at an offset inside a 3-D buffer)."""

    @T.prim_func
    def gemm(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((stages, bm, bk), "float16")
            B_s = T.alloc_shared((stages, bk, bn), "float16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.serial(T.ceildiv(K, bk)):
                T.copy(A[by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s[ko % stages, :, :])
                T.copy(B[ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s[ko % stages, :, :])
                T.gemm(A_s[ko % stages, :, :], B_s[ko % stages, :, :], C_l)
            T.copy(C_l, C[by * bm, bx * bn])

    return gemm


#: "unit": the core's mma.sync unit (on sm_90a the core would take wgmma: tests/test_cuda_wgmma_unit.py); both
#: with the register programs off, which take block_K = 32 tiles too since D47 (tests/test_cuda_swizzle64.py)
GENERAL = {"tilecore.cuda.register_programs": False}
PATHS = {"unit": {"tilecore.matrix_unit_families": ["mma_sync"], **GENERAL},
         "plugin": {"tilecore.matrix_unit_gemm": False, **GENERAL}}


def _compile(fn, target="cuda:sm_80", path="unit", cache=False):
    return tilecore.compile(fn, target=target, pass_configs={**(NOCACHE if not cache else {}), **PATHS[path]})


def _assert_path(k, path, dtype="float16", acc="C_l"):
    """The gemm took ``path``: on the unit, C in its layout and mma.sync through MatrixOps with ldmatrix
    operands; on the plugin's GEMM, its intrinsic."""
    if path == "unit":
        assert k.meta["attrs"]["fragment_layouts"][acc].startswith("mma_sync_m16n8k16.C"), k.meta["attrs"]
        body = k.get_kernel_source().split('extern "C"')[1]
        assert "tc_mma_16816_r(" in body and "tc_ldsm_regs<" in body and "tc_gemm_mma<" not in body
    else:
        assert f"gemm:cuda.gemm_mma_{'f16' if dtype == 'float16' else 'bf16'}" in k.meta["attrs"]["intrinsics"]


def _bits_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even) as uint16."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def _bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _operands(rng, shape_a, shape_b, dtype):
    a = rng.standard_normal(shape_a).astype(np.float32)
    b = rng.standard_normal(shape_b).astype(np.float32)
    if dtype == "float16":
        a, b = a.astype(np.float16), b.astype(np.float16)
        return a, b, a.astype(np.float64), b.astype(np.float64)
    ab, bb = _bits_bf16(a), _bits_bf16(b)
    return ab, bb, _bf16_value(ab), _bf16_value(bb)


def _check(c, a64, b64, ta, tb):
    am = a64.T if ta else a64
    bm = b64.T if tb else b64
    ref = am @ bm
    bound = 1e-5 * (np.abs(am) @ np.abs(bm)) + 1e-5  # float32 accumulation, any order
    err = np.abs(c.astype(np.float64) - ref)
    assert (err <= bound).all(), f"max error {err.max()} at {np.unravel_index(err.argmax(), err.shape)}"


# -- compile-only: source and SASS -----------------------------------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("target", ARCHS)
def test_readme_gemm_takes_tensor_cores_and_cp_async(target, path):
    k = tilecore.compile(matmul_relu(1000, 512, 256, 64, 64, 32), target=target, out_idx=[-1],
                         pass_configs={**NOCACHE, **PATHS[path]})
    _assert_path(k, path, acc="C_local")
    # the T.Pipelined loop's copies: 3 stages of 16-byte cp.async (tilecore.plan_pipelines)
    assert k.meta["attrs"]["pipelines"][0].startswith("loop ko: 3 stages")
    src = k.get_kernel_source()
    body = src.split('extern "C"')[1]
    assert "tc_cp_async16(" in body and "tc_cp_async_wait<1>();" in body
    if path == "plugin":
        assert "tc_gemm_mma<128, 64, 64, 32," in body
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src and "cp.async.cg.shared.global" in src
    # a loop of one stage is not pipelined: its two copies are one asynchronous group each iteration
    # (tilecore.group_async_copies: both issued, one commit, one wait, D42)
    k = _compile(gemm_kernel(128, 128, 64, 64, 64, 32, stages=1), target)
    assert "pipelines" not in k.meta["attrs"] and len(k.meta["attrs"]["copy_groups"]) == 1
    body = k.get_kernel_source().split('extern "C"')[1]
    assert "tc_copy_g2s_async<" not in body and body.count("tc_cp_async_wait<0>();") == 1


def _sass(kernel, target) -> str:
    try:
        return tilecore_cuda.CUDABackend().disassemble(kernel.binary, None)
    except SystemExit as e:  # no cuobjdump here
        pytest.skip(str(e))


@needs_toolchain
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("target", ARCHS)
def test_readme_gemm_sass_has_hmma_ldsm_ldgsts(target, path):
    k = tilecore.compile(matmul_relu(1000, 512, 256, 64, 64, 32), target=target, out_idx=[-1],
                         pass_configs={**NOCACHE, **PATHS[path]})
    sass = _sass(k, target)
    # B (K x N) by transposing ldmatrix: four 8x8 matrices at a time in the plugin's GEMM and on the unit where the
    # target has no wgmma (two atoms a load: D68's pairs), two (one atom) on sm_90a's unit
    b_load = "LDSM.16.MT88.4" if path == "plugin" or target != "cuda:sm_90a" else "LDSM.16.MT88.2"
    for op in ("HMMA.16816.F32", "LDSM.16.M88.4", b_load, "LDGSTS.E.BYPASS.128", "LDGDEPBAR"):
        assert op in sass, op
    if path == "unit":  # the operand and accumulator arrays stay in registers
        assert "LDL" not in sass and "STL" not in sass


@needs_toolchain
@pytest.mark.parametrize("path", PATHS)
def test_bf16_and_transposes_compile_to_hmma(path):
    for ta in (False, True):
        for tb in (False, True):
            k = _compile(gemm_kernel(128, 128, 64, 64, 64, 32, ta, tb, "bfloat16"), path=path)
            _assert_path(k, path, "bfloat16")
            sass = _sass(k, "cuda:sm_80")
            assert "HMMA.16816.F32.BF16" in sass
            # every transpose takes ldmatrix: A stored K x M by .trans (x4), B stored K x N by .trans and N x K
            # without (x4 on the unit too: two atoms a load, D68's pairs)
            assert ("LDSM.16.MT88.4" in sass) == (ta or not tb) or path == "plugin"
            assert "LDSM.16.MT88.2" not in sass and "LDSM.16.M88.2" not in sass
            assert "LDSM.16.M88" in sass if (not ta or tb) else True


@needs_toolchain
def test_fallbacks_to_simt():
    # tile shapes that are not whole mma tiles, float32 operands, fewer threads than a warp
    for fn in (gemm_kernel(40, 40, 24, 24, 24, 8), gemm_kernel(64, 64, 32, 32, 32, 16, dtype="float32"),
               gemm_kernel(64, 64, 32, 32, 32, 16, threads=16)):
        k = _compile(fn)
        # no tensor cores: the accumulator is in registers (the core's layout pass computes each thread's
        # elements from the shared tiles) or, where it is not, the CUDA SIMT gemm runs on shared memory
        layouts = k.meta["attrs"].get("fragment_layouts", {})
        in_regs = [b for b, lay in layouts.items() if not str(lay).startswith("shared")]
        assert in_regs or "gemm:cuda.gemm_simt" in k.meta["attrs"]["intrinsics"], layouts
        assert "tc_gemm_mma" not in k.get_kernel_source().split('extern "C"')[1]


@needs_toolchain
def test_ir_shows_the_collective_between_barriers():
    k = _compile(gemm_kernel(64, 64, 32, 32, 32, 16), path="plugin")
    text = k.get_kernel_source()
    body = text.split('extern "C"')[1]
    lines = [ln.strip() for ln in body.splitlines()]
    at = [n for n, ln in enumerate(lines) if ln.startswith("tc_gemm_mma<")]
    assert at and all(lines[n - 1] == "__syncthreads();" and lines[n + 1] == "__syncthreads();" for n in at)


# -- host emulation of the generated kernels ---------------------------------------------------------------

@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("path", PATHS)
def test_emulated_gemm_all_transposes(dtype, ta, tb, path):
    M, N, K = 100, 72, 56  # ragged in every dimension for 64 x 32 x 16 blocks
    k = _compile(gemm_kernel(M, N, K, 64, 32, 16, ta, tb, dtype), path=path)
    _assert_path(k, path, dtype)
    rng = np.random.default_rng([len(dtype), int(ta), int(tb)])
    a, b, a64, b64 = _operands(rng, (K, M) if ta else (M, K), (N, K) if tb else (K, N), dtype)
    c = np.full((M, N), np.nan, np.float32)
    out = run_on_host(k, [a, b, c])
    _check(out[2], a64, b64, ta, tb)


@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("case", ["readme", "threads256", "clear_accum", "unaligned_rows", "staged", "wide"])
@pytest.mark.parametrize("path", PATHS)
def test_emulated_gemm_variants(case, path):
    rng = np.random.default_rng(7)
    ta = tb = False
    if case == "readme":  # fp16 output with relu
        M, N, K = 130, 96, 72
        k = _compile(matmul_relu(M, N, K, 64, 32, 32), path=path)
        _assert_path(k, path, acc="C_local")
        a, b, a64, b64 = _operands(rng, (M, K), (K, N), "float16")
        out = run_on_host(k, [a, b, np.zeros((M, N), np.float16)])[2].astype(np.float64)
        ref = np.maximum(a64 @ b64, 0)
        assert (np.abs(out - ref) <= 1e-3 * np.abs(ref) + 1e-2).all()
        return
    if case == "threads256":
        M, N, K, fn = 128, 64, 48, gemm_kernel(128, 64, 48, 64, 64, 16, threads=256)
    elif case == "clear_accum":
        M, N, K, fn = 64, 64, 32, gemm_kernel(64, 64, 32, 64, 64, 32, clear=True)
    elif case == "unaligned_rows":  # K odd: rows of A are not 16-byte aligned -> element copies
        M, N, K, fn = 48, 40, 37, gemm_kernel(48, 40, 37, 32, 32, 16)
    elif case == "staged":
        M, N, K, fn = 96, 64, 80, staged_gemm_kernel(96, 64, 80, 32, 32, 16)
    else:  # one warp holding a 16 x 64 strip, x2 ldmatrix for an odd count of n tiles
        M, N, K, fn = 16, 120, 32, gemm_kernel(16, 120, 32, 16, 120, 32, threads=32)
    k = _compile(fn, path=path)
    _assert_path(k, path)
    a, b, a64, b64 = _operands(rng, (M, K), (K, N), "float16")
    out = run_on_host(k, [a, b, np.full((M, N), np.nan, np.float32)])
    _check(out[2], a64, b64, ta, tb)


@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_emulated_flash_attention(causal, path):
    """Both gemms of the conformance suite's FlashAttention (Q K^T with transpose_B; P V with P a
    float16 fragment) through the tensor-core path, with the online softmax between them."""
    composite = pytest.importorskip("tilecore_conformance.composite")
    k = _compile(composite.attention("float16", causal), path=path)
    if path == "plugin":
        assert "gemm:cuda.gemm_mma_f16" in k.meta["attrs"]["intrinsics"]
    else:  # S = Q K^T and O on the unit, in registers
        lays = k.meta["attrs"]["fragment_layouts"]
        assert sum(str(v).startswith("mma_sync_m16n8k16.C") for v in lays.values()) >= 1, lays
    rng = np.random.default_rng(5)
    shape = (composite.HEADS, composite.SEQ, composite.DIM)
    q, kk, v = (rng.standard_normal(shape).astype(np.float16) for _ in range(3))
    out = run_on_host(k, [q, kk, v, np.zeros(shape, np.float16)])[3].astype(np.float64)
    ref = composite.attention_ref([q, kk, v], "float16", causal)[0]
    assert np.abs(out - ref).max() <= 2e-3


# -- on a GPU ------------------------------------------------------------------------------------------

def _torch_operands(torch, rng, shape_a, shape_b, dtype):
    a = torch.from_numpy(rng.standard_normal(shape_a).astype(np.float32)).to(getattr(torch, dtype)).cuda()
    b = torch.from_numpy(rng.standard_normal(shape_b).astype(np.float32)).to(getattr(torch, dtype)).cuda()
    return a, b, a.double().cpu().numpy(), b.double().cpu().numpy()


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("M,N,K,blocks", [(256, 256, 128, (128, 128, 32)), (1000, 520, 264, (64, 64, 32)),
                                          (100, 72, 56, (64, 32, 16)), (33, 17, 40, (32, 32, 32))])
@pytest.mark.parametrize("path", PATHS)
def test_device_gemm_matches_float64(dtype, ta, tb, M, N, K, blocks, path):
    import torch

    rng = np.random.default_rng(11)
    k = _compile(gemm_kernel(M, N, K, *blocks, ta, tb, dtype), target="cuda", path=path, cache=True)
    if path == "plugin":
        _assert_path(k, path, dtype)
    a, b, a64, b64 = _torch_operands(torch, rng, (K, M) if ta else (M, K), (N, K) if tb else (K, N), dtype)
    c = torch.full((M, N), float("nan"), dtype=torch.float32, device="cuda")
    k(a, b, c)
    _check(c.cpu().numpy(), a64, b64, ta, tb)


@gpu
@pytest.mark.parametrize("case", ["threads256", "clear_accum", "unaligned_rows", "staged", "wide"])
@pytest.mark.parametrize("path", PATHS)
def test_device_gemm_variants(case, path):
    import torch

    rng = np.random.default_rng(12)
    fns = {"threads256": (128, 64, 48, gemm_kernel(128, 64, 48, 64, 64, 16, threads=256)),
           "clear_accum": (64, 64, 32, gemm_kernel(64, 64, 32, 64, 64, 32, clear=True)),
           "unaligned_rows": (48, 40, 37, gemm_kernel(48, 40, 37, 32, 32, 16)),
           "staged": (96, 64, 80, staged_gemm_kernel(96, 64, 80, 32, 32, 16)),
           "wide": (16, 120, 32, gemm_kernel(16, 120, 32, 16, 120, 32, threads=32))}
    M, N, K, fn = fns[case]
    k = _compile(fn, target="cuda", path=path, cache=True)
    a, b, a64, b64 = _torch_operands(torch, rng, (M, K), (K, N), "float16")
    c = torch.full((M, N), float("nan"), dtype=torch.float32, device="cuda")
    k(a, b, c)
    _check(c.cpu().numpy(), a64, b64, False, False)



@needs_toolchain
def test_operand_tiles_are_swizzled_unless_a_collective_reads_them():
    """The tiles the unit's operands are loaded from are stored XOR-swizzled (every access maps through the
    layout: the host-emulated gemms above check the numbers); a tile filled by element stores stays row-major;
    the pass config turns it off."""
    k = _compile(gemm_kernel(128, 128, 64, 64, 64, 32))
    assert k.meta["attrs"]["shared_layouts"] == {"A_s": "64x32 tile, 64-byte XOR swizzle of 16-byte units",
                                                 "B_s": "32x64 tile, 128-byte XOR swizzle of 16-byte units"}
    assert " ^ " in k.get_kernel_source().split('extern "C"')[1]
    # K = 37: A's rows are not whole 16-byte runs, so its tile is filled by element stores and stays row-major
    ragged = _compile(gemm_kernel(48, 40, 37, 32, 32, 16))
    assert set(ragged.meta["attrs"]["shared_layouts"]) == {"B_s"}
    # a loop of one stage: its two copies are one asynchronous group of per-thread copies (D42), which address
    # the tiles through their layout, so the tiles are swizzled as the planner's are
    one_stage = _compile(gemm_kernel(128, 128, 64, 64, 64, 32, stages=1))
    assert "copy:cuda.copy_async" not in one_stage.meta["attrs"]["intrinsics"]
    assert set(one_stage.meta["attrs"]["shared_layouts"]) == {"A_s", "B_s"}
    off = tilecore.compile(gemm_kernel(128, 128, 64, 64, 64, 32), target="cuda:sm_80",
                           pass_configs={**NOCACHE, "tilecore.swizzle_operand_tiles": False})
    assert "shared_layouts" not in off.meta["attrs"]
    assert "LDSM.16.M88.4" in _sass(off, "cuda:sm_80") and "LDSM.16.M88.4" in _sass(k, "cuda:sm_80")


@needs_toolchain
@needs_gxx
def test_emulated_gemm_one_stage_and_unswizzled():
    rng = np.random.default_rng(9)
    M, N, K = 96, 64, 96
    a, b, a64, b64 = _operands(rng, (M, K), (K, N), "float16")
    for cfg in ({"tilecore.swizzle_operand_tiles": False}, {}):
        k = tilecore.compile(gemm_kernel(M, N, K, 64, 64, 32, stages=1 if not cfg else 2), target="cuda:sm_80",
                             pass_configs={**NOCACHE, **cfg})
        out = run_on_host(k, [a, b, np.full((M, N), np.nan, np.float32)])
        _check(out[2], a64, b64, False, False)


@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("causal", [False, True])
def test_emulated_tilelang_flash_attention_keeps_p_in_registers(causal, monkeypatch):
    """TileLang's FlashAttention example (T.GemmWarpPolicy.FullRow): S = Q K^T accumulates on the mma.sync
    unit, P = S cast to float16 stays in the registers that held S (per-thread moves into the unit's A
    order: no shared-memory round trip), and O += P V takes A from those registers. On the host emulator,
    against float64."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tilelang_corpus import attention_mha_fwd_bhsd as example

    monkeypatch.setenv("TILECORE_TARGET", "cuda:sm_80")
    k = example.flashattn(1, 2, 64, 96, 32, causal, block_M=64, block_N=32, num_stages=1, threads=128)
    lays = k.meta["attrs"]["fragment_layouts"]
    assert lays["acc_s"].startswith("mma_sync_m16n8k16.C x 4x1")
    assert lays["acc_s_cast"].startswith("mma_sync_m16n8k16.A x 4 groups"), lays["acc_s_cast"]
    assert lays["acc_o"].startswith("mma_sync_m16n8k16.C x 4x1")
    # the row statistics too: each the projection of S's layout (the reduction's result), not the blocked
    # layout their initialising T.fill would have given them first
    assert not [n for n, lay in lays.items() if lay.startswith("shared")], lays
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 64, 32)).astype(np.float16)
    kk, v = (rng.standard_normal((1, 2, 96, 32)).astype(np.float16) for _ in range(2))
    out = run_on_host(k, [q, kk, v, np.zeros((1, 2, 64, 32), np.float16)])[3].astype(np.float64)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), kk.astype(np.float64)) / np.sqrt(32)
    if causal:  # the example aligns the queries with the last keys (past_len = seq_kv - seq_q)
        s = np.where(np.arange(64)[:, None] + 32 >= np.arange(96)[None, :], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v.astype(np.float64))
    assert np.abs(out - ref).max() <= 2e-2
