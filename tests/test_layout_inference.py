"""Layout inference and fragments in registers (tilecore/passes/layout.py), through the DSL and
tilecore.compile: the README GEMM on WebGPU (lavapipe), softmax / RMSNorm / LayerNorm / a GEMM with an
epilogue on CUDA (run on the host emulator) and on WebGPU, the shared-memory fallbacks (a layout conflict,
reductions without shuffles), replication, and the CPU target left alone."""
from __future__ import annotations

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.layout import Digit, FragmentLayout

from cuda_host_emulator import run_on_host
from kernels_for_tests import matmul_relu
from tilecore_conformance import composite

try:
    from tilecore_webgpu.runtime import adapters

    HAVE_WEBGPU = bool(adapters())
except Exception:  # noqa: BLE001
    HAVE_WEBGPU = False

needs_webgpu = pytest.mark.skipif(not HAVE_WEBGPU, reason="no WebGPU adapter (apt-get install mesa-vulkan-drivers)")
CUDA = ["cuda:sm_80", "cuda:sm_90a"]
ROWS, COLS, BR = 32, 96, 16


def layouts(kernel) -> dict:
    return kernel.meta["attrs"]["fragment_layouts"]


def body(kernel) -> str:
    """The generated kernel without the backend's prelude (which defines helpers it may not use)."""
    return kernel.source.code.partition('extern "C"')[2] or kernel.source.code


def in_registers(kernel) -> bool:
    got = layouts(kernel)
    return bool(got) and not any(v.startswith("shared") for v in got.values())


def softmax():
    @T.prim_func
    def kernel(X: T.Tensor((ROWS, COLS), "float32"), Y: T.Tensor((ROWS, COLS), "float32")):
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
    return kernel


def rmsnorm():
    @T.prim_func
    def kernel(X: T.Tensor((ROWS, COLS), "float32"), W: T.Tensor((COLS,), "float32"),
               Y: T.Tensor((ROWS, COLS), "float32")):
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
    return kernel


def layernorm():
    return composite.layernorm("float32", ROWS, COLS, BR)


def gemm_epilogue(M=64, N=777, K=48, bm=32, bn=32, bk=16):
    """A float32 GEMM with a bias + ReLU epilogue on the fragment; B has 777 columns."""
    @T.prim_func
    def kernel(A: T.Tensor((M, K), "float32"), B: T.Tensor((K, N), "float32"), bias: T.Tensor((N,), "float32"),
               C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float32")
            B_s = T.alloc_shared((bk, bn), "float32")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, acc)
            for i, j in T.Parallel(bm, bn):
                acc[i, j] = T.max(acc[i, j] + bias[bx * bn + j], 0)
            T.copy(acc, C[by * bm, bx * bn])
    return kernel


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((ROWS, COLS)).astype(np.float32), rng.standard_normal(COLS).astype(np.float32)


def _softmax_ref(x):
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _rms_ref(x, w):
    xd = x.astype(np.float64)
    return xd / np.sqrt((xd * xd).mean(1, keepdims=True) + 1e-6) * w


def _ln_ref(x):
    xd = x.astype(np.float64)
    return (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5)


def _cases():
    x, w = _data()
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 777)).astype(np.float32)
    bias = rng.standard_normal(777).astype(np.float32)
    return {
        "softmax": (softmax, [x, np.full_like(x, np.nan)], _softmax_ref(x)),
        "rmsnorm": (rmsnorm, [x, w, np.full_like(x, np.nan)], _rms_ref(x, w)),
        "layernorm": (layernorm, [x, np.full_like(x, np.nan)], _ln_ref(x)),
        "gemm_epilogue": (gemm_epilogue, [a, b, bias, np.full((64, 777), np.nan, np.float32)],
                          np.maximum(a.astype(np.float64) @ b + bias, 0)),
    }


# -- CUDA: the general path (not the register programs), shuffles, run on the host emulator -----------

@pytest.mark.parametrize("target", CUDA)
@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm", "gemm_epilogue"])
def test_cuda_fragments_reach_registers_off_the_matched_forms(name, target):
    from tilecore_cuda import lowering_path

    make, args, ref = _cases()[name]
    kernel = tilecore.compile(make(), target=target)
    assert lowering_path(kernel) == "generic"
    assert in_registers(kernel), layouts(kernel)
    if name != "gemm_epilogue":
        assert "__shfl_xor_sync(0xffffffffu" in body(kernel)
    # block memory holds the GEMM's A and B tiles only (two pipeline stages), never a fragment
    assert kernel.source.meta["shared_bytes"] <= (2 * (32 * 16 + 16 * 32) * 4 if name == "gemm_epilogue" else 0)
    if target == "cuda:sm_80":
        out = run_on_host(kernel, [a.copy() for a in args])[-1]
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


# -- WebGPU: the README GEMM at its own sizes, and the same kernels ----------------------------------

@needs_webgpu
def test_readme_gemm_runs_on_webgpu_with_the_accumulator_in_registers():
    kernel = tilecore.compile(matmul_relu(256, 256, 64, 128, 128, 32), target="webgpu", out_idx=[-1])
    assert in_registers(kernel), layouts(kernel)
    # A and B tiles only (128x32 + 32x128 halves): the 64 KiB accumulator is in registers
    assert kernel.source.meta["workgroup_bytes"] == 2 * 128 * 32 * 2
    rng = np.random.default_rng(7)
    a = rng.standard_normal((256, 64)).astype(np.float16)
    b = rng.standard_normal((64, 256)).astype(np.float16)
    c = kernel(a, b)
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
    np.testing.assert_allclose(c.astype(np.float64), ref, rtol=2e-3, atol=2e-2)


@needs_webgpu
@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm", "gemm_epilogue"])
def test_webgpu_fragments_in_registers(name):
    make, args, ref = _cases()[name]
    kernel = tilecore.compile(make(), target="webgpu")
    assert in_registers(kernel), layouts(kernel)
    if name != "gemm_epilogue":
        # the subgroup size is known only at run time: shuffles below it where the adapter has subgroups
        # (tests/test_webgpu_shuffles.py), rows meet in workgroup memory above it and without subgroups
        subgroups = kernel.target.capability_id == "webgpu/desktop-subgroups"
        assert ("subgroupShuffleXor(" in body(kernel)) == subgroups and "red_scratch" in body(kernel)
    args = [a.copy() for a in args]
    kernel(*args)
    np.testing.assert_allclose(args[-1], ref, rtol=2e-5, atol=2e-5)


# -- fallbacks -----------------------------------------------------------------------------------------

def transposed(n=32):
    @T.prim_func
    def kernel(A: T.Tensor((n, n), "float32"), B: T.Tensor((n, n), "float32")):
        with T.Kernel(1, threads=128) as bx:
            f = T.alloc_fragment((n, n), "float32")
            g = T.alloc_fragment((n, n), "float32")
            T.copy(A[0, 0], f)
            for i, j in T.Parallel(n, n):
                g[i, j] = f[i, j] + 2 * f[j, i]
            T.copy(g, B[0, 0])
    return kernel


@pytest.mark.parametrize("target", ["cuda:sm_80", pytest.param("webgpu", marks=needs_webgpu)])
def test_a_transposed_read_keeps_the_fragment_in_shared_memory_with_the_reason(target):
    kernel = tilecore.compile(transposed(), target=target)
    got = layouts(kernel)
    assert got["f"].startswith("shared: ") and "transposed read" in got["f"]
    assert not got["g"].startswith("shared")
    a = np.random.default_rng(3).standard_normal((32, 32)).astype(np.float32)
    b = np.full_like(a, np.nan)
    if target == "webgpu":
        kernel(a, b)
    else:
        b = run_on_host(kernel, [a, b])[-1]
    np.testing.assert_allclose(b, a + 2 * a.T, rtol=1e-6)


def rowmax_across_warps(clear=True):
    """A layout (annotated) whose rows spread over threads 4 apart, across warps: shuffles combine the threads of a
    row within a warp, shared memory the warps' totals."""
    lay = FragmentLayout((4, 64), [[Digit("thread", 4, 1)], [Digit("reg", 2, 1), Digit("thread", 32, 4)]],
                         name="across")

    @T.prim_func
    def kernel(X: T.Tensor((4, 64), "float32"), Y: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((4, 64), "float32")
            m = T.alloc_fragment((4,), "float32")
            T.annotate_layout({x: lay})
            T.copy(X[0, 0], x)
            T.fill(m, 1.5)
            T.reduce_max(x, m, dim=1, clear=clear)
            T.copy(m, Y[0])
    return kernel


@pytest.mark.parametrize("clear", [True, False])
@pytest.mark.parametrize("target", ["cuda:sm_80", pytest.param("webgpu", marks=needs_webgpu)])
def test_reduction_through_shared_memory_when_shuffles_cannot_reach(target, clear):
    kernel = tilecore.compile(rowmax_across_warps(clear), target=target)
    assert layouts(kernel)["x"].startswith("across"), layouts(kernel)
    assert "red_scratch" in body(kernel)
    if target != "webgpu":  # the masks below the warp by shuffles, the warps' totals through shared memory
        for mask in (4, 8, 16):
            assert f"part[0], {mask}, 32)" in body(kernel)
        assert "part[0], 32, " not in body(kernel) and "part[0], 64, " not in body(kernel)
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32) - 1.0
    x[2, 17] = np.nan  # T.reduce_max propagates NaN, as the generic lowering does
    y = np.zeros(4, np.float32)
    if target == "webgpu":
        kernel(x, y)
    else:
        y = run_on_host(kernel, [x, y])[-1]
    ref = x.max(1) if clear else np.maximum(x.max(1), 1.5)
    np.testing.assert_array_equal(np.isnan(y), [False, False, True, False])
    np.testing.assert_allclose(y[[0, 1, 3]], ref[[0, 1, 3]])


def accumulate_rows(atomic=True):
    """A row sum held by 32 threads each (replicated); the global updates are not idempotent."""
    @T.prim_func
    def kernel(X: T.Tensor((8, 64), "float32"), Y: T.Tensor((8,), "float32"), Z: T.Tensor((8,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((8, 64), "float32")
            s = T.alloc_fragment((8,), "float32")
            T.copy(X[0, 0], x)
            T.reduce_sum(x, s, dim=1)
            for i in T.Parallel(8):
                Y[i] = Y[i] + s[i]
            if atomic:
                T.atomic_add(Z[0:8], s)
    return kernel


@pytest.mark.parametrize("target", ["cuda:sm_80", pytest.param("webgpu", marks=needs_webgpu)])
def test_replicated_elements_update_memory_once(target):
    webgpu = target == "webgpu"  # the host emulator has no atomics
    kernel = tilecore.compile(accumulate_rows(atomic=webgpu), target=target)
    assert "replicate" in layouts(kernel)["s"]
    x = np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32)
    y, z = np.ones(8, np.float32), np.full(8, 2.0, np.float32)
    if webgpu:
        kernel(x, y, z)
        np.testing.assert_allclose(z, 2 + x.sum(1), rtol=1e-5)
    else:
        y = run_on_host(kernel, [x, y, z])[1]
    np.testing.assert_allclose(y, 1 + x.sum(1), rtol=1e-5)


# -- the CPU target is left alone ------------------------------------------------------------------------

def test_cpu_keeps_fragments_as_block_arrays():
    kernel = tilecore.compile(softmax(), target="cpu")
    assert "fragment_layouts" not in kernel.meta["attrs"]
    x, _ = _data()
    y = np.full_like(x, np.nan)
    kernel(x, y)
    np.testing.assert_allclose(y, _softmax_ref(x), rtol=1e-5, atol=1e-6)


def test_ir_dump_names_each_fragments_place(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_DUMP_IR", str(tmp_path))
    tilecore.compile(transposed(), target="cuda:sm_80")
    text = next(tmp_path.rglob("*tilecore.lower_fragments.ir")).read_text()
    assert "# attr fragment_layouts = " in text and "'f': 'shared: " in text
    assert "with T.per_thread(" in text and "T.alloc_register((" in text


def row_center(rows, cols, threads):
    """TileLang's norms at blk_m = 1: one row per block over every thread (x - mean(x) per row)."""
    @T.prim_func
    def kernel(X: T.Tensor((rows, cols), "float32"), Y: T.Tensor((rows, cols), "float32")):
        with T.Kernel(rows, threads=threads) as bx:
            x = T.alloc_fragment((1, cols), "float32")
            s = T.alloc_fragment((1,), "float32")
            T.copy(X[bx, 0], x)
            T.reduce_sum(x, s, dim=1)
            for i, j in T.Parallel(1, cols):
                x[i, j] = x[i, j] - s[i] / cols
            T.copy(x, Y[bx, 0])
    return kernel


def test_a_single_row_spreads_over_every_thread():
    # before: the row over one warp's 32 lanes and 8 copies of it on the other warps (256 registers per thread at
    # 8192 columns: TileLang's layernorm spilled 1.3 KB per thread on sm_90a); now 256 threads x 4 registers, the
    # row's sum by shuffles within each warp and the 8 warps' totals through shared memory
    kernel = tilecore.compile(row_center(3, 1024, 256), target="cuda:sm_80",
                              pass_configs={"tilecore.disable_cache": True})
    assert layouts(kernel)["x"].endswith("(256 threads x 4 regs)") and "replicate" not in layouts(kernel)["x"]
    assert "red_scratch" in body(kernel) and "part[0], 16, 32)" in body(kernel)
    x = np.random.default_rng(7).standard_normal((3, 1024)).astype(np.float32)
    y = run_on_host(kernel, [x, np.zeros_like(x)])[-1]
    np.testing.assert_allclose(y, x - x.mean(1, keepdims=True), rtol=1e-5, atol=1e-5)
