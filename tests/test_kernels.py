"""Kernel correctness on target "cpu": the TileLang example kernels and every tile op, against float64.

Kernels are written as TileLang writes them; outputs are passed in filled with NaN (or a sentinel) so an
element the kernel forgets to write fails the comparison.
"""
import math

import numpy as np
import pytest
import torch

import tilecore
import tilecore.language as T
from tilecore.errors import KernelAssertionError
from conftest import assert_close, nan_like, poison, randn, to_f64

LOG2E = 1.44269504


# =================================================================================================
# softmax, RMSNorm, LayerNorm
# =================================================================================================

@tilecore.jit(target="cpu")
def softmax_kernel(M, N, blk_m, dtype="float32", accum="float32"):
    scale = LOG2E  # exp(x - m) == exp2(x * log2(e) - m * log2(e))

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            x_s = T.alloc_shared((blk_m, N), dtype)
            x = T.alloc_fragment((blk_m, N), accum)
            row_max = T.alloc_fragment((blk_m,), accum)
            row_sum = T.alloc_fragment((blk_m,), accum)
            T.copy(X[bx * blk_m, 0], x_s)
            T.copy(x_s, x)
            T.reduce_max(x, row_max, dim=1)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = T.exp2(x[i, j] * scale - row_max[i] * scale)
            T.reduce_sum(x, row_sum, dim=1)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = x[i, j] / row_sum[i]
            T.copy(x, Y[bx * blk_m, 0])

    return main


def _softmax_ref(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("M,N,blk_m,dtype", [(64, 128, 16, "float32"), (50, 77, 16, "float32"),
                                             (33, 96, 8, "float16")])
def test_softmax(rng, M, N, blk_m, dtype):
    kernel = softmax_kernel(M, N, blk_m, dtype)
    X = randn(rng, (M, N), dtype, scale=4.0)
    Y = nan_like((M, N), dtype)
    kernel(X, Y)
    tol = 1e-5 if dtype == "float32" else 2e-3
    ref = _softmax_ref(to_f64(X))
    assert_close(Y, ref, tol, tol * 0.1, what="softmax")
    np.testing.assert_allclose(to_f64(Y).sum(-1), 1.0, rtol=0, atol=tol * N)


@tilecore.jit(target="cpu")
def rms_norm_kernel(M, N, blk_m, eps, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            A_shared = T.alloc_shared((blk_m, N), dtype)
            A_local = T.alloc_fragment((blk_m, N), "float32")
            A_pow_local = T.alloc_fragment((blk_m, N), "float32")
            A_powsum = T.alloc_fragment((blk_m,), "float32")
            W_local = T.alloc_fragment((N,), "float32")
            T.copy(A[bx * blk_m:(bx + 1) * blk_m, :], A_shared)
            T.copy(A_shared, A_local)
            T.copy(W, W_local)
            for i, j in T.Parallel(blk_m, N):
                A_pow_local[i, j] = A_local[i, j] * A_local[i, j]
            T.reduce_sum(A_pow_local, A_powsum, dim=1)
            for i in T.Parallel(blk_m):
                A_powsum[i] = T.rsqrt(A_powsum[i] / N + eps)
            for i, j in T.Parallel(blk_m, N):
                A_local[i, j] *= A_powsum[i] * W_local[j]
            T.copy(A_local, B[bx * blk_m:(bx + 1) * blk_m, :])

    return main


@pytest.mark.parametrize("M,N,dtype", [(64, 96, "float32"), (37, 100, "float32"), (20, 64, "float16")])
def test_rms_norm(rng, M, N, dtype):
    eps = 1e-6
    kernel = rms_norm_kernel(M, N, 16, eps, dtype)
    A, W = randn(rng, (M, N), dtype), randn(rng, (N,), dtype)
    B = nan_like((M, N), dtype)
    kernel(A, W, B)
    a = to_f64(A)
    ref = a / np.sqrt((a * a).mean(-1, keepdims=True) + eps) * to_f64(W)
    tol = 1e-5 if dtype == "float32" else 2e-3
    assert_close(B, ref, tol, tol, what="rmsnorm")


@tilecore.jit(target="cpu")
def layer_norm_kernel(M, N, blk_m, eps):
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), G: T.Tensor((N,), "float32"), Bt: T.Tensor((N,), "float32"),
             Y: T.Tensor((M, N), "float32"), Mean: T.Tensor((M,), "float32"), Rstd: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, blk_m)) as bx:
            x = T.alloc_fragment((blk_m, N), "float32")
            xc = T.alloc_fragment((blk_m, N), "float32")
            mean = T.alloc_fragment((blk_m,), "float32")
            var = T.alloc_fragment((blk_m,), "float32")
            T.copy(X[bx * blk_m:(bx + 1) * blk_m, 0:N], x)
            T.reduce_sum(x, mean, dim=1)
            for i in T.Parallel(blk_m):
                mean[i] = mean[i] / N
            for i, j in T.Parallel(blk_m, N):
                xc[i, j] = (x[i, j] - mean[i]) * (x[i, j] - mean[i])
            T.reduce_sum(xc, var, dim=1)
            for i in T.Parallel(blk_m):
                var[i] = T.rsqrt(var[i] / N + eps)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = (x[i, j] - mean[i]) * var[i] * G[j] + Bt[j]
            T.copy(x, Y[bx * blk_m:(bx + 1) * blk_m, :])
            T.copy(mean, Mean[bx * blk_m:(bx + 1) * blk_m])
            T.copy(var, Rstd[bx * blk_m])

    return main


@pytest.mark.parametrize("M,N", [(32, 64), (45, 81)])
def test_layer_norm(rng, M, N):
    eps = 1e-5
    kernel = layer_norm_kernel(M, N, 8, eps)
    X = randn(rng, (M, N), "float32", scale=3.0) + 1.5
    G, Bt = randn(rng, (N,), "float32"), randn(rng, (N,), "float32")
    Y, Mean, Rstd = nan_like((M, N), "float32"), nan_like((M,), "float32"), nan_like((M,), "float32")
    kernel(X, G, Bt, Y, Mean, Rstd)
    x = to_f64(X)
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    assert_close(Mean, mu[:, 0], 1e-5, 1e-5, what="mean")
    assert_close(Rstd, rstd[:, 0], 1e-5, 1e-5, what="rstd")
    assert_close(Y, (x - mu) * rstd * to_f64(G) + to_f64(Bt), 1e-5, 1e-5, what="layernorm")


# =================================================================================================
# elementwise with dynamic shapes (one kernel per variant, many shapes)
# =================================================================================================

@tilecore.jit(target="cpu")
def add_dynamic_if(bm, bn, dtype="float32"):
    M, N = T.dynamic("m"), T.symbolic("n")

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Buffer((M, N), dtype), C: T.Tensor[(M, N), dtype]):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            for i, j in T.Parallel(bm, bn):
                r = by * bm + i
                c = bx * bn + j
                if r < M and c < N:
                    C[r, c] = A[r, c] * 2 + B[r, c]

    return main


@tilecore.jit(target="cpu")
def add_dynamic_tiles(bm, bn, dtype="float16"):
    M, N = T.dynamic("m"), T.dynamic("n")

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            a = T.alloc_fragment((bm, bn), "float32")
            b = T.alloc_fragment((bm, bn), dtype)
            T.copy(A[by * bm, bx * bn], a)
            T.copy(B[by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn], b)
            for i, j in T.Parallel(bm, bn):
                a[i, j] = T.max(a[i, j], b[i, j]) - T.min(a[i, j], 0)
            T.copy(a, C[by * bm, bx * bn])

    return main


DYN_SHAPES = [(1, 1), (1, 37), (37, 1), (16, 32), (33, 65), (100, 200), (128, 31), (0, 5), (3, 0)]


@pytest.mark.parametrize("M,N", DYN_SHAPES)
def test_elementwise_dynamic_if(rng, M, N):
    kernel = add_dynamic_if(16, 32)
    A, B = randn(rng, (M, N), "float32"), randn(rng, (M, N), "float32")
    C = nan_like((M, N), "float32")
    kernel(A, B, C)
    assert_close(C, 2 * to_f64(A) + to_f64(B), 1e-6, 1e-6)


@pytest.mark.parametrize("M,N", DYN_SHAPES)
@pytest.mark.parametrize("use_torch", [False, True], ids=["numpy", "torch"])
def test_elementwise_dynamic_tiles(rng, M, N, use_torch):
    kernel = add_dynamic_tiles(16, 32)
    A = randn(rng, (M, N), "float16", torch_tensor=use_torch)
    B = randn(rng, (M, N), "float16", torch_tensor=use_torch)
    C = nan_like((M, N), "float16", torch_tensor=use_torch)
    kernel(A, B, C)
    a, b = to_f64(A), to_f64(B)
    assert_close(C, np.maximum(a, b) - np.minimum(a, 0), 1e-3, 1e-3)


def test_dynamic_output_allocated_from_symbols(rng):
    """out_idx outputs with symbolic dims take their sizes from the inputs."""

    m = T.dynamic("m")

    @T.prim_func
    def scale2(A: T.Tensor((m, 8), "float32"), B: T.Tensor((m, 8), "float32")):
        with T.Kernel(1) as bx:
            for i, j in T.Parallel(B.shape[0], 8):
                B[i, j] = A[i, j] * 3

    kernel = tilecore.compile(scale2, target="cpu", out_idx=[1])
    for m in (1, 5, 17):
        A = randn(rng, (m, 8), "float32")
        B = kernel(A)
        assert B.shape == (m, 8)
        assert_close(B, 3 * to_f64(A), 1e-6, 1e-6)


# =================================================================================================
# FlashAttention forward, as TileLang writes it
# =================================================================================================

@tilecore.jit(target="cpu")
def flashattn(batch, heads, seq_len, dim, is_causal, block_M, block_N, mask_tail=False):
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
    shape = [batch, seq_len, heads, dim]
    dtype = "float16"
    accum_dtype = "float"

    @T.macro
    def MMA0(K, Q_shared, K_shared, acc_s, k, bx, by, bz):
        T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_shared)
        if is_causal:
            for i, j in T.Parallel(block_M, block_N):
                acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0, -T.infinity(acc_s.dtype))
        elif mask_tail:
            for i, j in T.Parallel(block_M, block_N):
                acc_s[i, j] = T.if_then_else(k * block_N + j < seq_len, 0, -T.infinity(acc_s.dtype))
        else:
            T.clear(acc_s)
        T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def MMA1(V, V_shared, acc_s_cast, acc_o, k, by, bz):
        T.copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_shared)
        T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def Softmax(acc_s, acc_s_cast, scores_max, scores_max_prev, scores_scale, scores_sum, logsum):
        T.copy(scores_max, scores_max_prev)
        T.fill(scores_max, -T.infinity(accum_dtype))
        T.reduce_max(acc_s, scores_max, dim=1, clear=False)
        for i in T.Parallel(block_M):
            scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
        for i in T.Parallel(block_M):
            scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
        for i, j in T.Parallel(block_M, block_N):
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
        T.reduce_sum(acc_s, scores_sum, dim=1)
        for i in T.Parallel(block_M):
            logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
        T.copy(acc_s, acc_s_cast)

    @T.macro
    def Rescale(acc_o, scores_scale):
        for i, j in T.Parallel(block_M, dim):
            acc_o[i, j] *= scores_scale[i]

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
             Output: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=128) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)

            T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            loop_range = (
                T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N))
                if is_causal else T.ceildiv(seq_len, block_N))

            for k in T.Pipelined(loop_range, num_stages=1):
                MMA0(K, Q_shared, K_shared, acc_s, k, bx, by, bz)
                Softmax(acc_s, acc_s_cast, scores_max, scores_max_prev, scores_scale, scores_sum, logsum)
                Rescale(acc_o, scores_scale)
                MMA1(V, V_shared, acc_s_cast, acc_o, k, by, bz)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M:(bx + 1) * block_M, by, :])

    return main


def _attention_ref(q, k, v, causal):
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # b h s d
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("batch,heads,seq_len,dim,block_M,block_N", [(1, 2, 64, 32, 32, 32),
                                                                     (2, 1, 128, 16, 32, 16)])
def test_flash_attention_fwd(rng, causal, batch, heads, seq_len, dim, block_M, block_N):
    kernel = flashattn(batch, heads, seq_len, dim, causal, block_M, block_N)
    use_torch = causal  # both array libraries
    shape = (batch, seq_len, heads, dim)
    Q, K, V = (randn(rng, shape, "float16", torch_tensor=use_torch) for _ in range(3))
    O = nan_like(shape, "float16", torch_tensor=use_torch)
    kernel(Q, K, V, O)
    ref = _attention_ref(to_f64(Q), to_f64(K), to_f64(V), causal)
    assert_close(O, ref, 1e-2, 1e-2, what=f"flash attention causal={causal}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attention_ragged_seq(rng, causal):
    """seq_len not a multiple of either block: the tail keys are masked, the tail rows not stored."""
    batch, heads, seq_len, dim = 1, 2, 70, 16
    kernel = flashattn(batch, heads, seq_len, dim, causal, 32, 16, mask_tail=True)
    shape = (batch, seq_len, heads, dim)
    Q, K, V = (randn(rng, shape, "float16") for _ in range(3))
    O = nan_like(shape, "float16")
    kernel(Q, K, V, O)
    assert_close(O, _attention_ref(to_f64(Q), to_f64(K), to_f64(V), causal), 1e-2, 1e-2)


# =================================================================================================
# atomics
# =================================================================================================

@tilecore.jit(target="cpu")
def scatter_atomics(n, bins, blk, dtype):
    @T.prim_func
    def main(Idx: T.Tensor((n,), "int32"), X: T.Tensor((n,), dtype), Sum: T.Tensor((bins,), dtype),
             Max: T.Tensor((bins,), dtype), Min: T.Tensor((bins,), dtype)):
        with T.Kernel(T.ceildiv(n, blk)) as bx:
            for i in T.Parallel(blk):
                g = bx * blk + i
                if g < n:
                    T.atomic_add(Sum[Idx[g]], X[g])
                    T.atomic_max(Max[Idx[g]], X[g])
                    T.atomic_min(Min[Idx[g]], X[g])

    return main


@pytest.mark.parametrize("dtype", ["float32", "int32", "float64"])
def test_atomic_point_forms(rng, dtype):
    n, bins = 1000, 7
    kernel = scatter_atomics(n, bins, 64, dtype)  # 16 blocks contend for 7 bins
    idx = rng.integers(0, bins, n).astype(np.int32)
    if dtype == "int32":
        x = rng.integers(-50, 50, n).astype(np.int32)
        lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    else:
        x = rng.standard_normal(n).astype(dtype)
        lo, hi = -np.inf, np.inf
    S = np.zeros(bins, dtype)
    Mx = np.full(bins, lo, dtype)
    Mn = np.full(bins, hi, dtype)
    kernel(idx, x, S, Mx, Mn)
    xs = x.astype(np.float64)
    for b in range(bins):
        sel = xs[idx == b]
        tol = 1e-4 if dtype == "float32" else 1e-10
        assert abs(S[b] - sel.sum()) <= tol * (1 + np.abs(sel).sum()), b
        assert Mx[b] == sel.max() and Mn[b] == sel.min(), b


@tilecore.jit(target="cpu")
def atomic_region_kernel(M, N, bm, bn):
    """Out[r, c] op= X[g * bm + r, c] over the row tiles g: the region forms, with ragged tiles."""

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Sum: T.Tensor((bm, N), "float32"), Max: T.Tensor((bm, N), "float32"),
             Min: T.Tensor((bm, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            tile = T.alloc_fragment((bm, bn), "float32")
            T.copy(X[by * bm, bx * bn], tile)
            T.atomic_add(Sum[0:bm, bx * bn:(bx + 1) * bn], tile)
            T.atomic_max(Max[:, bx * bn:(bx + 1) * bn], tile)
            T.atomic_min(Min[0:bm, bx * bn:bx * bn + bn], tile[0:bm, 0:bn])

    return main


def test_atomic_region_forms(rng):
    M, N, bm, bn = 8 * 6, 50, 8, 16  # N ragged: the last column tile is partial
    kernel = atomic_region_kernel(M, N, bm, bn)
    X = randn(rng, (M, N), "float32")
    S = np.zeros((bm, N), np.float32)
    Mx = np.full((bm, N), -np.inf, np.float32)
    Mn = np.full((bm, N), np.inf, np.float32)
    kernel(X, S, Mx, Mn)
    tiles = to_f64(X).reshape(M // bm, bm, N)
    assert_close(S, tiles.sum(0), 1e-5, 1e-5, what="atomic_add region")
    np.testing.assert_array_equal(Mx, tiles.max(0))
    np.testing.assert_array_equal(Mn, tiles.min(0))


def test_atomic_region_ragged_rows(rng):
    """M not a multiple of bm: the zero-padded tail rows of the last tile still add (zeros) to Sum."""
    M, N, bm, bn = 20, 16, 8, 16
    kernel = atomic_region_kernel(M, N, bm, bn)
    X = randn(rng, (M, N), "float32")
    S = np.zeros((bm, N), np.float32)
    Mx = np.full((bm, N), -np.inf, np.float32)
    Mn = np.full((bm, N), np.inf, np.float32)
    kernel(X, S, Mx, Mn)
    padded = np.zeros((24, N))
    padded[:M] = to_f64(X)
    tiles = padded.reshape(3, bm, N)
    assert_close(S, tiles.sum(0), 1e-5, 1e-5)
    np.testing.assert_array_equal(Mx, tiles.max(0))
    np.testing.assert_array_equal(Mn, tiles.min(0))


# =================================================================================================
# cumsum
# =================================================================================================

@tilecore.jit(target="cpu")
def cumsum_kernel(M, N, bm, bn, dim, reverse, inplace):
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            src = T.alloc_shared((bm, bn), "float32")
            dst = T.alloc_fragment((bm, bn), "float32")
            T.copy(X[by * bm, bx * bn], src)
            if inplace:
                T.cumsum(src, dim=dim, reverse=reverse)
                T.copy(src, Y[by * bm, bx * bn])
            else:
                T.cumsum(src, dst, dim=dim, reverse=reverse)
                T.copy(dst, Y[by * bm, bx * bn])

    return main


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("inplace", [False, True], ids=["dst", "inplace"])
def test_cumsum(rng, dim, reverse, inplace):
    M, N, bm, bn = 24, 40, 8, 20
    kernel = cumsum_kernel(M, N, bm, bn, dim, reverse, inplace)
    X = randn(rng, (M, N), "float32")
    Y = nan_like((M, N), "float32")
    kernel(X, Y)
    tiles = to_f64(X).reshape(M // bm, bm, N // bn, bn).transpose(0, 2, 1, 3)  # (ti, tj, bm, bn)
    ax = 2 + (dim % 2)
    if reverse:
        ref = np.flip(np.cumsum(np.flip(tiles, ax), ax), ax)
    else:
        ref = np.cumsum(tiles, ax)
    ref = ref.transpose(0, 2, 1, 3).reshape(M, N)
    assert_close(Y, ref, 1e-5, 1e-5, what=f"cumsum dim={dim} reverse={reverse}")


@tilecore.jit(target="cpu")
def cumsum_1d(n):
    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32"), Z: T.Tensor((n,), "float32")):
        with T.Kernel(1) as bx:
            a = T.alloc_fragment((n,), "float32")
            b = T.alloc_fragment((n,), "float32")
            T.copy(X, a)
            T.cumsum(a, b)
            T.copy(b, Y)
            T.cumsum(a, b, dim=0, reverse=True)
            T.copy(b, Z)

    return main


@tilecore.jit(target="cpu")
def cumsum_row_into_1d(M, N):
    """dim counts the source's dims; the destination is 1-D (its unit dim dropped)."""
    rows = list(range(M))

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32"), Z: T.Tensor((N,), "float32")):
        with T.Kernel(1) as bx:
            x = T.alloc_fragment((M, N), "float32")
            row = T.alloc_fragment((N,), "float32")
            T.copy(X, x)
            for r in rows:  # a Python list: unrolled while building, so r is a Python int
                T.cumsum(x[r, :], row, dim=1, reverse=r % 2 == 1)
                T.copy(row, Y[r, :])
            T.cumsum(x[M - 1:M, 0:N], Z, dim=1)

    return main


def test_cumsum_row_into_1d(rng):
    M, N = 3, 12
    kernel = cumsum_row_into_1d(M, N)
    X = randn(rng, (M, N), "float32")
    Y, Z = nan_like((M, N), "float32"), nan_like((N,), "float32")
    kernel(X, Y, Z)
    x = to_f64(X)
    ref = np.stack([np.cumsum(x[r]) if r % 2 == 0 else np.cumsum(x[r, ::-1])[::-1] for r in range(M)])
    assert_close(Y, ref, 1e-5, 1e-5)
    assert_close(Z, np.cumsum(x[M - 1]), 1e-5, 1e-5)


def test_cumsum_1d(rng):
    kernel = cumsum_1d(33)
    X = randn(rng, (33,), "float32")
    Y, Z = nan_like((33,), "float32"), nan_like((33,), "float32")
    kernel(X, Y, Z)
    x = to_f64(X)
    assert_close(Y, np.cumsum(x), 1e-5, 1e-5)
    assert_close(Z, np.cumsum(x[::-1])[::-1], 1e-5, 1e-5)


# =================================================================================================
# reductions: every kind, dim 0 and 1, clear True and False
# =================================================================================================

KINDS = ["sum", "max", "min", "abssum", "absmax"]


@tilecore.jit(target="cpu")
def reduce_kernel(kind, M, N, dim, clear, bm):
    red = getattr(T, f"reduce_{kind}")
    out_len = N if dim == 0 else M

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Init: T.Tensor((out_len,), "float32"),
             Out: T.Tensor((out_len,), "float32")):
        with T.Kernel(1) as bx:
            x = T.alloc_fragment((M, N), "float32")
            o = T.alloc_fragment((out_len,), "float32")
            T.copy(X, x)
            T.copy(Init, o)
            red(x, o, dim=dim, clear=clear)
            T.copy(o, Out)

    return main


def _reduce_ref(kind, x, init, dim, clear):
    f = {"sum": lambda a: a.sum(dim), "max": lambda a: a.max(dim), "min": lambda a: a.min(dim),
         "abssum": lambda a: np.abs(a).sum(dim), "absmax": lambda a: np.abs(a).max(dim)}[kind]
    r = f(x)
    if clear:
        return r
    if kind in ("sum", "abssum"):
        return init + r
    return np.maximum(init, r) if kind in ("max", "absmax") else np.minimum(init, r)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("clear", [True, False], ids=["clear", "accumulate"])
def test_reduce(rng, kind, dim, clear):
    M, N = 13, 24
    kernel = reduce_kernel(kind, M, N, dim, clear, 8)
    X = randn(rng, (M, N), "float32")
    out_len = N if dim == 0 else M
    # the initial values win for some outputs and lose for others when accumulating
    Init = randn(rng, (out_len,), "float32", scale=2.0)
    Out = nan_like((out_len,), "float32")
    kernel(X, Init, Out)
    assert_close(Out, _reduce_ref(kind, to_f64(X), to_f64(Init), dim, clear), 1e-5, 1e-5,
                 what=f"reduce_{kind} dim={dim} clear={clear}")


@tilecore.jit(target="cpu")
def reduce_tiled_rows(M, N, bm, dtype):
    """Row reductions of a ragged tile grid, into outputs in the source's dtype, using dim=-1."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), S: T.Tensor((M,), "float32"), Mx: T.Tensor((M,), dtype)):
        with T.Kernel(T.ceildiv(M, bm)) as bx:
            x = T.alloc_shared((bm, N), dtype)
            s = T.alloc_fragment((bm,), "float32")
            m = T.alloc_fragment((bm,), dtype)
            T.copy(X[bx * bm, 0], x)
            T.reduce_sum(x, s)
            T.reduce_max(x, m, dim=-1)
            T.copy(s, S[bx * bm])
            T.copy(m, Mx[bx * bm])

    return main


@pytest.mark.parametrize("dtype", ["float16", "int32"])
def test_reduce_tiled_dtypes(rng, dtype):
    M, N = 45, 30
    kernel = reduce_tiled_rows(M, N, 16, dtype)
    if dtype == "int32":
        X = rng.integers(-1000, 1000, (M, N)).astype(np.int32)
    else:
        X = randn(rng, (M, N), dtype)
    S, Mx = nan_like((M,), "float32"), poison(np.empty((M,), dtype))
    kernel(X, S, Mx)
    x = to_f64(X)
    assert_close(S, x.sum(1), 1e-5, 1e-4)
    np.testing.assert_array_equal(to_f64(Mx), x.max(1))


# =================================================================================================
# copies, fill, clear
# =================================================================================================

@tilecore.jit(target="cpu")
def copy_kernel(M, N, bm, bn):
    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float16"),
             D: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            s = T.alloc_shared((bm, bn), "float32")
            f = T.alloc_fragment((bm, bn), "float16")
            # slice -> shared, shared -> point start (ragged tails on both sides)
            T.copy(A[by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn], s)
            T.copy(s, B[by * bm, bx * bn])
            # point start -> fragment with a cast, fragment -> slice
            T.copy(A[by * bm, bx * bn], f)
            T.copy(f, C[by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn])
            # global -> global, slices on both sides
            T.copy(A[by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn], D[by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn])

    return main


@pytest.mark.parametrize("M,N", [(32, 64), (30, 50), (1, 5), (17, 16)])
def test_copy_tiles(rng, M, N):
    kernel = copy_kernel(M, N, 8, 16)
    A = randn(rng, (M, N), "float32")
    B, C, D = nan_like((M, N), "float32"), nan_like((M, N), "float16"), nan_like((M, N), "float32")
    kernel(A, B, C, D)
    np.testing.assert_array_equal(B, A)
    np.testing.assert_array_equal(C, A.astype(np.float16))
    np.testing.assert_array_equal(D, A)


@tilecore.jit(target="cpu")
def copy_windows(M, N):
    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), W: T.Tensor((4, 3), "float32"), R: T.Tensor((N,), "float32"),
             Col: T.Tensor((M,), "float32"), Whole: T.Tensor((M, N), "float32"), P: T.Tensor((M + 2, N + 2), "float32")):
        with T.Kernel(1) as bx:
            buf = T.alloc_shared((M, N), "float32")
            row = T.alloc_fragment((N,), "float32")
            T.copy(A[2:6, 1:4], W)             # a window into a whole buffer
            T.copy(A[M - 1, :], row)            # one row (unit dim) into a 1-D fragment
            T.copy(row, R)
            T.copy(A[:, N - 2], Col)            # one column
            T.copy(A, buf)                      # whole buffers
            T.copy(buf, Whole)
            T.fill(P, -1.0)                     # fill a whole global buffer, then copy into its interior
            T.copy(buf, P[1:M + 1, 1:N + 1])

    return main


def test_copy_windows_rows_columns_whole(rng):
    M, N = 9, 7
    kernel = copy_windows(M, N)
    A = randn(rng, (M, N), "float32")
    W, R, Col = nan_like((4, 3), "float32"), nan_like((N,), "float32"), nan_like((M,), "float32")
    Whole, P = nan_like((M, N), "float32"), nan_like((M + 2, N + 2), "float32")
    kernel(A, W, R, Col, Whole, P)
    np.testing.assert_array_equal(W, A[2:6, 1:4])
    np.testing.assert_array_equal(R, A[M - 1])
    np.testing.assert_array_equal(Col, A[:, N - 2])
    np.testing.assert_array_equal(Whole, A)
    ref = np.full((M + 2, N + 2), -1.0, np.float32)
    ref[1:-1, 1:-1] = A
    np.testing.assert_array_equal(P, ref)


@tilecore.jit(target="cpu")
def fill_kernel(M, N, bm, bn):
    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "int32"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            f = T.alloc_fragment((bm, bn), "float16")
            T.fill(A[by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn], 2.5)   # ragged region of a global
            T.fill(B[by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn], bx * 100 + by)
            T.clear(f)
            f[0, 0] = 7
            T.copy(f, C[by * bm, bx * bn])
            if bx == 0 and by == 0:
                T.fill(A[0, 0], -3.0)                                       # a point

    return main


def test_fill_clear(rng):
    M, N, bm, bn = 21, 35, 8, 16
    kernel = fill_kernel(M, N, bm, bn)
    A, B, C = nan_like((M, N), "float32"), poison(np.empty((M, N), np.int32)), nan_like((M, N), "float16")
    kernel(A, B, C)
    refA = np.full((M, N), 2.5)
    refA[0, 0] = -3.0
    np.testing.assert_array_equal(A, refA)
    rows, cols = np.indices((M, N))
    np.testing.assert_array_equal(B, (cols // bn) * 100 + rows // bm)
    refC = np.where((rows % bm == 0) & (cols % bn == 0), 7.0, 0.0)
    np.testing.assert_array_equal(C, refC)


# =================================================================================================
# math functions, casts, select
# =================================================================================================

UNARY = {
    "exp": (np.exp, (-5, 5)), "exp2": (np.exp2, (-5, 5)), "log": (np.log, (0.01, 10)),
    "log2": (np.log2, (0.01, 10)), "sqrt": (np.sqrt, (0, 10)), "rsqrt": (lambda x: 1 / np.sqrt(x), (0.01, 10)),
    "abs": (np.abs, (-5, 5)), "tanh": (np.tanh, (-5, 5)), "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-8, 8)),
    "sin": (np.sin, (-4, 4)), "cos": (np.cos, (-4, 4)), "floor": (np.floor, (-5, 5)), "ceil": (np.ceil, (-5, 5)),
    "exp10": (lambda x: 10.0 ** x, (-3, 3)), "log10": (np.log10, (0.01, 10)),
}


@tilecore.jit(target="cpu")
def unary_kernel(fn_name, n, blk, dtype):
    fn = getattr(T, fn_name)

    @T.prim_func
    def main(X: T.Tensor((n,), dtype), Y: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, blk)) as bx:
            for i in T.Parallel(blk):
                if bx * blk + i < n:
                    Y[bx * blk + i] = fn(X[bx * blk + i])

    return main


@pytest.mark.parametrize("fn_name,dtype", [(f, "float32") for f in sorted(UNARY)] +
                         [(f, "float64") for f in ("exp", "exp2", "log", "rsqrt", "tanh", "sqrt")])
def test_unary_math(rng, fn_name, dtype):
    ref_fn, (lo, hi) = UNARY[fn_name]
    n = 300
    kernel = unary_kernel(fn_name, n, 128, dtype)
    X = rng.uniform(lo, hi, n).astype(dtype)
    Y = nan_like((n,), dtype)
    kernel(X, Y)
    tol = 2e-6 if dtype == "float32" else 1e-13
    assert_close(Y, ref_fn(X.astype(np.float64)), tol, tol, what=f"T.{fn_name} {dtype}")


@tilecore.jit(target="cpu")
def binary_math_kernel(n):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"), Mx: T.Tensor((n,), "float32"),
             Mn: T.Tensor((n,), "float32"), Sel: T.Tensor((n,), "float32"), Pw: T.Tensor((n,), "float32"),
             Ai: T.Tensor((n,), "int32"), Ia: T.Tensor((n,), "int32"), H: T.Tensor((n,), "float16"),
             F: T.Tensor((n,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(n):
                Mx[i] = T.max(A[i], B[i])
                Mn[i] = T.min(A[i], B[i])
                Sel[i] = T.if_then_else(A[i] > B[i], A[i] - B[i], B[i] * 2)
                Pw[i] = T.pow(T.abs(A[i]), 1.5)
                Ai[i] = T.cast(A[i] * 10, "int32")          # truncation toward zero
                Ia[i] = T.abs(T.cast(B[i] * 10, "int32"))   # integer abs
                H[i] = T.cast(A[i] * 1000, T.float16)        # round to nearest even, overflow to inf
                F[i] = T.float32(Ai[i]) / 4                  # int -> float

    return main


def test_binary_math_select_casts(rng):
    n = 64
    kernel = binary_math_kernel(n)
    A = (rng.standard_normal(n) * 80).astype(np.float32)
    B = rng.standard_normal(n).astype(np.float32)
    outs = [nan_like((n,), "float32") for _ in range(4)] + [poison(np.empty(n, np.int32)) for _ in range(2)] + \
        [nan_like((n,), "float16"), nan_like((n,), "float32")]
    kernel(A, B, *outs)
    Mx, Mn, Sel, Pw, Ai, Ia, H, F = outs
    a, b = A.astype(np.float64), B.astype(np.float64)
    np.testing.assert_array_equal(Mx, np.maximum(A, B))
    np.testing.assert_array_equal(Mn, np.minimum(A, B))
    assert_close(Sel, np.where(a > b, a - b, b * 2), 1e-6, 1e-6)
    assert_close(Pw, np.abs(a) ** 1.5, 1e-5, 1e-5)
    np.testing.assert_array_equal(Ai, np.trunc(A * np.float32(10)).astype(np.int32))
    np.testing.assert_array_equal(Ia, np.abs(np.trunc(B * np.float32(10)).astype(np.int32)))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(H, (A * np.float32(1000)).astype(np.float16))
    np.testing.assert_array_equal(F, np.trunc(A * np.float32(10)).astype(np.int32) / np.float32(4))


@tilecore.jit(target="cpu")
def bf16_cast_kernel(n):
    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "bfloat16"), Z: T.Tensor((n,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(n):
                Y[i] = X[i]
                Z[i] = T.cast(T.cast(X[i], "bfloat16"), "float32") + 0

    return main


def test_bfloat16_casts(rng):
    n = 257
    kernel = bf16_cast_kernel(n)
    X = torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 100)
    Y, Z = nan_like((n,), "bfloat16"), nan_like((n,), "float32", torch_tensor=True)
    kernel(X, Y, Z)
    assert torch.equal(Y, X.to(torch.bfloat16))
    assert torch.equal(Z, X.to(torch.bfloat16).to(torch.float32))


# =================================================================================================
# T.alloc_var, symbolic if, T.macro, scalar parameters
# =================================================================================================

@tilecore.jit(target="cpu")
def var_accumulator(M, N):
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), RowSum: T.Tensor((M,), "float32"), Count: T.Tensor((1,), "int32")):
        with T.Kernel(M) as row:
            acc = T.alloc_var("float32")
            npos = T.alloc_var(T.int32, init=0)
            acc = 0
            for k in T.serial(N):
                acc += X[row, k]
                if X[row, k] > 0:
                    npos += 1
            RowSum[row] = acc
            T.atomic_add(Count[0], npos)

    return main


def test_alloc_var_accumulators(rng):
    M, N = 19, 23
    kernel = var_accumulator(M, N)
    X = randn(rng, (M, N), "float32")
    S = nan_like((M,), "float32")
    C = np.zeros((1,), np.int32)
    kernel(X, S, C)
    assert_close(S, to_f64(X).sum(1), 1e-5, 1e-5)
    assert C[0] == (X > 0).sum()


@T.macro
def _axpy_tile(alpha, x, y, n):
    """Module-level macro: y = alpha * x + y on a tile; returns the alpha it used."""
    for i in T.Parallel(n):
        y[i] = alpha * x[i] + y[i]
    return alpha


@tilecore.jit(target="cpu")
def branchy_kernel(n, blk):
    @T.macro
    def store_tile(dst, src, base):
        for i in T.Parallel(blk):
            if base + i < n:
                dst[base + i] = src[i]

    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32"), alpha: T.float32, limit: T.int32):
        with T.Kernel(T.ceildiv(n, blk)) as bx:
            x = T.alloc_fragment((blk,), "float32")
            y = T.alloc_fragment((blk,), "float32")
            T.copy(X[bx * blk:(bx + 1) * blk], x)
            if bx % 2 == 0:                   # a symbolic branch on the block index
                T.clear(y)
                used = _axpy_tile(alpha, x, y, blk)
                for i in T.Parallel(blk):
                    y[i] = y[i] + used * 0
            else:
                for i in T.Parallel(blk):
                    y[i] = -x[i]
            for i in T.Parallel(blk):
                if bx * blk + i >= limit:     # a symbolic branch on a scalar parameter
                    y[i] = 1000.0
            store_tile(Y, y, bx * blk)

    return main


@pytest.mark.parametrize("alpha,limit", [(2.0, 1000), (-0.5, 37), (3, 0)])
def test_symbolic_if_macro_scalar_params(rng, alpha, limit):
    n, blk = 90, 16
    kernel = branchy_kernel(n, blk)
    X = randn(rng, (n,), "float32")
    Y = nan_like((n,), "float32")
    kernel(X, Y, alpha, limit)
    x = to_f64(X)
    blocks = np.arange(n) // blk
    ref = np.where(blocks % 2 == 0, np.float32(alpha) * x, -x)
    ref = np.where(np.arange(n) >= limit, 1000.0, ref)
    assert_close(Y, ref, 1e-6, 1e-6)


def test_scalar_param_types_checked(rng):
    kernel = branchy_kernel(90, 16)
    X, Y = randn(rng, (90,), "float32"), nan_like((90,), "float32")
    with pytest.raises(TypeError):
        kernel(X, Y, 1.0, 2.5)  # limit is T.int32


@tilecore.jit(target="cpu")
def scalar_only(n):
    @T.prim_func
    def main(Y: T.Tensor((n,), "float64"), a: T.float64, b: T.int32, c: T.int64):
        with T.Kernel(1) as bx:
            for i in T.Parallel(n):
                Y[i] = a * i + b - c

    return main


def test_scalar_params_numeric_types(rng):
    kernel = scalar_only(10)
    Y = nan_like((10,), "float64")
    kernel(Y, 0.25, np.int32(7), 2**40)
    np.testing.assert_array_equal(Y, 0.25 * np.arange(10) + 7 - 2**40)


# =================================================================================================
# T.print and T.device_assert
# =================================================================================================

@tilecore.jit(target="cpu")
def print_kernel():
    @T.prim_func
    def main(X: T.Tensor((3,), "float32"), v: T.int32):
        with T.Kernel(1) as bx:
            buf = T.alloc_fragment((3,), "float16")
            T.copy(X, buf)
            T.print(v, msg="value")
            T.print(v * 2, msg="50% \"quoted\"")
            T.print(X[1] * 2, msg="twice")
            T.print(buf, msg="buf")

    return main


def test_print(capfd):
    kernel = print_kernel()
    X = np.array([1.5, -2.0, 0.25], np.float32)
    kernel(X, 42)
    out = capfd.readouterr().out
    assert "value: 42" in out
    assert '50% "quoted": 84' in out
    assert "twice: -4" in out
    for i, v in enumerate(["1.5", "-2", "0.25"]):
        assert f"buf[{i}] = {v}" in out, out


@tilecore.jit(target="cpu")
def assert_kernel(n, blk):
    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, blk)) as bx:
            for i in T.serial(blk):
                if bx * blk + i < n:
                    T.device_assert(X[bx * blk + i] >= 0, "X must be non-negative")
                    Y[bx * blk + i] = T.sqrt(X[bx * blk + i])

    return main


def test_device_assert(rng):
    n = 50
    kernel = assert_kernel(n, 16)
    X = rng.uniform(0, 4, n).astype(np.float32)
    Y = nan_like((n,), "float32")
    kernel(X, Y)  # passes
    assert_close(Y, np.sqrt(X.astype(np.float64)), 1e-6, 1e-6)
    X[37] = -1.0
    with pytest.raises(KernelAssertionError, match="X must be non-negative"):
        kernel(X, Y)
    X[37] = 1.0
    kernel(X, Y)  # the failure leaves no state behind
    assert_close(Y, np.sqrt(X.astype(np.float64)), 1e-6, 1e-6)


@tilecore.jit(target="cpu")
def reduce_on_slices():
    @T.prim_func
    def main(X: T.Tensor((8, 6), "float32"), O: T.Tensor((8,), "float32"), X3: T.Tensor((2, 3, 4), "float32"),
             O3: T.Tensor((2, 4), "float32"), O3b: T.Tensor((3,), "float32")):
        with T.Kernel(1) as bx:
            x = T.alloc_fragment((8, 6), "float32")
            o = T.alloc_fragment((8,), "float32")
            T.copy(X, x)
            T.reduce_sum(x[4:8, :], o[4:8], dim=1)
            T.reduce_max(x[0:4, 1:6], o[0:4], dim=1)
            T.copy(o, O)
            x3 = T.alloc_fragment((2, 3, 4), "float32")
            o3 = T.alloc_fragment((2, 4), "float32")
            T.copy(X3, x3)
            T.reduce_sum(x3, o3, dim=1)
            T.copy(o3, O3)
            T.reduce_absmax(x3[1, :, :], O3b, dim=2)   # into a global, with a unit leading dim

    return main


def test_reduce_on_slices_and_3d(rng):
    kernel = reduce_on_slices()
    X, X3 = randn(rng, (8, 6), "float32"), randn(rng, (2, 3, 4), "float32")
    O, O3, O3b = nan_like((8,), "float32"), nan_like((2, 4), "float32"), nan_like((3,), "float32")
    kernel(X, O, X3, O3, O3b)
    x, x3 = to_f64(X), to_f64(X3)
    assert_close(O, np.concatenate([x[0:4, 1:].max(1), x[4:].sum(1)]), 1e-6, 1e-6)
    assert_close(O3, x3.sum(1), 1e-6, 1e-6)
    assert_close(O3b, np.abs(x3[1]).max(1), 0, 0)


# =================================================================================================
# integer and float division, other dtypes, control flow, fast math
# =================================================================================================

@tilecore.jit(target="cpu")
def division_kernel(n):
    @T.prim_func
    def main(A: T.Tensor((n,), "int32"), X: T.Tensor((n,), "float32"), Fd: T.Tensor((n,), "int32"),
             Fm: T.Tensor((n,), "int32"), Xd: T.Tensor((n,), "float32"), Xm: T.Tensor((n,), "float32"),
             Xf: T.Tensor((n,), "float32"), Xq: T.Tensor((n,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(n):
                Fd[i] = A[i] // 3          # floor division, Python semantics for negatives
                Fm[i] = A[i] % 3
                Xd[i] = X[i] // 2.5
                Xm[i] = X[i] % 2.5
                Xf[i] = X[i] // 1.0        # floor, not the identity
                Xq[i] = X[i] / 4

    return main


def test_floordiv_floormod(rng):
    n = 40
    kernel = division_kernel(n)
    A = rng.integers(-20, 20, n).astype(np.int32)
    X = (rng.standard_normal(n) * 10).astype(np.float32)
    Fd, Fm = poison(np.empty(n, np.int32)), poison(np.empty(n, np.int32))
    Xd, Xm, Xf, Xq = (nan_like((n,), "float32") for _ in range(4))
    kernel(A, X, Fd, Fm, Xd, Xm, Xf, Xq)
    np.testing.assert_array_equal(Fd, A // 3)
    np.testing.assert_array_equal(Fm, A % 3)
    x = X.astype(np.float64)
    assert_close(Xd, np.floor(X / np.float32(2.5)), 0, 0)
    assert_close(Xm, x - 2.5 * np.floor(X / np.float32(2.5)), 1e-5, 1e-5)
    np.testing.assert_array_equal(Xf, np.floor(X))
    np.testing.assert_array_equal(Xq, X / np.float32(4))


@tilecore.jit(target="cpu")
def int_dtypes_kernel(n):
    @T.prim_func
    def main(A: T.Tensor((n,), "int64"), U: T.Tensor((n,), "uint8"), Bo: T.Tensor((n,), "bool"),
             O: T.Tensor((n,), "int64"), Ob: T.Tensor((n,), "bool"), S: T.Tensor((2,), "int64")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(n):
                O[i] = A[i] * 3 + U[i] + T.if_then_else(Bo[i], 100, 0)
                Ob[i] = U[i] > 100
            for i in T.serial(n):
                T.atomic_add(S[0], A[i])
                T.atomic_max(S[1], A[i])

    return main


def test_int64_uint8_bool(rng):
    n = 30
    kernel = int_dtypes_kernel(n)
    A = rng.integers(-2**40, 2**40, n).astype(np.int64)
    U = rng.integers(0, 256, n).astype(np.uint8)
    Bo = rng.integers(0, 2, n).astype(bool)
    O, Ob = poison(np.empty(n, np.int64)), np.zeros(n, bool)
    S = np.array([0, np.iinfo(np.int64).min], np.int64)
    kernel(A, U, Bo, O, Ob, S)
    np.testing.assert_array_equal(O, A * 3 + U + np.where(Bo, 100, 0))
    np.testing.assert_array_equal(Ob, U > 100)
    assert S[0] == A.sum() and S[1] == A.max()


@tilecore.jit(target="cpu")
def narrow_atomics(n, blk):
    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), H: T.Tensor((4,), "float16"), Bf: T.Tensor((4,), "bfloat16"),
             Hm: T.Tensor((4,), "float16")):
        with T.Kernel(T.ceildiv(n, blk)) as bx:
            for i in T.Parallel(blk):
                if bx * blk + i < n:
                    T.atomic_add(H[i % 4], X[bx * blk + i])
                    T.atomic_add(Bf[i % 4], X[bx * blk + i])
                    T.atomic_max(Hm[i % 4], X[bx * blk + i])

    return main


def test_float16_bfloat16_atomics(rng):
    n, blk = 64, 16
    kernel = narrow_atomics(n, blk)
    X = (rng.integers(-8, 8, n) * 0.25).astype(np.float32)  # sums exact in 16 bits, in any order
    H, Hm = np.zeros(4, np.float16), np.full(4, -np.inf, np.float16)
    Bf = torch.zeros(4, dtype=torch.bfloat16)
    kernel(X, H, Bf, Hm)
    x = X.astype(np.float64)
    cols = (np.arange(n) % blk) % 4
    ref = np.array([x[cols == c].sum() for c in range(4)])
    np.testing.assert_array_equal(H, ref)
    np.testing.assert_array_equal(to_f64(Bf), ref)
    np.testing.assert_array_equal(Hm, [x[cols == c].max() for c in range(4)])


@tilecore.jit(target="cpu")
def control_flow_kernel(n):
    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Y: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            acc = T.alloc_var("float32", init=0)
            loc = T.alloc_local((2,), "float32")
            for i in T.serial(n):
                if X[i] < 0:
                    continue
                if X[i] > 5:
                    break
                acc += X[i]
            Y[0] = acc
            acc = 0
            for i in T.serial(3, 8):                   # a start other than 0
                acc += X[i]
            Y[1] = acc
            loc[0] = 0
            for i in T.Pipelined(2, 6, num_stages=2):  # (start, stop) form
                loc[0] = loc[0] + X[i]
            Y[2] = loc[0]
            loc[1] = 0
            for i in T.unroll(4):
                for j in range(2):
                    loc[1] = loc[1] + X[i * 2 + j] * (j + 1)
            Y[3] = loc[1]

    return main


def test_break_continue_loop_forms():
    X = np.array([1, -2, 3, 4, -1, 2, 9, 1, 1, 1, 1, 1], np.float32)
    Y = nan_like((4,), "float32")
    control_flow_kernel(len(X))(X, Y)
    ref = [1 + 3 + 4 + 2, X[3:8].sum(), X[2:6].sum(), (X[0:8:2] + 2 * X[1:8:2]).sum()]
    np.testing.assert_array_equal(Y, np.array(ref, np.float32))


def _f64_gemm_factory(fast):
    @tilecore.jit(target="cpu", pass_configs={"tilecore.fast_math": fast})
    def kernel(M, N, K):
        @T.prim_func
        def main(A: T.Tensor((M, K), "float64"), B: T.Tensor((K, N), "float64"), C: T.Tensor((M, N), "float64"),
                 E: T.Tensor((M, N), "float32")):
            with T.Kernel(1) as bx:
                a = T.alloc_shared((M, K), "float64")
                b = T.alloc_shared((K, N), "float64")
                c = T.alloc_fragment((M, N), "float64")
                T.copy(A, a)
                T.copy(B, b)
                T.gemm(a, b, c, clear_accum=True)
                T.copy(c, C)
                for i, j in T.Parallel(M, N):
                    E[i, j] = T.exp(T.cast(c[i, j], "float32")) + T.__exp(T.cast(c[i, j], "float32") * 0.5)

        return main

    return kernel


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast_math"])
def test_float64_gemm_and_fast_math(rng, fast):
    M, N, K = 12, 10, 9
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    C, E = nan_like((M, N), "float64"), nan_like((M, N), "float32")
    _f64_gemm_factory(fast)(M, N, K)(A, B, C, E)
    c = A @ B
    assert_close(C, c, 1e-13, 1e-13)
    c32 = c.astype(np.float32).astype(np.float64)
    assert_close(E, np.exp(c32) + np.exp(c32 * 0.5), 1e-5, 1e-6)


@tilecore.jit(target="cpu")
def global_tile_ops(M, N, bm):
    """Reductions, cumsum and region atomics directly on global regions whose last tile is ragged."""

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), S: T.Tensor((M,), "float32"), Mx: T.Tensor((M,), "float32"),
             C: T.Tensor((M, N), "float32"), A: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, bm)) as bx:
            T.reduce_sum(X[bx * bm:(bx + 1) * bm, :], S[bx * bm:(bx + 1) * bm], dim=1)
            T.reduce_max(X[bx * bm:(bx + 1) * bm, :], Mx[bx * bm:(bx + 1) * bm], dim=1)
            T.cumsum(X[bx * bm:(bx + 1) * bm, :], C[bx * bm:(bx + 1) * bm, :], dim=0, reverse=True)
            T.atomic_max(A[bx * bm:(bx + 1) * bm, :], X[bx * bm:(bx + 1) * bm, :])

    return main


def test_global_tile_ops_stay_in_bounds(rng):
    """Nothing past the tensors is read or written: the outputs are views of larger sentinel arrays."""
    M, N, bm = 20, 8, 16
    kernel = global_tile_ops(M, N, bm)
    big_x = np.full((M + bm, N), 1e6, np.float32)  # a read past X would show up in max / cumsum
    X = big_x[:M]
    X[:] = randn(rng, (M, N), "float32")
    big = [np.full((M + bm,), -99.0, np.float32), np.full((M + bm,), -99.0, np.float32),
           np.full((M + bm, N), -99.0, np.float32), np.full((M + bm, N), -np.inf, np.float32)]
    S, Mx, C, A = (b[:M] for b in big)
    S[:], Mx[:], C[:] = np.nan, np.nan, np.nan
    kernel(X, S, Mx, C, A)
    x = to_f64(X)
    assert_close(S, x.sum(1), 1e-5, 1e-5)
    assert_close(Mx, x.max(1), 0, 0)
    tiles = [x[0:bm], x[bm:M]]
    assert_close(C, np.concatenate([np.cumsum(t[::-1], 0)[::-1] for t in tiles]), 1e-5, 1e-5)
    np.testing.assert_array_equal(A, X)
    for b, fill in zip(big, (-99.0, -99.0, -99.0, -np.inf)):
        assert (b[M:] == fill).all(), "a tile op wrote past the end of a tensor"
