"""The softmax's critical path in the register programs (docs/decisions.md D39), through the public API:

- ``tilecore.cuda.tree_reduce`` (on where the loop runs 5 times or more; H100: non-causal fast 128 x 128 667.1 ->
  677.2 TFLOP/s, exact 128 x 176 579.4 -> 612.3): a row maximum (or minimum) of a 2-D fragment as k partial
  chains (4 for rows of up to 32 values a thread, else 2) combined pairwise, the identity applied last, instead of
  one chain of n / 4 dependent ``FMNMX``: the same instructions and the same bits (max and min are exact,
  commutative and associative; a row whose every value ``fmaxf`` drops, NaN, still gives the identity), a shorter
  wait before the first exp2.

- ``tilecore.cuda.softmax_beside_pv`` (off until measured): with the intra-warpgroup overlap, the wait for P @ V,
  the release of its V stage and the work on its fragments (O's rescale, P's pack) run at the start of the next
  iteration, after its barrier waits, so the exp2s run while P @ V does: ptxas otherwise hoists the wait above
  the softmax (to free P's registers). Where the fragments carried across an iteration's end fit 160 registers
  a thread (128 x 128 at d128), with FA3's register split (``tilecore.cuda.producer_registers`` 24: the
  consumers get 240); wider blocks keep the schedule (a note says why). Every register array sees the same
  operations in the same order: the same bits.

- ``tilecore.cuda.row_sum_per_thread`` (off until measured; fast math only, the order of additions changes): a
  row sum read only by a running sum ``L = L * X + r`` (X the same in a row's four threads) stays per thread; the
  quad's parts are added once after the loop (FA3's ``finalize``): 4 SHFL and 4 FADD an iteration fewer.

Without a GPU (CI): the dependency depth and the instruction counts of the benchmark's main loop from its SASS
(tests/sass_paths.py), the fact D39 builds on (ptxas runs none of the exp2s while the P @ V WGMMA does: it hoists
the wait for it above the softmax), and the sm_80 register program on the host emulator, bit for bit against
the chain, with a row of NaN scores, one of signed zeros and the causal mask's -inf; the softmax beside P @ V:
every exp2 between the two waits in the SASS, no local memory, and its protocols on the host simulator
(tests/regprog_sim.py: WGMMA hazards, stage releases, turns, each register array's history as before) for every
trip and split count, with a mutation (the first iteration's release unguarded) caught. On an sm_90 GPU:
bit-identical outputs against the defaults (exact and fast math), float64 references.
"""
from __future__ import annotations

import functools
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import sass_paths  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, _attention, _notes, hopper_gpu, torch_cuda  # noqa: E402,F401

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")

CHAIN = {"tilecore.cuda.tree_reduce": False}
TREE = {"tilecore.cuda.tree_reduce": True}
BESIDE = {"tilecore.cuda.softmax_beside_pv": True}


@functools.lru_cache(maxsize=None)
def _bench(tree: bool, fast: bool, bn: int, beside: bool = False, pingpong=None):
    """The benchmark's kernel (b8 h32 s4096 d128, 128 x bn, 256 threads, 2 stages, non-causal), compiled only;
    ``pingpong`` None: the build's default (on exact, off under fast math: D52)."""
    pp = {} if pingpong is None else {"tilecore.cuda.pingpong": pingpong}
    return tilecore.compile(_attention(4096, 128, 128, bn, 256, False, heads=32, batch=8), target=HOPPER,
                            pass_configs={**NOCACHE, **(TREE if tree else CHAIN), **(BESIDE if beside else {}),
                                          "tilecore.fast_math": fast, **pp})


@functools.lru_cache(maxsize=None)
def _sass(tree: bool, fast: bool, bn: int, beside: bool = False, pingpong=None) -> str:
    k = _bench(tree, fast, bn, beside, pingpong)
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "STL" not in sass and "LDL" not in sass  # the fragments stay in registers
    return sass


def test_tree_default_and_chains():
    from tilecore_cuda import _lean

    assert _lean.TREE_REDUCE_DEFAULT is True and _lean.TREE_MIN_TRIPS == 5
    assert [_lean.reduce_chains(True, n) for n in (16, 32, 44)] == [4, 4, 2]
    assert _lean.reduce_chains(False, 44) == 1 and _lean.reduce_chains(8, 44) == 8 and _lean.reduce_chains(8, 4) == 4
    with pytest.raises(ValueError, match="tilecore.cuda.tree_reduce: 3 partial chains"):
        _lean.reduce_chains(3, 44)


@needs_toolchain
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("bn", [128, 176])
def test_tree_row_max_depth(bn, fast):
    """n / 4 = 32 or 44 values a thread a row: a chain of that many dependent FMNMX before the shuffles; 4 (2)
    partial chains: a quarter (a half) of that, plus their combination; the same FMNMX count, the rest of the loop
    as it was give or take scheduling."""
    m = bn // 4
    k = 4 if m <= 32 else 2
    chain, tree = _sass(False, fast, bn), _sass(True, fast, bn)
    assert sass_paths.chain_depth(chain) >= m
    assert sass_paths.chain_depth(tree) <= m // k + (k - 1).bit_length() + 4  # + the identity, the shuffles' combines
    (c,), (t,) = sass_paths.loop_counts(chain), sass_paths.loop_counts(tree)
    assert t["FMNMX"] == c["FMNMX"] == bn // 2 + 6 and t["MUFU"] == c["MUFU"] == bn // 2 + 2
    assert abs(t["total"] - c["total"]) <= 4
    # the default (D35's pack) loop counts, pinned: the tree adds no instruction class
    assert t["F2FP"] == bn // 4 and t["HADD2"] == 0 and t["SHFL"] == 8


@needs_toolchain
def test_softmax_waits_for_p_v_today():
    """The fact D39 starts from (ptxas 13.0): with the intra-warpgroup overlap on, the source computes the softmax
    of S_k between the wait for QK^T_k (``wait_group 1``) and the wait for P_(k-1) V_(k-1) (``wait_group 0``),
    but ptxas hoists the second wait above every exp2: the softmax runs after P @ V, not beside it. A toolchain
    or a schedule that changes this fails here, and D39's account must be redone. Without ping-pong (the fast-math
    default since D52) the same holds except at 128 x 128 under fast math, where ptxas leaves 7 of the exp2 between
    the two waits (D52)."""
    for fast in (False, True):
        for bn in (128, 176):
            assert sass_paths.exp2_overlapped(_sass(True, fast, bn, pingpong=True)) == 0, (fast, bn)
            want = 7 if fast and bn == 128 else 0
            assert sass_paths.exp2_overlapped(_sass(True, fast, bn, pingpong=False)) == want, (fast, bn)


@needs_toolchain
def test_tree_not_where_the_loop_is_short():
    """The default keeps the chain where the loop runs at most 4 times (ptxas unrolls it; the partial chains made it
    serialize the WGMMAs at causal s256 128 x 128, spill at s384): the largest trip count from the block index's
    range, causal included. No PerformanceWarning there; the tree from 5 trips on."""
    import warnings

    for seq, bn, causal, tree in ((256, 128, True, False), (384, 128, False, False), (512, 128, True, False),
                                  (640, 128, True, True), (1000, 176, True, True), (4096, 176, False, True)):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            src = tilecore.compile(_attention(seq, 128, 128, bn, 256, causal), target=HOPPER,
                                   pass_configs=NOCACHE).get_kernel_source()
        assert ("float tc_t[" in src) == tree, (seq, bn, causal)
        assert not [x for x in w if "serialized" in str(x.message) or "spilled" in str(x.message)], (seq, bn)


@needs_toolchain
def test_tree_only_for_max_and_min():
    src = tilecore.compile(_attention(1000, 128, 128, 176, 256, True), target=HOPPER,
                           pass_configs={**NOCACHE, **TREE}).get_kernel_source()
    body = src.split("__global__")[-1]
    assert body.count("float tc_t[2];") == body.count("tc_nanmax(tc_t[tc_q], tc_t[tc_q + tc_w])") >= 1
    assert "tc_t[tc_q % 2] = tc_nanmax(tc_t[tc_q % 2], acc_s[4 * (tc_q / 2) + 2 * tc_h + tc_q % 2]);" in body
    assert "tc_r = (tc_r + acc_s[4 * tc_j + 2 * tc_h]);" in body  # the row sum keeps its order (its bits)
    off = tilecore.compile(_attention(1000, 128, 128, 176, 256, True), target=HOPPER,
                           pass_configs={**NOCACHE, **CHAIN}).get_kernel_source()
    assert "tc_t[" not in off.split("__global__")[-1]


def _host(k, arrays, edit=None):
    import dataclasses

    from cuda_host_emulator import run_on_host

    if edit:
        src = k.source
        code = src.code.replace(*edit)
        assert code != src.code, "the mutation changed nothing"
        k = type("K", (), {"source": dataclasses.replace(src, code=code)})()
    return run_on_host(k, arrays)


def _inputs(seq, dim, seed=3):
    rng = np.random.default_rng(seed)
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float32) for _ in range(3))
    q[1] *= 40  # head 1: scores spread over thousands
    q[0, 5] = np.nan  # a row of NaN scores
    q[0, 9] = 0.0  # a row of zero scores (signed zeros: -0 * k)
    q[0, 9, ::2] = -0.0
    q, kk, v = (x.astype(np.float16) for x in (q, kk, v))
    return q, kk, v


@needs_toolchain
@needs_gxx
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_host_tree_bit_identical_to_chain(fast):
    """The catalog's attention (causal, seq 192, d64, 64 x 64 blocks) on the sm_80 register program on the host:
    the tree and the chain give the same bytes, a row of NaN scores and one of signed zeros included.
    Mutation: combining the partial chains without the last level (half the row's values) is caught."""
    from tilecore_conformance.composite import attention_ref

    seq, dim = 192, 64
    q, kk, v = _inputs(seq, dim)
    outs = {}
    pc = {**NOCACHE, "tilecore.fast_math": fast}
    for name, cfg in (("tree", {"tilecore.cuda.tree_reduce": 4}), ("chain", CHAIN)):  # 3 trips: 4 chains asked
        k = tilecore.compile(_attention(seq, dim, 64, 64, 128, True), target="cuda:sm_80", pass_configs={**pc, **cfg})
        assert ("float tc_t[4];" in k.get_kernel_source()) == (name == "tree")
        outs[name] = _host(k, [q, kk, v, np.full(q.shape, 7.0, np.float16)])[3]
    assert outs["tree"].tobytes() == outs["chain"].tobytes()
    ref = attention_ref([q, kk, v], "float16", True, seq=seq, dim=dim)[0]
    head0 = np.ones(seq, bool)
    head0[5] = False
    np.testing.assert_allclose(outs["tree"][0][head0].astype(np.float64), ref[0][head0], atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(outs["tree"][1].astype(np.float64), ref[1], atol=2e-2, rtol=2e-2)
    assert np.isnan(outs["tree"][0, 5]).all()
    k = tilecore.compile(_attention(seq, dim, 64, 64, 128, True), target="cuda:sm_80",
                         pass_configs={**pc, "tilecore.cuda.tree_reduce": 4})
    short = _host(k, [q, kk, v, np.full(q.shape, 7.0, np.float16)],
                  ("for (int tc_w = 1; tc_w < 4; tc_w *= 2)", "for (int tc_w = 1; tc_w < 2; tc_w *= 2)"))[3]
    assert short.tobytes() != outs["chain"].tobytes()


@needs_toolchain
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_beside_runs_the_exp2s_while_p_v_does(fast):
    """128 x 128: all 66 MUFU (64 scores, 2 row factors) between the wait for S and the wait for P @ V (none
    today), no local memory at 240 registers, the same instruction classes give or take the moved waits."""
    on, off = _sass(False, fast, 128, True), _sass(False, fast, 128)
    assert sass_paths.exp2_overlapped(on) == 66 and sass_paths.exp2_overlapped(off) == 0
    (a,), (b,) = sass_paths.loop_counts(on), sass_paths.loop_counts(off)
    assert (a["MUFU"], a["F2FP"], a["HGMMA"], a["FMNMX"]) == (b["MUFU"], b["F2FP"], b["HGMMA"], b["FMNMX"])
    assert a["total"] <= b["total"] + 12
    k = _bench(False, fast, 128, True)
    assert "softmax beside P @ V: the wait for it and B from statement" in _notes(k)
    src = k.get_kernel_source()
    assert "tc_setmaxnreg_dec<24>();" in src and "tc_setmaxnreg_inc<240>();" in src
    assert "if (tc_it >= 2) tc_mbar_arrive(" in src and "if (tc_nit >= 2) tc_mbar_arrive(" in src


@needs_toolchain
def test_beside_not_where_the_carried_fragments_spill():
    """128 x 176 carries 88 + 44 + 64 = 196 registers a thread across an iteration's end (ptxas spilled 250-950
    bytes): the schedule stays as it was, 232 registers, and a note says why."""
    k = _bench(False, True, 176, True)
    assert "softmax beside P @ V not applied: 196 registers a thread carried" in _notes(k)
    assert k.get_kernel_source() == _bench(False, True, 176).get_kernel_source()


@needs_toolchain
def test_producer_registers_option():
    k = tilecore.compile(_attention(1024, 128, 128, 176, 256, False), target=HOPPER,
                         pass_configs={**NOCACHE, "tilecore.cuda.producer_registers": 24})
    src = k.get_kernel_source()
    assert "tc_setmaxnreg_dec<24>();" in src and "tc_setmaxnreg_inc<240>();" in src
    assert "STL" not in tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)  # the producer fits in 24
    with pytest.raises(Exception, match="tilecore.cuda.producer_registers: 20; setmaxnreg takes a multiple of 8"):
        tilecore.compile(_attention(1024, 128, 128, 176, 256, False), target=HOPPER,
                         pass_configs={**NOCACHE, "tilecore.cuda.producer_registers": 20})


def _protocol_problems(on: str, off: str, consumers: int = 2) -> list:
    import regprog_sim as sim

    out = []
    for trips in range(6):
        for nu in range(trips + 1):
            tr_on = [sim.trace(on, c, trips, nu) for c in range(consumers)]
            tr_off = [sim.trace(off, c, trips, nu) for c in range(consumers)]
            out += [f"{trips} trips, {nu} unmasked: {p}" for p in sim.check_turns(tr_on)]
            for c in range(consumers):
                out += [f"{trips} trips, {nu} unmasked, consumer {c}: {p}" for p in sim.check_wgmma(tr_on[c])]
                out += [f"{trips} trips, {nu} unmasked, consumer {c}: {p}"
                        for p in sim.same_per_fragment(tr_off[c], tr_on[c])]
    return out


@needs_toolchain
@pytest.mark.parametrize("shape,pingpong", [((1024, 128, 128, 128, 256, False), True),
                                            ((1000, 128, 128, 128, 256, True), True),
                                            ((1000, 64, 128, 64, 256, True), False),
                                            ((1000, 64, 192, 64, 384, True), True)],
                         ids=["d128", "d128-causal", "d64-causal-no-pingpong", "d64-3wg-causal"])
def test_beside_keeps_the_protocols(shape, pingpong):
    """On the host simulator, for 0-5 trips and every split count: no statement touches a fragment a WGMMA in
    flight uses, every stage acquired is released once and only after its WGMMA is done, the turns balance,
    and each register array sees what it saw with the option off. Mutation: the first iteration's release of a
    V stage no P @ V read (the guard dropped) is caught."""
    pc = {**NOCACHE, "tilecore.cuda.pingpong": pingpong}
    on = tilecore.compile(_attention(*shape), target=HOPPER, pass_configs={**pc, **BESIDE}).get_kernel_source()
    off = tilecore.compile(_attention(*shape), target=HOPPER, pass_configs=pc).get_kernel_source()
    assert on != off and "if (tc_it >= 2) tc_mbar_arrive(" in on
    consumers = shape[4] // 128
    assert _protocol_problems(on, off, consumers) == []
    bad = on.replace("if (tc_it >= 2) tc_mbar_arrive(", "if (tc_it >= 1) tc_mbar_arrive(")
    assert any("release" in p for p in _protocol_problems(bad, off, consumers))


ROWSUM = {"tilecore.cuda.row_sum_per_thread": True}


@needs_toolchain
def test_row_sum_per_thread_counts():
    """Fast math, 128 x 128: the loop's SHFL 8 -> 4 and FADD 68 -> 64; the quad's parts added once after it;
    the exact build ignores the option (its bits are promised)."""
    def build(cfg, fast):
        return tilecore.compile(_attention(4096, 128, 128, 128, 256, False, heads=32, batch=8), target=HOPPER,
                                pass_configs={**NOCACHE, **cfg, "tilecore.fast_math": fast})

    on, off = build(ROWSUM, True), build({}, True)
    (a,), (b,) = (sass_paths.loop_counts(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
                  for k in (on, off))
    assert (a["SHFL"], b["SHFL"]) == (4, 8) and a["FADD"] == b["FADD"] - 4
    assert "row sums kept per thread until after the loop (logsum; fast math)" in _notes(on)
    assert "logsum[tc_h] = (logsum[tc_h] + tc_shfl_xor(logsum[tc_h], 1));" in on.get_kernel_source()
    assert build(ROWSUM, False).get_kernel_source() == build({}, False).get_kernel_source()


@needs_toolchain
@needs_gxx
def test_host_row_sum_per_thread_matches_float64():
    """The sm_80 register program on the host, fast math: the per-thread row sums give the reference's output
    (float16's reach of float64) and the option off's within rounding. Mutation: the quad's parts not added up
    after the loop (each row divided by a quarter of its sum, about) is caught."""
    from tilecore_conformance.composite import attention_ref

    seq, dim = 192, 64
    rng = np.random.default_rng(21)
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float16) for _ in range(3))
    pc = {**NOCACHE, "tilecore.fast_math": True}
    k = tilecore.compile(_attention(seq, dim, 64, 64, 128, True), target="cuda:sm_80", pass_configs={**pc, **ROWSUM})
    assert "row sums kept per thread" in _notes(k)
    got = _host(k, [q, kk, v, np.full(q.shape, 7.0, np.float16)])[3].astype(np.float64)
    base = _host(tilecore.compile(_attention(seq, dim, 64, 64, 128, True), target="cuda:sm_80", pass_configs=pc),
                 [q, kk, v, np.full(q.shape, 7.0, np.float16)])[3].astype(np.float64)
    ref = attention_ref([q, kk, v], "float16", True, seq=seq, dim=dim)[0]
    np.testing.assert_allclose(got, ref, atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(got, base, atol=4e-3, rtol=4e-3)
    line = next(ln for ln in k.source.code.splitlines() if "tc_shfl_xor(logsum[tc_h], 1)" in ln)
    bad = _host(k, [q, kk, v, np.full(q.shape, 7.0, np.float16)], (line, ""))[3].astype(np.float64)
    assert not np.allclose(bad, ref, atol=2e-2, rtol=2e-2)


# -- on an sm_90 GPU ----------------------------------------------------------------------------------------

#: (seq, dim, bm, bn, threads, causal): the benchmark's blocks, the 176-wide one ragged at 4096 and causal
DEVICE = {"176-ragged": (4096, 128, 128, 176, 256, False), "176-causal": (1000, 128, 128, 176, 256, True),
          "128": (1024, 128, 128, 128, 256, False), "128-causal": (1024, 128, 128, 128, 256, True)}


def _device_run(torch, shape, configs, fast=False):
    seq, dim, bm, bn, threads, causal = DEVICE[shape]
    q, kk, v = (torch.from_numpy(x).cuda() for x in _inputs(seq, dim, seed=13))
    k = tilecore.compile(_attention(seq, dim, bm, bn, threads, causal), target="cuda",
                         pass_configs={**configs, "tilecore.fast_math": fast})
    o = torch.full_like(q, 7.0)
    k(q, kk, v, o)
    torch.cuda.synchronize()
    return [x.cpu().numpy() for x in (q, kk, v)], o.double().cpu().numpy()


@hopper_gpu
@pytest.mark.parametrize("shape", list(DEVICE))
def test_device_row_sum_per_thread_matches_float64(torch_cuda, shape):
    from tilecore_conformance.composite import attention_ref

    inputs, got = _device_run(torch_cuda, shape, {**ROWSUM, **BESIDE, **TREE}, True)
    _, base = _device_run(torch_cuda, shape, {}, True)
    seq, dim, *_, causal = DEVICE[shape]
    ref = attention_ref(inputs, "float16", causal, seq=seq, dim=dim)[0]
    ok = np.isfinite(ref)
    np.testing.assert_allclose(got[ok], ref[ok], atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(got[ok], base[ok], atol=4e-3, rtol=4e-3)


@hopper_gpu
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("shape", ["128", "128-causal"])
def test_device_beside_bit_identical_to_the_defaults(torch_cuda, shape, fast):
    from tilecore_conformance.composite import attention_ref

    inputs, got = _device_run(torch_cuda, shape, BESIDE, fast)
    _, base = _device_run(torch_cuda, shape, {}, fast)
    assert got.tobytes() == base.tobytes()
    seq, dim, *_, causal = DEVICE[shape]
    ref = attention_ref(inputs, "float16", causal, seq=seq, dim=dim)[0]
    ok = np.isfinite(ref)
    np.testing.assert_allclose(got[ok], ref[ok], atol=2e-2, rtol=2e-2)


@hopper_gpu
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("shape", list(DEVICE))
def test_device_tree_bit_identical_to_chain(torch_cuda, shape, fast):
    from tilecore_conformance.composite import attention_ref

    inputs, got = _device_run(torch_cuda, shape, TREE, fast)
    _, base = _device_run(torch_cuda, shape, CHAIN, fast)
    assert got.tobytes() == base.tobytes()
    seq, dim, *_, causal = DEVICE[shape]
    ref = attention_ref(inputs, "float16", causal, seq=seq, dim=dim)[0]
    ok = np.isfinite(ref)
    np.testing.assert_allclose(got[ok], ref[ok], atol=2e-2, rtol=2e-2)
