"""Composite cases written as TileLang users write them: softmax, norms, FlashAttention forward."""
from __future__ import annotations

import math

import numpy as np

import tilecore.language as T

from .catalog import f64, make

ROWS, COLS, BR = 64, 128, 16


def row_inputs(rng, dtype):
    return [make(rng, (ROWS, COLS), dtype)]


def softmax(dtype):
    scale = 1.44269504  # log2(e)

    @T.prim_func
    def softmax_k(X: T.Tensor((ROWS, COLS), dtype), Y: T.Tensor((ROWS, COLS), dtype)):
        with T.Kernel(ROWS // BR) as bx:
            x = T.alloc_fragment((BR, COLS), "float32")
            m = T.alloc_fragment((BR,), "float32")
            s = T.alloc_fragment((BR,), "float32")
            T.copy(X[bx * BR, 0], x)
            T.reduce_max(x, m, dim=1)
            for i, j in T.Parallel(BR, COLS):
                x[i, j] = T.exp2(x[i, j] * scale - m[i] * scale)
            T.reduce_sum(x, s, dim=1)
            for i, j in T.Parallel(BR, COLS):
                x[i, j] = x[i, j] / s[i]
            T.copy(x, Y[bx * BR, 0])
    return softmax_k


def softmax_ref(inputs, dtype):
    x = f64(inputs[0])
    e = np.exp(x - x.max(1, keepdims=True))
    return [e / e.sum(1, keepdims=True)]


def rmsnorm(dtype):
    @T.prim_func
    def rmsnorm_k(X: T.Tensor((ROWS, COLS), dtype), Y: T.Tensor((ROWS, COLS), dtype)):
        with T.Kernel(ROWS // BR) as bx:
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
                x[i, j] = x[i, j] * s[i]
            T.copy(x, Y[bx * BR, 0])
    return rmsnorm_k


def rmsnorm_ref(inputs, dtype):
    x = f64(inputs[0])
    return [x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6)]


def layernorm(dtype):
    @T.prim_func
    def layernorm_k(X: T.Tensor((ROWS, COLS), dtype), Y: T.Tensor((ROWS, COLS), dtype)):
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
    return layernorm_k


def layernorm_ref(inputs, dtype):
    x = f64(inputs[0])
    return [(x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)]


SEQ, DIM, HEADS, BM, BN = 80, 32, 2, 32, 32


def attention(dtype, causal):
    sm_scale = 1.44269504 / math.sqrt(DIM)

    @T.prim_func
    def flash_fwd(Q: T.Tensor((HEADS, SEQ, DIM), dtype), K: T.Tensor((HEADS, SEQ, DIM), dtype),
                  V: T.Tensor((HEADS, SEQ, DIM), dtype), O: T.Tensor((HEADS, SEQ, DIM), dtype)):
        with T.Kernel(T.ceildiv(SEQ, BM), HEADS, threads=128) as (bx, bh):
            Q_s = T.alloc_shared((BM, DIM), dtype)
            K_s = T.alloc_shared((BN, DIM), dtype)
            V_s = T.alloc_shared((BN, DIM), dtype)
            acc_s = T.alloc_fragment((BM, BN), "float32")
            acc_s_cast = T.alloc_fragment((BM, BN), dtype)
            acc_o = T.alloc_fragment((BM, DIM), "float32")
            m_prev = T.alloc_fragment((BM,), "float32")
            m_cur = T.alloc_fragment((BM,), "float32")
            scale = T.alloc_fragment((BM,), "float32")
            row_sum = T.alloc_fragment((BM,), "float32")
            logsum = T.alloc_fragment((BM,), "float32")
            T.copy(Q[bh, bx * BM, 0], Q_s)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(m_cur, -T.infinity("float32"))
            loop = T.ceildiv((bx + 1) * BM, BN) if causal else T.ceildiv(SEQ, BN)
            for k in T.Pipelined(loop, num_stages=2):
                T.copy(K[bh, k * BN, 0], K_s)
                for i, j in T.Parallel(BM, BN):
                    valid = k * BN + j < SEQ
                    if causal:
                        valid = valid & (bx * BM + i >= k * BN + j)
                    acc_s[i, j] = T.if_then_else(valid, 0, -T.infinity("float32"))
                T.gemm(Q_s, K_s, acc_s, transpose_B=True)
                T.copy(m_cur, m_prev)
                T.reduce_max(acc_s, m_cur, dim=1, clear=False)
                for i in T.Parallel(BM):
                    scale[i] = T.exp2(m_prev[i] * sm_scale - m_cur[i] * sm_scale)
                for i, j in T.Parallel(BM, BN):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * sm_scale - m_cur[i] * sm_scale)
                T.reduce_sum(acc_s, row_sum, dim=1)
                for i in T.Parallel(BM):
                    logsum[i] = logsum[i] * scale[i] + row_sum[i]
                for i, j in T.Parallel(BM, DIM):
                    acc_o[i, j] = acc_o[i, j] * scale[i]
                T.copy(acc_s, acc_s_cast)
                T.copy(V[bh, k * BN, 0], V_s)
                T.gemm(acc_s_cast, V_s, acc_o)
            for i, j in T.Parallel(BM, DIM):
                acc_o[i, j] = acc_o[i, j] / logsum[i]
            T.copy(acc_o, O[bh, bx * BM, 0])
    return flash_fwd


def attention_inputs(rng, dtype, causal):
    return [make(rng, (HEADS, SEQ, DIM), dtype) for _ in range(3)]


def attention_ref(inputs, dtype, causal):
    q, k, v = (f64(x) for x in inputs)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(DIM)
    if causal:
        s = np.where(np.tril(np.ones((SEQ, SEQ), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return [(p / p.sum(-1, keepdims=True)) @ v]
