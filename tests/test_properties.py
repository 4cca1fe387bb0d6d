"""Property tests (hypothesis) over shapes and dtypes: elementwise, reductions and GEMM on target "cpu".

Shapes are drawn as ``q * block + r``: most examples are not multiples of the block, so tails and
partial tiles are exercised. Kernels are dynamic in their shapes where the language allows it, so an
example usually reuses a compiled kernel; each new compile costs ~0.3 s, hence the small budgets.
"""
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilecore
import tilecore.language as T
from conftest import assert_close, nan_like, to_f64

SETTINGS = settings(max_examples=12, deadline=None, derandomize=False, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def dims(block, max_tiles=4):
    """A size with a partial last tile most of the time: q * block + r, r in [0, block)."""
    return st.builds(lambda q, r: max(1, q * block + r), st.integers(0, max_tiles), st.integers(0, block - 1))


def inputs(seed, shape, dtype, scale=1.0):
    data = np.random.default_rng(seed).standard_normal(shape) * scale
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(data).to(torch.bfloat16)
    return data.astype(dtype)


# -- elementwise: fused multiply-add with a cast, dynamic shapes ---------------------------------------

BM, BN = 8, 16


@tilecore.jit(target="cpu")
def fma_kernel(dtype, out_dtype):
    M, N = T.dynamic("m"), T.dynamic("n")

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), out_dtype),
             alpha: T.float32):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM)) as (bx, by):
            a = T.alloc_fragment((BM, BN), "float32")
            b = T.alloc_shared((BM, BN), dtype)
            c = T.alloc_fragment((BM, BN), out_dtype)
            T.copy(A[by * BM, bx * BN], a)
            T.copy(B[by * BM:(by + 1) * BM, bx * BN:(bx + 1) * BN], b)
            for i, j in T.Parallel(BM, BN):
                c[i, j] = a[i, j] * alpha + T.abs(b[i, j])
            T.copy(c, C[by * BM, bx * BN])

    return main


@SETTINGS
@given(M=dims(BM), N=dims(BN), dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
       out_dtype=st.sampled_from(["float32", "float16"]), alpha=st.floats(-4, 4, width=32),
       seed=st.integers(0, 2**32 - 1))
def test_elementwise_property(M, N, dtype, out_dtype, alpha, seed):
    kernel = fma_kernel(dtype, out_dtype)
    A, B = inputs(seed, (M, N), dtype), inputs(seed + 1, (M, N), dtype)
    C = nan_like((M, N), out_dtype, torch_tensor=dtype == "bfloat16")
    kernel(A, B, C, alpha)
    ref = to_f64(A) * alpha + np.abs(to_f64(B))
    tol = 1e-6 if out_dtype == "float32" else 1e-3
    assert_close(C, ref, tol, tol, what=f"{M}x{N} {dtype}->{out_dtype}")


# -- reductions along either dim of a ragged tile grid, sum and max ------------------------------------

@tilecore.jit(target="cpu")
def row_reduce_kernel(N, bm, dtype):
    """Per-row sum and max of X (M, N) for any M: one block per bm rows."""
    M = T.dynamic("m")

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), S: T.Tensor((M,), "float32"), Mx: T.Tensor((M,), "float32"),
             Amx: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, bm)) as bx:
            x = T.alloc_fragment((bm, N), "float32")
            s = T.alloc_fragment((bm,), "float32")
            m = T.alloc_fragment((bm,), "float32")
            a = T.alloc_fragment((bm,), "float32")
            T.copy(X[bx * bm, 0], x)
            T.reduce_sum(x, s, dim=1)
            T.reduce_max(x, m, dim=1)
            T.reduce_absmax(x, a, dim=1)
            T.copy(s, S[bx * bm])
            T.copy(m, Mx[bx * bm])
            T.copy(a, Amx[bx * bm])

    return main


@tilecore.jit(target="cpu")
def col_reduce_kernel(M, bn, dtype):
    """Per-column min and abssum of X (M, N) for any N, reducing dim 0 and accumulating (clear=False)."""
    N = T.dynamic("n")

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Mn: T.Tensor((N,), "float32"), As: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, bn)) as bx:
            x = T.alloc_fragment((M, bn), "float32")
            mn = T.alloc_fragment((bn,), "float32")
            asum = T.alloc_fragment((bn,), "float32")
            T.copy(X[0, bx * bn], x)
            T.fill(mn, T.max_value("float32"))
            T.fill(asum, 0)
            for half in T.serial(2):  # reduce each half of the rows, accumulating into the same outputs
                T.reduce_min(x[half * (M // 2):(half + 1) * (M // 2), :], mn, dim=0, clear=False)
                T.reduce_abssum(x[half * (M // 2):(half + 1) * (M // 2), :], asum, dim=0, clear=False)
            T.copy(mn, Mn[bx * bn])
            T.copy(asum, As[bx * bn])

    return main


@SETTINGS
@given(M=dims(8, 5), N=st.sampled_from([1, 7, 32]), dtype=st.sampled_from(["float32", "float16"]),
       seed=st.integers(0, 2**32 - 1))
def test_row_reduce_property(M, N, dtype, seed):
    kernel = row_reduce_kernel(N, 8, dtype)
    X = inputs(seed, (M, N), dtype, scale=3.0)
    S, Mx, Amx = (nan_like((M,), "float32") for _ in range(3))
    kernel(X, S, Mx, Amx)
    x = to_f64(X)
    assert_close(S, x.sum(1), 1e-5, 1e-5 * N, what="sum")
    assert_close(Mx, x.max(1), 0, 0, what="max")
    assert_close(Amx, np.abs(x).max(1), 0, 0, what="absmax")


@SETTINGS
@given(M=st.sampled_from([2, 6, 16]), N=dims(16, 4), dtype=st.sampled_from(["float32", "float16"]),
       seed=st.integers(0, 2**32 - 1))
def test_col_reduce_property(M, N, dtype, seed):
    kernel = col_reduce_kernel(M, 16, dtype)
    X = inputs(seed, (M, N), dtype, scale=3.0)
    Mn, As = nan_like((N,), "float32"), nan_like((N,), "float32")
    kernel(X, Mn, As)
    x = to_f64(X)
    assert_close(Mn, x.min(0), 0, 0, what="min")
    assert_close(As, np.abs(x).sum(0), 1e-5, 1e-5 * M, what="abssum")


# -- GEMM: dynamic M, N, K; every transpose; three input dtypes ------------------------------------------

@tilecore.jit(target="cpu")
def dyn_gemm(trans_A, trans_B, dtype, bm=32, bn=32, bk=16):
    M, N, K = T.dynamic("m"), T.dynamic("n"), T.dynamic("k")
    a_shape, b_shape = ((K, M) if trans_A else (M, K)), ((N, K) if trans_B else (K, N))

    @T.prim_func
    def main(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            A_s = T.alloc_shared((bk, bm) if trans_A else (bm, bk), dtype)
            B_s = T.alloc_shared((bn, bk) if trans_B else (bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
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


@settings(SETTINGS, max_examples=15)
@given(M=dims(32, 3), N=dims(32, 3), K=dims(16, 5), trans=st.sampled_from([(False, False), (False, True),
                                                                              (True, False), (True, True)]),
       dtype=st.sampled_from(["float16", "bfloat16", "float32"]), seed=st.integers(0, 2**32 - 1))
def test_gemm_property(M, N, K, trans, dtype, seed):
    ta, tb = trans
    kernel = dyn_gemm(ta, tb, dtype)
    A = inputs(seed, (K, M) if ta else (M, K), dtype)
    B = inputs(seed + 1, (N, K) if tb else (K, N), dtype)
    C = nan_like((M, N), "float32", torch_tensor=dtype == "bfloat16")
    kernel(A, B, C)
    a, b = to_f64(A), to_f64(B)
    ref = (a.T if ta else a) @ (b.T if tb else b)
    # inputs are exact in float64; the error is float32 accumulation over K
    assert_close(C, ref, 1e-5, 1e-5 * math.sqrt(K), what=f"{M}x{N}x{K} {trans} {dtype}")
