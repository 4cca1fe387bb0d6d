"""The exact build's exponentials split between the units (docs/decisions.md D60): ``tilecore.cuda.exp2_poly = n``
computes n of the 8-column groups of each row a thread holds with ``tc_ex2_poly`` (prelude/tc_ex2_poly.cuh: range
reduction and a degree-6 polynomial on the FMA pipe, FA4's trick) instead of ``exp2f`` (MUFU.EX2), off by default;
and ``tilecore.cuda.exp2_range_check="late"``: ``ex2.approx.ftz`` at once with each argument kept and tested beside
it, ``exp2f`` redone for a group of elements after a warp vote (the same bits as ``exp2f``).

Without a GPU (CI): the polynomial's model (scripts/exp2_poly_proof.py, whose exhaustive run over every float32 in
[-190, 0] measured at most 0.95 ulp) within exp2f's 2 ulp on every binade and the edges, a degree-5 fit caught; the
prelude's constants are the model's; the generated source and the SASS (MUFU.EX2 4n fewer a thread and iteration, no
local memory; "late": no predicated multiply on the fast path); the sm_80 register program on the host emulator
against float64 (a head scaled into the subnormal results) and, for "late", bit for bit the default. On an sm_90
GPU: the device function over every float32 in [-190, 0] within 2 ulp of float64 and bit for bit the model on a
sample; the attention kernels against float64 (poly) and bit for bit the default ("late").
"""
from __future__ import annotations

import importlib.util
import re
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
from test_cuda_exp2_rows import _device_run  # noqa: E402

_spec = importlib.util.spec_from_file_location("exp2_poly_proof",
                                               Path(__file__).parent.parent / "scripts" / "exp2_poly_proof.py")
proof = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(proof)
PRELUDE = Path(tilecore_cuda.__file__).parent / "prelude" / "tc_ex2_poly.cuh"
BENCH = (4096, 128, 128, 128, 256, True, 32, 8)


def _k(shape, configs, target=HOPPER):
    seq, dim, bm, bn, threads, causal, heads, batch = shape
    return tilecore.compile(_attention(seq, dim, bm, bn, threads, causal, heads=heads, batch=batch), target=target,
                            pass_configs={**NOCACHE, **configs})


# -- the polynomial ------------------------------------------------------------------------------------------

def test_model_within_exp2f_bound():
    """Every binade of [-190, 0] (4096 values each, subnormal arguments and results included) and the edges: within
    exp2f's documented 2 ulp (the exhaustive run: 0.95); NaN, -inf, +-0."""
    worst, at, sub = proof.check(proof.sample())
    assert worst <= 1.0, (worst, at)  # the exhaustive bound (0.95) with the sample inside it
    assert sub <= 1.0
    out = proof.model(np.array([np.nan, -np.inf, -1000.0, 0.0, -0.0, -1.0, -126.0, -149.0], np.float32))
    assert np.isnan(out[0]) and out[1] == 0 and out[2] == 0 and out[3] == 1 and out[4] == 1
    assert out[5] == 0.5 and out[6] == np.float32(2.0 ** -126) and out[7] == np.float32(2.0 ** -149)


def test_a_worse_polynomial_is_caught():
    """The check can fail: the degree-5 fit (1.1e-7 relative) exceeds 2 ulp; the linear coefficient off by 2^-20."""
    deg5 = (1.0, float.fromhex("0x1.62e42ap-1"), float.fromhex("0x1.ebf9bcp-3"), float.fromhex("0x1.c6b754p-5"),
            float.fromhex("0x1.3cea92p-7"), float.fromhex("0x1.5bb996p-10"))
    assert proof.check(proof.sample(), deg5)[0] > proof.BOUND
    off = list(proof.COEFFS)
    off[1] *= 1 + 2 ** -20
    assert proof.check(proof.sample(), tuple(off))[0] > proof.BOUND


def test_prelude_constants_are_the_models():
    src = PRELUDE.read_text()
    lits = [float.fromhex(h[:-1]) for h in re.findall(r"0x1\.[0-9a-f]+p-\d+f", src)]
    assert tuple(lits[:6]) == proof.COEFFS[:0:-1] and "__fmaf_rn(p, f, 1.0f)" in src
    assert "0fC33E0000" in src and np.float32(proof.CLAMP).view(np.uint32) == 0xC33E0000
    assert "12582912.0f" in src and "191u << 23" in src and "0x1p-64f" in src


@needs_toolchain
def test_device_function_sass():
    """The probe the device test runs (the prelude's function alone) builds; the function is FMA-pipe work: no
    MUFU, six FFMA, three FADD, two FMUL, one max.NaN; exp2f's MUFU.EX2 beside it in the probe."""
    from tilecore.plugin.api import Source
    from tilecore_cuda.runtime import CUDARuntime

    src = Source(PRELUDE.read_text() + PROBE.replace("ref[i] = exp2f(x);", ""), "cuda", "tc_poly_probe", {})
    sass = tilecore_cuda.CUDABackend().disassemble(CUDARuntime("sm_90a").build(src, {}), HOPPER)
    ops = [sass_paths.opcode(t) for _, t in sass_paths.parse(sass)]
    assert "MUFU" not in ops and ops.count("FFMA") == 6 and ops.count("FMUL") == 2 and ops.count("FMNMX") == 1


# -- the kernels ---------------------------------------------------------------------------------------------

@needs_toolchain
def test_bad_values():
    for key, bad in (("tilecore.cuda.exp2_poly", -1), ("tilecore.cuda.exp2_poly", True),
                     ("tilecore.cuda.exp2_late_group", 0), ("tilecore.cuda.exp2_range_check", "lat")):
        with pytest.raises(Exception, match=key.split(".")[-1]):
            _k((256, 64, 64, 64, 128, True, 1, None), {key: bad}, target="cuda:sm_80")


def _host(cfg, seq=192, dim=64):
    from cuda_host_emulator import run_on_host

    rng = np.random.default_rng(9)
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float32) for _ in range(3))
    q[1] *= 40  # head 1: arguments below -126 (subnormal results; exp2f's other path)
    q, kk, v = (x.astype(np.float16) for x in (q, kk, v))
    k = _k((seq, dim, 64, 64, 128, True, 2, None), cfg, target="cuda:sm_80")
    return (q, kk, v), run_on_host(k, [q, kk, v, np.full(q.shape, np.nan, np.float16)])[3], k


@needs_toolchain
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
def test_host_emulator():
    """The sm_80 register program (64-wide blocks: 8 groups a row, poly in 2): float64, and close to the default;
    "late" bit for bit the default (its vote taken in head 1)."""
    from tilecore_conformance.composite import attention_ref

    inputs, base, _ = _host({})
    _, poly, k = _host({"tilecore.cuda.exp2_poly": 2})
    assert "tc_ex2_poly(" in k.get_kernel_source()
    ref = attention_ref(list(inputs), "float16", True, seq=192, dim=64)[0]
    np.testing.assert_allclose(poly.astype(np.float64), ref, atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(poly.astype(np.float64), base.astype(np.float64), atol=2e-3, rtol=0)
    _, late, k = _host({"tilecore.cuda.exp2_range_check": "late", "tilecore.cuda.exp2_late_group": 2})
    assert "tc_x[" in k.get_kernel_source()
    assert late.tobytes() == base.tobytes()
    # both: the polynomial's groups untested, the others late's (exp2f's bits): bit for bit poly alone
    _, both, k = _host({"tilecore.cuda.exp2_range_check": "late", "tilecore.cuda.exp2_late_group": 2,
                        "tilecore.cuda.exp2_poly": 2})
    assert "tc_ex2_poly(" in k.get_kernel_source() and "tc_x[" in k.get_kernel_source()
    assert both.tobytes() == poly.tobytes()


# -- on an sm_90 GPU ----------------------------------------------------------------------------------------

PROBE = r"""
extern "C" __global__ void tc_poly_probe(float* out, float* ref, long long base, long long n, int* tc_status) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float x = __uint_as_float((unsigned)(base + i));
    out[i] = tc_ex2_poly(x);
    ref[i] = exp2f(x);
  }
}
"""


def _probe(torch):
    from tilecore.plugin.api import Source
    from tilecore_cuda.runtime import CUDARuntime

    rt = CUDARuntime("sm_90a")
    src = Source(PRELUDE.read_text() + PROBE, "cuda", "tc_poly_probe",
                 {"grid": ["(ints[1] + 255) // 256", "1", "1"], "threads": 256})
    return rt.load(rt.build(src, {}), src)


@hopper_gpu
def test_device_function_every_argument(torch_cuda):
    """Every float32 in [-190, 0] on the GPU: within 2 ulp of float64's 2^x (torch, float64), the GPU's bits the
    model's on a sample; how often they differ from exp2f's is printed (not asserted: MUFU.EX2 is not specified)."""
    torch = torch_cuda
    prog = _probe(torch)
    hi = int(np.float32(proof.CLAMP).view(np.uint32))
    step = 1 << 26
    out = torch.empty(step, device="cuda", dtype=torch.float32)
    ref = torch.empty_like(out)
    worst, differ, total, b = 0.0, 0, 0, 0x80000000
    while b <= hi:
        n = min(step, hi - b + 1)
        prog.launch([out.data_ptr(), ref.data_ptr()], [b, n], [])
        bits = (torch.arange(b, b + n, device="cuda", dtype=torch.int64) - (1 << 32)).to(torch.int32)  # b >= 2^31
        x = bits.view(torch.float32).double()
        r = torch.exp2(x)
        ulp = torch.exp2(torch.clamp(torch.floor(torch.log2(torch.clamp(r, min=2.0 ** -149))) - 23, min=-149))
        worst = max(worst, float(((out[:n].double() - r).abs() / ulp).max()))
        differ += int((out[:n].view(torch.int32) != ref[:n].view(torch.int32)).sum())
        total += n
        b += n
    print(f"tc_ex2_poly on the GPU: {total} arguments, max {worst:.4f} ulp; bits differ from exp2f's in {differ}")
    assert total == hi - 0x80000000 + 1 and worst <= proof.BOUND
    xs = proof.sample()
    got = torch.empty(xs.size, device="cuda", dtype=torch.float32)
    # the sample's arguments one by one through the same probe: base = their bits, n = 1 (a handful of launches)
    for k in range(0, xs.size, 97 * 131):  # a spread subset: each launch evaluates one argument
        prog.launch([got[k:].data_ptr(), ref.data_ptr()], [int(xs[k:k + 1].view(np.uint32)[0]), 1], [])
    torch.cuda.synchronize()
    idx = np.arange(0, xs.size, 97 * 131)
    assert got.cpu().numpy()[idx].tobytes() == proof.model(xs[idx]).tobytes()


DEVICE = {"128-causal": (1024, 128, 128, 128, 256, True), "176-ragged": (1000, 128, 128, 176, 256, False),
          "d64-3wg-causal": (1000, 64, 192, 64, 384, True)}

