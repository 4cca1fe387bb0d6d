# TileLang examples/convolution/example_convolution.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import torch
import tilecore as tilelang
from tilecore.autotuner import *
import tilecore.language as T


def check_hopper():
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    compute_capability = (props.major, props.minor)
    return compute_capability == (9, 0)


@tilelang.jit(out_idx=[2])
def convolution(N, C, H, W, F, K, S, D, P, block_M, block_N, block_K, num_stages, threads, dtype=T.float16, accum_dtype=T.float32):
    KH, KW = (K, K)
    OH = (H + 2 * P - D * (K - 1) - 1) // S + 1
    OW = (W + 2 * P - D * (K - 1) - 1) // S + 1
    dtype = T.float16
    accum_dtype = T.float32
    is_hopper = check_hopper()

    @T.prim_func
    def main(data: T.Tensor((N, H, W, C), dtype), kernel: T.Tensor((KH, KW, C, F), dtype), out: T.Tensor((N, OH, OW, F), dtype)):
        with T.Kernel(T.ceildiv(F, block_N), T.ceildiv(N * OH * OW, block_M), threads=threads) as (bx, by):
            data_shared = T.alloc_shared((block_M, block_K), dtype)
            kernel_shared = T.alloc_shared((block_K, block_N), dtype)
            out_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            out_shared = T.alloc_shared((block_M, block_N), dtype)
            kernel_flat = T.Tensor((KH * KW * C, F), dtype, kernel.data)
            out_flat = T.Tensor((N * OH * OW, F), dtype, out.data)
            T.clear(out_local)
            for k_iter in T.Pipelined(T.ceildiv(KH * KW * C, block_K), num_stages=num_stages):
                if is_hopper:
                    T.c2d_im2col(data, data_shared, by, k_iter, KH, S, D, P)
                else:
                    for i, j in T.Parallel(block_M, block_K):
                        k = k_iter * block_K + j
                        m = by * block_M + i
                        access_h = m % (OH * OW) // OW * S + k // (KW * C) * D - P
                        access_w = m % OW * S + k // C % KW * D - P
                        in_bound = access_h >= 0 and access_w >= 0 and (access_h < H) and (access_w < W)
                        data_shared[i, j] = T.if_then_else(in_bound, data[m // (OH * OW), access_h, access_w, k % C], 0)
                T.copy(kernel_flat[k_iter * block_K, bx * block_N], kernel_shared)
                T.gemm(data_shared, kernel_shared, out_local)
            T.copy(out_local, out_shared)
            T.copy(out_shared, out_flat[by * block_M, bx * block_N])
    return main


from ._driver import f64, randn  # noqa: E402

KERNELS = [(convolution, (128, 128, 64, 64, 128, 3, 1, 1, 1, 64, 128, 32, 3, 256), {})]


def check():
    out = []
    for N, C, H, W, F, K, S, D, P in ((1, 16, 8, 8, 32, 3, 1, 1, 1), (2, 16, 9, 7, 16, 3, 2, 2, 2)):
        a, b = randn(N, H, W, C), randn(K, K, C, F)
        c = convolution(N, C, H, W, F, K, S, D, P, 32, 32, 16, 1, 128)(a, b)
        ref = torch.conv2d(f64(a).permute(0, 3, 1, 2), f64(b).permute(3, 2, 0, 1), stride=S, padding=P, dilation=D)
        out.append((f"out N={N} S={S} D={D} P={P}", c, ref.permute(0, 2, 3, 1)))
    return out
