"""Composite cases written as TileLang users write them: softmax, norms, FlashAttention forward."""
from __future__ import annotations

import math

import numpy as np

import tilecore.language as T

from .catalog import f64, make

ROWS, COLS, BR = 64, 128, 16


def row_inputs(rng, dtype):
    return [make(rng, (ROWS, COLS), dtype)]


def softmax(dtype, rows=ROWS, cols=COLS, br=BR, threads=128):
    """The catalog's case at ``rows x cols`` (``br`` rows a block); the benchmarks use other sizes."""
    scale = 1.44269504  # log2(e)

    @T.prim_func
    def softmax_k(X: T.Tensor((rows, cols), dtype), Y: T.Tensor((rows, cols), dtype)):
        with T.Kernel(rows // br, threads=threads) as bx:
            x = T.alloc_fragment((br, cols), "float32")
            m = T.alloc_fragment((br,), "float32")
            s = T.alloc_fragment((br,), "float32")
            T.copy(X[bx * br, 0], x)
            T.reduce_max(x, m, dim=1)
            for i, j in T.Parallel(br, cols):
                x[i, j] = T.exp2(x[i, j] * scale - m[i] * scale)
            T.reduce_sum(x, s, dim=1)
            for i, j in T.Parallel(br, cols):
                x[i, j] = x[i, j] / s[i]
            T.copy(x, Y[bx * br, 0])
    return softmax_k


def softmax_ref(inputs, dtype):
    x = f64(inputs[0])
    e = np.exp(x - x.max(1, keepdims=True))
    return [e / e.sum(1, keepdims=True)]


def rmsnorm(dtype, rows=ROWS, cols=COLS, br=BR, threads=128):
    """The catalog's case at ``rows x cols`` (``br`` rows a block); the benchmarks use other sizes."""
    @T.prim_func
    def rmsnorm_k(X: T.Tensor((rows, cols), dtype), Y: T.Tensor((rows, cols), dtype)):
        with T.Kernel(rows // br, threads=threads) as bx:
            x = T.alloc_fragment((br, cols), "float32")
            sq = T.alloc_fragment((br, cols), "float32")
            s = T.alloc_fragment((br,), "float32")
            T.copy(X[bx * br, 0], x)
            for i, j in T.Parallel(br, cols):
                sq[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(sq, s, dim=1)
            for i in T.Parallel(br):
                s[i] = T.rsqrt(s[i] / cols + 1e-6)
            for i, j in T.Parallel(br, cols):
                x[i, j] = x[i, j] * s[i]
            T.copy(x, Y[bx * br, 0])
    return rmsnorm_k


def rmsnorm_ref(inputs, dtype):
    x = f64(inputs[0])
    return [x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6)]


def layernorm(dtype, rows=ROWS, cols=COLS, br=BR, threads=128):
    """The catalog's case at ``rows x cols`` (``br`` rows a block); the benchmarks use other sizes."""
    @T.prim_func
    def layernorm_k(X: T.Tensor((rows, cols), dtype), Y: T.Tensor((rows, cols), dtype)):
        with T.Kernel(rows // br, threads=threads) as bx:
            x = T.alloc_fragment((br, cols), "float32")
            sq = T.alloc_fragment((br, cols), "float32")
            mean = T.alloc_fragment((br,), "float32")
            var = T.alloc_fragment((br,), "float32")
            T.copy(X[bx * br, 0], x)
            T.reduce_sum(x, mean, dim=1)
            for i in T.Parallel(br):
                mean[i] = mean[i] / cols
            for i, j in T.Parallel(br, cols):
                x[i, j] = x[i, j] - mean[i]
                sq[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(sq, var, dim=1)
            for i, j in T.Parallel(br, cols):
                x[i, j] = x[i, j] * T.rsqrt(var[i] / cols + 1e-5)
            T.copy(x, Y[bx * br, 0])
    return layernorm_k


def layernorm_ref(inputs, dtype):
    x = f64(inputs[0])
    return [(x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)]


SEQ, DIM, HEADS, BM, BN = 80, 32, 2, 32, 32


def flash_attention_forward(seq, dim, heads, bm, bn, dtype="float16", causal=False, batch=None, threads=128,
                            num_stages=2, kv_heads=None, exp="exp2", policy=None):
    """FlashAttention forward as TileLang users write it: Q/K/V tiles in shared memory, online softmax
    with exp2, two gemms per block of ``bm`` query rows (``bn`` keys per step).

    Tensors are ``(heads, seq, dim)``, or ``(batch, heads, seq, dim)`` when ``batch`` is given; the
    grid is ``(ceildiv(seq, bm), heads[, batch])``. ``kv_heads`` (a divisor of ``heads``) makes it
    grouped-query attention: K and V have ``kv_heads`` heads, query head ``h`` reads K/V head
    ``h // (heads // kv_heads)``. ``exp="exp"`` writes the softmax with the natural exponential of the
    centered scores instead, ``T.exp((s - m) * scale)`` (the same function; the CUDA benchmark times both
    forms). ``policy`` is both gemms' warp policy (``T.GemmWarpPolicy.FullRow`` as TileLang's examples write it: every
    warp holds whole rows; None, the catalog's, leaves it to the backend). The conformance catalog, the WebGPU tests
    and the CUDA benchmark all build their kernel here."""
    if exp not in ("exp2", "exp"):
        raise ValueError(f"exp={exp!r}: 'exp2' or 'exp'")
    sm_scale = 1.44269504 / math.sqrt(dim)
    nat_scale = 1.0 / math.sqrt(dim)
    kv_heads = heads if kv_heads is None else kv_heads
    if heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} must divide heads={heads}")
    group = heads // kv_heads
    shape = (heads, seq, dim) if batch is None else (batch, heads, seq, dim)
    kv_shape = (kv_heads, seq, dim) if batch is None else (batch, kv_heads, seq, dim)
    grid = (T.ceildiv(seq, bm), heads) if batch is None else (T.ceildiv(seq, bm), heads, batch)

    def lead(blk):  # the block indices in front of (seq, dim) in a tensor index
        return (blk[1],) if batch is None else (blk[2], blk[1])

    def kv_lead(blk):  # the same for K and V: the query head's group
        h = blk[1] // group if group > 1 else blk[1]
        return (h,) if batch is None else (blk[2], h)

    @T.prim_func
    def flash_fwd(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                  O: T.Tensor(shape, dtype)):
        with T.Kernel(*grid, threads=threads) as blk:
            bx, hd, kvh = blk[0], lead(blk), kv_lead(blk)
            Q_s = T.alloc_shared((bm, dim), dtype)
            K_s = T.alloc_shared((bn, dim), dtype)
            V_s = T.alloc_shared((bn, dim), dtype)
            acc_s = T.alloc_fragment((bm, bn), "float32")
            acc_s_cast = T.alloc_fragment((bm, bn), dtype)
            acc_o = T.alloc_fragment((bm, dim), "float32")
            m_prev = T.alloc_fragment((bm,), "float32")
            m_cur = T.alloc_fragment((bm,), "float32")
            scale = T.alloc_fragment((bm,), "float32")
            row_sum = T.alloc_fragment((bm,), "float32")
            logsum = T.alloc_fragment((bm,), "float32")
            T.copy(Q[(*hd, bx * bm, 0)], Q_s)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(m_cur, -T.infinity("float32"))
            loop = T.ceildiv((bx + 1) * bm, bn) if causal else T.ceildiv(seq, bn)
            for k in T.Pipelined(loop, num_stages=num_stages):
                T.copy(K[(*kvh, k * bn, 0)], K_s)
                for i, j in T.Parallel(bm, bn):
                    valid = k * bn + j < seq
                    if causal:
                        valid = valid & (bx * bm + i >= k * bn + j)
                    acc_s[i, j] = T.if_then_else(valid, 0, -T.infinity("float32"))
                T.gemm(Q_s, K_s, acc_s, transpose_B=True, policy=policy)
                T.copy(m_cur, m_prev)
                T.reduce_max(acc_s, m_cur, dim=1, clear=False)
                for i in T.Parallel(bm):
                    if exp == "exp2":
                        scale[i] = T.exp2(m_prev[i] * sm_scale - m_cur[i] * sm_scale)
                    else:
                        scale[i] = T.exp((m_prev[i] - m_cur[i]) * nat_scale)
                for i, j in T.Parallel(bm, bn):
                    if exp == "exp2":
                        acc_s[i, j] = T.exp2(acc_s[i, j] * sm_scale - m_cur[i] * sm_scale)
                    else:
                        acc_s[i, j] = T.exp((acc_s[i, j] - m_cur[i]) * nat_scale)
                T.reduce_sum(acc_s, row_sum, dim=1)
                for i in T.Parallel(bm):
                    logsum[i] = logsum[i] * scale[i] + row_sum[i]
                for i, j in T.Parallel(bm, dim):
                    acc_o[i, j] = acc_o[i, j] * scale[i]
                T.copy(acc_s, acc_s_cast)
                T.copy(V[(*kvh, k * bn, 0)], V_s)
                T.gemm(acc_s_cast, V_s, acc_o, policy=policy)
            for i, j in T.Parallel(bm, dim):
                acc_o[i, j] = acc_o[i, j] / logsum[i]
            T.copy(acc_o, O[(*hd, bx * bm, 0)])
    return flash_fwd


def attention(dtype, causal):
    return flash_attention_forward(SEQ, DIM, HEADS, BM, BN, dtype, causal)


def attention_ref(inputs, dtype, causal, seq=SEQ, dim=DIM):
    """Attention in float64 over ``(..., seq, dim)`` inputs (causal: each query sees keys up to its own)."""
    q, k, v = (f64(x) for x in inputs)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(dim)
    if causal:
        s = np.where(np.tril(np.ones((seq, seq), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return [(p / p.sum(-1, keepdims=True)) @ v]


def attention_inputs(rng, dtype, causal):
    return [make(rng, (HEADS, SEQ, DIM), dtype) for _ in range(3)]


# one warpgroup's tile (64 query rows, 128-byte rows of dim): the shape of kernel sm_90a ran as a
# warp-specialized register program (cuda.hopper_register_program, retired in D86: the general path since D77);
# elsewhere the same kernel as above
TILE_SEQ, TILE_DIM, TILE_HEADS = 200, 64, 2


def attention_tile(dtype, causal):
    return flash_attention_forward(TILE_SEQ, TILE_DIM, TILE_HEADS, 64, 64, dtype, causal, threads=128)


def attention_tile_inputs(rng, dtype, causal):
    return [make(rng, (TILE_HEADS, TILE_SEQ, TILE_DIM), dtype) for _ in range(3)]


def attention_tile_ref(inputs, dtype, causal):
    return attention_ref(inputs, dtype, causal, seq=TILE_SEQ, dim=TILE_DIM)
