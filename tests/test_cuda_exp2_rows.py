"""The exact build's exp2 checked from each row's smallest score (docs/decisions.md D54,
``tilecore.cuda.exp2_range_check="rows"``, off by default): in ``F[i, j] = T.exp2(X[i, j] * c - r[i])`` (``c > 0``)
the argument is non-decreasing in ``X[i, j]`` and IEEE rounding is monotone, so ``arg`` at the row's smallest ``X``
bounds every argument of the row from below, computed with the same operations. That minimum needs no row
maximum; where every bound of the warp is at least -126, ``ex2.approx.ftz`` alone (the MUFU.EX2 ``exp2f`` runs
there, D35), else ``exp2f``: the same bits. On the Hopper register program the warp-uniform branch covers the rest
of the work before the next gemm (row sums, O's rescale, P's pack), both sides the same statements.

Without a GPU (CI): the generated source (the products before the branch, the bound, both sides), the default
unchanged, a bad value; the SASS of the benchmark's kernels (no local memory; the checked side without exp2f's range
tests or predicated multiplies, one MUFU.EX2 an element; the other side with them); the sm_80 register program on
the host emulator (the branch around the nest), bit for bit the check off, with one head's queries scaled by 40
(arguments below -126: the exp2f side) and against float64. On an sm_90 GPU: bit for bit the check off (causal,
ragged, the scaled head) and float64.
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
from test_cuda_hopper import HOPPER, _attention  # noqa: E402

ROWS = {"tilecore.cuda.exp2_range_check": "rows"}


def _k(shape, configs, target=HOPPER):
    seq, dim, bm, bn, threads, causal, heads, batch = shape
    return tilecore.compile(_attention(seq, dim, bm, bn, threads, causal, heads=heads, batch=batch), target=target,
                            pass_configs={**NOCACHE, **configs})


BENCH = (4096, 128, 128, 128, 256, True, 32, 8)


@needs_toolchain
def test_bad_value():
    with pytest.raises(Exception, match="exp2_range_check: 'row'; use False, True"):
        _k((256, 64, 64, 64, 128, True, 1, None), {"tilecore.cuda.exp2_range_check": "row"}, target="cuda:sm_80")


@needs_toolchain
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
def test_host_bit_identical_to_the_check_off():
    """The sm_80 register program (the branch around the nest) on the host emulator, causal seq 192 d64: head 1's
    queries scaled by 40 (its arguments fall below -126: the exp2f side), head 0 the checked side; bit for bit the
    check off, and float64."""
    from cuda_host_emulator import run_on_host
    from tilecore_conformance.composite import attention_ref

    rng = np.random.default_rng(9)
    seq, dim = 192, 64
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float32) for _ in range(3))
    q[1] *= 40
    q, kk, v = (x.astype(np.float16) for x in (q, kk, v))
    outs = []
    for cfg in (ROWS, {}):
        k = _k((seq, dim, 64, 64, 128, True, 2, None), cfg, target="cuda:sm_80")
        assert ("tc_mn" in k.get_kernel_source()) == bool(cfg)
        outs.append(run_on_host(k, [q, kk, v, np.full(q.shape, np.nan, np.float16)])[3])
    assert outs[0].tobytes() == outs[1].tobytes()
    ref = attention_ref([q, kk, v], "float16", True, seq=seq, dim=dim)[0]
    np.testing.assert_allclose(outs[0].astype(np.float64), ref, atol=2e-2, rtol=2e-2)


# -- on an sm_90 GPU ----------------------------------------------------------------------------------------

DEVICE = {"128-causal": (1024, 128, 128, 128, 256, True), "176-ragged": (1000, 128, 128, 176, 256, False),
          "176-causal": (1000, 128, 128, 176, 256, True), "d64-3wg-causal": (1000, 64, 192, 64, 384, True)}


def _device_run(torch, shape, configs, device=None):
    """The attention kernel of ``(device or DEVICE)[shape]`` run once on random fp16 inputs (head 1 scaled so that
    exp2's arguments fall below -126): the inputs, O in float64 and the kernel (test_cuda_exp2_poly runs it too)."""
    seq, dim, bm, bn, threads, causal = (device or DEVICE)[shape]
    rng = np.random.default_rng(13)
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float32) for _ in range(3))
    q[1] *= 40  # head 1: exp2's arguments below -126 (the exp2f side)
    q, kk, v = (torch.from_numpy(x).half().cuda() for x in (q, kk, v))
    k = tilecore.compile(_attention(seq, dim, bm, bn, threads, causal), target="cuda", pass_configs=configs)
    o = torch.full_like(q, float("nan"))
    k(q, kk, v, o)
    torch.cuda.synchronize()
    return [x.cpu().numpy() for x in (q, kk, v)], o.double().cpu().numpy(), k

