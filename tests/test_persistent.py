"""The persistent tile loop (``tilecore.persistent``, tilecore/passes/persistent.py, docs/decisions.md D36).

With the option on, a kernel of the form (setup) + one top-level ``T.Pipelined`` loop + (epilogue) on a static
grid launches the resident blocks only, each looping over the tiles; the pipeline planner carries its stage
count and barrier parity across the tiles and issues the next tile's first stages in this tile's last
iterations. Checked through ``tilecore.compile``:

- the C backend (no async copies: the tile loop alone) against float64, and on == off bit for bit, for tile
  counts below, at and above the launched blocks, ragged edges and ``T.use_swizzle``;
- the generated CUDA for sm_80 (cp.async stages carried across tiles) on the host emulator, against float64 and
  bit for bit against the kernel without the option; a mutation (the next tile's copies addressed with this
  tile's block indices) must give wrong numbers;
- sm_90a (TMA bulk copies on transaction barriers, wgmma): the structure of the source, and its SASS (HGMMA,
  UTMALDG, SYNCS, no local-memory spills) where NVRTC is installed;
- the kernels that do not fit keep their launch, with a note saying why;
- on an sm_90 GPU: on == off bit for bit and against float64.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.ir
import tilecore.language as T
from tilecore.passes import persistent as persistent_pass

sys.path.insert(0, str(Path(__file__).parent))

NOCACHE = {"tilecore.disable_cache": True}


def gemm(M, N, K, bm=32, bn=32, bk=16, stages=3, threads=128, dtype="float32", acc="float32", swizzle=None,
         clear=True, n_dyn=False):
    n = T.dynamic("n") if n_dyn else N

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, n), dtype), C: T.Tensor((M, n), dtype)):
        with T.Kernel(T.ceildiv(n, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), acc)
            if swizzle:
                T.use_swizzle(swizzle)
            if clear:
                T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])

    return main


def _note(k) -> str:
    return " ".join(k.meta["attrs"].get("persistent", ()))


# -- the C backend ----------------------------------------------------------------------------------------

#: (M, N, K, blocks, swizzle): tiles of 32x32 -> ceil(N/32) x ceil(M/32) tiles
CPU_CASES = {
    "above": (64, 96, 40, 2, None),       # 6 tiles on 2 blocks (3 each)
    "uneven": (100, 70, 50, 3, None),     # 12 tiles, ragged on every edge, 3 blocks
    "swizzle": (96, 160, 64, 4, 3),       # 15 tiles, T.use_swizzle(3): panels of 3 rows
    "ragged-panel": (150, 90, 50, 4, 3),  # 5 rows of tiles in panels of 3 (the last of 2), ragged edges (D56)
    "one-block": (64, 64, 48, True, None),  # the profile's execution.cores (1): every tile on one block
}


@pytest.mark.parametrize("case", sorted(CPU_CASES))
def test_cpu_persistent_gemm_matches_float64_and_the_plain_launch(case):
    M, N, K, blocks, swz = CPU_CASES[case]
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    on = tilecore.compile(gemm(M, N, K, swizzle=swz), target="cpu",
                          pass_configs={**NOCACHE, "tilecore.persistent": blocks})
    off = tilecore.compile(gemm(M, N, K, swizzle=swz), target="cpu", pass_configs=NOCACHE)
    tiles = -(-M // 32) * -(-N // 32)
    want = 1 if blocks is True else blocks
    assert _note(on).startswith(f"persistent: {want} blocks over {tiles} tiles"), _note(on)
    c_on, c_off = np.full((M, N), np.nan, np.float32), np.full((M, N), np.nan, np.float32)
    on(a, b, c_on)
    off(a, b, c_off)
    np.testing.assert_allclose(c_on, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)
    assert np.array_equal(c_on, c_off)


@pytest.mark.parametrize("blocks,why", [(6, "fit in one wave"), (64, "fit in one wave")])
def test_as_many_blocks_as_tiles_keeps_the_plain_launch(blocks, why):
    k = tilecore.compile(gemm(64, 96, 40), target="cpu", pass_configs={**NOCACHE, "tilecore.persistent": blocks})
    assert why in _note(k) and not _note(k).startswith("persistent:")


def test_the_tile_loop_in_the_ir(tmp_path, monkeypatch):
    """The launch after the pass: 4 blocks, one serial tile loop annotated for the planner, the block indices
    bound per tile with their ranges promised (T.assume) for the bounds prover."""
    monkeypatch.setenv("TILECORE_DUMP_IR", str(tmp_path))
    tilecore.compile(gemm(64, 96, 40), target="cpu", pass_configs={**NOCACHE, "tilecore.persistent": 4})
    ir = next(tmp_path.glob("*/*_pipelining.tilecore.persistent_tiles.ir")).read_text()
    assert "with T.Kernel(4, threads=(128,)) as (tc_pid):" in ir
    assert ("for tile_i in T.serial(0, ((((tc_pid * -1) + 5) // 4) + 1), "
            "persistent_tiles=persistent(4 blocks, 6 tiles))") in ir
    assert "tile: int32 = (tc_pid + (tile_i * 4))" in ir
    assert ir.count("T.assume(") == 2
    final = next(tmp_path.glob("*/final.c")).read_text()
    assert "tile_i" in final


def test_tile_indices_cover_the_grid_once():
    """Every rasterization maps the linear tiles onto the grid one to one (the swizzled order as the launch's)."""
    from tilecore.ir import Var

    t = Var("t", "int32")
    for grid, swz in (([5, 7], None), ([5, 7], (3, "row")), ([5, 7], (2, "col")), ([4, 3, 2], None),
                      ([4, 3, 2], (2, "row"))):
        exprs = persistent_pass.tile_indices(t, grid, swz)
        seen = set()
        for v in range(int(np.prod(grid))):
            idx = tuple(_eval(e, {id(t): v}) for e in exprs)
            assert all(0 <= x < g for x, g in zip(idx, grid)), (grid, swz, v, idx)
            seen.add(idx)
        assert len(seen) == int(np.prod(grid)), (grid, swz)


def _eval(e, env):
    """An integer expression (constants, ``env``'s variables, arithmetic, comparisons, selects) as Python ints."""
    from tilecore.ir import BinOp, Cast, Cmp, IntImm, Select, Var

    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b, "min": min, "max": max,
           "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}
    if isinstance(e, IntImm):
        return e.value
    if isinstance(e, Var):
        return env[id(e)]
    if isinstance(e, Cast):
        return _eval(e.value, env)
    if isinstance(e, (BinOp, Cmp)):
        return ops[e.op](_eval(e.a, env), _eval(e.b, env))
    if isinstance(e, Select):
        return _eval(e.t if _eval(e.cond, env) else e.f, env)
    raise TypeError(f"cannot evaluate {type(e).__name__}")


def _launch_order(v, grid, panel, order):
    """Block ``v``'s indices as the SIMT emitter's launch rasterizes T.use_swizzle (SIMTCppEmitter.block_indices:
    a panel's rows ``min(gs - first, panel)``, a run-time quotient)."""
    gx, gy = grid[0], grid[1]
    lin = v % (gx * gy)
    gf, gs = (gx, gy) if order == "row" else (gy, gx)
    pn = panel * gf
    first = (lin // pn) * panel
    rows = min(gs - first, panel)
    fast, slow = (lin % pn) // rows, first + (lin % pn) % rows
    return tuple(([fast, slow] if order == "row" else [slow, fast]) + ([v // (gx * gy)] if len(grid) == 3 else []))


@pytest.mark.parametrize("grid", [[16, 32], [5, 7], [7, 5], [4, 3, 2], [3, 10]])
def test_tile_indices_walk_the_launch_order_dividing_by_constants_only(grid):
    """The persistent loop walks T.use_swizzle's panels in the launch's order, ragged last panels included, and
    every quotient is by a constant: the planner evaluates the stage ahead's indices in every k step, where a
    quotient by the panel's run-time row count was a 64-bit division subroutine in thread 0's path (D56)."""
    from tilecore.ir import BinOp, Var, const_value, walk_expr

    t = Var("t", "int32")
    for panel in (1, 2, 3, 4, 8, 12):
        for order in ("row", "col"):
            exprs = persistent_pass.tile_indices(t, grid, (panel, order))
            for v in range(int(np.prod(grid))):
                got = tuple(_eval(e, {id(t): v}) for e in exprs)
                assert got == _launch_order(v, grid, panel, order), (grid, panel, order, v)
            runtime = []
            for e in exprs:
                walk_expr(e, lambda x: runtime.append(x) if isinstance(x, BinOp) and x.op in ("floordiv", "floormod")
                          and const_value(x.b) is None else None)
            assert not runtime, (grid, panel, order, runtime)


def _two_loops(M=64, N=64, K=32):
    @T.prim_func
    def main(A: T.Tensor((M, K), "float32"), B: T.Tensor((K, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, 32), T.ceildiv(M, 32), threads=128) as (bx, by):
            A_s = T.alloc_shared((32, 16), "float32")
            B_s = T.alloc_shared((16, 32), "float32")
            C_l = T.alloc_fragment((32, 32), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, 16), num_stages=2):
                T.copy(A[by * 32, ko * 16], A_s)
                T.copy(B[ko * 16, bx * 32], B_s)
                T.gemm(A_s, B_s, C_l)
            for ko in T.Pipelined(T.ceildiv(K, 16), num_stages=2):
                T.copy(A[by * 32, ko * 16], A_s)
                T.copy(B[ko * 16, bx * 32], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * 32, bx * 32])

    return main


def _bounds_by_block(M=64, N=64, K=64):
    @T.prim_func
    def main(A: T.Tensor((M, K), "float32"), B: T.Tensor((K, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, 32), T.ceildiv(M, 32), threads=128) as (bx, by):
            A_s = T.alloc_shared((32, 16), "float32")
            B_s = T.alloc_shared((16, 32), "float32")
            C_l = T.alloc_fragment((32, 32), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(by + 1, num_stages=2):  # a triangular loop: each tile its own length
                T.copy(A[by * 32, ko * 16], A_s)
                T.copy(B[ko * 16, bx * 32], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * 32, bx * 32])

    return main


def _causal_attention():
    from tilecore_conformance.composite import flash_attention_forward

    return flash_attention_forward(128, 32, 2, 32, 32, "float16", True)  # loop = ceildiv((bx + 1) * bm, bn)


@pytest.mark.parametrize("kernel,cfg,why", [
    (lambda: gemm(64, 96, 40, n_dyn=True), {}, "the grid is not static"),
    (_two_loops, {}, "2 pipelined loops"),
    (_bounds_by_block, {}, "the loop's bounds use the block index by, which differs from tile to tile"),
    (lambda: gemm(64, 96, 40, clear=False), {}, "not set before it"),
    (lambda: _causal_attention(), {}, "the loop's bounds use the scalar loop, which differs from tile to tile"),
])
def test_kernels_outside_the_form_keep_their_launch_with_a_note(kernel, cfg, why):
    target = "cpu" if "not set" not in why else "cuda:sm_80"
    try:
        k = tilecore.compile(kernel(), target=target, pass_configs={**NOCACHE, "tilecore.persistent": 2, **cfg,
                                                                     "tilecore.cuda.register_programs": False})
    except tilecore.errors.CompileError as exc:  # no CUDA compiler here: the notes are in the lowered IR
        pytest.skip(str(exc).splitlines()[0])
    assert why in _note(k) and not _note(k).startswith("persistent:"), _note(k)


# -- CUDA sm_80 on the host emulator: cp.async stages carried across tiles ------------------------------------

tilecore_cuda = pytest.importorskip("tilecore_cuda")
from test_cuda_backend import needs_toolchain  # noqa: E402

GENERAL = {**NOCACHE, "tilecore.cuda.register_programs": False}
#: (M, N, K, tile (bm, bn, bk, threads, stages), blocks)
EMU_CASES = {
    "2-stage": (256, 256, 256, (128, 128, 32, 128, 2), 3),           # 4 tiles on 3 blocks
    "3-stage-ragged": (200, 136, 200, (64, 64, 64, 128, 3), 2),     # 12 tiles, ragged edges, 4 k-steps
    "k-shorter-than-stages": (192, 128, 32, (64, 64, 16, 128, 4), 4),  # 2 k-steps < 3 stages ahead: 2 tiles ahead
    # T.use_swizzle(2) over 5 rows of tiles: a ragged last panel, its guards on the ragged rows (D56)
    "ragged-panel": (300, 136, 128, (64, 64, 64, 128, 3, 2), 3),
}


def _emu_gemm(M, N, K, cfg):
    bm, bn, bk, threads, stages = cfg[:5]
    return gemm(M, N, K, bm, bn, bk, stages, threads, dtype="float16", swizzle=cfg[5] if len(cfg) > 5 else None)


def _emulate(k, a, b):
    from cuda_host_emulator import run_on_host

    return run_on_host(k, [a, b, np.full((a.shape[0], b.shape[1]), np.nan, np.float16)])[2]


@needs_toolchain
@pytest.mark.parametrize("case", sorted(EMU_CASES))
def test_sm80_carried_cp_async_stages_on_the_host_emulator(case):
    M, N, K, cfg, blocks = EMU_CASES[case]
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((M, K)) / 4).astype(np.float16)
    b = (rng.standard_normal((K, N)) / 4).astype(np.float16)
    on = tilecore.compile(_emu_gemm(M, N, K, cfg), target="cuda:sm_80",
                          pass_configs={**GENERAL, "tilecore.persistent": blocks})
    off = tilecore.compile(_emu_gemm(M, N, K, cfg), target="cuda:sm_80", pass_configs=GENERAL)
    note = on.meta["attrs"]["pipelines"][0]
    assert "carried across the persistent tile loop" in note and "async 16-byte copies" in note, note
    assert _note(on).startswith(f"persistent: {blocks} blocks")
    c_on, c_off = _emulate(on, a, b), _emulate(off, a, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c_on.astype(np.float64), ref, rtol=2e-2, atol=2e-2)
    assert np.array_equal(c_on, c_off)


@needs_toolchain
def test_mutation_next_tile_addressed_as_this_tile_is_caught(monkeypatch):
    """The next tile's first stages addressed with this tile's block indices (the carry's substitution broken):
    the emulated result must differ from float64; unmutated it matches (the test above)."""
    M, N, K, cfg, blocks = EMU_CASES["3-stage-ragged"]
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((M, K)) / 4).astype(np.float16)
    b = (rng.standard_normal((K, N)) / 4).astype(np.float16)
    orig = persistent_pass.TileWalk.at

    def broken(self, i_expr):
        return orig(self, tilecore.ir.as_expr(0))  # every stage addressed with the block's first tile

    monkeypatch.setattr(persistent_pass.TileWalk, "at", broken)
    k = tilecore.compile(_emu_gemm(M, N, K, cfg), target="cuda:sm_80",
                         pass_configs={**GENERAL, "tilecore.persistent": blocks})
    c = _emulate(k, a, b).astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert not np.allclose(c, ref, rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def fakemu(tmp_path_factory):
    from fake_matrix_backend import register
    from tilecore.plugin import reset_registry

    reset_registry()
    register(tmp_path_factory.mktemp("fakemu"))
    yield "fakemu"
    reset_registry()


@needs_toolchain
def test_the_made_up_matrix_unit_runs_a_persistent_gemm(fakemu):
    """The test backend (a 64-thread matrix unit nothing like CUDA's, tests/fake_matrix_backend.py) with the
    persistent loop and its cp.async stages carried across tiles, on the host emulator, against float64 and
    the plain launch bit for bit."""
    from fake_matrix_backend import SPELLING

    M, N, K = 100, 136, 72  # 4 x 5 = 20 tiles of 32 x 32 on 4 blocks, ragged on every edge
    fn = lambda: gemm(M, N, K, 32, 32, 16, 3, 64, dtype="float16")  # noqa: E731
    on = tilecore.compile(fn(), target=fakemu, pass_configs={**NOCACHE, "tilecore.persistent": 4})
    off = tilecore.compile(fn(), target=fakemu, pass_configs=NOCACHE)
    assert on.meta["attrs"]["fragment_layouts"]["C_l"].startswith(SPELLING)
    assert _note(on).startswith("persistent: 4 blocks over 20 tiles"), _note(on)
    assert "carried across the persistent tile loop" in on.meta["attrs"]["pipelines"][0]
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((M, K)) / 4).astype(np.float16)
    b = (rng.standard_normal((K, N)) / 4).astype(np.float16)
    c_on, c_off = _emulate(on, a, b), _emulate(off, a, b)
    np.testing.assert_allclose(c_on.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64),
                               rtol=2e-2, atol=2e-2)
    assert np.array_equal(c_on, c_off)


def _attention(seq, dim, heads, bm, bn):
    from tilecore_conformance.composite import flash_attention_forward

    return flash_attention_forward(seq, dim, heads, bm, bn, "float16", False)


def _attention_ref(q, k, v):
    s = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)


@needs_toolchain
def test_sm80_flash_attention_carries_its_late_v_copies_across_tiles():
    """FlashAttention's form (the conformance catalog's kernel): Q copied in the setup of every tile, K staged at
    the loop's top, V issued with the stage ahead and waited for where it stands (a second commit group)."""
    from cuda_host_emulator import run_on_host

    S, D, H = 160, 32, 2  # 5 x 2 = 10 tiles of 32 query rows on 3 blocks
    rng = np.random.default_rng(5)
    q, k, v = ((rng.standard_normal((H, S, D)) / 2).astype(np.float16) for _ in range(3))
    on = tilecore.compile(_attention(S, D, H, 32, 32), target="cuda:sm_80",
                          pass_configs={**GENERAL, "tilecore.persistent": 3})
    off = tilecore.compile(_attention(S, D, H, 32, 32), target="cuda:sm_80", pass_configs=GENERAL)
    note = on.meta["attrs"]["pipelines"][0]
    assert "V_s async 16-byte copies (issued with the stage ahead" in note and "carried across" in note, note
    run = lambda kern: run_on_host(kern, [q, k, v, np.full(q.shape, np.nan, np.float16)])[3]  # noqa: E731
    o_on, o_off = run(on), run(off)
    np.testing.assert_allclose(o_on.astype(np.float64), _attention_ref(q, k, v), atol=2e-3)
    assert np.array_equal(o_on, o_off)


@pytest.mark.parametrize("target", ["hip:gfx942", "hip:gfx90a"])
def test_hip_persistent_gemm_on_the_host_emulator(target):
    """HIP: gfx942's 4-byte LDS-direct copies (one run across the thread group) carried across tiles, gfx90a's tile
    loop without async copies; on the HIP host emulator against float64 and the plain launch bit for bit."""
    pytest.importorskip("tilecore_hip")
    from hip_host_emulator import compiler as host_compiler, run_on_host as run_hip

    if host_compiler() is None:
        pytest.skip("no clang++ for the host emulation")
    M, N, K = 100, 136, 72  # 20 ragged tiles of 32 x 32 on 4 blocks
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((M, K)) / 4).astype(np.float16)
    b = (rng.standard_normal((K, N)) / 4).astype(np.float16)
    fn = lambda: gemm(M, N, K, 32, 32, 16, 3, 64, dtype="float16")  # noqa: E731
    on = tilecore.compile(fn(), target=target, pass_configs={**NOCACHE, "tilecore.persistent": 4})
    off = tilecore.compile(fn(), target=target, pass_configs=NOCACHE)
    assert _note(on).startswith("persistent: 4 blocks over 20 tiles"), _note(on)
    if target == "hip:gfx942":
        assert "carried across the persistent tile loop" in on.meta["attrs"]["pipelines"][0]
    c_on, c_off = (run_hip(k, [a, b, np.full((M, N), np.nan, np.float16)])[2] for k in (on, off))
    np.testing.assert_allclose(c_on.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64),
                               rtol=2e-2, atol=2e-2)
    assert np.array_equal(c_on, c_off)


# -- sm_90a: bulk copies on transaction barriers, wgmma -------------------------------------------------------

def _hopper(M=1024, N=1024, K=512, blocks=True, **kw):
    return tilecore.compile(gemm(M, N, K, 128, 256, 64, 3, 256, dtype="float16"), target="cuda:sm_90a",
                            pass_configs={**GENERAL, "tilecore.matrix_unit_families": ["wgmma"],
                                          "tilecore.persistent": blocks, **kw})


@needs_toolchain
def test_sm90a_persistent_gemm_carries_bulk_copies_and_compiles_to_hgmma_and_tma():
    k = _hopper()  # 32 tiles; the profile's 132 SMs would take them in one wave: 7 blocks asked
    assert "fit in one wave" in _note(k)
    k = _hopper(blocks=7)
    note = k.meta["attrs"]["pipelines"][0]
    assert "bulk tile copies" in note and "carried across the persistent tile loop" in note, note
    code = k.source.code
    assert code.count("tc_mbar_init(tc_smem_addr") == 1  # the barriers initialised once, before the tile loop
    assert "for (long long tile_i = 0;" in code
    # the last iteration of every tile waits for its own gemm (the ptxas hazard of D29, per tile)
    assert "if ((ko == 7)) {\n" in code and "tc_wg_wait<0>()" in code
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "HGMMA" in sass and "UTMALDG" in sass and "SYNCS" in sass
    assert "STL" not in sass and "LDL" not in sass


@needs_toolchain
def test_sm90a_persistent_flash_attention_compiles_to_hgmma_and_tma():
    k = tilecore.compile(_attention(1024, 128, 8, 64, 64), target="cuda:sm_90a",
                         pass_configs={**GENERAL, "tilecore.persistent": 40})
    note = k.meta["attrs"]["pipelines"][0]
    assert "bulk tile copies" in note and "carried across" in note, note
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "HGMMA" in sass and "UTMALDG" in sass and "SYNCS" in sass
    assert "STL" not in sass and "LDL" not in sass


@needs_toolchain
def test_sm90a_resident_blocks_from_the_profile():
    k = _hopper(4096, 4096, 256)  # 512 tiles of 128x256: one block per SM (144 KiB of stages, 256 x 168 registers)
    assert _note(k).startswith("persistent: 132 blocks over 512 tiles (132 (limits.sm_count) x 1 block(s)"), _note(k)
    assert k.source.meta["grid"][0] in ("132", 132)


@needs_toolchain
def test_a_launch_that_assumed_more_resident_blocks_than_ptxas_allows_warns(monkeypatch):
    """The resident-block estimate counts register buffers + an allowance; where ptxas's real count fits fewer
    blocks per SM the blocks past them would start late: a PerformanceWarning names the blocks to pass. Mutation:
    the allowance made too small (the estimate too high); unmutated, no warning."""
    import warnings

    fn = lambda: gemm(4096, 4096, 4096, 128, 128, 32, 2, 128, dtype="float16")  # noqa: E731
    cfg = {**GENERAL, "tilecore.matrix_unit_families": ["wgmma"], "tilecore.persistent": True,
           "tilecore.bulk_store": False}  # the persistent loop alone (D51's default bulk store's tile takes 32 KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilecore.errors.PerformanceWarning)
        k = tilecore.compile(fn(), target="cuda:sm_90a", pass_configs=cfg)
    assert k.source.meta["persistent"] == {"blocks": 396, "tiles": 1024, "units": 132, "per_unit": 3}
    monkeypatch.setattr(persistent_pass, "REGISTER_ALLOWANCE", -64)
    with pytest.warns(tilecore.errors.PerformanceWarning,
                      match=r"assumed 7 blocks per multiprocessor, but at ptxas's \d+ registers per thread 3 fit: "
                            r"pass tilecore.persistent=396"):
        tilecore.compile(fn(), target="cuda:sm_90a", pass_configs=cfg)


@needs_toolchain
def test_warp_specialization_walks_the_tiles_too():
    """tests/test_general_gemm.py checks the schedule (D46); here: the launch is persistent and specialized."""
    k = _hopper(blocks=7, **{"tilecore.warp_specialize": True})
    assert _note(k).startswith("persistent: 7 blocks over 32 tiles"), _note(k)
    assert "warp-specialized" in k.meta["attrs"]["pipelines"][0]


@pytest.mark.parametrize("swizzle", [None, 3])
def test_the_default_leaves_kernels_without_a_bulk_store_as_written(swizzle):
    """The default (``"auto"``, D56) takes only kernels with the bulk-store epilogue and a panel: a CPU kernel keeps
    its launch and gets no note (the catalog's golden sources: byte-identical)."""
    k = tilecore.compile(gemm(150, 90, 50, swizzle=swizzle), target="cpu", pass_configs=NOCACHE)
    assert "persistent" not in k.meta["attrs"]


# -- on an sm_90 GPU -------------------------------------------------------------------------------------------

from test_cuda_hopper import hopper_gpu  # noqa: E402


@hopper_gpu
@pytest.mark.parametrize("shape,blocks", [((4096, 4096, 4096), True), ((1000, 1800, 1000), 5),
                                          ((4096, 4096, 512), 200), ((512, 512, 4096), 3)])
@pytest.mark.parametrize("copies", ["bulk", "cp.async"])
def test_device_persistent_matches_float64_and_the_plain_launch(shape, blocks, copies):
    import torch

    M, N, K = shape
    extra = {} if copies == "bulk" else {"tilecore.bulk_copy": False}
    fn = lambda: gemm(M, N, K, 128, 256, 64, 3, 256, dtype="float16")  # noqa: E731
    cfg = {**GENERAL, "tilecore.matrix_unit_families": ["wgmma"], **extra}
    on = tilecore.compile(fn(), target="cuda", pass_configs={**cfg, "tilecore.persistent": blocks})
    off = tilecore.compile(fn(), target="cuda", pass_configs=cfg)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g) / 8
    b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=g) / 8
    c_on = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    c_off = c_on.clone()
    on(a, b, c_on)
    off(a, b, c_off)
    torch.cuda.synchronize()
    assert torch.equal(c_on, c_off), _note(on)
    ref = a.double() @ b.double()
    assert float((c_on.double() - ref).abs().max()) < 2e-2


@pytest.mark.parametrize("value,ok", [("True", True), ("3", True), ("off", True), ("auto", True), (-2, False),
                                      ("many", False)])
def test_the_option_accepts_command_line_spellings_and_names_a_bad_value(value, ok):
    run = lambda: tilecore.compile(gemm(64, 96, 40), target="cpu",  # noqa: E731
                                   pass_configs={**NOCACHE, "tilecore.persistent": value})
    if ok:
        run()
    else:
        with pytest.raises(tilecore.errors.CompileError, match="tilecore.persistent=.*expected True, False, 'auto' "
                                                               "or a positive number of blocks"):
            run()


@hopper_gpu
@pytest.mark.parametrize("copies", ["bulk", "cp.async"])
def test_device_persistent_flash_attention_matches_float64_and_the_plain_launch(copies):
    import torch

    S, D, H = 1024, 128, 8  # 16 x 8 = 128 tiles of 64 query rows on 40 blocks
    extra = {} if copies == "bulk" else {"tilecore.bulk_copy": False}
    on = tilecore.compile(_attention(S, D, H, 64, 64), target="cuda",
                          pass_configs={**GENERAL, **extra, "tilecore.persistent": 40})
    off = tilecore.compile(_attention(S, D, H, 64, 64), target="cuda", pass_configs={**GENERAL, **extra})
    assert "carried across" in on.meta["attrs"]["pipelines"][0]
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(H, S, D, device="cuda", dtype=torch.float16, generator=g) / 2 for _ in range(3))
    o_on = torch.full_like(q, float("nan"))
    o_off = o_on.clone()
    on(q, k, v, o_on)
    off(q, k, v, o_off)
    torch.cuda.synchronize()
    assert torch.equal(o_on, o_off), _note(on)
    ref = _attention_ref(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy())
    assert float(np.abs(o_on.cpu().numpy().astype(np.float64) - ref).max()) < 1e-2


@pytest.mark.parametrize("rows", ["runtime", "bogus"])
def test_the_panel_rows_control_divides_at_run_time_and_a_bad_value_is_named(rows):
    """``tilecore.persistent_panel_rows="runtime"`` (the control D56 measures against) walks the same tiles with
    D36's run-time divisor, computing the same numbers; another value is named in the error."""
    cfg = {**NOCACHE, "tilecore.persistent": 4, "tilecore.persistent_panel_rows": rows}
    if rows == "bogus":
        with pytest.raises(tilecore.errors.CompileError, match="tilecore.persistent_panel_rows='bogus': expected"):
            tilecore.compile(gemm(96, 160, 64, swizzle=3), target="cpu", pass_configs=cfg)
        return
    from tilecore.compiler import lower

    # 5 rows of tiles in panels of 3: a ragged last panel
    binds = {rows: [line.strip() for line in tilecore.ir.printer.func_str(lower(
        gemm(160, 96, 64, swizzle=3), "cpu", {**cfg, "tilecore.persistent_panel_rows": rows})[2]).split("\n")
        if line.strip().startswith("bx: int32")] for rows in ("runtime", "constant")}
    assert binds["runtime"] == ["bx: int32 = ((tile % 9) // T.min((((tile // 9) * -3) + 5), 3))"], binds
    assert binds["constant"] == ["bx: int32 = T.if_then_else((tile < 9), ((tile % 9) // 3), ((tile % 9) // 2))"], binds
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((160, 64), dtype=np.float32), rng.standard_normal((64, 96), dtype=np.float32)
    outs = []
    for extra in ({"tilecore.persistent_panel_rows": "runtime"}, {}):
        c = np.zeros((160, 96), np.float32)
        tilecore.compile(gemm(160, 96, 64, swizzle=3), target="cpu",
                         pass_configs={**NOCACHE, "tilecore.persistent": 4, **extra})(a, b, c)
        outs.append(c)
    assert np.array_equal(outs[0], outs[1])
    assert np.allclose(outs[1], a.astype(np.float64) @ b.astype(np.float64), atol=1e-3)
