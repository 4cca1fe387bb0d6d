# TileLang examples/convolution/example_convolution.py @ tile-ai/tilelang a35008a42: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import torch
import tilecore as tilelang
from tilecore.autotuner import *
import tilecore.language as T


@tilelang.jit
def convolution(data, kernel, S, D, P, block_M, block_N, block_K, num_stages, threads, dtype=T.float16, accum_dtype=T.float32):
    N, C, H, W, F, K = T.const('N, C, H, W, F, K')
    KH, KW = (K, K)
    OH = (H + 2 * P - D * (K - 1) - 1) // S + 1
    OW = (W + 2 * P - D * (K - 1) - 1) // S + 1
    dtype = T.float16
    accum_dtype = T.float32
    data: T.Tensor((N, H, W, C), dtype)
    kernel: T.Tensor((KH, KW, C, F), dtype)
    out = T.empty((N, OH, OW, F), dtype)
    with T.Kernel(T.ceildiv(F, block_N), T.ceildiv(N * OH * OW, block_M), threads=threads) as (bx, by):
        data_shared = T.alloc_shared((block_M, block_K), dtype)
        kernel_shared = T.alloc_shared((block_K, block_N), dtype)
        out_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        out_shared = T.alloc_shared((block_M, block_N), dtype)
        kernel_flat = T.Tensor((KH * KW * C, F), dtype, kernel.data)
        out_flat = T.Tensor((N * OH * OW, F), dtype, out.data)
        T.clear(out_local)
        for k_iter in T.Pipelined(T.ceildiv(KH * KW * C, block_K), num_stages=num_stages):
            T.im2col(data, data_shared, by, k_iter, KH, S, D, P)
            T.copy(kernel_flat[k_iter * block_K, bx * block_N], kernel_shared)
            T.gemm(data_shared, kernel_shared, out_local)
        T.copy(out_local, out_shared)
        T.copy(out_shared, out_flat[by * block_M, bx * block_N])
    return out


from ._driver import f64, randn  # noqa: E402

KERNELS = [(convolution, (), dict(N=128, C=128, H=64, W=64, F=128, K=3, S=1, D=1, P=1, block_M=64, block_N=128,
                                  block_K=32, num_stages=3, threads=256))]


def check():
    N, C, H, W, F, K, S, D, P = 2, 16, 9, 7, 16, 3, 2, 2, 2
    a, b = randn(N, H, W, C), randn(K, K, C, F)
    c = convolution(a, b, S, D, P, 32, 32, 16, 1, 128)
    ref = torch.conv2d(f64(a).permute(0, 3, 1, 2), f64(b).permute(3, 2, 0, 1), stride=S, padding=P, dilation=D)
    return [("out", c, ref.permute(0, 2, 3, 1))]
