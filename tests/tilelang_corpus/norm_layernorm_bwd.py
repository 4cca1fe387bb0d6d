# TileLang examples/norm/layernorm.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import tilecore as tilelang
import tilecore.language as T


@tilelang.jit(out_idx=[-3])
def _layernorm_bwd(N, D, blk_m=32, threads=256, in_dtype='bfloat16'):
    assert N % blk_m == 0, f'N={N} must be a multiple of blk_m={blk_m}'
    accum_dtype = 'float'

    @T.prim_func
    def main(DY: T.Tensor((N, D), in_dtype), X: T.Tensor((N, D), in_dtype), gamma: T.Tensor((D,), in_dtype), Mean: T.Tensor((N,), accum_dtype), Rstd: T.Tensor((N,), accum_dtype), DX: T.Tensor((N, D), in_dtype), DGamma: T.Tensor((D,), accum_dtype), DBeta: T.Tensor((D,), accum_dtype)):
        with T.Kernel(T.ceildiv(N, blk_m), threads=threads) as bx:
            DY_smem = T.alloc_shared((1, D), in_dtype)
            X_smem = T.alloc_shared((1, D), in_dtype)
            G_smem = T.alloc_shared((D,), in_dtype)
            DX_smem = T.alloc_shared((1, D), in_dtype)
            x_hat = T.alloc_fragment((1, D), accum_dtype)
            dx_hat = T.alloc_fragment((1, D), accum_dtype)
            dx_hat_x_hat = T.alloc_fragment((1, D), accum_dtype)
            sum_dx_hat = T.alloc_fragment((1,), accum_dtype)
            sum_dx_hat_x_hat = T.alloc_fragment((1,), accum_dtype)
            dgamma_acc = T.alloc_fragment((D,), accum_dtype)
            dbeta_acc = T.alloc_fragment((D,), accum_dtype)
            T.copy(gamma, G_smem)
            T.clear(dgamma_acc)
            T.clear(dbeta_acc)
            inv_D = T.float32(1.0) / T.Cast(accum_dtype, D)
            for k in T.serial(blk_m):
                row = bx * blk_m + k
                T.copy(DY[row, 0], DY_smem)
                T.copy(X[row, 0], X_smem)
                m_v = Mean[row]
                r_v = Rstd[row]
                for i, j in T.Parallel(1, D):
                    xv = T.Cast(accum_dtype, X_smem[i, j])
                    dy_v = T.Cast(accum_dtype, DY_smem[i, j])
                    g_v = T.Cast(accum_dtype, G_smem[j])
                    x_hat[i, j] = (xv - m_v) * r_v
                    dx_hat[i, j] = dy_v * g_v
                    dx_hat_x_hat[i, j] = dx_hat[i, j] * x_hat[i, j]
                T.reduce_sum(dx_hat, sum_dx_hat, dim=1)
                T.reduce_sum(dx_hat_x_hat, sum_dx_hat_x_hat, dim=1)
                for i, j in T.Parallel(1, D):
                    c1 = sum_dx_hat_x_hat[0] * inv_D
                    c2 = sum_dx_hat[0] * inv_D
                    dx_v = r_v * (dx_hat[i, j] - c2 - x_hat[i, j] * c1)
                    DX_smem[i, j] = T.Cast(in_dtype, dx_v)
                    dy_v = T.Cast(accum_dtype, DY_smem[i, j])
                    dgamma_acc[j] += dy_v * x_hat[i, j]
                    dbeta_acc[j] += dy_v
                T.copy(DX_smem, DX[row, 0])
            for j in T.Parallel(D):
                T.atomic_add(DGamma[j], dgamma_acc[j], memory_order='relaxed')
                T.atomic_add(DBeta[j], dbeta_acc[j], memory_order='relaxed')
    return main


import torch  # noqa: E402

from ._driver import f64, randn  # noqa: E402

KERNELS = [(_layernorm_bwd, (4096, 8192), {})]


def check():
    N, D, eps = 64, 128, 1e-5
    x, g, dy = randn(N, D, dtype=torch.bfloat16), randn(D, dtype=torch.bfloat16), randn(N, D, dtype=torch.bfloat16)
    mean = f64(x).mean(-1)
    rstd = torch.rsqrt(f64(x).var(-1, unbiased=False) + eps)
    dgamma, dbeta = torch.zeros(D), torch.zeros(D)
    dx = _layernorm_bwd(N, D)(dy, x, g, mean.float(), rstd.float(), dgamma, dbeta)
    xr, gr = f64(x).requires_grad_(), f64(g).requires_grad_()
    br = torch.zeros(D, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.layer_norm(xr, (D,), gr, br, eps=eps).backward(f64(dy))
    return [("DX", dx, xr.grad), ("DGamma", dgamma, gr.grad), ("DBeta", dbeta, br.grad)]
