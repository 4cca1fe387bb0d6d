# TileLang examples/gemm_streamk/example_tilelang_gemm_streamk.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import tilecore as tilelang
import tilecore.language as T


@tilelang.jit
def tl_matmul_streamk(M, N, K, streamk_tiles, block_M, block_N, block_K, trans_A, trans_B, dtypeAB, dtypeC, accum_dtype, num_stages, threads):
    assert not trans_A
    A_shape = (M, K) if not trans_A else (K, M)
    B_shape = (K, N) if not trans_B else (N, K)
    A_shared_shape = (block_M, block_K) if not trans_A else (block_K, block_M)
    B_shared_shape = (block_K, block_N) if not trans_B else (block_N, block_K)

    @T.prim_func
    def main(A: T.Tensor(A_shape, dtypeAB), B: T.Tensor(B_shape, dtypeAB), C: T.Tensor((M, N), dtypeC)):
        with T.Kernel(streamk_programs, threads=threads) as pid:
            A_shared = T.alloc_shared(A_shared_shape, dtypeAB)
            B_shared = T.alloc_shared(B_shared_shape, dtypeAB)
            A_shared_full_tiles = T.alloc_shared(A_shared_shape, dtypeAB)
            B_shared_full_tiles = T.alloc_shared(B_shared_shape, dtypeAB)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            start_iter = T.alloc_fragment((1,), T.int32, 'local')
            end_iter = T.alloc_fragment((1,), T.int32, 'local')
            start_iter[0] = pid * streamk_full_tiles + T.min(pid, streamk_partial_tiles)
            last_iter = (pid + 1) * streamk_full_tiles + T.min(pid + 1, streamk_partial_tiles)
            while start_iter[0] < last_iter:
                end_iter[0] = T.min(start_iter[0] + (iters_per_tile - start_iter[0] % iters_per_tile), last_iter)
                tile_id = start_iter[0] // iters_per_tile
                remain_iters = start_iter[0] % iters_per_tile
                pid_m = tile_id // T.ceildiv(N, block_N)
                pid_n = tile_id % T.ceildiv(N, block_N)
                T.clear(C_local)
                for k in T.Pipelined(end_iter[0] - start_iter[0], num_stages=num_stages):
                    T.copy(A[pid_m * block_M, (k + start_iter[0] % iters_per_tile) * block_K], A_shared)
                    T.copy(B[pid_n * block_N, (k + start_iter[0] % iters_per_tile) * block_K], B_shared)
                    T.gemm(A_shared, B_shared, C_local, transpose_B=trans_B)
                if remain_iters == 0 and end_iter[0] % iters_per_tile == 0:
                    T.copy(C_local, C[pid_m * block_M, pid_n * block_N])
                else:
                    for i, j in T.Parallel(block_M, block_N):
                        T.atomic_add(C[pid_m * block_M + i, pid_n * block_N + j], C_local[i, j])
                start_iter[0] = end_iter[0]
            if sm_patition_factor > 0:
                for p in T.serial(sm_patition_factor):
                    tile_id = pid + streamk_tiles + p * total_sm
                    pid_m = tile_id // T.ceildiv(N, block_N)
                    pid_n = tile_id % T.ceildiv(N, block_N)
                    T.clear(C_local)
                    for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=1):
                        T.copy(A[pid_m * block_M, k * block_K], A_shared_full_tiles)
                        T.copy(B[pid_n * block_N, k * block_K], B_shared_full_tiles)
                        T.gemm(A_shared_full_tiles, B_shared_full_tiles, C_local, transpose_B=trans_B)
                    T.copy(C_local, C[pid_m * block_M, pid_n * block_N])
    return main


import math  # noqa: E402

import torch  # noqa: E402

from ._driver import f64  # noqa: E402

# the example's module-level schedule, for a small problem on 8 "SMs" (the kernel reads these globals)
m, n, k, total_sm = 64, 128, 96, 8
BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K = 16, 32, 32
streamk_programs = total_sm
num_block_m, num_block_n = tilelang.cdiv(m, BLOCK_SIZE_M), tilelang.cdiv(n, BLOCK_SIZE_N)
iters_per_tile = tilelang.cdiv(k, BLOCK_SIZE_K)
total_tiles = num_block_m * num_block_n
streamk_tiles = total_tiles % streamk_programs
if total_tiles - streamk_tiles > streamk_programs:
    streamk_tiles += streamk_programs
blocking_tiles = total_tiles - streamk_tiles
streamk_iters = streamk_tiles * iters_per_tile
streamk_full_tiles = streamk_iters // streamk_programs
streamk_partial_tiles = streamk_iters % streamk_programs
sm_patition_factor = max(blocking_tiles // total_sm, 1)
ARGS = (m, n, k, streamk_tiles, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, False, True, T.float16, T.float16,
        T.float32, 2, 64)
KERNELS = [(tl_matmul_streamk, ARGS, {})]


def check():
    A = torch.rand(m, k, dtype=torch.float16) * 2 - 1
    B = torch.rand(n, k, dtype=torch.float16) * 2 - 1
    C = torch.zeros(m, n, dtype=torch.float16)
    tl_matmul_streamk(*ARGS)(A, B, C)
    return [("C", C, f64(A) @ f64(B).T)]
