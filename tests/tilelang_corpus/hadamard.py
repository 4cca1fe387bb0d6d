# TileLang examples/hadamard_transform/example_hadamard.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import tilecore as tilelang
import tilecore.language as T
from tilecore.cuda.intrinsics import make_mma_swizzle_layout
import math
import torch
from torch.nn import functional as F
import scipy


def is_pow_of_2(n):
    return isinstance(n, int) and n > 0 and (n & n - 1 == 0)


@tilelang.jit(out_idx=[1])
def hadamard(b, n, dtype):
    assert is_pow_of_2(n), 'n must be a power of 2'
    assert 2 <= n <= 32768, 'n must be in [2, 32768]'
    elem_size = {T.float32: 4, T.float16: 2, T.bfloat16: 2}[dtype]
    logN = int(math.log2(n))
    threads = [0, 1, 1, 1, 2, 4, 8, 16, 32, 32, 128, 256, 256, 256, 256, 256][logN]
    thread_elem = n // threads
    thread_round = int(math.log2(thread_elem))
    warps = 1 if threads <= 32 else threads // 32
    warp_round = int(math.log2(threads / warps))
    warp_size = threads // warps
    block_round = int(math.log2(warps))
    exchange_round = n * elem_size // 32768 if n * elem_size > 32768 else 1
    thread_elem_in_smem = thread_elem // exchange_round if exchange_round > 1 else thread_elem

    @T.macro
    def warp_shfl(local: T.Tensor((thread_elem,), dtype), buf: T.Tensor((thread_elem,), dtype), round: int):
        tx = T.get_thread_binding(0)
        for i in T.serial(round):
            tx_stride = 1 << i
            another_tx = tx ^ tx_stride
            sign = tx >> i & 1
            for j in T.Pipelined(thread_elem, num_stages=1):
                buf[j] = T.tvm_warp_shuffle(4294967295, local[j], another_tx % warp_size, warp_size, warp_size)
                local[j] = T.if_then_else(sign == 0, local[j] + buf[j], buf[j] - local[j])

    @T.prim_func
    def main(A: T.Tensor((b, n), dtype), B: T.Tensor((b, n), dtype)):
        with T.Kernel(b, threads=threads) as bx:
            local = T.alloc_local((thread_elem,), dtype)
            shared = T.alloc_shared((threads, thread_elem_in_smem), dtype)
            T.annotate_layout({shared: make_mma_swizzle_layout(shared)})
            tx = T.get_thread_binding(0)
            for i in T.vectorized(thread_elem):
                local[i] = A[bx, tx * thread_elem + i]
            for i in T.serial(thread_round):
                chunksize = 1 << i + 1
                chunknum = thread_elem // chunksize
                for j in T.serial(chunknum):
                    chunkbase = j * chunksize
                    for k in T.serial(chunksize // 2):
                        local[chunkbase + k] = local[chunkbase + k] + local[chunkbase + k + chunksize // 2]
                        local[chunkbase + k + chunksize // 2] = local[chunkbase + k] - 2 * local[chunkbase + k + chunksize // 2]
            another_val = T.alloc_local((thread_elem,), dtype)
            warp_shfl(local, another_val, warp_round)
            if block_round > 0:
                warp_id = tx // warp_size
                lane_id = tx % warp_size
                src_tx = warp_id * warp_size + lane_id
                tgt_warp_id = tx % warps
                tgt_lane_id = tx // warps
                tgt_tx = tgt_warp_id * warp_size + tgt_lane_id
                for cur_round in T.serial(exchange_round):
                    exchange_base = thread_elem_in_smem * cur_round
                    for j in T.vectorized(thread_elem_in_smem):
                        shared[src_tx, j] = local[exchange_base + j]
                    for j in T.vectorized(thread_elem_in_smem):
                        local[exchange_base + j] = shared[tgt_tx, j]
                warp_shfl(local, another_val, block_round)
                for cur_round in T.serial(exchange_round):
                    exchange_base = thread_elem_in_smem * cur_round
                    for j in T.vectorized(thread_elem_in_smem):
                        shared[tgt_tx, j] = local[exchange_base + j]
                    for j in T.vectorized(thread_elem_in_smem):
                        local[exchange_base + j] = shared[src_tx, j]
            for i in T.vectorized(thread_elem):
                B[bx, tx * thread_elem + i] = local[i]
    return main


from ._driver import f64  # noqa: E402

KERNELS = [(hadamard, (64, 4096, T.float32), {})]


def check():
    x = torch.randn(4, 256)
    y = hadamard(4, 256, T.float32)(x)
    return [("B", y, f64(x) @ torch.tensor(scipy.linalg.hadamard(256), dtype=torch.float64))]
