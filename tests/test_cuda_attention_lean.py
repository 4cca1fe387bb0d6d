"""Fewer instructions in the mma.sync register program's softmax, the same bits (docs/decisions.md D35), through the public API:

- ``tilecore.cuda.pack_direct``: P (``T.copy(acc_s, acc_s_cast)`` into a float16 fragment, used only as the second
  gemm's A) is packed straight from the float32 scores, one ``F2FP.PACK_AB`` per pair instead of a rounding,
  a conversion back and a packing;
- ``tilecore.cuda.exp2_range_check`` (exact build): ``F[i, j] = T.exp2(arg)`` computes the arguments, tests the
  thread's smallest (one ``FMNMX`` an element) and, where every lane of the warp has none below -126, runs
  ``ex2.approx.ftz`` alone, which is what ``exp2f`` runs for such arguments (its ``FSETP`` / halving / squaring
  act only below -126); else ``exp2f`` as written;
- ``tilecore.cuda.skip_unit_rescale``: the rescale of O skipped where no row factor of the warp differs from 1.

The generated code only where the form holds (a source written between the copy and the gemm keeps the rounded
copy); the sm_80 register program on the host emulator (tests/cuda_host_emulator.py), bit for bit against every
option off and against float64, with inputs that take both exp2 paths, and a mutation (packing from a source the
program changed after the copy) caught. D86 retired the WGMMA register program (sm_90a) whose SASS counts and device
runs these options were measured on; the mma.sync program keeps them.
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

sys.path.insert(0, str(Path(__file__).parent))

from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import _attention  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")

#: every option of D35 off, and each alone on (the defaults: pack_direct and exp2_range_check on)
OFF = {"tilecore.cuda.pack_direct": False, "tilecore.cuda.exp2_range_check": False,
       "tilecore.cuda.skip_unit_rescale": False}
LEAN = {"off": OFF, "pack": {**OFF, "tilecore.cuda.pack_direct": True},
        "exp2": {**OFF, "tilecore.cuda.exp2_range_check": True},
        "rescale": {**OFF, "tilecore.cuda.skip_unit_rescale": True},
        "pack+rescale": {**OFF, "tilecore.cuda.pack_direct": True, "tilecore.cuda.skip_unit_rescale": True},
        "all": {k: True for k in OFF}, "default": {}}


def test_defaults_are_the_documented_settings():
    from tilecore_cuda import _lean

    assert (_lean.PACK_DIRECT_DEFAULT, _lean.EXP2_RANGE_CHECK_DEFAULT, _lean.SKIP_UNIT_RESCALE_DEFAULT) == \
        (True, False, False)


def chain(seq, dim, bm=64, bn=64, threads=128, between=False, exp2=False, rescale=False):
    """Two gemms, P = relu(S) (or exp2(S / 8 - 1)) copied to float16 between them; ``between`` scales S
    after the copy and before the second gemm (the copy's values are no longer S's: no direct pack);
    ``rescale`` multiplies O by a row factor before the second gemm (0.5 where the row's largest P exceeds 2,
    else exactly 1: the skip's case)."""

    @T.prim_func
    def main(Q: T.Tensor((seq, dim), "float16"), K: T.Tensor((seq, dim), "float16"),
             V: T.Tensor((seq, dim), "float16"), O: T.Tensor((seq, dim), "float32")):
        with T.Kernel(T.ceildiv(seq, bm), threads=threads) as bx:
            Q_s = T.alloc_shared((bm, dim), "float16")
            K_s = T.alloc_shared((bn, dim), "float16")
            V_s = T.alloc_shared((bn, dim), "float16")
            s = T.alloc_fragment((bm, bn), "float32")
            p = T.alloc_fragment((bm, bn), "float16")
            o = T.alloc_fragment((bm, dim), "float32")
            r = T.alloc_fragment((bm,), "float32")
            T.copy(Q[bx * bm, 0], Q_s)
            T.fill(o, 0)
            for k in T.Pipelined(T.ceildiv(seq, bn), num_stages=2):
                T.copy(K[k * bn, 0], K_s)
                T.fill(s, 0)
                T.gemm(Q_s, K_s, s, transpose_B=True)
                for i, j in T.Parallel(bm, bn):
                    if exp2:
                        s[i, j] = T.exp2(s[i, j] * 0.125 - 1.0)
                    else:
                        s[i, j] = T.max(s[i, j], 0.0) * 0.125
                if rescale:
                    T.reduce_max(s, r, dim=1)
                    for i in T.Parallel(bm):
                        r[i] = T.if_then_else(r[i] > 2.0, 0.5, 1.0)
                    for i, j in T.Parallel(bm, dim):
                        o[i, j] = o[i, j] * r[i]
                T.copy(s, p)
                if between:
                    for i, j in T.Parallel(bm, bn):
                        s[i, j] = s[i, j] * 3.0
                T.copy(V[k * bn, 0], V_s)
                T.gemm(p, V_s, o)
            T.copy(o, O[bx * bm, 0])

    return main


def _chain_ref(q, k, v, between=False, exp2=False, rescale=False, bn=64):
    o = np.zeros((q.shape[0], v.shape[1]))
    for k0 in range(0, k.shape[0], bn):
        s = q.astype(np.float64) @ k[k0:k0 + bn].astype(np.float64).T
        p = np.exp2(s * 0.125 - 1.0) if exp2 else np.maximum(s, 0) * 0.125
        if rescale:
            o *= np.where(p.max(1) > 2.0, 0.5, 1.0)[:, None]
        o += p.astype(np.float16).astype(np.float64) @ v[k0:k0 + bn].astype(np.float64)
    return o


@needs_toolchain
@pytest.mark.parametrize("target", ["cuda:sm_80"])
def test_pack_direct_only_where_the_copy_holds_the_source(target):
    on = tilecore.compile(chain(256, 64), target=target, pass_configs=NOCACHE).get_kernel_source()
    assert "tc_pack_h2(s[2 * tc_q], s[2 * tc_q + 1])" in on and "tc_round_h(s[" not in on
    kept = tilecore.compile(chain(256, 64, between=True), target=target, pass_configs=NOCACHE).get_kernel_source()
    assert "tc_pack_h2(p[2 * tc_q], p[2 * tc_q + 1])" in kept and "tc_round_h(s[tc_q])" in kept
    # exp2 of a nest in the exact build: arguments first, the check, two ways
    ex = tilecore.compile(chain(256, 64, exp2=True), target=target,
                          pass_configs={**NOCACHE, **LEAN["exp2"]}).get_kernel_source()
    assert "tc_ex2_ftz(s[tc_q])" in ex and "= exp2f(s[tc_q]);" in ex and ">= -126.0f))" in ex
    assert "tc_ex2_ftz" not in tilecore.compile(chain(256, 64, exp2=True), target=target,
                                                pass_configs={**NOCACHE, **OFF}).get_kernel_source().split("__global__")[-1]


def _host(k, arrays, edit=None):
    from cuda_host_emulator import run_on_host

    if edit:
        src = k.source
        code = src.code.replace(*edit)
        assert code != src.code, "the mutation changed nothing"
        k = type("K", (), {"source": dataclasses.replace(src, code=code)})()
    return run_on_host(k, arrays)


@needs_toolchain
@needs_gxx
def test_host_chain_packs_what_the_program_rounded():
    """The sm_80 register program on the host: the direct pack with the exp2 form and the skipped rescale (every
    change; bit for bit as with them off), and the kept copy where S changes after it, against float64 of P
    rounded to float16. Mutation: the kept copy's gemm packing S instead (the scaled values) is caught."""
    rng = np.random.default_rng(5)
    seq, dim = 128, 64
    q, kk, v = (rng.standard_normal((seq, dim)).astype(np.float16) for _ in range(3))
    out = np.full((seq, dim), np.nan, np.float32)
    outs = []
    for lean in ("all", "off"):
        k = tilecore.compile(chain(seq, dim, exp2=True, rescale=True), target="cuda:sm_80",
                             pass_configs={**NOCACHE, **LEAN[lean]})
        outs.append(_host(k, [q, kk, v, out.copy()])[3])
    assert outs[0].tobytes() == outs[1].tobytes()
    ref = _chain_ref(q, kk, v, exp2=True, rescale=True)
    np.testing.assert_allclose(outs[0].astype(np.float64), ref, atol=2e-3 * np.abs(ref).max(), rtol=1e-3)
    k = tilecore.compile(chain(seq, dim, between=True), target="cuda:sm_80", pass_configs=NOCACHE)
    got = _host(k, [q, kk, v, out.copy()])[3].astype(np.float64)
    ref = _chain_ref(q, kk, v, between=True)
    np.testing.assert_allclose(got, ref, atol=2e-3 * np.abs(ref).max(), rtol=1e-3)
    bad = _host(k, [q, kk, v, out.copy()], ("tc_pack_h2(p[2 * tc_q], p[2 * tc_q + 1])",
                                            "tc_pack_h2(s[2 * tc_q], s[2 * tc_q + 1])"))[3].astype(np.float64)
    assert not np.allclose(bad, ref, atol=2e-3 * np.abs(ref).max(), rtol=1e-3)


@needs_toolchain
@needs_gxx
def test_host_attention_bit_identical_to_every_option_off():
    """The catalog's attention (causal, seq 192, d64, 64 x 64 blocks) on the sm_80 register program on the host:
    bit for bit the same output with D35's options on as off, and within float16's reach of float64. Head 1's
    queries are scaled by 40, so its scores spread over thousands and exp2's arguments fall below -126 (the
    unchecked path, and flushed-or-subnormal probabilities); head 0 takes the checked one."""
    from tilecore_conformance.composite import attention_ref

    rng = np.random.default_rng(9)
    seq, dim = 192, 64
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float32) for _ in range(3))
    q[1] *= 40
    q, kk, v = (x.astype(np.float16) for x in (q, kk, v))
    outs = []
    for lean in ("all", "off"):
        k = tilecore.compile(_attention(seq, dim, 64, 64, 128, True), target="cuda:sm_80",
                             pass_configs={**NOCACHE, **LEAN[lean]})
        assert ("tc_ex2_ftz" in k.get_kernel_source().split("__global__")[-1]) == (lean == "all")
        outs.append(_host(k, [q, kk, v, np.full(q.shape, np.nan, np.float16)])[3])
    assert outs[0].tobytes() == outs[1].tobytes()
    ref = attention_ref([q, kk, v], "float16", True, seq=seq, dim=dim)[0]
    np.testing.assert_allclose(outs[0].astype(np.float64), ref, atol=2e-2, rtol=2e-2)
