# TileLang examples/blocksparse_gemm/example_blocksparse_gemm.py @ tile-ai/tilelang a35008a42: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import itertools
import tilecore as tilelang
import tilecore.language as T
import itertools
from tilecore.utils.tensor import get_tensor_supply, TensorSupplyType
import torch
from tilecore.profiler import do_bench


def get_configs():
    block_M = [64, 128, 256]
    block_N = [64, 128, 256]
    block_K = [32, 64]
    num_stages = [1, 2, 3]
    thread_num = [128, 256]
    enable_rasterization = [True, False]
    _configs = list(itertools.product(block_M, block_N, block_K, num_stages, thread_num, enable_rasterization))
    return [{'block_M': c[0], 'block_N': c[1], 'block_K': c[2], 'num_stages': c[3], 'thread_num': c[4], 'enable_rasteration': c[5]} for c in _configs]


@tilelang.autotune(configs=get_configs())
@tilelang.jit
def blocksparse_matmul(A, B, BlockMask, block_M, block_N, block_K, num_stages, thread_num, enable_rasteration, dtype=T.float16, accum_dtype=T.float32):
    M, N, K = T.const('M, N, K')
    block_mask_shape = (M // block_M, N // block_N, K // block_K)
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    BlockMask: T.Tensor(block_mask_shape, 'bool')
    C = T.empty((M, N), dtype)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        C_shared = T.alloc_shared((block_M, block_N), dtype)
        T.use_swizzle(panel_size=10, enable=enable_rasteration)
        T.clear(C_local)
        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
            if BlockMask[by, bx, k]:
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
        T.copy(C_local, C_shared)
        T.copy(C_shared, C[by * block_M, bx * block_N])
    return C


import torch  # noqa: E402

from ._driver import f64, randn  # noqa: E402

KERNELS = [(blocksparse_matmul, (), dict(M=1024, N=1024, K=1024, block_M=128, block_N=128, block_K=32, num_stages=2,
                                         thread_num=128, enable_rasteration=True))]


def check():
    M, N, K, bm, bn, bk = 128, 128, 128, 64, 64, 32
    a, b = randn(M, K), randn(K, N)
    mask = torch.rand(M // bm, N // bn, K // bk) > 0.5
    c = blocksparse_matmul(a, b, mask, block_M=bm, block_N=bn, block_K=bk, num_stages=2, thread_num=128,
                           enable_rasteration=True)
    ref = torch.zeros(M, N, dtype=torch.float64)
    for i in range(M // bm):
        for j in range(N // bn):
            for kk in range(K // bk):
                if mask[i, j, kk]:
                    ref[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn] += (
                        f64(a)[i * bm:(i + 1) * bm, kk * bk:(kk + 1) * bk] @ f64(b)[kk * bk:(kk + 1) * bk, j * bn:(j + 1) * bn])
    return [("C", c, ref)]
