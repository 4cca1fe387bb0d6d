# TileLang examples/gemm_fp8/example_tilelang_gemm_fp8.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import tilecore as tilelang
import tilecore.language as T


@tilelang.jit(out_idx=[-1])
def matmul(M, N, K, block_M, block_N, block_K, dtype, accum_dtype=T.float32):

    @T.prim_func
    def gemm_fp8(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
            T.copy(C_local, C[by * block_M, bx * block_N])
    return gemm_fp8


import torch  # noqa: E402

from ._driver import f64  # noqa: E402

KERNELS = [(matmul, (1024, 1024, 1024, 128, 128, 64, "float8_e4m3"), {}),
           (matmul, (1024, 1024, 1024, 128, 128, 64, "float8_e5m2"), {})]


def check():
    out = []
    for dtype in ("float8_e4m3", "float8_e5m2"):
        torch_dtype = T.dtype(dtype).as_torch()
        kernel = matmul(64, 64, 128, 32, 32, 64, dtype)
        a = torch.randn(64, 128, dtype=torch.float16).to(torch_dtype)
        b = torch.randn(64, 128, dtype=torch.float16).to(torch_dtype)
        c = kernel(a, b)
        # the kernel rounds its float32 sums to the fp8 output: compare with the rounded reference
        out.append((f"C {dtype}", c, (f64(a) @ f64(b).T).to(torch_dtype)))
    return out
