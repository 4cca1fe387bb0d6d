# TileLang examples/topk/example_topk.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import tilecore as tilelang
import tilecore.language as T
import torch
import itertools


def get_configs():
    iter_params = dict(blk_m=[64, 128, 256], threads=[128, 256, 512])
    return [dict(zip(iter_params, values)) for values in itertools.product(*iter_params.values())]


@tilelang.autotune(configs=get_configs())
@tilelang.jit(out_idx=[1, 2])
def tl_topk(M, N, topk, blk_m, threads=128):
    dtype = T.float32

    @T.prim_func
    def topk_kernel(logits: T.Tensor([M, N], dtype), topk_gates: T.Tensor([M, topk], dtype), topk_indices: T.Tensor([M, topk], T.int32)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=threads) as bx:
            logits_frag = T.alloc_fragment([blk_m, N], dtype=dtype)
            max_val = T.alloc_fragment([blk_m], dtype=dtype)
            expand_max_idx = T.alloc_fragment([blk_m, N], T.int32)
            max_idx = T.alloc_fragment([blk_m], T.int32)
            T.copy(logits[bx * blk_m, 0], logits_frag)
            for k in T.serial(topk):
                T.fill(expand_max_idx, -1)
                T.reduce_max(logits_frag, max_val, dim=1, clear=True)
                for i, j in T.Parallel(blk_m, N):
                    expand_max_idx[i, j] = T.if_then_else(max_val[i] == logits_frag[i, j], j, expand_max_idx[i, j])
                T.reduce_max(expand_max_idx, max_idx, dim=1, clear=True)
                for i, j in T.Parallel(blk_m, N):
                    logits_frag[i, j] = T.if_then_else(max_val[i] == logits_frag[i, j], -10000.0, logits_frag[i, j])
                for i in T.Parallel(blk_m):
                    topk_gates[bx * blk_m + i, k] = max_val[i]
                    topk_indices[bx * blk_m + i, k] = max_idx[i]
    return topk_kernel


from ._driver import f64  # noqa: E402

KERNELS = [(tl_topk, (), dict(M=320, N=128, topk=6, blk_m=64, threads=128))]


def check():
    logits = torch.rand((96, 40), dtype=torch.float32)
    gates, indices = tl_topk(M=96, N=40, topk=4, blk_m=32, threads=128)(logits)
    ref_gates, ref_indices = torch.topk(f64(logits), 4, dim=-1)
    return [("topk_gates", gates, ref_gates), ("topk_indices", indices.to(torch.int64), ref_indices)]
