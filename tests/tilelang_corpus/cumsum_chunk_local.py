# TileLang examples/gdn/example_cumsum.py @ tile-ai/tilelang e3e71f0c8: kernel code as TileLang wrote it (comments dropped),
# imports renamed; the driver below is tilecore's, with sizes shrunk for the cpu target.
import tilecore as tilelang
import tilecore.language as T
import sys
import torch


@tilelang.jit(out_idx=[-1], pass_configs={tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True})
def tilelang_chunk_local_cumsum_scalar(B, S, H, chunk_size=64, is_varlen=False, head_first=False, reverse=False, input_dtype=T.float16, output_dtype=T.float32, block_S=64, threads=256, use_fragment=False):
    G_shape = (B, H, S) if head_first else (B, S, H)
    assert chunk_size == 2 ** (chunk_size.bit_length() - 1), 'chunk_size must be a power of 2'
    assert chunk_size == block_S, 'chunk_size must be equal to block_S'

    @T.prim_func
    def kernel(G: T.Tensor(G_shape, dtype=input_dtype), G_new: T.Tensor(G_shape, dtype=output_dtype)):
        with T.Kernel(T.ceildiv(S, block_S), B * H, threads=threads) as (bs, bbh):
            bb, bh = (bbh // H, bbh % H)
            G_shared = T.alloc_shared((1, block_S), dtype=output_dtype, scope='shared')
            if head_first:
                T.copy(G[bb, bh, bs * block_S:(bs + 1) * block_S], G_shared)
            else:
                T.copy(G[bb, bs * block_S:(bs + 1) * block_S, bh], G_shared)
            if use_fragment:
                G_fragment = T.alloc_fragment((1, block_S), dtype=output_dtype, scope='shared')
                T.copy(G_shared, G_fragment)
                T.cumsum(G_fragment, dim=1, reverse=reverse)
                if head_first:
                    T.copy(G_fragment, G_new[bb, bh, bs * block_S:(bs + 1) * block_S])
                else:
                    T.copy(G_fragment, G_new[bb, bs * block_S:(bs + 1) * block_S, bh])
            else:
                T.cumsum(G_shared, dim=1, reverse=reverse)
                if head_first:
                    T.copy(G_shared, G_new[bb, bh, bs * block_S:(bs + 1) * block_S])
                else:
                    T.copy(G_shared, G_new[bb, bs * block_S:(bs + 1) * block_S, bh])
    return kernel


from ._driver import f64, randn  # noqa: E402

KERNELS = [(tilelang_chunk_local_cumsum_scalar, (1, 4096, 32), {}),
           (tilelang_chunk_local_cumsum_scalar, (1, 4096, 32), dict(reverse=True, use_fragment=True))]


def _ref(G, chunk, reverse, head_first):
    g = f64(G) if head_first else f64(G).transpose(1, 2)
    B, H, S = g.shape
    g = g.reshape(B, H, S // chunk, chunk)
    r = g.flip(-1).cumsum(-1).flip(-1) if reverse else g.cumsum(-1)
    r = r.reshape(B, H, S)
    return r if head_first else r.transpose(1, 2)


def check():
    out = []
    for reverse, head_first, use_fragment in ((False, False, False), (True, True, False), (False, False, True)):
        B, S, H = 2, 128, 3
        G = randn(B, H, S) if head_first else randn(B, S, H)
        kernel = tilelang_chunk_local_cumsum_scalar(B, S, H, chunk_size=32, head_first=head_first, reverse=reverse,
                                                    block_S=32, threads=64, use_fragment=use_fragment)
        out.append((f"G_new reverse={reverse} head_first={head_first} fragment={use_fragment}", kernel(G),
                    _ref(G, 32, reverse, head_first)))
    return out
