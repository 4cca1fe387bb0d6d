"""The MUSA backend (tilecore-musa), through the public API. No MUSA compiler or device exists here, so
the honest mode is ``codegen-only``: the generated MUSA C++ is checked structurally on every build
(tilecore_musa/structure.py) and, with ``TILECORE_MUSA_STUB`` set, by clang in CUDA mode against the stub
header the backend's tests keep (backends/musa/tests/stub). Both gates get mutation tests: the
unmutated kernels pass, each mutation is caught."""
from __future__ import annotations

import inspect
import os
import shutil
from pathlib import Path

import pytest

import tilecore
import tilecore.language as T
from kernels_for_tests import matmul_relu
from tilecore.errors import CompileError, DeviceError, UnsupportedFeatureError

tilecore_musa = pytest.importorskip("tilecore_musa")
from tilecore_musa import compiler as mcc, structure  # noqa: E402
from tilecore_musa.units import qy2_mma_32x32x16  # noqa: E402

STUB = str(Path(tilecore_musa.__file__).resolve().parents[1] / "tests" / "stub")
CLANG = mcc.find_clang()
needs_clang = pytest.mark.skipif(CLANG is None and os.environ.get("TILECORE_MUSA_REQUIRE_TOOLCHAIN") != "1",
                                 reason="no clang++ for the MUSA stub check (apt-get install clang-22)")
QY2, PH1 = "musa:mp_22", "musa:mp_31"
NOCACHE = {"tilecore.disable_cache": True}


def source(kernel) -> str:
    return kernel.get_kernel_source()


def meta(kernel) -> dict:
    return kernel.meta["source"]["meta"] if "meta" in kernel.meta.get("source", {}) else kernel.meta["source"]


def caps(target: str):
    from tilecore.plugin import profile_for, resolve_target

    return profile_for(resolve_target(target)[1])


def tme_gemm(M=256, N=256, K=128, bm=64, bn=64, bk=32, threads=128, copy_kwargs=None, kernel_kwargs=None):
    """A GEMM whose operand copies are outside any pipelined loop (TME candidates on PH1)."""
    copy_kwargs, kernel_kwargs = copy_kwargs or {}, kernel_kwargs or {}

    @T.prim_func
    def gemm_k(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads, **kernel_kwargs) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.float16)
            B_s = T.alloc_shared((bk, bn), T.float16)
            C_l = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_l)
            for ko in T.serial(T.ceildiv(K, bk)):
                T.copy(A[by * bm, ko * bk], A_s, **copy_kwargs)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])
    return gemm_k


def tme_gemm32(M, N, K, bm=64, bn=64, bk=32, threads=128):
    """A float32 GEMM (no SQMMA: its operands are 32-bit) whose operand copies are TME loads on PH1."""
    @T.prim_func
    def gemm32(A: T.Tensor((M, K), T.float32), B: T.Tensor((K, N), T.float32), C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.float32)
            B_s = T.alloc_shared((bk, bn), T.float32)
            C_l = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_l)
            for ko in T.serial(T.ceildiv(K, bk)):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])
    return gemm32


def pipelined_gemm(M=256, N=256, K=128, bm=64, bn=64, bk=32, stages=2, force_async=False):
    @T.prim_func
    def gemm_p(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.float16)
            B_s = T.alloc_shared((bk, bn), T.float16)
            C_l = T.alloc_fragment((bm, bn), T.float32)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                if force_async:
                    T.copy(A[by * bm, ko * bk], A_s, force_async_copy=True)
                    T.copy(B[ko * bk, bx * bn], B_s, force_async_copy=True)
                else:
                    T.copy(A[by * bm, ko * bk], A_s)
                    T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])
    return gemm_p


# -- targets, profiles, modes ---------------------------------------------------------------------------

def test_targets_aliases_and_profiles():
    from tilecore.plugin import resolve_target

    for spec, arch, profile in (("musa:mp_22", "mp_22", "musa/quyuan"), ("musa:qy2", "mp_22", "musa/quyuan"),
                                ("musa:mp_31", "mp_31", "musa/pinghu"), ("musa:ph1", "mp_31", "musa/pinghu")):
        backend, target = resolve_target(spec)
        assert backend.name == "musa" and target.arch == arch and target.capability_id == profile
    assert tilecore_musa.MUSABackend().targets() == [QY2, PH1]
    # QY2 runs 128-wide warps (tilelang_musa's TargetGetWarpSize), PH1 32-wide ones in 4-warp squads
    assert caps(QY2).get("execution.simd_width") == 128 and caps(PH1).get("execution.simd_width") == 32
    for f in ("bulk_tensor_copy", "async_barrier", "sqmma"):
        assert caps(PH1).satisfies(f"feature:{f}")[0] is True and caps(QY2).satisfies(f"feature:{f}")[0] is False


def test_mode_is_codegen_only_and_load_refuses():
    backend = tilecore_musa.MUSABackend()
    probe = backend.probe()
    assert probe.status in ("no-toolchain", "no-device") and "MUSA SDK" in probe.detail
    k = tilecore.compile(matmul_relu(256, 256, 128, 64, 64, 32), target=PH1)
    assert k.mode == "codegen-only"
    with pytest.raises(DeviceError, match="codegen-only"):
        backend.runtime(k.target).load(k.binary, k.source)


def test_qy2_unit_layouts_follow_the_fork():
    u = qy2_mma_32x32x16()
    assert (u.m, u.n, u.k, u.group) == (32, 32, 16, 128)
    for r in range(32):
        for c in range(32):  # C: lane c0 + 8 r0 + 32 c1 + 64 r1, register c2 + 2 r2
            r0, r1, r2, c0, c1, c2 = r % 4, (r // 4) % 2, r // 8, c % 8, (c // 8) % 2, c // 16
            assert u.c.locate((r, c)) == ((c0 + 8 * r0 + 32 * c1 + 64 * r1,), c2 + 2 * r2)
        for k in range(16):  # A (m x k): lane k1 + 4 r0 + 32 k2 + 64 r1, register k0 + 2 r2
            r0, r1, r2, k0, k1, k2 = r % 8, (r // 8) % 2, r // 16, k % 2, (k // 2) % 4, k // 8
            assert u.a.locate((r, k)) == ((k1 + 4 * r0 + 32 * k2 + 64 * r1,), k0 + 2 * r2)
            # B (k x n), n = r: lane k1 + 4 n0 + 32 n1 + 64 k2, register k0 + 2 n2
            n0, n1, n2 = r % 8, (r // 8) % 2, r // 16
            assert u.b.locate((k, r)) == ((k1 + 4 * n0 + 32 * n1 + 64 * k2,), k0 + 2 * n2)


# -- what each generation gets ----------------------------------------------------------------------------

def test_qy2_gemm_on_the_mma_atom_with_128_wide_warps():
    k = tilecore.compile(matmul_relu(256, 256, 128, 64, 64, 32), target=QY2)
    src = source(k)
    assert "#define TC_WARP 128" in src
    assert "tc_mp22_mma(&" in src and "__musa_fmma_m32n32k16_mma(" in src
    for absent in ("__musa_tme", "__musa_async_", "sqmma", "__musa_memcpy_g2s", "MUtensorDescriptor"):
        assert absent not in src, absent
    assert not structure.check(src, meta(k), caps(QY2))


def test_ph1_tme_barriers_and_sqmma():
    k = tilecore.compile(tme_gemm(), target=PH1)
    src, m = source(k), meta(k)
    assert "#define TC_WARP 32" in src and "tc_mp22_mma" not in src
    assert m["vendor"] == {"tme_loads": 2, "async_barriers": [1, 2], "sqmma_gemms": 1, "async_copies": 0}
    # one descriptor per tensor and box, built on the host: A's box 64 x 32, B's 32 x 64 (rows, columns)
    assert [(d["name"], d["box"]) for d in m["tme_descriptors"]] == [("A", [64, 32]), ("B", [32, 64])]
    body = src[src.index('extern "C" __global__'):]
    assert "const MUtensorDescriptor tc_desc0" in body and "const MUtensorDescriptor tc_desc1" in body
    assert "__musa_async_bar_record(2);" in body and "__musa_async_init_arrival(1, 1, 0);" in body
    assert "__musa_async_add_trans(1, 4096);" in body and "__musa_async_wait(2, tc_phase2);" in body
    assert "tc_tme_load_2d(tc_desc0, 1, A_s" in body and "tc_sqmma_gemm<128, 64, 64, 32, 64, 64, 16," in body
    assert not structure.check(src, m, caps(PH1))


def test_ph1_tme_stays_off_where_the_user_or_the_shape_says():
    # disable_tma (the core's T.copy option) and force_async_copy (MUSA's extension) keep A's copy off TME
    for kw in ({"disable_tma": True}, {"force_async_copy": True}):
        k = tilecore.compile(tme_gemm(copy_kwargs=kw), target=PH1)
        assert meta(k)["vendor"]["tme_loads"] == 1 and "tc_tme_load_2d(tc_desc0, 1, B_s" in source(k), kw
    # a gemm in 64 threads (not a whole squad) does not take SQMMA
    k = tilecore.compile(tme_gemm(threads=64), target=PH1)
    assert meta(k)["vendor"]["sqmma_gemms"] == 0 and "tc_sqmma_gemm<" not in source(k)


def test_ph1_pipelined_loops_take_tme_unless_forced_async():
    k = tilecore.compile(pipelined_gemm(), target=PH1)
    v = meta(k)["vendor"]
    assert v["tme_loads"] == 2 and v["async_copies"] == 0 and v["sqmma_gemms"] == 1
    # force_async_copy: the planner's multi-stage per-thread copies, spelled __musa_memcpy_g2s
    k = tilecore.compile(pipelined_gemm(bk=16, force_async=True), target=PH1)  # two stages fit in 28 KiB
    src, v = source(k), meta(k)["vendor"]
    assert v["tme_loads"] == 0 and v["async_copies"] > 0 and "2 stages" in k.meta["attrs"]["pipelines"][0]
    assert "tc_async_copy<16>(" in src and "__musa_memcpy_g2s(" in src and "tc_async_wait();" in src
    assert not structure.check(src, meta(k), caps(PH1))
    bad = src.replace("tc_async_wait();\n", "")
    assert any("never waited for" in p for p in structure.check(bad, meta(k), caps(PH1)))


def test_producer_threads_picks_the_issuing_warp():
    k = tilecore.compile(tme_gemm(threads=256, kernel_kwargs={"producer_threads": 64}), target=PH1)
    assert source(k).count("if (((int)threadIdx.x) == 192) {") == 2
    with pytest.raises(CompileError, match=r"producer_threads=48\).*multiple of the warp width \(32"):
        tilecore.compile(tme_gemm(threads=256, kernel_kwargs={"producer_threads": 48}), target=PH1)


@pytest.mark.parametrize("target", ["cpu", QY2])
def test_musa_extensions_are_refused_elsewhere_naming_ph1(target):
    with pytest.raises(UnsupportedFeatureError) as e:
        tilecore.compile(tme_gemm(copy_kwargs={"force_async_copy": True}), target=target)
    msg = str(e.value)
    line = inspect.getsourcelines(tme_gemm)[1] + next(
        i for i, s in enumerate(inspect.getsourcelines(tme_gemm)[0]) if "T.copy(A[by * bm" in s)
    assert "`force_async_copy`" in msg and "backend musa (tilecore-musa: musa:mp_31)" in msg, msg
    assert f"test_musa_backend.py:{line}" in msg, msg


def test_warp_width_reaches_the_row_reductions():
    from tilecore_conformance import composite

    widths = {}
    for t in (QY2, PH1):
        src = source(tilecore.compile(composite.softmax("float32", rows=64, cols=256, br=4, threads=128), target=t))
        import re
        widths[t] = {int(w) for w in re.findall(r"__shfl_xor_sync\(0xffffffffu, .*?, \d+, (\d+)\)", src)}
    assert max(widths[QY2]) > 32 and max(widths[PH1]) <= 32, widths


# -- the structural gate: mutations ---------------------------------------------------------------------

def _ph1():
    k = tilecore.compile(tme_gemm(), target=PH1, pass_configs=NOCACHE)
    return source(k), meta(k)


MUTATIONS = [
    ("drop the wait on barrier 1", lambda s: s.replace("    __musa_async_wait(1, tc_phase1);\n", ""),
     "not followed by every thread's __musa_async_wait(1"),
    ("wrong byte count", lambda s: s.replace("__musa_async_add_trans(1, 4096);", "__musa_async_add_trans(1, 2048);"),
     "barrier 1 expects 2048 bytes, the TME box has 4096"),
    ("drop the arrive", lambda s: s.replace("      __musa_async_arrive(2);\n", ""), "without __musa_async_arrive(2)"),
    ("two loads on one barrier", lambda s: s.replace("tc_tme_load_2d(tc_desc1, 2,", "tc_tme_load_2d(tc_desc1, 1,")
     .replace("__musa_async_add_trans(2,", "__musa_async_add_trans(1,")
     .replace("__musa_async_arrive(2);", "__musa_async_arrive(1);"), "shared by 2 TME load sites"),
    ("no init", lambda s: s.replace(" __musa_async_init_arrival(2, 1, 0);", ""),
     "barrier 2 is used but never initialised"),
    ("no warpsquad_wait", lambda s: s.replace("    __musa_sqmma_wait(); /*", "    /*"),
     "without waiting for the squad"),
    ("TME arity", lambda s: s.replace("(int)((ko * 32)), (int)((by * 64)), 32, 64);", "(int)((ko * 32)), 32, 64);"),
     "tc_tme_load_2d with 6 arguments"),
    ("every thread issues", lambda s: s.replace("if (((int)threadIdx.x) == 0) {\n      __musa_async_add_trans(1",
                                                 "{\n      __musa_async_add_trans(1"),
     "not issued by exactly one thread"),
]


@pytest.mark.parametrize("name,mutate,expect", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_structural_checks_catch_mutations(name, mutate, expect):
    src, m = _ph1()
    assert not structure.check(src, m, caps(PH1))
    bad = mutate(src)
    assert bad != src, f"mutation {name} changed nothing"
    problems = structure.check(bad, m, caps(PH1))
    assert any(expect in p for p in problems), problems


def test_structural_checks_gate_vendor_statements_by_profile():
    k = tilecore.compile(matmul_relu(256, 256, 128, 64, 64, 32), target=QY2, pass_configs=NOCACHE)
    src, m = source(k), meta(k)
    ph1_src, _ = _ph1()
    tme_line = next(line for line in ph1_src.splitlines() if "tc_tme_load_2d(tc_desc0" in line)
    body = src.index('extern "C" __global__')
    bad = src[:body] + "/* */\n" + src[body:].replace("__syncthreads();", "__syncthreads();\n" + tme_line, 1)
    assert any("bulk_tensor_copy" in p for p in structure.check(bad, m, caps(QY2)))
    narrow = src.replace("#define TC_WARP 128", "#define TC_WARP 32")
    assert any("simd_width is 128" in p for p in structure.check(narrow, m, caps(QY2)))


# -- the clang stub gate: every MUSA statement the backend writes is declared with its real arity -------

@needs_clang
@pytest.mark.parametrize("target", [QY2, PH1])
def test_stub_check_accepts_generated_code(target):
    k = tilecore.compile(tme_gemm() if target == PH1 else matmul_relu(256, 256, 128, 64, 64, 32), target=target,
                         pass_configs=NOCACHE)
    mcc.syntax_check(source(k), k.target.arch, STUB)


STUB_MUTATIONS = [
    ("unknown name", lambda s: s.replace("__musa_async_arrive(1);", "__musa_async_arive(1);"), "__musa_async_arive"),
    ("wrong arity", lambda s: s.replace("__musa_sqmma_wait();", "__musa_sqmma_wait(0);"), "__musa_sqmma_wait"),
    ("wrong type", lambda s: s.replace("tc_f2h(", "tc_f2bf(", 1), "__mt_bfloat16"),
    ("TME arity", lambda s: s.replace("(unsigned long long)&d, dim, crd, TC_TME_TAIL);",
                                      "(unsigned long long)&d, dim, crd);", 1), "__musa_tme_ld_tile_2d"),
]


@needs_clang
@pytest.mark.parametrize("name,mutate,expect", STUB_MUTATIONS, ids=[m[0] for m in STUB_MUTATIONS])
def test_stub_check_catches_mutations(name, mutate, expect):
    src, _ = _ph1()
    bad = mutate(src)
    assert bad != src, f"mutation {name} changed nothing"
    with pytest.raises(CompileError, match=expect):
        mcc.syntax_check(bad, "mp_31", STUB)


@needs_clang
def test_build_runs_the_stub_check_when_asked(monkeypatch):
    monkeypatch.setenv("TILECORE_MUSA_STUB", STUB)
    k = tilecore.compile(tme_gemm(), target=PH1, pass_configs=NOCACHE)
    assert k.binary == source(k).encode()
    assert "clang stub check" in tilecore_musa.MUSABackend().toolchain_version(k.target)


def test_stub_lives_with_the_backend_tests():
    assert shutil.os.path.exists(os.path.join(STUB, "musa_stub.h"))
    text = Path(STUB, "musa_stub.h").read_text()
    for name in ("__musa_tme_ld_tile_2d", "__musa_async_init_arrival", "__musa_sqmma_m##M##n##N##_mma",
                 "TC_STUB_SQMMA(64, 64)", "__musa_fmma_m32n32k16_mma", "__musa_memcpy_g2s"):
        assert name in text


def test_mcc_when_present_builds_and_the_mode_says_compile_only(tmp_path, monkeypatch):
    """A stand-in mcc (records its command line, writes a binary): the backend uses it, and without a MUSA
    device the mode is compile-only, not device."""
    fake = tmp_path / "mcc"
    fake.write_text('#!/bin/sh\necho "mcc version 9.9 (stand-in)"\nfor a; do last="$prev"; prev="$a"; done\n'
                    f'echo "$@" > {tmp_path}/args\nprintf MUBIN > "$prev"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("TILECORE_MUSA_MCC", str(fake))
    mcc.find_mcc.cache_clear()
    mcc.mcc_version.cache_clear()
    try:
        k = tilecore.compile(matmul_relu(256, 256, 128, 64, 64, 32), target=PH1, pass_configs=NOCACHE)
        assert k.binary == b"MUBIN" and k.mode == "compile-only"
        args = (tmp_path / "args").read_text()
        assert "-x musa --cuda-device-only --cuda-gpu-arch=mp_31" in args and "-O3" in args
        with pytest.raises(DeviceError, match="compile-only"):
            tilecore_musa.MUSABackend().runtime(k.target).load(k.binary, k.source)
    finally:
        mcc.find_mcc.cache_clear()
        mcc.mcc_version.cache_clear()


def test_loading_the_plugin_imports_no_compiler_machinery():
    """Loading a cached or exported kernel discovers every plugin: tilecore-musa must not pull in the passes
    or the language when it is imported (tests/test_cache_and_export.py checks the same for the process)."""
    import subprocess
    import sys

    code = ("import sys, tilecore_musa; tilecore_musa.MUSABackend().emitter(None); "
            "print([m for m in ('tilecore.passes', 'tilecore.language') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
