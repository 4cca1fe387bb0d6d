"""Indexed shuffles in layout conversion (tilecore.ir.ShuffleIndex, plan_conversion's ``index`` kind; docs/layout.md
"Layout conversion", decision D24): the algebra over random lane permutations (every plan, run by
apply_conversion through the same lane and register expressions the lowering emits, moves every element where
the destination wants it; ``index`` only where the target has indexed shuffles; xor where it is no dearer),
kernels through tilecore.compile run on the host emulators of every backend that spells it (CUDA, HIP, MUSA,
Metal) against numpy, a real catalog kernel whose conversion now takes indexed shuffles, the capability gate,
and mutations: a wrong source lane is caught by the algebra and by the compiled kernel."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import CompileError
from tilecore.layout import Digit, FragmentLayout, apply_conversion, plan_conversion
from tilecore.layout.convert import MAX_EXCHANGES, Conversion

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
NOCACHE = {"tilecore.disable_cache": True}
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
from test_layout_conversion import values  # noqa: E402  ([thread, reg] -> the element's row-major index)


def bits_layout(slots, name: str) -> FragmentLayout:
    """A 32x32 layout over 128 threads x 8 registers from one-bit digits: ``slots[b]`` places coordinate bit
    ``b`` (row bits 0-4, then column bits 0-4, innermost first) as ``(space, stride)``."""
    dims = [[Digit(sp, 2, st) for sp, st in slots[:5]], [Digit(sp, 2, st) for sp, st in slots[5:]]]
    return FragmentLayout((32, 32), dims, name=name)


#: mma.sync's 16x8 accumulator over 2x2 warps and registers (32x32), bit by bit: rows r0..r2 in lane bits
#: 2..4, r3 in register bit 1, r4 in warp bit 5; columns c0 in register bit 0, c1 c2 in lane bits 0 1,
#: c3 in warp bit 6, c4 in register bit 2
MMA = [("thread", 4), ("thread", 8), ("thread", 16), ("reg", 2), ("thread", 32),
       ("reg", 1), ("thread", 1), ("thread", 2), ("thread", 64), ("reg", 4)]
LANE_BITS = [k for k, (sp, st) in enumerate(MMA) if sp == "thread" and st < 32]
#: the lane bits rotated by one (bit i of the lane goes to bit i + 1): the holders of a register are at 32
#: xor distances, all in one source register, so one indexed shuffle per register does it
ROTATED = [(sp, (st * 2 if st < 16 else 1) if sp == "thread" and st < 32 else st) for sp, st in MMA]


def random_layouts(n: int, seed: int):
    """``n`` layouts with the warp bits of :data:`MMA` and its lane and register bits shuffled at random."""
    rng = np.random.default_rng(seed)
    free = [k for k, (sp, st) in enumerate(MMA) if not (sp == "thread" and st >= 32)]
    out = []
    for i in range(n):
        perm = rng.permutation(free)
        slots = list(MMA)
        for k, p in zip(free, perm):
            slots[k] = MMA[p]
        out.append(bits_layout(slots, f"random{i}"))
    return out


# -- the algebra -----------------------------------------------------------------------------------------

def test_random_permutations_plan_and_apply_to_the_direct_move():
    lays = [bits_layout(MMA, "mma"), bits_layout(ROTATED, "rotated")] + random_layouts(10, 0)
    kinds: dict = {}
    for a in lays:
        for b in lays:
            for width in (32, 64):
                conv = plan_conversion(a, b, width, True)
                kinds[conv.kind] = kinds.get(conv.kind, 0) + 1
                np.testing.assert_array_equal(apply_conversion(conv, values(a)), values(b),
                                              err_msg=f"{a.name} -> {b.name} by {conv.describe()}")
                without = plan_conversion(a, b, width, False)
                assert without.kind != "index"
                if conv.kind == "index":
                    assert all(len(ks) <= MAX_EXCHANGES for ks in conv.sources)
                    assert all(bool(ms) != bool(ks) for ms, ks in zip(conv.masks, conv.sources))
                    # indexed shuffles are taken only where xor shuffles cost more or cannot do it
                    assert without.kind == "shared" or without.shuffles() > conv.shuffles() + conv.indexed()
                else:
                    assert conv.kind == without.kind and conv.masks == without.masks
    assert kinds.get("index", 0) >= 20 and kinds.get("shared", 0) and kinds.get("registers", 0), kinds


def test_the_kinds_follow_the_cost():
    mma, rot = bits_layout(MMA, "mma"), bits_layout(ROTATED, "rotated")
    conv = plan_conversion(mma, rot, 32, True)
    assert conv.kind == "index" and conv.indexed() == 8 and conv.shuffles() == 0, conv.describe()
    assert "8 indexed shuffles within groups of 32 for 8 registers" in conv.describe()
    assert plan_conversion(mma, rot, 32, False).kind == "shared"     # 32 xor distances a register
    assert plan_conversion(mma, rot, 0, True).kind == "shared"       # no shuffles at all
    # two lane bits exchanged: one xor distance per register, as cheap as an indexed shuffle: xor kept
    swapped = list(MMA)
    swapped[0], swapped[6] = MMA[6], MMA[0]
    conv = plan_conversion(mma, bits_layout(swapped, "swapped"), 32, True)
    assert conv.kind == "shuffle" and conv.sources == ()


def _wrong_lane(monkeypatch):
    """Mutation: every indexed shuffle reads the lane next to the right one (lane ^ 1)."""
    from tilecore.ir import binary

    real = Conversion.lane_expr
    monkeypatch.setattr(Conversion, "lane_expr", lambda self, thread, r: binary("xor", real(self, thread, r), 1))


def test_a_wrong_source_lane_is_caught_by_the_algebra(monkeypatch):
    mma, rot = bits_layout(MMA, "mma"), bits_layout(ROTATED, "rotated")
    conv = plan_conversion(mma, rot, 32, True)
    np.testing.assert_array_equal(apply_conversion(conv, values(mma)), values(rot))
    _wrong_lane(monkeypatch)
    assert (apply_conversion(conv, values(mma)) != values(rot)).any()


# -- kernels ---------------------------------------------------------------------------------------------

def relayout(src: FragmentLayout, dst: FragmentLayout, dtype: str):
    """``Y = 2 X + 1`` between two fragments laid out by ``src`` and ``dst`` (annotated): the nest works in
    one layout, so the other fragment is converted."""
    M, N = src.shape

    @T.prim_func
    def kern(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(1, threads=src.threads) as bx:
            X_l = T.alloc_fragment((M, N), dtype)
            Y_l = T.alloc_fragment((M, N), dtype)
            T.annotate_layout({X_l: src, Y_l: dst})
            T.copy(X, X_l)
            for i, j in T.Parallel(M, N):
                Y_l[i, j] = X_l[i, j] * 2 + 1
            T.copy(Y_l, Y)
    return kern


def _converted(kernel) -> str:
    got = kernel.meta["attrs"]["fragment_layouts"]
    assert not any(v.startswith("shared") for v in got.values()), got
    text = " ".join(v for v in got.values() if "[converted for" in v)
    assert text, got
    return text


def _data(dtype, seed=0):
    x = np.random.default_rng(seed).standard_normal((32, 32)).astype(dtype)
    return x, (x.astype(np.float64) * 2 + 1)


def _runner(target):
    """The host emulator's run function for ``target``, or a skip where its compiler is missing."""
    vendor = target.split(":")[0]
    if vendor == "cuda":
        if shutil.which("g++") is None:
            pytest.skip("the host emulator needs g++ (C++20)")
        from cuda_host_emulator import run_on_host
        return run_on_host
    pytest.importorskip(f"tilecore_{vendor}")
    mod = __import__(f"{vendor}_host_emulator")
    if mod.compiler() is None:
        pytest.skip(f"the {vendor} host emulator needs clang++")
    return mod.run_on_host


SPELLED = {"cuda:sm_80": "__shfl_sync(", "hip:gfx942": "tc_shfl_idx(", "musa:mp_31": "__shfl_sync(",
           "metal:apple9": "simd_shuffle("}


@pytest.mark.parametrize("target,dtype", [("cuda:sm_80", "float16"), ("hip:gfx942", "float32"),
                                          ("musa:mp_31", "float32"), ("metal:apple9", "float32")])
def test_a_lane_rotation_runs_on_indexed_shuffles(target, dtype):
    run = _runner(target)
    k = tilecore.compile(relayout(bits_layout(MMA, "mma"), bits_layout(ROTATED, "rotated"), dtype), target=target,
                         pass_configs=NOCACHE)
    assert "by index (8 indexed shuffles" in _converted(k)
    assert SPELLED[target] in k.source.code and "_xchg" not in k.source.code   # no shared round trip
    if target.startswith("hip") and shutil.which("llvm-objdump-22"):
        # the code object clang built (compile-only mode): 8 ds_bpermute, nothing written to LDS
        import subprocess
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".co") as f:
            f.write(k.binary)
            f.flush()
            isa = subprocess.run(["llvm-objdump-22", "-d", f.name], capture_output=True, text=True).stdout
        assert isa.count("ds_bpermute_b32") == 8 and "ds_write" not in isa, isa[-2000:]
    if target.startswith("cuda") and k.binary:
        # the cubin nvcc/NVRTC built (compile-only here): 8 SHFL.IDX, nothing stored to shared memory
        import tilecore_cuda

        sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
        assert sass.count("SHFL.IDX") == 8 and "STS" not in sass and "STL" not in sass, sass[-2000:]
    if target.startswith("metal"):
        # MSL checked by clang against the metal_stdlib stand-in (simd_shuffle's signature, address spaces)
        from metal_msl_check import check as msl_check

        assert msl_check({"relayout": k.source.code}) == {}
        assert msl_check({"relayout": k.source.code}, address_spaces=True) == {}
    x, ref = _data(dtype)
    out = run(k, [x, np.zeros_like(x)])[1]
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-3 if dtype == "float16" else 1e-6, atol=1e-6)


@needs_gxx
def test_a_wrong_source_lane_is_caught_in_the_compiled_kernel(monkeypatch):
    from cuda_host_emulator import run_on_host

    kern = relayout(bits_layout(MMA, "mma"), bits_layout(ROTATED, "rotated"), "float32")
    good = tilecore.compile(kern, target="cuda:sm_80", pass_configs=NOCACHE)
    x, ref = _data("float32", 1)
    np.testing.assert_allclose(run_on_host(good, [x, np.zeros_like(x)])[1], ref, rtol=1e-6)
    _wrong_lane(monkeypatch)
    bad = tilecore.compile(kern, target="cuda:sm_80", pass_configs=NOCACHE)
    assert bad.source.code != good.source.code
    assert not np.allclose(run_on_host(bad, [x, np.zeros_like(x)])[1], ref, rtol=1e-6)


def test_the_ir_prints_the_shuffle_and_its_lane():
    from tilecore.compiler import lower
    from tilecore.ir import func_str

    ir = func_str(lower(relayout(bits_layout(MMA, "mma"), bits_layout(ROTATED, "rotated"), "float32"),
                        "cuda:sm_80", NOCACHE)[2])
    assert "T.shuffle(X_l[0], " in ir and ", width=32)" in ir and "T.shuffle_xor(" not in ir, ir


@pytest.mark.parametrize("target,width", [("hip:gfx942", 64), ("musa:mp_22", 128)])
def test_the_catalog_reduction_into_a_fragment_laid_out_otherwise_takes_indexed_shuffles(target, width):
    """The catalog's ``T.copy(D, r)`` then ``T.reduce_max(f, r, clear=False)``: on waves of 64 (and QY2's warps
    of 128) r's old value reaches the reduction's layout by one indexed shuffle per register (before: a shared
    round trip); on 64-wide waves the result still goes back through shared memory (its holders are in the
    other wave)."""
    from tilecore_conformance.catalog import _reduce_kernel

    run = _runner(target)
    k = tilecore.compile(_reduce_kernel("max", 1, False, "float32"), target=target, pass_configs=NOCACHE)
    text = _converted(k)
    assert "(its old value): " in text and f"by index (8 indexed shuffles within groups of {width}" in text, text
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    d = rng.standard_normal(64).astype(np.float32) + 1.0
    out = run(k, [a, d, np.full(64, np.nan, np.float32)])[2]
    np.testing.assert_allclose(out, np.maximum(a.max(1), d))


# -- the capability gate and the spelling -----------------------------------------------------------------

def test_a_target_without_indexed_shuffles_never_gets_them(monkeypatch):
    from tilecore.capabilities._profile import Capabilities

    real = Capabilities.feature
    monkeypatch.setattr(Capabilities, "feature",
                        lambda self, name: False if name == "shuffle_index" else real(self, name))
    k = tilecore.compile(relayout(bits_layout(MMA, "mma"), bits_layout(ROTATED, "rotated"), "float32"),
                         target="cuda:sm_80", pass_configs=NOCACHE)
    assert "by shared" in _converted(k) and "__shfl_sync(" not in k.source.code


def test_an_emitter_without_the_spelling_is_told_what_to_set(monkeypatch):
    from tilecore_cuda.codegen import CUDAEmitter

    monkeypatch.setattr(CUDAEmitter, "shuffle_index", "")
    with pytest.raises(CompileError, match=r"indexed register exchange .*shuffle_index.*features.shuffle_index"):
        tilecore.compile(relayout(bits_layout(MMA, "mma"), bits_layout(ROTATED, "rotated"), "float32"),
                         target="cuda:sm_80", pass_configs=NOCACHE)


def test_musa_structural_check_bounds_the_indexed_shuffle_width():
    """tilecore_musa.structure: every ``__shfl_sync`` width fits the profile's warp; the unmutated kernel passes,
    a width above the warp (64 on PH1's 32) is caught."""
    pytest.importorskip("tilecore_musa")
    from tilecore.plugin import profile_for, resolve_target
    from tilecore_musa import structure

    k = tilecore.compile(relayout(bits_layout(MMA, "mma"), bits_layout(ROTATED, "rotated"), "float32"),
                         target="musa:mp_31", pass_configs=NOCACHE)
    code, caps = k.get_kernel_source(), profile_for(resolve_target("musa:mp_31")[1])
    meta = k.meta["source"]["meta"] if "meta" in k.meta.get("source", {}) else k.meta["source"]
    assert code.count("__shfl_sync(0xffffffffu, ") == 8 and code.count(", 32);") >= 8
    assert not structure.check(code, meta, caps)
    bad = code.replace(", 32);", ", 64);")
    assert any("indexed lane exchange of width 64 on 32-wide warps" in p for p in structure.check(bad, meta, caps))
