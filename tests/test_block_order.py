"""Heaviest blocks first (docs/decisions.md D54, ``tilecore.heaviest_first``, the core's ``tilecore.order_blocks``):
where a block's loop trip count grows with one block index (causal attention: query block ``bx`` runs
``ceil((bx + 1) bm / bn)`` key iterations), the emitter maps the block's linear index so that the growing index runs
descending, longest first in sections of G rows of the other axes (heads, batch), instead of the grid order that
starts the longest blocks last.

Without a GPU (CI): the notes (done, and why not: non-causal, decreasing, the option off), the generated remap
evaluated for every block index of several grids and section sizes (a permutation of the grid; descending within
each section; sections of G consecutive rows; a last partial section), with mutations of the emitted lines caught;
the default is True (on since the H100 measured it: exact causal +10.5% / +7.7% at batch 1); the CUDA register program keeps its SASS (HGMMA, no local memory) with
the remap. On an sm_90 GPU: bit for bit against grid order (a permutation of the blocks: the same tiles), exact and
fast math, causal, ragged (s1000), a 3-D grid with a partial last section, and against float64.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
from tilecore import language as T

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, hopper_gpu, torch_cuda  # noqa: E402,F401

ON = {"tilecore.heaviest_first": True}


def _attention(seq, bm, bn, causal, heads, batch, dim=128, threads=256):
    from tilecore_conformance.composite import flash_attention_forward

    return flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=threads)


def _k(shape, extra=(), target=HOPPER):
    # (the cache keys on the values' types too: 1 == True, but 1 is one row a section and True the automatic size)
    return _compiled(shape, tuple((k, type(v).__name__, v) for k, v in extra), target)


@functools.lru_cache(maxsize=None)
def _compiled(shape, extra, target):
    return tilecore.compile(_attention(*shape), target=target, pass_configs={**NOCACHE, **{k: v for k, _, v in extra}})


def _note(k) -> str:
    return str(k.meta["attrs"].get("heaviest_first", ""))


# -- the remap, evaluated from the generated source ----------------------------------------------------------

_DECL = re.compile(r"const (?:int|long long) (.*);$")


def remap_lines(src: str) -> list:
    """The emitted remap's declarations ``[(name, C expression)]`` in order."""
    out = []
    for line in src.splitlines():
        m = _DECL.match(line.strip())
        if not m or "tc_hf" not in m.group(1):
            continue
        for part in m.group(1).split(", tc_hf"):  # "a = x, tc_hfb = y"
            name, _, expr = part.partition(" = ")
            name = name if name.startswith("tc_hf") else "tc_hf" + name
            out.append((name.strip(), expr.strip()))
    return out


def evaluate(lines: list, bidx: tuple) -> tuple:
    """The block variables (tc_hfx, tc_hfy, tc_hfz) the remap gives block index ``bidx``: C's integer arithmetic on
    non-negative values (``/`` truncates, as Python's ``//`` on these)."""
    env = {"tc_min": min, "blockIdx_x": bidx[0], "blockIdx_y": bidx[1], "blockIdx_z": bidx[2]}
    for name, expr in lines:
        py = expr.replace("blockIdx.", "blockIdx_").replace("(int)", "").replace("(long long)", "").replace("/", "//")
        env[name] = eval(py, {}, env)  # noqa: S307 (the test's own generated integer expressions)
    return tuple(env.get(f"tc_hf{a}", 0) for a in "xyz")


def check_order(lines: list, grid: tuple, g: int) -> str | None:
    """None where the remap is heaviest first in sections of ``g`` rows on ``grid`` (x the growing axis), else what
    is wrong."""
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    rows = gy * gz
    seen = []
    for lin in range(gx * rows):
        bidx = (lin % gx, (lin // gx) % gy, lin // (gx * gy))
        seen.append(evaluate(lines, bidx))
    if sorted(seen) != sorted(itertools.product(range(gx), range(gy), range(gz))):
        return "not a permutation of the grid's blocks"
    for s0 in range(0, rows, g):
        size = min(g, rows - s0)
        part = seen[s0 * gx:(s0 + size) * gx]
        xs = [p[0] for p in part]
        if xs != sorted(xs, reverse=True):
            return f"section at row {s0}: x not descending"
        if {p[1] + gy * p[2] for p in part} != set(range(s0, s0 + size)):
            return f"section at row {s0}: not rows {s0}..{s0 + size - 1}"
        if xs[0] != gx - 1 or xs[-1] != 0:
            return f"section at row {s0}: does not run from the last x to the first"
    return None


@needs_toolchain
def test_notes_source_and_default():
    shape = (1024, 128, 128, True, 4, 2)  # grid (8, 4, 2): 1..8 iterations a block
    on, off, default = _k(shape, tuple(ON.items())), _k(shape, (("tilecore.heaviest_first", False),)), _k(shape)
    assert "heaviest blocks first: x descending (1 .. 8 iterations in grid order) in sections of 8 of the other " \
           "axes' 8 rows" in _note(on)
    assert "blocks in grid order: the work grows along x (1 .. 8 iterations)" in _note(off)
    assert default.get_kernel_source() == on.get_kernel_source()  # on by default since the H100 measured it (D54)
    from tilecore.passes.blockorder import HEAVIEST_FIRST_DEFAULT

    assert HEAVIEST_FIRST_DEFAULT is True
    src = on.get_kernel_source()
    assert "tc_hf" not in off.get_kernel_source() and "const int bx = (int)tc_hfx;" in src
    assert "const int bx = (int)blockIdx.x;" in off.get_kernel_source()
    assert check_order(remap_lines(src), (8, 4, 2), 8) is None
    full = _k((1024, 128, 128, False, 4, 2), tuple(ON.items()))  # non-causal: every block runs 8 iterations
    assert "tc_hf" not in full.get_kernel_source() and _note(full) == ""


@needs_toolchain
@pytest.mark.parametrize("heads,batch,g", [(4, 2, 1), (4, 2, 3), (3, 2, 4), (5, 1, 2), (1, 1, 1)])
def test_remap_is_heaviest_first_permutation(heads, batch, g):
    """Every block index maps to a distinct block; x descending within each section of g rows, the last partial."""
    shape = (1000, 128, 128, True, heads, batch)  # ragged: 8 query blocks, the last one short
    k = _k(shape, (("tilecore.heaviest_first", g),))
    lines = remap_lines(k.get_kernel_source())
    assert lines and f"sections of {min(g, heads * batch)} of" in _note(k)
    assert check_order(lines, (8, heads, batch), min(g, heads * batch)) is None


@needs_toolchain
def test_remap_mutations_caught():
    k = _k((1000, 128, 128, True, 3, 2), (("tilecore.heaviest_first", 4),))
    lines = remap_lines(k.get_kernel_source())
    assert check_order(lines, (8, 3, 2), 4) is None

    def mutate(name, old, new):
        return [(n, e.replace(old, new) if n == name else e) for n, e in lines]

    assert check_order(mutate("tc_hfg", "6 - tc_hfs * 4", "4"), (8, 3, 2), 4)  # no partial last section
    assert check_order(mutate("tc_hfa", "7 - ", "0 + "), (8, 3, 2), 4)  # ascending
    assert check_order(mutate("tc_hfrow", "tc_hfw % tc_hfg", "0"), (8, 3, 2), 4)  # rows lost
    assert check_order(lines, (8, 3, 2), 2)  # the checker tells the section size apart


def _custom(n, falling):
    """A block whose serial loop runs more (or fewer) iterations the larger its x index."""
    @T.prim_func
    def k(A: T.Tensor((n * 4, 64), "float32"), B: T.Tensor((n * 4, 64), "float32")):
        with T.Kernel(n, 4, threads=64) as (bx, by):
            acc = T.alloc_fragment((64,), "float32")
            T.fill(acc, 0)
            for i in T.serial((n - bx) if falling else (bx + 1)):
                for j in T.Parallel(64):
                    acc[j] = acc[j] + A[by * n + i, j]
            for j in T.Parallel(64):
                B[by * n + bx, j] = acc[j]
    return k


@needs_toolchain
def test_other_kernels_generic_path():
    """The core's analysis on a kernel outside the register programs: growing (reordered, a permutation of the 2-D
    grid), falling (already heaviest first: left in grid order with a note)."""
    up = tilecore.compile(_custom(6, False), target=HOPPER, pass_configs={**NOCACHE, **ON})
    down = tilecore.compile(_custom(6, True), target=HOPPER, pass_configs={**NOCACHE, **ON})
    assert "heaviest blocks first: x descending (1 .. 6 iterations" in _note(up)
    assert check_order(remap_lines(up.get_kernel_source()), (6, 4), 4) is None
    assert "the work falls along x, 6 .. 1 iterations: the heaviest start first" in _note(down)
    assert "tc_hf" not in down.get_kernel_source()


@needs_toolchain
def test_bad_option_value():
    with pytest.raises(tilecore.errors.CompileError, match="tilecore.heaviest_first='yes': True, False or a number"):
        tilecore.compile(_attention(1024, 128, 128, True, 4, 2), target=HOPPER,
                         pass_configs={**NOCACHE, "tilecore.heaviest_first": "yes"})


@needs_toolchain
@pytest.mark.parametrize("bn", [128, 176])
def test_the_benchmarks_kernel_sass(bn):
    """The benchmark's causal kernel (b8 h32 s4096) with the remap: the core's general path (the WGMMA register program
    it ran on before D86 retired it), HGMMA in the main loop, no local memory."""
    k = _k((4096, 128, bn, True, 32, 8), tuple(ON.items()))
    assert tilecore_cuda.lowering_path(k) == "generic"
    assert "in sections of 8 of the other axes' 256 rows" in _note(k)  # 8 heads x 32 query blocks >= 132 SMs
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, HOPPER)
    assert "HGMMA" in sass and "STL" not in sass and "LDL" not in sass


@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulator needs g++ (C++20)")
def test_runs_right_on_the_host():
    """The sm_80 register program (mma.sync + cp.async) of causal attention on a 3-D grid (3 query blocks, the last
    ragged, x 3 heads x 2 batches), sections of 4 rows (the last one of 2), run on the host emulator
    (tests/cuda_host_emulator.py): bit for bit the grid order's output, and against float64. A remap that sends two
    blocks to one tile (a mutation) leaves a tile unwritten."""
    from cuda_host_emulator import run_on_host
    from tilecore_conformance.composite import attention_ref

    seq, heads, batch = 136, 3, 2  # 3 query blocks of 64 (the last 8 rows): 6 kv steps a head, not 200's 10
    rng = np.random.default_rng(5)
    q, kk, v = (rng.standard_normal((batch, heads, seq, 64)).astype(np.float16) for _ in range(3))
    outs, kernels = [], []
    for order in (4, False):
        k = tilecore.compile(_attention(seq, 64, 64, True, heads, batch, dim=64, threads=128), target="cuda:sm_80",
                             pass_configs={**NOCACHE, "tilecore.heaviest_first": order})
        assert ("tc_hf" in k.get_kernel_source()) == (order is not False)
        kernels.append(k)
        outs.append(run_on_host(k, [q, kk, v, np.full(q.shape, np.nan, np.float16)])[3])
    assert outs[0].tobytes() == outs[1].tobytes()
    for b in range(batch):
        ref = attention_ref([x[b] for x in (q, kk, v)], "float16", True, seq=seq, dim=64)[0]
        np.testing.assert_allclose(outs[0][b].astype(np.float64), ref, atol=2e-2, rtol=2e-2)
    src = kernels[0].source
    code = src.code.replace("tc_hfs * 4 + tc_hfw % tc_hfg", "tc_hfs * 4")  # every block of a section on one row
    assert code != src.code
    broken = type("K", (), {"source": dataclasses.replace(src, code=code)})()
    bad = run_on_host(broken, [q, kk, v, np.full(q.shape, np.nan, np.float16)])[3]
    assert np.isnan(bad.astype(np.float64)).any()


def test_hip_runs_right_on_the_host():
    """The same order on another SIMT C++ target: the catalog's causal attention for hip:gfx942 (a 2-D grid; the
    profile has no SM count, so True means sections of one row: each head reversed), run on the HIP host emulator
    (tests/hip_host_emulator.py): bit for bit the grid order's output, and against float64."""
    hip = pytest.importorskip("hip_host_emulator")
    if hip.compiler() is None:
        pytest.skip("the HIP host emulator needs clang++")
    from tilecore_conformance import composite

    rng = np.random.default_rng(2)
    q, kk, v = (rng.standard_normal((2, 80, 32)).astype(np.float16) for _ in range(3))
    outs = []
    for order in (True, False):
        k = tilecore.compile(composite.attention("float16", True), target="hip:gfx942",
                             pass_configs={**NOCACHE, "tilecore.heaviest_first": order})
        assert ("tc_hf" in k.get_kernel_source()) == order
        if order:
            assert "in sections of 1 of the other axes' 2 rows (tilecore.heaviest_first; the profile has no " \
                   "limits.sm_count" in _note(k)
        outs.append(hip.run_on_host(k, [q, kk, v, np.zeros_like(q)])[3])
    assert outs[0].tobytes() == outs[1].tobytes()
    ref = composite.attention_ref([q, kk, v], "float16", True)[0]
    np.testing.assert_allclose(outs[0].astype(np.float64), ref, atol=3e-3, rtol=3e-3)


# -- on an H100 --------------------------------------------------------------------------------------------

DEVICE = {"causal-3d": (1024, 128, 128, True, 3, 2), "causal-ragged-176": (1000, 128, 176, True, 4, 2),
          "full-ragged": (1000, 128, 128, False, 2, 2)}


def _device_run(torch, shape, configs, fast):
    seq, bm, bn, causal, heads, batch = shape
    rng = np.random.default_rng(31)
    q, kk, v = (rng.standard_normal((batch, heads, seq, 128)).astype(np.float16) for _ in range(3))
    qt, kt, vt = (torch.from_numpy(x).cuda() for x in (q, kk, v))
    k = tilecore.compile(_attention(*shape), target="cuda", pass_configs={**configs, "tilecore.fast_math": fast})
    o = torch.full_like(qt, 7.0)
    k(qt, kt, vt, o)
    torch.cuda.synchronize()
    return (q, kk, v), o.double().cpu().numpy(), k


@hopper_gpu
@pytest.mark.parametrize("order", [True, 1, 4], ids=["auto", "reverse", "s4"])
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("shape", list(DEVICE))
def test_device_bit_identical_and_float64(torch_cuda, shape, fast, order):
    from tilecore_conformance.composite import attention_ref

    inputs, got, k = _device_run(torch_cuda, DEVICE[shape], {"tilecore.heaviest_first": order}, fast)
    _, base, _ = _device_run(torch_cuda, DEVICE[shape], {"tilecore.heaviest_first": False}, fast)
    assert got.tobytes() == base.tobytes()
    seq, bm, bn, causal, heads, batch = DEVICE[shape]
    assert ("heaviest blocks first" in _note(k)) == causal
    for b in range(batch):
        ref = attention_ref([x[b] for x in inputs], "float16", causal, seq=seq, dim=128)[0]
        np.testing.assert_allclose(got[b], ref, atol=2e-2, rtol=2e-2)
