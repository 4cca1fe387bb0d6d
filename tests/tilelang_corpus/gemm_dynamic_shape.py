# TileLang examples/dynamic_shape/example_dynamic.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import tilecore as tilelang
import tilecore.language as T


@tilelang.jit
def matmul_dynamic_mnk(block_M, block_N, block_K, trans_A, trans_B, in_dtype, out_dtype, accum_dtype, num_stages, threads):
    M = T.dynamic('m')
    N = T.dynamic('n')
    K = T.dynamic('k')
    A_shape = (K, M) if trans_A else (M, K)
    B_shape = (N, K) if trans_B else (K, N)
    A_shared_shape = (block_K, block_M) if trans_A else (block_M, block_K)
    B_shared_shape = (block_N, block_K) if trans_B else (block_K, block_N)

    @T.prim_func
    def dynamic_matmul(A: T.Tensor(A_shape, in_dtype), B: T.Tensor(B_shape, in_dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared(A_shared_shape, in_dtype)
            B_shared = T.alloc_shared(B_shared_shape, in_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                if trans_A:
                    T.copy(A[k * block_K, by * block_M], A_shared)
                else:
                    T.copy(A[by * block_M, k * block_K], A_shared)
                if trans_B:
                    T.copy(B[bx * block_N, k * block_K], B_shared)
                else:
                    T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local, trans_A, trans_B)
            T.copy(C_local, C[by * block_M, bx * block_N])
    return dynamic_matmul


import torch  # noqa: E402

from ._driver import f64  # noqa: E402

ARGS = (128, 128, 32, False, False, "float16", "float16", "float32", 3, 128)
KERNELS = [(matmul_dynamic_mnk, ARGS, {}), (matmul_dynamic_mnk, (128, 128, 32, True, True) + ARGS[5:], {})]


def check():
    out = []
    kernel = matmul_dynamic_mnk(*ARGS)
    for M, N, K in ((100, 72, 40), (64, 130, 96)):           # one kernel, any sizes
        A, B = torch.rand(M, K, dtype=torch.float16), torch.rand(K, N, dtype=torch.float16)
        C = torch.zeros(M, N, dtype=torch.float16)
        kernel(A, B, C)
        out.append((f"C {M}x{N}x{K}", C, f64(A) @ f64(B)))
    kt = matmul_dynamic_mnk(64, 64, 32, True, True, *ARGS[5:])
    A, B = torch.rand(48, 80, dtype=torch.float16), torch.rand(56, 48, dtype=torch.float16)
    C = torch.zeros(80, 56, dtype=torch.float16)
    kt(A, B, C)
    out.append(("C transposed", C, f64(A).T @ f64(B).T))
    return out
