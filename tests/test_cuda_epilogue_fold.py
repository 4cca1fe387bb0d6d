"""The register programs' epilogues of TileLang's attention examples (docs/decisions.md D33), through the public API.

TileLang's FlashAttention examples end ``T.copy(acc_o, O_shared)`` then ``T.copy(O_shared, Output[...])``. The
register programs (backends/cuda/tilecore_cuda/regprog.py) fold such a tile, one that only relays a fragment
to global memory, into their store from registers, rounded through the tile's dtype. Checked here without a
GPU: the corpus's forward-attention examples take the register program on sm_90a and sm_80; the sm_80
program (mma.sync + cp.async) runs on the host emulator (tests/cuda_host_emulator.py) against float64
references, for the corpus kernel as TileLang wrote it and for a GEMM whose tile's dtype is narrower than
its output's (with a mutation: the rounding through the tile dropped from the generated code is caught); a
tile with any other use is not folded and the note says why. The backward examples' forward kernel stores a
row value per query row (``T.copy(logsum, lse[...])``, a 1-D fragment) from registers: it takes the register
program too, checked the same way (output and lse on the host, a mutated store caught). On a GPU the corpus runner
(``TILECORE_CORPUS_DEVICE=cuda:sm_90a pytest tests/test_tilelang_corpus.py -k device``) runs the same kernels.
"""
from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T

tilecore_cuda = pytest.importorskip("tilecore_cuda")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from cuda_host_emulator import run_on_host  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")


def _corpus(name):
    sys.path.insert(0, str(HERE))
    import importlib

    return importlib.import_module(f"tilelang_corpus.{name}")


def _notes(k) -> list:
    return list(k.meta["attrs"].get("hopper_pipelines", ()))


def gemm_via_tile(M, N, K, tile_dtype="float16", out_dtype="float32", extra_use=False):
    """C = A @ B with the README's epilogue through a shared tile: ``T.copy(C_local, C_shared)`` then
    ``T.copy(C_shared, C[...])``; ``extra_use`` also reads the tile in a ``T.Parallel`` nest (no fold)."""
    bm, bn, bk = 64, 64, 64

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), out_dtype),
             D: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            C_s = T.alloc_shared((bm, bn), tile_dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C_s)
            T.copy(C_s, C[by * bm, bx * bn])
            if extra_use:
                for i, j in T.Parallel(bm, bn):
                    D[by * bm + i, bx * bn + j] = C_s[i, j]

    return main


@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("causal", [False, True])
def test_corpus_attention_on_the_host(causal):
    """TileLang's example_mha_fwd_bhsd kernel, untouched, at the corpus driver's sizes, on the sm_80 register
    program (mma.sync + cp.async, 2 stages, the folded epilogue) run on the host: seq_kv > seq_q (the causal
    mask's past), 3 key blocks."""
    import torch

    from tilelang_corpus._driver import attention_ref

    mod = _corpus("attention_mha_fwd_bhsd")
    args, kwargs = mod.CHECK[int(causal)]
    assert args[5] == causal
    k = tilecore.compile(mod.flashattn.jit_fn.get_tir(*args, **kwargs), target="cuda:sm_80", out_idx=[3],
                         pass_configs=NOCACHE)
    assert tilecore_cuda.lowering_path(k) == "register program (mma.sync)", _notes(k)
    rng = np.random.default_rng(3)
    q, kk, v = (rng.standard_normal(s).astype(np.float16) for s in ((1, 2, 128, 64), (1, 2, 192, 64), (1, 2, 192, 64)))
    out = run_on_host(k, [q, kk, v, np.full(q.shape, np.nan, np.float16)])[3].astype(np.float64)
    ref = attention_ref(*(torch.from_numpy(x) for x in (q, kk, v)), causal).numpy()
    assert np.abs(out - ref).max() <= 2e-3


def _run_gemm(k, M, N, K, out_dtype, mutate=None):
    if mutate:
        src = k.source
        code = mutate(src.code)
        assert code != src.code, "the mutation changed nothing"
        k = dataclasses.replace(k, source=dataclasses.replace(src, code=code)) if dataclasses.is_dataclass(k) else \
            type("K", (), {"source": dataclasses.replace(src, code=code)})()
    rng = np.random.default_rng(4)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = np.full((M, N), np.nan, out_dtype)
    out = run_on_host(k, [a, b, c, np.zeros((M, N), out_dtype)])[2]
    return out, a.astype(np.float64) @ b.astype(np.float64)


def _check_via_f16(out, ref):
    """Close to the reference, and every value exactly a float16 (what the float16 tile held)."""
    assert np.abs(out - ref).max() <= 1e-3 * np.abs(ref).max() + 2e-2
    assert (out.astype(np.float16).astype(np.float32) == out).all(), "values not rounded through the float16 tile"


@needs_toolchain
@needs_gxx
def test_gemm_epilogue_rounds_through_the_tile_dtype():
    """A float16 tile between a float32 accumulator and a float32 output: folded, and the store rounds through
    float16 as the round trip did (ragged M and N: the store's edge guards). Mutation: the rounding dropped
    from the generated store, the float32 values come through and the check catches it."""
    M, N, K = 100, 72, 128
    k = tilecore.compile(gemm_via_tile(M, N, K), target="cuda:sm_80", pass_configs={**NOCACHE, "tilecore.cuda.register_programs": True})  # pinned (D63)
    assert tilecore_cuda.lowering_path(k) == "register program (mma.sync)", _notes(k)
    assert any("C_s only relayed a fragment" in n for n in _notes(k)), _notes(k)
    out, ref = _run_gemm(k, M, N, K, np.float32)
    _check_via_f16(out, ref)
    mutated, ref = _run_gemm(k, M, N, K, np.float32, mutate=lambda c: c.replace("tc_round_h(C_l[", "(C_l["))
    with pytest.raises(AssertionError, match="not rounded through"):
        _check_via_f16(mutated, ref)


@needs_toolchain
def test_tile_with_another_use_is_not_folded():
    """The tile also read by a T.Parallel nest: not folded; the kernel stays off the register program and
    the note says why, naming the tile and the fragment (sm_80: on sm_90a the Hopper GEMM pipeline takes
    this GEMM first; the analysis is the same code)."""
    k = tilecore.compile(gemm_via_tile(128, 128, 128, extra_use=True), target="cuda:sm_80", pass_configs=NOCACHE)
    assert tilecore_cuda.lowering_path(k) != "register program (mma.sync)"
    why = [n for n in _notes(k) if n.startswith("cuda.register_program")]
    assert any("C_s: a shared tile filled from fragment C_l is used otherwise than relaying it" in n
               for n in why), why


def _bwd_forward_on_host(causal, mutate=None):
    import torch

    from tilelang_corpus._driver import attention_lse2, attention_ref

    mod = _corpus("attention_mha_bwd_bhsd")
    args, kwargs = mod.FWD_CHECK[int(causal)]
    assert args[4] == causal
    k = tilecore.compile(mod.flashattn_fwd.get_tir(*args, **kwargs), target="cuda:sm_80", out_idx=[3, 4],
                         pass_configs=NOCACHE)
    assert tilecore_cuda.lowering_path(k) == "register program (mma.sync)", _notes(k)
    if mutate:
        code = mutate(k.source.code)
        assert code != k.source.code, "the mutation changed nothing"
        k = type("K", (), {"source": dataclasses.replace(k.source, code=code)})()
    b, h, s, d = args[:4]
    rng = np.random.default_rng(6)
    q, kk, v = (rng.standard_normal((b, h, s, d)).astype(np.float16) for _ in range(3))
    res = run_on_host(k, [q, kk, v, np.full(q.shape, np.nan, np.float16), np.full((b, h, s), np.nan, np.float32)])
    tq, tk, tv = (torch.from_numpy(x) for x in (q, kk, v))
    return (np.abs(res[3].astype(np.float64) - attention_ref(tq, tk, tv, causal).numpy()).max(),
            np.abs(res[4].astype(np.float64) - attention_lse2(tq, tk, causal).numpy()).max())


@needs_toolchain
@needs_gxx
def test_corpus_bwd_forward_on_the_host():
    """example_mha_bwd_bhsd's forward, causal, on the sm_80 register program on the host: the output and the
    log2-sum-exp row values against float64. Mutation: every thread stores its first row's value in both of
    its rows (``[tc_h]`` -> ``[0]`` in the lse store): the lse check catches it."""
    o_err, lse_err = _bwd_forward_on_host(True)
    assert o_err <= 2e-3 and lse_err <= 1e-4, (o_err, lse_err)
    _, lse_err = _bwd_forward_on_host(True, mutate=lambda c: c.replace("tc_store1<float>(tc_g + (long long)(tc_row + "
                                                                      "8 * tc_h) * tc_ld, logsum[tc_h])",
                                                                      "tc_store1<float>(tc_g + (long long)(tc_row + "
                                                                      "8 * tc_h) * tc_ld, logsum[0])"))
    assert lse_err > 1e-2
