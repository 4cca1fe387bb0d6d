"""The softmax path of the CUDA mma.sync register program (docs/decisions.md D30), through the public API:

- ``tilecore.cuda.split_masked_loop``: the loop runs the iterations where every ``T.if_then_else`` mask on the
  loop variable provably holds for the whole tile without the mask (causal attention's blocks left of the
  diagonal, the blocks before the sequence's edge), and keeps the masks for the rest. Where the mask was S's
  initial value, its zeros cost nothing in the unmasked iterations: ptxas folds them into the first WGMMA.

The mma.sync register program (sm_80): the split count ``tc_nu`` the kernel computes is checked against a
brute-force count of the iterations whose mask holds everywhere, for every block (sound: never more; tight: no
fewer); mutations of the count are caught; the program with the split runs right on the host emulator (a count one
too large is caught there). D86 retired the WGMMA register program (sm_90a) whose protocols, SASS and device runs
these tests also checked.
"""
from __future__ import annotations

import dataclasses
import functools
import re
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

#: (seq, dim, bm, bn, threads, causal)
SHAPES = {"d128-causal": (512, 128, 128, 128, 256, True), "d128-causal-bn64": (1000, 128, 128, 64, 256, True),
          "d64-3wg-causal": (1000, 64, 192, 64, 384, True), "d128-edge": (1000, 128, 128, 64, 256, False)}
SPLIT = {"split": {"tilecore.cuda.split_masked_loop": True}, "nosplit": {"tilecore.cuda.split_masked_loop": False}}


@functools.lru_cache(maxsize=None)
def _kernel(shape: str, split: str = "split", fast: bool = False):
    """The mma.sync register program's kernel (sm_80; D86 retired the WGMMA one these tests ran on first)."""
    cfg = {**NOCACHE, **SPLIT[split], "tilecore.fast_math": fast}
    return tilecore.compile(_attention(*SHAPES[shape]), target="cuda:sm_80", pass_configs=cfg)


# -- the split count against brute force ------------------------------------------------------------------

def _c_count(src: str, bx: int, loop: int) -> int:
    """``tc_nu`` as the kernel computes it for block ``bx`` (its C expression evaluated in Python)."""
    text = re.search(r"const int tc_nu = \(int\)\((.*)\);  /\*", src).group(1)
    env = {"tc_min": min, "tc_max": max, "tc_floordiv": lambda a, b: a // b, "bx": bx, "loop": loop}
    return int(eval(text.replace("(int)", ""), {"__builtins__": {}}, env))  # noqa: S307


def _true_count(seq, bm, bn, causal, bx) -> tuple:
    """(trip count, leading iterations whose mask holds for every (i, j) of the tile), by brute force."""
    loop = -(-((bx + 1) * bm) // bn) if causal else -(-seq // bn)
    i, j = np.arange(bm)[:, None], np.arange(bn)[None, :]
    n = 0
    for k in range(loop):
        ok = (k * bn + j < seq) & ((bx * bm + i >= k * bn + j) if causal else True)
        if not ok.all():
            break
        n += 1
    return loop, n


def _count_problems(src, seq, bm, bn, causal) -> list:
    out = []
    for bx in range(-(-seq // bm)):
        loop, want = _true_count(seq, bm, bn, causal, bx)
        got = _c_count(src, bx, loop)
        if got != want:
            out.append(f"block {bx}: {got} iterations without masks, {want} hold everywhere (of {loop})")
    return out


@needs_toolchain
@pytest.mark.parametrize("shape", list(SHAPES))
def test_split_count_is_the_iterations_whose_mask_holds_everywhere(shape):
    seq, dim, bm, bn, threads, causal = SHAPES[shape]
    k = _kernel(shape)
    assert "masked-loop split: the iterations before the mask's first run without" in _notes(k)
    assert _count_problems(k.get_kernel_source(), seq, bm, bn, causal) == []


@needs_toolchain
def test_split_on_the_mma_sync_register_program():
    """sm_80's register program (every warp loads and computes) splits the same way: two loops, the same count."""
    seq, dim, bm, bn, threads, causal = 1000, 64, 64, 64, 128, True
    k = tilecore.compile(_attention(seq, dim, bm, bn, threads, causal), target="cuda:sm_80", pass_configs=NOCACHE)
    assert "cuda.register_program: masked-loop split" in _notes(k)
    src = k.get_kernel_source()
    assert "for (int tc_it = 0; tc_it < tc_nu; ++tc_it)" in src and "for (int tc_it = tc_nu; tc_it < " in src
    assert _count_problems(src, seq, bm, bn, causal) == []


@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
@pytest.mark.parametrize("seq,bn,causal", [(200, 32, True), (200, 64, False)], ids=["causal", "edge"])
def test_split_runs_right_on_the_host(seq, bn, causal):
    """The sm_80 register program (mma.sync + cp.async) run on the host emulator (tests/cuda_host_emulator.py):
    with the split, blocks whose unmasked counts go 0..6 (causal, 32-key blocks) or 3 of 4 iterations (the
    sequence's edge), against float64 and bit for bit against the split off."""
    from cuda_host_emulator import run_on_host
    from tilecore_conformance.composite import attention_ref

    rng = np.random.default_rng(7)
    q, kk, v = (rng.standard_normal((1, seq, 64)).astype(np.float16) for _ in range(3))
    outs = []
    for split in ("split", "nosplit"):
        k = tilecore.compile(_attention(seq, 64, 64, bn, 128, causal, heads=1), target="cuda:sm_80",
                             pass_configs={**NOCACHE, **SPLIT[split]})
        assert ("tc_nu" in k.get_kernel_source()) == (split == "split")
        outs.append(run_on_host(k, [q, kk, v, np.full(q.shape, np.nan, np.float16)])[3])
    ref = attention_ref([q, kk, v], "float16", causal, seq=seq, dim=64)[0]
    np.testing.assert_allclose(outs[0].astype(np.float64), ref, atol=2e-2, rtol=2e-2)
    assert outs[0].tobytes() == outs[1].tobytes()
    # the mutation: one iteration more without the mask (the diagonal block, or the one past the edge)
    src = tilecore.compile(_attention(seq, 64, 64, bn, 128, causal, heads=1), target="cuda:sm_80",
                           pass_configs=NOCACHE).source
    count = re.search(r"const int tc_nu = (\(int\)\(.*\));  /\*", src.code).group(1)
    trips = re.search(r"for \(int tc_it = tc_nu; tc_it < (.*); \+\+tc_it\)", src.code).group(1)
    code = src.code.replace(f"const int tc_nu = {count};", f"const int tc_nu = tc_min({count} + 1, {trips});")
    assert code != src.code
    broken = type("K", (), {"source": dataclasses.replace(src, code=code)})()
    bad = run_on_host(broken, [q, kk, v, np.full(q.shape, np.nan, np.float16)])[3].astype(np.float64)
    assert not np.allclose(bad, ref, atol=2e-2, rtol=2e-2)


@needs_toolchain
@pytest.mark.parametrize("edit", [("+ 1)), 0), loop)", "+ 2)), 0), loop)"), ("tc_max(", "tc_min(")],
                         ids=["one iteration too many", "no clamp at zero"])
def test_split_count_check_catches_a_wrong_count(edit):
    seq, dim, bm, bn, threads, causal = SHAPES["d128-causal-bn64"]
    src = _kernel("d128-causal-bn64").get_kernel_source()
    line = next(ln for ln in src.splitlines() if "const int tc_nu" in ln)
    assert edit[0] in line
    assert _count_problems(src.replace(line, line.replace(edit[0], edit[1], 1)), seq, bm, bn, causal) != []
