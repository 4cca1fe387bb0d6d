# TileLang examples/gemm_splitk/example_tilelang_gemm_splitk_vectorize_atomicadd.py @ tile-ai/tilelang a35008a42: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import tilecore as tilelang
import tilecore.language as T


@tilelang.jit
def matmul(A, B, C, block_M, block_N, block_K, split_k, dtype=T.float16, accum_dtype=T.float32, out_dtype=T.float32):
    M, N, K = T.const('M, N, K')
    splitK = K // split_k
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    C: T.Tensor((M, N), out_dtype)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k, threads=128) as (bx, by, bz):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        T.clear(C_local)
        for ko in T.Pipelined(T.ceildiv(splitK, block_K), num_stages=0):
            T.copy(A[by * block_M, bz * splitK + ko * block_K], A_shared)
            T.copy(B[bz * splitK + ko * block_K, bx * block_N], B_shared)
            T.gemm(A_shared, B_shared, C_local)
        T.atomic_add(C[by * block_M, bx * block_N], C_local)


import torch  # noqa: E402

from ._driver import f64, randn  # noqa: E402

KERNELS = [(matmul, (), dict(M=1024, N=1024, K=1024, block_M=128, block_N=128, block_K=32, split_k=4))]


def check():
    a, b = randn(128, 128), randn(128, 128)
    c = torch.zeros(128, 128, dtype=torch.float32)
    matmul(a, b, c, 64, 64, 32, 4)
    return [("C", c, f64(a) @ f64(b))]
