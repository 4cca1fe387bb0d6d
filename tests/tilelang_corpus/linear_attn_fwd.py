# TileLang examples/linear_attention/example_linear_attn_fwd.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import torch
import tilecore as tilelang
import tilecore.language as T
from tilecore.profiler import do_bench
from einops import rearrange
from typing import Optional, Tuple


@tilelang.jit(out_idx=[4], pass_configs={tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True})
def tl_fused_chunk_fwd_kernel(B, S, H, DK, DV, dtype: T.dtype=T.float16, scale: float=None) -> torch.Tensor:
    if scale is None:
        scale = DK ** (-0.5)
    accum_dtype = T.float32
    chunk_size = 64
    BK = BV = 64
    assert S % chunk_size == 0 and DK % BK == 0 and (DV % BV == 0)
    NK = tilelang.cdiv(DK, BK)
    NV = tilelang.cdiv(DV, BV)
    NT = tilelang.cdiv(S, chunk_size)

    @T.prim_func
    def fused_chunk_linear_attn_fwd(Q: T.Tensor([B, S, H, DK], dtype), K: T.Tensor([B, S, H, DK], dtype), V: T.Tensor([B, S, H, DV], dtype), O: T.Tensor([B, S, H, DV], accum_dtype), final_state: T.Tensor([B, H, DK, DV], accum_dtype)):
        with T.Kernel(NV, NK, B * H) as (i_v, i_k, i_bh):
            i_b = i_bh // H
            i_h = i_bh % H
            q = T.alloc_shared([chunk_size, BK], dtype)
            k = T.alloc_shared([chunk_size, BK], dtype)
            v = T.alloc_shared([chunk_size, BV], dtype)
            h = T.alloc_fragment([BK, BV], accum_dtype)
            h_shared = T.alloc_shared([BK, BV], dtype)
            s = T.alloc_fragment([chunk_size, chunk_size], accum_dtype)
            s_shared = T.alloc_shared([chunk_size, chunk_size], dtype)
            o = T.alloc_fragment([chunk_size, BV], accum_dtype)
            o_shared = T.alloc_shared([chunk_size, BV], accum_dtype)
            T.use_swizzle(10)
            T.clear(h)
            for i in T.Pipelined(0, NT):
                for row, col in T.Parallel(chunk_size, BK):
                    q[row, col] = Q[i_b, i * chunk_size + row, i_h, i_k * BK + col] * scale
                T.copy(K[i_b, i * chunk_size:(i + 1) * chunk_size, i_h, i_k * BK:(i_k + 1) * BK], k)
                T.copy(V[i_b, i * chunk_size:(i + 1) * chunk_size, i_h, i_v * BV:(i_v + 1) * BV], v)
                T.gemm(q, k, s, clear_accum=True, transpose_B=True)
                for row, col in T.Parallel(chunk_size, chunk_size):
                    s_shared[row, col] = T.if_then_else(row >= col, s[row, col], 0)
                T.gemm(s_shared, v, o, clear_accum=True)
                T.copy(h, h_shared)
                T.gemm(k, v, h, transpose_A=True)
                T.gemm(q, h_shared, o)
                T.copy(o, o_shared)
                T.atomic_add(O[i_b, i * chunk_size:(i + 1) * chunk_size, i_h, i_v * BV:(i_v + 1) * BV], o_shared)
            T.copy(h, final_state[i_b, i_h, i_k * BK:(i_k + 1) * BK, i_v * BV:(i_v + 1) * BV])
    return fused_chunk_linear_attn_fwd


from ._driver import causal_linear_ref, f64, randn  # noqa: E402

KERNELS = [(tl_fused_chunk_fwd_kernel, (1, 512, 16, 128, 128), {})]


def check():
    B, S, H, D = 1, 128, 2, 64
    q, k, v = randn(B, S, H, D), randn(B, S, H, D), randn(B, S, H, D)
    o = torch.zeros((B, S, H, D), dtype=torch.float32)
    h = tl_fused_chunk_fwd_kernel(B, S, H, D, D)(q, k, v, o)
    ref_h = f64(k).permute(0, 2, 3, 1) @ f64(v).transpose(1, 2)
    # O is float32, but the kernel stages q * scale, the masked scores and the running state in float16 tiles:
    # it is compared at float16 tolerance (final_state, summed in float32 from float16 inputs, at float32's)
    return [("O", o, causal_linear_ref(q, k, v, D ** -0.5), "float16"), ("final_state", h, ref_h)]
