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
import sass_paths  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, _attention, hopper_gpu, torch_cuda  # noqa: E402,F401

DIV = {"tilecore.cuda.row_division": True}
BENCH = (4096, 128, 128, 128, 256, True, 32, 8)
PRELUDE = Path(tilecore_cuda.__file__).parent / "prelude" / "tc_div_row.cuh"


def _k(shape, configs, target=HOPPER):
    seq, dim, bm, bn, threads, causal, heads, batch = shape
    return tilecore.compile(_attention(seq, dim, bm, bn, threads, causal, heads=heads, batch=batch), target=target,
                            pass_configs={**NOCACHE, **configs})


@needs_toolchain
def test_source():
    src = _k(BENCH, DIV).get_kernel_source()
    assert "tc_dr[tc_h] = tc_div_rcp(logsum[tc_h]);" in src and "if (__all_sync(0xffffffffu, tc_dk))" in src
    assert "acc_o[tc_q] = tc_div_fast(acc_o[tc_q], logsum[(tc_q / 2) % 2], tc_dr[(tc_q / 2) % 2]);" in src
    assert "acc_o[tc_q] = (acc_o[tc_q] / logsum[(tc_q / 2) % 2]);" in src  # the other side
    assert _k(BENCH, {}).get_kernel_source() == src  # on by default since round 3 (D60)
    off = _k(BENCH, {"tilecore.cuda.row_division": False}).get_kernel_source()
    assert "tc_div" not in off and "/ logsum[tc_h]" in off
    fast = _k(BENCH, {**DIV, "tilecore.fast_math": True}).get_kernel_source()
    assert "tc_div" not in fast


@needs_toolchain
def test_sass_fast_side():
    """The side the warp's vote takes when every operand is in range: no CALL, no MUFU.RCP, no FCHK, 3 FFMA an
    element; the two rows' MUFU.RCP before the vote; the default: 64 MUFU.RCP and 64 CALL sites."""
    def sass(cfg):
        return sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(_k(BENCH, cfg).binary, HOPPER))

    base = sass({"tilecore.cuda.row_division": False})
    assert sum("MUFU.RCP" in t for _, t in base) >= 64 and sum(t.startswith("CALL") for _, t in base) == 64
    ins = sass(DIV)
    pos = {a: k for k, (a, _) in enumerate(ins)}
    vote = next(i for i, (_, t) in enumerate(ins) if "VOTE.ALL" in t)
    br = ins[vote + 1][1]
    assert sass_paths.opcode(br) == "BRA" and br.startswith("@P")
    k = pos[int(sass_paths._TARGET.search(br).group(1), 16)]
    side = []
    while sass_paths.opcode(ins[k][1]) != "BRA" or ins[k][1].startswith("@"):
        side.append(ins[k][1])
        k += 1
    ops = [sass_paths.opcode(t) for t in side]
    assert "CALL" not in ops and "FCHK" not in ops and not any("MUFU.RCP" in t for t in side)
    assert ops.count("FFMA") == 3 * 64 + 2 * 2  # (and the two rows' Newton steps, which ptxas sinks here)
    assert sum("MUFU.RCP" in t for _, t in ins[vote - 400:vote]) == 2


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


@hopper_gpu
def test_device_fast_path_is_div_rn(torch_cuda):
    """For 12 divisors (1, the largest mantissa, 1.5, 2^-40, 2^40 and its neighbours, random in [1, 4096]) and every
    positive and negative float32 dividend in [2^-40, 2^40]: tc_div_fast's bits are ``a / b``'s (div.rn)."""
    torch = torch_cuda
    from tilecore.plugin.api import Source
    from tilecore_cuda.runtime import CUDARuntime

    rt = CUDARuntime("sm_90a")
    src = Source(PRELUDE.read_text() + PROBE, "cuda", "tc_div_probe",
                 {"grid": ["(ints[1] + 255) // 256", "1", "1"], "threads": 256})
    prog = rt.load(rt.build(src, {}), src)
    rng = np.random.default_rng(5)
    bs = [1.0, float(np.nextafter(np.float32(2), np.float32(0))), 1.5, 2.0 ** -40, 2.0 ** 40,
          float(np.nextafter(np.float32(2.0 ** 40), np.float32(0))), float(np.nextafter(np.float32(2.0 ** -40), np.float32(1)))]
    bs += [float(x) for x in rng.uniform(1, 4096, 5).astype(np.float32)]
    lo, hi = int(np.float32(2.0 ** -40).view(np.uint32)), int(np.float32(2.0 ** 40).view(np.uint32))
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    for b in bs:
        for sign in (0, 1 << 31):
            prog.launch([bad.data_ptr()], [lo + sign, hi - lo + 1], [b])
    torch.cuda.synchronize()
    assert int(bad.item()) == 0


DEVICE = {"128-causal": (1024, 128, 128, 128, 256, True), "176-ragged": (1000, 128, 128, 176, 256, False),
          "d64-3wg-causal": (1000, 64, 192, 64, 384, True)}


@hopper_gpu
@pytest.mark.parametrize("shape", list(DEVICE))
def test_device_bit_identical(torch_cuda, shape):
    from tilecore_conformance.composite import attention_ref

    torch = torch_cuda
    seq, dim, bm, bn, threads, causal = DEVICE[shape]
    rng = np.random.default_rng(13)
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float32) for _ in range(3))
    v[1, :3] *= 1e-30  # head 1: outputs below 2^-40 (the division as written)
    outs = []
    for cfg in (DIV, {"tilecore.cuda.row_division": False}):
        k = tilecore.compile(_attention(seq, dim, bm, bn, threads, causal), target="cuda", pass_configs=cfg)
        qt, kt, vt = (torch.from_numpy(x).half().cuda() for x in (q, kk, v))
        o = torch.full_like(qt, float("nan"))
        k(qt, kt, vt, o)
        torch.cuda.synchronize()
        outs.append(o.double().cpu().numpy())
    assert outs[0].tobytes() == outs[1].tobytes()
    ref = attention_ref([x.astype(np.float16) for x in (q, kk, v)], "float16", causal, seq=seq, dim=dim)[0]
    np.testing.assert_allclose(outs[0], ref, atol=2e-2, rtol=2e-2)
