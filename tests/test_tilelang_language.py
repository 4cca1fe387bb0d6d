"""TileLang language names (issue 10, item 3), each through the DSL + tilecore.compile.

Every kernel runs on the CPU target with its result checked against numpy/torch in float64; kernels in
the core pipeline also run on WebGPU (lavapipe here) and compile for cuda:sm_90a. A name tilecore does
not support raises its error naming the feature and what to use instead.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tilecore
import tilecore.language as T
from tilecore.errors import KernelAssertionError, ParseError, TileOpShapeError, UnsupportedFeatureError

CPU = "cpu"
NOCACHE = {"tilecore.disable_cache": True}


def _cuda_compiles(func, **kw):
    tilecore_cuda = pytest.importorskip("tilecore_cuda")
    probe = tilecore_cuda.CUDABackend().probe()
    import os
    if probe.status == "no-toolchain" and os.environ.get("TILECORE_CUDA_REQUIRE_TOOLCHAIN") != "1":
        pytest.skip("no CUDA compiler here")
    k = tilecore.compile(func, target="cuda:sm_90a", pass_configs=NOCACHE, **kw)
    assert k.mode in ("compile-only", "device")
    return k


def _webgpu(func, **kw):
    pytest.importorskip("tilecore_webgpu")
    k = tilecore.compile(func, target="webgpu", pass_configs=NOCACHE, **kw)
    assert k.mode == "device"
    return k


def on_targets(func, run_check, out_idx=None):
    """Run ``run_check(kernel)`` on cpu and webgpu, and compile for cuda:sm_90a."""
    run_check(tilecore.compile(func, target=CPU, out_idx=out_idx, pass_configs=NOCACHE))
    run_check(_webgpu(func, out_idx=out_idx))
    _cuda_compiles(func, out_idx=out_idx)


# -- T.dtype ----------------------------------------------------------------------------------------

def test_dtype_value_annotation_and_as_torch():
    assert T.dtype("half") == T.float16 and isinstance(T.float16, T.dtype)
    assert T.dtype(torch.bfloat16) == "bfloat16" and T.dtype(T.float32) is T.float32
    assert T.float16.as_torch() is torch.float16 and T.dtype("float8_e4m3").as_torch() is torch.float8_e4m3fn
    assert T.dtype(float) == "float32" and T.dtype(int) == "int32"
    with pytest.raises(ValueError, match="unknown dtype"):
        T.dtype("float13")

    def scale(n, dtype: T.dtype = T.float16):
        dtype = T.dtype(dtype)

        @T.prim_func
        def k(A: T.Tensor((n,), dtype), B: T.Tensor((n,), dtype)):
            with T.Kernel(1, threads=32):
                acc: T.float32 = 0.5
                for i in T.Parallel(n):
                    B[i] = A[i] * T.dtype("float32")(acc)
        return k

    a = torch.randn(64).half()
    b = tilecore.compile(scale(64, "half"), target=CPU, out_idx=[-1])(a)
    assert b.dtype == T.dtype("half").as_torch()
    np.testing.assert_allclose(b.double().numpy(), a.double().numpy() * 0.5, rtol=1e-3)


# -- scalar functions: T.floordiv, T.floormod, T.clamp ------------------------------------------------

def test_floordiv_floormod_clamp():
    n = 96

    @T.prim_func
    def k(A: T.Tensor((n,), T.int32), X: T.Tensor((n,), T.float32), Q: T.Tensor((n,), T.int32),
          R: T.Tensor((n,), T.int32), C: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=32):
            for i in T.Parallel(n):
                Q[i] = T.floordiv(A[i], 7)
                R[i] = T.floormod(A[i], T.floordiv(21, 3))
                C[i] = T.clamp(X[i], -0.5, 0.75)

    rng = np.random.default_rng(0)
    a = rng.integers(-100, 100, n).astype(np.int32)
    x = rng.standard_normal(n).astype(np.float32)

    def check(kern):
        q, r, c = (np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.float32))
        kern(a, x, q, r, c)
        np.testing.assert_array_equal(q, a // 7)
        np.testing.assert_array_equal(r, a % 7)
        np.testing.assert_array_equal(c, np.clip(x, -0.5, 0.75))

    on_targets(k, check)
    assert T.floordiv(-7, 2) == -4 and T.floormod(-7, 2) == 1


# -- loops: T.Serial, T.Persistent, while ---------------------------------------------------------------

def test_serial_alias_rms_norm_style():
    M, N, bk = 8, 96, 32

    @T.prim_func
    def k(A: T.Tensor((M, N), T.float32), B: T.Tensor((M, N), T.float32)):
        with T.Kernel(M, threads=32) as bx:
            s = T.alloc_fragment((1,), T.float32)
            T.clear(s)
            for kk in T.Serial(N // bk):
                for j in T.serial(bk):
                    s[0] += A[bx, kk * bk + j] * A[bx, kk * bk + j]
            for kk in T.Serial(0, N // bk):
                for j in T.Parallel(bk):
                    B[bx, kk * bk + j] = A[bx, kk * bk + j] * T.rsqrt(s[0] / N + 1e-6)

    a = np.random.default_rng(1).standard_normal((M, N)).astype(np.float32)
    ref = a / np.sqrt((a.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6)

    def check(kern):
        np.testing.assert_allclose(kern(a), ref, rtol=1e-5, atol=1e-6)

    on_targets(k, check, out_idx=[-1])


@pytest.mark.parametrize("gm,gn,waves,group", [(5, 3, 4, 2), (4, 4, 3, 8), (7, 2, 16, 3)])
def test_persistent_visits_every_tile_once(gm, gn, waves, group):
    bm = bn = 4
    M, N = gm * bm, gn * bn

    @T.prim_func
    def k(A: T.Tensor((M, N), T.float32), Seen: T.Tensor((gm, gn), T.int32), B: T.Tensor((M, N), T.float32)):
        with T.Kernel(waves, threads=32) as block_id:
            for bx, by in T.Persistent([gm, gn], waves, block_id, group):
                Seen[bx, by] = Seen[bx, by] + 1
                for i, j in T.Parallel(bm, bn):
                    B[bx * bm + i, by * bn + j] = A[bx * bm + i, by * bn + j] * 2.0

    a = np.random.default_rng(2).standard_normal((M, N)).astype(np.float32)

    def check(kern):
        seen, b = np.zeros((gm, gn), np.int32), np.zeros((M, N), np.float32)
        kern(a, seen, b)
        np.testing.assert_array_equal(seen, np.ones((gm, gn), np.int32))  # each tile by one block, once
        np.testing.assert_array_equal(b, a * 2)

    on_targets(k, check)


def test_while_loop_stream_k_style():
    """``while`` on a T.alloc_var (the stream-K / AMD flash-attention pattern), with break/continue."""
    n, chunk = 100, 16

    @T.prim_func
    def k(A: T.Tensor((n,), T.float32), Out: T.Tensor((3,), T.float32)):
        with T.Kernel(1, threads=32):
            start = T.alloc_var(T.int32, init=0)
            acc = T.alloc_var(T.float32, init=0.0)
            steps = T.alloc_var(T.int32, init=0)
            while start < n:
                for i in T.serial(chunk):
                    if start + i < n:
                        acc = acc + A[start + i]
                start = start + chunk
                steps = steps + 1
            evens = T.alloc_var(T.float32, init=0.0)
            j = T.alloc_var(T.int32, init=-1)
            while True:
                j = j + 1
                if j >= n:
                    break
                if j % 2 == 1:
                    continue
                evens = evens + A[j]
            Out[0] = acc
            Out[1] = steps
            Out[2] = evens

    a = np.random.default_rng(3).standard_normal(n).astype(np.float32)

    def check(kern):
        out = kern(a)
        np.testing.assert_allclose(out[0], a.astype(np.float64).sum(), rtol=1e-5)
        assert out[1] == -(-n // chunk)
        np.testing.assert_allclose(out[2], a[::2].astype(np.float64).sum(), rtol=1e-5)

    on_targets(k, check, out_idx=[-1])


def test_while_else_is_refused():
    with pytest.raises(ParseError, match="while ... else"):
        @T.prim_func
        def k(A: T.Tensor((4,), T.float32)):
            with T.Kernel(1):
                i = T.alloc_var(T.int32, init=0)
                while i < 4:
                    i = i + 1
                else:
                    A[0] = 1.0


# -- T.atomic_add of a tile into a point ------------------------------------------------------------------

def test_atomic_add_tile_into_point():
    """Split-K style: every block adds its (bm, bn) tile into C at a point start."""
    M, N, splits, bm, bn = 16, 24, 4, 8, 8

    @T.prim_func
    def k(A: T.Tensor((splits, M, N), T.float32), C: T.Tensor((M, N), T.float32)):
        with T.Kernel(N // bn, M // bm, splits, threads=64) as (bx, by, bz):
            t = T.alloc_fragment((bm, bn), T.float32)
            T.copy(A[bz, by * bm, bx * bn], t)
            T.atomic_add(C[by * bm, bx * bn], t)

    a = np.random.default_rng(4).standard_normal((splits, M, N)).astype(np.float32)

    def check(kern):
        c = np.zeros((M, N), np.float32)
        kern(a, c)
        np.testing.assert_allclose(c, a.astype(np.float64).sum(0), rtol=1e-5, atol=1e-6)

    on_targets(k, check)


# -- T.SharedBuffer / T.FragmentBuffer annotations of macro parameters -----------------------------------

@T.macro
def _softmax_rows(s: T.FragmentBuffer([8, 16], T.float32), m: T.FragmentBuffer([8], T.float32),
                  src: T.SharedBuffer([8, 16], T.float32)):
    T.copy(src, s)
    T.reduce_max(s, m, dim=1)
    for i, j in T.Parallel(8, 16):
        s[i, j] = T.exp(s[i, j] - m[i])


def test_shared_and_fragment_buffer_macro_annotations():
    @T.prim_func
    def k(A: T.Tensor((8, 16), T.float32), B: T.Tensor((8, 16), T.float32)):
        with T.Kernel(1, threads=64):
            a_s = T.alloc_shared((8, 16), T.float32)
            s = T.alloc_fragment((8, 16), T.float32)
            m = T.alloc_fragment((8,), T.float32)
            T.copy(A, a_s)
            _softmax_rows(s, m, a_s)
            T.copy(s, B)

    a = np.random.default_rng(5).standard_normal((8, 16)).astype(np.float32)
    ref = np.exp(a - a.max(1, keepdims=True))

    def check(kern):
        np.testing.assert_allclose(kern(a), ref, rtol=1e-5)

    on_targets(k, check, out_idx=[-1])

    with pytest.raises(ParseError, match="parameter `src` is a T.SharedBuffer but a_f is a fragment buffer"):
        @T.prim_func
        def wrong_scope(A: T.Tensor((8, 16), T.float32)):
            with T.Kernel(1):
                a_f = T.alloc_fragment((8, 16), T.float32)
                _softmax_rows(a_f, T.alloc_fragment((8,), T.float32), a_f)
    with pytest.raises(ParseError, match=r"parameter `s` has shape \(8, 16\) but s2 has shape \(8, 8\)"):
        @T.prim_func
        def wrong_shape(A: T.Tensor((8, 16), T.float32)):
            with T.Kernel(1):
                s2 = T.alloc_fragment((8, 8), T.float32)
                _softmax_rows(s2, T.alloc_fragment((8,), T.float32), T.alloc_shared((8, 16), T.float32))


# -- T.Tensor(shape, dtype, A.data): a view of a parameter (TileLang's convolution) ----------------------

def test_tensor_view_of_parameter_convolution_style():
    """A 1x1 convolution written as TileLang's example does: the NHWC input seen as a matrix."""
    N, H, W_, C, F = 2, 4, 6, 16, 8
    bm = 16

    @T.prim_func
    def conv1x1(data: T.Tensor((N, H, W_, C), T.float32), kernel: T.Tensor((C, F), T.float32),
                out: T.Tensor((N, H, W_, F), T.float32)):
        with T.Kernel(T.ceildiv(N * H * W_, bm), threads=64) as bx:
            data_flat = T.Tensor((N * H * W_, C), T.float32, data.data)
            out_flat = T.Tensor((N * H * W_, F), T.float32, out.data)
            a = T.alloc_shared((bm, C), T.float32)
            w = T.alloc_shared((C, F), T.float32)
            acc = T.alloc_fragment((bm, F), T.float32)
            T.clear(acc)
            T.copy(data_flat[bx * bm, 0], a)
            T.copy(kernel, w)
            T.gemm(a, w, acc)
            T.copy(acc, out_flat[bx * bm, 0])

    rng = np.random.default_rng(6)
    x = rng.standard_normal((N, H, W_, C)).astype(np.float32)
    wk = rng.standard_normal((C, F)).astype(np.float32)
    ref = np.einsum("nhwc,cf->nhwf", x.astype(np.float64), wk)

    def check(kern):
        np.testing.assert_allclose(kern(x, wk), ref, rtol=1e-4, atol=1e-4)

    on_targets(conv1x1, check, out_idx=[-1])

    with pytest.raises(ParseError, match="data must be `.data` of a T.Tensor parameter"):
        @T.prim_func
        def bad(A: T.Tensor((4, 4), T.float32)):
            with T.Kernel(1):
                s = T.alloc_shared((4, 4), T.float32)
                T.Tensor((16,), T.float32, s)


# -- layouts and hints --------------------------------------------------------------------------------

def test_layout_fragment_and_hints_do_not_change_results():
    M = 32
    layout = T.Layout((M, M), lambda i, j: [j, i])
    assert layout.map(1, 2) == [2, 1]
    frag = T.Fragment((M, M), forward_thread_fn=lambda i, j: i % 32, forward_index_fn=lambda i, j: [j])
    assert frag.map(3, 4) == [4]

    @T.prim_func
    def k(A: T.Tensor((M, M), T.float32), B: T.Tensor((M, M), T.float32)):
        with T.Kernel(1, threads=128):
            s = T.alloc_shared((M, M), T.float32)
            f = T.alloc_fragment((M, M), T.float32)
            T.annotate_layout({s: layout, f: frag})
            T.disable_warp_group_reg_alloc()
            T.copy(A, s)
            T.copy(s, f)
            T.copy(f, B)

    a = np.random.default_rng(7).standard_normal((M, M)).astype(np.float32)
    on_targets(k, lambda kern: np.testing.assert_array_equal(kern(a), a), out_idx=[-1])


# -- dtypes: T.tfloat32, T.int4 ----------------------------------------------------------------------------

def test_tfloat32_is_float32_storage_and_gemm():
    M = 16

    @T.prim_func
    def k(A: T.Tensor((M, M), T.tfloat32), B: T.Tensor((M, M), T.float32), C: T.Tensor((M, M), T.float32)):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((M, M), dtype=T.tfloat32)
            b = T.alloc_fragment((M, M), dtype=T.tfloat32)
            c = T.alloc_fragment((M, M), T.float32)
            T.copy(A, a)
            T.copy(B, b)
            T.gemm(a, b, c, clear_accum=True)
            T.copy(c, C)

    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((M, M)).astype(np.float32), rng.standard_normal((M, M)).astype(np.float32)
    ref = a.astype(np.float64) @ b
    on_targets(k, lambda kern: np.testing.assert_allclose(kern(a, b), ref, rtol=1e-4, atol=1e-4), out_idx=[-1])


def test_int4_is_refused_with_the_feature_named():
    @T.prim_func
    def k(A: T.Tensor((16, 16), T.int4), B: T.Tensor((16, 16), T.int32)):
        with T.Kernel(1):
            for i, j in T.Parallel(16, 16):
                B[i, j] = A[i, j]

    for target in ("cpu", "webgpu"):
        with pytest.raises(UnsupportedFeatureError, match="int4") as e:
            tilecore.compile(k, target=target)
        assert e.value.feature == "dtype:int4:storage"


# -- T.alloc_barrier and the mbarrier calls, in program order ---------------------------------------------

def _pipeline(order_ok: bool):
    n, bk, steps = 16, 8, 4

    @T.prim_func
    def k(A: T.Tensor((steps * bk, n), T.float32), B: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=64):
            s = T.alloc_shared((2, bk, n), T.float32)
            acc = T.alloc_fragment((n,), T.float32)
            part = T.alloc_fragment((n,), T.float32)
            full = T.alloc_barrier([128] * 2)
            empty = T.alloc_barrier([128, 128])
            T.clear(acc)
            for ko in T.serial(steps):
                # producer: wait until the consumer freed the stage, fill it, arrive
                T.mbarrier_wait_parity(empty[ko % 2], ((ko // 2) & 1) ^ 1)
                T.copy(A[ko * bk, 0], s[ko % 2, :, :])
                T.mbarrier_arrive(full[ko % 2])
                if order_ok:  # consumer: wait for the data, use it, free the stage
                    T.barrier_wait(full[ko % 2], (ko // 2) & 1)
                    T.reduce_sum(s[ko % 2, :, :], part, dim=1)
                    for j in T.Parallel(n):
                        acc[j] += part[j]
                    T.barrier_arrive(empty[ko % 2])
            T.copy(acc, B)
    return k


def test_alloc_barrier_phases_in_program_order():
    a = np.random.default_rng(9).standard_normal((32, 16)).astype(np.float32)
    kern = tilecore.compile(_pipeline(True), target=CPU, out_idx=[-1], pass_configs=NOCACHE)
    np.testing.assert_allclose(kern(a), a.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    _cuda_compiles(_pipeline(True), out_idx=[-1])
    with pytest.raises(UnsupportedFeatureError, match="device_assert"):  # no way to report a stuck wait
        tilecore.compile(_pipeline(True), target="webgpu", out_idx=[-1])


def test_barrier_wait_that_cannot_complete_stops_the_kernel():
    """Without a consumer, the producer's third wait needs a phase nobody arrives at: a deadlock on a GPU,
    a KernelAssertionError here, never a silently overwritten stage."""
    kern = tilecore.compile(_pipeline(False), target=CPU, out_idx=[-1], pass_configs=NOCACHE)
    with pytest.raises(KernelAssertionError, match="T.barrier_wait on empty .* can never complete"):
        kern(np.zeros((32, 16), np.float32))


def test_barrier_calls_need_a_barrier():
    with pytest.raises(ParseError, match="the barrier must come from T.alloc_barrier"):
        @T.prim_func
        def k(A: T.Tensor((4,), T.int32)):
            with T.Kernel(1):
                T.barrier_arrive(A[0])


# -- refused with the feature named ------------------------------------------------------------------

@pytest.mark.parametrize("call", ["T.get_thread_binding()", "T.get_thread_binding(1)", "T.shfl_xor(x, 1)",
                                  "T.alloc_reducer(4, T.float32)", "T.tvm_thread_allreduce(x)"])
def test_thread_level_intrinsics_are_refused_at_the_line(tmp_path, call):
    name = call.split("(")[0].split(".")[1]
    src = tmp_path / "k.py"
    src.write_text(
        "import tilecore.language as T\n\n"
        "@T.prim_func\n"
        "def k(A: T.Tensor((4,), T.float32)):\n"
        "    with T.Kernel(1, threads=32):\n"
        "        x = A[0]\n"
        f"        t = {call}\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("k_thread_level", src)
    with pytest.raises(UnsupportedFeatureError) as e:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    msg = str(e.value)
    assert msg.startswith(f"{src}:7 in k: T.{name} is not supported") and "block-level" in msg, msg
    assert "T.Parallel" in msg or "T.reduce_sum" in msg
    assert e.value.feature == f"language:{name}"


# -- T.alloc_global --------------------------------------------------------------------------------

def _scratch_kernel(M=64, N=32, bm=16):
    """Phase 1 writes 2*A+1 into a T.alloc_global workspace; phase 2 reads it back and row-sums it."""
    @T.prim_func
    def k(A: T.Tensor((M, N), T.float32), B: T.Tensor((M,), T.float32)):
        W = T.alloc_global((M, N), T.float32)
        with T.Kernel(M // bm, threads=64) as bx:
            a = T.alloc_fragment((bm, N), T.float32)
            w = T.alloc_shared((bm, N), T.float32)
            s = T.alloc_fragment((bm,), T.float32)
            T.copy(A[bx * bm, 0], a)
            for i, j in T.Parallel(bm, N):
                a[i, j] = a[i, j] * 2 + 1
            T.copy(a, W[bx * bm, 0])
            T.copy(W[bx * bm:(bx + 1) * bm, :], w)
            T.reduce_sum(w, s, dim=1)
            T.copy(s, B[bx * bm])
    return k


def test_alloc_global_is_a_workspace_between_two_phases():
    a = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    want = (a.astype(np.float64) * 2 + 1).sum(axis=1)
    func = _scratch_kernel()
    assert [p.name for p in func.params] == ["A", "B", "W"] and func.params[-1].workspace
    assert "W: T.Workspace((64, 32,), 'float32')" in func.script()

    def check(k):
        assert [p["name"] for p in k.signature["params"]] == ["A", "B", "W"] and k.signature["params"][2]["workspace"]
        b = k(a)  # the workspace is neither passed nor returned
        np.testing.assert_allclose(np.asarray(b, dtype=np.float64), want, rtol=1e-5, atol=1e-4)
        b2 = k(a)  # a fresh workspace per call: the second call gives the same result
        np.testing.assert_allclose(np.asarray(b2, dtype=np.float64), want, rtol=1e-5, atol=1e-4)

    on_targets(func, check, out_idx=[-1])  # -1 is B: out_idx counts the declared parameters only


def test_alloc_global_between_two_launches_zero_filled_and_exported(tmp_path):
    """Flash-decoding's shape: launch 1 writes partial results into workspaces, launch 2 combines them; a
    workspace nobody writes reads as zeros. The kernel survives export / load_kernel."""
    n, parts = 32, 4

    @T.prim_func
    def k(A: T.Tensor((parts, n), T.float32), Out: T.Tensor((n,), T.float32)):
        partial = T.alloc_global((parts, n), T.float32)
        untouched = T.alloc_global((n,), T.float32)
        with T.Kernel(parts, threads=32) as p:
            for i in T.Parallel(n):
                partial[p, i] = A[p, i] * (p + 1)
        with T.Kernel(1, threads=32):
            acc = T.alloc_fragment((n,), T.float32)
            T.clear(acc)
            for q in T.serial(parts):
                for i in T.Parallel(n):
                    acc[i] += partial[q, i]
            for i in T.Parallel(n):
                Out[i] = acc[i] + untouched[i]

    a = np.random.default_rng(1).standard_normal((parts, n)).astype(np.float32)
    want = (a.astype(np.float64) * np.arange(1, parts + 1)[:, None]).sum(axis=0)
    kern = tilecore.compile(k, target=CPU, out_idx=[1], pass_configs=NOCACHE)
    np.testing.assert_allclose(kern(a), want, rtol=1e-5, atol=1e-5)
    loaded = tilecore.load_kernel(kern.export(tmp_path / "k.tck"))
    np.testing.assert_allclose(loaded(a), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loaded(torch.from_numpy(a)).double().numpy(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(tilecore.errors.ArgumentError, match="takes 1 argument"):
        kern(a, np.zeros(n, np.float32))


def test_alloc_global_named_apart_from_the_parameters():
    @T.prim_func
    def k(A: T.Tensor((8,), T.float32), B: T.Tensor((8,), T.float32)):
        A = T.alloc_global((8,), T.float32)  # noqa: F841 - shadows the parameter's name
        with T.Kernel(1, threads=8):
            for i in T.Parallel(8):
                B[i] = 1.0
    names = [p.name for p in k.params]
    assert names[:2] == ["A", "B"] and len(set(names)) == 3 and k.params[2].workspace


@tilecore.jit(target=CPU)
def _eager_with_workspace(A):
    N = T.const("N")
    A: T.Tensor((N,), T.float32)
    W = T.alloc_global((N,), T.float32)
    B = T.empty((N,), T.float32)
    with T.Kernel(1, threads=32):
        for i in T.Parallel(N):
            W[i] = A[i] * 2
        for i in T.Parallel(N):
            B[i] = W[i] + 1
    return B


def test_alloc_global_in_an_eager_kernel():
    a = torch.randn(16)
    b = _eager_with_workspace(a)  # only B comes back; W is the call's
    np.testing.assert_allclose(b.double().numpy(), a.double().numpy() * 2 + 1, rtol=1e-6)


# -- T.im2col (and its older name T.c2d_im2col) -------------------------------------------------------------

def _im2col_ref(img, K, S, D, P):
    """The unfolded image, float64: row (n, oh, ow), column (kh, kw, c) with c fastest."""
    x = torch.from_numpy(img).double().permute(0, 3, 1, 2)  # NCHW
    N, C = x.shape[:2]
    cols = torch.nn.functional.unfold(x, K, dilation=D, padding=P, stride=S)  # (N, C*K*K, L), c slowest
    cols = cols.view(N, C, K * K, -1).permute(0, 3, 2, 1).reshape(-1, K * K * C)
    return cols.numpy()


@pytest.mark.parametrize("name,N,H,W,C,K,S,D,P", [("im2col", 2, 9, 7, 4, 3, 2, 2, 2),
                                                  ("c2d_im2col", 1, 6, 5, 3, 2, 1, 1, 0)])
def test_im2col_unfolds_the_image_like_torch(name, N, H, W, C, K, S, D, P):
    OH, OW = (H + 2 * P - D * (K - 1) - 1) // S + 1, (W + 2 * P - D * (K - 1) - 1) // S + 1
    bm, bk = 16, 8  # N*OH*OW and K*K*C are not multiples: the last tiles run past the image
    rows, cols = T.ceildiv(N * OH * OW, bm) * bm, T.ceildiv(K * K * C, bk) * bk
    op = getattr(T, name)

    @T.prim_func
    def k(data: T.Tensor((N, H, W, C), T.float32), out: T.Tensor((rows, cols), T.float32)):
        with T.Kernel(cols // bk, rows // bm, threads=32) as (bx, by):
            tile = T.alloc_shared((2, bm, bk), T.float32)
            op(data, tile[1, :, :], by, bx, K, S, D, P)  # a slice of a bigger buffer as the destination
            T.copy(tile[1, :, :], out[by * bm, bx * bk])

    img = np.random.default_rng(3).standard_normal((N, H, W, C)).astype(np.float32)
    want = np.zeros((rows, cols))
    want[:N * OH * OW, :K * K * C] = _im2col_ref(img, K, S, D, P)

    def check(kern):
        got = np.full((rows, cols), np.nan, np.float32)
        kern(img, got)
        got[:, K * K * C:] = 0  # past the last kernel column: TileLang's im2col leaves what it reads there
        np.testing.assert_array_equal(got, want)

    on_targets(k, check)


def test_im2col_errors_name_the_problem():
    with pytest.raises(TileOpShapeError, match=r"test_tilelang_language.py:\d+ in k: T.im2col: the image is float16 but tile is float32"):
        @T.prim_func
        def k(data: T.Tensor((1, 4, 4, 2), T.float16)):
            with T.Kernel(1):
                tile = T.alloc_shared((8, 8), T.float32)
                T.im2col(data, tile, 0, 0, 3, 1, 1, 1)
    with pytest.raises(TileOpShapeError, match=r"T.im2col: the image must be a 4-D \(N, H, W, C\) tensor"):
        @T.prim_func
        def k2(data: T.Tensor((4, 4, 2), T.float32)):
            with T.Kernel(1):
                tile = T.alloc_shared((8, 8), T.float32)
                T.im2col(data, tile, 0, 0, 3, 1, 1, 1)
