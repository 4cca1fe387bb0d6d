"""The CUDA plugin's matrix units as data (tilecore_cuda/units.py): each layout is a bijection, matches the
PTX ISA's fragment figure element by element, and agrees with the mapping the register programs
(regprog.py) and the host emulator's mma.sync already write as text. The MatrixOp spelling compiles."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tilecore.layout import units_for
from tilecore.plugin import get_registry
from tilecore.plugin.capabilities import profile_for

import tilecore_cuda
from tilecore_cuda.units import MMA_16816, mma_16816_units, wgmma_accumulator, wgmma_units

MMA = mma_16816_units()[0]
HERE = Path(__file__).parent


def test_every_unit_layout_is_a_bijection():
    for u in mma_16816_units() + wgmma_units():
        for role, lay in u.layouts().items():
            if lay.opaque:   # wgmma reads B from shared memory itself
                assert u.family == "wgmma" and role == "b"
                continue
            lay.check()


def test_mma_16816_matches_the_ptx_figures():
    # PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type": groupID = lane >> 2,
    # threadID_in_group = lane % 4; a_i: row groupID (+ 8 for i in 2, 3, 6, 7), column 2 t + (i & 1) (+ 8 for i >= 4)
    assert (MMA.a.regs, MMA.b.regs, MMA.c.regs) == (8, 4, 4)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            assert MMA.a.element(lane, i) == (g + 8 * (i in (2, 3, 6, 7)), 2 * t + (i & 1) + 8 * (i >= 4))
        for i in range(4):
            assert MMA.b.element(lane, i) == (2 * t + (i & 1) + 8 * (i >= 2), g)
            assert MMA.c.element(lane, i) == (g + 8 * (i >= 2), 2 * t + (i & 1))


@pytest.mark.parametrize("n", [8, 64, 120, 256])
def test_wgmma_accumulator_matches_the_formula(n):
    lay = wgmma_accumulator(n)
    lay.check()
    assert (lay.threads, lay.regs) == (128, n // 2)
    for thread in range(128):
        warp, lane = divmod(thread, 32)
        for j in range(n // 8):
            for h in range(2):
                for e in range(2):
                    assert lay.element(thread, 4 * j + 2 * h + e) == (16 * warp + lane // 4 + 8 * h,
                                                                    8 * j + 2 * (lane % 4) + e)


def _c_eval(expr: str, **names) -> int:
    """A C integer expression of non-negative ints, evaluated in Python."""
    return eval(expr.replace("/", "//"), {}, names)  # noqa: S307 - text from our own sources


def test_regprog_text_uses_the_same_accumulator_mapping():
    src = (Path(tilecore_cuda.__file__).parent / "regprog.py").read_text()
    row = re.search(r"const int tc_row = ([^;]+);", src).group(1)
    col = re.search(r"const int tc_col = ([^;]+);", src).group(1)
    elem_row = re.search(r"const int \{iv\} = ([^;]+);", src).group(1)
    elem_col = re.search(r"const int \{jv\} = ([^;]+);", src).group(1)
    reg = re.search(r"\{em\.name\(st, b\)\}\[(4 \* tc_j[^\]]+)\]", src).group(1)
    lay = wgmma_accumulator(64)
    for tc_t in (0, 5, 37, 70, 127):
        base = dict(tc_c=0, tc_t=tc_t, tc_l=tc_t % 32)
        for tc_j in range(8):
            for tc_h in range(2):
                for tc_e in range(2):
                    names = dict(base, tc_j=tc_j, tc_h=tc_h, tc_e=tc_e, tc_row=_c_eval(row, **base),
                                 tc_col=_c_eval(col, **base))
                    r = _c_eval(reg, **names)
                    assert lay.element(tc_t, r) == (_c_eval(elem_row, **names), _c_eval(elem_col, **names))
    # the warp-level mma.sync accumulator is the same placement for the rows of one warp
    for lane in range(32):
        for r in range(4):
            assert MMA.c.element(lane, r) == lay.element(lane, r)


def test_host_emulator_mma_uses_the_same_operand_mapping():
    """tests/cuda_host_emulator.py computes mma.sync from the lanes' 32-bit registers: A (row, k) in lane
    ``(row % 8) * 4 + (k % 8) / 2``, register ``(row >= 8) + 2 * (k >= 8)``, half ``k & 1`` (B alike); the
    16-bit element index in the unit's layout is ``2 * register + half``."""
    src = (HERE / "cuda_host_emulator.py").read_text()
    a_lane, a_reg = re.search(r"tc_w->a\[([^\]]*row[^\]]*)\]\[([^\]]+)\]", src).groups()
    b_lane, b_reg = re.search(r"tc_w->b\[([^\]]*col[^\]]*)\]\[([^\]]+)\]", src).groups()
    for row in range(16):
        for k in range(16):
            lane, reg = _c_eval(a_lane, row=row, k=k), _c_eval(a_reg, row=row, k=k)
            assert MMA.a.locate((row, k)) == ((lane,), 2 * reg + (k & 1))
    for k in range(16):
        for col in range(8):
            lane, reg = _c_eval(b_lane, col=col, k=k), _c_eval(b_reg, col=col, k=k)
            assert MMA.b.locate((k, col)) == ((lane,), 2 * reg + (k & 1))


def test_profiles_pick_the_units():
    reg = get_registry()
    for target, want in (("cuda:sm_80", {MMA_16816}), ("cuda:sm_86", {MMA_16816})):
        backend, tgt = reg.resolve(target)
        assert {u.spelling for u in units_for(backend, tgt, profile_for(tgt))} == want
    backend, tgt = reg.resolve("cuda:sm_90a")
    got = {u.spelling for u in units_for(backend, tgt, profile_for(tgt))}
    assert MMA_16816 in got and "wgmma_m64n256k16" in got and "wgmma_m64n256k32" in got and len(got) == 65
    # D67: the 8-bit units (e4m3 and e5m2, k 32) by the profile's fp8 wgmma entry; not on sm_80 / sm_86 (above)
    eight = [u for u in units_for(backend, tgt, profile_for(tgt)) if u.k == 32]
    assert len(eight) == 32 and all(u.a_dtypes == ("float8_e4m3", "float8_e5m2") for u in eight)


def test_wgmma_8_bit_a_matches_the_ptx_figure():
    """The m64nNk32 8-bit A (PTX ISA, wgmma "Register fragment for matrix A", .e4m3/.e5m2; data only: the unit reads
    A from its tile, D67): warp w's rows 16 w ..; lane l's element i at row l / 4 + 8 (i / 4 % 2), column
    4 (l % 4) + i % 4 + 16 (i / 8); K-major only, A from shared memory only."""
    u = next(u for u in wgmma_units() if u.spelling == "wgmma_m64n128k32")
    assert (u.a.regs, u.a.threads) == (16, 128)
    for thread in range(128):
        w, lane = divmod(thread, 32)
        for i in range(16):
            assert u.a.element(thread, i) == (16 * w + lane // 4 + 8 * (i // 4 % 2), 4 * (lane % 4) + i % 4 + 16 * (i // 8))
    assert u.attrs["k_major_only"] and u.attrs["operand_sources"] == {"a": ("shared",), "b": ("shared",)}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_matrix_op_spelling_compiles_to_mma(tmp_path):
    """The emitter's MatrixOp spelling (prelude/tc_matrix.cuh) on 16-bit register arrays becomes mma.sync."""
    pre = Path(tilecore_cuda.__file__).parent / "prelude"
    body = "  __half ah[8], bh[4];\n  __nv_bfloat16 an[8], bn[4];\n"
    code = (prelude() + (pre / "tc_matrix.cuh").read_text() +
            'extern "C" __global__ void k(const __half* x, const __nv_bfloat16* y, float* out) {\n' + body +
            "  float c[4] = {0, 0, 0, 0};\n"
            "  for (int i = 0; i < 8; ++i) { ah[i] = x[threadIdx.x * 8 + i]; an[i] = y[threadIdx.x * 8 + i]; }\n"
            "  for (int i = 0; i < 4; ++i) { bh[i] = x[i]; bn[i] = y[i]; }\n"
            "  " + CUDA_SPELL.format(c="c", c_off=0, a="ah", a_off=0, b="bh", b_off=0) + "\n"
            "  " + CUDA_SPELL.format(c="c", c_off=0, a="an", a_off=0, b="bn", b_off=0) + "\n"
            "  for (int i = 0; i < 4; ++i) out[threadIdx.x * 4 + i] = c[i];\n}\n")
    (tmp_path / "k.cu").write_text(code.replace("#pragma once\n", ""))
    r = subprocess.run(["nvcc", "-arch=sm_80", "-ptx", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.ptx")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    ptx = (tmp_path / "k.ptx").read_text()
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 1
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 1
    assert ".local" not in ptx      # the register arrays stay in registers


from tilecore_cuda.codegen import CUDAEmitter, prelude  # noqa: E402

CUDA_SPELL = CUDAEmitter.matrix_ops[MMA_16816]
