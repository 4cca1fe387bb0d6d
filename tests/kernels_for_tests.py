"""Small kernels shared by the infrastructure tests (cache, export, CLI, errors)."""
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
