"""The persistent Hopper GEMM's epilogue through shared memory and TMA stores (``tilecore.cuda.tma_store``,
docs/decisions.md D38), through the public API: the README GEMM, unchanged, compiled with the pass configs on.

Compile-only wherever a CUDA compiler exists (CI): the note, the kernel's third tensor map (C's: its shape, a
64-row x 128-byte box, the 128-byte swizzle; dynamic M), the shared memory it takes, which kernels keep the
direct stores and why (not persistent, a C tile that does not fit, block_N not whole 128-byte rows, C's rows
not a multiple of 16 bytes), the config's errors, the default (on) and off, and the SASS: STSM (16-bit C),
UTMASTG, one bulk commit, no global store of C, no spill, and per tile the wait for the stores before the buffer
is written again (DEPBAR.LE SB0 before the barrier and the first shared store of the epilogue) and the fence
before the barrier that lets the stores go. Both launch paths encode C's map (a recording driver on the CPU).
The protocol across tiles runs on the host in tests/test_cuda_persistent.py (tests/persistent_host.cpp, with
its mutants). On an sm_90 GPU the kernels run against float64 references and bit for bit against the config off.
"""
from __future__ import annotations

import re
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
from test_cuda_persistent import _INS, _body, _run, _runs_match_float64, reads_accumulators, tile_ends  # noqa: E402
from test_cuda_persistent import _compile as _compile_persistent  # noqa: E402

ON = {"tilecore.cuda.persistent": True, "tilecore.cuda.tma_store": True}
BIG = dict(M=4096, N=4096, K=512, bm=128, bn=256, threads=256, stages=3)  # 512 tiles; 144 KB of stages + 64 KB of C
NOTE = "tma_store: the epilogue through "


@pytest.fixture(autouse=True)
def _the_plugins_hopper_pipeline(monkeypatch):
    """These tests test the plugin's Hopper pipeline on plain GEMMs, which D58 routes to the core's general path by
    default: pinned to the pipeline (``tilecore.cuda.general_plain_gemm=False``, on top of any TILECORE_PASS_CONFIGS)."""
    import json
    import os

    env = json.loads(os.environ.get("TILECORE_PASS_CONFIGS", "") or "{}")
    monkeypatch.setenv("TILECORE_PASS_CONFIGS", json.dumps({**env, "tilecore.cuda.general_plain_gemm": False}))


def _compile(shape: dict, target=HOPPER, persistent=True, tma_store=True, **kw):
    """test_cuda_persistent's compile with ``tilecore.cuda.tma_store`` set (None: the default)."""
    cfg = {} if tma_store is None else {"tilecore.cuda.tma_store": tma_store}
    return _compile_persistent(shape, target, persistent, pass_configs=cfg, **kw)


# -- the decision, the tensor map, the shared memory ---------------------------------------------------------

@needs_toolchain
def test_tma_store_stages_the_tile_in_shared_memory_and_stores_it_through_cs_tensor_map():
    k = _compile(BIG)
    assert ("persistent: at most 132 blocks (132 SMs x 1), each looping over its tiles, the next tile's loads under "
            "this tile's epilogue; tma_store: the epilogue through 64 KB of shared memory and 8 TMA stores a tile, "
            "under the next tile's main loop") in _notes(k)
    body = _body(k)
    # EPI 11: TC_EPI_TMA (8) and the proven rows and columns (not PAIRS: no pair stores); C's map is the third
    assert re.search(r"tc_wgmma_persistent<384, 128, 256, 64, 3, 2, 1, false, 0, 64, 64, 0, 11, 16, false, "
                     r"tc_wgmma_f16_n256_t1>\(\(pipe_A_s \+ 0\), C, \(long long\)\(512\), \(long long\)\(4096\), "
                     r"tc_tile_of, &tc_tmap0, &tc_tmap1, &tc_tmap2\);", body)
    assert body.count("__grid_constant__ tc_tmap") == 3
    cmap = k.source.meta["tensor_maps"][2]
    assert cmap == {"arg": 2, "dtype": 6, "elem_bytes": 2, "dims": ["4096", "4096"], "box": [64, 64], "swizzle": 3,
                    "fix": "pass_configs={'tilecore.cuda.tma_store': False}"}
    # the pipeline buffer: 1024 bytes of slack, 3 stages of 48 KB, 1024 for the barriers, the 128x256 fp16 tile
    assert k.source.meta["shared_bytes"] == 1024 + 3 * 49152 + 1024 + 65536 <= 227 * 1024
    off = _compile(BIG, tma_store=False)
    assert off.source.meta["shared_bytes"] == 1024 + 3 * 49152 + 48


@needs_toolchain
def test_on_is_the_default_and_off_gives_the_direct_stores():
    """D38: on by default (measured on the H100: every configuration faster, the same bits); False gives the
    direct stores of D34, and a kernel that is not persistent says nothing about TMA stores unless asked."""
    default, on, off = (_compile(BIG, tma_store=x) for x in (None, True, False))
    assert default.get_kernel_source() == on.get_kernel_source() and NOTE in _notes(default)
    assert "tma_store" not in _notes(off) and len(off.source.meta["tensor_maps"]) == 2
    assert ", 7, 16, false, tc_wgmma_f16_n256_t1>" in _body(off) and "tc_tmap2" not in _body(off)
    per_tile = _compile(BIG, persistent=False, tma_store=None)
    assert "tma_store" not in _notes(per_tile) and "tc_tmap2" not in _body(per_tile)


@needs_toolchain
def test_dynamic_m_builds_cs_map_from_cs_shape_at_launch():
    from tilecore.runtime.launch import shape_fn

    k = tilecore.compile(dynamic_m_gemm(N=1024, K=512), target=HOPPER, pass_configs={**NOCACHE, **ON})
    assert NOTE in _notes(k)
    cmap = k.source.meta["tensor_maps"][2]
    assert cmap["box"] == [64, 64] and cmap["swizzle"] == 3
    assert shape_fn(cmap["dims"])([1000]) == (1024, 1000)  # (N, m) innermost first: TMA clips the ragged rows


@needs_toolchain
@pytest.mark.parametrize("shape,kw,note", [
    (dict(BIG, bn=128), {"out": "float32"}, "tma_store: the epilogue through 64 KB of shared memory and 8 TMA stores"),
    (dict(BIG, bn=128, stages=4), {"persistent": "pingpong", "panel": 8},
     "tma_store: the epilogue through 64 KB of shared memory and 4 TMA stores"),  # a 32 KB tile per warpgroup
    (dict(BIG, M=1000, N=4000, bn=128, threads=128), {"dtype": "bfloat16", "out": "bfloat16", "tb": True},
     "tma_store: the epilogue through 32 KB of shared memory and 4 TMA stores"),
    # the whole C tile does not fit beside the stages, half of it does: staged and stored in two halves
    (dict(BIG, stages=4), {}, "tma_store: the epilogue through 32 KB of shared memory in two halves (the 128x256 "
                              "float16 C tile does not fit beside 4 stages) and 8 TMA stores a tile"),
    (BIG, {"out": "float32"}, "tma_store: the epilogue through 64 KB of shared memory in two halves (the 128x256 "
                              "float32 C tile does not fit beside 3 stages) and 16 TMA stores a tile"),
])
def test_tma_store_takes_float32_c_pingpong_and_one_consumer_warpgroup(shape, kw, note):
    k = _compile(shape, **kw)
    assert note in _notes(k), _notes(k)
    epi = int(re.search(r", (\d+), (16|32), (true|false), tc_wgmma_", _body(k)).group(1))
    assert epi & 8 and bool(epi & 16) == ("two halves" in note) and "&tc_tmap2);" in _body(k)


@needs_toolchain
@pytest.mark.parametrize("shape,kw,why", [
    (dict(BIG, bk=128, stages=2), {"out": "float32"},
     "not tma_store: the 128x256 float32 C tile (128 KB), nor half of it, does not fit in shared memory beside 2 "
     "stages (329728 of 232448 bytes); a smaller block_M x block_N or a 16-bit C makes room"),
    (dict(BIG, bm=256, bn=32, bk=128, stages=3), {"tb": True, "out": "float32"},  # one box wide: no halves
     "not tma_store: the 256x32 float32 C tile (32 KB) does not fit in shared memory beside 3 stages (256000 of "
     "232448 bytes); num_stages=2 makes room"),
    (dict(BIG, bn=96), {"tb": True},
     "not tma_store: block_N = 96 is not whole 128-byte rows of float16 C (a multiple of 64 columns)"),
    (dict(BIG, N=1004, bn=128), {"tb": True},
     "not tma_store: the rows of C are not provably a multiple of 16 bytes, as a TMA store needs"),
    (BIG, {"persistent": False},
     "not tma_store: the epilogue through shared memory and TMA stores runs on a persistent grid "
     "(tilecore.cuda.persistent=True)"),
    (dict(BIG, bn=128), {"epilogue": "relu"}, "not tma_store: the epilogue through shared memory and TMA stores runs "
                                              "on a persistent grid"),
])
def test_kernels_that_keep_the_direct_stores_say_why(shape, kw, why):
    k = _compile(shape, **kw)
    assert why in _notes(k), _notes(k)
    assert "tc_tmap2" not in _body(k) and len(k.source.meta["tensor_maps"]) == 2


@needs_toolchain
@pytest.mark.parametrize("value", ["yes", 1])
def test_the_config_must_be_a_boolean_and_the_error_names_the_users_loop(value):
    with pytest.raises(CompileError, match=r"pass config tilecore.cuda.tma_store must be True or False, got") as e:
        _compile(BIG, tma_store=value)
    assert "test_cuda_hopper.py:" in str(e.value)


# -- SASS -----------------------------------------------------------------------------------------------------

def _sass(k) -> str:
    return tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)


def epilogue_order(sass: str) -> list:
    """What is wrong with the order of the TMA store epilogue in ``sass`` ([] when nothing), from each tile's full
    WGMMA wait to the next (in code order): every run of shared stores of C (STSM / STS) comes after a wait for the
    stores before to have read the buffer (DEPBAR.LE SB0, 0x0) and a named barrier after that wait; every TMA
    store (UTMASTG) after a fence to the async proxy (FENCE.VIEW.ASYNC.S) and a barrier after the last shared store;
    the stores are committed (UTMACMDFLUSH) before the next tile; each tile has shared stores and TMA stores."""
    ins = [m.group(2).strip() for m in _INS.finditer(sass)]
    starts = [i for i, t in enumerate(ins) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in t]
    if not starts:
        return ["no full WGMMA wait"]
    wrong = []
    for s, e in zip(starts, starts[1:] + [len(ins)]):
        waited = barred = fenced = fence_barred = pending = False
        stores = tma = 0
        for t in ins[s:e]:
            if t.startswith("DEPBAR.LE SB0, 0x0"):
                waited, barred = True, False
            elif t.startswith("BAR.SYNC"):
                barred = barred or waited
                fence_barred = fence_barred or fenced
            elif re.match(r"(STSM|STS)\b", t):
                if not (waited and barred):
                    wrong.append("the buffer written without waiting for the stores' reads and a barrier")
                stores += 1
                fenced = fence_barred = False
            elif t.startswith("FENCE.VIEW.ASYNC.S"):
                fenced, fence_barred = True, False
            elif t.startswith("UTMASTG"):
                if not (fenced and fence_barred):
                    wrong.append("the stores issued without a fence and a barrier after the shared stores")
                tma += 1
                pending, waited, barred = True, False, False
            elif t.startswith("UTMACMDFLUSH"):
                pending = False
        if not stores or not tma:
            wrong.append("no shared store or no TMA store after a tile's wait")
        if pending:
            wrong.append("the stores never committed")
    return sorted(set(wrong))


@needs_toolchain
@pytest.mark.parametrize("shape,kw,mma,stsm", [
    (BIG, {}, "HGMMA.64x256x16.F32", True),
    (dict(BIG, bn=128, stages=4), {"dtype": "bfloat16", "out": "bfloat16", "tb": True}, "HGMMA.64x128x16.F32.BF16",
     True),
    (dict(BIG, bn=128), {"out": "float32"}, "HGMMA.64x128x16.F32", False),
    (dict(BIG, M=1000, N=4000, bn=128, threads=128), {"panel": 4}, "HGMMA.64x128x16.F32", True),  # MR = 2, ragged
    (dict(BIG, bn=128, stages=4), {"panel": 8, "persistent": "pingpong"}, "HGMMA.64x128x16.F32", True),
    (dict(BIG, stages=4), {"panel": 8}, "HGMMA.64x256x16.F32", True),  # two halves
    (BIG, {"out": "float32"}, "HGMMA.64x256x16.F32", False),           # two halves
])
def test_sass_stores_c_through_shared_memory_and_tma_and_waits_before_reuse(shape, kw, mma, stsm):
    k = _compile(shape, **kw)
    assert NOTE in _notes(k)
    sass = _sass(k)
    for op in (mma, "UTMALDG.2D", "UTMASTG.2D", "UTMACMDFLUSH", "FENCE.VIEW.ASYNC.S", "DEPBAR.LE SB0, 0x0"):
        assert op in sass, op
    assert ("STSM.16.M88.4" in sass) == stsm
    assert not re.search(r"\bSTG\b", sass)  # no global store of C left: every element goes through TMA
    assert "STL" not in sass and "LDL" not in sass  # no spills
    assert k.source.meta["ptxas"].get("spill_stores", 0) == 0 and not k.source.meta.get("performance_notes")
    assert not epilogue_order(sass), epilogue_order(sass)
    for window, first, count in tile_ends(sass):  # D29's hazard: nothing reads the accumulators above the wait
        assert not reads_accumulators(window, first, count)


def _drop_last_fence(sass: str) -> str:
    """``sass`` without the fence between the epilogue's shared stores and its TMA stores."""
    at = sass.index("UTMASTG")
    i = sass.rindex("FENCE.VIEW.ASYNC.S", 0, at)
    return sass[:i] + "NOP" + sass[i + len("FENCE.VIEW.ASYNC.S"):]


@needs_toolchain
@pytest.mark.parametrize("mutation,what", [
    (lambda s: re.sub(r"/\*[0-9a-f]{4,}\*/\s+DEPBAR\.LE SB0, 0x0 ;[^\n]*\n", "", s, count=1),
     "the buffer written without waiting for the stores' reads and a barrier"),
    (lambda s: _drop_last_fence(s), "the stores issued without a fence and a barrier after the shared stores"),
    (lambda s: re.sub(r"UTMACMDFLUSH", "NOP", s), "the stores never committed"),
])
def test_the_sass_order_check_catches_each_mutation(mutation, what):
    sass = _sass(_compile(BIG))
    assert not epilogue_order(sass)
    assert what in epilogue_order(mutation(sass))


# -- the runtime: C's map on both launch paths (a recording driver on the CPU) ------------------------------------

def test_both_launch_paths_encode_cs_tensor_map(monkeypatch):
    torch = pytest.importorskip("torch")
    from test_c_launcher import on_cpu
    from test_cuda_backend import HAS_TOOLCHAIN
    from tilecore_cuda import runtime as cuda_runtime

    if not HAS_TOOLCHAIN:
        pytest.skip("no CUDA compiler here")
    monkeypatch.setattr(cuda_runtime, "device_properties", lambda index=0: {})
    kernel = tilecore.compile(dynamic_m_gemm(N=1024, K=512), target=HOPPER, pass_configs={**NOCACHE, **ON})
    for c_launcher in (True, False):
        k, prog, driver = on_cpu(kernel, c_launcher, monkeypatch)
        a, b, c = torch.randn(300, 512).half(), torch.randn(512, 1024).half(), torch.empty(300, 1024).half()
        k(a, b, c)
        words = [int.from_bytes(p, "little") for p in driver.records[-1]["params"]]
        # A, B, C, m, then the three descriptors (the stand-in encodes the address and the outer dimension)
        assert words[3] == 300
        assert words[4:7] == [a.data_ptr() ^ (300 << 48), b.data_ptr() ^ (512 << 48), c.data_ptr() ^ (300 << 48)]
        assert driver.records[-1]["grid"] == (12, 1, 1)  # 3 x 4 tiles
        # C's rows must be whole 16-byte units at a 16-byte aligned address, as for A and B: the error says the fix
        c2 = torch.empty(300 * 1024 + 4).half()[4:].view(300, 1024)
        with pytest.raises(Exception, match=r"tilecore.cuda.tma_store': False"):
            k(a, b, c2)


# -- on an H100 / H200 ------------------------------------------------------------------------------------------


@hopper_gpu
@pytest.mark.parametrize("shape,kw", [
    (dict(BIG, K=4096), {}),                                                   # the README GEMM at 4096^3
    (dict(BIG, M=1024, N=1024, K=1024), {}),                                   # 32 tiles: fewer than SMs
    (dict(BIG, M=4096 + 128, N=4096), {}),                                     # 528 tiles: not a multiple of 132
    (dict(BIG, M=1000, N=3000, K=1000), {}),                                   # ragged M, N and K
    (dict(BIG, M=1000, N=3000, K=1000, bn=128), {"out": "float32"}),           # float32 C, ragged
    (dict(BIG, M=1000, N=3000, K=1000, bn=128, threads=128), {"dtype": "bfloat16", "out": "bfloat16"}),  # MR 2
    (BIG, {"dtype": "bfloat16", "panel": 4}),                                  # bf16, use_swizzle
    (dict(BIG, M=2000, N=3000, bn=128, stages=4), {"tb": True, "panel": 3}),   # B k-major, swizzled, ragged
    (dict(BIG, bn=128, stages=4), {"persistent": "pingpong", "panel": 8}),    # ping-pong: a tile a warpgroup
    (dict(BIG, K=4096, stages=4), {"panel": 8}),                               # the README GEMM's 4 stages: halves
    (dict(BIG, M=1000, N=3000, K=1000), {"out": "float32", "dtype": "bfloat16"}),  # float32 C in halves, ragged
    (dict(BIG, M=1000, N=3000, K=1000, bn=128, stages=4), {"persistent": "pingpong", "dtype": "bfloat16",
                                                           "out": "bfloat16"}),
])
def test_device_tma_store_matches_float64_and_the_direct_stores_bit_for_bit(shape, kw):
    torch = pytest.importorskip("torch")
    M, N, K = shape["M"], shape["N"], shape["K"]
    dtype, out, tb = kw.get("dtype", "float16"), kw.get("out", "float16"), kw.get("tb", False)
    k = _compile(shape, target="cuda", **kw)
    assert NOTE in _notes(k), _notes(k)
    g = torch.Generator().manual_seed(M + N + K)
    a = torch.randn(M, K, generator=g).cuda().to(getattr(torch, dtype))
    b = torch.randn(K, N, generator=g).cuda().to(getattr(torch, dtype))
    ref = a.double() @ b.double()
    if tb:
        b = b.t().contiguous()
    first = _runs_match_float64(k, a, b, ref, M, N, K, out, torch)
    # the direct stores (tma_store off, the same grid): the same bits
    off = _compile(shape, target="cuda", tma_store=False, **kw)
    assert "tma_store" not in _notes(off)
    assert torch.equal(_run(off, a, b, M, N, out, torch), first)


@hopper_gpu
def test_device_dynamic_m_matches_the_direct_stores(monkeypatch):
    torch = pytest.importorskip("torch")
    on = tilecore.compile(dynamic_m_gemm(N=1024, K=512), target="cuda", pass_configs={**NOCACHE, **ON})
    off = tilecore.compile(dynamic_m_gemm(N=1024, K=512), target="cuda",
                           pass_configs={**NOCACHE, "tilecore.cuda.persistent": True, "tilecore.cuda.tma_store": False})
    assert NOTE in _notes(on) and "tma_store" not in _notes(off)
    for m in (1, 100, 129, 1000, 8192 + 64):
        a = torch.randn(m, 512, device="cuda").half()
        b = torch.randn(512, 1024, device="cuda").half()
        got = _run(on, a, b, m, 1024, "float16", torch)
        assert torch.equal(got, _run(off, a, b, m, 1024, "float16", torch)), m
        assert torch.allclose(got.double(), a.double() @ b.double(), atol=2e-2 * np.sqrt(512), rtol=2e-2), m
    # rows past C's end are not written: C inside a bigger allocation keeps its neighbours
    big = torch.full((1100, 1024), 7.0, device="cuda").half()
    a = torch.randn(1000, 512, device="cuda").half()
    on(a, b, big[:1000])
    torch.cuda.synchronize()
    assert torch.equal(big[1000:], torch.full((100, 1024), 7.0, device="cuda").half())
