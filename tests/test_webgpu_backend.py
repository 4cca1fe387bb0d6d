"""The WebGPU backend (tilecore-webgpu) through the public API, on a real adapter.

CI has no GPU: scripts/setup.sh installs Debian's mesa-vulkan-drivers, so the adapter is lavapipe
(llvmpipe, a Vulkan driver on the CPU) and these tests run kernels for real (``device`` mode).
Outputs are pre-filled with NaN so an unwritten element fails; references are computed in float64.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tilecore_webgpu
import torch
from tilecore_conformance.composite import attention_ref, flash_attention_forward
from tilecore_webgpu.runtime import TRANSFERS, adapters, has_subgroups

import tilecore
import tilecore.language as T
from kernels_for_tests import matmul_relu
from tilecore.errors import UnsupportedFeatureError

TARGET = "webgpu"


def f64(x) -> np.ndarray:
    return x.double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)


def nan_like(shape, dtype=np.float32) -> np.ndarray:
    return np.full(shape, np.nan, dtype)


def check(got, ref, rtol, atol):
    got = f64(got)
    assert not np.isnan(got).any(), f"{int(np.isnan(got).sum())} element(s) not written"
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


# -- the README GEMM ----------------------------------------------------------------------------

def test_readme_gemm_float16_torch_tensors():
    kernel = tilecore.compile(matmul_relu(200, 96, 80, 64, 64, 32), target=TARGET, out_idx=[-1])
    assert kernel.mode == "device"
    src = kernel.get_kernel_source()
    for piece in ("enable f16;", "var<workgroup> A_shared: array<f16", "workgroupBarrier()", "@compute"):
        assert piece in src, piece
    g = torch.Generator().manual_seed(0)
    a = torch.randn(200, 80, generator=g).half()
    b = torch.randn(80, 96, generator=g).half()
    c = kernel(a, b)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.float16 and c.shape == (200, 96)
    ref = np.maximum(f64(a) @ f64(b), 0)
    check(c, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())  # one float16 rounding of the result


def test_gemm_float32_numpy_with_poisoned_output():
    kernel = tilecore.compile(_gemm_f32(), target=TARGET)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal((48, 64)).astype(np.float32)
    c = nan_like((64, 64))
    kernel(a, b, c)
    ref = np.maximum(f64(a) @ f64(b), 0)
    check(c, ref, rtol=1e-5, atol=1e-5 * 48 * np.abs(ref).max())


def _gemm_f32():
    @T.prim_func
    def gemm32(A: T.Tensor((64, 48), "float32"), B: T.Tensor((48, 64), "float32"), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(2, 2, threads=64) as (bx, by):
            A_s = T.alloc_shared((32, 16), "float32")
            B_s = T.alloc_shared((16, 32), "float32")
            C_l = T.alloc_fragment((32, 32), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(3, num_stages=2):
                T.copy(A[by * 32, ko * 16], A_s)
                T.copy(B[ko * 16, bx * 32], B_s)
                T.gemm(A_s, B_s, C_l)
            for i, j in T.Parallel(32, 32):
                C_l[i, j] = T.max(C_l[i, j], 0)
            T.copy(C_l, C[by * 32, bx * 32])
    return gemm32


# -- softmax and norms --------------------------------------------------------------------------

ROWS, COLS, BR = 48, 96, 16


def _softmax(dtype):
    @T.prim_func
    def softmax(X: T.Tensor((ROWS, COLS), dtype), Y: T.Tensor((ROWS, COLS), dtype)):
        with T.Kernel(ROWS // BR, threads=128) as bx:
            x = T.alloc_fragment((BR, COLS), "float32")
            m = T.alloc_fragment((BR,), "float32")
            s = T.alloc_fragment((BR,), "float32")
            T.copy(X[bx * BR, 0], x)
            T.reduce_max(x, m, dim=1)
            for i, j in T.Parallel(BR, COLS):
                x[i, j] = T.exp(x[i, j] - m[i])
            T.reduce_sum(x, s, dim=1)
            for i, j in T.Parallel(BR, COLS):
                x[i, j] = x[i, j] / s[i]
            T.copy(x, Y[bx * BR, 0])
    return softmax


def _rmsnorm(dtype):
    @T.prim_func
    def rmsnorm(X: T.Tensor((ROWS, COLS), dtype), W: T.Tensor((COLS,), dtype), Y: T.Tensor((ROWS, COLS), dtype)):
        with T.Kernel(ROWS // BR, threads=64) as bx:
            x = T.alloc_fragment((BR, COLS), "float32")
            sq = T.alloc_fragment((BR, COLS), "float32")
            s = T.alloc_fragment((BR,), "float32")
            T.copy(X[bx * BR, 0], x)
            for i, j in T.Parallel(BR, COLS):
                sq[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(sq, s, dim=1)
            for i in T.Parallel(BR):
                s[i] = T.rsqrt(s[i] / COLS + 1e-6)
            for i, j in T.Parallel(BR, COLS):
                x[i, j] = x[i, j] * s[i] * W[j]
            T.copy(x, Y[bx * BR, 0])
    return rmsnorm


def _layernorm(dtype):
    @T.prim_func
    def layernorm(X: T.Tensor((ROWS, COLS), dtype), Y: T.Tensor((ROWS, COLS), dtype)):
        with T.Kernel(ROWS // BR) as bx:
            x = T.alloc_fragment((BR, COLS), "float32")
            sq = T.alloc_fragment((BR, COLS), "float32")
            mean = T.alloc_fragment((BR,), "float32")
            var = T.alloc_fragment((BR,), "float32")
            T.copy(X[bx * BR, 0], x)
            T.reduce_sum(x, mean, dim=1)
            for i in T.Parallel(BR):
                mean[i] = mean[i] / COLS
            for i, j in T.Parallel(BR, COLS):
                x[i, j] = x[i, j] - mean[i]
                sq[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(sq, var, dim=1)
            for i, j in T.Parallel(BR, COLS):
                x[i, j] = x[i, j] * T.rsqrt(var[i] / COLS + 1e-5)
            T.copy(x, Y[bx * BR, 0])
    return layernorm


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_softmax(dtype):
    kernel = tilecore.compile(_softmax(dtype), target=TARGET)
    x = np.random.default_rng(2).standard_normal((ROWS, COLS)).astype(dtype)
    y = nan_like((ROWS, COLS), dtype)
    kernel(x, y)
    e = np.exp(f64(x) - f64(x).max(1, keepdims=True))
    check(y, e / e.sum(1, keepdims=True), rtol=1e-5 if dtype == "float32" else 1e-3, atol=1e-6)


def test_rmsnorm_torch_float32():
    kernel = tilecore.compile(_rmsnorm("float32"), target=TARGET)
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(ROWS, COLS, generator=g), torch.randn(COLS, generator=g)
    y = torch.full((ROWS, COLS), float("nan"))
    kernel(x, w, y)
    xd = f64(x)
    ref = xd / np.sqrt((xd * xd).mean(1, keepdims=True) + 1e-6) * f64(w)
    check(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_layernorm(dtype):
    kernel = tilecore.compile(_layernorm(dtype), target=TARGET)
    x = np.random.default_rng(4).standard_normal((ROWS, COLS)).astype(dtype)
    y = nan_like((ROWS, COLS), dtype)
    kernel(x, y)
    xd = f64(x)
    ref = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5)
    check(y, ref, rtol=1e-5 if dtype == "float32" else 2e-3, atol=1e-5 if dtype == "float32" else 2e-3)


# -- FlashAttention forward -----------------------------------------------------------------------

SEQ, DIM, HEADS, BM, BN = 72, 32, 2, 32, 16


def _flash(causal):
    return flash_attention_forward(SEQ, DIM, HEADS, BM, BN, "float16", causal)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_forward(causal):
    kernel = tilecore.compile(_flash(causal), target=TARGET)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(HEADS, SEQ, DIM, generator=g).half() for _ in range(3))
    o = torch.full((HEADS, SEQ, DIM), float("nan")).half()
    kernel(q, k, v, o)
    ref = attention_ref([q, k, v], "float16", causal, seq=SEQ, dim=DIM)[0]
    check(o, ref, rtol=1e-2, atol=1e-2)  # P is rounded to float16 before P @ V, as TileLang kernels do


# -- dynamic shapes, large grids, atomics -----------------------------------------------------------

def _axpy():
    n = T.dynamic("n")

    @T.prim_func
    def axpy(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32"), alpha: T.float32):
        with T.Kernel(T.ceildiv(n, 64), threads=64) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < n:
                    Y[bx * 64 + i] = X[bx * 64 + i] * alpha + 1.0
    return axpy


def test_dynamic_shapes_one_kernel_many_sizes():
    kernel = tilecore.compile(_axpy(), target=TARGET)
    for n in (1, 63, 64, 65, 1000):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        y = nan_like((n,))
        kernel(x, y, 2.5)
        check(y, f64(x) * 2.5 + 1.0, rtol=1e-6, atol=1e-6)
    xt = torch.arange(300, dtype=torch.float32)
    yt = torch.full((300,), float("nan"))
    kernel(xt, yt, -1.0)
    check(yt, -f64(xt) + 1.0, rtol=0, atol=0)


def test_grid_larger_than_65535_blocks_is_split():
    n = 70000 * 4 + 3  # 70001 blocks of 4: above the per-dimension dispatch limit

    @T.prim_func
    def scale(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 4), threads=4) as bx:
            for i in T.Parallel(4):
                if bx * 4 + i < n:
                    Y[bx * 4 + i] = X[bx * 4 + i] * 3.0 + T.cast(bx, "float32")
    kernel = tilecore.compile(scale, target=TARGET)
    x = np.random.default_rng(6).standard_normal(n).astype(np.float32)
    y = nan_like((n,))
    kernel(x, y)
    ref = f64(x) * 3.0 + np.arange(n) // 4
    check(y, ref, rtol=1e-6, atol=1e-6)


def test_two_dimensional_grid_with_a_large_second_axis():
    rows = 66000

    @T.prim_func
    def rowsum(X: T.Tensor((rows, 8), "float32"), Y: T.Tensor((rows,), "float32")):
        with T.Kernel(1, rows, threads=8) as (bx, by):
            acc = T.alloc_fragment((1, 8), "float32")
            s = T.alloc_fragment((1,), "float32")
            T.copy(X[by, 0:8], acc[0, 0:8])
            T.reduce_sum(acc, s, dim=1)
            Y[by] = s[0] + T.cast(bx, "float32")
    kernel = tilecore.compile(rowsum, target=TARGET)
    x = np.random.default_rng(7).standard_normal((rows, 8)).astype(np.float32)
    y = nan_like((rows,))
    kernel(x, y)
    check(y, f64(x).sum(1), rtol=1e-5, atol=1e-5)


def test_int32_atomic_add():
    @T.prim_func
    def histogram(I: T.Tensor((512,), "int32"), H: T.Tensor((16,), "int32")):
        with T.Kernel(4, threads=128) as bx:
            for i in T.Parallel(128):
                T.atomic_add(H[I[bx * 128 + i]], 1)
    kernel = tilecore.compile(histogram, target=TARGET)
    idx = np.random.default_rng(8).integers(0, 16, 512).astype(np.int32)
    h = np.zeros(16, np.int32)
    kernel(idx, h)
    assert (h == np.bincount(idx, minlength=16)).all()


# -- subgroup reductions ---------------------------------------------------------------------------

def _adapter_has_subgroups() -> bool:
    found = adapters()
    return bool(found) and has_subgroups(found[0])


needs_subgroups = pytest.mark.skipif(not _adapter_has_subgroups(),
                                     reason="the WebGPU adapter here has no subgroups feature")
SUBGROUP_OP = {"sum": "subgroupAdd", "abssum": "subgroupAdd", "max": "subgroupMax", "absmax": "subgroupMax",
               "min": "subgroupMin"}


def _reduce(kind, dtype, rows, cols, threads, clear, scope="shared"):
    """Workgroup-memory tiles take the subgroup intrinsic; fragments go to registers (the layout pass)."""
    alloc = T.alloc_shared if scope == "shared" else T.alloc_fragment

    @T.prim_func
    def reduce_rows(X: T.Tensor((rows, cols), dtype), Y: T.Tensor((rows,), dtype)):
        with T.Kernel(2, threads=threads) as bx:
            x = alloc((rows, cols), dtype)
            s = alloc((rows,), dtype)
            T.copy(X[0, 0], x)
            T.fill(s, 3)
            getattr(T, f"reduce_{kind}")(x, s, dim=1, clear=clear)
            if bx == 0:
                T.copy(s, Y[0])
    return reduce_rows


def _reduce_ref(kind, x, clear):
    x = f64(x)
    out = {"sum": x.sum(1), "abssum": np.abs(x).sum(1), "max": x.max(1), "absmax": np.abs(x).max(1),
           "min": x.min(1)}[kind]
    if not clear:
        out = {"sum": out + 3, "abssum": out + 3, "max": np.maximum(out, 3), "absmax": np.maximum(out, 3),
               "min": np.minimum(out, 3)}[kind]
    return out


@needs_subgroups
@pytest.mark.parametrize("kind,dtype,rows,cols,threads,clear", [
    ("sum", "float32", 16, 96, 128, True),      # a few rows, several subgroups per row
    ("max", "float32", 1, 1000, 256, True),     # one long row over every subgroup
    ("min", "float32", 5, 37, 64, False),       # ragged rows, the old destination value joins in
    ("abssum", "float32", 64, 8, 32, True),     # more rows than subgroups: one row per subgroup pass
    ("absmax", "float32", 3, 200, 128, False),
    ("sum", "int32", 7, 300, 128, True),        # integers: exact
    ("max", "int32", 33, 20, 64, False),
    ("min", "int32", 2, 5, 4, True),            # fewer invocations than one subgroup
])
def test_reductions_use_subgroup_operations(kind, dtype, rows, cols, threads, clear):
    # float max / min propagate NaN; subgroupMax may drop it, so floats take the subgroup path under fast math
    nan_sensitive = dtype == "float32" and kind in ("max", "min", "absmax")
    configs = {"tilecore.fast_math": True} if nan_sensitive else None
    kernel = tilecore.compile(_reduce(kind, dtype, rows, cols, threads, clear), target=TARGET, pass_configs=configs)
    src = kernel.get_kernel_source()
    assert SUBGROUP_OP[kind] + "(" in src and "@builtin(subgroup_size)" in src, src
    if nan_sensitive:
        exact = tilecore.compile(_reduce(kind, dtype, rows, cols, threads, clear), target=TARGET)
        assert "subgroup" not in exact.get_kernel_source() and "tc_nan" in exact.get_kernel_source()
    plain = tilecore.compile(_reduce(kind, dtype, rows, cols, threads, clear), target="webgpu:desktop")
    assert "subgroup" not in plain.get_kernel_source()  # the profile without subgroups keeps the loop lowering
    rng = np.random.default_rng(rows * cols)
    if dtype == "int32":
        x = rng.integers(-1000, 1000, (rows, cols)).astype(np.int32)
        y, y_plain = np.full(rows, -7, np.int32), np.full(rows, -7, np.int32)
    else:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        y, y_plain = nan_like((rows,)), nan_like((rows,))
    kernel(x, y)
    plain(x, y_plain)
    ref = _reduce_ref(kind, x, clear)
    if dtype == "int32":
        assert (y == ref.astype(np.int64)).all() and (y == y_plain).all()
    else:
        check(y, ref, rtol=1e-5, atol=1e-5 * cols)
        check(y, f64(y_plain), rtol=1e-5, atol=1e-5 * cols)


@pytest.mark.parametrize("kind,dtype,rows,cols,threads,clear,where", [
    ("sum", "float32", 16, 96, 128, True, "registers"),
    ("max", "float32", 1, 1000, 256, True, "registers"),
    ("min", "float32", 5, 37, 64, False, "registers"),   # a row per thread group of 1: every thread holds all
    ("absmax", "float32", 3, 200, 128, False, "registers"),
    ("sum", "int32", 7, 300, 128, True, "shared"),       # 525 registers per thread: stays in workgroup memory
    ("max", "int32", 33, 20, 64, False, "registers"),
])
def test_fragment_reductions_in_registers(kind, dtype, rows, cols, threads, clear, where):
    kernel = tilecore.compile(_reduce(kind, dtype, rows, cols, threads, clear, scope="fragment"), target=TARGET)
    got = kernel.meta["attrs"]["fragment_layouts"]["x"]
    assert got.startswith("shared") == (where == "shared"), got
    rng = np.random.default_rng(rows * cols)
    if dtype == "int32":
        x = rng.integers(-1000, 1000, (rows, cols)).astype(np.int32)
        y = np.full(rows, -7, np.int32)
    else:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        x[rows // 2, cols // 3] = np.nan if kind in ("max", "min", "absmax") else x[rows // 2, cols // 3]
        y = nan_like((rows,))
    kernel(x, y)
    ref = _reduce_ref(kind, x, clear)
    if dtype == "int32":
        assert (y == ref.astype(np.int64)).all()
    else:  # max / min propagate NaN, as the generic lowering does
        assert (np.isnan(y) == np.isnan(ref)).all()
        check(y[~np.isnan(ref)], ref[~np.isnan(ref)], rtol=1e-5, atol=1e-5 * cols)


@needs_subgroups
def test_targets_show_reports_the_subgroup_profile():
    r = subprocess.run([sys.executable, "-m", "tilecore", "targets", "show", "webgpu"], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "capability profile: webgpu/desktop-subgroups" in r.stdout
    assert "subgroup_ops: true" in r.stdout


def test_baseline_profile_keeps_the_loop_reduction():
    kernel = tilecore.compile(_softmax("float32"), target="webgpu:baseline")
    src = kernel.get_kernel_source()
    assert "subgroup" not in src
    x = np.random.default_rng(9).standard_normal((ROWS, COLS)).astype(np.float32)
    y = nan_like((ROWS, COLS))
    kernel(x, y)
    e = np.exp(f64(x) - f64(x).max(1, keepdims=True))
    check(y, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


# -- the tiled GEMM ------------------------------------------------------------------------------------

def _gemm_tile(m, n, k, threads, ta, tb, scope="shared"):
    a_shape, b_shape = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))

    @T.prim_func
    def gemm_tile(A: T.Tensor(a_shape, "float32"), B: T.Tensor(b_shape, "float32"), C: T.Tensor((m, n), "float32")):
        with T.Kernel(1, threads=threads):
            A_s = T.alloc_shared(a_shape, "float32")
            B_s = T.alloc_shared(b_shape, "float32")
            # a workgroup-memory accumulator takes webgpu.tiled_gemm; a fragment goes to registers
            C_l = (T.alloc_shared if scope == "shared" else T.alloc_fragment)((m, n), "float32")
            T.copy(A[0, 0], A_s)
            T.copy(B[0, 0], B_s)
            T.fill(C_l, 0.5)
            T.gemm(A_s, B_s, C_l, transpose_A=ta, transpose_B=tb)
            T.copy(C_l, C[0, 0])
    return gemm_tile


@pytest.mark.parametrize("m,n,k,threads,ta,tb,block", [
    (32, 32, 16, 64, False, False, "4x4"),
    (64, 64, 32, 128, False, True, "4x4"),
    (32, 16, 8, 128, True, False, "2x2"),     # fewer outputs than 16 per invocation: smaller blocks
    (6, 10, 7, 8, True, True, "2x2"),         # extents that 4 does not divide
    (6, 10, 7, 32, True, True, "1x1"),
])
@pytest.mark.parametrize("scope", ["shared", "fragment"])
def test_gemm_uses_register_blocks_and_sums_in_order(m, n, k, threads, ta, tb, block, scope):
    kernel = tilecore.compile(_gemm_tile(m, n, k, threads, ta, tb, scope), target=TARGET)
    src = kernel.get_kernel_source()
    if scope == "shared":
        assert f"a {block} register block per invocation (tiled gemm)" in src, src
        tm, tn = (int(v) for v in block.split("x"))
        assert f"var acc: array<f32, {tm * tn}>;" in src
    else:  # the accumulator in registers, owner-computes (the same additions in the same order)
        assert not kernel.meta["attrs"]["fragment_layouts"]["C_l"].startswith("shared"), kernel.meta["attrs"]
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = nan_like((m, n))
    kernel(a, b, c)
    a2, b2 = (a.T if ta else a), (b.T if tb else b)
    # the generic lowering's order: c = c + a_k * b_k for k ascending, each step rounded to float32. A
    # driver may fuse each step into one fma (WGSL allows it; NVIDIA's Vulkan driver does): one rounding
    ref = np.full((m, n), 0.5, np.float32)
    fused = ref.copy()
    for kk in range(k):
        ref = (ref + np.outer(a2[:, kk], b2[kk, :]).astype(np.float32)).astype(np.float32)
        fused = (fused + np.outer(f64(a2[:, kk]), f64(b2[kk, :]))).astype(np.float32)
    check(c, f64(a2) @ f64(b2) + 0.5, rtol=1e-5, atol=1e-5 * k)
    in_order = [np.allclose(c, r, rtol=2e-7, atol=1e-7) for r in (ref, fused)]
    assert any(in_order), f"neither the sequential nor the fused-sequential sum: max diff {np.abs(c - ref).max()}"


# -- tensors that stay on the GPU ------------------------------------------------------------------------

def test_device_tensors_stay_on_the_gpu_between_launches():
    kernel = tilecore.compile(_axpy(), target=TARGET)
    x = np.random.default_rng(10).standard_normal(1000).astype(np.float32)
    dx = tilecore_webgpu.to_device(x)
    dy = tilecore_webgpu.empty((1000,), "float32")
    dz = tilecore_webgpu.to_device(torch.zeros(1000))
    assert isinstance(dx, tilecore_webgpu.DeviceTensor) and dx.shape == (1000,) and dx.dtype == np.float32
    before = dict(TRANSFERS)
    kernel(dx, dy, 2.0)   # y = 2x + 1, written on the GPU
    kernel(dy, dz, 2.0)   # z = 2y + 1 reads the first launch's output where it is
    assert dict(TRANSFERS) == before, "a launch on device tensors copied between host and GPU"
    check(dz.numpy(), (f64(x) * 2 + 1) * 2 + 1, rtol=1e-6, atol=1e-6)
    zt = dz.torch()
    assert isinstance(zt, torch.Tensor) and zt.shape == (1000,)
    assert TRANSFERS["downloads"] == before.get("downloads", 0) + 2
    # host arguments keep working next to device ones, and are copied as before
    y = nan_like((1000,))
    kernel(dx, y, -1.0)
    check(y, -f64(x) + 1, rtol=1e-6, atol=1e-6)
    assert TRANSFERS["downloads"] == before.get("downloads", 0) + 3
    with pytest.raises(TypeError, match="on the GPU"):
        np.asarray(dx)


def test_device_tensors_are_checked_like_host_tensors():
    dx = tilecore_webgpu.to_device(np.ones(64, np.float32))
    with pytest.raises(TypeError, match="on the GPU"):
        dx[32:]  # no views: WebGPU binds whole buffers
    kernel = tilecore.compile(_axpy(), target=TARGET)
    with pytest.raises(tilecore.errors.ArgumentError, match="'n' is already 64"):
        kernel(dx, np.zeros(32, np.float32), 1.0)
    on_cpu = tilecore.compile(_axpy(), target="cpu")
    with pytest.raises(tilecore.errors.ArgumentError, match="memory of the 'webgpu' backend"):
        on_cpu(dx, np.zeros(64, np.float32), 1.0)


# -- what WebGPU cannot do is refused at compile time ---------------------------------------------------

def test_float64_is_not_supported_with_a_clear_compile_error():
    @T.prim_func
    def copy64(A: T.Tensor((16,), "float64"), B: T.Tensor((16,), "float64")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(16):
                B[i] = A[i]
    with pytest.raises(UnsupportedFeatureError) as info:
        tilecore.compile(copy64, target=TARGET)
    assert info.value.feature == "dtype:float64:storage"
    assert "float64" in str(info.value) and "webgpu" in str(info.value)


def test_too_many_storage_buffers_for_the_baseline_profile_is_reported():
    @T.prim_func
    def many(A0: T.Tensor((4,), "float32"), A1: T.Tensor((4,), "float32"), A2: T.Tensor((4,), "float32"),
             A3: T.Tensor((4,), "float32"), A4: T.Tensor((4,), "float32"), A5: T.Tensor((4,), "float32"),
             A6: T.Tensor((4,), "float32"), A7: T.Tensor((4,), "float32"), B: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=4) as bx:
            for i in T.Parallel(4):
                B[i] = A0[i] + A1[i] + A2[i] + A3[i] + A4[i] + A5[i] + A6[i] + A7[i]
    with pytest.raises(UnsupportedFeatureError) as info:
        tilecore.compile(many, target="webgpu:baseline")
    assert info.value.feature == "limit:max_storage_buffers_per_stage"
    assert "9 tensors" in str(info.value)


# -- the command line and the profiler ----------------------------------------------------------------

def test_targets_show_names_the_adapter():
    r = subprocess.run([sys.executable, "-m", "tilecore", "targets", "show", "webgpu"], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "status: ok" in r.stdout and "adapter" in r.stdout and "backend" in r.stdout
    assert "capability profile: webgpu/" in r.stdout


def test_profiler_times_the_kernel():
    kernel = tilecore.compile(_axpy(), target=TARGET)
    x = np.ones(4096, np.float32)
    y = np.zeros(4096, np.float32)
    ms = kernel.get_profiler().do_bench(warmup=1, rep=3, input_tensors=[x, y, 2.0])
    assert ms >= 0.0 and math.isfinite(ms)


# -- the conformance catalog ----------------------------------------------------------------------------

def test_conformance_catalog_on_webgpu_device_mode_has_no_failures(tmp_path):
    report = tmp_path / "report"
    env = {**os.environ, "TILECORE_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "tilecore", "conformance", "run", "--target", "webgpu", "-n", "2",
                        "--report", str(report)], capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    man = json.loads((report / "manifest.json").read_text())
    assert man["mode"] == "device" and man["capability_profile"].startswith("webgpu/") and man["cases"] == len(res)
    assert man["device"]["status"] == "ok" and man["device"]["devices"], man["device"]  # the adapter is recorded
    assert len(res) >= 340
    assert {x["state"] for x in res} <= {"PASS", "NOT_SUPPORTED"}
    assert all(x["mode"] == "device" for x in res)
    for x in res:
        if x["state"] == "NOT_SUPPORTED":  # a capability the profile lacks, or a limit it declares too low
            err = x["error"]
            assert ("does not support" in err and "webgpu/" in err) or ("target webgpu allows" in err and
                                                                        "(limit max_shared_bytes" in err), x
    families = {x["family"] for x in res if x["state"] == "PASS"}
    assert {"copy", "gemm", "reduce", "cumsum", "elementwise", "atomic", "softmax", "rmsnorm", "layernorm",
            "attention", "dynamic", "pipelined"} <= families
