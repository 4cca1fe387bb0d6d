"""The exact build's O / l (docs/decisions.md D60, ``tilecore.cuda.row_division``, on by default): ptxas emits each
IEEE ``/`` as its own region (MUFU.RCP, FCHK, a branch to the slow path's CALL), 64 of them a thread in
FlashAttention's epilogue, one after another. With the option, ``F[i, j] = F[i, j] / r[i]`` runs div.rn.f32's fast path
itself (``prelude/tc_div_row.cuh``: the reciprocal and its Newton step once a row, three FFMA an element) where every
operand of the warp lies in [2^-40, 2^40] in magnitude, the division as written otherwise: the same bits.

Without a GPU: the source (both sides, the default's, the option off, ignored under fast math), the SASS (no
CALL and two MUFU.RCP on the fast side: the epilogue's divisions no longer serialized), the sm_80 register program on
the host emulator bit for bit the default. On an sm_90 GPU: ``tc_div_fast`` bit for bit ``a / b`` for every float32
``a`` of the safe range and 12 divisors (edges of the mantissa and random), and the attention kernels bit for bit the
default.
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

DIV = {"tilecore.cuda.row_division": True}
BENCH = (4096, 128, 128, 128, 256, True, 32, 8)
PRELUDE = Path(tilecore_cuda.__file__).parent / "prelude" / "tc_div_row.cuh"


def _k(shape, configs, target=HOPPER):
    seq, dim, bm, bn, threads, causal, heads, batch = shape
    return tilecore.compile(_attention(seq, dim, bm, bn, threads, causal, heads=heads, batch=batch), target=target,
                            pass_configs={**NOCACHE, **configs})


@needs_toolchain
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
def test_host_bit_identical():
    from cuda_host_emulator import run_on_host

    rng = np.random.default_rng(4)
    seq, dim = 192, 64
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float16) for _ in range(3))
    v[1, :5] = 0  # a head with zero outputs: the warp's check fails there, the division as written
    outs = []
    for cfg in (DIV, {"tilecore.cuda.row_division": False}):
        k = _k((seq, dim, 64, 64, 128, True, 2, None), cfg, target="cuda:sm_80")
        assert ("tc_div_fast(" in k.get_kernel_source()) == (cfg is DIV)
        outs.append(run_on_host(k, [q, kk, v, np.full(q.shape, np.nan, np.float16)])[3])
    assert outs[0].tobytes() == outs[1].tobytes()


# -- on an sm_90 GPU ----------------------------------------------------------------------------------------

PROBE = r"""
extern "C" __global__ void tc_div_probe(unsigned* bad, long long base, long long n, double bd, int* tc_status) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const float b = (float)bd;  /* a float32 value passed as the launcher's double: exact */
  if (i < n) {
    const float a = __uint_as_float((unsigned)(base + i));
    const float r = tc_div_rcp(b);
    if (tc_div_safe(a) && __float_as_uint(tc_div_fast(a, b, r)) != __float_as_uint(a / b)) atomicAdd(bad, 1u);
  }
}
"""


DEVICE = {"128-causal": (1024, 128, 128, 128, 256, True), "176-ragged": (1000, 128, 128, 176, 256, False),
          "d64-3wg-causal": (1000, 64, 192, 64, 384, True)}

