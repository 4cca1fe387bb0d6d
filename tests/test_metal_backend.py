"""The Metal backend (tilecore-metal), through the public API.

No Mac exists here, so the backend is ``codegen-only``: kernels are generated and their bindings linted.
What the tests add on top, without a Metal compiler:

- every conformance case's MSL, for all three families, through clang against the tests' ``metal_stdlib``
  stand-in (tests/metal_shim), once plainly and once with device / constant / threadgroup as clang address
  spaces (tests/metal_msl_check.py), and through the binding lint;
- mutations of generated kernels (a wrong ``mem_flags``, a missing ``simdgroup_multiply_accumulate``
  argument, a ``device`` automatic array, a device pointer as the gemm's threadgroup operand, a duplicate,
  missing or unbound ``[[buffer(n)]]``), each caught;
- numbers: the generated MSL compiled as C++ against an executing stand-in that runs each Metal thread as a
  host thread (tests/metal_host_emulator.py): the README GEMM on simdgroup matrices (accumulators resident
  over the K loop, and per call), a transposed float32 GEMM, a bfloat16 GEMM, softmax with simd_sum /
  simd_max, erf and sigmoid, and causal attention agree with float64 references, and planted bugs do not.
  A test of the generated code, not an execution mode.

clang++ (clang-22, installed by scripts/setup.sh) is required: without it these tests fail, naming it.
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
from kernels_for_tests import matmul_relu
from metal_host_emulator import run_on_host
from metal_msl_check import check as msl_check
from tilecore.errors import CompileError, DeviceError, UnsupportedFeatureError

tilecore_metal = pytest.importorskip("tilecore_metal")
from tilecore_metal.lint import check_bindings  # noqa: E402

FAMILIES = ["metal:apple7", "metal:apple8", "metal:apple9"]
off_macos = pytest.mark.skipif(sys.platform == "darwin", reason="the codegen-only behaviour off macOS")


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def readme_gemm(target="metal:apple7", m=100, n=128, k=96):
    return tilecore.compile(matmul_relu(m, n, k, 64, 64, 32), target=target)


# -- targets, profiles, probe, runtime without a Mac -------------------------------------------------------

def test_targets_and_profiles():
    from tilecore.plugin import profile_for, resolve_target

    for spec, fam in [("metal:apple7", "apple7"), ("metal:m2", "apple8"), ("metal:M3", "apple9"),
                      ("metal:m4", "apple9")]:
        assert resolve_target(spec)[1].capability_id == f"metal/{fam}"
    caps = {f: profile_for(resolve_target(f)[1]) for f in FAMILIES}
    for f, c in caps.items():
        assert c.get("execution.simd_width") == 32 and c.get("memory.shared.max_bytes_per_block") == 32768
        assert c.dtype("float64") is False and c.feature("async_copy") is False and c.feature("simdgroup_matrix")
        assert c.satisfies("dtype:bfloat16:storage")[0] is (f == "metal:apple9")
        unit = c.get("matrix_units")[0]
        assert (unit["family"], unit["m"], unit["n"], unit["k"]) == ("simdgroup_matrix", 8, 8, 8)
    assert "metal:apple8" in subprocess.run([sys.executable, "-m", "tilecore", "targets", "list"],
                                            capture_output=True, text=True).stdout


@off_macos
def test_metal_alone_is_apple7_and_codegen_only_off_macos():
    from tilecore.plugin import resolve_target

    backend, target = resolve_target("metal")
    assert target.arch == "apple7"
    probe = backend.probe()
    assert probe.status == "no-device" and "macOS" in probe.detail
    k = readme_gemm("metal")
    assert k.mode == "codegen-only"
    a, b = np.ones((100, 96), np.float16), np.ones((96, 128), np.float16)
    with pytest.raises(DeviceError, match="run only on a Mac"):
        k(a, b, np.zeros((100, 128), np.float16))


def test_mps_wrapper_takes_only_mps_tensors():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="'mps' device"):
        tilecore_metal.mps(torch.zeros(4))
    with pytest.raises(ValueError, match="'mps' device"):
        tilecore_metal.mps(np.zeros(4))


def test_simdgroup_unit_is_registered_opaque():
    from tilecore.layout import units_for
    from tilecore.plugin import profile_for, resolve_target

    backend, target = resolve_target("metal:apple7")
    units = units_for(backend, target, profile_for(target))
    assert [u.a_dtypes for u in units] == [("float16",), ("float32",)]  # bfloat16 only where the profile has it
    assert all(u.a.opaque and u.b.opaque and u.c.opaque and u.group == 32 for u in units)
    with pytest.raises(ValueError, match="opaque"):
        units[0].c.locate((0, 0))
    backend, target = resolve_target("metal:apple9")
    assert ("bfloat16",) in [u.a_dtypes for u in units_for(backend, target, profile_for(target))]


# -- the MSL ---------------------------------------------------------------------------------------------

def test_readme_gemm_msl():
    k = readme_gemm()
    code = k.source.code
    assert "[[kernel, max_total_threads_per_threadgroup(128)]] void tc_kernel(" in code
    for i, name in enumerate(("A", "B", "C")):
        assert f"device half* {name} [[buffer({i})]]" in code
    assert "device int* tc_status [[buffer(3)]]" in code
    assert "uint3 tc_bid [[threadgroup_position_in_grid]]" in code and "[[thread_index_in_threadgroup]]" in code
    assert re.search(r"^\s+threadgroup half A_shared\[2048\];", code, re.M)
    assert "threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);" in code
    # the accumulator tiles stay in simdgroup registers over the K loop: loaded once, stored once
    body = code.split("void tc_kernel")[1]
    load, gemm, store = (body.index(f"{name}<") for name in ("tc_sg_acc_load", "tc_sg_gemm_acc", "tc_sg_acc_store"))
    loop = body.index("for (long ko = 0; ko < 3; ++ko) {")
    assert load < loop < gemm < store and "simdgroup_matrix<float, 8, 8> tc_acc0[16];" in body
    assert re.search(r"tc_sg_gemm_acc<128, 64, 64, 32, .*>\(\(A_shared \+ 0\), \(B_shared \+ 0\), tc_acc0, tc_tid\);",
                     body)
    assert "tc_sg_gemm<" not in body and "simdgroup_multiply_accumulate" in code and "simdgroup_load" in code
    assert "16 8x8 tiles per simdgroup" in k.meta["attrs"]["resident_accumulators"]["C_local"]
    off = tilecore.compile(matmul_relu(100, 128, 96, 64, 64, 32), target="metal:apple7",
                           pass_configs={"tilecore.metal.resident_accumulators": False}).source.code.split("void tc_kernel")[1]
    assert re.search(r"tc_sg_gemm<128, 64, 64, 32, .*>\(\(A_shared \+ 0\), \(B_shared \+ 0\), \(C_local \+ 0\), "
                     r"tc_tid\);", off) and "tc_sg_acc_load" not in off
    assert [b["kind"] for b in k.source.meta["bindings"]] == ["tensor"] * 3 + ["status"]
    # the opaque accumulator lives in threadgroup memory, and the reason is recorded
    why = k.meta["attrs"]["fragment_layouts"]["C_local"]
    assert "opaque fragment" in why and "metal.gemm_simdgroup" in why
    assert check_bindings(code, 31) == []


def test_scalars_are_constant_buffers():
    n = T.symbolic("n")

    @T.prim_func
    def scale(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32"), a: T.float32, off: T.int32):
        with T.Kernel(T.ceildiv(n, 64), threads=64) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < n:
                    Y[bx * 64 + i] = X[bx * 64 + i] * a + off

    src = tilecore.compile(scale, target="metal:apple8").source
    # tensors first, then the integers (the argument, then the shape symbol), the float, the status word
    assert "constant long& tc_i0 [[buffer(2)]]" in src.code and "constant long& tc_i1 [[buffer(3)]]" in src.code
    assert "constant float& tc_f0 [[buffer(4)]]" in src.code and "device int* tc_status [[buffer(5)]]" in src.code
    assert "double" not in src.code.split("void tc_kernel")[1]
    assert check_bindings(src.code, 31) == []


def test_safe_math_unless_fast_math():
    from tilecore_conformance import composite

    safe = tilecore.compile(composite.softmax("float32"), target="metal:apple7").source
    fast = tilecore.compile(composite.softmax("float32"), target="metal:apple7",
                            pass_configs={"tilecore.fast_math": True}).source
    body = lambda s: s.code.split("void tc_kernel")[1]  # noqa: E731
    assert "precise::exp" in body(safe) and "fast::" not in body(safe) and safe.meta["fast_math"] is False
    assert "fast::exp" in body(fast) and "precise::" not in body(fast) and fast.meta["fast_math"] is True
    # row reductions across a whole simdgroup: simd_sum, and a NaN-propagating max unless fast math
    assert "simd_sum(" in body(safe) and "tc_simd_max(" in body(safe) and "simd_shuffle_xor" not in body(safe)
    assert re.search(r"= simd_max\(", body(fast))


def test_bfloat16_only_on_apple9():
    from tilecore_conformance.catalog import _gemm_kernel

    func = _gemm_kernel("bfloat16", "float32", False, False, 64, 64, 64)
    with pytest.raises(UnsupportedFeatureError, match="bfloat16"):
        tilecore.compile(func, target="metal:apple7")
    src = tilecore.compile(func, target="metal:apple9").source
    assert "device bfloat* A [[buffer(0)]]" in src.code and src.meta["msl_version"] == "3.1"
    assert readme_gemm().source.meta["msl_version"] == "3.0"


def test_print_is_refused_by_the_profile():
    @T.prim_func
    def show(X: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=32):
            T.print(X[0])

    with pytest.raises(UnsupportedFeatureError, match="T.print.*feature:printf"):
        tilecore.compile(show, target="metal:apple7")


# -- the whole catalog: clang against the metal_stdlib stand-in, both passes, and the binding lint -----------

def _catalog_sources(tmp_path, family) -> tuple:
    """Run the conformance suite for ``family`` (codegen-only here) into a private kernel cache; returns the
    result states and the generated sources (every compiled case's MSL)."""
    cache, report = tmp_path / "cache", tmp_path / f"report-{family}"
    env = {**os.environ, "TILECORE_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "tilecore", "conformance", "run", "--target", family, "-n", "2",
                           "--report", str(report)], capture_output=True, text=True, env=env)
    results = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    assert proc.returncode == 0, proc.stdout[-3000:]
    return results


def test_conformance_catalog_msl_compiles_for_every_family(tmp_path):
    sources: dict = {}
    for family in FAMILIES:
        results = _catalog_sources(tmp_path, family)
        states = {r["state"] for r in results}
        assert states <= {"PASS", "NOT_SUPPORTED"} and {r["mode"] for r in results} == {"codegen-only"}, \
            [(r["id"], r["state"], r.get("error")) for r in results if r["state"] not in ("PASS", "NOT_SUPPORTED")]
        assert len(results) >= 361
    for p in sorted((tmp_path / "cache").rglob("kernel.json")):
        code = json.loads(p.read_text())["source"]["code"]
        family = re.search(r"^// generated by tilecore-metal for kernel \w+ \((\w+),", code).group(1)
        sources.setdefault(code, f"{family}/{p.parent.name[:12]}")
    families = {name.split("/")[0] for name in sources.values()}
    assert families == {"apple7", "apple8", "apple9"} and len(sources) > 600
    kernels = {name: code for code, name in sources.items()}
    assert any("tc_sg_gemm_acc<" in c.split("void tc_kernel")[1] for c in kernels.values())
    assert any("tc_sg_gemm<" in c.split("void tc_kernel")[1] for c in kernels.values())  # attention's per-call gemms
    assert any("bfloat" in c.split("void tc_kernel")[1] for c in kernels.values())
    assert msl_check(kernels) == {}
    assert msl_check(kernels, address_spaces=True) == {}
    assert {n: p for n, c in kernels.items() if (p := check_bindings(c, 31))} == {}


# -- mutations: each planted bug is caught, the unmutated kernels pass ------------------------------------------

def test_mutations_are_caught():
    from tilecore_conformance import composite

    gemm = readme_gemm().source
    softmax = tilecore.compile(composite.softmax("float32"), target="metal:apple9").source
    assert msl_check({"gemm": gemm.code, "softmax": softmax.code}) == {}
    assert msl_check({"gemm": gemm.code, "softmax": softmax.code}, address_spaces=True) == {}
    barrier = "threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);"
    mma = "simdgroup_multiply_accumulate(acc[c + i * RN + j], a[i], b[j], acc[c + i * RN + j])"  # tc_sg_gemm_acc's
    assert barrier in gemm.code and mma in gemm.code and "  float x[16];" in softmax.code
    wrong_flags = gemm.code.replace(barrier, "threadgroup_barrier(mem_flags::mem_shared);", 1)
    missing_arg = gemm.code.replace(mma, "simdgroup_multiply_accumulate(acc[c + i * RN + j], a[i], b[j])")
    device_array = softmax.code.replace("  float x[16];", "  device float x[16];")
    for code in (wrong_flags, missing_arg):
        assert msl_check({"m": code}) and msl_check({"m": code}, address_spaces=True)
    assert "mem_shared" in msl_check({"m": wrong_flags})["m"]
    assert "simdgroup_multiply_accumulate" in msl_check({"m": missing_arg})["m"]
    # an automatic array in device memory is plain C++ once the qualifier is gone: only the address-space
    # pass sees it
    assert msl_check({"m": device_array}) == {}
    assert "automatic variable qualified with an address space" in msl_check({"m": device_array}, True)["m"]
    # a device pointer handed to the threadgroup gemm: plain C++ takes it, the address spaces do not
    wrong_space = gemm.code.replace("((A_shared + 0), (B_shared + 0)", "((A + 0), (B_shared + 0)")
    assert wrong_space != gemm.code and msl_check({"m": wrong_space}) == {}
    assert "no matching function for call to 'tc_sg_gemm_acc'" in msl_check({"m": wrong_space}, True)["m"]
    # a duplicate binding compiles everywhere and binds the wrong buffer: the lint (and so build) refuses it
    dup = softmax.code.replace("[[buffer(1)]]", "[[buffer(0)]]")
    assert msl_check({"m": dup}) == {} and any("bound twice" in p for p in check_bindings(dup))
    gap = softmax.code.replace("device int* tc_status [[buffer(2)]]", "device int* tc_status [[buffer(3)]]")
    assert check_bindings(gap) == ["tc_kernel: [[buffer(n)]] indices [2] are missing (used: [0, 1, 3])"]
    unbound = softmax.code.replace("device int* tc_status [[buffer(2)]]", "device int* tc_status")
    assert any("no [[buffer(n)]] binding" in p for p in check_bindings(unbound))
    assert any("past the 2 buffer" in p for p in check_bindings(softmax.code, 2)) and check_bindings(softmax.code) == []
    rt = tilecore_metal.MetalBackend().runtime(tilecore.plugin.resolve_target("metal:apple9")[1])
    with pytest.raises(CompileError, match="bound twice"):
        rt.build(type(softmax)(dup, softmax.lang, softmax.entry, softmax.meta), {})


# -- numbers: the generated MSL run on the host ------------------------------------------------------------------

def _close(got, ref, tol):
    err = float(np.max(np.abs(f64(got) - ref)))
    assert err <= tol * max(1.0, float(np.max(np.abs(ref)))), err
    return err


def test_readme_gemm_on_host():
    m, n, kk = 100, 128, 96
    k = readme_gemm("metal:apple7", m, n, kk)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float16) for s in ((m, kk), (kk, n)))
    ref = np.maximum(f64(a) @ f64(b), 0)
    _close(run_on_host(k, [a, b, np.zeros((m, n), np.float16)])[2], ref, 2e-3)
    # a planted bug: B A instead of A B in the simdgroup multiply
    swap = lambda code: code.replace("simdgroup_multiply_accumulate(acc[c + i * RN + j], a[i], b[j],",  # noqa: E731
                                     "simdgroup_multiply_accumulate(acc[c + i * RN + j], b[j], a[i],")
    bad = run_on_host(k, [a, b, np.zeros((m, n), np.float16)], mutate=swap)[2]
    assert np.max(np.abs(f64(bad) - ref)) > 1.0
    # another: the resident accumulators never stored back after the K loop
    drop = lambda code: re.sub(r"\n *tc_sg_acc_store<[^\n]*", "", code)  # noqa: E731
    bad = run_on_host(k, [a, b, np.zeros((m, n), np.float16)], mutate=drop)[2]
    assert drop(k.source.code) != k.source.code and np.max(np.abs(f64(bad) - ref)) > 1.0
    # the per-call form (accumulators loaded and stored by every gemm) computes the same
    k2 = tilecore.compile(matmul_relu(m, n, kk, 64, 64, 32), target="metal:apple7",
                          pass_configs={"tilecore.metal.resident_accumulators": False})
    _close(run_on_host(k2, [a, b, np.zeros((m, n), np.float16)])[2], ref, 2e-3)


def test_transposed_float32_gemm_on_host():
    from tilecore_conformance.catalog import _gemm_kernel

    m, n, kk = 64, 64, 64
    k = tilecore.compile(_gemm_kernel("float32", "float32", True, True, m, n, kk), target="metal:apple8")
    # both operands stored transposed: unit stride along M for A and along K for B (SAM = SBK = 1), so both
    # take simdgroup_load's transposed form
    assert re.search(r"tc_sg_gemm(_acc)?<\d+, \d+, \d+, \d+, 1, \d+, 1, \d+,", k.source.code)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((kk, m)).astype(np.float32), rng.standard_normal((n, kk)).astype(np.float32)
    _close(run_on_host(k, [a, b, np.zeros((m, n), np.float32)])[2], f64(a).T @ f64(b).T, 1e-5)


def test_bfloat16_gemm_on_host():
    from tilecore_conformance.catalog import _gemm_kernel

    k = tilecore.compile(_gemm_kernel("bfloat16", "float32", False, True, 64, 64, 64), target="metal:apple9")
    assert "simdgroup_matrix<TA, 8, 8>" in k.source.code and "device bfloat* A" in k.source.code
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
    bits = lambda x: (x.view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731 - truncation to bfloat16
    value = lambda u: (u.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    ab, bb = bits(a), bits(b)
    out = run_on_host(k, [ab, bb, np.zeros((64, 64), np.float32)])[2]
    _close(out, f64(value(ab)) @ f64(value(bb)).T, 1e-5)


def test_softmax_with_simd_reductions_on_host():
    from tilecore_conformance import composite

    k = tilecore.compile(composite.softmax("float32"), target="metal:apple9")
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    ref = composite.softmax_ref([x], "float32")[0]
    _close(run_on_host(k, [x, np.zeros_like(x)])[1], ref, 1e-6)
    x[5, 17] = np.nan  # the NaN-propagating simdgroup max: the row is NaN, the others are not
    y = run_on_host(k, [x, np.zeros_like(x)])[1]
    assert np.isnan(y[5]).all() and not np.isnan(np.delete(y, 5, axis=0)).any()
    # a planted bug: the row sums left per lane
    bad = run_on_host(k, [np.nan_to_num(x), np.zeros_like(x)], mutate=lambda c: c.replace("simd_sum(", "("))[1]
    assert np.max(np.abs(bad - ref)) > 0.1


def test_erf_and_sigmoid_on_host():
    """MSL has no erf: the prelude's (a Chebyshev fit of erfc), and sigmoid from precise::exp."""
    import math

    @T.prim_func
    def act(X: T.Tensor((256,), "float32"), Y: T.Tensor((256,), "float32"), Z: T.Tensor((256,), "float32")):
        with T.Kernel(4, threads=64) as bx:
            for i in T.Parallel(64):
                Y[bx * 64 + i] = T.erf(X[bx * 64 + i])
                Z[bx * 64 + i] = T.sigmoid(X[bx * 64 + i])

    k = tilecore.compile(act, target="metal:apple7")
    assert "tc_erf(" in k.source.code and "precise::exp(" in k.source.code
    x = np.linspace(-6, 6, 256).astype(np.float32)
    _, y, z = run_on_host(k, [x, np.zeros_like(x), np.zeros_like(x)])
    assert np.max(np.abs(f64(y) - [math.erf(v) for v in f64(x)])) < 3e-7
    assert np.max(np.abs(f64(z) - 1 / (1 + np.exp(-f64(x))))) < 3e-7


def test_causal_attention_on_host():
    from tilecore_conformance.catalog import catalog

    case = next(c for c in catalog() if c.id == "attention/causal/float16")
    k = tilecore.compile(case.build(**case.params), target="metal:apple7")
    inputs = case.inputs(np.random.default_rng(case.seed), **case.params)
    ref = case.reference(inputs, **case.params)[0]
    arrays = [np.asarray(x) for x in inputs] + [np.zeros(ref.shape, np.float16)]
    _close(run_on_host(k, arrays)[-1], ref, 2e-3)
