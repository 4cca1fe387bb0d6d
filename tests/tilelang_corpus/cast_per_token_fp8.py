# TileLang examples/cast/example_per_token_cast_to_fp8.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import torch
import tilecore as tilelang
import tilecore.language as T
from typing import Tuple
from tilecore.utils.tensor import torch_assert_close


@tilelang.jit(out_idx=[1, 2])
def per_token_cast_to_fp8(M, N, blk_m):
    dtype = T.float
    group_size = 128
    fp8_min = -448.0
    fp8_max = 448.0

    @T.prim_func
    def per_token_cast(X: T.Tensor((M, N), dtype), X_fp8: T.Tensor((M, N), T.float8_e4m3fn), X_amax: T.Tensor((M, T.ceildiv(N, group_size)), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), T.ceildiv(N, group_size), threads=128) as (bx, by):
            row = bx
            row_g_id = by
            y_local = T.alloc_fragment((blk_m, group_size), dtype)
            y_amax_local = T.alloc_fragment((blk_m,), dtype)
            y_s_local = T.alloc_fragment((blk_m,), dtype)
            y_q_local = T.alloc_fragment((blk_m, group_size), dtype)
            y_q_local_fp8 = T.alloc_fragment((blk_m, group_size), T.float8_e4m3fn)
            T.copy(X[row * blk_m:(row + 1) * blk_m, row_g_id * group_size:(row_g_id + 1) * group_size], y_local)
            T.reduce_absmax(y_local, y_amax_local, dim=1)
            for i in T.Parallel(blk_m):
                y_amax_local[i] = T.max(y_amax_local[i], 0.0001)
                y_s_local[i] = y_amax_local[i] / fp8_max
            for i, j in T.Parallel(blk_m, group_size):
                y_q_local[i, j] = T.clamp(y_local[i, j] / y_s_local[i], fp8_min, fp8_max)
            T.copy(y_q_local, y_q_local_fp8)
            for i in T.Parallel(blk_m):
                X_amax[row * blk_m + i, row_g_id] = y_s_local[i]
            T.copy(y_q_local_fp8, X_fp8[row * blk_m:(row + 1) * blk_m, row_g_id * group_size:(row_g_id + 1) * group_size])
    return per_token_cast


from ._driver import f64  # noqa: E402

KERNELS = [(per_token_cast_to_fp8, (8192, 8192, 8), {})]


def check():
    M, N = 16, 384
    x = torch.randn(M, N, dtype=torch.float32)
    x_fp8, x_amax = per_token_cast_to_fp8(M, N, 8)(x)
    amax = f64(x).view(M, -1, 128).abs().amax(dim=2).clamp(1e-4)
    ref_fp8 = (f64(x).view(M, -1, 128) * (448.0 / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(M, N)
    return [("X_fp8", x_fp8, ref_fp8), ("X_amax", x_amax, amax / 448.0)]
