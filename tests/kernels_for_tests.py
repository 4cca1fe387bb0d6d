"""Small kernels shared by several test files (cache, export, CLI, errors, the GPU backends)."""
import tilecore
import tilecore.language as T


@tilecore.jit(out_idx=[-1], target="cpu")
def vadd(n, block=128, dtype="float32"):
    @T.prim_func
    def vadd_kernel(A: T.Tensor((n,), dtype), B: T.Tensor((n,), dtype), C: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, block), threads=128) as bx:
            for i in T.Parallel(block):
                if bx * block + i < n:
                    C[bx * block + i] = A[bx * block + i] + B[bx * block + i]
    return vadd_kernel


def scale_kernel(factor):
    m = T.dynamic("m")

    @T.prim_func
    def scale(X: T.Tensor((m, 64), "float32"), Y: T.Tensor((m, 64), "float32")):
        with T.Kernel(T.ceildiv(m, 32), threads=128) as bx:
            tile = T.alloc_fragment((32, 64), "float32")
            T.copy(X[bx * 32, 0], tile)
            for i, j in T.Parallel(32, 64):
                tile[i, j] = tile[i, j] * factor
            T.copy(tile, Y[bx * 32, 0])
    return scale


def matmul_relu(M, N, K, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
    """The README kernel (compile it with ``out_idx=[-1]`` to get C returned)."""

    @T.prim_func
    def kernel(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
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

    return kernel
