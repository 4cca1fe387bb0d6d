# TileLang examples/norm/layernorm.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import tilecore as tilelang
import tilecore.language as T


@tilelang.jit(out_idx=[-3, -2, -1])
def _layernorm_fwd(N, D, eps=1e-05, blk_m=1, threads=256, in_dtype='bfloat16', out_dtype='bfloat16'):
    accum_dtype = 'float'

    @T.prim_func
    def main(X: T.Tensor((N, D), in_dtype), gamma: T.Tensor((D,), in_dtype), beta: T.Tensor((D,), in_dtype), Y: T.Tensor((N, D), out_dtype), Mean: T.Tensor((N,), accum_dtype), Rstd: T.Tensor((N,), accum_dtype)):
        with T.Kernel(T.ceildiv(N, blk_m), threads=threads) as bx:
            X_smem = T.alloc_shared((blk_m, D), in_dtype)
            G_smem = T.alloc_shared((D,), in_dtype)
            B_smem = T.alloc_shared((D,), in_dtype)
            X_local = T.alloc_fragment((blk_m, D), accum_dtype)
            X_sq_local = T.alloc_fragment((blk_m, D), accum_dtype)
            sum_row = T.alloc_fragment((blk_m,), accum_dtype)
            sumsq_row = T.alloc_fragment((blk_m,), accum_dtype)
            mean_row = T.alloc_fragment((blk_m,), accum_dtype)
            rstd_row = T.alloc_fragment((blk_m,), accum_dtype)
            T.copy(X[bx * blk_m, 0], X_smem)
            T.copy(gamma, G_smem)
            T.copy(beta, B_smem)
            for i, j in T.Parallel(blk_m, D):
                X_local[i, j] = T.Cast(accum_dtype, X_smem[i, j])
            for i, j in T.Parallel(blk_m, D):
                X_sq_local[i, j] = X_local[i, j] * X_local[i, j]
            T.reduce_sum(X_local, sum_row, dim=1)
            T.reduce_sum(X_sq_local, sumsq_row, dim=1)
            inv_D = T.float32(1.0) / T.Cast(accum_dtype, D)
            for i in T.Parallel(blk_m):
                mean_row[i] = sum_row[i] * inv_D
                rstd_row[i] = T.rsqrt(sumsq_row[i] * inv_D - mean_row[i] * mean_row[i] + T.Cast(accum_dtype, eps))
                Mean[bx * blk_m + i] = mean_row[i]
                Rstd[bx * blk_m + i] = rstd_row[i]
            for i, j in T.Parallel(blk_m, D):
                norm = (X_local[i, j] - mean_row[i]) * rstd_row[i]
                X_smem[i, j] = T.Cast(out_dtype, norm * T.Cast(accum_dtype, G_smem[j]) + T.Cast(accum_dtype, B_smem[j]))
            T.copy(X_smem, Y[bx * blk_m, 0])
    return main


import torch  # noqa: E402

from ._driver import f64, randn  # noqa: E402

KERNELS = [(_layernorm_fwd, (4096, 8192), {})]


def check():
    N, D, eps = 16, 256, 1e-5
    x, g, b = randn(N, D, dtype=torch.bfloat16), randn(D, dtype=torch.bfloat16), randn(D, dtype=torch.bfloat16)
    y, mean, rstd = _layernorm_fwd(N, D, eps=eps)(x, g, b)
    ref = torch.nn.functional.layer_norm(f64(x), (D,), f64(g), f64(b), eps=eps)
    return [("Y", y, ref), ("Mean", mean, f64(x).mean(-1)),
            ("Rstd", rstd, torch.rsqrt(f64(x).var(-1, unbiased=False) + eps))]
