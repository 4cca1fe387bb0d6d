"""GEMM correctness on target "cpu": shapes (ragged ones included), transposes, dtypes, numpy and torch."""
import math

import numpy as np
import pytest
import torch

import tilecore
import tilecore.language as T
from conftest import TOL, assert_close, nan_like, randn, to_f64


# -- the README example, verbatim -----------------------------------------------------------------

@tilecore.jit(out_idx=[-1], target="cpu")
def matmul(M, N, K, bm, bn, bk, dtype=T.float16, accum=T.float32):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype); B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), accum)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, ko * bk], A_s); T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            for i, j in T.Parallel(bm, bn):
                C_l[i, j] = T.max(C_l[i, j], 0)
            T.copy(C_l, C[by * bm, bx * bn])
    return main


def _tol(dtype, K):
    r = TOL[str(dtype)]
    return r, r * math.sqrt(K)


@pytest.mark.parametrize("M,N,K", [(200, 256, 256), (128, 128, 64), (77, 45, 100)])
@pytest.mark.parametrize("use_torch", [False, True], ids=["numpy", "torch"])
def test_readme_gemm_relu(rng, M, N, K, use_torch):
    kernel = matmul(M, N, K, 64, 64, 32)
    A = randn(rng, (M, K), "float16", torch_tensor=use_torch)
    B = randn(rng, (K, N), "float16", torch_tensor=use_torch)
    C = kernel(A, B)
    assert type(C) is type(A), "outputs follow the inputs' array library"
    assert tuple(C.shape) == (M, N) and str(C.dtype).endswith("float16")
    ref = np.maximum(to_f64(A) @ to_f64(B), 0)
    assert_close(C, ref, *_tol("float16", K), what="gemm+relu")
    assert (to_f64(C) >= 0).all()


# -- a general GEMM: transposes, dtypes, output passed in (NaN-poisoned) ---------------------------

@tilecore.jit(target="cpu")
def gemm_kernel(M, N, K, bm, bn, bk, trans_A, trans_B, in_dtype, out_dtype, accum="float32", stages=2):
    a_shape = (K, M) if trans_A else (M, K)
    b_shape = (N, K) if trans_B else (K, N)
    a_tile = (bk, bm) if trans_A else (bm, bk)
    b_tile = (bn, bk) if trans_B else (bk, bn)

    @T.prim_func
    def main(A: T.Tensor(a_shape, in_dtype), B: T.Tensor(b_shape, in_dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            T.use_swizzle(panel_size=10)  # a hint: must not change results
            A_s = T.alloc_shared(a_tile, in_dtype)
            B_s = T.alloc_shared(b_tile, in_dtype)
            C_l = T.alloc_fragment((bm, bn), accum)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                if trans_A:
                    T.copy(A[ko * bk, by * bm], A_s)
                else:
                    T.copy(A[by * bm, ko * bk], A_s)
                if trans_B:
                    T.copy(B[bx * bn, ko * bk], B_s)
                else:
                    T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l, transpose_A=trans_A, transpose_B=trans_B)
            T.copy(C_l, C[by * bm, bx * bn])

    return main


def _run_gemm(rng, M, N, K, ta, tb, dtype, out_dtype=None, use_torch=False, blocks=(64, 64, 32)):
    out_dtype = out_dtype or dtype
    kernel = gemm_kernel(M, N, K, *blocks, ta, tb, dtype, out_dtype)
    A = randn(rng, (K, M) if ta else (M, K), dtype, torch_tensor=use_torch)
    B = randn(rng, (N, K) if tb else (K, N), dtype, torch_tensor=use_torch)
    C = nan_like((M, N), out_dtype, torch_tensor=use_torch or dtype == "bfloat16")
    assert kernel(A, B, C) is None
    a, b = to_f64(A), to_f64(B)
    ref = (a.T if ta else a) @ (b.T if tb else b)
    assert_close(C, ref, *_tol(out_dtype if TOL[out_dtype] > TOL[dtype] else dtype, K),
                 what=f"gemm {M}x{N}x{K} tA={ta} tB={tb} {dtype}->{out_dtype}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)],
                         ids=["NN", "NT", "TN", "TT"])
def test_gemm_transposes_dtypes(rng, ta, tb, dtype):
    # 150 x 97 x 83: no dim is a multiple of its block, and K leaves a partial last k-tile
    _run_gemm(rng, 150, 97, 83, ta, tb, dtype)


@pytest.mark.parametrize("M,N,K", [(64, 64, 32), (256, 128, 192), (1, 1, 1), (1, 200, 31), (130, 3, 257),
                                   (65, 129, 33)])
def test_gemm_shapes(rng, M, N, K):
    _run_gemm(rng, M, N, K, False, False, "float16")


@pytest.mark.parametrize("ta,tb", [(False, True), (True, False)], ids=["NT", "TN"])
def test_gemm_small_blocks_torch(rng, ta, tb):
    _run_gemm(rng, 70, 50, 45, ta, tb, "float16", use_torch=True, blocks=(16, 32, 16))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gemm_float32_output(rng, dtype):
    """Narrow inputs, float32 accumulation and float32 output: error is then only from accumulation."""
    _run_gemm(rng, 96, 80, 200, False, False, dtype, out_dtype="float32")


def test_gemm_numpy_and_torch_agree(rng):
    kernel = gemm_kernel(90, 70, 50, 64, 64, 32, False, True, "float32", "float32")
    A = rng.standard_normal((90, 50)).astype(np.float32)
    B = rng.standard_normal((70, 50)).astype(np.float32)
    Cn = nan_like((90, 70), "float32")
    Ct = nan_like((90, 70), "float32", torch_tensor=True)
    kernel(A, B, Cn)
    kernel(torch.from_numpy(A), torch.from_numpy(B), Ct)
    np.testing.assert_array_equal(Cn, Ct.numpy())
    assert_close(Cn, A.astype(np.float64) @ B.astype(np.float64).T, *_tol("float32", 50))


def test_gemm_runs_repeatedly_with_fresh_inputs(rng):
    """A compiled kernel keeps no state between calls (the accumulator is cleared per block)."""
    kernel = gemm_kernel(100, 60, 70, 32, 32, 32, False, False, "float32", "float32")
    for _ in range(3):
        A = randn(rng, (100, 70), "float32")
        B = randn(rng, (70, 60), "float32")
        C = nan_like((100, 60), "float32")
        kernel(A, B, C)
        assert_close(C, A.astype(np.float64) @ B.astype(np.float64), *_tol("float32", 70))


# -- gemm variants: clear_accum, dynamic M, fragments as the A operand -----------------------------

@tilecore.jit(target="cpu")
def gemm_clear_accum(N, K, bm, bn, bk):
    M = T.dynamic("m")

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            C_t = T.alloc_fragment((bm, bn), "float32")
            T.fill(C_l, 0)
            T.fill(C_t, 1e30)  # garbage that clear_accum must discard
            for ko in T.serial(T.ceildiv(K, bk)):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_t, clear_accum=True)   # this k-tile alone
                for i, j in T.Parallel(bm, bn):
                    C_l[i, j] += C_t[i, j]
            T.copy(C_l, C[by * bm, bx * bn])

    return main


@pytest.mark.parametrize("M", [1, 31, 32, 100])
def test_gemm_clear_accum_dynamic_m(rng, M):
    kernel = gemm_clear_accum(48, 72, 32, 32, 16)  # one kernel for every M
    A = randn(rng, (M, 72), "float16")
    B = randn(rng, (72, 48), "float16")
    C = nan_like((M, 48), "float32")
    kernel(A, B, C)
    assert_close(C, to_f64(A) @ to_f64(B), 1e-5, 1e-4, what=f"M={M}")


@tilecore.jit(target="cpu")
def two_gemms(M, N, K, P, bm):
    """D = (A @ B) @ E with the intermediate kept in a fragment and cast to float16 (P @ V style)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), E: T.Tensor((N, P), "float16"),
             D: T.Tensor((M, P), "float16")):
        with T.Kernel(T.ceildiv(M, bm)) as bx:
            A_s = T.alloc_shared((bm, K), "float16")
            B_s = T.alloc_shared((K, N), "float16")
            E_s = T.alloc_shared((N, P), "float16")
            S = T.alloc_fragment((bm, N), "float32")
            S16 = T.alloc_fragment((bm, N), "float16")
            O = T.alloc_fragment((bm, P), "float32")
            T.copy(A[bx * bm:(bx + 1) * bm, :], A_s)
            T.copy(B, B_s)
            T.copy(E, E_s)
            T.gemm(A_s, B_s, S, clear_accum=True)
            T.copy(S, S16)
            T.clear(O)
            T.gemm(S16, E_s, O)
            T.copy(O, D[bx * bm:(bx + 1) * bm, :])

    return main


def test_gemm_chain_through_fragment(rng):
    M, N, K, P = 45, 32, 24, 16
    kernel = two_gemms(M, N, K, P, 16)
    A, B, E = randn(rng, (M, K), "float16"), randn(rng, (K, N), "float16"), randn(rng, (N, P), "float16")
    D = nan_like((M, P), "float16")
    kernel(A, B, E, D)
    S16 = (to_f64(A) @ to_f64(B)).astype(np.float16).astype(np.float64)  # the kernel rounds S to fp16
    assert_close(D, S16 @ to_f64(E), 1e-2, 1e-2 * math.sqrt(K * N))
