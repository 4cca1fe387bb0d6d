# TileLang examples/quickstart.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import tilecore as tilelang
import tilecore.language as T


@tilelang.jit
def matmul(M, N, K, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):

    @T.prim_func
    def matmul_relu_kernel(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, ko * block_K], A_shared)
                T.copy(B[ko * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            for i, j in T.Parallel(block_M, block_N):
                C_local[i, j] = T.max(C_local[i, j], 0)
            T.copy(C_local, C[by * block_M, bx * block_N])
    return matmul_relu_kernel


from ._driver import f64, randn  # noqa: E402

M, N, K, block_M, block_N, block_K = 128, 64, 96, 64, 32, 32
KERNELS = [(matmul, (1024, 1024, 1024, 128, 128, 32), {})]


def check():
    kernel = matmul(M, N, K, block_M, block_N, block_K)
    a, b = randn(M, K), randn(K, N)
    c = a.new_empty(M, N)
    kernel(a, b, c)
    return [("C", c, (f64(a) @ f64(b)).relu())]
