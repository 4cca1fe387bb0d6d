"""The HIP backend (tilecore-hip), through the public API and the real AMD compiler (clang-22).

No AMD GPU exists here, so the strongest honest mode is ``compile-only``: every kernel is compiled to a
code object for gfx90a / gfx942 / gfx950 / gfx1100 and the disassembly is read for the instructions the
lowering promises. The numbers come from tests/hip_host_emulator.py, which runs the generated HIP on the
host at the hardware's wave width. Tests that need clang skip when it is missing, unless
``TILECORE_HIP_REQUIRE_TOOLCHAIN=1`` (scripts/setup.sh installs it).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from hip_host_emulator import compiler as host_compiler, run_on_host
from kernels_for_tests import matmul_relu
from tilecore.errors import CompileError, DeviceError

tilecore_hip = pytest.importorskip("tilecore_hip")
from tilecore_hip import compiler as hipc  # noqa: E402
from tilecore_hip.units import mfma_16x16, wmma_16x16x16  # noqa: E402

PROBE = tilecore_hip.HIPBackend().probe()
needs_toolchain = pytest.mark.skipif(
    PROBE.status == "no-toolchain" and os.environ.get("TILECORE_HIP_REQUIRE_TOOLCHAIN") != "1",
    reason="no clang++-22 here (apt-get install clang-22 lld-22 llvm-22 rocm-device-libs)")
needs_host = pytest.mark.skipif(host_compiler() is None, reason="no clang++ for the host emulation")
ARCHS = ["hip:gfx90a", "hip:gfx942", "hip:gfx950", "hip:gfx1100"]
UNIT = {"hip:gfx90a": "v_mfma_f32_16x16x16", "hip:gfx942": "v_mfma_f32_16x16x16", "hip:gfx950": "v_mfma_f32_16x16x32",
        "hip:gfx1100": "v_wmma_f32_16x16x16"}


def asm(kernel) -> str:
    return tilecore_hip.HIPBackend().disassemble(kernel.binary, kernel.target)


def mnemonics(kernel) -> set:
    return set(re.findall(r"^\s+([a-z][a-z0-9_]+)", asm(kernel), re.M))


# -- targets, probe, runtime without a device ---------------------------------------------------------

def test_targets_round_trip_and_profiles():
    be = tilecore_hip.HIPBackend()
    assert be.targets() == ARCHS
    for t in ARCHS:
        assert str(be.parse_target(t)) == t and be.parse_target(t).capability_id == "hip/" + t[4:]
    assert be.parse_target("hip").arch == tilecore_hip.local_arch()
    assert be.parse_target("hip:mi300x").arch == "gfx942"
    assert be.parse_target("hip:gfx908") is None and be.parse_target("cuda:sm_80") is None


def test_probe_names_toolchain_or_install_hint(monkeypatch):
    if PROBE.status != "no-toolchain":
        assert PROBE.status in ("no-device", "ok") and "clang" in PROBE.toolchain
        if PROBE.status == "no-device":
            assert "clang" in PROBE.detail and "compile only" in PROBE.detail
    monkeypatch.setattr(tilecore_hip, "find_clang", lambda: None)
    p = tilecore_hip.HIPBackend().probe()
    assert p.status == "no-toolchain" and "apt-get install clang-22" in p.detail


def test_no_device_means_compile_only_and_load_refuses():
    from tilecore_hip.runtime import HIPRuntime, device_count

    if device_count():
        pytest.skip("an AMD GPU is present")
    rt = HIPRuntime("gfx942")
    assert rt.mode() == "compile-only"
    from tilecore.plugin import Source

    with pytest.raises(DeviceError, match="hip-python|no AMD GPU"):
        rt.load(b"", Source("", "hip", "tc_kernel", {"arch": "gfx942"}))


def test_hip_python_present_reports_no_device():
    """With hip-python installed but no GPU (its loader finds no libamdhip64, or the runtime no device) the
    backend stays compile-only and says which."""
    pytest.importorskip("hip")
    from tilecore_hip.runtime import _hip, device_count

    if device_count():
        pytest.skip("an AMD GPU is present")
    assert _hip() is not None
    p = tilecore_hip.HIPBackend().probe()
    if p.status != "no-toolchain":
        assert p.status == "no-device" and "hip-python finds none" in p.detail


@needs_toolchain
def test_targets_list_shows_no_device_with_toolchain():
    proc = subprocess.run([sys.executable, "-m", "tilecore", "targets", "list", "--json"], capture_output=True, text=True)
    rows = {r["target"]: r for r in json.loads(proc.stdout)}
    for t in ARCHS:
        assert rows[t]["status"] in ("no-device", "ok"), rows[t]


# -- the units, element by element against the ISA's formulas ------------------------------------------

@pytest.mark.parametrize("k", [16, 32])
def test_mfma_layouts_follow_the_isa(k):
    u = mfma_16x16(k, ("float16",), "x")
    per = k // 4
    for lane in range(64):
        for e in range(per):
            assert u.a.element(lane, e) == (lane % 16, per * (lane // 16) + e)
            assert u.b.element(lane, e) == (per * (lane // 16) + e, lane % 16)
        for r in range(4):
            assert u.c.element(lane, r) == (4 * (lane // 16) + r, lane % 16)


def test_wmma_layouts_follow_the_isa():
    u = wmma_16x16x16()
    for lane in range(32):
        for e in range(16):
            assert u.a.element(lane, e) == (lane % 16, e) and u.b.element(lane, e) == (e, lane % 16)
        for r in range(8):
            assert u.c.element(lane, r) == (2 * r + lane // 16, lane % 16)
    assert sorted(u.a.locate((3, 5))[0]) == [3, 19]  # both half-waves hold row 3


def test_profiles_pick_units_and_wave_width():
    from tilecore.layout import units_for
    from tilecore.plugin.capabilities import profile_for

    be = tilecore_hip.HIPBackend()
    got = {t: sorted(u.spelling for u in units_for(be, be.parse_target(t), profile_for(be.parse_target(t))))
           for t in ARCHS}
    assert got["hip:gfx90a"] == ["mfma_f32_16x16x16_f16"]
    assert got["hip:gfx942"] == ["mfma_f32_16x16x16_f16", "mfma_f32_16x16x32_fp8"]
    assert got["hip:gfx950"] == ["mfma_f32_16x16x16_f16", "mfma_f32_16x16x32_f16", "mfma_f32_16x16x32_fp8"]
    assert got["hip:gfx1100"] == ["wmma_f32_16x16x16_f16_w32"]
    waves = {t: profile_for(be.parse_target(t)).get("execution.simd_width") for t in ARCHS}
    assert waves == {"hip:gfx90a": 64, "hip:gfx942": 64, "hip:gfx950": 64, "hip:gfx1100": 32}


# -- compiled code objects: what the disassembly must show ---------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("target", ARCHS)
def test_readme_gemm_disassembly(target):
    k = tilecore.compile(matmul_relu(256, 256, 128, 128, 128, 32), target=target, out_idx=[-1])
    layout = k.meta["attrs"]["fragment_layouts"]["C_local"]
    assert ("wmma" if target.endswith("gfx1100") else "mfma") in layout
    ops = mnemonics(k)
    assert any(m.startswith(UNIT[target]) for m in ops), sorted(ops)
    assert any(m.startswith(("ds_read", "ds_load")) for m in ops) and any(m.startswith(("ds_write", "ds_store")) for m in ops)
    assert "s_barrier" in ops  # 128 threads: two waves on CDNA, four on RDNA3
    assert "tc_lds_vec<" in k.source.code  # A (stored M x K) as vector LDS reads, B element by element
    pipes = " ".join(k.meta["attrs"].get("pipelines", ()))
    if target in ("hip:gfx942", "hip:gfx950"):  # features.async_copy, limits.max_async_copy_bytes 4 / 16
        width = {"hip:gfx942": 4, "hip:gfx950": 16}[target]
        assert f"async {width}-byte copies" in pipes
        assert ("global_load_lds_dwordx4" if width == 16 else "global_load_lds_dword") in ops
        assert width == 16 or "global_load_lds_dwordx4" not in ops
        # global_load_lds writes a wave-wide run: its tiles stay row-major (async_copy_linear_destination)
        assert not k.meta["attrs"].get("shared_layouts")
    else:
        assert not any(m.startswith("global_load_lds") for m in ops)


@needs_toolchain
def test_single_wave_block_has_no_barrier_but_shuffles():
    from tilecore_conformance import composite

    k = tilecore.compile(composite.softmax("float32", threads=64), target="hip:gfx942")
    ops = mnemonics(k)
    assert "ds_bpermute_b32" in ops
    assert "s_barrier" not in ops  # one wave of 64: clang drops the barrier, as hipcc does


@needs_toolchain
@pytest.mark.parametrize("target", ["hip:gfx942", "hip:gfx950"])
def test_catalog_gemm_cases_take_the_matrix_unit(target):
    """Every float16 / bfloat16 / float8 gemm case whose accumulator takes a unit has the instruction."""
    from tilecore_conformance.catalog import gemm_cases

    seen = 0
    for case in gemm_cases():
        p = case.params
        if p["dtype"] not in ("float16", "bfloat16", "float8_e4m3") or (p["m"], p["n"], p["k"]) != (64, 64, 64):
            continue
        k = tilecore.compile(case.build(**p), target=target)
        if "mfma" not in k.meta["attrs"]["fragment_layouts"]["C_l"]:
            continue
        seen += 1
        assert any(m.startswith("v_mfma_f32_16x16x") for m in mnemonics(k)), case.id
    assert seen >= 8


def _fp8_gemm(dtype):
    @T.prim_func
    def g(A: T.Tensor((64, 64), dtype), B: T.Tensor((64, 64), dtype), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128) as bx:
            A_s = T.alloc_shared((64, 64), dtype)
            B_s = T.alloc_shared((64, 64), dtype)
            C_l = T.alloc_fragment((64, 64), "float32")
            T.copy(A, A_s)
            T.copy(B, B_s)
            T.clear(C_l)
            T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C)
    return g


@needs_toolchain
def test_fp8_fnuz_on_gfx942_ocp_on_gfx950():
    """Tensors hold OCP float8 (torch's float8_e4m3fn / e5m2): gfx942's MFMA reads FNUZ, so its operands are
    re-encoded by the hardware conversion (features.float8_fnuz); gfx950 reads OCP bytes as they are."""
    for dtype, mfma, cvt in (("float8_e4m3", "v_mfma_f32_16x16x32_fp8_fp8", "v_cvt_pk_fp8_f32"),
                             ("float8_e5m2", "v_mfma_f32_16x16x32_bf8_bf8", "v_cvt_pk_bf8_f32")):
        k942 = tilecore.compile(_fp8_gemm(dtype), target="hip:gfx942")
        k950 = tilecore.compile(_fp8_gemm(dtype), target="hip:gfx950")
        assert "#define TC_FP8_FNUZ 1" in k942.source.code and "#define TC_FP8_FNUZ 0" in k950.source.code
        o942, o950 = mnemonics(k942), mnemonics(k950)
        assert mfma in o942 and mfma in o950
        assert cvt in o942 and cvt not in o950
    with pytest.raises(tilecore.errors.UnsupportedFeatureError):
        tilecore.compile(_fp8_gemm("float8_e4m3"), target="hip:gfx90a")  # no fp8 MFMA on CDNA2


@needs_toolchain
def test_emit_asm_cli(tmp_path):
    src = tmp_path / "kern.py"
    src.write_text("from kernels_for_tests import matmul_relu\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tilecore", "compile", f"{src}:matmul_relu", "--args",
                           "128,128,64,64,64,32", "--target", "hip:gfx942", "--emit", "asm"],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "v_mfma_f32_16x16x16_f16" in proc.stdout and "s_endpgm" in proc.stdout


@needs_toolchain
def test_compile_error_shows_clang_message_and_file():
    from tilecore.plugin import Source

    bad = Source("extern \"C\" __attribute__((global)) void tc_kernel() { undefined_thing(); }\n", "hip", "tc_kernel",
                 {"arch": "gfx942", "libs": []})
    with pytest.raises(CompileError) as e:
        hipc.HIPCompiler("gfx942").compile(bad, {})
    msg = str(e.value)
    assert "undefined_thing" in msg and re.search(r"source: \S+kernel\.hip", msg)


@needs_toolchain
def test_math_links_ocml_only_when_called():
    from tilecore_conformance import composite

    k = tilecore.compile(composite.softmax("float32"), target="hip:gfx942")  # exp2
    assert k.source.meta["libs"] == ["ocml"]

    @T.prim_func
    def add(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(64):
                B[i] = A[i] + 1.0
    assert tilecore.compile(add, target="hip:gfx942").source.meta["libs"] == []


# -- numbers: the generated HIP on the host emulation ----------------------------------------------------

def _close(got, ref, tol):
    err = np.abs(got.astype(np.float64) - ref).max() / max(1.0, np.abs(ref).max())
    assert err < tol, err


@needs_host
@pytest.mark.parametrize("target", ARCHS)
def test_readme_gemm_on_host(target):
    m, n, kk = 100, 128, 96  # ragged M: the edge predicates of the copies
    k = tilecore.compile(matmul_relu(m, n, kk, 64, 64, 32), target=target)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float16) for s in ((m, kk), (kk, n)))
    c = run_on_host(k, [a, b, np.zeros((m, n), np.float16)])[2]
    _close(c, np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0), 2e-3)


@needs_host
@pytest.mark.parametrize("target", ["hip:gfx942", "hip:gfx1100"])
def test_softmax_on_host(target):
    from tilecore_conformance import composite

    k = tilecore.compile(composite.softmax("float32"), target=target)
    wave = 64 if target != "hip:gfx1100" else 32
    assert f", {wave})" in k.source.code and f"#define TC_WAVE {wave}" in k.source.code  # exchanges at the wave
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    _close(run_on_host(k, [x, np.zeros_like(x)])[1], composite.softmax_ref([x], "float32")[0], 1e-6)


@needs_host
@pytest.mark.parametrize("target,causal", [("hip:gfx942", False), ("hip:gfx942", True), ("hip:gfx1100", True),
                                           ("hip:gfx950", False)])
def test_flash_attention_on_host(target, causal):
    from tilecore_conformance import composite

    k = tilecore.compile(composite.attention("float16", causal), target=target)
    assert ("wmma" if target.endswith("1100") else "mfma") in k.meta["attrs"]["fragment_layouts"]["acc_o"]
    rng = np.random.default_rng(2)
    q, kk, v = (rng.standard_normal((2, 80, 32)).astype(np.float16) for _ in range(3))
    o = run_on_host(k, [q, kk, v, np.zeros_like(q)])[3]
    _close(o, composite.attention_ref([q, kk, v], "float16", causal)[0], 3e-3)


def _gemm_reduce():
    @T.prim_func
    def gr(A: T.Tensor((64, 32), "float16"), B: T.Tensor((32, 64), "float16"), R: T.Tensor((64,), "float32"),
           S: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64) as bx:
            A_s = T.alloc_shared((64, 32), "float16")
            B_s = T.alloc_shared((32, 64), "float16")
            C = T.alloc_fragment((64, 64), "float32")
            r = T.alloc_fragment((64,), "float32")
            s = T.alloc_fragment((64,), "float32")
            T.copy(A, A_s)
            T.copy(B, B_s)
            T.clear(C)
            T.gemm(A_s, B_s, C)
            T.reduce_max(C, r, dim=1)
            T.reduce_sum(C, s, dim=0)
            T.copy(r, R)
            T.copy(s, S)
    return gr


@needs_host
@pytest.mark.parametrize("target,masks", [("hip:gfx942", {(1, 64), (2, 64), (4, 64), (8, 64), (16, 64), (32, 64)}),
                                          ("hip:gfx1100", {(1, 32), (2, 32), (4, 32), (8, 32), (16, 32)})])
def test_reductions_across_the_unit_lanes(target, masks):
    """Rows of the MFMA accumulator span lanes l % 16 (xor 1..8), columns lanes l / 16 (xor 16, 32) in one
    wave of 64; on RDNA3 (waves of 32) xor 16 stays a shuffle and the column's lanes 32 apart are another wave
    (the waves' totals through shared memory)."""
    k = tilecore.compile(_gemm_reduce(), target=target)
    got = {(int(a), int(b)) for a, b in re.findall(r"tc_shfl_xor\([^;]*?, (\d+), (\d+)\)", k.source.code)}
    assert got == masks
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((64, 32)).astype(np.float16), rng.standard_normal((32, 64)).astype(np.float16)
    r, s = run_on_host(k, [a, b, np.zeros(64, np.float32), np.zeros(64, np.float32)])[2:]
    c = a.astype(np.float64) @ b.astype(np.float64)
    _close(r, c.max(1), 1e-5)
    _close(s, c.sum(0), 1e-5)


@needs_host
def test_a_wrong_mfma_layout_fails_on_host(monkeypatch):
    """The emulator checks the layouts: registering the MFMA accumulator transposed gives wrong numbers."""
    import tilecore_hip.units as hu
    from tilecore.layout import FragmentLayout

    good = hu.mfma_16x16

    def transposed(k, dtypes, spelling):
        u = good(k, dtypes, spelling)
        c = FragmentLayout((16, 16), [[("thread", 16, 1)], [("reg", 4, 1), ("thread", 4, 16)]], name="wrong.C")
        return type(u)(u.family, u.m, u.n, u.k, u.a_dtypes, u.acc_dtype, u.group, u.a, u.b, c, u.spelling)

    monkeypatch.setattr(hu, "mfma_16x16", transposed)
    k = tilecore.compile(matmul_relu(64, 64, 32, 64, 64, 32), target="hip:gfx942",
                         pass_configs={"tilecore.disable_cache": True})
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((64, 32)).astype(np.float16), rng.standard_normal((32, 64)).astype(np.float16)
    c = run_on_host(k, [a, b, np.zeros((64, 64), np.float16)])[2]
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
    assert np.abs(c - ref).max() > 1.0


# -- the conformance catalog, compile-only, per architecture ----------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("target", ARCHS)
def test_conformance_catalog(tmp_path, target):
    """The whole catalog as a vendor's CI runs it: compile-only here (no AMD GPU), device mode where one is."""
    proc = subprocess.run([sys.executable, "-m", "tilecore", "conformance", "run", "--target", target, "-n", "1",
                           "--report", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    res = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    states = [x["state"] for x in res]
    assert len(res) >= 340 and states.count("PASS") >= 290, len(res)
    assert set(states) <= {"PASS", "NOT_SUPPORTED", "EXPECTED_FAIL"}, set(states)
    mode = tilecore_hip.HIPBackend().runtime(tilecore_hip.HIPBackend().parse_target(target)).mode()
    assert mode == "compile-only" or PROBE.status == "ok"
    assert {x["mode"] for x in res} == {mode}
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["mode"] == mode and man["capability_profile"] == "hip/" + target.split(":")[1]
