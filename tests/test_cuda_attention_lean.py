"""Fewer instructions in the register programs' softmax, the same bits (docs/decisions.md D35), through the public API:

- ``tilecore.cuda.pack_direct``: P (``T.copy(acc_s, acc_s_cast)`` into a float16 fragment, used only as the second
  gemm's A) is packed straight from the float32 scores, one ``F2FP.PACK_AB`` per pair instead of a rounding,
  a conversion back and a packing;
- ``tilecore.cuda.exp2_range_check`` (exact build): ``F[i, j] = T.exp2(arg)`` computes the arguments, tests the
  thread's smallest (one ``FMNMX`` an element) and, where every lane of the warp has none below -126, runs
  ``ex2.approx.ftz`` alone, which is what ``exp2f`` runs for such arguments (its ``FSETP`` / halving / squaring
  act only below -126); else ``exp2f`` as written;
- ``tilecore.cuda.skip_unit_rescale``: the rescale of O skipped where no row factor of the warp differs from 1.

Without a GPU (CI): instruction counts per path through the benchmark's main loop (tests/sass_paths.py), which
also pin the ``exp2f`` lowering the range check relies on; the generated code only where the form holds (a
source written between the copy and the gemm keeps the rounded copy); the sm_80 register program on the host
emulator (tests/cuda_host_emulator.py), bit for bit against every option off and against float64, with inputs
that take both exp2 paths, and a mutation (packing from a source the program changed after the copy) caught. On
an sm_90 GPU: bit-identical outputs against every option off (exact build; both exp2 paths taken), float64
references, the 128 x 176 block at a sequence it does not divide.
"""
from __future__ import annotations

import dataclasses
import functools
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import sass_paths  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, _attention, hopper_gpu, torch_cuda  # noqa: E402,F401

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")

#: every option of D35 off, and each alone on (the defaults: pack_direct and exp2_range_check on)
OFF = {"tilecore.cuda.pack_direct": False, "tilecore.cuda.exp2_range_check": False,
       "tilecore.cuda.skip_unit_rescale": False}
LEAN = {"off": OFF, "pack": {**OFF, "tilecore.cuda.pack_direct": True},
        "exp2": {**OFF, "tilecore.cuda.exp2_range_check": True},
        "rescale": {**OFF, "tilecore.cuda.skip_unit_rescale": True},
        "pack+rescale": {**OFF, "tilecore.cuda.pack_direct": True, "tilecore.cuda.skip_unit_rescale": True},
        "all": {k: True for k in OFF}, "default": {}}


@functools.lru_cache(maxsize=None)
def _bench(lean: str, fast: bool = False, bn: int = 128):
    """The benchmark's kernel (b8 h32 s4096 d128, 128 x bn, 256 threads, 2 stages, non-causal), compiled only."""
    return tilecore.compile(_attention(4096, 128, 128, bn, 256, False, heads=32, batch=8), target=HOPPER,
                            pass_configs={**NOCACHE, **LEAN[lean], "tilecore.fast_math": fast})


@functools.lru_cache(maxsize=None)
def _loop(lean: str, fast: bool = False, bn: int = 128) -> list:
    k = _bench(lean, fast, bn)
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "STL" not in sass and "LDL" not in sass  # the fragments stay in registers
    return sass_paths.loop_counts(sass)


def test_defaults_are_the_documented_settings():
    from tilecore_cuda import _lean

    assert (_lean.PACK_DIRECT_DEFAULT, _lean.EXP2_RANGE_CHECK_DEFAULT, _lean.SKIP_UNIT_RESCALE_DEFAULT) == \
        (True, False, False)


@needs_toolchain
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_skip_unit_rescale_is_one_warp_decision(fast):
    """Asked for, the rescale runs where some lane of the warp has a row factor other than 1, in both builds;
    off (the default), as written."""
    on = tilecore.compile(chain(256, 64, exp2=True, rescale=True), target=HOPPER,
                          pass_configs={**NOCACHE, "tilecore.fast_math": fast,
                                        "tilecore.cuda.skip_unit_rescale": True}).get_kernel_source()
    assert "__any_sync(0xffffffffu, r[0] != 1.0f || r[1] != 1.0f)" in on
    off = tilecore.compile(chain(256, 64, exp2=True, rescale=True), target=HOPPER,
                           pass_configs={**NOCACHE, "tilecore.fast_math": fast}).get_kernel_source()
    assert "__any_sync" not in off.split("__global__")[-1]


@needs_toolchain
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_pack_direct_one_conversion_per_pair(fast):
    src = _bench("pack", fast).get_kernel_source()
    assert "tc_pack_h2(acc_s[2 * tc_q], acc_s[2 * tc_q + 1])" in src and "tc_round_h(acc_s[" not in src
    assert "tc_round_h(acc_s[" in _bench("off", fast).get_kernel_source()
    (on,), (off,) = _loop("pack", fast), _loop("off", fast)
    # 64 scores a thread: 32 F2FP.PACK_AB; before, each score rounded (F2FP), widened back (HADD2.F32) and
    # the pairs packed again (F2FP.PACK_AB in the exact build; fast math folds that into the first)
    assert (on["F2FP"], on["HADD2"]) == (32, 0)
    assert (off["F2FP"], off["HADD2"]) == ((64, 64) if fast else (96, 64))
    saved = off["F2FP"] + off["HADD2"] - on["F2FP"] - on["HADD2"]
    assert on["total"] <= off["total"] - saved + 8  # the rest of the loop as it was, give or take scheduling


@needs_toolchain
@pytest.mark.parametrize("bn", [128, 176])
def test_exp2_range_check_paths(bn):
    n = bn // 2  # scores a thread
    (off,) = _loop("off", False, bn)
    # what the check relies on: exp2f without flushing is MUFU.EX2 behind a test of its input against -126 and
    # two predicated multiplies (halve the input, square the result) for arguments below it. A toolchain that
    # lowers exp2f otherwise fails here, and D35's argument must be made again.
    assert off["MUFU"] == off["exp2f range tests"] == n + 2 and off["predicated FMUL"] == 2 * (n + 2)
    fast_path, slow_path = _loop("exp2", False, bn)
    # the checked path: only the two row factors' exp2f keep their tests; each score costs one FMNMX instead
    assert fast_path["MUFU"] == n + 2 and fast_path["exp2f range tests"] == 2 and fast_path["predicated FMUL"] == 4
    assert fast_path["FMNMX"] == off["FMNMX"] + n - 1 and fast_path["VOTE"] == 1
    assert fast_path["total"] <= off["total"] - n
    # the other path: exp2f as written
    assert slow_path["exp2f range tests"] == n + 2
    # fast math: the option changes nothing (exp2f is ex2.approx.ftz there already)
    assert _bench("exp2", True, bn).get_kernel_source() == _bench("off", True, bn).get_kernel_source()


@needs_toolchain
@pytest.mark.parametrize("seq,causal", [(4096, False), (1000, True)], ids=["ragged", "causal"])
def test_176_block_keeps_the_protocols(seq, causal):
    """FA3's 128 x 176 block at a sequence it does not divide (4096 = 23 x 176 + 48) and causal: the consumers on
    the host simulator (tests/regprog_sim.py) for every trip and split count (turns, WGMMA hazards, the unmasked
    iterations, every register array's history as with the split off), and the split count against brute force."""
    from test_cuda_attention_softmax import _count_problems, _split_problems

    shape = (seq, 128, 128, 176, 256, causal)
    every = {**NOCACHE, **LEAN["all"]}
    src = tilecore.compile(_attention(*shape), target=HOPPER, pass_configs=every).get_kernel_source()
    base = tilecore.compile(_attention(*shape), target=HOPPER,
                            pass_configs={**every, "tilecore.cuda.split_masked_loop": False}).get_kernel_source()
    assert "tc_ex2_ftz(acc_s[tc_q])" in src and "tc_pack_h2(acc_s[2 * tc_q], acc_s[2 * tc_q + 1])" in src
    assert _split_problems(src, base, 2) == []
    assert _count_problems(src, seq, 128, 176, causal) == []


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
@pytest.mark.parametrize("target", ["cuda:sm_90a", "cuda:sm_80"])
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


# -- on an sm_90 GPU ----------------------------------------------------------------------------------------

#: (seq, dim, bm, bn, threads, causal): the 176-wide block at a sequence it does not divide (the last K/V block
#: has 48 keys: TMA zero-fills the rest, the mask's -inf covers their scores), causal at 176, the benchmark's
#: 128 x 128 block, three consumers at d64
DEVICE = {"176-ragged": (4096, 128, 128, 176, 256, False), "176-causal": (1000, 128, 128, 176, 256, True),
          "128": (1024, 128, 128, 128, 256, False), "d64-3wg-causal": (1000, 64, 192, 64, 384, True)}


def _device_run(torch, shape, configs, fast=False):
    seq, dim, bm, bn, threads, causal = DEVICE[shape]
    rng = np.random.default_rng(13)
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float32) for _ in range(3))
    q[1] *= 40  # head 1: exp2's arguments below -126 (the unchecked path)
    q, kk, v = (torch.from_numpy(x).half().cuda() for x in (q, kk, v))
    k = tilecore.compile(_attention(seq, dim, bm, bn, threads, causal), target="cuda",
                         pass_configs={**configs, "tilecore.fast_math": fast})
    o = torch.full_like(q, float("nan"))
    k(q, kk, v, o)
    torch.cuda.synchronize()
    return [x.cpu().numpy() for x in (q, kk, v)], o.double().cpu().numpy()


@hopper_gpu
@pytest.mark.parametrize("lean", ["pack", "exp2", "rescale", "pack+rescale", "all"])
@pytest.mark.parametrize("shape", list(DEVICE))
def test_device_lean_bit_identical_to_off(torch_cuda, shape, lean):
    from tilecore_conformance.composite import attention_ref

    inputs, got = _device_run(torch_cuda, shape, LEAN[lean])
    _, base = _device_run(torch_cuda, shape, OFF)
    assert got.tobytes() == base.tobytes()
    seq, dim, *_, causal = DEVICE[shape]
    ref = attention_ref(inputs, "float16", causal, seq=seq, dim=dim)[0]
    np.testing.assert_allclose(got, ref, atol=2e-2, rtol=2e-2)


@hopper_gpu
@pytest.mark.parametrize("shape", list(DEVICE))
def test_device_fast_math_matches_float64(torch_cuda, shape):
    from tilecore_conformance.composite import attention_ref

    inputs, got = _device_run(torch_cuda, shape, LEAN["all"], fast=True)
    seq, dim, *_, causal = DEVICE[shape]
    ref = attention_ref(inputs, "float16", causal, seq=seq, dim=dim)[0]
    np.testing.assert_allclose(got, ref, atol=2e-2, rtol=2e-2)
