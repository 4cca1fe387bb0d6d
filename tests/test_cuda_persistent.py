"""A persistent grid for the Hopper GEMM pipeline (``tilecore.cuda.persistent``, docs/decisions.md D34), through
the public API: the README GEMM, unchanged, compiled with the pass config on.

Compile-only wherever a CUDA compiler exists (CI): the launch grid in the kernel's metadata (min(tiles, SMs of
the profile)), the tile function (the kernel's block indices, ``T.use_swizzle`` included, from the tile's
linear index), which kernels stay one block per tile and why (split-K, an epilogue on the fragment, the config
off: the source is the default's byte for byte), the config's errors, and the SASS: HGMMA / QGMMA, UTMALDG, no
spills, one full WGMMA wait per tile and no read of the accumulators between a tile's last HGMMA and that wait
(D29's ptxas hazard). Both launch paths read the grid from the metadata (a recording driver on the CPU). The
producer/consumer protocol across tiles runs on the host (tests/persistent_host.cpp), as it ships and mutated.
On an sm_90 GPU the kernels run against float64 references, three runs bit-identical, on == off bit for bit.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
from tilecore.errors import CompileError

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, _notes, dynamic_m_gemm, gemm, hopper_gpu  # noqa: E402

ON = {"tilecore.cuda.persistent": True}
BIG = dict(M=4096, N=4096, K=512, bm=128, bn=256, threads=256, stages=3)  # 512 tiles: 3.9 per SM
DIRECT = {"tilecore.cuda.tma_store": False}  # the epilogue's direct stores (D34), not through TMA (D38, the default)
PRELUDE = Path(tilecore_cuda.__file__).parent / "prelude"


@pytest.fixture(autouse=True)
def _the_plugins_hopper_pipeline(monkeypatch):
    """These tests test the plugin's Hopper pipeline on plain GEMMs, which D58 routes to the core's general path by
    default: pinned to the pipeline (``tilecore.cuda.general_plain_gemm=False``, on top of any TILECORE_PASS_CONFIGS)."""
    import json
    import os

    env = json.loads(os.environ.get("TILECORE_PASS_CONFIGS", "") or "{}")
    monkeypatch.setenv("TILECORE_PASS_CONFIGS", json.dumps({**env, "tilecore.cuda.general_plain_gemm": False}))


def _compile(shape: dict, target=HOPPER, persistent=True, **kw):
    cfg = dict(kw.pop("pass_configs", {}))
    if persistent is not None:
        cfg["tilecore.cuda.persistent"] = persistent
    s = dict(shape)
    fn = gemm(s.pop("M"), s.pop("N"), s.pop("K"), **s, **kw)
    return tilecore.compile(fn, target=target, pass_configs={**NOCACHE, **cfg})


def _body(k) -> str:
    src = k.get_kernel_source()
    return src[src.index('extern "C" __global__'):]


# -- the decision and the launch -------------------------------------------------------------------------

@needs_toolchain
def test_persistent_gemm_launches_one_block_per_sm_each_looping_over_tiles():
    k = _compile(BIG)
    assert ("128x256x64 float16, 3 stages, 2 consumer warpgroup(s) + 1 producer, epilogue to global memory; "
            "persistent: at most 132 blocks (132 SMs x 1)") in _notes(k)
    assert k.source.meta["grid"] == ["132", "1", "1"]
    body = _body(k)
    # the block indices exist only in the tile function, from the tile's linear index (x fastest, as the grid)
    assert "blockIdx" not in body
    assert "auto tc_tile_of = [&](long long tc_t) {" in body
    assert "const long long tc_px = tc_t % (16), tc_py = tc_t / (16);" in body
    assert "const int bx = (int)tc_px;" in body and "const int by = (int)tc_py;" in body
    # EPI 11: the rows and columns proven, C through shared memory and TMA stores (the default since D38)
    assert re.search(r"tc_wgmma_persistent<384, 128, 256, 64, 3, 2, 1, false, 0, 64, 64, 0, 11, 16, false, "
                     r"tc_wgmma_f16_n256_t1>\(\(pipe_A_s \+ 0\), C, \(long long\)\(512\), \(long long\)\(4096\), "
                     r"tc_tile_of, &tc_tmap0, &tc_tmap1, &tc_tmap2\);", body)
    # the tile's arguments: C's offset, A's and B's coordinates, the k tiles, the valid rows and columns
    assert ("return tc_gemm_tile{(long long)(((bx * 256) + (by * 524288))), (long long)((by * 128)), (long long)(0), "
            "(long long)(0), (long long)((bx * 256)), (long long)(8), (long long)(((by * (-128)) + 4096)), "
            "(long long)(((bx * (-256)) + 4096))};") in body
    src = k.get_kernel_source()
    assert "tc_wgmma_persistent(" in src and "struct tc_gemm_tile" in src  # tc_persistent.cuh, only here


@needs_toolchain
def test_on_is_the_default_and_off_is_one_block_per_tile():
    """D43: the persistent grid is the default (measured +2.4% at 4096^3, +0.5-0.8% at 8192^3 on the H100);
    ``tilecore.cuda.persistent=False`` gives back the per-tile kernel."""
    default, on, off = (_compile(BIG, persistent=p) for p in (None, True, False))
    assert default.get_kernel_source() == on.get_kernel_source()
    assert default.source.meta["grid"] == ["132", "1", "1"] and "persistent: at most 132 blocks" in _notes(default)
    assert off.source.meta["grid"] == ["16", "32", "1"] and "persistent" not in _notes(off)
    assert "tc_gemm_tile" not in off.get_kernel_source() and "tc_wgmma_pipeline<" in off.get_kernel_source()


@needs_toolchain
def test_fewer_tiles_than_sms_launch_one_block_per_tile():
    k = _compile(dict(BIG, M=1024, N=1024, K=1024))  # 32 tiles, 16 k tiles: not split over K either
    assert "persistent: at most 132 blocks" in _notes(k) and "split-K" not in _notes(k)
    assert k.source.meta["grid"] == ["32", "1", "1"]
    k = _compile(dict(BIG, M=1000, N=4000))  # ragged: 8 x 16 = 128 tiles
    assert k.source.meta["grid"] == ["128", "1", "1"]


@needs_toolchain
def test_a_dynamic_grid_takes_the_smaller_of_tiles_and_sms_at_launch():
    from tilecore.runtime.launch import shape_fn

    k = tilecore.compile(dynamic_m_gemm(N=1024, K=512), target=HOPPER, pass_configs={**NOCACHE, **ON})
    assert "persistent" in _notes(k)
    grid = shape_fn(k.source.meta["grid"])
    assert grid([128]) == (4, 1, 1) and grid([8192]) == (132, 1, 1) and grid([129]) == (8, 1, 1)
    assert grid([4096]) == (128, 1, 1)
    body = _body(k)
    assert "const long long tc_px = tc_t % (4), tc_py = tc_t / (4);" in body
    assert "(long long)((tc_floordiv((m + 127), 128) * 4)), (long long)(1024), tc_tile_of" in body


@needs_toolchain
def test_swizzled_tiles_map_as_the_grid_maps_its_blocks():
    k = _compile(BIG, panel=4)
    body = _body(k)
    lam = body[body.index("auto tc_tile_of"):body.index("};")]
    for line in ("const long long tc_lin = (long long)tc_py * tc_gf + tc_px;", "tc_pn = 4LL * tc_gf",
                 "const int bx = (int)tc_bx;", "const int by = (int)tc_by;"):
        assert line in lam, line


@needs_toolchain
@pytest.mark.parametrize("shape,kw,why", [
    (dict(M=128, N=4096, K=4096, bm=128, bn=128, threads=256, stages=3), {},
     "split-K 3 (32 tiles on 132 SMs; 4 splits in clusters would not all fit at once on cuda/sm_90a (30 of 4), 3 do "
     "(39)): 96 blocks, 21-22 k tiles each, each tile's blocks one cluster, float32 slices summed in split order "
     "through its shared memory (DSMEM); not persistent: a GEMM split over K keeps one block per (tile, split)"),
    (dict(BIG, bn=128), {"epilogue": "relu"}, "not persistent: the accumulator is used after the loop"),
])
def test_kernels_that_keep_a_block_per_tile_say_why(shape, kw, why):
    k = _compile(shape, **kw)
    assert why in _notes(k)
    assert "tc_wgmma_persistent" not in _body(k) and k.source.meta["grid"][0] != "132"


@needs_toolchain
@pytest.mark.parametrize("value", ["yes", 1])
def test_the_config_must_be_a_boolean_and_the_error_names_the_users_loop(value):
    with pytest.raises(CompileError, match=r'tilecore.cuda.persistent must be True, False or "pingpong", got') as e:
        _compile(BIG, persistent=value)
    assert "test_cuda_hopper.py:" in str(e.value)


@needs_toolchain
def test_pingpong_gives_each_consumer_warpgroup_whole_tiles():
    # the direct stores (DIRECT): the pipeline buffer as D34 laid it out
    k = _compile(dict(BIG, bn=128, stages=4), persistent="pingpong", panel=8, pass_configs=DIRECT)
    assert ("persistent: at most 132 blocks (132 SMs x 1), each looping over its tiles, the next tile's loads under "
            "this tile's epilogue; ping-pong: the two consumer warpgroups take whole tiles in turn") in _notes(k)
    # MR = 2: one warpgroup holds the whole 128-row tile; PINGPONG before the WGMMA struct
    assert "tc_wgmma_persistent<384, 128, 128, 64, 4, 2, 2, false, 0, 64, 64, 0, 7, 16, true, tc_wgmma_f16_n128_t1>" \
        in _body(k)
    # the pipeline buffer has 16 more bytes: the two warpgroups' `done` barriers
    plain = _compile(dict(BIG, bn=128, stages=4), panel=8, pass_configs=DIRECT)
    assert k.source.meta["shared_bytes"] == plain.source.meta["shared_bytes"] + 16
    assert "tc_wgmma_persistent<384, 128, 128, 64, 4, 2, 1, false, 0, 64, 64, 0, 7, 16, false," in _body(plain)


@needs_toolchain
@pytest.mark.parametrize("shape,why", [
    (BIG, "not ping-pong: a 128x256 tile is 256 accumulators a thread of one warpgroup, more than 128 (use "
          "block_N = 128)"),
    (dict(BIG, bn=128, threads=128), "not ping-pong: it needs two consumer warpgroups (threads=256), not 1"),
])
def test_pingpong_refused_where_it_cannot_run_keeps_the_persistent_grid(shape, why):
    k = _compile(shape, persistent="pingpong")
    assert why in _notes(k) and "persistent: at most 132 blocks" in _notes(k)
    assert ", false, tc_wgmma_f16_n" in _body(k)


# -- the prelude: the epilogue and the loads are tc_wgmma_pipeline's -----------------------------------------

def _norm(text: str) -> list:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def test_persistent_main_loop_body_and_epilogue_are_the_pipelines_one_copy():
    """One copy (D50): the persistent kernel's k step issues its WGMMAs through tc_hopper.cuh's tc_wgmma_ktile and
    its direct stores are tc_wgmma_store_acc, as tc_wgmma_pipeline's; the descriptor arithmetic and the epilogue's
    layout exist once in the prelude; the producer's loads are the pipeline's, line for line."""
    hopper, pers = (PRELUDE / "tc_hopper.cuh").read_text(), (PRELUDE / "tc_persistent.cuh").read_text()
    for name in ("tc_wgmma_ktile<BM, BN, BK, MR, B_KMAJOR, KSTEP, MMA>(acc, sa, sb, c);",
                 "tc_wgmma_store_acc<BN, MR, TO_GLOBAL, EPI>("):
        assert name in hopper and name in pers, name
    for once in ("tc_wgmma_desc(sb + (kb / 128) * BN * 128 + kb % 128, 16, 1024);",
                 "tc_wgmma_desc(sb + kk * KSTEP * 128, BK * 128, 1024);",
                 "(c * MR + i) * 64 * 128 + kb % 128, 16, 1024);", "/* accumulator layout of m64nN",
                 "MMA::run(acc[i], da, db);", "tc_wgmma_commit();\n"):
        assert hopper.count(once) == 1 and once not in pers, once
    for line in ("for (int a = 0; a < BK / ATOM; ++a) tc_tma_load_2d(sa + a * BM * 128, tma, full, ac + a * ATOM, ar);",
                 "for (int a = 0; a < B_ATOMS; ++a) tc_tma_load_2d(sb + a * B_ROWS * 128, tmb, full, bc + a * ATOM, br);"):
        assert line in _norm(hopper) and line in _norm(pers), line


# -- SASS ------------------------------------------------------------------------------------------------------

_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")


def tile_ends(sass: str) -> list:
    """For each full WGMMA wait (WARPGROUP.DEPBAR.LE gsb0, 0x0): the instructions between the last HGMMA /
    QGMMA before it and it, and that MMA's accumulator registers (its first register and count)."""
    ins = [m.group(2).strip() for m in _INS.finditer(sass)]
    out = []
    for i, t in enumerate(ins):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x0" not in t:
            continue
        j = i - 1
        while j >= 0 and not re.search(r"[HQ]GMMA\.", ins[j]):
            j -= 1
        m = re.search(r"[HQ]GMMA\.64x(\d+)x\d+\S* R(\d+),", ins[j])
        out.append((ins[j + 1:i], int(m.group(2)), int(m.group(1)) // 2))
    return out


def reads_accumulators(window: list, first: int, count: int) -> list:
    """The instructions of ``window`` that name a register of R<first> .. R<first + count - 1>."""
    hit = []
    for t in window:
        if any(first <= int(r) < first + count for r in re.findall(r"\bR(\d+)\b", t)):
            hit.append(t)
    return hit


def _sass(k) -> str:
    return tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)


@needs_toolchain
@pytest.mark.parametrize("shape,kw,mma", [
    (BIG, {}, "HGMMA.64x256x16.F32"),
    (dict(BIG, bn=128, stages=4), {"dtype": "bfloat16", "out": "float32", "tb": True}, "HGMMA.64x128x16.F32.BF16"),
    (dict(BIG, bk=128), {"dtype": "float8_e4m3", "tb": True}, "QGMMA.64x256x32.F32.E4M3.E4M3"),
    (dict(BIG, M=1000, N=4000, bn=128, threads=128), {"panel": 4}, "HGMMA.64x128x16.F32"),  # MR = 2, ragged
    # ping-pong with the direct stores (D38's TMA stores on ping-pong: test_cuda_tma_store.py's SASS test)
    (dict(BIG, bn=128, stages=4), {"panel": 8, "persistent": "pingpong", "pass_configs": DIRECT}, "HGMMA.64x128x16.F32"),
    (dict(BIG, M=1000, N=4000, bn=128, stages=4), {"persistent": "pingpong", "dtype": "bfloat16", "tb": True,
                                                   "pass_configs": DIRECT}, "HGMMA.64x128x16.F32.BF16"),
])
def test_sass_has_the_pipeline_and_a_full_wait_per_tile_before_the_epilogue(shape, kw, mma):
    k = _compile(shape, **kw)
    assert "persistent" in _notes(k)
    sass = _sass(k)
    for op in (mma, "UTMALDG.2D", "SYNCS.PHASECHK", "SYNCS.ARRIVE"):
        assert op in sass, op
    assert "STL" not in sass and "LDL" not in sass  # no spills
    assert not k.source.meta.get("performance_notes")  # ptxas -v: no spill, no wgmma serialization
    # (the SASS check above is the spill test; one device run under pytest-xdist lacked the report's spill line)
    assert k.source.meta["ptxas"].get("spill_stores", 0) == 0 and k.source.meta["ptxas"].get("registers", 0) <= 168
    ends = tile_ends(sass)
    # the main loop keeps one group in flight: the only full waits are the tiles' last k steps
    assert 1 <= len(ends) <= 2, len(ends)
    for window, first, count in ends:
        assert not reads_accumulators(window, first, count), reads_accumulators(window, first, count)
        assert not any(re.match(r"(F2FP|STG|F2F|FADD|FMUL|FMNMX)", t) for t in window)
    if shape["threads"] == 256:  # the producer gives its registers away: its code after that stays under 56
        assert "USETMAXREG.DEALLOC.CTAPOOL 0x38" in sass and producer_registers(sass) < 56
        assert "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe0" in sass  # 56 x 128 + 224 x 256 = 168 x 384


def producer_registers(sass: str) -> int:
    """The highest register the producer names after its setmaxnreg.dec (USETMAXREG.DEALLOC): its code from there
    to its EXIT (the loop with its tile function), and the out-of-line wait loops after the kernel's code that
    branch back into it. (Out-of-line waits that return elsewhere are the consumers': with one copy of the main
    loop, D50, ptxas places a consumer's wait after the producer's code.)"""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in _INS.finditer(sass)]
    first = next(i for i, (_, t) in enumerate(ins) if "USETMAXREG.DEALLOC" in t)
    end = next(i for i in range(first, len(ins)) if re.fullmatch(r"EXIT", ins[i][1]))
    lo, hi = ins[first][0], ins[end][0]
    mine = [t for _, t in ins[first:end + 1]]
    block: list = []
    for _, t in ins[end + 1:]:  # out-of-line blocks, each closed by an unconditional branch back
        block.append(t)
        m = re.fullmatch(r"BRA (0x[0-9a-f]+)", t)
        if m:
            if lo <= int(m.group(1), 16) <= hi:
                mine += block
            block = []
    return max((int(r) for t in mine for r in re.findall(r"\bR(\d+)\b", t)), default=0)


def test_producer_register_check_reads_the_producers_code_and_its_out_of_line_waits():
    """producer_registers on made-up SASS: a register the producer names after its dealloc, in its code or in an
    out-of-line wait that returns into it, counts; a consumer's out-of-line wait after the producer's code does
    not (D50 puts one there); the unmutated text gives the producer's own highest register."""
    def sass(producer_extra="", own_wait="R9", other_wait="R158"):
        lines = ["/*0000*/ HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ ;", "/*0010*/ @!P0 BRA 0x0100 ;",
                 "/*0020*/ USETMAXREG.DEALLOC.CTAPOOL 0x38 ;", "/*0030*/ IADD3 R3, R4, 0x1, RZ ;",
                 f"/*0040*/ @!P0 BRA 0x0090 ;{producer_extra}", "/*0050*/ EXIT ;",
                 f"/*0060*/ SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [{other_wait}+URZ], R17 ;", "/*0070*/ @!P0 BRA 0x0060 ;",
                 "/*0080*/ BRA 0x0010 ;",
                 f"/*0090*/ SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [{own_wait}+URZ], R2 ;", "/*00a0*/ @!P0 BRA 0x0090 ;",
                 "/*00b0*/ BRA 0x0040 ;", "/*00c0*/ BRA 0x00c0 ;"]
        return "\n".join(lines)

    assert producer_registers(sass()) == 9
    assert producer_registers(sass(own_wait="R77")) == 77  # the producer's own wait loop
    assert producer_registers(sass(producer_extra="\n/*0048*/ MOV R200, R3 ;")) == 200
    assert producer_registers(sass(other_wait="R250")) == 9  # a consumer's wait: not the producer's


@needs_toolchain
def test_hazard_check_catches_an_epilogue_above_the_wait():
    """The check on SASS text: an accumulator read (F2FP of R24) moved between the last HGMMA and the wait is
    found; the kernel's own SASS passes (above)."""
    k = _compile(BIG)
    sass = _sass(k)
    m = re.search(r"(/\*[0-9a-f]{4,}\*/\s+)(WARPGROUP\.DEPBAR\.LE gsb0, 0x0 ;)", sass)
    mutated = sass[:m.start()] + "/*ffff*/ F2FP.F16.F32.PACK_AB R7, R25, R24 ;\n" + sass[m.start():]
    window, first, count = tile_ends(mutated)[0]
    assert reads_accumulators(window, first, count) == ["F2FP.F16.F32.PACK_AB R7, R25, R24"]
    window, first, count = tile_ends(sass)[0]
    assert not reads_accumulators(window, first, count)


# -- the runtime: the grid of the metadata on both launch paths (a recording driver on the CPU) ------------------

def test_both_launch_paths_launch_the_persistent_grid(monkeypatch):
    torch = pytest.importorskip("torch")
    from test_c_launcher import on_cpu
    from test_cuda_backend import HAS_TOOLCHAIN

    if not HAS_TOOLCHAIN:
        pytest.skip("no CUDA compiler here")
    from tilecore_cuda import runtime as cuda_runtime

    monkeypatch.setattr(cuda_runtime, "device_properties", lambda index=0: {})  # no device: the profile's 132 SMs
    kernel = tilecore.compile(dynamic_m_gemm(N=1024, K=512), target=HOPPER, pass_configs={**NOCACHE, **ON})
    for c_launcher in (True, False):
        k, prog, driver = on_cpu(kernel, c_launcher, monkeypatch)
        for m, grid in ((256, (8, 1, 1)), (8192, (132, 1, 1)), (8192, (132, 1, 1))):
            a, b = torch.randn(m, 512).half(), torch.randn(512, 1024).half()
            k(a, b, torch.empty(m, 1024).half())
            assert driver.records[-1]["grid"] == grid
        if c_launcher:
            assert k._native is not None


@pytest.mark.parametrize("sms,static_grid,dynamic_grids", [(114, (114, 1, 1), ((8, 1, 1), (114, 1, 1))),
                                                            (78, (78, 1, 1), ((8, 1, 1), (78, 1, 1)))])
def test_the_runtime_caps_the_grid_at_the_devices_own_sms(monkeypatch, sms, static_grid, dynamic_grids):
    """An H100 PCIe (114 SMs) or an H20 (78) runs the sm_90a profile's kernels: 132 blocks there would leave 18
    (54) of them waiting for a whole block's tiles. The runtime takes min(tiles, the device's SMs x 1)."""
    torch = pytest.importorskip("torch")
    from test_c_launcher import on_cpu
    from test_cuda_backend import HAS_TOOLCHAIN
    from tilecore_cuda import runtime as cuda_runtime

    if not HAS_TOOLCHAIN:
        pytest.skip("no CUDA compiler here")
    monkeypatch.setattr(cuda_runtime, "device_properties", lambda index=0: {"sm_count": sms})
    static = _compile(BIG)
    assert static.source.meta["hopper_persistent"] == {"tiles": "512", "blocks_per_sm": 1}
    assert "persistent" not in static.source.meta  # the core's tilecore.persistent key (D36) is not ours
    dynamic = tilecore.compile(dynamic_m_gemm(N=1024, K=512), target=HOPPER, pass_configs={**NOCACHE, **ON})
    for c_launcher in (True, False):
        k, prog, driver = on_cpu(static, c_launcher, monkeypatch)
        a, b = torch.randn(4096, 512).half(), torch.randn(512, 4096).half()
        k(a, b, torch.empty(4096, 4096).half())
        assert driver.records[-1]["grid"] == static_grid and prog._grid == static_grid
        k, prog, driver = on_cpu(dynamic, c_launcher, monkeypatch)
        for m, grid in zip((256, 8192), dynamic_grids):
            k(torch.randn(m, 512).half(), torch.randn(512, 1024).half(), torch.empty(m, 1024).half())
            assert driver.records[-1]["grid"] == grid
    # a kernel that is not persistent keeps its grid whatever the device
    k, prog, driver = on_cpu(_compile(BIG, persistent=False), False, monkeypatch)
    k(torch.randn(4096, 512).half(), torch.randn(512, 4096).half(), torch.empty(4096, 4096).half())
    assert driver.records[-1]["grid"] == (16, 32, 1)


# -- on an H100 / H200 --------------------------------------------------------------------------------------

def _run(k, a, b, M, N, out, torch):
    c = torch.full((M, N), float("nan"), device="cuda", dtype=getattr(torch, out))
    k(a, b, c)
    torch.cuda.synchronize()
    return c


def _runs_match_float64(k, a, b, ref, M, N, K, out, torch):
    """Three runs of ``k``: the same bits each time, every element written, within the float64 reference's
    tolerance; returns the first run's C."""
    runs = [_run(k, a, b, M, N, out, torch) for _ in range(3)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])  # the same bits every run
    got = runs[0].double()
    assert torch.isfinite(got).all()  # every element written (NaN-filled before)
    tol = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 8e-2}[out] * np.sqrt(K)
    assert torch.allclose(got, ref, atol=tol, rtol=2e-2), (got - ref).abs().max().item()
    return runs[0]


@hopper_gpu
@pytest.mark.parametrize("shape,kw", [
    (BIG, {}),                                                                  # 512 tiles on 132 blocks
    (dict(BIG, M=1024, N=1024, K=1024), {}),                                    # 32 tiles: fewer than SMs
    (dict(BIG, M=4096 + 128, N=4096), {}),                                      # 528 tiles: not a multiple of 132
    (dict(BIG, M=1000, N=3000, K=1000), {"out": "float32"}),                    # ragged M, N and K
    (dict(BIG, M=1000, N=3000, K=1000, bn=128, threads=128), {"dtype": "bfloat16", "out": "bfloat16"}),  # MR 2
    (BIG, {"dtype": "bfloat16", "panel": 4}),                                   # use_swizzle
    (dict(BIG, M=2000, N=3000, bn=128), {"tb": True, "panel": 3}),              # B k-major, swizzled, ragged
    (dict(BIG, bk=128, K=1024), {"dtype": "float8_e4m3", "tb": True, "out": "float16"}),  # QGMMA
    # ping-pong: each consumer warpgroup whole 128x128 tiles in turn
    (dict(BIG, bn=128, stages=4), {"persistent": "pingpong", "panel": 8}),               # 1024 tiles
    (dict(BIG, M=1000, N=3000, K=1000, bn=128, stages=4), {"persistent": "pingpong", "dtype": "bfloat16",
                                                           "out": "bfloat16"}),  # ragged, 192 tiles: 1-2 a block
    (dict(BIG, M=2000, N=3000, bn=128, stages=4), {"persistent": "pingpong", "tb": True, "panel": 3}),
    (dict(BIG, M=1024, N=1024, K=1024, bn=128), {"persistent": "pingpong"}),          # 64 tiles: one a block
])
def test_device_persistent_gemm_matches_float64_and_the_per_tile_grid_bit_for_bit(shape, kw):
    torch = pytest.importorskip("torch")
    M, N, K = shape["M"], shape["N"], shape["K"]
    dtype, out, tb = kw.get("dtype", "float16"), kw.get("out", "float16"), kw.get("tb", False)
    k = _compile(shape, target="cuda", **kw)
    assert "persistent: at most" in _notes(k)
    if kw.get("persistent") == "pingpong":
        assert "; ping-pong:" in _notes(k)
    kw = {x: v for x, v in kw.items() if x != "persistent"}
    g = torch.Generator().manual_seed(M + N + K)
    a32, b32 = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    if dtype == "float8_e4m3":
        a, bt = a32.cuda().to(torch.float8_e4m3fn), b32.t().contiguous().cuda().to(torch.float8_e4m3fn)
        ref = a.double() @ bt.double().t()
        b = bt
    else:
        a, b = a32.cuda().to(getattr(torch, dtype)), b32.cuda().to(getattr(torch, dtype))
        ref = a.double() @ b.double()
        if tb:
            b = b.t().contiguous()
    first = _runs_match_float64(k, a, b, ref, M, N, K, out, torch)
    # the same kernel on one block per tile: the same bits (the same sums in the same order)
    off = _compile(shape, target="cuda", persistent=False, **kw)
    assert "persistent" not in _notes(off)
    assert torch.equal(_run(off, a, b, M, N, out, torch), first)


# -- the protocol across tiles on the host: tc_persistent.cuh as it ships, and mutated -------------------------

HARNESS = Path(__file__).with_name("persistent_host.cpp")
HEADER = PRELUDE / "tc_persistent.cuh"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here")

#: one way each to break the protocol (text replacements in the header: old, new, how many times old occurs); the
#: harness must catch every one (the unmutated header passes)
MUTANTS = {
    "the producer's k steps restart per tile": [
        ("ke = (int)g.k_tiles;\n#pragma unroll 1 /* one copy of the loads", "ke = (int)g.k_tiles;\n        it = 0;\n#pragma unroll 1 /*", 1)],
    "the consumers' k steps restart per tile": [
        ("const int k_tiles = ke - kb;", "const int k_tiles = ke - kb;\n      it = 0;", 1)],
    "the accumulators are zeroed once, not per tile": [
        ("    unsigned it = 0;  /* as the producer's */\n",
         "    unsigned it = 0;  /* as the producer's */\n    float acc_keep[MR][BN / 2] = {};\n", 1),
        ("float acc[MR][BN / 2];\n#pragma unroll\n      for (int i = 0; i < MR; ++i) {\n#pragma unroll\n"
         "        for (int j = 0; j < BN / 2; ++j) acc[i][j] = 0.0f;\n      }", "auto& acc = acc_keep;", 1)],
    "the tile's last group left in flight before the epilogue": [
        ("      tc_wgmma_wait<0>();\n      if (k_tiles > 0)", "      tc_wgmma_wait<1>();\n      if (k_tiles > 0)", 1)],
    "the tile's last stage never released": [
        ("      if (k_tiles > 0) release((it - 1) % STAGES);\n", "", 1)],
    "a stage released before its group completed": [
        ("        if (kt > 0) release((it - 1) % STAGES);\n      }", "        release(it % STAGES);\n      }", 1),
        ("      if (k_tiles > 0) release((it - 1) % STAGES);\n", "", 1)],
    "the producer does not wait for the release": [
        ("          if (it >= STAGES) tc_mbar_wait(bars + 8 * (STAGES + s), ((it / STAGES) + 1) & 1);\n", "", 1)],
    "the consumers wait for the wrong phase": [
        ("tc_mbar_wait(bars + 8 * s, (it / STAGES) & 1);", "tc_mbar_wait(bars + 8 * s, ((it / STAGES) + 1) & 1);", 1)],
    "blocks step over the tiles one by one": [("dp += gridDim.x;", "++dp;", 1)],
    "fewer bytes announced than the stage's loads": [
        ("tc_mbar_expect_tx(full, STAGE);", "tc_mbar_expect_tx(full, A_BYTES);", 1)],
    "ping-pong: a warpgroup starts its tile before the other finished the tile before": [
        ("      if (PINGPONG && j > 0) tc_mbar_wait(", "      if (false) tc_mbar_wait(", 1)],
    "ping-pong: a warpgroup never says its main loop is done": [
        ("      if (PINGPONG) tc_mbar_arrive(done + 8 * me);", "", 1)],
    "ping-pong: both warpgroups must release a stage": [
        ("constexpr int READERS = PINGPONG ? 128 : 128 * NC;", "constexpr int READERS = 128 * NC;", 1)],
    "ping-pong: the other warpgroup's k steps not counted": [
        ("        it += k_tiles;\n        continue;", "        continue;", 1)],
    # the epilogue through shared memory and TMA stores (tilecore.cuda.tma_store, D38)
    "tma store: the buffer rewritten before the stores of the tile before read it": [
        ("        if (t == 0) tc_bulk_wait_read<0>();", "        if (false) tc_bulk_wait_read<0>();", 1)],
    "tma store: the warpgroup writes the buffer before its storing thread has waited": [
        ("have read the buffer */\n          tc_consumer_sync(1 + me, 128);\n", "have read the buffer */\n", 1)],
    "tma store: no fence.proxy.async before the stores": [("        tc_fence_proxy_async();\n", "", 1)],
    "tma store: the stores issued before the warpgroup has written the tile": [
        ("tc_fence_proxy_async();\n          tc_consumer_sync(1 + me, 128);\n", "tc_fence_proxy_async();\n", 1)],
    "tma store: the stores never committed": [("          tc_bulk_commit();\n", "", 1)],
    "tma store: the block exits with its stores in flight": [
        ("    if (TMA_STORE && threadIdx.x % 128 == 0) tc_bulk_wait<0>();", "", 1)],
    "tma store: every box to the tile's first columns": [("col0 + (part * PBOXES + b) * OATOM", "col0", 1)],
    "tma store: the slice written without the 128-byte swizzle": [
        ("((((col % OATOM) / 4) ^ (r & 7)) << 4)", "(((col % OATOM) / 4) << 4)", 1)],
    "tma store: both warpgroups stage into the same slices": [
        ("cbuf + (me * MR + i) * PBOXES * 8192", "cbuf + i * PBOXES * 8192", 1)],
    "tma store in halves: the second half written before the first half's stores read it": [
        ("          if (t == 0) tc_bulk_wait_read<0>();", "          if (t == 0 && part == 0) tc_bulk_wait_read<0>();", 1)],
    "tma store in halves: both halves stored at the first half's columns": [
        ("col0 + (part * PBOXES + b) * OATOM", "col0 + b * OATOM", 1)],
    "tma store: 16-bit C written without the 128-byte swizzle": [
        ("((((col % OATOM) / 8) ^ (r & 7)) << 4)", "(((col % OATOM) / 8) << 4)", 1)],
    "tma store: stmatrix's second and third matrices swapped": [
        ("tc_pack_c2<TOUT>(acc[8 * q + 2], acc[8 * q + 3]),", "tc_pack_c2<TOUT>(acc[8 * q + 9], acc[8 * q + 8]),", 1),
        ("tc_pack_c2<TOUT>(acc[8 * q + 4], acc[8 * q + 5]),", "tc_pack_c2<TOUT>(acc[8 * q + 2], acc[8 * q + 3]),", 1),
        ("tc_pack_c2<TOUT>(acc[8 * q + 9], acc[8 * q + 8]),", "tc_pack_c2<TOUT>(acc[8 * q + 4], acc[8 * q + 5]),", 1)],
}


def _run_harness(header_text: str, tmp: Path, defines=(), harness: Path = HARNESS) -> subprocess.CompletedProcess:
    """Build ``harness`` (a host program including tc_persistent.cuh) against ``header_text`` and run it."""
    (tmp / "tc_persistent.cuh").write_text(header_text)
    (tmp / "tc_hopper.cuh").write_text((PRELUDE / "tc_hopper.cuh").read_text())  # its k step and direct stores (D50)
    exe = tmp / harness.stem
    subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", *(f"-D{d}" for d in defines), "-I", str(tmp),
                    "-o", str(exe), str(harness)], check=True, capture_output=True, text=True)
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)


@needs_gxx
def test_protocol_runs_every_tile_once_with_the_right_stages_and_phases(tmp_path):
    proc = _run_harness(HEADER.read_text(), tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


@needs_gxx
@pytest.mark.parametrize("name", list(MUTANTS))
def test_protocol_harness_catches_each_mutant(name, tmp_path):
    text = HEADER.read_text()
    for old, new, count in MUTANTS[name]:
        assert text.count(old) == count, (name, old)  # the mutation still applies to the shipped header
        text = text.replace(old, new)
    # a mutant of the TMA store epilogue runs the cases that have it, any other the cases without it (CI time)
    proc = _run_harness(text, tmp_path, defines=("TC_HOST_TMA_ONLY",) if name.startswith("tma store")
                        else ("TC_HOST_NO_TMA",))
    assert proc.returncode != 0, f"{name}: not caught\n{proc.stdout}"
    print(name, "->", proc.stdout.strip())


@needs_gxx
def test_protocol_harness_catches_tma_stores_past_cs_edges(tmp_path):
    """C's tensor map with the tiles' extent instead of C's shape (as a runtime that built it from the grid would):
    the edge tiles' TMA stores then write outside C's valid rows and columns, and the harness says so."""
    proc = _run_harness(HEADER.read_text(), tmp_path, defines=("TC_HOST_PADDED_CMAP", "TC_HOST_TMA_ONLY"))
    assert proc.returncode != 0 and "outside C's valid rows and columns" in proc.stdout, proc.stdout


@needs_gxx
def test_protocol_with_the_stage_released_per_warp_and_its_mutant(tmp_path):
    """tilecore.cuda.stage_release="warp" (docs/decisions.md D49): each consumer warp's first lane releases the stage
    after the warp's WGMMA wait (the harness's wait meets the warp's lanes, as .sync.aligned does), the empty
    barrier counting warps. Counting half of them lets the producer overwrite a stage still being read."""
    proc = _run_harness(HEADER.read_text(), tmp_path, defines=("TC_HOST_REL=TC_REL_WARP",))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
    old = "REL == TC_REL_WARP ? (MCAST ? 2 : 1) * READERS / 32"
    text = HEADER.read_text()
    assert text.count(old) == 1
    proc = _run_harness(text.replace(old, "REL == TC_REL_WARP ? (MCAST ? 2 : 1) * READERS / 64"), tmp_path,
                        defines=("TC_HOST_REL=TC_REL_WARP", "TC_HOST_NO_TMA"))
    assert proc.returncode != 0 and "FAIL" in proc.stdout, proc.stdout
