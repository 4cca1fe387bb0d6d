"""The softmax's critical path in the mma.sync register program (docs/decisions.md D39), through the public API:

- ``tilecore.cuda.tree_reduce`` (on where the loop runs 5 times or more): a row maximum (or minimum) of a 2-D
  fragment as k partial chains (4 for rows of up to 32 values a thread, else 2) combined pairwise, the identity
  applied last, instead of one chain of n / 4 dependent ``FMNMX``: the same bits (max and min are exact,
  commutative and associative; a row whose every value ``fmaxf`` drops, NaN, still gives the identity).
- ``tilecore.cuda.row_sum_per_thread`` (off until measured; fast math only, the order of additions changes): a
  row sum read only by a running sum ``L = L * X + r`` stays per thread; the quad's parts are added once after
  the loop (FA3's ``finalize``).

The sm_80 register program on the host emulator, bit for bit against the chain, with a row of NaN scores, one of
signed zeros and the causal mask's -inf. D86 retired the WGMMA register program (sm_90a) these options were measured
on (D39's SASS counts, the softmax beside P @ V, FA3's register split: gone with it).
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import _attention, _notes  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")

CHAIN = {"tilecore.cuda.tree_reduce": False}
TREE = {"tilecore.cuda.tree_reduce": True}


def test_tree_default_and_chains():
    from tilecore_cuda import _lean

    assert _lean.TREE_REDUCE_DEFAULT is True and _lean.TREE_MIN_TRIPS == 5
    assert [_lean.reduce_chains(True, n) for n in (16, 32, 44)] == [4, 4, 2]
    assert _lean.reduce_chains(False, 44) == 1 and _lean.reduce_chains(8, 44) == 8 and _lean.reduce_chains(8, 4) == 4
    with pytest.raises(ValueError, match="tilecore.cuda.tree_reduce: 3 partial chains"):
        _lean.reduce_chains(3, 44)


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


ROWSUM = {"tilecore.cuda.row_sum_per_thread": True}


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
